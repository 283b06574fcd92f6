"""The culler's grants leave a margin of the GPU ungranted on a pool whose pods' NVML is their
slice's (HAMi: the grant is the only check before a restore; issue 36 item 1;
NVIDIA/cuda-checkpoint#44: a restore that meets CUDA out-of-memory loses the kernel's GPU state
for good).

The scenario is the culler benchmark's (breaks, half the GPUs, HAMi's reserving pool): the
culler counted 69,054 MiB on an 81,559 MiB GPU from reports up to a minute old, while a
co-tenant had grown to 71,147 MiB; with no margin both of brk-15's waiting kernels (8,192 and
4,096 MiB) were granted into the 12,505 MiB it saw, and the second restore met 2,220 MiB free.
"""

from __future__ import annotations

from fracspawner.culler.grants import Waiter, plan_grants
from fracspawner.culler.pressure import swap_facts
from fracspawner.culler.swapdesk import Seat, SwapDesk

H100 = 81559.0
QUARTER = 20389.0
SEEN = 69054.0  # what the culler counted on the GPU (stale reports)
REAL = 71147.0  # what the GPU held when the restores ran
MARGIN = 2048.0


def test_two_waiting_kernels_in_just_enough_room_by_a_stale_view_only_what_fits_with_the_margin():
    first = Waiter("brk-15", "", "k1", 8192.0, since=1.0, cap_mib=QUARTER)
    second = Waiter("brk-15", "", "k2", 4096.0, since=2.0, cap_mib=QUARTER - 8192.0)
    # no margin: both granted into 12,505 MiB of room, which really held 10,412
    assert plan_grants(H100, SEEN, [second, first], {}) == [first.key, second.key]
    assert 8192.0 + 4096.0 > H100 - REAL
    got = plan_grants(H100, SEEN, [second, first], {}, margin_mib=MARGIN)
    assert got == [first.key], got
    # the grant in force holds its room; the second waits until the first is seen back
    got = plan_grants(H100, SEEN, [second, first], {first.key: 8192.0}, margin_mib=MARGIN)
    assert got == [first.key], got
    # a kernel of the whole GPU still comes back onto an empty GPU: the margin is never more
    # than what the GPU leaves beyond the kernel
    whole = Waiter("u", "", "kw", H100, since=0.0, cap_mib=H100)
    assert plan_grants(H100, 0.0, [whole], {}, margin_mib=MARGIN) == [whole.key]


def _report(kernels: list[dict], waiting: list[dict], used: float, present: bool = True) -> dict:
    return {
        "available": True,
        "devices": [
            {"index": "0", "uuid": "GPU-h100", "memory_total_mib": H100, "memory_used_mib": used}
        ],
        "processes": [
            {"pid": 10 + i, "kernel_id": k["id"], "device": "0",
             "gpu_memory_mib": k["gpu_memory_mib"], "matched": True}
            for i, k in enumerate(kernels)
        ],
        "kernels": kernels,
        "swap": {"waiting": waiting},
        "presence": {"known": True, "present": present},
    }  # fmt: skip


def _kernel(kid: str, mib: float) -> dict:
    return {"id": kid, "execution_state": "busy", "last_activity": "2026-01-01T10:00:00Z",
            "last_gpu_activity": None, "gpu_memory_mib": mib, "gpu_utilization": 50,
            "gpu_activity_known": True, "hibernation": {"state": "running"}}  # fmt: skip


def _brk15_gpu(enforced: bool) -> list[Seat]:
    """Three co-tenants whose reports sum to 69,054 MiB (their device readings, taken then,
    agree), and brk-15 with two kernels (8,192 and 4,096 MiB) waiting to resume."""
    tenants = [17000.0, 17000.0, 17000.0, SEEN - 51000.0]
    seats = [
        Seat(f"t{i}", "", swap_facts(_report([_kernel(f"t{i}k", mib)], [], SEEN), 1e10),
             True, QUARTER, H100, margin_mib=0.0, present=True, enforced=enforced)
        for i, mib in enumerate(tenants)
    ]  # fmt: skip
    waiting = [
        {"kernel_id": "k1", "gpu_memory_mib": 8192.0, "since": "2026-01-01T12:00:00Z"},
        {"kernel_id": "k2", "gpu_memory_mib": 4096.0, "since": "2026-01-01T12:00:01Z"},
    ]
    brk = swap_facts(_report([], waiting, SEEN), 1e10)
    return [*seats, Seat("brk-15", "", brk, True, QUARTER, H100, margin_mib=0.0, enforced=enforced)]


