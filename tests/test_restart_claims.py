"""A spawn's claim on a slot outlives a hub restart while its pod is Pending (review s53,
finding 2). Admission's in-flight holds (`fracspawner.choice.admission.Admissions`) live in the
hub's memory; the pod watch shows the hub's pods made but on no node yet, and admission counts
those as claims on their slots, once each.

Real JupyterHub users and spawners (tests/hub_support.py) and the hub's real `CapacityWatcher`,
its reads included; only its watches are fed here with what they would list (no API server):
the T4's nodes, jobs bound to it, and the pods these spawns make, Pending with no node.
The same for a DRA pool's pod bound to a node whose claim the claim watch has not shown
allocated: the counts, made from claims, do not include it yet either.
"""

from __future__ import annotations

import asyncio
import re

import pytest
from kubernetes_asyncio.client import ApiClient
from tornado.web import HTTPError

from fracspawner.capacity.watch import CapacityWatcher
from fracspawner.choice.admission import Admissions
from fracspawner.hub.waiting import WaitingSpawns
from tests import test_dra_capacity as dra
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


# --------------------------------------------------------------------------- DRA
DRA_CATALOG = {
    "pools": {
        "h100-dra": {
            "gpu": "H100-80GB",
            "backend": "dra",
            "options": {"sharing": "memory"},
            "offers": ["10GiB"],  # 7 claims of 10 GiB fit one H100's 81559 MiB
        }
    },
    "images": CATALOG["images"],
    "access": {"default": {"pools": "all", "max_gpu": None}},
}
TEN = {"gpu": "10GiB", "pool": "h100-dra"}


def dra_cluster(hub: HubUsers, jobs: int) -> FedWatcher:
    """One H100 shared by memory (7 x 10 GiB), `jobs` of them held by allocated claims."""
    watcher = FedWatcher(hub.spawner(hub.user("nobody")).fracspawner_catalog)
    watcher.live.replace_nodes([dra.node("dra-1")])
    watcher.live.replace_pods([])
    watcher.live.replace_slices([dra.memory_slice("dra-1")])
    watcher.live.replace_claims(
        [dra.claim(f"job-{i}", "dra-1", "gpu-0", "10Gi") for i in range(jobs)]
    )
    return watcher


def pod_claim(spawner, *, allocated: bool) -> dict:
    """The claim kube-controller-manager makes for the spawner's pod from its template
    (owned by the pod), as the claim watch sees it: allocated on dra-1's GPU, or not yet."""
    made = dra.claim(f"{spawner.pod_name}-gpu-x1", "dra-1", "gpu-0", "10Gi")
    made["metadata"].update(
        namespace=spawner.namespace,
        ownerReferences=[
            {"apiVersion": "v1", "kind": "Pod", "name": spawner.pod_name,
             "uid": f"uid-{spawner.pod_name}", "controller": True}
        ],
    )  # fmt: skip
    return made if allocated else {**made, "status": {}}


async def free_on_form(spawner) -> str:
    form = await spawner._render_options_form_async(None)
    return re.findall(r"\d+ of \d+ free", form)[0]


NO_TEN = "No 10 GiB is free on h100-dra right now"


