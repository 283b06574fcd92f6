"""Admission knows who is present (issue 36, item 5; bug 4: "8 present users on one
over-committed GPU: 28 CUDA out-of-memory errors in the cells of users 5-8 over 40 min, and no
word about why"). The everyone-present lab: one T4 of a pool with 4 slots over-committed twice
(8 slots of 1/4). The culler's room view (culler/room.py, `Culler.room_json`) counts a present
user's slice whole; the hub's admission (hub/room.py, FracSpawner) keeps the 5th..8th new
servers in line with the reason while the first four hold the GPU, and lets the next one in
when a user leaves."""

from __future__ import annotations

from fracspawner.backends import load_catalog
from fracspawner.culler.decide import ServerFacts
from fracspawner.culler.placement import Placement
from fracspawner.culler.reports import parse_report
from fracspawner.culler.room import gpu_rooms, server_tag
from fracspawner.culler.swapdesk import seats_from
from tests.test_overcommit_pressure import QUARTER, SIZE, UUID, kernel, report

LAB = {
    "pools": {
        "t4": {"gpu": "T4", "backend": "timeslicing", "replicas": 4, "overcommit": 2,
               "offers": ["1/4"]},
    }
}  # fmt: skip
NOW = 1e9
AT = "2001-09-09T01:46:00Z"  # the reports' sampled_at, just before NOW


def lab_reports(present: dict[str, bool], busy: frozenset[str] = frozenset()) -> list:
    """Each user's server report: one idle (or busy) kernel holding its quarter; the device
    reading says what all of them hold."""
    used = QUARTER * len(present)
    out = []
    for i, (user, here) in enumerate(sorted(present.items())):
        extra = {"execution_state": "busy"} if user in busy else {}
        body = report(
            [kernel(f"k-{user}", QUARTER, f"2001-09-09T00:0{i}:00Z", **extra)],
            present=here,
            used=used,
        )
        out.append((user, "", parse_report({**body, "sampled_at": AT}, received_at=NOW)))
    return out


def rooms(reports, users) -> list:
    catalog = load_catalog(LAB)
    known = {(u, ""): ServerFacts(u, user_options={"gpu": "1/4", "pool": "t4"}) for u in users}
    seats = seats_from(reports, known, catalog, NOW, 30, placement=lambda u, s: Placement("node-1"))
    return gpu_rooms([("t4", s) for s in seats])


def test_present_users_hold_their_whole_slice_and_a_leaving_one_frees_it():
    users = ["u1", "u2", "u3", "u4"]
    (room,) = rooms(lab_reports(dict.fromkeys(users, True)), users)
    assert (room.pool, room.gpu, room.size_mib) == ("t4", f"node-1/{UUID}", SIZE)
    # four present people, each may run a cell at any moment: the GPU is theirs
    assert room.present == 4 and room.held_mib == SIZE and room.free_mib == 0
    assert set(room.servers) == {server_tag(u, "") for u in users}
    # u1 leaves (absent): its idle kernel can be swapped out, so its quarter is room
    (room,) = rooms(lab_reports({**dict.fromkeys(users, True), "u1": False}), users)
    assert room.present == 3 and room.free_mib == QUARTER
    # a busy kernel of an absent user cannot be swapped out: no room
    (room,) = rooms(lab_reports({**dict.fromkeys(users, True), "u1": False}, {"u1"}), users)
    assert room.free_mib == 0


def test_unknown_is_never_room():
    """A server whose report is stale, or that has not reported (its pod on the GPU's node),
    counts its whole slice; memory the device shows and nobody reports counts too."""
    users = ["u1", "u2", "u3", "u4"]
    absent = lab_reports(dict.fromkeys(users, False))
    (room,) = rooms(absent, users)
    assert room.present == 0 and room.free_mib == SIZE  # four idle kernels: all swappable
    # u5 listed by the hub, pod on node-1, no report yet: its slice
    (room,) = rooms(absent, [*users, "u5"])
    assert room.free_mib == SIZE - QUARTER and server_tag("u5", "") in room.servers
    # u1's report is stale: its slice
    old = parse_report({**report([]), "sampled_at": AT}, received_at=NOW - 100)
    (room,) = rooms([*absent[1:], ("u1", "", old)], users)
    assert room.free_mib == SIZE - QUARTER
    # the device shows a quarter more than the servers report (a kernel above its slice)
    more = lab_reports(dict.fromkeys(users, False))
    more = [(u, s, r) for u, s, r in more]
    bigger = report([kernel("k-u1", QUARTER, "2001-09-09T00:00:00Z")], used=5 * QUARTER)
    more[0] = ("u1", "", parse_report({**bigger, "sampled_at": AT}, received_at=NOW))
    for i in range(1, 4):
        body = report([kernel(f"k-u{i + 1}", QUARTER, AT)], used=5 * QUARTER)
        more[i] = (f"u{i + 1}", "", parse_report({**body, "sampled_at": AT}, received_at=NOW))
    (room,) = rooms(more, users)
    assert room.free_mib == SIZE - QUARTER
