"""A restarted server counts by its own report, never by its previous incarnation's (issue
rules: unknown is never free; two requests at once must not both pass a limit meant for one).

A server stopped and started again keeps its name, and the culler keeps its last report until
it goes stale (max_staleness, 300 s) and lists the server by the hub's listing of up to
cull_every (300 s) ago. The room answer (`GET api/room`) and the grants counted the new pod by
the old one's report: an away user's idle kernel that no longer exists, 0 MiB, where the new
server's first cell may take its whole slice. The hub's admission, seeing her tag counted,
dropped its own admission of her and let the next spawn into the same quarter. A report whose
monitor started before the server's pod was made is now no report (ReportStore.for_server's
rule, which the culling path already used): the server counts its whole slice until it reports.
"""

from __future__ import annotations

import time

import pytest

from fracspawner.backends import load_catalog
from fracspawner.culler.app import Culler
from fracspawner.culler.decide import ServerFacts
from fracspawner.culler.placement import Placement
from fracspawner.culler.reports import parse_report
from fracspawner.culler.unlisted import unlisted_seats
from fracspawner.hub.room import RoomLine, counted_tags, server_tag, verdict
from tests.test_overcommit_pressure import QUARTER, SIZE, UUID, kernel, report

CATALOG = {"pools": {"t4": {"gpu": "T4", "backend": "hami", "overcommit": 2, "offers": ["1/4"]}}}


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _ann_away(now: float) -> dict:
    """Ann's report of 100 s ago from a server started 2 h ago: away, one idle quarter (the
    swap could take it)."""
    k = kernel("old-k", QUARTER, _iso(now - 7200))
    body = report([k], used=4 * QUARTER)
    return {**body, "sampled_at": _iso(now - 100), "monitor_started": _iso(now - 7200)}


@pytest.mark.parametrize(
    ("ann_report", "pod_made", "bob_admitted"),
    [
        (False, 7200, False),  # no report: her whole slice
        (True, 30, False),  # her pod was made 30 s ago: the report is the previous one's
        (True, 7200, True),  # the report is her pod's: the swap can take her idle kernel
    ],
)
def test_a_restarted_servers_previous_report_is_no_report(
    ann_report: bool, pod_made: float, bob_admitted: bool
) -> None:
    """One T4 (HAMi, over-committed twice): three present users hold a busy quarter each. Ann
    closed her tab (one idle quarter), stopped her server and started it again within
    cull_every: the culler still lists her old server and has its fresh report. The hub let
    her new server in; bob asks for a quarter. Before, her previous report counted (0 MiB) and
    bob was admitted into her quarter."""
    go, free = bob_after_ann(ann_report, pod_made)
    assert go == bob_admitted, f"bob admitted: {go} (free {free} MiB)"


def bob_after_ann(
    ann_report: bool, pod_made: float, culler_key: str = "", hub_key: str = ""
) -> tuple[bool, float]:
    """The scenario above (tests/test_room_tag_key.py's too, with the room tag keys of culler
    and hub): whether bob is admitted, and the free MiB the culler's answer says."""
    culler = Culler(room_tag_key=culler_key)
    culler._catalog = load_catalog(CATALOG)
    now = time.time()
    here = Placement("node-1", uuids=frozenset({UUID}), pool="t4", memory_mib=QUARTER)
    ann_pod = Placement(
        "node-1", uuids=frozenset({UUID}), pool="t4", memory_mib=QUARTER, created=now - pod_made
    )
    culler.placement_of = lambda user, server: ann_pod if user == "ann" else here
    at = _iso(now - 100)
    for i in (1, 2, 3):
        k = kernel(f"k{i}", QUARTER, at, execution_state="busy")
        body = {**report([k], present=True, used=4 * QUARTER), "sampled_at": at}
        culler.known[(f"u{i}", "")] = ServerFacts(
            f"u{i}", user_options={"gpu": "1/4", "pool": "t4"}
        )
        culler.reports.put(f"u{i}", "", parse_report(body, received_at=now - 100))
    culler.known[("ann", "")] = ServerFacts(
        "ann", user_options={"gpu": "1/4", "pool": "t4"}, started=now - 7200
    )
    if ann_report:
        culler.reports.put("ann", "", parse_report(_ann_away(now), received_at=now - 100))
    culler.listed_at = now - 200
    answer = culler.room_json(now)
    line = RoomLine()
    line.admit(("ann", ""), "t4", server_tag("ann", "", hub_key), QUARTER)  # the hub let her in
    in_flight = line.in_flight_mib("t4", counted_tags(answer), ("bob", ""))
    v = verdict(answer, "t4", QUARTER, size_mib=SIZE, gpus_in_pool=1, in_flight_mib=in_flight)
    (gpu,) = answer["gpus"]
    return v.go, gpu["free_mib"]


@pytest.mark.parametrize(("pod_made", "counted"), [(30, False), (7200, True)])
def test_an_unlisted_servers_previous_report_is_no_report(pod_made: float, counted: bool) -> None:
    """Ann's server, stopped while the hub listed its servers and started again since, is not
    listed yet: the pod watch seats it. Its previous incarnation's report does not count for
    the new pod (its whole slice does, unknown is never free); its own pod's report does."""
    now = time.time()
    where = Placement(
        "node-1", uuids=frozenset({UUID}), pool="t4", memory_mib=QUARTER,
        owner=("ann", ""), created=now - pod_made,
    )  # fmt: skip
    reports = {("ann", ""): parse_report(_ann_away(now), received_at=now - 100)}
    (seat,) = unlisted_seats(
        [("jupyter-ann", where)], (), (), reports, load_catalog(CATALOG), now, 300
    )
    assert seat.fresh == counted and bool(seat.facts.gpus) == counted, seat
