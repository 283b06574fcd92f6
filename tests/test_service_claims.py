"""The fracspawner service's live offers count what the hub's form counts while a hub's server
pod is Pending on no node: its claim on its pool's slot (`unplaced_holds`, which the hub has
counted since a spawn's claim outlives a hub restart). Before, the service read one more free
than the hub's form for as long as such a pod waited ("1 of 4 free" on refresh against the
form's "0 of 4 free"), and Start was then refused or put in line.

The service is served for real (its `make_app` routes on a local port, the picker's
`GET /services/fracspawner/api/offers`); only HubOAuth's login is stood in for. Its watcher is
the real `CapacityWatcher`, watches fed by hand (tests/test_restart_claims.py's), with the pods
a real FracSpawner makes (`get_pod_manifest`) and the hub's form from the same watch.

The service's admin page and its gauges (`fracspawner_pool_offer_free_slices`,
`fracspawner_pool_gpu_equivalents_free`) count free the same way: before, they read the raw
counts, one more free than the form and the picker while such a pod waited.
"""

from __future__ import annotations

import json
import re

import pytest
from tornado.httpclient import AsyncHTTPClient
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from fracspawner.hub.admin import AdminData, render_admin_page
from fracspawner.hub.service import OffersHandler, make_app
from tests.hub_support import HubUsers
from tests.test_admission import pod
from tests.test_restart_claims import (
    T4,
    FedWatcher,
    cluster,
    empty_registries,  # noqa: F401 (an autouse fixture: the hub's registries start empty)
    made,
    outcome,
    restart_hub,
    spawner_of,
)
from tests.test_waiting_line import CATALOG

PREFIX = "/services/fracspawner/"


@pytest.fixture
def logged_in(monkeypatch):
    """HubOAuth's login stood in for: the cookie's user is `dan`, the watch tells usage."""
    monkeypatch.setattr(
        OffersHandler, "get_current_user", lambda self: {"name": "dan", "groups": []}
    )


async def service_t4(watcher: FedWatcher) -> tuple[int, int]:
    """(free, total) of the T4's 1/4 in the service's JSON answer to the picker."""
    sockets = bind_sockets(0, "127.0.0.1")
    server = HTTPServer(make_app(watcher.catalog, watcher, PREFIX))
    server.add_sockets(sockets)
    try:
        port = sockets[0].getsockname()[1]
        response = await AsyncHTTPClient().fetch(
            f"http://127.0.0.1:{port}{PREFIX}api/offers", follow_redirects=False
        )
    finally:
        server.stop()
    model = json.loads(response.body)
    offer = next(
        o for p in model["pools"] if p["name"] == "t4" for o in p["offers"] if o["spec"] == "1/4"
    )
    return offer["free"], offer["total"]


async def form_t4(hub: HubUsers, watcher: FedWatcher) -> str:
    form = await spawner_of(hub, "dan", watcher)._render_options_form_async(None)
    for free in range(5):
        if f"{free} of 4 free" in form:
            return f"{free} of 4 free"
    raise AssertionError(form)


async def test_the_service_counts_a_pending_hub_pods_claim_as_the_hubs_form_does(logged_in):
    """Two T4 replicas free; ann's spawn is admitted and its pod made, Pending on no node. The
    hub's form says 1 of 4 free, and so does the service's refresh (before: 2 of 4). After a
    hub restart the same. Once bound, the pod is in the counts: still one claim, not two."""
    hub = HubUsers({"FracSpawner": {"catalog": CATALOG, "admission": "refuse"}})
    watcher = cluster(hub, jobs=2)
    assert await service_t4(watcher) == (2, 4)
    ann = spawner_of(hub, "ann", watcher)
    assert await outcome(ann, T4) == "admitted"
    await made(ann, watcher)
    assert [r.name for r in watcher.unbound_pods()] == [ann.pod_name]
    assert await form_t4(hub, watcher) == "1 of 4 free"
    assert await service_t4(watcher) == (1, 4), "the service's offers, ann's pod Pending"
    restart_hub(hub)
    assert await form_t4(hub, watcher) == "1 of 4 free"
    assert await service_t4(watcher) == (1, 4)
    # bound: counted by the nodes' counts, and no longer a claim of its own
    await made(ann, watcher, node="t4")
    assert watcher.unbound_pods() == []
    assert await form_t4(hub, watcher) == "1 of 4 free"
    assert await service_t4(watcher) == (1, 4)


