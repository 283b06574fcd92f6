"""Host memory per node (issue 36, item 2): hibernated kernels are kept rather than shut down,
and the culler keeps what a node's servers hold in host memory within a budget, the oldest
first; shutting a kernel down is the last resort, by its own server, counted as a kernel
shutdown. Never a kernel whose resume waits, nor one of a user present or in session.

The decision (culler/hostbudget.py, pure), the culler's answer to a report (the real
`Culler.answer_report` over reports parsed as they arrive) and the server taking the order
(serverext/swap.py's SwapAgent on tests/test_presence.py's server model).
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone

from fracspawner.backends import load_catalog
from fracspawner.culler.app import Culler
from fracspawner.culler.decide import ServerFacts
from fracspawner.culler.hostbudget import HibernatedKernel, Holder, plan_evictions
from fracspawner.culler.identity import Identity
from fracspawner.culler.placement import Placement
from fracspawner.culler.reports import parse_report
from fracspawner.serverext.hibernate import KernelSleep
from fracspawner.serverext.swap import SwapAgent
from tests.conftest import DEMO_CATALOG
from tests.test_hibernation_driver import (  # noqa: F401 (fixtures)
    add_process,
    fake,
    set_process,
    sleeper,
    suspend,
)
from tests.test_hibernation_room import plain, until, wired  # noqa: F401 (fixtures)
from tests.test_presence import Server

GIB = 1024.0
QUARTER_T4 = 3840.0  # the demo catalog's 1/4 T4 (15360 MiB)


def holder(user: str, *kernels: tuple[str, float, float], node="node-a", **kw) -> Holder:
    ks = tuple(HibernatedKernel(kid, mib, since, **kw.pop("k", {})) for kid, mib, since in kernels)
    return Holder(user, "", node, kw.pop("cap", QUARTER_T4), kernels=ks, **kw)


def test_the_oldest_hibernated_kernels_go_first_until_the_node_fits():
    holders = [
        holder("ann", ("a1", 3000, 100.0), ("a2", 3000, 400.0)),
        holder("bob", ("b1", 3000, 200.0)),
        holder("cat", ("c1", 3000, 300.0)),
        holder("dan", ("d1", 3000, 50.0), node="node-b"),  # another node: its own budget
    ]
    # node-a holds 12,000 MiB, budget 7,000: two must go, the oldest (a1 at 100, b1 at 200)
    out = plan_evictions(holders, 7000.0)
    assert [(e.user, e.kernel_id) for e in out] == [("ann", "a1"), ("bob", "b1")]
    assert "node-a" in out[0].reason and "oldest" in out[0].reason
    assert plan_evictions(holders, 12000.0) == []  # within budget: nothing


def test_never_a_waiting_resume_nor_a_present_user_s_kernel():
    holders = [
        holder("ann", ("a1", 3000, 100.0), k={"waiting": True}),  # its cell waits for room
        holder("bob", ("b1", 3000, 200.0), present=True),
        holder("cat", ("c1", 3000, 300.0)),
    ]
    out = plan_evictions(holders, 1000.0)
    assert [e.kernel_id for e in out] == ["c1"]  # the only one it may touch, still over


def test_one_servers_inflated_word_shuts_its_own_kernels_down_first():
    """A report is its server's word: each kernel counts at most its slice, and servers above
    an equal share of the budget lose theirs first."""
    liar = holder("eve", *[(f"e{i}", 10**6, 500.0 + i) for i in range(4)])
    holders = [holder("ann", ("a1", 3000, 1.0)), liar]
    out = plan_evictions(holders, 8000.0)
    assert {e.user for e in out} == {"eve"}
    assert all(e.mib == QUARTER_T4 for e in out)


# --- the culler's answer ---------------------------------------------------------------------
def iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat().replace("+00:00", "Z")


def report(now: float, kernels: list[tuple[str, float, float, bool]]) -> dict:
    return {
        "available": True, "sampled_at": iso(now), "monitor_started": iso(now - 7200),
        "server_last_activity": iso(now - 3600), "user_last_activity": iso(now - 3600),
        "gpu_memory_mib": 0, "gpu_activity_known": True, "gpu_idle_since": iso(now - 3600),
        "kernels": [
            {"id": kid, "execution_state": "idle", "gpu_memory_mib": 0,
             "hibernation": {"state": "hibernated", "hibernated_gpu_memory_mib": mib,
                             "hibernated_since": iso(since), "waiting_for_gpu": waiting}}
            for kid, mib, since, waiting in kernels
        ],
    }  # fmt: skip


class Pods:
    """The culler's pod watch, as far as the answer reads it: every server on node-a."""

    def placement(self, name: str) -> Placement:
        return Placement("node-a")


