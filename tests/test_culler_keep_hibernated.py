"""Keep rather than kill where memory can be moved (issue 36 item 2): on a pool where
hibernation frees memory others use, an idle server whose kernels are all hibernated is stopped
for GPU idleness only when a server pod of its pool waits for a node (culler/keep.py).

The capacity benchmark (classroom, time-sliced, half the GPUs) had the culler stop 10 students'
servers at 13:40, when the session their open tab kept ran out (`server_gpu_idle` long past,
0 MiB on the GPU), 20-30 min before they came back for the 14:00 lab, with nobody waiting for a
slot. Through a whole culler cycle (`Culler.cull_once`) against the benchmark's stand-in hub,
the reports parsed as received, and a pod watch's placements.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from tornado.httpserver import HTTPServer

from benchmarks.bench_culler import StandInHub, server_model
from devcluster.localhub import free_port
from fracspawner.backends import load_catalog
from fracspawner.culler.app import Culler
from fracspawner.culler.placement import Placement
from fracspawner.culler.reports import parse_report
from tests.conftest import DEMO_CATALOG

QUARTER_T4 = 3840.0  # the demo catalog's t4 offer (time-sliced, four replicas of 15,360 MiB)


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat().replace("+00:00", "Z")


def report(now: float, idle_h: float, on_gpu_mib: float = 0.0, tab_closed: bool = False) -> dict:
    """A server whose user left `idle_h` hours ago (a tab left open: presence known, away, out
    of session; or `tab_closed`: no tab reports now, one saw them last then), its GPU idle as
    long; its one kernel hibernated, or `on_gpu_mib` on the GPU."""
    hibernated = on_gpu_mib <= 0
    presence = {"known": True, "present": False, "in_session": False}
    if tab_closed:
        presence = {"known": False, "present": False, "in_session": False,
                    "last_present": iso(now - idle_h * 3600)}  # fmt: skip
    return {
        "available": True, "sampled_at": iso(now), "monitor_started": iso(now - 10 * 3600),
        "server_last_activity": iso(now - idle_h * 3600),
        "user_last_activity": iso(now - idle_h * 3600),
        "gpu_memory_mib": on_gpu_mib, "gpu_activity_known": True,
        "gpu_idle_since": iso(now - idle_h * 3600),
        "presence": presence,
        "devices": [{"index": "0", "uuid": "GPU-t4", "memory_total_mib": 15360,
                     "memory_used_mib": on_gpu_mib}],
        "kernels": [
            {"id": "k1", "execution_state": "idle", "gpu_memory_mib": on_gpu_mib,
             "hibernation": {"state": "hibernated", "hibernated_gpu_memory_mib": 3000,
                             "hibernated_since": iso(now - (idle_h - 0.2) * 3600)}
             if hibernated else {"state": "running"}},
        ],
        "hibernated_gpu_memory_mib": 3000 if hibernated else 0,
    }  # fmt: skip


class Pods:
    """The culler's pod watch: each listed server's pod on node n1, and the pods waiting."""

    def __init__(self, pods: dict[str, Placement]):
        self.pods = pods

    def placement(self, name: str, namespace: str | None = None) -> Placement | None:
        return self.pods.get(name)

    def placements(self) -> list[tuple[str, Placement]]:
        return list(self.pods.items())

    def known(self, address: str) -> bool:
        return False


async def run_cycle(
    models: list[dict],
    server_pods: Pods | None,
    reports: dict[str, dict],
    now: float,
    room_json: Callable[[float], dict] | None = None,
    **culler_options: Any,
) -> tuple[list[str], dict[str, str]]:
    """One culler cycle at `now` against a stand-in hub serving `models`, with the demo
    catalog, the pod watch `server_pods`, each user's report body in `reports` and, where
    given, the room answer `room_json`; the users stopped and each server's decision
    (reason: message)."""
    hub = StandInHub(lambda: models)
    http = HTTPServer(hub.app)
    port = free_port()
    http.listen(port, "127.0.0.1")
    culler = Culler(
        url=f"http://127.0.0.1:{port}/hub/api", api_token="t", report_url="http://127.0.0.1:9",
        **culler_options,
    )  # fmt: skip
    culler._catalog = load_catalog(str(DEMO_CATALOG))
    if room_json is not None:
        culler.room_json = room_json  # type: ignore[method-assign]
    culler.server_pods = server_pods
    for u, body in reports.items():
        culler.reports.put(u, "", parse_report(body, received_at=now))
    try:
        result = await culler.cull_once(now=now)
    finally:
        http.stop()
    said = {
        o.server.facts.user: f"{o.decision.reason}: {o.decision.message}" for o in result.outcomes
    }
    return sorted(hub.deleted), said


async def cycle(
    servers: dict[str, tuple[float, float]],
    pool: str = "t4",
    waiting: int = 0,
    pod_watch: bool = True,
    keep: bool = True,
    tabs_closed: frozenset[str] = frozenset(),
    waited: float = 3600.0,
) -> tuple[list[str], dict[str, str]]:
    """One culler cycle over `servers` (user -> hours idle, MiB on the GPU) of `pool`, with
    `waiting` quarter-T4 pods of that pool made `waited` seconds ago and not scheduled, the
    users in `tabs_closed` having closed their tabs (the others left one open); the users
    stopped and each server's decision (reason: message)."""
    now = time.time()
    models = [
        server_model(u, now - 10 * 3600, now - h * 3600, {"gpu": "1/4", "pool": pool})
        for u, (h, _) in servers.items()
    ]
    pods = {
        f"jupyter-{u}": Placement("n1", pool=pool, memory_mib=QUARTER_T4, owner=(u, ""))
        for u in servers
    }
    pods |= {
        f"jupyter-new{i}": Placement(
            None, pool=pool, memory_mib=QUARTER_T4, owner=(f"new{i}", ""), created=now - waited
        )
        for i in range(waiting)
    }
    reports = {u: report(now, h, mib, u in tabs_closed) for u, (h, mib) in servers.items()}
    return await run_cycle(
        models, Pods(pods) if pod_watch else None, reports, now, keep_hibernated_servers=keep
    )