def test_the_desk_grants_only_what_fits_with_the_margin():
    """The same GPU through the culler's desk (`_grant`): three co-tenants whose reports sum to
    69,054 MiB (and whose device readings, taken then, agree), brk-15 with two kernels waiting.
    With the margin the answer grants the first kernel and tells the second it waits."""
    seats = _brk15_gpu(enforced=True)
    answer = SwapDesk(report_in=10, grant_margin_mib=MARGIN).answer("brk-15", "", seats, 100.0)
    swap = answer["swap"]
    assert swap.get("resume") == [{"kernel_id": "k1", "gpu_memory_mib": 8192.0}], swap
    assert [w["kernel_id"] for w in swap.get("wait", [])] == ["k2"], swap
    # no margin: both were granted (the loss the benchmark met)
    swap = SwapDesk(report_in=10).answer("brk-15", "", seats, 100.0)["swap"]
    assert [r["kernel_id"] for r in swap["resume"]] == ["k1", "k2"], swap


def test_a_waiting_kernel_that_fits_only_without_the_grant_margin_gets_a_swap():
    """The swap margin set below the grant margin (here 0): a kernel waits for exactly the room
    the GPU has. It would never be granted, and no pressure would ever make room for it; with
    a resume waiting, pressure keeps the grant margin too, so an idle kernel is asked out."""
    seats = [
        Seat(f"t{i}", "", swap_facts(_report([{**_kernel(f"t{i}k", QUARTER),
             "execution_state": "idle", "gpu_utilization": 0}], [], 3 * QUARTER), 1e10),
             True, QUARTER, 4 * QUARTER, margin_mib=0.0, enforced=True)
        for i in range(3)
    ]  # fmt: skip
    waiting = [{"kernel_id": "k1", "gpu_memory_mib": QUARTER, "since": "2026-01-01T12:00:00Z"}]
    seats.append(
        Seat("u", "", swap_facts(_report([], waiting, 3 * QUARTER), 1e10), True, QUARTER,
             4 * QUARTER, margin_mib=0.0, enforced=True)
    )  # fmt: skip
    desk = SwapDesk(report_in=10, grant_margin_mib=MARGIN)
    assert "resume" not in desk.answer("u", "", seats, 100.0)["swap"]
    order = desk.answer("t0", "", seats, 101.0)
    assert order and order["swap"].get("hibernate"), order


def test_no_grant_margin_where_the_pod_reads_the_whole_gpu():
    """Time-slicing (not enforced): the server restores on a grant only once its own reading, a
    moment old, shows the room (serverext/room.py), so the culler keeps no margin there: the
    same stale view grants both kernels, and each waits for the pod's reading."""
    seats = _brk15_gpu(enforced=False)
    swap = SwapDesk(report_in=10, grant_margin_mib=MARGIN).answer("brk-15", "", seats, 100.0)
    assert [r["kernel_id"] for r in swap["swap"]["resume"]] == ["k1", "k2"], swap


def test_on_hami_a_resume_behind_present_people_is_told_it_waits():
    """HAMi-core shows each pod its own memory as the device's (its slice as the total), so a
    pod's reading is never the GPU's: four present people hold the H100 by their reports, and
    the kernel waiting to resume is told so, with the reason, not asked to report again in 3 s
    for ever with its cell never told why (the smallest reading, the waiting pod's own 0 MiB,
    showed room)."""
    seats = [
        Seat(f"t{i}", "", swap_facts(_report([_kernel(f"t{i}k", QUARTER)], [], QUARTER), 1e10),
             True, QUARTER, H100, margin_mib=0.0, present=True, enforced=True)
        for i in range(4)
    ]  # fmt: skip
    waiting = [{"kernel_id": "k1", "gpu_memory_mib": 8192.0, "since": "2026-01-01T12:00:00Z"}]
    seats.append(
        Seat("u", "", swap_facts(_report([], waiting, 0.0), 1e10), True, QUARTER, H100,
             margin_mib=0.0, enforced=True)
    )  # fmt: skip
    swap = SwapDesk(report_in=10, grant_margin_mib=MARGIN).answer("u", "", seats, 100.0)["swap"]
    assert "resume" not in swap, swap
    assert swap.get("wait") == [
        {"kernel_id": "k1", "reason": "the GPU is in use by 4 people now; you are next"}
    ], swap
    assert swap["report_in"] == 10
