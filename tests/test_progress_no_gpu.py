"""A pool whose nodes offer no GPU to Kubernetes is not a wait for a free one.

The scheduler says "0/1 nodes are available: 1 Insufficient nvidia.com/gpu" both when every
GPU of the pool is taken (a wait: it starts by itself once one frees) and when no node of the
pool offers the resource at all: the device plugin (NVIDIA's, HAMi's, ...) is not running or
not registered, so the node's allocatable lacks it (it never registered) or holds 0 (the
kubelet's mark of a plugin that registered once and is gone, pkg/kubelet/nodestatus
setters.go: "Set capacity for removed resource to 0 on device removal"). The second does not
change by itself. Where the pod watch is live and says so, the progress says so, and after
SCHEDULER_GRACE_S (a plugin registering a few seconds after its node joined is normal) the
pod holds no place in line: start_timeout ends the spawn with these words. Counts the watch
cannot tell (no watch, a stale one) keep the plain wait. Stand-ins as in
tests/test_review56_progress.py; the real control plane's side is tests/test_e2e_no_gpu.py."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import time
import types
from typing import Any

import pytest

from fracspawner.backends import load_catalog
from fracspawner.capacity import compute_capacity
from fracspawner.hub import spawner as spawner_module
from fracspawner.hub.progress import gpus_unoffered
from fracspawner.hub.spawner import FracSpawner
from fracspawner.hub.waiting import WaitingSpawns
from tests.hub_support import HubUsers, begin_spawn
from tests.test_admission import NODES, pod
from tests.test_review56_progress import progress_of, spawn_with_pod, stamp, unschedulable
from tests.test_waiting_line import CATALOG, FULL_T4, FullPool

T4 = "1/4 GPU on t4"
GPU = "nvidia.com/gpu"  # the T4 pool is time-sliced: the resource is named
INSUFFICIENT = (
    "0/1 nodes are available: 1 Insufficient nvidia.com/gpu. preemption: 0/1 nodes are "
    "available: 1 No preemption victims found for incoming pod."
)


def t4_node(gpus: str | None) -> dict:
    """The T4 node of tests/test_admission.py, its nvidia.com/gpu `gpus` (None: absent)."""
    node = copy.deepcopy(NODES[0])
    for key in ("capacity", "allocatable"):
        node["status"][key] = dict(node["status"][key])
        if gpus is None:
            node["status"][key].pop("nvidia.com/gpu")
        else:
            node["status"][key]["nvidia.com/gpu"] = gpus
    return node


CATALOG_LOADED = load_catalog(CATALOG)
#: the device plugin never registered: no nvidia.com/gpu on the node at all
NEVER_REGISTERED = compute_capacity(CATALOG_LOADED, [t4_node(None)], [])
#: it registered once and is gone: the kubelet keeps the resource at 0
PLUGIN_GONE = compute_capacity(CATALOG_LOADED, [t4_node("0")], [])


def watching(snapshot):
    class Watch(FullPool):
        def snapshot(self):
            return snapshot

    return Watch


async def pending(monkeypatch, snapshot, *, age: float, admission: str = "wait", **kw):
    """A spawn for 1/4 T4 whose pod the scheduler found no node for (`INSUFFICIENT`), made
    `age` seconds ago; the pod watch shows `snapshot` (None: no watch)."""
    spawner = await spawn_with_pod(
        monkeypatch, admission, unschedulable(INSUFFICIENT, seconds_ago=age), **kw
    )
    spawner._capacity_watcher = watching(snapshot) if snapshot is not None else (lambda: None)
    return spawner


def failed_scheduling():
    raw = {"reason": "FailedScheduling", "type": "Warning", "message": INSUFFICIENT}
    return {"progress": 30, "raw_event": raw, "message": "x"}


OLD = spawner_module.SCHEDULER_GRACE_S + 30


def test_the_counts_tell_a_pool_without_gpus_from_a_full_one():
    assert NEVER_REGISTERED.get("t4", "1/4").unpublished
    assert (PLUGIN_GONE.get("t4", "1/4").free, PLUGIN_GONE.get("t4", "1/4").total) == (0, 0)
    full = FULL_T4.get("t4", "1/4")
    assert (full.free, full.total, full.unpublished) == (0, 4, False)


def test_the_words():
    assert gpus_unoffered("1/4 GPU", "T4 16GB", waited=None) == (
        "Waiting for your 1/4 GPU on T4 16GB: none of the pool's nodes offers a GPU to "
        "Kubernetes yet (a node that has just started registers its GPUs within minutes)."
    )
    assert gpus_unoffered("1/4 GPU", "T4 16GB", waited="2 minutes") == (
        "None of the nodes of T4 16GB offers a GPU to Kubernetes now, so your 1/4 GPU cannot be "
        "reserved (your server has waited 2 minutes). This does not change by itself: tell an "
        "administrator (for them: the GPU device plugin on the pool's nodes, NVIDIA's, HAMi's "
        "or another, is not running or not registered with the kubelet)."
    )
    assert "DRA driver" in gpus_unoffered("1 GPU", "H100", dra=True, waited="2 minutes")


@pytest.mark.parametrize("snapshot", [NEVER_REGISTERED, PLUGIN_GONE], ids=["absent", "zero"])
async def test_a_pool_whose_nodes_offer_no_gpu_says_so_and_leaves_the_line(monkeypatch, snapshot):
    """Before: "Waiting for a free 1/4 GPU on t4: 0 of 0 free; it starts by
    itself as soon as one frees (your place is kept for 30 minutes)." (or without the counts
    where the resource is absent), and 30 minutes in line."""
    spawner = await pending(monkeypatch, snapshot, age=OLD)
    (said,) = await progress_of(spawner, [failed_scheduling()])
    assert "starts by itself" not in said, said
    words = gpus_unoffered("1/4 GPU", "t4", resource=GPU, waited="1 minute")
    assert await progress_of(spawner, [failed_scheduling()]) == [words]
    assert spawner._stuck_words() == words
    assert not spawner._in_line()
    # kubespawner's patience message later says the same
    assert await progress_of(spawner, [{"message": "Spawn taking longer than expected"}]) == [words]


@pytest.mark.parametrize("snapshot", [NEVER_REGISTERED, PLUGIN_GONE], ids=["absent", "zero"])
async def test_within_the_grace_it_waits_and_does_not_promise(monkeypatch, snapshot):
    spawner = await pending(monkeypatch, snapshot, age=5)
    said = await progress_of(spawner, [failed_scheduling()])
    assert "starts by itself" not in said[0], said
    assert said == [gpus_unoffered("1/4 GPU", "t4", resource=GPU, waited=None)]
    assert spawner._stuck_words() is None and spawner._in_line()


async def test_a_full_pool_is_still_a_plain_wait(monkeypatch):
    spawner = await pending(monkeypatch, FULL_T4, age=OLD)
    (said,) = await progress_of(spawner, [failed_scheduling()])
    assert said == (
        f"Waiting for a free {T4}: 0 of 4 free; it starts by itself as soon as one frees (your "
        "place is kept for 30 minutes)."
    )
    assert spawner._stuck_words() is None and spawner._in_line()


@pytest.mark.parametrize("watch", ["none", "stale"])
async def test_unknown_counts_are_never_read_as_no_gpu(monkeypatch, watch):
    snapshot = None
    if watch == "stale":
        snapshot = dataclasses.replace(PLUGIN_GONE, stale=True, age_seconds=90.0)
    spawner = await pending(monkeypatch, snapshot, age=OLD)
    (said,) = await progress_of(spawner, [failed_scheduling()])
    assert said.startswith(f"Waiting for a free {T4}")
    assert "; it starts by itself as soon as one frees" in said
    assert spawner._stuck_words() is None and spawner._in_line()


@pytest.mark.parametrize("admission", ["refuse", "wait"])
async def test_start_timeout_ends_it_in_these_words(monkeypatch, admission):
    """Under "wait" too the pod holds no place in line past the grace: start_timeout, not
    queue_timeout (30 min), ends the spawn, saying why."""
    spawner = await pending(monkeypatch, NEVER_REGISTERED, age=OLD, admission=admission,
                            start_timeout=1)  # fmt: skip
    with pytest.raises(asyncio.TimeoutError) as caught:
        await asyncio.wait_for(spawner._start(), timeout=5)
    said = str(caught.value)
    assert "offers a GPU" in said, said
    assert said.startswith("ann did not start in 1 seconds"), said
    assert said.endswith(gpus_unoffered("1/4 GPU", "t4", resource=GPU, waited="1 minute"))
    assert len(WaitingSpawns.shared()) == 0


def test_no_node_of_the_pool_is_not_read_as_a_missing_plugin():
    """No ready node matches the pool (the scheduler says so itself: node affinity): not
    this case."""
    capacity = compute_capacity(CATALOG_LOADED, [], [pod("x", None, {})])
    assert not capacity.get("t4", "1/4").unpublished


# ------------------------------------------------- a pool with no node, or one on its way
def plain_wait(said: str) -> bool:
    return said.startswith(f"Waiting for a free {T4}") and "; it starts by itself" in said


def t4_node_ready(gpus: str | None, *, ready: bool = True, since: float | None = None) -> dict:
    """`t4_node(gpus)`, its Ready condition `ready`, turned so `since` seconds ago."""
    node = t4_node(gpus)
    condition = {"type": "Ready", "status": "True" if ready else "False"}
    if since is not None:
        condition["lastTransitionTime"] = stamp(since)
    node["status"]["conditions"] = [condition]
    return node


#: nodes the cluster has, none of them the T4 pool's: an autoscaled pool scaled to zero
NO_T4_NODE = compute_capacity(CATALOG_LOADED, [NODES[1]], [])
#: the autoscaler's new node has joined, not Ready yet, its GPUs not registered
T4_JOINING = compute_capacity(CATALOG_LOADED, [NODES[1], t4_node_ready(None, ready=False)], [])


# made when the test runs, not at import: a module imported at collection may run many minutes
# later under pytest-xdist, and "2 minutes ago" would have become 12 (past the node's grace)
def t4_ready_for(seconds: float) -> Any:
    """The T4 pool's one node Ready `seconds` ago, no GPU registered: 120, the GPU driver
    installs and the device plugin registers after that; 3600, the plugin is not running."""
    return compute_capacity(CATALOG_LOADED, [t4_node_ready(None, since=seconds)], [])


def test_the_counts_tell_a_pool_without_nodes_from_one_whose_nodes_offer_none():
    """A pool with no ready node counts 0 of 0, as one whose plugin is gone: only the second
    is `unoffered_since`, with the time its newest node became Ready."""
    for snapshot in (NO_T4_NODE, T4_JOINING):
        counts = snapshot.get("t4", "1/4")
        assert (counts.total, counts.unoffered_since) == (0, None), counts
    before = time.time()
    since = t4_ready_for(3600).get("t4", "1/4").unoffered_since
    assert before - 3600 - 1 <= since <= time.time() - 3600  # the stamp is in whole seconds
    assert PLUGIN_GONE.get("t4", "1/4").unoffered_since == 0.0  # no Ready time: long ago
    assert FULL_T4.get("t4", "1/4").unoffered_since is None


@pytest.mark.parametrize("snapshot", [NO_T4_NODE, T4_JOINING], ids=["no node", "not ready"])
async def test_a_pool_with_no_ready_node_keeps_the_plain_wait(monkeypatch, snapshot):
    """An autoscaled GPU pool at zero nodes (z2jh on GKE, EKS, AKS): the pending pod makes
    the cluster autoscaler add one. Before: after the grace "None of the nodes of t4 offers a
    GPU to Kubernetes now, ... This does not change by itself" and out of line."""
    spawner = await pending(monkeypatch, snapshot, age=OLD)
    (said,) = await progress_of(spawner, [failed_scheduling()])
    assert plain_wait(said), said
    assert spawner._stuck_words() is None and spawner._in_line()