@pytest.mark.parametrize("claim_seen", [True, False], ids=["claim-unallocated", "claim-unseen"])
async def test_a_bound_dra_pod_whose_claim_the_watch_has_not_seen_allocated_keeps_its_slot(
    claim_seen: bool,
):
    """Ann took the H100's last 10 GiB; her pod is bound, but the claim watch has not shown
    her claim allocated (or not listed it at all: two watches, no order between them, and
    after a hub restart both list again). The counts, made from claims, do not include her pod
    until then, and after a restart no in-flight hold stood for it: bob was admitted for the
    memory her claim holds. Her pod now counts as the offer its labels name until the
    allocation shows, then by the allocation, once."""
    hub = HubUsers({"FracSpawner": {"catalog": DRA_CATALOG, "admission": "refuse"}})
    watcher = dra_cluster(hub, jobs=6)
    ann = spawner_of(hub, "ann", watcher)
    assert await outcome(ann, TEN) == "admitted"
    await made(ann, watcher, node="dra-1")
    if claim_seen:
        watcher.live.put_claim(pod_claim(ann, allocated=False))
    assert (await outcome(spawner_of(hub, "bob", watcher), TEN)).startswith(NO_TEN)

    restart_hub(hub)
    got = await outcome(spawner_of(hub, "bob", watcher), TEN)
    assert got.startswith(NO_TEN), f"bob, after the restart: {got!r} (ann's bound pod's 10 GiB)"
    assert await free_on_form(spawner_of(hub, "bob", watcher)) == "0 of 7 free"
    # the allocation arrives: counted by it now, and only by it (a job's claim gone frees one)
    watcher.live.put_claim(pod_claim(ann, allocated=True))
    assert await free_on_form(spawner_of(hub, "bob", watcher)) == "0 of 7 free"
    watcher.live.drop_claim("jhub/job-0")
    assert await free_on_form(spawner_of(hub, "bob", watcher)) == "1 of 7 free"
    assert await outcome(spawner_of(hub, "bob", watcher), TEN) == "admitted"


async def test_a_bound_dra_pod_of_no_offer_awaiting_its_claim_leaves_its_pool_unknown_not_free():
    """A hub server's DRA pod, bound, its claim not shown allocated, labelled with a size the
    catalog no longer offers (taken out before the restart): what it holds is unknown, so no
    offer of its pool reads free (refused; under "wait" it would wait) until the allocation
    shows; then the counts are the allocation's."""
    hub = HubUsers({"FracSpawner": {"catalog": DRA_CATALOG, "admission": "refuse"}})
    watcher = dra_cluster(hub, jobs=0)
    ann = spawner_of(hub, "ann", watcher)
    assert await outcome(ann, TEN) == "admitted"
    manifest = object.__new__(ApiClient).sanitize_for_serialization(await ann.get_pod_manifest())
    manifest["metadata"].update(namespace=ann.namespace, uid=f"uid-{ann.pod_name}")
    manifest["metadata"]["labels"]["fracspawner.io/gpu"] = "40Gi"  # no offer of the catalog
    manifest["spec"]["nodeName"] = "dra-1"
    manifest["status"] = {"phase": "Running"}
    watcher.live.put_pod(manifest)
    restart_hub(hub)
    bob = spawner_of(hub, "bob", watcher)
    assert (await outcome(bob, TEN)).startswith(NO_TEN)
    assert "GPU claim is not known yet" in await bob._render_options_form_async(None)
    watcher.live.put_claim(pod_claim(ann, allocated=True))
    assert await free_on_form(spawner_of(hub, "bob", watcher)) == "6 of 7 free"


async def test_a_bound_dra_pod_awaiting_its_claim_counts_against_its_users_quota_after_a_restart():
    """The quota side needs no claim: the watch counts each active pod of a user by its
    `fracspawner.io/gpu-equivalent`, bound or not, allocated or not (LiveCapacity usage)."""
    catalog = {**DRA_CATALOG, "access": {"default": {"pools": "all", "max_gpu": 0.125}}}
    hub = HubUsers({"FracSpawner": {"catalog": catalog, "admission": "refuse"}})
    watcher = dra_cluster(hub, jobs=0)
    ann = spawner_of(hub, "ann", watcher)
    assert await outcome(ann, TEN) == "admitted"
    await made(ann, watcher, node="dra-1")
    restart_hub(hub)
    assert watcher.usage_of("ann") == 0.125
    second = hub.spawner(hub.user("ann"), "two")
    second._capacity_watcher = lambda: watcher  # type: ignore[method-assign]
    got = await outcome(second, TEN)
    assert got.startswith("Quota"), got
