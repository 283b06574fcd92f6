"""The host memory budget bounds hibernation itself (issue 36 item 2, goal "host memory peak
per node within the stated budget").

The budget used to be enforced after the fact: servers hibernated freely, and the culler then
shut down the oldest hibernated kernels of users away. Kernels it may never touch (those of
users present or in session: a hidden lecture tab may hibernate, never be shut down) could fill
a node past the budget, and the budget then took the away users' kernels, or nothing. Now a
kernel is hibernated only with room for it in its node's budget, counting every hibernated
kernel on the node (culler/hostroom.py, hostbudget.plan_room; serverext/swap.py asks).

Through the pure plan, and the capacity benchmark's replay of the product (the real monitor,
Hibernator, SwapAgent, Presence and `Culler.answer_report`, benchmarks/bench_culler.py).
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.bench_culler import OVERCOMMIT_KIND, Sim, replay
from benchmarks.culler_trace import Cluster, User
from fracspawner.culler.app import Culler
from fracspawner.culler.hostbudget import HibernatedKernel, Holder

try:  # the plan's names: new with this rule (the replay test runs on main without them)
    from fracspawner.culler.hostbudget import Want, plan_room
except ImportError:  # pragma: no cover
    Want = plan_room = None  # type: ignore[assignment,misc]

Q = 20000.0  # a kernel of a 1/4 H100 slice


def holder(user: str, since: float, *, present: bool = False) -> Holder:
    return Holder(user, "", "node-0", Q, present, (HibernatedKernel(f"{user}-k", Q, since),))


def test_a_present_user_s_kernel_that_does_not_fit_stays_on_the_gpu():
    spared = [holder("ann", 100.0, present=True), holder("bob", 200.0, present=True)]
    plan = plan_room("node-0", spared, 0.0, [Want("cat-k", Q)], Q, 50000.0, may_evict=False)
    assert plan.grants == () and plan.evictions == ()
    ((kid, why),) = plan.waits
    assert kid == "cat-k" and "10000 MiB left" in why and "stays on the GPU" in why
    # room held for another kernel (granted, not yet hibernated) counts too
    plan = plan_room("node-0", [], 40000.0, [Want("cat-k", Q)], Q, 50000.0, may_evict=False)
    assert plan.grants == ()
    plan = plan_room("node-0", spared, 0.0, [Want("cat-k", 9000.0)], Q, 50000.0, may_evict=False)
    assert plan.grants == (Want("cat-k", 9000.0),)


def test_an_away_user_s_kernel_makes_room_only_where_shutting_the_oldest_away_down_frees_it():
    # ann (present) and bob (away, the oldest) hold 40,000 of 50,000 MiB: cat's kernel needs
    # 20,000; bob's going frees enough, ann's is never touched
    group = [holder("ann", 50.0, present=True), holder("bob", 100.0)]
    plan = plan_room("node-0", group, 0.0, [Want("cat-k", Q)], Q, 50000.0, may_evict=True)
    assert [e.kernel_id for e in plan.evictions] == ["bob-k"] and plan.grants == ()
    assert plan.waits[0][1].startswith("waits for 1 older")
    # with only spared kernels there, nothing is shut down: it stays on the GPU
    spared = [holder("ann", 50.0, present=True), holder("dan", 60.0, present=True)]
    plan = plan_room("node-0", spared, 0.0, [Want("cat-k", Q)], Q, 50000.0, may_evict=True)
    assert plan.evictions == () and plan.grants == ()


def _lecture(minutes: int) -> list[User]:
    """Five students run a GPU cell in the first minutes. Four stay in the lecture with their
    notebook tab hidden behind the slides (in session: their kernels may hibernate, never be
    shut down); the fifth leaves at minute 3, closing the tab (away)."""
    users = []
    for i in range(5):
        u = User(f"st-{i}", int(Q))
        for m in range(minutes):
            if i < 4 or m < 3:
                u.present[m] = True
                u.tab_hidden[m] = m >= 3
                u.tab_open[m] = m < 3
                u.input[m] = m < 3
            u.cell[m] = u.gpu_cell[m] = m < 2
        users.append(u)
    return users


def test_hibernation_stays_within_the_node_budget_when_spared_kernels_hold_it(
    tmp_path: Path, monkeypatch
):
    """A node's budget of 3 kernels: the four students in session fill it as their kernels
    hibernate, the fourth's stays on the GPU; the student who left is not hibernated into a
    full budget (and so not shut down for it: no disruption)."""
    monkeypatch.setattr(Culler.host_memory_budget_mib, "default_value", 3 * Q + 1000.0)
    sims: list[Sim] = []
    minutes = 40
    import asyncio

    out = asyncio.run(
        replay(_lecture(minutes), OVERCOMMIT_KIND, "time_sliced", Cluster(1), tmp_path,
               minutes=minutes, sims=sims)
    )  # fmt: skip
    (sim,) = sims
    budget = 3 * Q + 1000.0
    assert sim.host_peak_node_mib <= budget, (
        f"hibernated beyond the node's budget: {sim.host_peak_node_mib:.0f} MiB held against "
        f"{budget:.0f} MiB"
    )
    assert out["kernel_shutdowns"] == 0 and sim.budget_orders == 0  # nobody loses a kernel
    assert out["culls_while_present"] == 0
    held = [s for s in sim.servers.values() if s.hibernated()]
    assert len(held) == 3  # the budget's worth is hibernated (idle, or swapped out)
    (kept,) = [s for s in sim.servers.values() if not s.hibernated() and s.kernel_id]
    note = kept.monitor.hibernator.kernels[kept.kernel_id].note
    assert "host memory budget of node node-0" in note and "stays on the GPU" in note


def test_the_culler_orders_no_swap_out_the_node_budget_has_no_room_for(tmp_path: Path, monkeypatch):
    """The culler's own swap orders (GPU memory pressure on the over-committed GPU) pass the
    same check: with a budget smaller than one kernel, none is ordered out, and the GPU stays
    held (newcomers wait in admission) instead of the node's host memory going over."""
    budget = Q / 2
    monkeypatch.setattr(Culler.host_memory_budget_mib, "default_value", budget)
    sims: list[Sim] = []
    import asyncio

    asyncio.run(
        replay(_lecture(20), OVERCOMMIT_KIND, "time_sliced", Cluster(1), tmp_path, minutes=20,
               sims=sims)
    )  # fmt: skip
    (sim,) = sims
    assert sim.swap_orders == 0, f"{sim.swap_orders} swap order(s) beyond the node's budget"
    assert sim.host_peak_node_mib == 0.0
    # the admin sees it: orders held by the budget, none counted as sent
    registry = sim.culler.metrics.registry
    pool = {"pool": "h100-ts"}
    held = registry.get_sample_value("fracspawner_swap_orders_held_by_host_budget_total", pool)
    assert held and held > 0, held
    assert not registry.get_sample_value("fracspawner_swap_orders_total", pool)