async def test_an_idle_server_whose_kernels_are_all_hibernated_stays_while_nobody_waits():
    stopped, said = await cycle({"ann": (2.5, 0.0)})
    assert stopped == [], f"stopped although nobody waits for its slot: {said['ann']}"
    assert said["ann"].startswith("hibernated: its kernels are all hibernated")


async def test_it_is_stopped_when_a_pod_of_its_pool_waits_least_recently_active_first():
    # two kept servers past server_gpu_idle, one quarter waiting: the longer idle one goes
    stopped, said = await cycle({"ann": (3.0, 0.0), "bob": (2.0, 0.0)}, waiting=1)
    assert stopped == ["ann"], said
    assert said["ann"].startswith("gpu_idle:") and said["bob"].startswith("hibernated:")
    stopped, _ = await cycle({"ann": (3.0, 0.0), "bob": (2.0, 0.0)}, waiting=2)
    assert stopped == ["ann", "bob"]


async def test_a_server_whose_person_closed_their_tab_is_released_before_one_left_open():
    """A person who closed every tab of their server left on purpose; a tab still open and
    reporting (hidden, or a desk past its session) may have its person back in minutes. The
    capacity benchmark's classroom on half the GPUs released section A's kept servers, tabs
    left open, least recently active first, 1-10 min before their owners came back for the
    next lab: 8 (reserving) and 6 (time-sliced) disruptions against the baseline's 0."""
    servers = {"ann": (3.0, 0.0), "bob": (2.0, 0.0)}  # ann the longer idle, her tab open
    stopped, said = await cycle(servers, waiting=1, tabs_closed=frozenset({"bob"}))
    assert stopped == ["bob"], said
    assert said["ann"].startswith("hibernated:"), said
    # within each, least recently active first
    stopped, _ = await cycle(servers, waiting=1, tabs_closed=frozenset({"ann", "bob"}))
    assert stopped == ["ann"]


