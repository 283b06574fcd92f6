"""Admission counts what present users' kernels physically hold where the slice is a limit
(issue 36, item 5: a new server waits where it "would exceed the physical memory held by
present users' kernels"), and half again for them to grow into (culler/room.py
`PRESENT_GROWTH`), within their slice. On a pool whose backend hard-limits memory (HAMi here),
a present user whose kernel holds 1/4 of its slice leaves most of that slice free for a
newcomer; a present user whose kernel is hibernated counts what its report says it brings
back, the same way; one whose kernels hold nothing yet (about to allocate: bug 4's
everyone-present lab), or whose hibernated kernel's size is not reported, still counts the
whole slice; on time-slicing (no limit at the slice) every present user does."""

from __future__ import annotations

from fracspawner.backends import load_catalog
from fracspawner.culler.decide import ServerFacts
from fracspawner.culler.placement import Placement
from fracspawner.culler.reports import parse_report
from fracspawner.culler.room import PRESENT_GROWTH, gpu_rooms
from fracspawner.culler.swapdesk import seats_from
from tests.test_overcommit_admission import AT, NOW
from tests.test_overcommit_admission import rooms as time_sliced_rooms
from tests.test_overcommit_pressure import QUARTER, SIZE, kernel, report

USERS = ["u1", "u2", "u3", "u4"]
HAMI = {"pools": {"t4": {"gpu": "T4", "backend": "hami", "overcommit": 2, "offers": ["1/4"]}}}


def rooms(reports, users) -> list:
    """The culler's room view of a T4 of a HAMi pool over-committed twice (8 quarters)."""
    catalog = load_catalog(HAMI)
    known = {(u, ""): ServerFacts(u, user_options={"gpu": "1/4", "pool": "t4"}) for u in users}
    seats = seats_from(reports, known, catalog, NOW, 30, placement=lambda u, s: Placement("node-1"))
    return gpu_rooms([("t4", s) for s in seats])


def present_reports(mib: dict[str, float], state: dict[str, str] | None = None) -> list:
    """Each present user's report: one idle kernel holding `mib[user]` on the GPU."""
    used = sum(mib.values())
    out = []
    for i, user in enumerate(sorted(mib)):
        hibernation = (state or {}).get(user, "running")
        k = kernel(f"k-{user}", mib[user], f"2001-09-09T00:0{i}:00Z", hibernation)
        body = report([k], present=True, used=used)
        out.append((user, "", parse_report({**body, "sampled_at": AT}, received_at=NOW)))
    return out


def test_present_users_count_what_their_kernels_hold_not_their_whole_slice():
    # four present people whose kernels each hold a quarter of their quarter (as a 5 GiB kernel
    # in a 1/4 of an H100): the GPU physically holds a quarter of its memory; with room for
    # them to grow by half again, two more quarters fit
    (room,) = rooms(present_reports(dict.fromkeys(USERS, QUARTER / 4)), USERS)
    assert room.present == 4
    assert room.held_mib == SIZE / 4 * (1 + PRESENT_GROWTH)
    assert room.free_mib >= 2 * QUARTER
    # what they may grow into stays within their slice
    (room,) = rooms(present_reports(dict.fromkeys(USERS, 0.9 * QUARTER)), USERS)
    assert room.held_mib == SIZE and room.free_mib == 0


def test_a_present_user_about_to_allocate_counts_the_whole_slice():
    # u1's kernel holds nothing yet (its first cell may allocate at any moment): its slice
    mib = {**dict.fromkeys(USERS, QUARTER / 4), "u1": 0.0}
    (room,) = rooms(present_reports(mib), USERS)
    assert room.held_mib == QUARTER + 3 * QUARTER / 4 * (1 + PRESENT_GROWTH)


def test_a_present_user_s_hibernated_kernel_counts_what_it_brings_back():
    # u1's kernel is hibernated and its report says what it brings back (hibernate.py's
    # `hibernated_gpu_memory_mib`): counted as if resident, half again to grow into, within
    # the slice; a present user's small hibernated kernel does not hold their whole slice
    # (breaks on half the GPUs, reserving: 15,412 MiB a GPU on average while people waited)
    mib = dict.fromkeys(USERS, QUARTER / 4)
    asleep = {"state": "hibernated", "hibernated_gpu_memory_mib": QUARTER / 4}
    body = report([kernel("k-u1", 0, "2001-09-09T00:00:00Z") | {"hibernation": asleep}],
                  present=True, used=3 * QUARTER / 4)  # fmt: skip
    u1 = ("u1", "", parse_report({**body, "sampled_at": AT}, received_at=NOW))
    others = [r for r in present_reports(mib) if r[0] != "u1"]
    (room,) = rooms([u1, *others], USERS)
    assert room.held_mib == 4 * QUARTER / 4 * (1 + PRESENT_GROWTH)
    # its size not reported (a server from before it said so): unknown is never free, its slice
    (room,) = rooms(present_reports({**mib, "u1": 0.0}, {"u1": "hibernated"}), USERS)
    assert room.held_mib == QUARTER + 3 * QUARTER / 4 * (1 + PRESENT_GROWTH)


def test_on_time_slicing_a_present_user_counts_the_whole_slice():
    # nothing limits a kernel to its replica's share: a first allocation or growth may exceed
    # it, so the unused rest of a present user's slice is never room for a newcomer
    (room,) = time_sliced_rooms(present_reports(dict.fromkeys(USERS, QUARTER / 4)), USERS)
    assert room.held_mib == SIZE and room.free_mib == 0


def test_a_server_the_hub_has_not_listed_yet_is_limited_by_its_pool_too():
    """A pod the culler counts before the hub lists its server (culler/unlisted.py) is of the
    same HAMi pool as the listed ones: its kernels can never hold more than its slice either,
    so the present rule is the same (what they hold and half again, not the whole slice)."""
    from fracspawner.culler.room import held_by
    from fracspawner.culler.unlisted import unlisted_seats

    (u5,) = present_reports({"u5": QUARTER / 4})
    where = Placement("node-1", pool="t4", memory_mib=QUARTER, owner=("u5", ""))
    (seat,) = unlisted_seats(
        [("jupyter-u5", where)], set(), set(), {("u5", ""): u5[2]}, load_catalog(HAMI), NOW, 30
    )
    assert seat.enforced, "an unlisted HAMi pod is taken as not limited to its slice"
    (gpu,) = seat.facts.gpus
    assert held_by(seat, gpu) == QUARTER / 4 * (1 + PRESENT_GROWTH)