def test_room_given_is_held_until_its_server_reports_again():
    """Room given to one server's kernel is held until that server reports again (its report
    then counts the kernel hibernated), not for a fixed time: it may have hibernated the kernel
    the moment it got the room. (The breaks replay went 5.9 GiB over: a grant lapsed at 30 s,
    before the server's next report, and its room was given again.)"""
    from fracspawner.culler.hostroom import HostRoom

    rooms = HostRoom()
    ann = [holder("ann", 10.0)]
    plan = rooms.plan("bob", "", "node-0", ann, [Want("bob-k", 8000.0)], Q, 30000.0, 0.0,
                      {("bob", ""): 0.0}, away=True)  # fmt: skip
    assert plan.grants == (Want("bob-k", 8000.0),)
    for now, bob_reported in ((30.0, 0.0), (45.0, 30.0), (300.0, 0.0)):
        plan = rooms.plan("cat", "", "node-0", ann, [Want("cat-k", 8000.0)], Q, 30000.0, now,
                          {("bob", ""): bob_reported}, away=False)  # fmt: skip
        assert plan.grants == (), f"bob's room given again at {now} s"
    # bob reported after his room ran out without the kernel: it is free again
    plan = rooms.plan("cat", "", "node-0", ann, [Want("cat-k", 8000.0)], Q, 30000.0, 61.0,
                      {("bob", ""): 60.0}, away=False)  # fmt: skip
    assert plan.grants == (Want("cat-k", 8000.0),)


