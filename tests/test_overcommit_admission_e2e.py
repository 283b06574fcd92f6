"""Admission knows who is present, end to end (issue 36, item 5; bug 4: "8 present users on one
over-committed GPU: ... CUDA out-of-memory errors in the cells of users 5-8, and no word about
why"). A real JupyterHub with FracSpawner on the real control plane, the T4 pool of
test_overcommit_swap_e2e (`replicas: 4, overcommit: 2`: eight 1/4 slots on ONE simulated GPU),
real single-user servers with the notebook extension reporting to the culler in this process,
each user's JupyterLab tab reporting presence as labextension/src/presence.ts does (visible,
just used). Four present users hold the GPU: the fifth user's spawn waits in line before any
pod is made, its pending page saying why; when one of the four hides their tab (no longer
present, nothing of theirs on the GPU) the fifth's pod is made and starts.

tests/test_overcommit_admission.py holds the decision itself (the culler's room view, the hub's
verdict and line, a stale or silent server never room, no answer admits by slots).
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from tests.e2e_helpers import progress_events, server_pods, spawn, stop_all, the_pod, wait_until
from tests.test_overcommit_swap_e2e import (  # the same cluster and simulated GPU
    CATALOG,
    TOPOLOGY,
    culler,
    gpu,  # noqa: F401 (a fixture)
    server_api,
)
from tests.test_overcommit_swap_e2e import HUB_EXTRA_CONFIG as SWAP_HUB_CONFIG

pytestmark = pytest.mark.e2e
__all__ = ["CATALOG", "TOPOLOGY"]  # read by conftest's fixtures
# the hub of test_overcommit_swap_e2e (its culler's URL and service), spawns waiting in line
HUB_EXTRA_CONFIG = SWAP_HUB_CONFIG + 'c.FracSpawner.admission = "wait"\n'

PRESENT = ["p1", "p2", "p3", "p4"]
NEWCOMER = "p5"
REASON = "The GPU is in use by 4 people now; you are next"


class Tabs(threading.Thread):
    """Each present user's JupyterLab tab: a presence report now and then (visible, just
    used), as the tab sends them while its person works; `hide(user)` hides theirs."""

    def __init__(self, hub, users: list[str]) -> None:
        super().__init__(daemon=True)
        self.hub, self.visible = hub, dict.fromkeys(users, True)
        self.done = threading.Event()

    def report(self, user: str) -> None:
        body = {"client": f"tab-{user}", "visible": self.visible[user],
                "focused": self.visible[user], "idle_seconds": 0}  # fmt: skip
        status, answer = server_api(self.hub, user, "POST", "/api/fracspawner/presence", body)
        assert status == 200, answer

    def hide(self, user: str) -> None:
        self.visible[user] = False
        self.report(user)

    def run(self) -> None:
        while not self.done.wait(15):
            for user in list(self.visible):
                try:
                    self.report(user)
                except Exception:  # a busy hub: the next round reports again
                    pass


async def test_a_newcomer_waits_while_present_users_hold_the_gpu_and_starts_when_one_leaves(
    hub,
    devcluster,
    gpu,  # noqa: F811 (the fixture)
):
    c = culler(hub)
    receiver = c.start_receiver()
    tabs = Tabs(hub, PRESENT)
    try:
        # blocking calls go to threads: the culler answers the hub's room questions in this
        # test's event loop (a blocked loop is "no answer": admitted by slots alone)
        for user in PRESENT:
            status, body = await asyncio.to_thread(spawn, hub, user, {"gpu": "1/4", "pool": "t4"})
            assert status in (201, 202), body
        for user in PRESENT:
            await asyncio.to_thread(hub.wait_ready, user, timeout=300)
        for user in PRESENT:
            await asyncio.to_thread(tabs.report, user)
        tabs.start()
        await c.cull_once()  # the culler lists the hub's servers: its room answer counts them

        def room() -> dict:
            gpus = c.room_json(time.time())["gpus"]
            return gpus[0] if len(gpus) == 1 else {}

        await asyncio.to_thread(
            wait_until, lambda: room().get("present") == 4, 120, "four people present on the GPU"
        )
        assert room()["free_mib"] == 0

        status, body = await asyncio.to_thread(spawn, hub, NEWCOMER, {"gpu": "1/4", "pool": "t4"})
        assert status == 202, body  # accepted: it waits in line
        seen: dict[str, object] = {}

        def one_leaves() -> None:
            # the reason is said before the pod exists: no pod yet, nothing to meet OOM
            seen["pods_while_waiting"] = server_pods(devcluster, NEWCOMER)
            tabs.hide("p1")  # p1's tab hidden: not present; its server holds no memory

        events = await asyncio.to_thread(progress_events, hub, NEWCOMER, REASON, one_leaves, 300)
        messages = [e.get("message", "") for e in events]
        waiting = [m for m in messages if REASON in m]
        assert waiting, messages
        assert "starts by itself" in waiting[0] and "place is kept" in waiting[0]
        assert seen["pods_while_waiting"] == []
        await asyncio.to_thread(hub.wait_ready, NEWCOMER, timeout=300)
        assert the_pod(devcluster, NEWCOMER)["spec"]["nodeName"] == "gpu-t4-1"
    finally:
        tabs.done.set()
        receiver.stop()
        await asyncio.to_thread(stop_all, hub, devcluster, [(u, "") for u in [*PRESENT, NEWCOMER]])
