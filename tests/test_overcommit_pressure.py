"""The culler's decision under GPU memory pressure on an over-committed pool (pure): which idle
kernels are swapped out, least recently used first; the margin; never a busy, unknown, present
or already hibernated kernel; unknown memory never counted as free; one pressure asks once.
Eight 1/4 servers of a T4 (15360 MiB as NVML reports it) over-committed twice, as in issue 26.
"""

from __future__ import annotations

import pytest

from fracspawner.culler.pressure import KernelOnGpu, ServerOnGpu, plan_swaps, swap_facts
from fracspawner.culler.swapdesk import Seat, SwapDesk

SIZE = 15360.0
QUARTER = SIZE / 4
UUID = "GPU-fake-0"


def server(
    i: int, *, resident: bool = True, last_used: float | None = None, **kernel
) -> ServerOnGpu:
    """Server s<i> with one kernel k<i> holding its quarter (resident) or hibernated."""
    k = KernelOnGpu(
        kernel_id=f"k{i}",
        resident_mib=QUARTER if resident else 0.0,
        idle=kernel.pop("idle", True),
        last_used=float(i) if last_used is None else last_used,
        hibernated=not resident,
    )
    return ServerOnGpu(
        user=f"u{i}",
        server="",
        cap_mib=QUARTER,
        resident_mib=k.resident_mib,
        kernels=(k,),
        **kernel,
    )


def chosen(pressure) -> list[str]:
    return [s.kernel_id for s in pressure.swaps]


def test_eight_quarters_one_gpu_the_least_recently_used_idle_kernels_go_first():
    # u1..u4 resident, last used at 40, 5, 30 and 20; u5..u8 hibernated; u6 comes back: its
    # kernel waits to resume, so one quarter must leave: u2's, used longest ago
    servers = [
        server(i, last_used=used) for i, used in zip((1, 2, 3, 4), (40, 5, 30, 20), strict=True)
    ]
    servers += [server(i, resident=False) for i in range(5, 9)]
    servers[5] = ServerOnGpu(**{**servers[5].__dict__, "waiting_mib": QUARTER})
    p = plan_swaps(UUID, SIZE, servers)
    assert (p.resident_mib, p.waiting_mib, p.excess_mib) == (SIZE, QUARTER, QUARTER)
    assert chosen(p) == ["k2"]
    assert p.swaps[0].user == "u2" and p.swaps[0].mib == QUARTER
    assert "least recently used idle kernel" in p.swaps[0].reason
    # two waiting: the two least recently used
    servers[6] = ServerOnGpu(**{**servers[6].__dict__, "waiting_mib": QUARTER})
    assert chosen(plan_swaps(UUID, SIZE, servers)) == ["k2", "k4"]


def test_the_margin_keeps_room_for_one_more_slice():
    three = [server(i) for i in range(1, 4)]  # 3/4 of the GPU resident
    assert not plan_swaps(UUID, SIZE, three).under_pressure
    # room for one more quarter exactly: not above size - margin
    assert not plan_swaps(UUID, SIZE, three, margin_mib=QUARTER).under_pressure
    four = [server(i) for i in range(1, 5)]  # full
    assert not plan_swaps(UUID, SIZE, four).under_pressure  # not above its size
    p = plan_swaps(UUID, SIZE, four, margin_mib=QUARTER)
    assert chosen(p) == ["k1"] and p.excess_mib == QUARTER


@pytest.mark.parametrize(
    "why, change",
    [
        ("a cell executes", {"idle": False}),
        ("its user is at the server", {"present": True}),
        ("its last use is unknown", {"last_used": None}),
    ],
)
def test_never_a_busy_present_or_unknown_kernel(why, change):
    servers = [server(i) for i in range(1, 5)]
    last_used = change.pop("last_used", "keep")
    if last_used is None:
        k = servers[0].kernels[0]
        servers[0] = ServerOnGpu(
            **{
                **servers[0].__dict__,
                "kernels": (KernelOnGpu(**{**k.__dict__, "last_used": None}),),
            }
        )
    else:
        servers[0] = server(1, **change)
    p = plan_swaps(UUID, SIZE, servers, margin_mib=QUARTER)
    assert chosen(p) == ["k2"], why  # the next least recently used instead


