"""HAMi's scheduler, as the stand-in plays it: per-device fit from the node's registration.

On a HAMi cluster kube-scheduler ignores HAMi's resources (its KubeSchedulerConfiguration marks
`nvidia.com/gpu`, `gpumem`, `gpumem-percentage` and `gpucores` `ignoredByScheduler`, charts/hami/
templates/scheduler/configmapnew.yaml) and HAMi's extender fits each container onto single
devices of the node: task slots, memory (`devmem * percentage / 100` for a percentage,
computeMemreq in pkg/device/nvidia/fit_checks.go), cores. It writes what it chose onto the pod
(`hami.io/vgpu-devices-allocated`, `hami.io/vgpu-node`) before binding, and later fits are
charged with those annotations. So does this module, on every node that carries HAMi's
registration annotation. The arithmetic is `fracspawner.backends.hami_devices` (HAMi's formats
and Fit, checked against HAMi's source there); the booking and the annotations are here.

A devcluster has no HAMi webhook to set `schedulerName: hami-scheduler`, so the rule applies to
any pod asking for HAMi's resources on such a node.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from decimal import Decimal
from typing import Any

from fracspawner.backends import hami_devices as hd

MANAGED = (hd.RESOURCE_COUNT, hd.RESOURCE_MEM, hd.RESOURCE_MEM_PERCENT, hd.RESOURCE_CORES)
#: usage keys holding one device's booking: hami.io/device/<id>/<used|usedmem|usedcores>
_KEY = "hami.io/device/{}/{}"
_FIELDS = ("used", "usedmem", "usedcores")


def node_devices(node: Mapping[str, Any]) -> list[hd.HamiDevice] | None:
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    return hd.parse_node_devices(annotations.get(hd.REGISTER_ANNOTATION))


def container_requests(pod: Mapping[str, Any]) -> list[hd.HamiRequest]:
    """HAMi's reading of each container's limits (a request for extended resources equals
    its limit); containers asking nothing of HAMi are left out."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    out = []
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        amounts = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
        if not any(name in amounts for name in MANAGED):
            continue
        if hd.RESOURCE_COUNT not in amounts:
            amounts[hd.RESOURCE_COUNT] = "1"  # gpumem/gpucores alone imply one vGPU
        req = hd.request_from_resources(amounts, annotations)
        if req is not None:
            out.append(req)
    return out


def book_allocations(pod: Mapping[str, Any], node_use: MutableMapping[str, Decimal]) -> None:
    """Charge a bound pod's `hami.io/vgpu-devices-allocated` to its node's usage."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    for device_id, mem, cores in (
        hd.parse_pod_devices(annotations.get(hd.ALLOCATED_ANNOTATION)) or []
    ):
        _add(node_use, device_id, 1, mem, cores)


def _add(node_use: MutableMapping[str, Decimal], device_id: str, *amounts: int) -> None:
    for field, amount in zip(_FIELDS, amounts, strict=True):
        key = _KEY.format(device_id, field)
        node_use[key] = node_use.get(key, Decimal(0)) + amount


def _use(node_use: Mapping[str, Decimal], device_id: str) -> hd.DeviceUse:
    values = [int(node_use.get(_KEY.format(device_id, f), 0)) for f in _FIELDS]
    return hd.DeviceUse(*values)


def allocate(
    pod: Mapping[str, Any], node: Mapping[str, Any], node_use: Mapping[str, Decimal]
) -> tuple[list[list[tuple[str, int, int]]] | None, str]:
    """Devices for every container of `pod` on `node` (HAMi's Fit, scanning from the last
    device), or (None, reason) when they do not fit."""
    devices = node_devices(node) or []
    taken: dict[str, hd.DeviceUse] = {}
    allocation = []
    for req in container_requests(pod):
        chosen: list[tuple[str, int, int]] = []
        for dev in reversed(devices):
            if len(chosen) == req.nums:
                break
            if any(c[0] == dev.id for c in chosen):
                continue
            use = taken.setdefault(dev.id, _use(node_use, dev.id))
            if hd.device_fits(dev, use, req) <= 0:
                continue
            memreq = hd.memory_request(req, dev)
            use.used, use.usedmem, use.usedcores = (
                use.used + 1,
                use.usedmem + memreq,
                use.usedcores + req.cores,
            )
            chosen.append((dev.id, memreq, req.cores))
        if len(chosen) < req.nums:
            return None, "Insufficient nvidia.com/gpu (HAMi: no device with room)"
        allocation.append(chosen)
    return allocation, ""


def encode(allocation: list[list[tuple[str, int, int]]]) -> str:
    """HAMi's pod annotation format (EncodePodSingleDevice): `uuid,type,usedmem,usedcores:`
    per device, containers joined by ';'."""
    return (
        ";".join(
            "".join(f"{device},NVIDIA,{mem},{cores}:" for device, mem, cores in container)
            for container in allocation
        )
        + ";"
    )


def assign(
    pod: MutableMapping[str, Any],
    node_name: str,
    allocation: list[list[tuple[str, int, int]]],
    node_use: MutableMapping[str, Decimal],
) -> None:
    """Write the allocation onto the pod (as HAMi's scheduler patches it before binding) and
    book it, so the next pod of the same scheduling pass sees it."""
    annotations = pod.setdefault("metadata", {}).setdefault("annotations", {})
    annotations[hd.ALLOCATED_ANNOTATION] = encode(allocation)
    annotations[hd.ASSIGNED_NODE_ANNOTATION] = node_name
    for container in allocation:
        for device_id, mem, cores in container:
            _add(node_use, device_id, 1, mem, cores)