def test_one_servers_report_takes_at_most_its_own_gpus_of_the_node_budget():
    """A report is its server's word (issue 36 item 4: a report never moves other users'
    kernels). Each hibernated kernel counts up to its GPU's memory (a time-sliced kernel may
    hold more than its slice), so one report listing 50 kernels of 80 GiB used to fill the
    node's budget, and every other user's idle kernel then stayed on the GPU. All of one
    server's kernels together now count at most what its pod can hold on the GPUs it is bound
    to (Culler.host_share): the excess is ignored, logged once, and the others get room."""
    import logging
    import time

    from fracspawner.backends import load_catalog
    from fracspawner.culler.decide import ServerFacts
    from fracspawner.culler.identity import Identity
    from fracspawner.culler.reports import parse_report
    from tests.conftest import DEMO_CATALOG
    from tests.test_host_budget import Pods, report

    gpu = 80 * 1024.0  # the demo catalog's H100 80GB, each of eve's kernels claims all of it
    # (on HAMi each counts at most her 1/8 slice, and all of hers together that too)
    culler = Culler(host_memory_budget_mib=2 * gpu)
    culler._catalog = load_catalog(str(DEMO_CATALOG))
    culler.server_pods = Pods()  # both pods on node-a, one GPU each
    now = time.time()
    presence = {
        "known": True, "present": True, "last_present": iso_now(now), "tabs": 1,
        "visible_tabs": 1, "in_session": True, "elsewhere": False,
    }  # fmt: skip
    eve = report(now, [(f"e{i}", gpu, now - 5000 + i, False) for i in range(50)])
    eve["presence"] = presence  # present: hers may never be shut down to make room
    eve["swap"] = {"hibernate_wanted": [{"kernel_id": "e-more", "gpu_memory_mib": gpu}]}
    ann = report(now, [])
    ann["swap"] = {"hibernate_wanted": [{"kernel_id": "a1", "gpu_memory_mib": 10000.0}]}
    for user, body in (("eve", eve), ("ann", ann)):
        culler.known[(user, "")] = ServerFacts(user, user_options={"gpu": "1/8", "pool": "h100"})
        culler.reports.put(user, "", parse_report(body, received_at=now))
    lines: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    culler.log.addHandler(handler)
    try:
        answer = culler.answer_report(Identity("ann", ""), now) or {}
        swap = answer.get("swap") or {}
        assert swap.get("host_room") == [{"kernel_id": "a1", "gpu_memory_mib": 10000.0}], (
            f"another user's kernel got no room beside one hostile report: {swap}"
        )
        # eve's own further kernel waits: her kernels already hold all her GPU can
        swap = (culler.answer_report(Identity("eve", ""), now) or {}).get("swap") or {}
        assert "host_room" not in swap
        ((wait,),) = [swap["host_wait"]]
        assert wait["kernel_id"] == "e-more" and "its pod's GPUs" in wait["reason"]
        culler.answer_report(Identity("ann", ""), now)
    finally:
        culler.log.removeHandler(handler)
    over = [line for line in lines if "beyond what its pod" in line]
    assert len(over) == 1 and over[0].startswith("eve"), over


def iso_now(t: float) -> str:
    from tests.test_host_budget import iso

    return iso(t)