def test_nothing_to_swap_when_every_kernel_is_busy_says_what_is_short():
    servers = [server(i, idle=False) for i in range(1, 5)]
    p = plan_swaps(UUID, SIZE, servers, margin_mib=QUARTER)
    assert p.swaps == () and p.short_mib == QUARTER


def test_unknown_memory_is_never_counted_as_free():
    # u4's report is stale: its whole slice counts as resident, and it is never chosen
    servers = [server(i) for i in range(1, 4)]
    servers.append(ServerOnGpu("u4", "", cap_mib=QUARTER, resident_mib=None))
    p = plan_swaps(UUID, SIZE, servers, margin_mib=QUARTER)
    assert p.resident_mib == SIZE and chosen(p) == ["k1"]


def test_a_servers_word_counts_at_most_its_slice():
    liar = ServerOnGpu("mallory", "", cap_mib=QUARTER, resident_mib=10 * SIZE)
    p = plan_swaps(UUID, SIZE, [liar, server(1)])
    assert p.resident_mib == 2 * QUARTER and not p.under_pressure


def test_kernels_asked_before_count_as_leaving_and_are_not_asked_again():
    servers = [server(i) for i in range(1, 5)]
    asked = {("u1", "", "k1"): QUARTER}
    p = plan_swaps(UUID, SIZE, servers, margin_mib=QUARTER, asked=asked)
    assert p.freeing_mib == QUARTER and not p.under_pressure and p.swaps == ()


def report(kernels: list[dict], *, waiting=(), present=False, used=2 * QUARTER) -> dict:
    """A report as the extension sends it (serverext/monitor.py), one device (its NVML reading
    of the device's used memory: `used`)."""
    return {
        "available": True,
        "devices": [{"index": "0", "uuid": UUID, "memory_total_mib": SIZE,
                     "memory_used_mib": used}],
        "processes": [
            {"pid": 10 + i, "kernel_id": k["id"], "device": "0",
             "gpu_memory_mib": k["gpu_memory_mib"], "matched": True}
            for i, k in enumerate(kernels) if k["gpu_memory_mib"]
        ],
        "kernels": kernels,
        "swap": {"waiting": list(waiting)},
        "presence": {"known": True, "present": present},
    }  # fmt: skip


def kernel(kid: str, mib: float, last: str, state="running", **extra) -> dict:
    return {"id": kid, "execution_state": "idle", "last_activity": last,
            "last_gpu_activity": None, "gpu_memory_mib": mib, "gpu_utilization": 0,
            "gpu_activity_known": True, "hibernation": {"state": state}, **extra}  # fmt: skip


def test_report_facts_per_device():
    body = report(
        [
            kernel("a", QUARTER, "2026-01-01T10:00:00Z"),
            kernel("b", 0, "2026-01-01T09:00:00Z", state="hibernated"),
            kernel("c", 100, "2026-01-01T11:00:00Z", gpu_utilization=80),
            kernel("d", 100, "2026-01-01T11:00:00Z", gpu_activity_known=False),
            kernel("e", 100, "2026-01-01T11:00:00Z", execution_state="busy"),
            kernel("f", 100, "2030-01-01T11:00:00Z", state="cannot_hibernate"),
            kernel("g", 100, "2026-01-01T11:00:00Z"),
            # suspended by its server's word; its process's last reading predates the suspend
            kernel("h", QUARTER, "2026-01-01T08:00:00Z", state="hibernated"),
        ],
        waiting=[{"kernel_id": "b", "gpu_memory_mib": QUARTER}],
    )
    (gpu,) = swap_facts(body, received_at=1893456000.0).gpus  # 2030-01-01
    assert (gpu.uuid, gpu.total_mib, gpu.used_mib) == (UUID, SIZE, 2 * QUARTER)
    g = next(k for k in body["kernels"] if k["id"] == "g")
    g["hibernation"]["next_try"] = "2031-01-01T00:00:00Z"
    (gpu,) = swap_facts(body, received_at=1893456000.0).gpus
    assert gpu.resident_mib == QUARTER + 500 and gpu.waiting_mib == QUARTER
    kernels = {k.kernel_id: k for k in gpu.kernels}
    assert kernels["a"].idle and kernels["a"].last_used == 1767261600.0
    assert kernels["b"].hibernated and not kernels["b"].idle
    assert kernels["h"].hibernated and kernels["h"].resident_mib == 0
    # GPU busy, GPU unknown, a cell running, or a kernel that cannot hibernate: never asked
    assert not any(kernels[k].idle for k in "cdef")
    # refused a moment ago (its server tries again later): not asked meanwhile
    assert kernels["g"].idle and kernels["g"].refused
    assert kernels["f"].last_used == 1893456000.0  # a time from the future is clamped
    assert swap_facts({"available": False}, 0.0).gpus == ()