async def test_a_node_ready_minutes_ago_still_registers_its_gpus(monkeypatch):
    """A node the autoscaler added minutes after the pod was made: its GPU driver and device
    plugin come up minutes after it is Ready, so the grace runs from the node, not the pod."""
    spawner = await pending(monkeypatch, t4_ready_for(120), age=OLD + 300)
    (said,) = await progress_of(spawner, [failed_scheduling()])
    assert said == gpus_unoffered("1/4 GPU", "t4", resource=GPU, waited=None), said
    assert spawner._stuck_words() is None and spawner._in_line()


async def test_a_node_ready_long_ago_without_gpus_says_so(monkeypatch):
    spawner = await pending(monkeypatch, t4_ready_for(3600), age=OLD)
    words = gpus_unoffered("1/4 GPU", "t4", resource=GPU, waited="1 minute")
    assert await progress_of(spawner, [failed_scheduling()]) == [words]
    assert not spawner._in_line()


async def test_a_ready_node_without_gpus_and_one_joining_is_a_wait(monkeypatch):
    """One node of the pool publishes no GPU, another is on its way: that may change."""
    joining = t4_node_ready("4", ready=False)
    joining["metadata"]["name"] = "t4-new"
    snapshot = compute_capacity(CATALOG_LOADED, [t4_node_ready(None, since=3600), joining], [])
    spawner = await pending(monkeypatch, snapshot, age=OLD)
    (said,) = await progress_of(spawner, [failed_scheduling()])
    assert plain_wait(said), said
    assert spawner._stuck_words() is None and spawner._in_line()


