"""While someone waits for a slot, the servers of people who left are released for them
(culler/away.py), sooner than `server_gpu_idle`, least recently active first.

The capacity benchmark's classroom (HAMi, no over-commit, 16 slots): section B arrives at
10:45 while section A, gone since 10:25-10:35 with their tabs closed, still holds the slots
(`gpu_busy` for the hour after their last GPU cell, then `active`); every student of B waited
20-50 min (57 waits against jupyterhub-idle-culler's 46). Through a whole culler cycle
(`Culler.cull_once`) against the benchmark's stand-in hub, the reports parsed as received, and
a pod watch's placements (tests/test_culler_keep_hibernated.py's).
"""

from __future__ import annotations

import asyncio
import time

import pytest

from benchmarks.bench_culler import server_model
from fracspawner.backends import load_catalog
from fracspawner.culler.app import Culler
from fracspawner.culler.placement import Placement
from tests.conftest import DEMO_CATALOG
from tests.test_culler_keep_hibernated import Pods, iso, run_cycle

QUARTER_H100 = 20389.0  # what FracSpawner annotates a 1/4 H100 pod with (81,559 MiB / 4)


def report(
    now: float,
    left_min: float,
    *,
    tab: str = "closed",
    gpu_idle_min: float | None = None,
    executing: bool = False,
) -> dict:
    """A HAMi server whose person was last seen `left_min` ago, their kernel holding 8 GiB,
    its GPU idle since then (or `gpu_idle_min`). `tab`: "closed" (no tab reports: every tab
    closed), "hidden" (the lecture's slides in front, in session), "silent" (a visible tab
    without input, in session), "desk" (a tab left open, its person out of session: the
    server's session timeout shorter than `left_min`), "never" (no tab of it ever reported:
    VS Code, a script)."""
    left = now - left_min * 60
    gpu_since = now - (left_min if gpu_idle_min is None else gpu_idle_min) * 60
    presence = {
        "closed": {"known": False, "present": False, "in_session": False,
                   "last_present": iso(left)},
        "hidden": {"known": True, "present": False, "in_session": True,
                   "last_present": iso(left)},
        "silent": {"known": True, "present": False, "in_session": True,
                   "last_present": iso(left)},
        "desk": {"known": True, "present": False, "in_session": False,
                 "last_present": iso(left)},
        "never": {"known": False, "present": False, "in_session": False, "last_present": None},
    }[tab]  # fmt: skip
    return {
        "available": True, "sampled_at": iso(now), "monitor_started": iso(now - 3 * 3600),
        "server_last_activity": iso(left), "user_last_activity": iso(left),
        "gpu_memory_mib": 8192, "gpu_activity_known": True, "gpu_idle_since": iso(gpu_since),
        "presence": presence,
        "kernels": [{"id": "k1", "execution_state": "busy" if executing else "idle",
                     "gpu_memory_mib": 8192}],
    }  # fmt: skip


async def cycle(
    servers: dict[str, dict],
    waiting: int = 0,
    slices: dict[str, str] | None = None,
    rooms: list[dict] | None = None,
    waited: float = 3600.0,
    **culler_options: object,
) -> tuple[list[str], dict[str, str]]:
    """One culler cycle over `servers` (user -> report) of the HAMi `h100` pool (1/4 slices,
    or `slices`), with `waiting` quarter pods of it made `waited` seconds ago and not
    scheduled; the users stopped and each server's decision (reason: message)."""
    now = time.time()
    slices = slices or {}
    models = [
        server_model(
            u, now - 3 * 3600, now - 2 * 3600, {"gpu": slices.get(u, "1/4"), "pool": "h100"}
        )
        for u in servers
    ]
    pods = {
        f"jupyter-{u}": Placement("n1", pool="h100", memory_mib=QUARTER_H100, owner=(u, ""))
        for u in servers
    }
    pods |= {
        f"jupyter-new{i}": Placement(
            None, pool="h100", memory_mib=QUARTER_H100, owner=(f"n{i}", ""), created=now - waited
        )
        for i in range(waiting)
    }
    # the room answer (room.py) of an over-committed pool
    room_json = None if rooms is None else (lambda now: {"gpus": rooms})
    return await run_cycle(models, Pods(pods), servers, now, room_json, **culler_options)


async def test_a_server_whose_person_left_is_released_when_a_pod_waits_for_its_slot():
    now = time.time()
    stopped, said = await cycle({"ann": report(now, 20)}, waiting=1)
    assert stopped == ["ann"], f"kept while a pod waits for its slot: {said['ann']}"
    assert said["ann"].startswith("needed: a server pod of its pool waits for a node"), said


async def test_nobody_waiting_it_stays_until_server_gpu_idle():
    now = time.time()
    stopped, said = await cycle({"ann": report(now, 20)})
    assert stopped == [] and said["ann"].startswith("gpu_busy:"), said


async def test_least_recently_active_first_until_the_waiting_slices_are_covered():
    now = time.time()
    both = {"ann": report(now, 20), "bob": report(now, 30)}
    stopped, said = await cycle(both, waiting=1)
    assert stopped == ["bob"], said
    stopped, _ = await cycle(both, waiting=2)
    assert stopped == ["ann", "bob"]
    # a quarter waits; cat's server stops by its own idle timeout and frees it
    stopped, said = await cycle({"ann": report(now, 20), "cat": report(now, 70)}, waiting=1)
    assert stopped == ["cat"] and said["cat"].startswith("gpu_idle:"), said


