"""End to end with `c.FracSpawner.live_capacity = False` (issue 14, item 9): no pod watch, and
quotas still hold, counted from the hub's own state, also for simultaneous spawns."""

from __future__ import annotations

import pytest

from tests.e2e_helpers import server_pods, spawn_all, stop

pytestmark = pytest.mark.e2e

HUB_EXTRA_CONFIG = "c.FracSpawner.live_capacity = False"


def test_three_simultaneous_eighths_under_a_quarter_quota_admit_two(hub, devcluster):
    # the demo's default rule: pool h100, at most 0.25 GPU across all of a user's servers
    names = ("one", "two", "three")
    results = spawn_all(hub, [("nowa", {"gpu": "1/8", "pool": "h100"}, n) for n in names])
    passed = [n for n, (status, _) in zip(names, results, strict=True) if status in (201, 202)]
    refused = [body for status, body in results if status == 400]
    assert len(passed) == 2 and len(refused) == 1, results
    assert refused[0]["message"].startswith("Quota:"), refused
    for name in names:
        assert len(server_pods(devcluster, "nowa", name)) == (name in passed)

    # the quota is taken by running servers, not by a watch: still refused one by one
    for name in passed:
        hub.wait_ready("nowa", name)
    refused_name = next(n for n in names if n not in passed)
    status, body = spawn_all(hub, [("nowa", {"gpu": "1/8", "pool": "h100"}, refused_name)])[0]
    assert status == 400 and body["message"].startswith("Quota:"), body

    # stopping one frees its eighth
    stop(hub, "nowa", passed[0], cluster=devcluster)
    status, body = spawn_all(hub, [("nowa", {"gpu": "1/8", "pool": "h100"}, refused_name)])[0]
    assert status in (201, 202), body
    hub.wait_ready("nowa", refused_name)
    for name in (passed[1], refused_name):
        stop(hub, "nowa", name, cluster=devcluster)