# ------------------------------------------- a MIG profile the layout lacks, a renamed resource
MIG_CATALOG = {
    "pools": {
        "a100": {
            "gpu": "A100-80GB",
            "backend": "mig-mixed",
            "node_selector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
            "offers": ["mig-1g.10gb", "mig-3g.40gb"],
        }
    },
    "images": CATALOG["images"],
    "access": CATALOG["access"],
}
#: the A100's MIG layout is all 1g.10gb: the device plugin runs and publishes 7 of those,
#: and no nvidia.com/mig-3g.40gb at all
ALL_1G = copy.deepcopy(NODES[1])
for _key in ("capacity", "allocatable"):
    ALL_1G["status"][_key] = {"cpu": "8", "memory": "32Gi", "nvidia.com/mig-1g.10gb": "7"}
MIG_ALL_1G = compute_capacity(load_catalog(MIG_CATALOG), [ALL_1G], [])
MIG_ADMIN = (
    "the GPUs' MIG layout has no 3g.40gb instance (nvidia.com/mig.config), or the device "
    "plugin is not running"
)


def test_the_words_for_a_mig_profile_the_layout_lacks():
    assert gpus_unoffered("MIG 3g.40gb", "A100", mig_profile="3g.40gb", waited="2 minutes") == (
        "None of the nodes of A100 offers a 3g.40gb MIG instance to Kubernetes now, so your "
        "MIG 3g.40gb cannot be reserved (your server has waited 2 minutes). This does not "
        f"change by itself: tell an administrator (for them: {MIG_ADMIN})."
    )
    assert gpus_unoffered("MIG 3g.40gb", "A100", mig_profile="3g.40gb", waited=None) == (
        "Waiting for your MIG 3g.40gb on A100: none of the pool's nodes offers a 3g.40gb MIG "
        "instance to Kubernetes yet (a node that has just started registers its GPUs within "
        "minutes)."
    )