def test_shutting_down_a_server_above_its_share_frees_nothing_until_it_is_within():
    """A server counts at most its share (Holder.share_mib): shutting one of its many listed
    kernels down frees no counted room while the rest still fill its share, so the plan asks
    for all of them (its own) before counting the room as made, and never ann's."""
    eve = Holder("eve", "", "node-0", Q, False,
                 tuple(HibernatedKernel(f"e{i}", Q, float(i)) for i in range(5)), Q)  # fmt: skip
    group = [eve, holder("ann", 100.0)]
    plan = plan_room("node-0", group, 0.0, [Want("cat-k", Q)], Q, 2 * Q, may_evict=True)
    assert [e.kernel_id for e in plan.evictions] == ["e0", "e1", "e2", "e3", "e4"]
    assert plan.grants == () and plan.waits[0][1].startswith("waits for 5 older")
    # eve's own want beyond her share stays on the GPU, whatever room the node has
    plan = plan_room("node-0", group, 0.0, [Want("e5", Q)], Q, 100 * Q, may_evict=True,
                     own_mib=eve.held_mib(), share_mib=eve.share_mib)  # fmt: skip
    assert plan.grants == () and "its pod's GPUs can hold" in plan.waits[0][1]


def test_the_over_share_log_forgets_a_server_gone_or_within_its_share():
    """The culler logs an over-share report once per server (Culler._note_over_share), not at
    every report; what it remembers for that is bounded by the servers reporting now: a server
    gone, or whose report is within its share again, is forgotten (its set grew by one entry per
    server over the culler's life), so a later excess of a server of that name is logged again."""
    import logging
    import time

    from fracspawner.backends import load_catalog
    from fracspawner.culler.decide import ServerFacts
    from fracspawner.culler.identity import Identity
    from fracspawner.culler.reports import parse_report
    from tests.conftest import DEMO_CATALOG
    from tests.test_host_budget import Pods, report

    gpu = 80 * 1024.0  # the demo catalog's H100 80GB: three kernels of it are over eve's share
    culler = Culler(host_memory_budget_mib=4 * gpu)
    culler._catalog = load_catalog(str(DEMO_CATALOG))
    culler.server_pods = Pods()
    now = time.time()

    def reports(user: str, kernels: int) -> None:
        culler.known[(user, "")] = ServerFacts(user, user_options={"gpu": "1/8", "pool": "h100"})
        body = report(now, [(f"{user}{i}", gpu, now - 5000 + i, False) for i in range(kernels)])
        culler.reports.put(user, "", parse_report(body, received_at=now))
        culler.answer_report(Identity(user, ""), now)

    lines: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    culler.log.addHandler(handler)
    try:
        reports("ann", 0)
        for user in ("eve", "bob"):
            reports(user, 3)
            reports(user, 3)  # once per server, not per report
        assert culler._host_over == {("eve", ""), ("bob", "")}
        # eve's server is gone (culled: Culler._act forgets its report; the hub lists it no
        # more), and bob's report is within his share again
        culler.reports.forget("eve", "")
        del culler.known[("eve", "")]
        reports("bob", 1)
        reports("ann", 0)
        assert culler._host_over == set(), "a server gone or within its share is remembered"
        reports("eve", 3)  # a new server of eve's, over its share: logged again
        reports("bob", 3)
    finally:
        culler.log.removeHandler(handler)
    over = [line.split(":")[0] for line in lines if "beyond what its pod" in line]
    assert over == ["eve", "bob", "eve", "bob"], over


