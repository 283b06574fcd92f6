"""A report from a server of another pool does not end grants in force (issue rule: two
requests at once must not both pass a limit meant for one).

The culler answers each report with seats of the over-committed pools and the reporter's own
pool only (Culler._swap_answer). Its swap desk forgot every grant, and every grant beyond a
slice, whose server was not among those seats, as if its kernel no longer waited: a report from
any server of another pool erased them. On a HAMi pool without over-commit, where the grant is
the only check before a restore, the room granted to one waiting kernel was then granted again
to the next in line: two restores into room for one, and the second meets CUDA out of memory
and loses its GPU state (NVIDIA/cuda-checkpoint#44). Now a grant ends only on its own pool's
seats (its kernel no longer waits, or its server stopped) or after GRANT_SECONDS.
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from fracspawner.backends import load_catalog
from fracspawner.culler.app import Culler
from fracspawner.culler.decide import ServerFacts
from fracspawner.culler.identity import Identity
from fracspawner.culler.placement import Placement
from fracspawner.culler.reports import parse_report
from fracspawner.culler.swapdesk import Seat, SwapDesk
from tests.test_culler_claim_bound import _ann_granted_beyond, _hami, _only_vic_granted, waiting
from tests.test_overcommit_pressure import QUARTER, kernel, report

CATALOG = {
    "pools": {
        # HAMi without over-commit: the culler grants where a resume waits
        "t4": {"gpu": "T4", "backend": "hami", "offers": ["1/4"]},
        "t4b": {"gpu": "T4", "backend": "hami", "overcommit": 2, "offers": ["1/4"]},
    }
}


@pytest.mark.parametrize("other_pool_reports", [False, True])
def test_a_report_from_another_pool_keeps_grants_in_force(other_pool_reports: bool) -> None:
    """GPU-A (pool t4) has room for one waiting quarter, granted to u4. u5's kernel has waited
    since a second before u4's (its first report comes just after u4's grant). A server of the
    over-committed pool t4b (GPU-B) reports in between. u5 waits behind u4's grant either way.
    Before, t4b's report erased u4's grant and u5 was granted the same room."""
    culler = Culler()
    culler._catalog = load_catalog(CATALOG)
    culler.placement_of = lambda user, server: Placement("node-1")
    now = time.time()
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))

    def put(user: str, pool: str, body: dict, uuid: str) -> None:
        body["devices"][0]["uuid"] = uuid
        culler.known[(user, "")] = ServerFacts(user, user_options={"gpu": "1/4", "pool": pool})
        culler.reports.put(user, "", parse_report({**body, "sampled_at": at}, received_at=now))

    def waits(user: str, since: str) -> None:
        wait = [{"kernel_id": f"{user}k", "gpu_memory_mib": 2000.0, "since": since}]
        put(user, "t4", report([], waiting=wait, used=3 * QUARTER), "GPU-A")

    for i in (1, 2, 3):  # three busy quarters: one quarter left on GPU-A
        k = kernel(f"k{i}", QUARTER, "2026-01-01T10:00:00Z", execution_state="busy")
        put(f"u{i}", "t4", report([k], used=3 * QUARTER), "GPU-A")
    waits("u4", "2026-01-01T12:00:01Z")
    got = culler.answer_report(Identity("u4", ""), now)["swap"]
    assert got.get("resume") == [{"kernel_id": "u4k", "gpu_memory_mib": 2000.0}], got
    waits("u5", "2026-01-01T12:00:00Z")
    k = kernel("vk", QUARTER, "2026-01-01T10:00:00Z", execution_state="busy")
    put("v1", "t4b", report([k], used=QUARTER), "GPU-B")
    if other_pool_reports:
        culler.answer_report(Identity("v1", ""), now + 1)
    got = (culler.answer_report(Identity("u5", ""), now + 2) or {}).get("swap", {})
    assert "resume" not in got, f"u4's room granted again to u5: {got}"
    assert got.get("wait") == [{"kernel_id": "u5k", "reason": "the GPU is full"}], got


def _in(pool: str, seat: Seat) -> Seat:
    return replace(seat, pool=pool)


def test_a_report_from_another_pool_keeps_a_grant_beyond_the_slice_counted() -> None:
    """Ann's second kernel is back beyond her quarter by the culler's grant (pool t4). A
    server of pool t4b reports (its seats: t4b's only). The device still holds Ann's two
    quarters: of Vic's and Wes's waiting quarters only Vic's is granted. Before, t4b's report
    erased her grant beyond the slice, and Wes's restore met CUDA out of memory."""
    desk = SwapDesk(report_in=10)
    u1, back = _ann_granted_beyond(desk)  # seats without a pool: the same one
    u1, ann = _in("t4", u1), _in("t4", _hami("ann", report(back, used=2 * QUARTER)))
    desk.answer("ann", "", [u1, ann], now=105.0)  # the desk sees her kernel back
    body = report([kernel("vk", QUARTER, "2026-01-01T10:00:00Z")])
    body["devices"][0]["uuid"] = "GPU-B"  # another pool's GPU
    other = _in("t4b", _hami("v1", body))
    desk.answer("v1", "", [other], now=106.0)
    _only_vic_granted(desk, u1, ann, now=110.0)


def test_a_stopped_servers_grants_end_with_its_own_pools_next_report() -> None:
    """The control: a server of the same pool that has no seat any more (stopped) keeps no
    grant once a server of that pool reports."""
    desk = SwapDesk(report_in=10)
    u1 = _in("t4", _hami("u1", report([kernel("k1", QUARTER, "2026-01-01T10:00:00Z")])))
    ann = _in("t4", _hami("ann", waiting(("a2", "2026-01-01T11:00:00Z"), resident=QUARTER)))
    got = desk.answer("ann", "", [u1, ann], now=100.0)["swap"]
    assert got.get("resume") == [{"kernel_id": "a2", "gpu_memory_mib": QUARTER}], got
    assert desk.granted and desk.beyond
    desk.answer("u1", "", [u1], now=101.0)  # Ann stopped: t4 has u1 only
    assert not desk.granted and not desk.beyond