def test_the_culler_orders_the_oldest_hibernated_kernel_of_a_full_node_shut_down():
    culler = Culler(host_memory_budget_mib=2.5 * QUARTER_T4)
    culler._catalog = load_catalog(str(DEMO_CATALOG))
    culler.server_pods = Pods()
    now = time.time()
    kernels = {
        "ann": [("a1", QUARTER_T4, now - 5000, False)],  # the oldest
        "bob": [("b1", QUARTER_T4, now - 4000, False)],
        "cat": [("c1", QUARTER_T4, now - 9000, True)],  # older still, but its cell waits
    }
    for user, ks in kernels.items():
        culler.known[(user, "")] = ServerFacts(user, user_options={"gpu": "1/4", "pool": "t4"})
        culler.reports.put(user, "", parse_report(report(now, ks), received_at=now))
    answer = culler.answer_report(Identity("ann", ""))
    assert answer is not None, "no order: the node keeps 3 quarters of hibernated state"
    (order,) = answer["swap"]["shutdown"]
    assert order["kernel_id"] == "a1" and "budget" in order["reason"]
    assert culler.answer_report(Identity("bob", "")) is None  # a1 alone brings it within
    assert culler.answer_report(Identity("cat", "")) is None  # waiting: never


def test_the_budget_spares_a_user_in_session():
    """A user in session (a tab open and reporting, seen within the session timeout: the silent
    reader, the hidden lecture tab) keeps their kernels from shutdown (issue 36 item 3): the
    budget takes the others' first, and never theirs."""
    culler = Culler(host_memory_budget_mib=1.5 * QUARTER_T4)
    culler._catalog = load_catalog(str(DEMO_CATALOG))
    culler.server_pods = Pods()
    now = time.time()
    presence = {
        "known": True, "present": False, "last_present": iso(now - 2700), "tabs": 1,
        "visible_tabs": 1, "in_session": True, "elsewhere": False,
    }  # fmt: skip
    for user, since in (("ann", now - 5000), ("bob", now - 4000)):
        body = report(now, [(f"{user[0]}1", QUARTER_T4, since, False)])
        if user == "ann":  # the oldest, but her person reads at a visible tab since 45 min
            body["presence"] = presence
        culler.known[(user, "")] = ServerFacts(user, user_options={"gpu": "1/4", "pool": "t4"})
        culler.reports.put(user, "", parse_report(body, received_at=now))
    assert culler.answer_report(Identity("ann", "")) is None  # in session: never hers
    (order,) = culler.answer_report(Identity("bob", ""))["swap"]["shutdown"]
    assert order["kernel_id"] == "b1"


