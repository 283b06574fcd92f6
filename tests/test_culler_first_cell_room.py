"""The culler makes room for a present person's first cell: on a GPU where that person's server
holds nothing yet and idle kernels of people who left fill it, those kernels are asked out, as
they are for a waiting resume (issue 36 item 5: the hub admitted the server on that room, "instead
of meeting CUDA out-of-memory in a cell").

The pool's default swap margin (its largest slice, at most half the GPU) often covers one such
first cell; a margin an admin sets lower (`Culler.swap_margin_mib`), or several people arriving
at once, did not: a first cell's room counted only while a resume waited. The scenario is the
culler benchmark's (breaks, HAMi's reserving pool, over-commit 2, half the GPUs, 16:33 on day
two), with a 4,096 MiB swap margin: brk-19 (a 1/4 slice, 10,240 MiB at its first cell) was
admitted where the hub's room answer had room, and its pod went to the GPU with the fewest slices
allocated. There brk-04 (present, idle, 36,372 MiB) and brk-18 (idle, 40,632 MiB) held 77,004 of
81,559 MiB, and brk-18's person left at 16:37 for 41 minutes: 4,555 MiB free, above the margin.
(With the default margin the culler did ask brk-18's kernel out; the node's host memory budget,
spent, kept it on the GPU: docs/benchmarks.md.)
"""

from __future__ import annotations

from fracspawner.culler.pressure import swap_facts
from fracspawner.culler.swapdesk import Seat, SwapDesk
from tests.test_culler_grant_margin import _report

H100 = 81559.0
QUARTER = 20389.0
HALF = 40779.0
SWAP_MARGIN = 4096.0
BRK18, BRK04 = 40632.0, 36372.0
USED = BRK18 + BRK04  # every device reading


def _idle(kid: str, mib: float) -> dict:
    return {"id": kid, "execution_state": "idle", "last_activity": "2026-01-01T10:00:00Z",
            "last_gpu_activity": "2026-01-01T10:00:00Z", "gpu_memory_mib": mib,
            "gpu_utilization": 0, "gpu_activity_known": True,
            "hibernation": {"state": "running"}}  # fmt: skip


def _seat(user: str, cap: float, report: dict, present: bool, enforced: bool) -> Seat:
    return Seat(user, "", swap_facts(report, 1e10), True, cap, H100, margin_mib=SWAP_MARGIN,
                present=present, enforced=enforced)  # fmt: skip


def _gpu(brk19_present: bool, brk18_present: bool = False, enforced: bool = True) -> list[Seat]:
    return [
        _seat("brk-18", HALF, _report([_idle("k18", BRK18)], [], USED, brk18_present),
              brk18_present, enforced),
        _seat("brk-04", HALF, _report([_idle("k04", BRK04)], [], USED, True), True, enforced),
        _seat("brk-19", QUARTER, _report([], [], USED, brk19_present), brk19_present, enforced),
    ]  # fmt: skip


def _orders(seats: list[Seat], user: str = "brk-18") -> list[str]:
    """What the culler's answer to `user`'s report asks it to swap out."""
    swap = (SwapDesk().answer(user, "", seats, now=1e10) or {}).get("swap", {})
    return [o["kernel_id"] for o in swap.get("hibernate", [])]


def test_an_idle_kernel_of_a_person_who_left_is_asked_out_for_a_present_persons_first_cell():
    assert H100 - USED > SWAP_MARGIN  # by the swap margin alone the GPU is not under pressure
    assert H100 - USED < 10240.0  # ... yet brk-19's first cell cannot allocate
    assert _orders(_gpu(brk19_present=True)) == ["k18"]


def test_on_time_slicing_too():
    # time-slicing (the pods' NVML is the device's): the same first cell meets CUDA out of
    # memory beside the same idle kernel
    assert _orders(_gpu(brk19_present=True, enforced=False)) == ["k18"]


def test_nothing_is_asked_out_for_a_server_whose_person_is_away():
    # nobody is there to run a first cell: room kept for nobody costs brk-18 a resume later
    assert _orders(_gpu(brk19_present=False)) == []


def test_a_present_persons_idle_kernel_is_never_asked_out_for_it():
    # brk-18 back at their tab: present people's kernels are not swapped out (item 3); the
    # first cell waits for room or meets the note that says why (oomnote.py)
    assert _orders(_gpu(brk19_present=True, brk18_present=True)) == []
    assert _orders(_gpu(brk19_present=True, brk18_present=True), "brk-04") == []