async def test_a_server_left_with_a_tab_open_goes_only_once_the_newcomer_has_waited():
    """A tab left open may have its person back in minutes: the culler benchmark's classroom
    on half the GPUs released five such kept servers for newcomers, their people back 3-10 min
    later. Now one with a tab open is released only once a pod of its pool has waited
    release_tab_open_after (5 min); one whose person closed every tab goes at once."""
    servers = {"ann": (3.0, 0.0)}  # her tab still open
    stopped, said = await cycle(servers, waiting=1, waited=120.0)
    assert stopped == [], said
    assert said["ann"].startswith("hibernated:"), said
    stopped, said = await cycle(servers, waiting=1, waited=300.0)
    assert stopped == ["ann"], said
    # closed every tab: at once
    stopped, said = await cycle(servers, waiting=1, waited=0.0, tabs_closed=frozenset({"ann"}))
    assert stopped == ["ann"], said


def test_a_pods_wait_is_since_it_was_made_and_unknown_is_no_wait():
    from fracspawner.culler.keep import waited
    from fracspawner.culler.placement import placement_of

    made = {"metadata": {"creationTimestamp": "2026-11-30T10:00:00Z",
                         "labels": {"fracspawner.io/pool": "t4"}}, "spec": {}}  # fmt: skip
    pod = placement_of(made)
    assert pod.created == 1796032800.0 and pod.node is None
    later = pod.created + 90
    unknown = Placement(None, pool="t4")
    assert waited([("a", pod), ("b", unknown)], later) == {"t4": 90.0}
    assert waited([("b", unknown)], later) == {"t4": 0.0}
    assert waited([("c", Placement("n1", pool="t4", created=0.0))], later) == {}  # scheduled


async def test_the_plain_server_idle_still_stops_it():
    stopped, said = await cycle({"ann": (9.0, 0.0)})  # the demo's server_idle: 8 h
    assert stopped == ["ann"] and said["ann"].startswith("idle:"), said


async def test_a_server_holding_gpu_memory_is_stopped_as_before():
    stopped, said = await cycle({"ann": (2.5, 2000.0)})
    assert stopped == ["ann"] and said["ann"].startswith("gpu_idle:"), said


async def test_where_hibernation_frees_nothing_others_use_it_is_stopped_as_before():
    stopped, said = await cycle({"ann": (2.5, 0.0)}, pool="h100")  # HAMi, no over-commit
    assert stopped == ["ann"] and said["ann"].startswith("gpu_idle:"), said


async def test_off_by_default_servers_are_stopped_as_before():
    # under the hub's admission "refuse" a newcomer makes no pod: nobody waiting could be seen
    stopped, said = await cycle({"ann": (2.5, 0.0)}, keep=False)
    assert stopped == ["ann"] and said["ann"].startswith("gpu_idle:"), said
    assert Culler().keep_hibernated_servers is False


async def test_without_the_pod_watch_nobody_waiting_can_be_seen_so_nothing_is_kept():
    stopped, said = await cycle({"ann": (2.5, 0.0)}, pod_watch=False)
    assert stopped == ["ann"] and said["ann"].startswith("gpu_idle:"), said