async def test_a_person_who_closed_their_tab_gives_their_slot_before_a_tab_left_open():
    """Closing every tab is leaving on purpose; a tab still open and reporting (a desk past
    the server's session timeout, here shorter than the hour) may have its person back in
    minutes. So the closed one goes first, whichever was less recently active (keep.released,
    as for kept hibernated servers); within each, least recently active first."""
    now = time.time()
    both = {"ann": report(now, 40, tab="desk"), "bob": report(now, 20)}
    stopped, said = await cycle(both, waiting=1)
    assert stopped == ["bob"], said
    assert said["ann"].startswith("gpu_busy:"), said
    stopped, _ = await cycle(both, waiting=2)
    assert stopped == ["ann", "bob"]
    # the tab left open goes only once a newcomer has waited release_tab_open_after (5 min)
    stopped, said = await cycle(both, waiting=2, waited=60.0)
    assert stopped == ["bob"], said


async def test_on_an_over_committed_pool_only_where_a_gpu_has_room_for_the_waiting_pod():
    """Where present users' kernels fill every GPU of the pool, the waiting pod lacks room,
    not a slot: a slot released seats nobody (the hub's admission waits for room), and its
    person comes back to wait in turn (breaks on half the GPUs: 56 waits to 72)."""
    now = time.time()
    full = [{"pool": "h100", "gpu": "n1/GPU-a", "size_mib": 81559.0, "free_mib": 9000.0}]
    stopped, said = await cycle({"ann": report(now, 20)}, waiting=1, rooms=full)
    assert stopped == [] and said["ann"].startswith("gpu_busy:"), said
    room = [{"pool": "h100", "gpu": "n1/GPU-a", "size_mib": 81559.0, "free_mib": 30000.0}]
    stopped, said = await cycle({"ann": report(now, 20)}, waiting=1, rooms=room)
    assert stopped == ["ann"], said


@pytest.mark.parametrize(
    "why, body",
    [
        ("hidden lecture tab (in session)", dict(tab="hidden")),
        ("silent reader at a visible tab (in session)", dict(tab="silent")),
        ("no tab ever reported its person", dict(tab="never")),
        ("a cell is running", dict(executing=True)),
        ("left only 10 min ago", dict(left=10)),
        ("GPU worked 5 min ago", dict(gpu_idle_min=5)),
    ],
)
async def test_never_a_person_in_session_a_server_at_work_or_one_left_just_now(why, body):
    now = time.time()
    left = body.pop("left", 20)
    stopped, said = await cycle({"ann": report(now, left, **body)}, waiting=2)
    assert stopped == [], f"{why}: released: {said['ann']}"


async def test_the_time_since_the_gpu_was_read_is_not_counted_as_idle():
    """The report was sampled 250 s ago (fresh: max_staleness is 300 s) with the GPU busy at
    that moment. With release_away_after (200 s) below max_staleness, its GPU's last known work
    was still not `after` ago: the 250 s since it was read are unknown, never idle (as for
    decide_server), so it is not released."""
    now = time.time()
    started = {"monitor_started": iso(now - 3 * 3600)}  # this incarnation's monitor
    busy_then = report(now - 250, 20, gpu_idle_min=0) | started
    stopped, said = await cycle({"ann": busy_then}, waiting=1, release_away_after=200)
    assert stopped == [] and said["ann"].startswith("gpu_busy:"), said
    # 250 s of GPU idleness read then: released, 200 s past its last known work
    idle_then = report(now - 250, 20, gpu_idle_min=250 / 60) | started
    stopped, said = await cycle({"ann": idle_then}, waiting=1, release_away_after=200)
    assert stopped == ["ann"] and said["ann"].startswith("needed:"), said


async def test_off_it_stays_until_server_gpu_idle():
    now = time.time()
    assert Culler().release_away_after == 900  # 15 min, Presence.timeout's
    stopped, said = await cycle({"ann": report(now, 20)}, waiting=1, release_away_after=0)
    assert stopped == [] and said["ann"].startswith("gpu_busy:"), said


class Waiting(Pods):
    """A pod watch whose one server pod waits for a node, or no longer does."""

    def __init__(self) -> None:
        super().__init__({})
        self.on_waiting = None

    def wait(self, waits: bool) -> None:
        where = Placement(None, pool="h100", memory_mib=QUARTER_H100, owner=("new", ""))
        self.pods = {"jupyter-new": where} if waits else {}
        if waits and self.on_waiting is not None:
            self.on_waiting()


async def _paused_culler() -> tuple[Waiting, asyncio.Future]:
    """A culler (cull_every 300 s, cull_when_waiting 10 ms) paused until its next cycle, and
    its pod watch."""
    culler = Culler(cull_every=300, cull_when_waiting=0.01)
    culler._catalog = load_catalog(str(DEMO_CATALOG))
    pods = culler.server_pods = Waiting()
    pause = asyncio.ensure_future(culler.until_next_cycle())
    await asyncio.sleep(0.05)
    return pods, pause


async def test_a_pod_that_waits_for_a_node_calls_a_cycle_before_cull_every():
    """Released at the next cycle, a person who arrives just after one waited up to
    `cull_every` (5 min) for a slot whose person had left: the pod watch wakes the loop."""
    pods, pause = await _paused_culler()
    pods.wait(True)
    await asyncio.wait_for(pause, 30)  # cull_every is 300 s: only the pod's wait ends it
    assert pods.on_waiting is None, "the loop's hook outlived its pause"


async def test_a_pod_placed_at_once_calls_no_cycle():
    # every pod waits for a moment before the scheduler places it: only one still waiting
    # `cull_when_waiting` later calls for a cycle
    pods, pause = await _paused_culler()
    pods.wait(True)
    pods.wait(False)  # placed before the delay ran out
    await asyncio.sleep(0.5)
    assert not pause.done(), "a cycle before cull_every although no pod waits any more"
    pause.cancel()