def test_no_room_is_given_out_of_a_shut_down_not_yet_seen():
    """Room that a shut-down ordered will free is still held until the kernel's server reports
    it gone: no kernel hibernates into it meanwhile. (The research time-sliced replay without
    over-commit went to 74 GiB on one node of a 64 GiB budget: bob's first kernel needed ann's
    40,960 MiB one shut down, and the rest of what that would free was given, in the same
    answer, to bob's second kernel, which hibernated while ann's was still in host memory.)"""
    from fracspawner.culler.hostroom import HostRoom

    budget = 65536.0
    ann = Holder("ann", "", "node-0", 40960.0, False, (HibernatedKernel("ann-k", 40960.0, 1.0),))
    ozzy = Holder("oz", "", "node-0", Q, True, (HibernatedKernel("oz-k", Q, 1.0),))
    rooms = HostRoom()
    wants = [Want("bob-1", Q), Want("bob-2", 15000.0)]
    plan = rooms.plan("bob", "", "node-0", [ann, ozzy], wants, 40960.0, budget, 10.0,
                      {("bob", ""): 10.0}, away=True)  # fmt: skip
    assert [e.kernel_id for e in plan.evictions] == ["ann-k"]
    assert plan.grants == (), "room given before the shut-down it needs was seen"
    assert {kid for kid, why in plan.waits if why.startswith("waits for ")} == {"bob-1", "bob-2"}
    # nobody else takes that room meanwhile
    plan = rooms.plan("cat", "", "node-0", [ann, ozzy], [Want("cat-k", 4000.0)], Q, budget,
                      20.0, {("bob", ""): 10.0}, away=True)  # fmt: skip
    assert plan.grants == ()
    # ann's server reported her kernel gone: bob's kernels have their room
    plan = rooms.plan("bob", "", "node-0", [ozzy], wants, 40960.0, budget, 70.0,
                      {("bob", ""): 70.0, ("ann", ""): 65.0}, away=True)  # fmt: skip
    assert plan.grants == (Want("bob-1", Q), Want("bob-2", 15000.0)) and plan.evictions == ()


def test_a_want_reported_again_orders_no_second_shut_down():
    """bob's kernel (away) needs ann's oldest kernel shut down. bob's server reports again
    20 s later (the extension lists the want until it hibernates; servers under pressure
    report every 20 s), before ann's server reported the shut-down done (once a minute): the
    second plan waits for the same shut-down and orders nobody else's kernel out. It did
    order dan's: each report of one want took another user's kernel (review s53)."""
    from fracspawner.culler.hostroom import HostRoom

    budget = 2 * Q
    ann = Holder("ann", "", "node-0", Q, False, (HibernatedKernel("ann-k", Q, 1.0),))
    dan = Holder("dan", "", "node-0", Q, False, (HibernatedKernel("dan-k", Q, 2.0),))
    rooms = HostRoom()
    plan = rooms.plan("bob", "", "node-0", [ann, dan], [Want("bob-k", Q)], Q, budget, 10.0,
                      {("bob", ""): 10.0}, away=True)  # fmt: skip
    assert [e.kernel_id for e in plan.evictions] == ["ann-k"]
    for t in (30.0, 50.0):
        plan = rooms.plan("bob", "", "node-0", [ann, dan], [Want("bob-k", Q)], Q, budget, t,
                          {("bob", ""): t, ("ann", ""): 0.0}, away=True)  # fmt: skip
        assert plan.evictions == (), plan.evictions
        assert plan.grants == ()
        assert plan.waits == (("bob-k", "waits for 1 older hibernated kernel(s) on node node-0 "
                                "to be shut down"),)  # fmt: skip
    # ann's server reported her kernel gone: bob's kernel has its room, dan's stays
    plan = rooms.plan("bob", "", "node-0", [dan], [Want("bob-k", Q)], Q, budget, 70.0,
                      {("bob", ""): 70.0, ("ann", ""): 65.0}, away=True)  # fmt: skip
    assert plan.grants == (Want("bob-k", Q),) and plan.evictions == ()