# --- the server takes the order --------------------------------------------------------------
def test_the_server_shuts_down_only_a_still_hibernated_kernel(monkeypatch):
    server = Server(monkeypatch)
    server.km.kernels["w"] = server.km.kernels["k"]
    hib = server.monitor.hibernator
    hib.kernels["k"] = KernelSleep("k", state="hibernated", memory_mib=GIB)
    hib.kernels["w"] = KernelSleep("w", state="hibernated", memory_mib=GIB, gpu_full=True)

    async def take() -> None:
        swap = SwapAgent(server.monitor, lambda seconds: None)
        orders = [{"kernel_id": kid, "reason": "budget"} for kid in ("k", "w", "someone-else")]
        swap.on_answer({"swap": {"shutdown": orders}})
        await asyncio.gather(*swap._tasks)

    asyncio.run(take())
    assert list(server.km.kernels) == ["w"]  # its resume waits: kept
    assert [c["id"] for c in server.monitor.culled] == ["k"]  # counted as a kernel shutdown


class KernelManager:
    """The server's kernel manager as SwapAgent._shut_down uses it."""

    def __init__(self, ids: set[str]) -> None:
        self.ids, self.shut = set(ids), []

    def list_kernel_ids(self) -> list[str]:
        return list(self.ids)

    async def shutdown_kernel(self, kid: str) -> None:
        self.shut.append(kid)
        self.ids.discard(kid)


async def test_a_shutdown_order_spares_a_kernel_whose_resume_is_under_way(fake, sleeper, plain):  # noqa: F811 (the fixtures)
    """Nothing a person is using is shut down. A user runs a cell in a hibernated kernel; its
    first restore fails with a transient error (CUDA_ERROR_NOT_READY), so it reads
    "restore_failed" (not waiting for room) while the hibernator retries, the cell held. The
    culler's budget answer, computed from a report sent before the cell, orders it shut down:
    before, the server did, and the user's variables and the held cell were lost (review s53
    finding 1). Now the order is refused, the culler is told at once (a report now, the kernel
    still there and not counted as shut down), and the cell runs once the restore passes."""
    state, cgroup = fake
    pid = sleeper.pid
    hib, monitor, agent, soon, _told = wired(state, cgroup, retry_first=0.5)
    km = KernelManager({"k"})
    monitor.settings, monitor.culled = {"kernel_manager": km}, []
    add_process(state, pid, 2 * GIB)
    assert await suspend(hib, "k", pid, 2 * GIB) == "hibernated"
    set_process(state, pid, restore_transient=1)
    task = hib.resume("k", "a message to the kernel")  # the user's cell is held
    await until(lambda: hib.kernels["k"].state == "restore_failed", "the first restore failing")
    assert not task.done()  # retried shortly, the cell still held
    soon.clear()
    agent.on_answer({"swap": {"shutdown": [{"kernel_id": "k"}]}})
    await asyncio.gather(*agent._tasks)
    assert km.shut == [], "a kernel whose resume was in progress (a cell held) was shut down"
    assert monitor.culled == [] and soon == [0.0]  # the culler hears it was not, at once
    assert await asyncio.wait_for(task, 20) is True  # the cell runs


# --- one order per kernel ----------------------------------------------------------------------
def _budget_culler(budget_mib: float, kernels: dict, now: float) -> Culler:
    """A culler with the demo catalog's 1/4 T4 servers on node-a, each reporting `kernels`."""
    culler = Culler(host_memory_budget_mib=budget_mib)
    culler._catalog = load_catalog(str(DEMO_CATALOG))
    culler.server_pods = Pods()
    for user, ks in kernels.items():
        culler.known[(user, "")] = ServerFacts(user, user_options={"gpu": "1/4", "pool": "t4"})
        culler.reports.put(user, "", parse_report(report(now, ks), received_at=now))
    return culler


def _refuses(culler: Culler, user: str, at: float, kernels: list) -> list[str]:
    """`user`'s server reports at `at`, its kernels read "restore_failed": each one's restore
    is being retried after a transient error, a cell held (hibernate.py), so the server refused
    the shut-down (serverext/swap.py `_shut_down`) and reported at once. The kernels the
    culler's answer orders shut down."""
    body = report(at, kernels)
    for k in body["kernels"]:
        k["hibernation"]["state"] = "restore_failed"
    culler.reports.put(user, "", parse_report(body, received_at=at))
    return _shutdown(culler, user, at)