def seat(user: str, body: dict, fresh: bool = True, present: bool = False) -> Seat:
    return Seat(
        user, "", swap_facts(body, 1e10), fresh, QUARTER, SIZE, margin_mib=0.0, present=present
    )


def test_the_desk_answers_each_server_with_its_own_kernels_once():
    desk = SwapDesk(report_in=10)
    seats = [seat(f"u{i}", report([kernel(f"k{i}", QUARTER, f"2026-01-01T1{i}:00:00Z")], used=SIZE))
             for i in range(1, 5)]  # fmt: skip
    waiting = report([], waiting=[{"kernel_id": "k5", "gpu_memory_mib": QUARTER}], used=SIZE)
    seats.append(seat("u5", waiting))
    # the waiting server is told to report again soon, and that its kernel waits (the GPU is
    # full: no room to grant); u1's kernel is not its to swap
    assert desk.answer("u5", "", seats, now=100.0) == {
        "swap": {"report_in": 10, "wait": [{"kernel_id": "k5", "reason": "the GPU is full"}]}
    }
    assert desk.under_pressure() == 1
    assert desk.answer("u2", "", seats, now=101.0) == {"swap": {"report_in": 10}}
    order = desk.answer("u1", "", seats, now=102.0)
    assert order["swap"]["hibernate"][0]["kernel_id"] == "k1"
    # asked once: while u1's report still shows it resident, it counts as leaving
    assert desk.answer("u1", "", seats, now=103.0) is None
    assert desk.answer("u2", "", seats, now=104.0) is None
    # u1 reports it hibernated, u5's kernel is back: no pressure, nothing to say
    seats[0] = seat("u1", report([kernel("k1", 0, "2026-01-01T11:00:00Z", state="hibernated")]))
    seats[4] = seat("u5", report([kernel("k5", QUARTER, "2026-01-01T16:00:00Z")]))
    assert desk.answer("u5", "", seats, now=105.0) is None
    assert desk.under_pressure() == 0
    # u1 is back, u5 waits again: one quarter must go; u2 is asked, and its user runs a cell
    # before it goes: it will not go, so the next least recently used kernel is asked at once,
    # not in 30 s
    seats[0] = seat("u1", report([kernel("k1", QUARTER, "2026-01-01T20:00:00Z")]))
    seats[4] = seat("u5", waiting)
    assert desk.answer("u2", "", seats, now=106.0)["swap"]["hibernate"][0]["kernel_id"] == "k2"
    busy = kernel("k2", QUARTER, "2026-01-01T12:00:00Z", execution_state="busy")
    seats[1] = seat("u2", report([busy]))
    assert desk.answer("u3", "", seats, now=107.0)["swap"]["hibernate"][0]["kernel_id"] == "k3"
    # a stale server gets no orders
    seats[1] = seat("u2", seats[1].facts and report([]), fresh=False)
    assert desk.answer("u2", "", seats, now=106.0) is None


