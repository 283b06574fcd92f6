"""Issue 36 item 4: one server's claim on all its GPUs together is bounded by its slice, for
the room the culler grants to waiting resumes too (grants.py).

A server's word counts at most its slice for pressure (swapdesk.bind). Its waiting kernels'
grants were bounded one by one: each kernel at most the slice, so a server could report four
kernels waiting a quarter each and take the whole room before a neighbour who waited after it.
Now what it already holds and what its earlier waiting kernels ask count against its slice; a
kernel beyond it is served only after every kernel within its server's slice (a kernel above
its slice may still come back: time-slicing enforces nothing, and only its grant restores it).
"""

from __future__ import annotations

from dataclasses import replace

from fracspawner.culler.grants import Waiter, plan_grants
from fracspawner.culler.swapdesk import Seat, SwapDesk
from tests.test_overcommit_pressure import QUARTER, SIZE, kernel, report, seat


def waiting(*kernels: tuple[str, str], resident: float = 0.0, used: float = 2 * QUARTER) -> dict:
    """A report with kernels (id, since) waiting a quarter each, and `resident` MiB held by a
    running kernel r; the device reads `used`."""
    held = [kernel("r", resident, "2026-01-01T09:00:00Z")] if resident else []
    return report(
        held,
        waiting=[
            {"kernel_id": k, "gpu_memory_mib": QUARTER, "since": since} for k, since in kernels
        ],
        used=used,
    )


def test_one_servers_waiting_kernels_together_get_at_most_its_slice_before_others():
    """Half the GPU is free (two quarters resident). Mallory (a quarter) waits with four
    kernels since before Vic's one: she gets one quarter, Vic the other, and her three others
    wait."""
    desk = SwapDesk(report_in=10)
    seats = [
        seat("u1", report([kernel("k1", QUARTER, "2026-01-01T10:00:00Z")])),
        seat("u2", report([kernel("k2", QUARTER, "2026-01-01T10:00:00Z")])),
        seat("mallory", waiting(*[(f"m{i}", f"2026-01-01T11:00:0{i}Z") for i in range(4)])),
        seat("vic", waiting(("v", "2026-01-01T11:30:00Z"))),
    ]
    got = desk.answer("mallory", "", seats, now=100.0)["swap"]
    assert got.get("resume") == [{"kernel_id": "m0", "gpu_memory_mib": QUARTER}], got
    got = desk.answer("vic", "", seats, now=101.0)["swap"]
    assert got.get("resume") == [{"kernel_id": "v", "gpu_memory_mib": QUARTER}], got


def test_what_a_server_holds_counts_against_its_slice_for_its_waiting_kernels():
    """Ann already holds her quarter; her second kernel waits since before Vic's: it is beyond
    her slice, so Vic's quarter comes first, and hers only with room left."""
    desk = SwapDesk(report_in=10)
    full = 3 * QUARTER  # every reading: room for one quarter
    seats = [
        seat("u1", report([kernel("k1", QUARTER, "2026-01-01T10:00:00Z")], used=full)),
        seat("ann", waiting(("a2", "2026-01-01T11:00:00Z"), resident=QUARTER, used=full)),
        seat("vic", waiting(("v", "2026-01-01T11:30:00Z"), used=full)),
    ]
    got = desk.answer("ann", "", seats, now=100.0)["swap"]
    assert not got.get("resume"), got
    got = desk.answer("vic", "", seats, now=101.0)["swap"]
    assert got.get("resume") == [{"kernel_id": "v", "gpu_memory_mib": QUARTER}], got


def test_a_kernel_beyond_its_slice_comes_after_those_within_and_holds_no_one_up():
    a = Waiter("ua", "", "ka", QUARTER, since=1.0, cap_mib=0.0)  # beyond its server's slice
    b = Waiter("ub", "", "kb", QUARTER, since=2.0, cap_mib=QUARTER)
    assert plan_grants(SIZE, 3 * QUARTER, [a, b], {}) == [b.key]
    assert plan_grants(SIZE, 2 * QUARTER, [a, b], {}) == [b.key, a.key]
    big = Waiter("uc", "", "kc", 2 * QUARTER, since=0.0, cap_mib=2 * QUARTER)
    # a kernel within its slice that does not fit still stops the walk (first come, first
    # served): nobody overtakes it, beyond a slice or not
    assert plan_grants(SIZE, 3 * QUARTER, [big, a, b], {}) == []


def _hami(user: str, body: dict, present: bool = False) -> Seat:
    """A server on HAMi (enforced: each pod's NVML shows its own memory only)."""
    return replace(seat(user, body, present=present), enforced=True)


def _ann_granted_beyond(desk: SwapDesk) -> tuple[Seat, list[dict]]:
    """u1 holds a quarter; Ann holds hers and her second kernel a2 waits: the desk grants it
    beyond her slice. Returns u1 and Ann's two kernels once back."""
    u1 = _hami("u1", report([kernel("k1", QUARTER, "2026-01-01T10:00:00Z")], used=QUARTER))
    ann = _hami("ann", waiting(("a2", "2026-01-01T11:00:00Z"), resident=QUARTER, used=QUARTER))
    got = desk.answer("ann", "", [u1, ann], now=100.0)["swap"]
    assert got.get("resume") == [{"kernel_id": "a2", "gpu_memory_mib": QUARTER}], got
    back = [
        kernel("r", QUARTER, "2026-01-01T09:00:00Z"),
        kernel("a2", QUARTER, "2026-01-01T12:00:00Z"),
    ]
    return u1, back