def test_answer_report_again_for_one_want_shuts_one_kernel_down():
    """The same through `Culler.answer_report`: bob's kernel waits for host room, and his
    next report (ann's and dan's servers have not reported since) orders only ann's kernel
    out, not dan's too."""
    import time

    from fracspawner.backends import load_catalog
    from fracspawner.culler.decide import ServerFacts
    from fracspawner.culler.identity import Identity
    from fracspawner.culler.reports import parse_report
    from tests.conftest import DEMO_CATALOG
    from tests.test_host_budget import QUARTER_T4, Pods, report

    culler = Culler(host_memory_budget_mib=2 * QUARTER_T4)
    culler._catalog = load_catalog(str(DEMO_CATALOG))
    culler.server_pods = Pods()
    now = time.time()
    want = {"hibernate_wanted": [{"kernel_id": "b1", "gpu_memory_mib": QUARTER_T4}]}
    servers = (
        ("ann", [("a1", QUARTER_T4, now - 5000, False)]),
        ("dan", [("d1", QUARTER_T4, now - 4000, False)]),
        ("bob", []),
    )
    for user, kernels in servers:
        culler.known[(user, "")] = ServerFacts(user, user_options={"gpu": "1/4", "pool": "t4"})
        body = report(now, kernels)
        if user == "bob":
            body["swap"] = want
        culler.reports.put(user, "", parse_report(body, received_at=now))
    first = culler.answer_report(Identity("bob", ""), now)["swap"]
    assert first["host_wait"][0]["reason"].startswith("waits for 1 older")
    body = report(now + 20, [])
    body["swap"] = want
    culler.reports.put("bob", "", parse_report(body, received_at=now + 20))
    again = culler.answer_report(Identity("bob", ""), now + 20)["swap"]
    assert again["host_wait"][0]["reason"].startswith("waits for 1 older")
    told = {
        u: (culler.answer_report(Identity(u, ""), now + 25) or {}).get("swap", {}).get("shutdown")
        for u in ("ann", "dan")
    }
    assert [o["kernel_id"] for o in told["ann"]] == ["a1"]
    assert told["dan"] is None


def test_an_unlisted_server_whose_pod_the_watch_does_not_know_gets_no_room():
    """A server the hub has not listed yet gets no host room until it is (it is not counted on
    its node). That held only where the pod watch knew its node: one it did not know yet got
    room for every kernel it asked for, with no budget at all (review s53)."""
    import time

    from fracspawner.backends import load_catalog
    from fracspawner.culler.identity import Identity
    from fracspawner.culler.reports import parse_report
    from tests.conftest import DEMO_CATALOG
    from tests.test_host_budget import QUARTER_T4, report

    class Unknown:  # the pod watch, before it has seen the new pod
        def placement(self, name: str):
            return None

    culler = Culler(host_memory_budget_mib=2 * QUARTER_T4)
    culler._catalog = load_catalog(str(DEMO_CATALOG))
    culler.server_pods = Unknown()
    now = time.time()
    body = report(now, [])
    body["swap"] = {"hibernate_wanted": [{"kernel_id": f"n{i}", "gpu_memory_mib": QUARTER_T4}
                                         for i in range(8)]}  # fmt: skip
    culler.reports.put("newt", "", parse_report(body, received_at=now))
    swap = (culler.answer_report(Identity("newt", ""), now) or {}).get("swap", {})
    assert "host_room" not in swap, swap
    assert swap["host_wait"][0]["reason"].endswith("the culler has not listed this server yet")