def test_seats_are_the_hub_records_servers_on_over_committed_pools():
    from fracspawner.backends import load_catalog
    from fracspawner.culler.decide import ServerFacts
    from fracspawner.culler.reports import parse_report
    from fracspawner.culler.swapdesk import seats_from

    catalog = load_catalog(
        {"pools": {
            "t4": {"gpu": "T4", "backend": "timeslicing", "replicas": 4, "overcommit": 2,
                   "offers": ["1/4"]},
            "plain": {"gpu": "T4", "backend": "timeslicing", "replicas": 4, "offers": ["1/4"]},
        }}
    )  # fmt: skip
    now = 1e9
    body = report([kernel("k", QUARTER, "2001-09-09T00:00:00Z")])
    reports = [
        (user, "", parse_report({**body, "sampled_at": "2001-09-09T01:46:00Z"}, received_at=at))
        for user, at in (("ann", now), ("bob", now), ("cy", now - 100), ("dan", now))
    ]
    known = {
        ("ann", ""): ServerFacts("ann", user_options={"gpu": "1/4", "pool": "t4"}),
        ("bob", ""): ServerFacts("bob", user_options={"gpu": "1/4", "pool": "plain"}),
        ("cy", ""): ServerFacts("cy", user_options={"gpu": "nonsense", "pool": "t4"}),
        # dan: the hub has not listed him yet
    }
    seats = {s.user: s for s in seats_from(reports, known, catalog, now, max_staleness=30)}
    assert set(seats) == {"ann", "cy"}  # bob's pool does not over-commit; dan is not known
    assert seats["ann"].fresh and not seats["cy"].fresh
    assert seats["ann"].size_mib == SIZE and seats["ann"].margin_mib == QUARTER
    assert seats["ann"].cap_mib == QUARTER
    # a slice the catalog cannot size counts as the pool's largest, never as nothing
    assert seats["cy"].cap_mib == QUARTER
    (gpu,) = seats["ann"].facts.gpus
    assert gpu.uuid == UUID and gpu.resident_mib == QUARTER
    assert seats_from(reports, known, catalog, now, 30, margin_mib=0.0)[0].margin_mib == 0.0


def test_room_is_granted_first_come_first_served_and_never_twice():
    """A waiting resume restores only on the culler's grant (NVIDIA/cuda-checkpoint#44: a
    restore refused for want of room loses the kernel's GPU state). Room for one: the oldest
    wait gets it, the next waits; a grant holds its room until its kernel is seen back; a
    reading of the device above the slices' sum counts; a claim above its slice holds nobody
    up."""
    from fracspawner.culler.grants import Waiter, plan_grants

    a = Waiter("ua", "", "ka", QUARTER, since=1.0, cap_mib=QUARTER)
    b = Waiter("ub", "", "kb", QUARTER, since=2.0, cap_mib=QUARTER)
    assert plan_grants(SIZE, 3 * QUARTER, [b, a], {}) == [a.key]
    assert plan_grants(SIZE, 3 * QUARTER, [b, a], {a.key: QUARTER}) == [a.key]  # not b too
    assert plan_grants(SIZE, 2 * QUARTER, [b, a], {}) == [a.key, b.key]
    liar = Waiter("m", "", "km", 10 * SIZE, since=0.0, cap_mib=QUARTER)
    assert plan_grants(SIZE, 3 * QUARTER, [liar, b, a], {}) == [a.key]
    big = Waiter("ubig", "", "kbig", 2 * QUARTER, since=0.0, cap_mib=2 * QUARTER)
    assert plan_grants(SIZE, 3 * QUARTER, [big, a], {}) == []  # first come, first served

    def waiting(kid: str, since: str) -> dict:
        return report([], waiting=[{"kernel_id": kid, "gpu_memory_mib": QUARTER,
                                    "since": since}], used=3 * QUARTER)  # fmt: skip

    desk = SwapDesk(report_in=10)
    seats = [seat(f"u{i}", report([kernel(f"k{i}", QUARTER, f"2026-01-01T1{i}:00:00Z")],
                                  used=3 * QUARTER))
             for i in range(1, 4)]  # fmt: skip
    seats += [seat("u4", waiting("k4", "2026-01-01T12:00:00Z")),
              seat("u5", waiting("k5", "2026-01-01T12:00:01Z"))]  # fmt: skip
    # u5 asks first, but u4 has waited longer: u5 waits, u4 gets the room, once
    assert desk.answer("u5", "", seats, now=100.0)["swap"]["wait"][0]["kernel_id"] == "k5"
    got = desk.answer("u4", "", seats, now=101.0)["swap"]
    assert got["resume"] == [{"kernel_id": "k4", "gpu_memory_mib": QUARTER}]
    assert "resume" not in desk.answer("u5", "", seats, now=102.0)["swap"]
    # every reading of the device shows more than the slices' sum (a kernel above its slice):
    # no room; one server's reading alone does not hold the room
    desk = SwapDesk(report_in=10)
    bodies = [report([kernel(f"k{i}", QUARTER, f"2026-01-01T1{i}:00:00Z")]) for i in (1, 2, 3)]
    bodies += [waiting("k4", "2026-01-01T12:00:00Z"), waiting("k5", "2026-01-01T12:00:01Z")]
    bodies[0]["devices"][0]["memory_used_mib"] = SIZE
    seats = [seat(f"u{i}", body) for i, body in enumerate(bodies, 1)]
    assert "resume" in desk.answer("u4", "", seats, now=103.0)["swap"]
    for body in bodies:
        body["devices"][0]["memory_used_mib"] = SIZE
    desk = SwapDesk(report_in=10)
    seats = [seat(f"u{i}", body) for i, body in enumerate(bodies, 1)]
    assert "resume" not in desk.answer("u4", "", seats, now=104.0)["swap"]


