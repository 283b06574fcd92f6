"""A present person's server that holds nothing on the GPU yet keeps its whole slice from the
culler's grants: on a pool whose pods' NVML is their slice's (HAMi: the grant is the only check
before a restore), and on time-slicing, where the restore is checked by the pod's own reading
but the first cell after it would meet CUDA out of memory (issue 36; NVIDIA/cuda-checkpoint#44:
a restore that meets CUDA out-of-memory loses the kernel's GPU state for good).

The scenario is the culler benchmark's (research, reserving, over-commit 2, both GPUs; minute
634): res-00 and res-01, away with runs, held 20,390 and 16,384 MiB of an 81,559 MiB GPU;
res-03's person was at their tab with nothing allocated (last report: 0 MiB); res-06 waited to
resume 32,768 MiB. The culler granted it into the 40,689 MiB it saw beyond the 4,096 margin, and
in the same minute res-03's first cell took 32,768 MiB: the restore met 12,017 MiB free and the
kernel's GPU state was lost. The hub's admission already counts such a server at its whole slice
(room.held_by: the first cell allocates); a grant now does too.
"""

from __future__ import annotations

from fracspawner.culler.pressure import swap_facts
from fracspawner.culler.swapdesk import Seat, SwapDesk
from tests.test_culler_grant_margin import _kernel
from tests.test_culler_grant_margin import _report as margin_report

H100 = 81559.0
QUARTER = 20390.0
HALF = 40780.0
MARGIN = 4096.0
USED = 20390.0 + 16384.0  # every device reading: the two runs


def _report(kernels: list[dict], waiting: list[dict], present: bool) -> dict:
    return margin_report(kernels, waiting, USED, present)


def _gpu(res03_present: bool, enforced: bool = True) -> list[Seat]:
    def seat(user: str, cap: float, report: dict, present: bool) -> Seat:
        facts = swap_facts(report, 1e10)
        return Seat(user, "", facts, True, cap, H100, margin_mib=0.0, present=present,
                    enforced=enforced)  # fmt: skip

    waiting = [{"kernel_id": "k6", "gpu_memory_mib": 32768.0, "since": "2026-01-01T12:00:00Z"}]
    return [
        seat("res-00", QUARTER, _report([_kernel("k0", 20390.0)], [], False), False),
        seat("res-01", QUARTER, _report([_kernel("k1", 16384.0)], [], False), False),
        seat("res-03", HALF, _report([], [], res03_present), res03_present),
        seat("res-06", HALF, _report([], waiting, True), True),
    ]


def _answer(seats: list[Seat]) -> dict:
    desk = SwapDesk(grant_margin_mib=MARGIN)
    return (desk.answer("res-06", "", seats, now=1e10) or {}).get("swap", {})


def test_a_present_persons_server_holding_nothing_yet_keeps_its_slice_from_a_grant():
    swap = _answer(_gpu(res03_present=True))
    assert not swap.get("resume"), (
        "granted into the slice of a present person whose first cell may take it: "
        f"{swap.get('resume')}"
    )
    assert [w["kernel_id"] for w in swap.get("wait", [])] == ["k6"], swap


def test_the_same_room_is_granted_when_that_person_is_away():
    swap = _answer(_gpu(res03_present=False))
    assert swap.get("resume") == [{"kernel_id": "k6", "gpu_memory_mib": 32768.0}], swap


def test_where_the_pods_own_reading_checks_the_room_a_first_cell_keeps_its_slice_too():
    # time-slicing (not enforced): the server restores only once its own NVML shows the room,
    # so the restore is safe; but the present person's first cell, a moment later, would meet
    # CUDA out of memory in the room the grant gave away (capacity replay, breaks, time-sliced,
    # half the GPUs: brk-12's first cells met 3,489 MiB free for 16,384)
    swap = _answer(_gpu(res03_present=True, enforced=False))
    assert not swap.get("resume"), swap
    assert [w["kernel_id"] for w in swap.get("wait", [])] == ["k6"], swap
    # that person away: granted (no margin on this pool)
    swap = _answer(_gpu(res03_present=False, enforced=False))
    assert swap.get("resume") == [{"kernel_id": "k6", "gpu_memory_mib": 32768.0}], swap
