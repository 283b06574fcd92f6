"""A spawn's claim on a slot outlives a hub restart while its pod is Pending (review s53,
finding 2). Admission's in-flight holds (`fracspawner.choice.admission.Admissions`) live in the
hub's memory; the pod watch shows the hub's pods made but on no node yet, and admission counts
those as claims on their slots, once each.

Real JupyterHub users and spawners (tests/hub_support.py) and the hub's real `CapacityWatcher`,
its reads included; only its watches are fed here with what they would list (no API server):
the T4's nodes, jobs bound to it, and the pods these spawns make, Pending with no node.
"""

from __future__ import annotations

import asyncio

import pytest
from kubernetes_asyncio.client import ApiClient
from tornado.web import HTTPError

from fracspawner.capacity.watch import CapacityWatcher
from fracspawner.choice.admission import Admissions
from fracspawner.hub.waiting import WaitingSpawns
from tests.hub_support import HubUsers, begin_spawn, refusal
from tests.test_admission import NODES, pod
from tests.test_waiting_line import CATALOG

T4 = {"gpu": "1/4", "pool": "t4"}


class FedWatcher(CapacityWatcher):
    """The hub's capacity watcher, its watches fed by hand and always current."""

    async def start(self) -> None:
        await asyncio.sleep(0)

    def freshness(self) -> tuple[bool, float]:
        return False, 0.0


@pytest.fixture(autouse=True)
def empty_registries():
    WaitingSpawns.shared().keys.clear()
    Admissions._shared.clear()
    yield
    WaitingSpawns.shared().keys.clear()
    Admissions._shared.clear()


def cluster(hub: HubUsers, jobs: int) -> FedWatcher:
    """The T4 (4 replicas) with `jobs` of them taken by jobs bound to it."""
    watcher = FedWatcher(hub.spawner(hub.user("nobody")).fracspawner_catalog)
    watcher.live.replace_nodes(NODES)
    watcher.live.replace_pods([pod(f"job-{i}", "t4", {"nvidia.com/gpu": "1"}) for i in range(jobs)])
    return watcher


def spawner_of(hub: HubUsers, name: str, watcher: FedWatcher):
    spawner = hub.spawner(hub.user(name))
    spawner._capacity_watcher = lambda: watcher  # type: ignore[method-assign]
    return spawner


async def made(spawner, watcher: FedWatcher, node: str | None = None) -> None:
    """The spawn's pod as the API server holds it once made: Pending, on no node (or bound)."""
    manifest = object.__new__(ApiClient).sanitize_for_serialization(
        await spawner.get_pod_manifest()
    )
    manifest["metadata"].update(namespace=spawner.namespace, uid=f"uid-{spawner.pod_name}")
    manifest["spec"]["nodeName"] = node
    manifest["status"] = {"phase": "Running" if node else "Pending"}
    watcher.live.put_pod(manifest)


async def outcome(spawner, options=T4) -> str:
    try:
        await begin_spawn(spawner, options)
    except HTTPError as exc:
        return refusal(exc)
    return "admitted"


def restart_hub(hub: HubUsers) -> None:
    """What a hub restart forgets: every in-flight admission (JupyterHub stores a spawn's
    state only once start() returns, so a spawn still pending kept none either)."""
    Admissions._shared.clear()
    WaitingSpawns.shared().keys.clear()


async def test_a_hub_restart_keeps_a_pending_pods_claim_on_the_last_slot():
    """Admission "refuse": ann took the T4's last replica, her pod is made, not bound yet.
    Bob is refused before the hub restarts and after it (before the fix he was admitted for
    the replica ann's pod waits for, and his pod then waited: what "refuse" rules out)."""
    hub = HubUsers({"FracSpawner": {"catalog": CATALOG, "admission": "refuse"}})
    watcher = cluster(hub, jobs=3)
    ann = spawner_of(hub, "ann", watcher)
    assert await outcome(ann) == "admitted"
    await made(ann, watcher)
    bob = spawner_of(hub, "bob", watcher)
    assert (await outcome(bob)).startswith("No 1/4 GPU is free on t4 right now")

    restart_hub(hub)
    bob = spawner_of(hub, "bob", watcher)
    got = await outcome(bob)
    assert got.startswith("No 1/4 GPU is free on t4 right now"), (
        f"bob, after the restart: {got!r} (the replica ann's Pending pod waits for)"
    )
    # once bound, ann's pod is in the counts themselves: still one claim, still refused
    await made(ann, watcher, node="t4")
    assert (await outcome(spawner_of(hub, "bob", watcher))).startswith("No 1/4 GPU is free")
    # a server's own old pod is not a claim against its new spawn (the new pod replaces it)
    restart_hub(hub)
    await made(ann, watcher)
    assert await outcome(spawner_of(hub, "ann", watcher)) == "admitted"


