"""End to end with `c.FracSpawner.live_capacity = False` (issue 14, item 9): no pod watch, and
quotas still hold, counted from the hub's own state, also for simultaneous spawns; the picker's
service, without its watch too, tells each user what their servers hold (never "0 in use")."""

from __future__ import annotations

import re

import pytest

from tests.e2e_helpers import Browserless, server_pods, spawn, spawn_all, stop

pytestmark = pytest.mark.e2e

HUB_EXTRA_CONFIG = """
c.FracSpawner.live_capacity = False
# the picker's service without its pod watch too, as a hub without node/pod read access runs it
for _service in c.JupyterHub.services:
    if _service["name"] == "fracspawner":
        _service["command"] = [*_service["command"], "--no-live-capacity"]
"""
OFFERS = "/services/fracspawner/api/offers"


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


def test_the_service_without_a_watch_says_what_the_users_servers_hold(hub, devcluster):
    # the demo's default rule: at most 1/4 GPU; a 1/4 server holds all of it
    status, body = spawn(hub, "nowq", {"gpu": "1/4", "pool": "h100"}, server="work")
    assert status in (201, 202), body
    hub.wait_ready("nowq", "work")
    user = Browserless(hub, "nowq")
    # the service signs the user in through the hub (HubOAuth) and asks the hub for their
    # servers with that token: the quota the picker's refresh shows, not "0 in use"
    model = user.session.get(hub.url + OFFERS, timeout=60).json()
    quota = model["quota"]
    assert (quota["used_text"], quota["max_text"], quota["remaining_text"]) == (
        "1/4",
        "1/4 GPU",
        "0 GPU",
    )
    h100 = next(p for p in model["pools"] if p["name"] == "h100")
    eighth = next(o for o in h100["offers"] if o["spec"] == "1/8")
    assert not eighth["allowed"] and eighth["over_quota"]
    assert eighth["reason"] == "Needs 1/8 GPU; your quota has 0 GPU left."
    page = user.session.get(hub.url + "/services/fracspawner/", timeout=60).text
    line = re.search(r'<p id="fs-page-quota">(.*?)</p>', page, re.S)
    assert line and " ".join(re.sub(r"<[^>]+>", "", line.group(1)).split()) == (
        "Your GPU quota: 1/4 of 1/4 GPU in use, 0 GPU left."
    )

    # stopped, it holds nothing: the next refresh says so
    stop(hub, "nowq", "work", cluster=devcluster)
    quota = user.session.get(hub.url + OFFERS, timeout=60).json()["quota"]
    assert (quota["used_text"], quota["remaining_text"]) == ("0", "1/4 GPU")