def _shutdown(culler: Culler, user: str, at: float) -> list[str]:
    swap = (culler.answer_report(Identity(user, ""), at) or {}).get("swap") or {}
    return [o["kernel_id"] for o in swap.get("shutdown") or []]


def test_a_refused_shut_down_is_not_ordered_again_at_each_answer():
    """ann's oldest kernel is ordered shut down for the node's budget. Her person has just run
    a cell in it and its restore is being retried (a transient error): her server refuses the
    order and reports at once, the kernel still there. Each answer ordered it again, so the
    server refused and reported again at once, until the report rate limit answered 429 and
    her server's reports (her waiting kernels, her presence) were held back. A kernel is told
    once; refused, it is told again only after EVICT_SECONDS (180 s), and no other user's
    kernel goes in its place meanwhile."""
    now = time.time()
    a1 = [("a1", QUARTER_T4, now - 5000, False)]
    culler = _budget_culler(
        1.5 * QUARTER_T4, {"ann": a1, "bob": [("b1", QUARTER_T4, now - 4000, False)]}, now
    )
    assert _shutdown(culler, "ann", now) == ["a1"]
    for t in (1.0, 2.0, 21.0, 61.0, 170.0):
        assert _refuses(culler, "ann", now + t, a1) == [], f"a1 ordered again at {t:.0f} s"
        assert _shutdown(culler, "bob", now + t) == [], "bob's kernel shut down in a1's place"
    assert _refuses(culler, "ann", now + 181.0, a1) == ["a1"]  # the backoff is over
    assert _refuses(culler, "ann", now + 182.0, a1) == []


def test_a_shut_down_ordered_for_room_is_told_once_and_nobody_else_goes_for_it():
    """bob's kernel (away) waits for host room; ann's oldest kernel is ordered out for it
    (hostroom.py). ann's server refuses (a restore being retried) and reports at once: the
    order was told again at each of her answers. Once the order lapses (EVICT_SECONDS),
    bob's next report plans anew: dan's kernel was ordered out in ann's place where ann's
    server had not reported since (the lapsed order still left her kernel out of the plan),
    though ann's kernel was the oldest and nothing was shut down for bob; ann's is asked
    again, once."""
    now = time.time()
    a1 = [("a1", QUARTER_T4, now - 5000, False)]
    culler = _budget_culler(
        2 * QUARTER_T4,
        {"ann": a1, "dan": [("d1", QUARTER_T4, now - 4000, False)], "bob": []},
        now,
    )
    want = {"hibernate_wanted": [{"kernel_id": "b1", "gpu_memory_mib": QUARTER_T4}]}

    def bob(at: float) -> dict:
        body = report(at, [])
        body["swap"] = want
        culler.reports.put("bob", "", parse_report(body, received_at=at))
        return (culler.answer_report(Identity("bob", ""), at) or {}).get("swap") or {}

    assert bob(now)["host_wait"][0]["reason"].startswith("waits for 1 older")
    assert _shutdown(culler, "ann", now + 5) == ["a1"]
    assert _refuses(culler, "ann", now + 6, a1) == [], "a1 ordered again after its refusal"
    for t in (20.0, 40.0, 60.0):
        assert bob(now + t)["host_wait"][0]["reason"].startswith("waits for 1 older")
        assert _shutdown(culler, "dan", now + t + 1) == []
    assert _refuses(culler, "ann", now + 66, a1) == []
    # the order lapsed at 180 s; ann's server has not reported since 66 s
    assert bob(now + 200)["host_wait"][0]["reason"].startswith("waits for 1 older")
    assert _shutdown(culler, "dan", now + 201) == [], "dan's kernel shut down in ann's place"
    assert _refuses(culler, "ann", now + 220, a1) == ["a1"]
    assert _refuses(culler, "ann", now + 221, a1) == []