async def test_a_pending_pod_with_its_hold_in_flight_is_counted_once():
    """Two replicas free: ann's in-flight hold and her Pending pod are one claim, so bob gets
    the other replica; carol, third, is refused. After a restart the same from the pods."""
    hub = HubUsers({"FracSpawner": {"catalog": CATALOG, "admission": "refuse"}})
    watcher = cluster(hub, jobs=2)
    ann = spawner_of(hub, "ann", watcher)
    assert await outcome(ann) == "admitted"
    await made(ann, watcher)
    bob = spawner_of(hub, "bob", watcher)
    assert await outcome(bob) == "admitted"
    await made(bob, watcher)
    assert (await outcome(spawner_of(hub, "carol", watcher))).startswith("No 1/4 GPU is free")
    restart_hub(hub)
    assert (await outcome(spawner_of(hub, "carol", watcher))).startswith("No 1/4 GPU is free")
    # the form says so too: 0 of 4 free, not the 2 the nodes alone would show
    form = await spawner_of(hub, "carol", watcher)._render_options_form_async(None)
    assert "0 of 4 free" in form and "2 of 4 free" not in form


async def test_a_recovered_claim_takes_no_place_in_the_waiting_line():
    """Admission "wait", one place in line: after a restart ann's Pending pod (not found
    Unschedulable) claims the last replica but takes no place; bob, who will wait for the
    next replica, takes the one place, and carol is refused as the line is full."""
    hub = HubUsers({"FracSpawner": {"catalog": CATALOG, "admission": "wait", "max_waiting": 1}})
    watcher = cluster(hub, jobs=3)
    ann = spawner_of(hub, "ann", watcher)
    assert await outcome(ann) == "admitted"
    await made(ann, watcher)
    restart_hub(hub)
    assert await outcome(spawner_of(hub, "bob", watcher)) == "admitted"
    assert WaitingSpawns.shared().keys == {("bob", "")}
    got = await outcome(spawner_of(hub, "carol", watcher))
    assert got.endswith(
        "Waiting is closed for now: 1 server already waits in line on this hub, the most it "
        "keeps waiting at once, so that others can still start."
    ), got


async def test_the_watch_knows_which_pods_no_node_holds_yet():
    """`unbound_pods`: Pending pods on no node, kept up to date event by event (a pod
    bound, booked by HAMi's scheduler, finished or deleted leaves it)."""
    watcher = cluster(HubUsers({"FracSpawner": {"catalog": CATALOG}}), jobs=1)
    names = lambda: sorted(r.name for r in watcher.unbound_pods())  # noqa: E731
    assert names() == []
    pending = pod("p", None, {"nvidia.com/gpu": "1"})
    booked = pod("b", None, {"nvidia.com/gpu": "1"}, **{"hami.io/vgpu-node": "t4"})
    watcher.live.put_pod(pending)
    watcher.live.put_pod(booked)
    assert names() == ["p"]
    watcher.live.put_pod(pod("p", "t4", {"nvidia.com/gpu": "1"}))
    assert names() == []
    watcher.live.put_pod(pending)
    watcher.live.drop_pod("default/p")
    assert names() == []
    watcher.live.put_pod(pending)
    watcher.live.put_pod({**pending, "status": {"phase": "Failed"}})
    assert names() == []
    watcher.live.replace_pods([pending])
    assert names() == ["p"]