def test_on_a_pool_that_holds_pods_to_their_slice_a_server_s_host_share_is_its_slice():
    """HAMi-core holds a pod's kernels, a hibernated one's memory included, to its slice: a 1/8
    server's hibernated kernels hold at most an eighth of the GPU in host memory, so that is
    its share of the node's budget, the most other users' kernels may be shut down for. It
    was a whole GPU per kernel, as on time-slicing (review s53). Time-slicing keeps the GPU:
    nothing limits a kernel to its slice there."""
    from fracspawner.backends import load_catalog
    from fracspawner.culler.decide import ServerFacts
    from fracspawner.culler.placement import Placement
    from fracspawner.model.slices import parse_slice, slice_memory_mib
    from tests.conftest import DEMO_CATALOG

    culler = Culler()
    culler._catalog = load_catalog(str(DEMO_CATALOG))
    eighth = ServerFacts("eve", user_options={"gpu": "1/8", "pool": "h100"})
    quarter_t4 = ServerFacts("tim", user_options={"gpu": "1/4", "pool": "t4"})
    where = Placement("node-a", 1)
    h100 = culler._catalog.pools["h100"].gpu.device_memory_mib
    t4 = culler._catalog.pools["t4"].gpu.device_memory_mib
    eighth_mib = slice_memory_mib(parse_slice("1/8"), culler._catalog.pools["h100"].gpu)
    assert eighth_mib < h100 / 4  # an eighth, by the catalog's own sizing (whole MiB)
    assert culler.host_cap(eighth, 1e6) == culler.host_share(eighth, where, 1e6) == eighth_mib
    assert culler.host_cap(quarter_t4, 1e6) == culler.host_share(quarter_t4, where, 1e6) == t4


# --- copies under way at the rates measured on an H200 (docs/serverext.md "First run on a GPU":
# a checkpoint copies at 1.4-1.9 GiB/s, a restore at 3.4-5.5 GiB/s) ----------------------------
WHOLE = 76000.0  # a kernel of a whole H100 (HAMi): 39-53 s to checkpoint, 14-22 s to restore


def _h100_culler(budget_mib: float):
    """A culler with the demo catalog, every server a whole H100 (HAMi) on node-a."""
    from fracspawner.backends import load_catalog
    from fracspawner.culler.decide import ServerFacts
    from tests.conftest import DEMO_CATALOG
    from tests.test_host_budget import Pods

    culler = Culler(host_memory_budget_mib=budget_mib)
    culler._catalog = load_catalog(str(DEMO_CATALOG))
    culler.server_pods = Pods()
    for user in ("bob", "cat"):
        culler.known[(user, "")] = ServerFacts(user, user_options={"gpu": "1", "pool": "h100"})
    return culler


def _says(culler: Culler, user: str, at: float, kernels=(), wants=()) -> dict:
    """`user`'s server reports at `at` (its kernels' hibernation states, the kernels it would
    hibernate); the culler's answer's `swap`."""
    from fracspawner.culler.identity import Identity
    from fracspawner.culler.reports import parse_report
    from tests.test_host_budget import report

    body = report(at, [])
    body["kernels"] = [
        {"id": kid, "execution_state": "idle", "gpu_memory_mib": on_gpu,
         "hibernation": {"state": state, "hibernated_gpu_memory_mib": in_host,
                         "waiting_for_gpu": state == "resuming"}}
        for kid, state, on_gpu, in_host in kernels
    ]  # fmt: skip
    if wants:
        body["swap"] = {"hibernate_wanted": [{"kernel_id": k, "gpu_memory_mib": m}
                                             for k, m in wants]}  # fmt: skip
    culler.reports.put(user, "", parse_report(body, received_at=at))
    return (culler.answer_report(Identity(user, ""), at) or {}).get("swap", {})


