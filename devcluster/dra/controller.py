"""The DRA parts of kube-controller-manager, kube-scheduler and the kubelet, for one DevCluster.

resourceclaim controller (kubernetes pkg/controller/resourceclaim/controller.go):

- handleClaim: for each `spec.resourceClaims` entry of a pod naming a
  `resourceClaimTemplateName`, a ResourceClaim is created from the template: `generateName`
  `<pod>-<claim>-` (both truncated proportionally when over 57 characters), the template's
  labels and annotations plus `resource.kubernetes.io/pod-claim-name: <claim>`, an
  ownerReference to the pod (`controller` and `blockOwnerDeletion` true), the template's
  spec; the claim's name goes into the pod's `status.resourceClaimStatuses`. It goes through
  admission, as the controller's create does. A missing template leaves the pod waiting and
  is retried when templates change.
- syncClaim: a pod that is done (Succeeded, Failed) or gone is taken out of its claims'
  `status.reservedFor`; a claim nobody reserves any more is deallocated (allocation and the
  `resource.kubernetes.io/delete-protection` finalizer removed); a claim made for a pod that is
  done or gone is deleted.

kube-scheduler's DynamicResources plugin (pkg/scheduler/framework/plugins/dynamicresources):

- PreEnqueue/PreFilter: a pod whose claims do not all exist yet waits, without an event;
  a claim made from a template for another pod ("not created for the pod") or being deleted
  stops it with that reason;
- Filter: an allocated claim restricts the pod to its `nodeSelector`'s node ("resourceclaim
  not available on the node"); the unallocated ones must all be allocated together on the
  node (allocator.py), else "cannot allocate all claims";
- PostFilter: "still not schedulable" before the preemption plugin's verdict;
- Reserve/PreBind: the allocation is written to `status.allocation` with the
  delete-protection finalizer, and the pod added to `status.reservedFor`, before binding.

kubelet: a container using a claim (`resources.claims`) gets what the driver's CDI spec gives
it, see `claim_env`.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..admission import RequestInfo
from ..scheduler import FilterError, quantity
from ..store import ApiError
from . import allocator, nvidia
from .kinds import DEVICECLASSES, RESOURCECLAIMS, RESOURCECLAIMTEMPLATES, RESOURCESLICES

if TYPE_CHECKING:
    from ..cluster import DevCluster

log = logging.getLogger("devcluster.dra")

POD_CLAIM_NAME = "resource.kubernetes.io/pod-claim-name"
FINALIZER = "resource.kubernetes.io/delete-protection"
CANNOT_ALLOCATE = "cannot allocate all claims"
#: the kubelet's stand-in for the GPU device nodes a claim's CDI devices mount
DEVICES_ENV = "DEVCLUSTER_DRA_DEVICES"
NOT_ON_NODE = "resourceclaim not available on the node"
POST_FILTER = "still not schedulable"  # DynamicResources.PostFilter with nothing to deallocate
#: the resourceclaim controller's identity, as the apiserver's admission sees it
CONTROLLER_USER = {
    "username": "system:serviceaccount:kube-system:resource-claim-controller",
    "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system",
               "system:authenticated"],
}  # fmt: skip


def generate_name(pod: str, claim: str) -> str:
    """controller.go handleClaim's generateName."""
    base = f"{pod}-{claim}-"
    limit = 57  # room for the 5 random characters in 63
    if len(base) <= limit:
        return base
    return pod[: len(pod) * limit // len(base)] + "-" + claim[: len(claim) * limit // len(base)]


def pod_done(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def claim_names(pod: Mapping[str, Any]) -> dict[str, str | None]:
    """Pod claim name -> the ResourceClaim's name (None: not created yet)."""
    statuses = {
        s.get("name"): s.get("resourceClaimName")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
    }
    out: dict[str, str | None] = {}
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        if entry.get("resourceClaimName"):
            out[entry["name"]] = entry["resourceClaimName"]
        else:
            out[entry["name"]] = statuses.get(entry["name"])
    return out


def _owned_by(claim: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    return any(
        ref.get("controller") and ref.get("uid") == pod["metadata"]["uid"]
        for ref in claim["metadata"].get("ownerReferences") or []
    )


class Dra:
    """The DRA behaviour of one DevCluster (hooks called by cluster.py)."""

    def __init__(self, cluster: DevCluster) -> None:
        self.cluster = cluster
        self.store = cluster.store
        for name, spec in (cluster.topology.get("dra") or {}).items():
            nvidia.node_slice(name, spec)  # a bad `dra:` section fails at load, in words
        self._creating: set[tuple[str, str, str]] = set()  # (ns, pod uid, claim) in flight
        self._backoff: dict[str, float] = {}  # pod uid -> seconds before its next try
        self._retrying: set[str] = set()  # pod uids with a try scheduled

    # ------------------------------------------------------------ set-up
    def load_topology(self, topology: Mapping[str, Any]) -> None:
        """The slices each `dra:` node publishes, and (if any) the driver's DeviceClasses."""
        specs = topology.get("dra") or {}
        for name, spec in specs.items():
            self.publish(name, spec)

    def publish(self, node: str, spec: Mapping[str, Any]) -> None:
        """The kubelet plugin starting on a node: the chart's DeviceClasses (once), then the
        node's ResourceSlice."""
        for klass in nvidia.device_classes():
            if ("", klass["metadata"]["name"]) not in self.store.objects[DEVICECLASSES]:
                self.cluster.create(DEVICECLASSES, None, klass)
        published = nvidia.node_slice(node, spec)
        owner = self.store.objects["nodes"].get(("", node))
        if owner is not None:
            # the plugin's slices are owned by their Node (k8s.io/dynamic-resource-allocation
            # resourceslice controller): the garbage collector removes them with it
            published["metadata"]["ownerReferences"] = [
                {"apiVersion": "v1", "kind": "Node", "name": node,
                 "uid": owner.obj["metadata"]["uid"], "controller": True}
            ]  # fmt: skip
        self.cluster.create(RESOURCESLICES, None, published)

    # ------------------------------------------------------------ controller
    def on_change(self, plural: str, kind: str, obj: dict[str, Any]) -> None:
        if plural == "nodes" and kind == "DELETED":
            self._later(self._node_gone, obj)
        if plural == "pods":
            if not (obj.get("spec") or {}).get("resourceClaims"):
                return
            if kind == "DELETED" or pod_done(obj):
                self._later(self._release, obj)
            else:
                self._later(self._ensure_claims, obj)
        elif plural == RESOURCECLAIMTEMPLATES and kind != "DELETED":
            for entry in list(self.store.entries("pods", obj["metadata"]["namespace"])):
                if entry.obj["spec"].get("resourceClaims") and not pod_done(entry.obj):
                    self._later(self._ensure_claims, entry.obj)
        if (
            plural == RESOURCECLAIMS
            and kind != "DELETED"
            and obj["metadata"].get("deletionTimestamp")
        ):
            self._later(self._finish_deletion, obj)
        if plural in (RESOURCECLAIMS, RESOURCESLICES, DEVICECLASSES):
            self.cluster._reschedule.set()

    async def _node_gone(self, node: dict[str, Any]) -> None:
        """A deleted node's slices go (their owner is gone: what the garbage collector does
        with the ownerReference; done here too, whichever comes first)."""
        name = node["metadata"]["name"]
        for entry in list(self.store.entries(RESOURCESLICES, None)):
            if (entry.obj.get("spec") or {}).get("nodeName") == name:
                try:
                    self.store.remove(RESOURCESLICES, None, entry.obj["metadata"]["name"])
                except ApiError:
                    pass

    def _later(self, fn: Any, obj: dict[str, Any]) -> None:
        """Outside the store's notification (the controller works from its informers)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        loop.call_soon(lambda: self.cluster._spawn(fn(copy.deepcopy(obj))))

    async def _ensure_claims(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        for entry in pod["spec"].get("resourceClaims") or []:
            template_name = entry.get("resourceClaimTemplateName")
            if not template_name:
                continue
            current = self.cluster._current(namespace, name)
            if current is None or current["metadata"]["uid"] != meta["uid"]:
                return
            if claim_names(current).get(entry["name"]):
                continue
            key = (namespace, meta["uid"], entry["name"])
            if key in self._creating:
                continue
            self._creating.add(key)
            try:
                claim = self._find_claim(current, entry["name"])
                if claim is None:
                    claim = await self._create_claim(current, entry["name"], template_name)
                if claim is None:
                    self._retry(current)
                    continue
                current = self.cluster._current(namespace, name)
                if current is None or current["metadata"]["uid"] != meta["uid"]:
                    return
                statuses = [
                    s
                    for s in current["status"].get("resourceClaimStatuses") or []
                    if s.get("name") != entry["name"]
                ]
                statuses.append(
                    {"name": entry["name"], "resourceClaimName": claim["metadata"]["name"]}
                )
                current["status"]["resourceClaimStatuses"] = statuses
                self.store.update("pods", current)
                self.cluster._reschedule.set()
            finally:
                self._creating.discard(key)

    def _retry(self, pod: dict[str, Any]) -> None:
        """Try the pod again later, as the controller's rate-limited work queue does (5 ms
        doubling to 1000 s there; 0.5 s doubling to 30 s here): an admission webhook that was
        down, a template created after the pod (also retried at once on its creation)."""
        uid = pod["metadata"]["uid"]
        if uid in self._retrying:
            return
        self._retrying.add(uid)
        delay = min(30.0, self._backoff.get(uid, 0.25) * 2)
        self._backoff[uid] = delay

        async def later() -> None:
            await asyncio.sleep(delay)
            self._retrying.discard(uid)
            current = self.cluster._current(pod["metadata"]["namespace"], pod["metadata"]["name"])
            if current is not None and current["metadata"]["uid"] == uid and not pod_done(current):
                await self._ensure_claims(current)
            else:
                self._backoff.pop(uid, None)

        self.cluster._spawn(later())

    def _find_claim(self, pod: Mapping[str, Any], claim_name: str) -> dict[str, Any] | None:
        """A claim made for this pod entry before (findPodResourceClaim)."""
        for entry in self.store.entries(RESOURCECLAIMS, pod["metadata"]["namespace"]):
            claim = entry.obj
            annotations = claim["metadata"].get("annotations") or {}
            if _owned_by(claim, pod) and annotations.get(POD_CLAIM_NAME) == claim_name:
                return claim
        return None

    async def _create_claim(
        self, pod: Mapping[str, Any], claim_name: str, template_name: str
    ) -> dict[str, Any] | None:
        meta = pod["metadata"]
        try:
            template = self.store.get(RESOURCECLAIMTEMPLATES, meta["namespace"], template_name)
        except ApiError:
            log.info("pod %s/%s: resource claim template %r: not found", meta["namespace"],
                     meta["name"], template_name)  # fmt: skip
            return None
        template_meta = (template.get("spec") or {}).get("metadata") or {}
        annotations = dict(template_meta.get("annotations") or {})
        annotations[POD_CLAIM_NAME] = claim_name
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {
                "generateName": generate_name(meta["name"], claim_name),
                "namespace": meta["namespace"],
                "annotations": annotations,
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": copy.deepcopy(template["spec"].get("spec") or {}),
        }
        if template_meta.get("labels"):
            body["metadata"]["labels"] = dict(template_meta["labels"])
        try:
            return await self.cluster.api_create(
                RESOURCECLAIMS, "v1", meta["namespace"], body,
                RequestInfo(user=copy.deepcopy(CONTROLLER_USER)),
            )  # fmt: skip
        except ApiError as exc:
            log.warning("pod %s/%s: creating its claim %r failed: %s", meta["namespace"],
                        meta["name"], claim_name, exc.message)  # fmt: skip
            return None

    async def _release(self, pod: dict[str, Any]) -> None:
        """Done or gone: out of reservedFor, deallocated when unused, deleted if made for it."""
        namespace = pod["metadata"]["namespace"]
        uid = pod["metadata"]["uid"]
        for claim_name in claim_names(pod).values():
            if not claim_name:
                continue
            try:
                claim = copy.deepcopy(self.store.get(RESOURCECLAIMS, namespace, claim_name))
            except ApiError:
                continue
            status = claim.setdefault("status", {})
            reserved = [c for c in status.get("reservedFor") or [] if c.get("uid") != uid]
            changed = reserved != (status.get("reservedFor") or [])
            if reserved:
                status["reservedFor"] = reserved
            else:
                status.pop("reservedFor", None)
                if status.get("allocation"):
                    status.pop("allocation")
                    changed = True
                finalizers = [
                    f for f in claim["metadata"].get("finalizers") or [] if f != FINALIZER
                ]
                if finalizers != (claim["metadata"].get("finalizers") or []):
                    claim["metadata"]["finalizers"] = finalizers
                    changed = True
            if changed:
                self.store.update(RESOURCECLAIMS, claim)
            if _owned_by(claim, pod) and not reserved:
                try:
                    self.store.remove(RESOURCECLAIMS, namespace, claim_name)
                except ApiError:
                    pass
        self.cluster._reschedule.set()

    async def _finish_deletion(self, claim: dict[str, Any]) -> None:
        """A claim being deleted (a DELETE found finalizers): once nobody reserves it, the
        controller deallocates it and removes its delete-protection finalizer."""
        meta = claim["metadata"]
        entry = self.store.objects[RESOURCECLAIMS].get((meta["namespace"], meta["name"]))
        if entry is None or entry.obj["metadata"]["uid"] != meta["uid"]:
            return
        current = copy.deepcopy(entry.obj)
        status = current.get("status") or {}
        if status.get("reservedFor"):
            return  # in use: deallocated when its last pod ends
        finalizers = [f for f in current["metadata"].get("finalizers") or [] if f != FINALIZER]
        if finalizers:
            if finalizers != current["metadata"].get("finalizers"):
                current["metadata"]["finalizers"] = finalizers
                current.get("status", {}).pop("allocation", None)
                self.store.update(RESOURCECLAIMS, current)
            return  # someone else's finalizer
        try:  # no finalizer left: gone (the registry removes it; done here if not yet)
            self.store.remove(RESOURCECLAIMS, meta["namespace"], meta["name"])
        except ApiError:
            pass

    # ------------------------------------------------------------ scheduler
    def prefilter(self, pod: Mapping[str, Any]) -> tuple[list[dict[str, Any]] | None, str]:
        """The pod's claims, or (None, "") to wait silently, or (None, reason)."""
        namespace = pod["metadata"]["namespace"]
        claims = []
        for pod_claim, claim_name in claim_names(pod).items():
            if not claim_name:
                return None, ""  # the controller has not made it yet
            entry = self.store.objects[RESOURCECLAIMS].get((namespace, claim_name))
            if entry is None:
                return None, ""
            claim = entry.obj
            template = any(
                c.get("name") == pod_claim and c.get("resourceClaimTemplateName")
                for c in pod["spec"].get("resourceClaims") or []
            )
            if template and not _owned_by(claim, pod):
                pod_name = f"{namespace}/{pod['metadata']['name']}"
                return None, (
                    f"ResourceClaim {namespace}/{claim_name} was not created for pod "
                    f"{pod_name} (pod is not owner)"
                )
            if claim["metadata"].get("deletionTimestamp"):
                return None, f'resourceclaim "{claim_name}" is being deleted'
            claims.append(claim)
        return claims, ""

    def filter_for(self, pod: Mapping[str, Any], claims: list[dict[str, Any]]) -> Any:
        """A per-node Filter for one scheduling attempt; remembers what it allocated."""
        # slices by node and allocated results by pool, once per attempt: a node looks only
        # at its own (a 1,000-node cluster with 20,000 claims stays cheap)
        by_node: dict[str, list[dict[str, Any]]] = {}
        everywhere: list[dict[str, Any]] = []
        for entry in self.store.entries(RESOURCESLICES, None):
            spec = entry.obj.get("spec") or {}
            if spec.get("allNodes"):
                everywhere.append(entry.obj)
            elif spec.get("nodeName"):
                by_node.setdefault(spec["nodeName"], []).append(entry.obj)
        classes = {
            e.obj["metadata"]["name"]: e.obj for e in self.store.entries(DEVICECLASSES, None)
        }
        mine = {id(c) for c in claims}
        results: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for entry in self.store.entries(RESOURCECLAIMS, None):
            if id(entry.obj) in mine:
                continue
            allocation = (entry.obj.get("status") or {}).get("allocation") or {}
            for result in (allocation.get("devices") or {}).get("results") or []:
                pool = (result.get("driver", ""), result.get("pool", ""))
                results.setdefault(pool, []).append(result)
        pending = [c for c in claims if not (c.get("status") or {}).get("allocation")]
        found: dict[str, list[dict[str, Any]]] = {}

        def check(pod: Mapping[str, Any], node: Mapping[str, Any]) -> str | None:
            name = node["metadata"]["name"]
            for claim in claims:
                allocation = (claim.get("status") or {}).get("allocation")
                if allocation and not _selects(allocation.get("nodeSelector"), node):
                    return NOT_ON_NODE
            if not pending:
                return None
            devices = allocator.node_devices(by_node.get(name, []) + everywhere, name)
            by_key = {d.key: d for d in devices}
            pools = {(d.driver, d.pool) for d in devices}
            held = [
                {"status": {"allocation": {"devices": {"results": results[pool]}}}}
                for pool in pools
                if pool in results
            ]
            used = allocator.in_use(held, by_key)
            try:
                result = allocator.Allocator(devices, classes, used).allocate(pending, name)
            except allocator.AllocationError as exc:
                # a Filter error ends the attempt (framework RunFilterPlugins' wording)
                raise FilterError(f'running "DynamicResources" filter plugin: {exc}') from None
            if result is None:
                return CANNOT_ALLOCATE
            found[name] = result
            return None

        check.found = found  # type: ignore[attr-defined]
        check.pending = pending  # type: ignore[attr-defined]
        return check

    def reserve(
        self, pod: Mapping[str, Any], node: str, claims: list[dict[str, Any]], check: Any
    ) -> None:
        """Write the allocations and reservations before the pod is bound."""
        allocations = dict(
            zip((id(c) for c in check.pending), check.found.get(node) or [], strict=False)
        )
        consumer = {
            "resource": "pods",
            "name": pod["metadata"]["name"],
            "uid": pod["metadata"]["uid"],
        }
        for claim in claims:
            updated = copy.deepcopy(claim)
            status = updated.setdefault("status", {})
            if id(claim) in allocations:
                status["allocation"] = allocations[id(claim)]
                finalizers = updated["metadata"].setdefault("finalizers", [])
                if FINALIZER not in finalizers:
                    finalizers.append(FINALIZER)
            reserved = status.setdefault("reservedFor", [])
            if all(c.get("uid") != consumer["uid"] for c in reserved):
                reserved.append(consumer)
            self.store.update(RESOURCECLAIMS, updated)

    # ------------------------------------------------------------ kubelet
    def claim_env(self, pod: Mapping[str, Any], container: Mapping[str, Any]) -> dict[str, str]:
        """What the driver's CDI devices put in a container using a claim.

        The kubelet plugin writes a CDI spec per claim (cmd/gpu-kubelet-plugin/cdi.go,
        CreateClaimSpecFile) from nvidia-container-toolkit's nvcdi, whose common container
        edits set `NVIDIA_VISIBLE_DEVICES=void` (so the legacy runtime hook does nothing) and
        inject the device nodes of the allocated GPUs (/dev/nvidiaN): the container sees those
        GPUs through the device nodes, while the variable says `void` (as observed on a cluster
        running the driver: "NVIDIA_VISIBLE_DEVICES=void is normal with CDI mode"). Processes
        here have no device nodes, so `DEVCLUSTER_DRA_DEVICES` lists the allocated devices'
        UUIDs (a MIG device's, or for a dynamic MIG device not made yet its parent GPU's) in
        their place, for a fake NVML to show."""
        names = claim_names(pod)
        namespace = pod["metadata"]["namespace"]
        uuids: list[str] = []
        first_device: Mapping[str, Any] | None = None
        for ref in (container.get("resources") or {}).get("claims") or []:
            claim_name = names.get(ref.get("name"))
            entry = self.store.objects[RESOURCECLAIMS].get((namespace, claim_name or ""))
            if entry is None:
                continue
            allocation = (entry.obj.get("status") or {}).get("allocation") or {}
            for result in (allocation.get("devices") or {}).get("results") or []:
                wanted = ref.get("request")
                if (
                    wanted
                    and result["request"] != wanted
                    and not result["request"].startswith(f"{wanted}/")
                ):
                    continue
                uuid, device = self._device(result)
                if first_device is None:
                    first_device = device
                if uuid and uuid not in uuids:
                    uuids.append(uuid)
        if not uuids:
            return {}
        env = {"NVIDIA_VISIBLE_DEVICES": "void", DEVICES_ENV: ",".join(uuids)}
        env.update(self._simulated(first_device))
        return env

    def _simulated(self, device: Mapping[str, Any] | None) -> dict[str, str]:
        """`make demo`'s simulated GPU (kubelet.simulated_gpu_env) for a pod whose GPU comes
        from a claim: the device as NVML would show it inside the container, the whole GPU's
        memory (a memory share is not enforced: the container sees all of it) or the MIG
        device's."""
        from ..kubelet import SIMULATE_GPU

        if device is None or os.environ.get(SIMULATE_GPU) != "1":
            return {}
        if "FRACSPAWNER_GPU_SOURCE" in os.environ:
            return {}
        attributes = device.get("attributes") or {}
        product = (attributes.get("productName") or {}).get("string", "GPU")
        memory = (device.get("capacity") or {}).get("memory", {}).get("value", "0")
        spec: dict[str, Any] = {
            "name": f"{product} (simulated)",
            "kernel_memory_mib": 1536,
            "memory_total_mib": int(quantity(memory) // (1024 * 1024)),
        }
        profile = (attributes.get("profile") or {}).get("string")
        if profile:
            spec["mig"] = True
            spec["name"] = f"{product} MIG {profile} (simulated)"
        return {"FRACSPAWNER_GPU_SOURCE": "simulated-demo",
                "FRACSPAWNER_SIMULATED_GPU": json.dumps(spec)}  # fmt: skip

    def _device(self, result: Mapping[str, Any]) -> tuple[str | None, Mapping[str, Any] | None]:
        """An allocation result's device in its slice, and the UUID the container sees (a
        dynamic MIG device has none until the plugin makes it: its parent GPU's)."""
        for entry in self.store.entries(RESOURCESLICES, None):
            spec = entry.obj["spec"]
            if spec.get("driver") != result.get("driver"):
                continue
            if (spec.get("pool") or {}).get("name") != result.get("pool"):
                continue
            for device in spec.get("devices") or []:
                if device["name"] == result.get("device"):
                    attributes = device.get("attributes") or {}
                    value = attributes.get("uuid") or attributes.get("parentUUID") or {}
                    return value.get("string"), device
        return None, None


def _selects(selector: Mapping[str, Any] | None, node: Mapping[str, Any]) -> bool:
    """A claim allocation's nodeSelector (matchFields metadata.name, matchExpressions)."""
    if not selector:
        return True
    from ..scheduler import _term_matches

    name = node["metadata"]["name"]
    labels = node["metadata"].get("labels") or {}
    for term in selector.get("nodeSelectorTerms") or []:
        ok = _term_matches(term, labels)
        for field in term.get("matchFields") or []:
            if field.get("key") == "metadata.name":
                inside = name in (field.get("values") or [])
                ok = ok and (inside if field.get("operator") == "In" else not inside)
        if ok:
            return True
    return False