def _budget_answer(overcommit: float) -> dict:
    """Ann's and bob's hibernated quarters fill node-a's budget (2.5 quarters); cat, away,
    has an idle kernel due to hibernate (`kernel_gpu_hibernate`): the answer to her report."""
    from dataclasses import replace

    from fracspawner.culler.decide import ServerFacts
    from fracspawner.culler.identity import Identity
    from tests.test_host_budget import Pods as NodeA
    from tests.test_host_budget import report as hibernated

    catalog = load_catalog(str(DEMO_CATALOG))
    pools = {**catalog.pools, "t4": replace(catalog.pools["t4"], overcommit=overcommit)}
    culler = Culler(host_memory_budget_mib=2.5 * QUARTER_T4)
    culler._catalog = replace(catalog, pools=pools)
    culler.server_pods = NodeA()
    now = time.time()
    kernels = {
        "ann": [("a1", QUARTER_T4, now - 5000, False)],
        "bob": [("b1", QUARTER_T4, now - 4000, False)],
        "cat": [],
    }
    for user, ks in kernels.items():
        body = hibernated(now, ks)
        if user == "cat":
            body["swap"] = {"hibernate_wanted": [{"kernel_id": "c1", "gpu_memory_mib": QUARTER_T4}]}
        culler.known[(user, "")] = ServerFacts(user, user_options={"gpu": "1/4", "pool": "t4"})
        culler.reports.put(user, "", parse_report(body, received_at=now))
    culler.answer_report(Identity("cat", ""), now)
    # the shut-downs are told to the kernels' own servers
    return {
        user: ((culler.answer_report(Identity(user, ""), now) or {}).get("swap") or {})
        for user in ("ann", "bob", "cat")
    }


def test_an_idle_hibernation_shuts_no_kernel_down_where_the_pool_over_commits():
    """Shutting a kernel down is the last resort (issue 36 item 2): on an over-committed pool a
    kernel due to hibernate for idleness stays on the GPU when its node's budget is full (if
    its memory is needed, the swap orders it out then, and that order may shut the oldest
    down). The classroom replay (time-sliced, half the GPUs) shut 51 hibernated kernels down
    so that other idle kernels could hibernate, and students came back to dead kernels."""
    swap = _budget_answer(overcommit=2.0)
    assert "shutdown" not in swap["ann"], (
        f"ann's hibernated kernel shut down for cat's idle one to hibernate: {swap['ann']}"
    )
    (wait,) = swap["cat"]["host_wait"]
    assert wait["kernel_id"] == "c1" and "stays on the GPU" in wait["reason"]


def test_without_over_commit_an_idle_hibernation_still_makes_room_oldest_first():
    # no swap makes room for a newcomer there: the idle kernel's memory is freed by hibernation
    swap = _budget_answer(overcommit=1.0)
    assert [o["kernel_id"] for o in swap["ann"]["shutdown"]] == ["a1"]


def test_slices_that_add_up_to_the_waiting_slice_are_enough():
    """Slices are whole MiB, each floored (model/slices.py: 1/8 of an H100 is 10,194 MiB, 1/4
    20,389, 1/2 40,779): two eighths are a quarter less 1 MiB, three quarters a quarter and a
    half less 1 MiB. Releasing for the pods waiting stopped one server more than they needed
    for that MiB (capacity benchmark, classroom reserving on half the GPUs: 6 times)."""
    from fracspawner.culler.keep import Kept, released

    def kept(*mibs: float) -> list[Kept]:
        return [Kept((f"u{i}", ""), "h100", float(i), mib) for i, mib in enumerate(mibs)]

    two_eighths = released(kept(10194.0, 10194.0, 10194.0), {"h100": 20389.0})
    assert two_eighths == {("u0", ""), ("u1", "")}, f"{len(two_eighths)} released for a quarter"
    quarters = released(kept(20389.0, 20389.0, 20389.0, 20389.0), {"h100": 20389.0 + 40779.0})
    assert len(quarters) == 3, f"{len(quarters)} quarters released for a quarter and a half"
    # a slice short of the waiting one by more than its rounding is not enough
    assert len(released(kept(20000.0, 20000.0), {"h100": 20389.0})) == 2


async def test_no_kept_server_is_released_for_a_slot_another_stop_frees():
    """One pod waits; cat's server (GPU idle 3 h, its kernel on the GPU) is stopped this cycle
    for `gpu_idle` anyway, and frees the slot. Ann's kept hibernated server stays: it was
    stopped too, for nobody, and she lost her kernels (review s53; `release_for_waiting`
    already counted such stops)."""
    stopped, said = await cycle({"ann": (3.0, 0.0), "cat": (3.0, 2000.0)}, waiting=1)
    assert said["cat"].startswith("gpu_idle:"), said
    assert stopped == ["cat"], said