def test_a_gpu_full_by_every_reading_with_a_resume_waiting_orders_a_swap():
    """Two kernels above their slice (time-slicing enforces nothing): their servers' words count
    a quarter each, but every reading of the device shows it full. With a resume waiting, the
    reading bounds what is resident: one idle kernel is asked out (issue 36, item 5)."""
    desk = SwapDesk(report_in=10)

    def above(i: int) -> dict:
        body = report([kernel(f"k{i}", 2 * QUARTER, f"2026-01-01T1{i}:00:00Z")])
        body["devices"][0]["memory_used_mib"] = SIZE
        return body

    waiting = report([], waiting=[{"kernel_id": "k3", "gpu_memory_mib": QUARTER}])
    waiting["devices"][0]["memory_used_mib"] = SIZE
    seats = [seat("u1", above(1)), seat("u2", above(2)), seat("u3", waiting)]
    order = desk.answer("u1", "", seats, now=100.0)
    assert order and order["swap"]["hibernate"][0]["kernel_id"] == "k1", order
    assert desk.answer("u3", "", seats, now=101.0)["swap"]["wait"][0]["kernel_id"] == "k3"


def test_a_server_that_has_not_reported_counts_its_slice_where_its_pod_is():
    """The hub lists u4, its pod is on the GPUs' node, it has not reported yet: its slice is
    counted on the GPU (unknown memory is never free), so the margin is kept (issue 36, item
    5); a server on another node is not counted there."""
    from fracspawner.backends import load_catalog
    from fracspawner.culler.decide import ServerFacts
    from fracspawner.culler.placement import Placement
    from fracspawner.culler.reports import parse_report
    from fracspawner.culler.swapdesk import seats_from

    catalog = load_catalog(
        {"pools": {"t4": {"gpu": "T4", "backend": "timeslicing", "replicas": 4,
                          "overcommit": 2, "offers": ["1/4"]}}}
    )  # fmt: skip
    now = 1e9
    at = "2001-09-09T01:46:00Z"
    reports = [
        (f"u{i}", "", parse_report(
            {**report([kernel(f"k{i}", QUARTER, f"2001-09-09T00:0{i}:00Z")]), "sampled_at": at},
            received_at=now))
        for i in range(1, 4)
    ]  # fmt: skip
    known = {
        (f"u{i}", ""): ServerFacts(f"u{i}", user_options={"gpu": "1/4", "pool": "t4"})
        for i in range(1, 6)
    }
    nodes = {"u5": "node-2"}

    def placement(user: str, server: str) -> Placement:
        return Placement(nodes.get(user, "node-1"))

    seats = seats_from(reports, known, catalog, now, 30, placement=placement)
    assert {s.user for s in seats} == {"u1", "u2", "u3", "u4", "u5"}
    order = SwapDesk(report_in=10).answer("u1", "", seats, now=now)
    assert order and order["swap"]["hibernate"][0]["kernel_id"] == "k1"
    # u4 elsewhere too: the GPU is within its size less the margin
    nodes["u4"] = "node-2"
    seats = seats_from(reports, known, catalog, now, 30, placement=placement)
    assert SwapDesk(report_in=10).answer("u1", "", seats, now=now) is None