def test_room_given_is_held_while_its_server_reports_the_checkpoint_under_way():
    """bob's kernel is given room in the node's budget and starts its checkpoint: 74 GiB take
    39-53 s to copy. His server reports at 45 s, the kernel "hibernating" (its GPU state half
    in host memory, none of it counted as hibernated yet). The room was held 30 s, or until
    his server reported after that without the kernel hibernated, so it was free at that
    report and given to cat's kernel: both copies in room for one, the node's host memory
    over its budget. It is held now while his server reports the copy under way."""
    import time

    culler = _h100_culler(budget_mib=120000.0)
    now = time.time()
    _says(culler, "cat", now)  # heard from: a listed server not heard from counts at its bound
    assert _says(culler, "bob", now, wants=[("b1", WHOLE)])["host_room"] == [
        {"kernel_id": "b1", "gpu_memory_mib": WHOLE}
    ]
    _says(culler, "bob", now + 45, kernels=[("b1", "hibernating", WHOLE, 0.0)])
    swap = _says(culler, "cat", now + 46, wants=[("c1", WHOLE)])
    assert "host_room" not in swap, "bob's room, his copy still under way, given to cat"
    assert swap["host_wait"][0]["kernel_id"] == "c1"
    # bob's kernel is hibernated: his report counts it, and cat's kernel still waits
    _says(culler, "bob", now + 60, kernels=[("b1", "hibernated", 0.0, WHOLE)])
    assert "host_room" not in _says(culler, "cat", now + 61, wants=[("c1", WHOLE)])
    # its copy failed instead (the kernel back on the GPU): the room is free again
    culler = _h100_culler(budget_mib=120000.0)
    _says(culler, "cat", now)
    _says(culler, "bob", now, wants=[("b1", WHOLE)])
    _says(culler, "bob", now + 45, kernels=[("b1", "hibernating", WHOLE, 0.0)])
    _says(culler, "bob", now + 60, kernels=[("b1", "running", WHOLE, 0.0)])
    assert "host_room" in _says(culler, "cat", now + 61, wants=[("c1", WHOLE)])


def test_a_copy_its_server_reports_counts_once():
    """A server now reports what its checkpoint under way copies (serverext/hibernate.py): the
    room held for that kernel is then counted by the report itself, not held beside it as
    well. Counted twice, cat's kernel waited for room the node had."""
    import time

    from fracspawner.culler.decide import ServerFacts

    culler = _h100_culler(budget_mib=2.5 * WHOLE)
    now = time.time()
    assert "host_room" in _says(culler, "bob", now, wants=[("b1", WHOLE)])
    _says(culler, "bob", now + 45, kernels=[("b1", "hibernating", WHOLE, WHOLE)])
    swap = _says(culler, "cat", now + 46, wants=[("c1", WHOLE)])
    assert swap.get("host_room") == [{"kernel_id": "c1", "gpu_memory_mib": WHOLE}], swap
    # and the copy it reports still counts: a third kernel of that size does not fit
    _says(culler, "cat", now + 47, kernels=[("c1", "hibernating", WHOLE, WHOLE)])
    culler.known[("dan", "")] = ServerFacts("dan", user_options={"gpu": "1", "pool": "h100"})
    assert "host_room" not in _says(culler, "dan", now + 48, wants=[("d1", WHOLE)])


def test_a_kernel_being_restored_still_holds_its_host_memory():
    """bob's hibernated kernel is coming back: 74 GiB take 14-22 s to restore, and its GPU
    state is in host memory until the restore is done. His report says "resuming", which was
    not counted in the node's budget, and cat's kernel was given room meanwhile: the node's
    host memory over its budget while both were there. It counts now, and is never ordered
    shut down while it comes back."""
    import time

    culler = _h100_culler(budget_mib=120000.0)
    now = time.time()
    _says(culler, "bob", now, kernels=[("b1", "hibernated", 0.0, WHOLE)])
    _says(culler, "bob", now + 10, kernels=[("b1", "resuming", 20000.0, WHOLE)])
    swap = _says(culler, "cat", now + 11, wants=[("c1", WHOLE)])
    assert "host_room" not in swap, "cat's kernel hibernated beside a restore under way"
    _says(culler, "bob", now + 30, kernels=[("b1", "running", WHOLE, 0.0)])
    assert "host_room" in _says(culler, "cat", now + 31, wants=[("c1", WHOLE)])
    # counted, it is still never shut down for the budget while it comes back (its person
    # has just run a cell), on a node whose budget it alone is over
    culler = _h100_culler(budget_mib=WHOLE / 2)
    swap = _says(culler, "bob", now, kernels=[("b1", "resuming", 20000.0, WHOLE)])
    assert "shutdown" not in swap, swap
