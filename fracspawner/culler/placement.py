"""Where a server's pod is, and which GPUs it may hold: from the pod, never from its report
(pure).

A server's report names GPUs by NVML UUID, but a report is the server's word: a hostile one may
name GPUs it is not on (every UUID it can guess or learn), to make the culler swap its
neighbours' idle kernels out. What binds a server to GPUs is its pod, as the API server has it
(the culler's pod watch, serverpods.py):

- its node (`spec.nodeName`): a report's UUIDs count only among servers on the same node;
- the devices its allocation names, where the allocation names them: HAMi's
  `hami.io/vgpu-devices-allocated` annotation (`GPU-<uuid>,NVIDIA,<MiB>,<cores>:` per device,
  `;` per container; Project-HAMi/HAMi pkg/device/nvidia, `SupportDevices`);
- on a DRA pool, the devices its ResourceClaims were allocated (draclaims.py, from the culler's
  claim and slice watches): the claims the pod names (`spec.resourceClaims`; a template's
  generated claim by `status.resourceClaimStatuses`, a DRA-backed extended resource's by
  `status.extendedResourceClaimStatus`, KEP-5004), each device by the UUIDs its ResourceSlice
  publishes;
- how many devices it may see: the `nvidia.com/gpu` limit of its containers (a time-sliced
  replica, a HAMi vGPU: one physical GPU each), or its claims' devices, at least one.

FracSpawner's own labels on the pod (backends/__init__.py `LABEL_POOL`, `ANNOTATION_MEMORY`) say
its pool and its slice's memory, and KubeSpawner's annotations its user and server
(`hub.jupyter.org/username`, `.../servername`: kubespawner/spawner.py
`_build_common_annotations`): what a server the hub has not listed yet (started since the
culler's last cycle) holds at most on its GPU, and whose it is (unlisted.py).

The NVIDIA device plugin writes no device ids into the pod (the kubelet's pod-resources API has
them, the API server does not), so on time-slicing the node and the count bind a report, and its
claim on all GPUs together is bounded by its slice (swapdesk.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..k8s.objects import created_at

HAMI_ALLOCATED = "hami.io/vgpu-devices-allocated"
# FracSpawner's pod label and annotation (backends/__init__.py, design.md's contract keys)
LABEL_POOL = "fracspawner.io/pool"
ANNOTATION_MEMORY = "fracspawner.io/gpu-memory-mib"
USERNAME, SERVERNAME = "hub.jupyter.org/username", "hub.jupyter.org/servername"  # KubeSpawner's
GPU_RESOURCES = ("nvidia.com/gpu",)


@dataclass(frozen=True)
class Placement:
    """A server pod's node and GPUs as the API server has them."""

    node: str | None
    gpus: int = 1  # devices it may see
    uuids: frozenset[str] | None = None  # those its allocation names; None: not named
    # its ResourceClaims (namespace/name), whose allocation names its devices on a DRA pool
    claims: tuple[str, ...] = ()
    # it names a claim whose generated name is not in its status yet
    claims_pending: bool = False
    pool: str | None = None  # FracSpawner's pool label; None: not a FracSpawner GPU pod
    memory_mib: float | None = None  # its slice's memory by FracSpawner's annotation
    owner: tuple[str, str] | None = None  # (user, server) by KubeSpawner's annotations
    # when the pod was made (unix seconds; its creationTimestamp): a pod waiting for a node
    # has waited since then (keep.py); None: not known
    created: float | None = None

    def with_claims(self, devices: tuple[frozenset[str], int] | None) -> Placement:
        """Bound by its claims' devices (draclaims.DraClaims.devices: their UUIDs and how many
        they are); unchanged while they are not known (the node and the count bind)."""
        if devices is None or self.claims_pending or not self.claims:
            return self
        uuids, count = devices
        return replace(self, uuids=uuids, gpus=max(1, count))


def hami_uuids(value: str) -> frozenset[str]:
    """The device UUIDs of a `hami.io/vgpu-devices-allocated` value."""
    out = set()
    for container in value.split(";"):
        for device in container.split(":"):
            uuid = device.split(",", 1)[0].strip()
            if uuid:
                out.add(uuid)
    return frozenset(out)


def _count(value: Any) -> int:
    try:
        return max(0, int(str(value)))
    except ValueError:
        return 0


def pod_claims(pod: Mapping[str, Any]) -> tuple[tuple[str, ...], bool]:
    """The ResourceClaims (namespace/name) a pod uses, and whether one of them is not named
    yet (a template's claim before the resourceclaim controller writes its name into the
    pod's status). An entry whose status names no claim needed none (types.go
    PodResourceClaimStatus)."""
    meta, spec, status = (pod.get(k) or {} for k in ("metadata", "spec", "status"))
    namespace = meta.get("namespace", "")
    generated = {
        s.get("name"): s.get("resourceClaimName")
        for s in status.get("resourceClaimStatuses") or ()
        if isinstance(s, Mapping)
    }
    names, pending = [], False
    for entry in spec.get("resourceClaims") or ():
        if not isinstance(entry, Mapping):
            continue
        if entry.get("resourceClaimName"):
            names.append(str(entry["resourceClaimName"]))
        elif entry.get("resourceClaimTemplateName"):
            if entry.get("name") not in generated:
                pending = True
            elif generated[entry.get("name")]:
                names.append(str(generated[entry.get("name")]))
    extended = (status.get("extendedResourceClaimStatus") or {}).get("resourceClaimName")
    if extended:
        names.append(str(extended))
    return tuple(f"{namespace}/{n}" for n in dict.fromkeys(names)), pending


def _mib(value: Any) -> float | None:
    try:
        mib = float(str(value))
    except ValueError:
        return None
    return mib if mib == mib and 0 < mib < float("inf") else None


def placement_of(pod: Mapping[str, Any]) -> Placement:
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    annotations = meta.get("annotations") or {}
    pool = (meta.get("labels") or {}).get(LABEL_POOL)
    user, server = annotations.get(USERNAME), annotations.get(SERVERNAME) or ""
    owner = (user, server) if isinstance(user, str) and user and isinstance(server, str) else None
    allocated = annotations.get(HAMI_ALLOCATED)
    uuids = hami_uuids(str(allocated)) if allocated else None
    count = 0
    for container in spec.get("containers") or []:
        limits = ((container or {}).get("resources") or {}).get("limits") or {}
        count += sum(_count(limits.get(r, 0)) for r in GPU_RESOURCES)
    gpus = max(1, count, len(uuids or ()))
    node = spec.get("nodeName")
    claims, pending = pod_claims(pod)
    return Placement(
        node if isinstance(node, str) and node else None, gpus, uuids or None, claims, pending,
        pool=pool if isinstance(pool, str) and pool else None,
        memory_mib=_mib(annotations.get(ANNOTATION_MEMORY)), owner=owner,
        created=created_at(pod),
    )  # fmt: skip