async def test_pending_pods_that_are_not_the_hubs_are_not_claims(logged_in):
    """A Pending pod with the pool's and the slice's labels but no kubespawner username
    annotation (Kubeflow's, a job's) is no claim for the hub, nor for the service; nor is a
    Pending pod of a user without those labels (a CPU-only or hand-made pod)."""
    hub = HubUsers({"FracSpawner": {"catalog": CATALOG, "admission": "refuse"}})
    watcher = cluster(hub, jobs=2)
    labels = {"fracspawner.io/pool": "t4", "fracspawner.io/gpu": "0.25"}
    job = pod("labelled-job", None, {"nvidia.com/gpu": "1"})
    job["metadata"]["labels"] = labels
    unlabelled = pod(
        "hand-made", None, {"nvidia.com/gpu": "1"}, **{"hub.jupyter.org/username": "eve"}
    )
    watcher.live.put_pod(job)
    watcher.live.put_pod(unlabelled)
    assert sorted(r.name for r in watcher.unbound_pods()) == ["hand-made", "labelled-job"]
    assert await form_t4(hub, watcher) == "2 of 4 free"
    assert await service_t4(watcher) == (2, 4)


async def admin_t4(watcher: FedWatcher) -> tuple[tuple[int, int], float | None, float | None, str]:
    """The admin page's T4 1/4 (free, total), its gauges' free slices and free GPU-equivalents,
    and the page's words for the offer (AdminData: the pod watch, no hub token, no culler)."""
    data = AdminData(watcher.catalog, watcher, token="")
    try:
        model = await data.model()
    finally:
        data.http.close()
    (pool,) = [p for p in model["pools"] if p["name"] == "t4"]
    (offer,) = [o for o in pool["offers"] if o["spec"] == "1/4"]
    gauge = data.metrics.registry.get_sample_value
    html = render_admin_page(model, user="admin", hub_prefix="/hub/", static_prefix="/s/")
    (words,) = re.findall(r"(\d+ of \d+)</p>", html)
    return (
        (offer["free"], offer["total"]),
        gauge("fracspawner_pool_offer_free_slices", {"pool": "t4", "offer": "1/4"}),
        gauge("fracspawner_pool_gpu_equivalents_free", {"pool": "t4"}),
        words,
    )


async def test_the_admin_page_and_its_gauges_count_a_pending_hub_pods_claim():
    """Two T4 replicas free; ann's pod is made and Pending on no node: the admin page and its
    gauges say 1 of 4 free, as the hub's form and the picker do (before: 2 of 4). Bound, it is
    counted once, by the nodes' counts."""
    hub = HubUsers({"FracSpawner": {"catalog": CATALOG, "admission": "refuse"}})
    watcher = cluster(hub, jobs=2)
    assert await admin_t4(watcher) == ((2, 4), 2.0, 0.5, "2 of 4")
    ann = spawner_of(hub, "ann", watcher)
    assert await outcome(ann, T4) == "admitted"
    await made(ann, watcher)
    assert [r.name for r in watcher.unbound_pods()] == [ann.pod_name]
    assert await form_t4(hub, watcher) == "1 of 4 free"
    assert await admin_t4(watcher) == ((1, 4), 1.0, 0.25, "1 of 4"), "ann's pod Pending"
    await made(ann, watcher, node="t4")
    assert watcher.unbound_pods() == []
    assert await admin_t4(watcher) == ((1, 4), 1.0, 0.25, "1 of 4")