async def test_a_mig_profile_the_layout_lacks_is_not_blamed_on_the_plugin(monkeypatch):
    """Before: "None of the nodes of a100 offers a GPU to Kubernetes now ... (for them: the
    GPU device plugin ... is not running or not registered with the kubelet)": false in both
    halves, as the nodes offer 1g.10gb instances and the plugin runs."""
    assert MIG_ALL_1G.get("a100", "mig-3g.40gb").unoffered_since is not None
    assert MIG_ALL_1G.get("a100", "mig-1g.10gb").free == 7
    hub = HubUsers({"FracSpawner": {"catalog": MIG_CATALOG, "admission": "wait"}})
    spawner = hub.spawner(hub.user("ann"))
    await begin_spawn(spawner, {"gpu": "mig-3g.40gb", "pool": "a100"})
    raw = unschedulable(INSUFFICIENT.replace("nvidia.com/gpu", "nvidia.com/mig-3g.40gb"), OLD)
    raw["metadata"]["name"] = spawner.pod_name
    reflector = types.SimpleNamespace(pods={f"{spawner.namespace}/{spawner.pod_name}": raw})
    monkeypatch.setattr(FracSpawner, "pod_reflector", property(lambda self: reflector))
    spawner._capacity_watcher = watching(MIG_ALL_1G)
    words = gpus_unoffered("MIG 3g.40gb", "a100", mig_profile="3g.40gb", waited="1 minute")
    assert spawner._stuck_words() == words
    assert "device plugin on the pool's nodes" not in words


def test_a_time_sliced_pool_names_the_resource_it_asks_for():
    """renameByDefault makes the plugin publish nvidia.com/gpu.shared: the pool must say so
    (rename_by_default), or none of its nodes publishes what its pods ask for."""
    said = gpus_unoffered("1/4 GPU", "T4", resource="nvidia.com/gpu", waited="2 minutes")
    assert said.endswith(
        "tell an administrator (for them: none of the pool's nodes has any nvidia.com/gpu "
        "allocatable: the GPU device plugin there is not running or not registered with the "
        "kubelet, or it publishes another name, as with renameByDefault, which the pool's "
        "rename_by_default must match)."
    ), said
