"""What a container gets from the DRA claims it references, as NVIDIA's DRA kubelet plugin
prepares them. Pure.

The plugin writes a CDI spec per claim; the container runtime applies it (kubernetes-sigs/
dra-driver-nvidia-gpu, cmd/gpu-kubelet-plugin/cdi.go, CreateClaimSpecFile: each allocated
device's edits from nvidia-container-toolkit's nvcdi GetDeviceSpecsByID(uuid), plus the common
edits). The GPUs come as device nodes; the environment says `NVIDIA_VISIBLE_DEVICES=void` (the
common edits set it so that the legacy nvidia-container-runtime does not act on the variable as
well: the NVIDIA driver's cdi.go, "Make sure that NVIDIA_VISIBLE_DEVICES is set to void").
Processes here have no device nodes, so `DEVCLUSTER_DRA_DEVICES` names the allocated devices'
UUIDs in their place (the retired Python kubelet's variable): a GPU's or static MIG device's
own `uuid` attribute from the node's ResourceSlice; a dynamic MIG device, made only when the
plugin prepares it, has none there and shows its parent GPU's (`parentUUID`).

A container gets only the claims in its own `resources.claims` (and of a claim, only the
results of the request it names, if it names one); a claim not allocated yet cannot be
prepared, so the container waits (the kubelet's PrepareDynamicResources fails until it is)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

DRIVER = "gpu.nvidia.com"
DEVICES_ENV = "DEVCLUSTER_DRA_DEVICES"


class ClaimNotReady(Exception):
    """A claim the container references cannot be prepared yet (not created, not allocated,
    or allocated a device this node does not publish)."""


def claim_names(pod: Mapping[str, Any]) -> dict[str, str | None]:
    """The pod's claim name -> its ResourceClaim's name (None: the resourceclaim controller
    has not made it from the template yet)."""
    spec = pod.get("spec") or {}
    made = {
        s["name"]: s.get("resourceClaimName")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
    }
    names: dict[str, str | None] = {}
    for claim in spec.get("resourceClaims") or []:
        names[claim["name"]] = claim.get("resourceClaimName") or made.get(claim["name"])
    return names


def container_claims(pod: Mapping[str, Any], container: str) -> list[tuple[str, str | None]]:
    """(ResourceClaim name, request or None) for each claim `container` references; a
    reference the pod does not declare, or whose claim is not made yet, raises ClaimNotReady."""
    spec = pod.get("spec") or {}
    found = [c for c in [*(spec.get("initContainers") or []), *spec.get("containers", [])]
             if c.get("name") == container]  # fmt: skip
    if not found:
        raise KeyError(f"pod has no container {container!r}")
    names = claim_names(pod)
    out = []
    for ref in (found[0].get("resources") or {}).get("claims") or []:
        if ref["name"] not in names:
            raise ClaimNotReady(f"container {container!r}: pod declares no claim {ref['name']!r}")
        claim = names[ref["name"]]
        if not claim:
            raise ClaimNotReady(f"claim {ref['name']!r}: its ResourceClaim is not created yet")
        out.append((claim, ref.get("request") or None))
    return out


def uuids_by_device(slices: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], str]:
    """(pool, device) -> the UUID the container sees, from the node's NVIDIA slices."""
    out = {}
    for piece in slices:
        spec = piece.get("spec") or {}
        if spec.get("driver") != DRIVER:
            continue
        pool = (spec.get("pool") or {}).get("name", "")
        for device in spec.get("devices") or []:
            attrs = device.get("attributes") or {}
            uuid = (attrs.get("uuid") or attrs.get("parentUUID") or {}).get("string")
            if uuid:
                out[(pool, device["name"])] = uuid
    return out


def _wanted(result_request: str, request: str | None) -> bool:
    # a firstAvailable subrequest is reported as "<request>/<subrequest>"
    return request is None or result_request == request or result_request.startswith(f"{request}/")


def device_env(
    refs: Iterable[tuple[str, str | None]],
    claims: Mapping[str, Mapping[str, Any] | None],
    slices: Iterable[Mapping[str, Any]],
) -> dict[str, str]:
    """The env the CDI edits of the referenced claims' NVIDIA devices give a container;
    `claims`: ResourceClaim name -> object (None: not found). {} without NVIDIA devices."""
    uuids = uuids_by_device(slices)
    seen: list[str] = []
    for name, request in refs:
        claim = claims.get(name)
        if claim is None:
            raise ClaimNotReady(f"resourceclaim {name!r} not found")
        allocation = (claim.get("status") or {}).get("allocation")
        if not allocation:
            raise ClaimNotReady(f"resourceclaim {name!r} is not allocated")
        for result in (allocation.get("devices") or {}).get("results") or []:
            if result.get("driver") != DRIVER or not _wanted(result.get("request", ""), request):
                continue
            key = (result.get("pool", ""), result.get("device", ""))
            if key not in uuids:
                raise ClaimNotReady(
                    f"resourceclaim {name!r}: device {key[1]!r} of pool {key[0]!r} is not "
                    "published by this node"
                )
            if uuids[key] not in seen:
                seen.append(uuids[key])
    if not seen:
        return {}
    return {"NVIDIA_VISIBLE_DEVICES": "void", DEVICES_ENV: ",".join(seen)}