def _only_vic_granted(desk: SwapDesk, u1: Seat, ann: Seat, now: float) -> list[Seat]:
    """Vic and then Wes wait a quarter each beside u1 and Ann, with one quarter left: Vic's is
    granted and Wes's is not. Returns the seats."""
    vic = _hami("vic", waiting(("v", "2026-01-01T11:30:00Z"), used=0.0))
    wes = _hami("wes", waiting(("w", "2026-01-01T11:31:00Z"), used=0.0))
    seats = [u1, ann, vic, wes]
    got = desk.answer("vic", "", seats, now=now)["swap"]
    assert got.get("resume") == [{"kernel_id": "v", "gpu_memory_mib": QUARTER}], got
    got = desk.answer("wes", "", seats, now=now + 1)["swap"]
    assert not got.get("resume"), got
    return seats


def test_a_kernel_granted_beyond_its_slice_counts_on_the_gpu_once_back():
    """HAMi (each pod's NVML shows its own memory only): u1 holds a quarter, Ann holds hers
    and her second notebook's kernel waits. The GPU has room, so it is granted beyond her
    slice and comes back. Her word alone counts at most her slice (item 6), yet the device
    holds her two quarters: one quarter is left, so of Vic's and Wes's waiting quarters only
    Vic's is granted. Before, both were, and Wes's restore met CUDA out of memory, which
    loses a kernel for good (NVIDIA/cuda-checkpoint#44; the culler benchmark, breaks on half
    the GPUs)."""
    desk = SwapDesk(report_in=10)
    u1, back = _ann_granted_beyond(desk)
    ann = _hami("ann", report(back, used=2 * QUARTER))
    seats = _only_vic_granted(desk, u1, ann, now=110.0)
    # her second kernel hibernated again: its quarter is free, and Wes's comes back
    asleep = kernel("a2", 0, "2026-01-01T12:00:00Z", state="hibernated")
    seats[1] = _hami("ann", report([back[0], asleep], used=QUARTER))
    seats[2] = _hami("vic", report([kernel("v", QUARTER, "2026-01-01T12:01:00Z")], used=QUARTER))
    got = desk.answer("wes", "", seats, now=120.0)["swap"]
    assert got.get("resume") == [{"kernel_id": "w", "gpu_memory_mib": QUARTER}], got
    assert not desk.beyond


def test_the_hubs_room_counts_a_present_users_kernel_granted_beyond_the_slice():
    """The same GPU as the hub's admission sees it (culler/room.py): Ann, present, has her
    second kernel back beyond her quarter by the culler's grant; her word counts one quarter,
    the device holds two, so no newcomer's quarter fits beside her and u1 and Vic, present."""
    from fracspawner.culler.room import gpu_rooms

    desk = SwapDesk(report_in=10)
    u1, back = _ann_granted_beyond(desk)
    u1 = replace(u1, present=True)
    ann = _hami("ann", report(back, used=2 * QUARTER, present=True), present=True)
    vic = _hami(
        "vic", report([kernel("v", QUARTER, "2026-01-01T12:01:00Z")], used=QUARTER), present=True
    )
    seats = [("t4", s) for s in (u1, ann, vic)]
    desk.answer("vic", "", [u1, ann, vic], now=110.0)  # the desk sees her kernel back
    (room,) = gpu_rooms(seats, desk.above)
    assert (room.held_mib, room.free_mib) == (SIZE, 0.0), room
    # counted by her word alone, a quarter looked free that her second kernel holds
    (blind,) = gpu_rooms(seats)
    assert blind.free_mib == QUARTER


def test_a_kernel_granted_beyond_its_slice_still_counts_while_its_report_is_stale():
    """Ann's second kernel is back beyond her quarter by the culler's grant; then her reports
    stop (a busy server, a network blip). Unknown is never free: the culler still counts the
    two quarters her pod held when it last heard, so of Vic's and Wes's waiting quarters only
    Vic's is granted. Before, a stale report counted her slice alone, and Wes's restore met
    CUDA out of memory (lost: NVIDIA/cuda-checkpoint#44)."""
    desk = SwapDesk(report_in=10)
    u1, back = _ann_granted_beyond(desk)
    ann = _hami("ann", report(back, used=2 * QUARTER))
    desk.answer("ann", "", [u1, ann], now=105.0)  # the desk sees her kernel back
    _only_vic_granted(desk, u1, replace(ann, fresh=False), now=110.0)


def test_the_hubs_room_counts_a_grant_beyond_the_slice_of_an_absent_or_silent_server():
    """The hub's room (culler/room.py) beside u1 and Vic, present: Ann's second kernel is
    back beyond her quarter by the culler's grant. Where she is away and both her kernels
    work (no swap can take them), or where her report is stale, the device still holds her
    two quarters: no newcomer's quarter fits. Before, only a present user's grant counted,
    and a quarter looked free."""
    from fracspawner.culler.room import gpu_rooms

    desk = SwapDesk(report_in=10)
    u1, back = _ann_granted_beyond(desk)
    u1 = replace(u1, present=True)
    vic = _hami(
        "vic", report([kernel("v", QUARTER, "2026-01-01T12:01:00Z")], used=QUARTER), present=True
    )
    busy = [{**k, "execution_state": "busy"} for k in back]
    away = _hami("ann", report(busy, used=2 * QUARTER))
    desk.answer("vic", "", [u1, away, vic], now=110.0)  # the desk sees her kernel back
    for ann in (away, replace(away, fresh=False)):
        (room,) = gpu_rooms([("t4", s) for s in (u1, ann, vic)], desk.above)
        assert (room.held_mib, room.free_mib) == (SIZE, 0.0), (ann.fresh, room)
    # away with both kernels idle, the swap can take her second one: its quarter is room
    idle = _hami("ann", report(back, used=2 * QUARTER))
    (room,) = gpu_rooms([("t4", s) for s in (u1, idle, vic)], desk.above)
    assert room.free_mib >= QUARTER, room