def test_a_pods_placement_comes_from_the_pod_never_the_report():
    """The node, the devices HAMi's allocation names and the GPU count of the pod; a report
    naming others is cut to them, and its claim on all of them together is its slice."""
    from fracspawner.culler.placement import Placement, placement_of
    from fracspawner.culler.swapdesk import bind

    pod = {
        "metadata": {"annotations": {
            "hami.io/vgpu-devices-allocated": "GPU-a,NVIDIA,3840,25:;"}},
        "spec": {"nodeName": "n1", "containers": [
            {"resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }  # fmt: skip
    assert placement_of(pod) == Placement("n1", 1, frozenset({"GPU-a"}))
    assert placement_of({"spec": {}}) == Placement(None, 1, None)
    body = report([kernel("k", QUARTER, "2026-01-01T10:00:00Z")],
                  waiting=[{"kernel_id": "w", "gpu_memory_mib": SIZE}])  # fmt: skip
    body["devices"] += [{"index": str(i), "uuid": f"GPU-{i}", "memory_total_mib": SIZE}
                        for i in range(1, 5)]  # fmt: skip
    facts = swap_facts(body, 1e10)
    (gpu,) = bind(facts, Placement("n1", 1, None), QUARTER, 1).gpus
    assert gpu.uuid == f"n1/{UUID}" and gpu.resident_mib + gpu.waiting_mib == QUARTER
    assert bind(facts, placement_of(pod), QUARTER, 1).gpus == ()  # none of them is GPU-a


def test_a_report_from_before_a_swap_is_not_read_as_a_full_gpu():
    """u4's kernel was just swapped out and its report from before still shows it resident,
    while every fresh reading shows the room: u5's waiting kernel gets neither a grant (the
    servers' word says full) nor "wait" (its cell would be told the GPU is full when it is
    not); its server is asked to report again soon."""
    desk = SwapDesk(report_in=20)
    seats = [seat(f"u{i}", report([kernel(f"k{i}", QUARTER, f"2026-01-01T1{i}:00:00Z")],
                                  used=3 * QUARTER))
             for i in range(1, 5)]  # fmt: skip
    seats.append(
        seat("u5", report([], waiting=[{"kernel_id": "k5", "gpu_memory_mib": QUARTER}],
                          used=3 * QUARTER))
    )  # fmt: skip
    assert desk.answer("u5", "", seats, now=100.0) == {"swap": {"report_in": 3.0}}


def test_a_swap_just_done_is_not_counted_again_by_an_older_device_reading():
    """u5's kernel waits for a quarter of a full GPU: u1's idle kernel is asked out, and u1
    reports it gone. The other servers' reports are still fresh but were read before the swap:
    their device reading still holds u1's quarter. That memory is not counted twice, so u2's
    idle kernel is not asked out too (seen in the swap e2e under load: two kernels swapped
    0.3 s apart for one waiting kernel)."""
    desk = SwapDesk(report_in=10)
    seats = [seat(f"u{i}", report([kernel(f"k{i}", QUARTER, f"2026-01-01T1{i}:00:00Z")], used=SIZE))
             for i in range(1, 5)]  # fmt: skip
    waiting = report([], waiting=[{"kernel_id": "k5", "gpu_memory_mib": QUARTER}], used=SIZE)
    seats.append(seat("u5", waiting))
    desk.answer("u5", "", seats, now=100.0)
    order = desk.answer("u1", "", seats, now=101.0)
    assert order["swap"]["hibernate"][0]["kernel_id"] == "k1"
    # u1's new report says hibernated, but every device reading, its own included, was taken
    # before the memory went (NVML sampled before the suspend finished): the GPU reads full
    gone = [kernel("k1", 0, "2026-01-01T11:00:00Z", state="hibernated")]
    seats[0] = seat("u1", report(gone, used=SIZE))
    answer = desk.answer("u2", "", seats, now=102.0)
    assert not (answer or {}).get("swap", {}).get("hibernate"), answer


def test_a_server_cannot_claim_a_wait_longer_than_the_culler_saw():
    """The line for room is first come, first served by each kernel's wait, which its server
    reports: mallory's server first reports its waiting kernel two minutes after u4's, saying
    it has waited an hour. Its word counts back at most a report interval before the culler
    first saw it, so u4, seen first, gets the one room (review s53: the hour won)."""
    from datetime import datetime, timezone

    def iso(t: float) -> str:
        return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

    t = 1.8e9
    busy = [seat(f"u{i}", report([kernel(f"k{i}", QUARTER, iso(t - 600))], used=3 * QUARTER))
            for i in (1, 2, 3)]  # fmt: skip

    def waiting(user: str, since: float) -> Seat:
        wait = {"kernel_id": f"k-{user}", "gpu_memory_mib": QUARTER, "since": iso(since)}
        return seat(user, report([], waiting=[wait], used=3 * QUARTER))

    desk = SwapDesk(report_in=10)
    u4 = waiting("u4", t - 10)
    # u4 is granted the room; its server has not restored yet when the grant lapses (30 s)
    assert "resume" in desk.answer("u4", "", [*busy, u4], now=t)["swap"]
    mallory = waiting("mallory", t - 3600)
    seats = [*busy, u4, mallory]
    answer = desk.answer("mallory", "", seats, now=t + 120)["swap"]
    assert "resume" not in answer and answer["wait"][0]["kernel_id"] == "k-mallory", answer
    got = desk.answer("u4", "", seats, now=t + 121)["swap"]
    assert got["resume"] == [{"kernel_id": "k-u4", "gpu_memory_mib": QUARTER}]


# --- copies under way at the rates measured on an H200 (docs/serverext.md "First run on a GPU":
# a checkpoint copies at 1.4-1.9 GiB/s, a restore at 3.4-5.5 GiB/s) ----------------------------
H200 = 143771.0  # NVML's total for an H200 (fracspawner.model.gpumodels)
H200_QUARTER = H200 / 4  # 35 GiB: 19-26 s to checkpoint, 7-11 s to restore


def h200(user: str, kernels: list[dict], *, used: float, waiting=(), enforced=False) -> Seat:
    """A fresh report of `user`'s server on one H200 (its NVML reading of the device: `used`);
    `enforced`: HAMi-core, whose pods read only their slice (no device reading counts)."""
    body = report(kernels, waiting=waiting, used=used)
    body["devices"][0]["memory_total_mib"] = H200
    return Seat(user, "", swap_facts(body, 1e10), True, H200_QUARTER, H200, margin_mib=0.0,
                enforced=enforced)  # fmt: skip


def test_a_kernel_whose_checkpoint_is_under_way_still_holds_its_gpu_memory():
    """u1's idle kernel is being swapped out for u5's waiting one: its server reports it
    "hibernating" for the 19-26 s its 35 GiB take to copy, and its memory is on the GPU until
    the copy is done. The culler counted it off the GPU as soon as the report said so, and
    granted u5 the room: under HAMi-core the grant is the only check before a restore, which
    then met CUDA out of memory, and on current drivers that loses u5's GPU state for good
    (NVIDIA/cuda-checkpoint#44). Now the room is granted once u1's report says hibernated;
    meanwhile u5 waits, and nobody else's kernel is asked out for the memory on its way out."""
    at = "2026-01-01T10:00:00Z"
    copying = kernel("k1", H200_QUARTER, at, state="hibernating")
    seats = [h200("u1", [copying], used=H200, enforced=True)]
    seats += [h200(f"u{i}", [kernel(f"k{i}", H200_QUARTER, f"2026-01-01T1{i}:00:00Z")],
                   used=H200, enforced=True)
              for i in (2, 3, 4)]  # fmt: skip
    wait = {"kernel_id": "k5", "gpu_memory_mib": H200_QUARTER}
    seats.append(h200("u5", [], waiting=[wait], used=H200, enforced=True))
    desk = SwapDesk(report_in=20)
    swap = desk.answer("u5", "", seats, now=100.0)["swap"]
    assert "resume" not in swap, "granted into memory a checkpoint still holds (#44: lost)"
    assert swap["wait"][0]["kernel_id"] == "k5"
    for user in ("u2", "u3", "u4"):
        answer = desk.answer(user, "", seats, now=101.0) or {}
        assert not answer.get("swap", {}).get("hibernate"), f"{user} asked out as well"
    # u1's report says the copy is done: the room is u5's
    seats[0] = h200("u1", [kernel("k1", 0, at, state="hibernated")], used=H200, enforced=True)
    swap = desk.answer("u5", "", seats, now=125.0)["swap"]
    assert swap["resume"] == [{"kernel_id": "k5", "gpu_memory_mib": H200_QUARTER}]


def test_one_pressure_asks_once_while_the_checkpoint_is_under_way():
    """u1's idle kernel is asked out for u5's. Its server's next report, 20 s later, says
    "hibernating" (35 GiB take 19-26 s to copy), and every device reading still holds it. The
    ask was dropped at that report, so once the report interval that discounts a swap just
    done had passed, the full GPU read as a new pressure and u2's idle kernel was asked out
    too: two kernels swapped out for one. The ask now lasts while the copy is under way."""
    desk = SwapDesk(report_in=20)
    seats = [h200(f"u{i}", [kernel(f"k{i}", H200_QUARTER, f"2026-01-01T1{i}:00:00Z")],
                  used=H200)
             for i in range(1, 5)]  # fmt: skip
    wait = {"kernel_id": "k5", "gpu_memory_mib": H200_QUARTER}
    seats.append(h200("u5", [], waiting=[wait], used=H200))
    assert desk.answer("u1", "", seats, now=100.0)["swap"]["hibernate"][0]["kernel_id"] == "k1"
    copying = kernel("k1", H200_QUARTER, "2026-01-01T11:00:00Z", state="hibernating")
    seats[0] = h200("u1", [copying], used=H200)
    for now in (120.0, 145.0):  # the report interval, and the 30 s an ask lasts, are past
        for user in ("u2", "u3", "u4"):
            answer = desk.answer(user, "", seats, now=now) or {}
            assert not answer.get("swap", {}).get("hibernate"), f"{user} asked out at {now}"
    # the copy is done: u1's own reading shows the room, the others' were read before
    done = kernel("k1", 0, "2026-01-01T11:00:00Z", state="hibernated")
    seats[0] = h200("u1", [done], used=3 * H200_QUARTER)
    assert not (desk.answer("u2", "", seats, now=150.0) or {}).get("swap", {}).get("hibernate")
    swap = desk.answer("u5", "", seats, now=151.0)["swap"]
    assert swap["resume"] == [{"kernel_id": "k5", "gpu_memory_mib": H200_QUARTER}]


def test_a_restore_under_way_is_counted_once_and_its_grant_holds_until_it_is_done():
    """u4's kernel was granted the quarter the GPU had free and is being restored (7-11 s for
    35 GiB; a whole H200's 140 GiB take 26-42 s): its report says "resuming", its process
    already holds 20,000 MiB, and it still waits for all it asked. Counting both, the culler
    saw a pressure that is not there and asked u1's idle kernel out for nothing. And once the
    grant had lasted its 30 s the kernel was planned again as a new wait, met no room (its own
    memory was already there), and its cell was told the GPU is full while it was coming back.
    Now what it holds counts against what it asked, and its grant holds while it is restored;
    u5, who waits after it, is not granted that room."""
    at = "2026-01-01T1{}:00:00Z"
    busy = [h200(f"u{i}", [kernel(f"k{i}", H200_QUARTER, at.format(i))], used=3 * H200_QUARTER)
            for i in (1, 2, 3)]  # fmt: skip
    wait = {"kernel_id": "k4", "gpu_memory_mib": H200_QUARTER, "since": "2026-01-01T12:00:00Z"}
    desk = SwapDesk(report_in=20)
    seats = [*busy, h200("u4", [], waiting=[wait], used=3 * H200_QUARTER)]
    assert desk.answer("u4", "", seats, now=100.0)["swap"]["resume"][0]["kernel_id"] == "k4"
    part = 20000.0
    used = 3 * H200_QUARTER + part
    busy = [h200(s.user, [kernel(f"k{s.user[1]}", H200_QUARTER, at.format(s.user[1]))],
                 used=used)
            for s in busy]  # fmt: skip
    resuming = kernel("k4", part, "2026-01-01T13:00:00Z", state="resuming")
    seats = [*busy, h200("u4", [resuming], waiting=[wait], used=used)]
    for user in ("u1", "u2", "u3"):
        answer = desk.answer(user, "", seats, now=110.0) or {}
        assert not answer.get("swap", {}).get("hibernate"), f"{user} asked out for nothing"
    later = {"kernel_id": "k5", "gpu_memory_mib": H200_QUARTER, "since": "2026-01-01T12:30:00Z"}
    seats.append(h200("u5", [], waiting=[later], used=used))
    swap = desk.answer("u4", "", seats, now=140.0)["swap"]  # the grant's 30 s are past
    assert "wait" not in swap, f"told the GPU is full while it is being restored: {swap}"
    assert swap["resume"] == [{"kernel_id": "k4", "gpu_memory_mib": H200_QUARTER}]
    assert "resume" not in desk.answer("u5", "", seats, now=141.0)["swap"]
