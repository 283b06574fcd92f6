"""HAMi's own bookkeeping, read back: per-device registration and per-pod allocations.

HamiBackend.count uses it.

HAMi's scheduler does not count `nvidia.com/gpumem` against node allocatable; it fits each
request onto single devices, using two annotations (Project-HAMi/HAMi):

- node `hami.io/node-nvidia-register`: the devices the device plugin registered. Current
  releases write JSON (`MarshalNodeDevices` in pkg/device/devices.go: a list of
  `{"id", "index", "count", "devmem", "devcore", "type", "numa", "mode", "health"}`);
  older ones wrote `uuid,count,devmem,devcore,type,numa,health[,index,mode]:` per device
  (`EncodeNodeDevices`/`DecodeNodeDevices` in pkg/util/util.go). Both are accepted.
- pod `hami.io/vgpu-devices-allocated` (`SupportDevices["NVIDIA"]` in
  pkg/device/nvidia/device.go): containers joined by `;`, devices by `:`, each device
  `uuid,type,usedmem,usedcores` (`EncodePodSingleDevice`).

`device_fits` mirrors the checks of `NvidiaGPUDevices.Fit` in pkg/device/nvidia/device.go:
task slots (count), free memory, free cores, exclusive use at 100 cores, no zero-core task on
a device whose cores are all taken, and the `nvidia.com/use-gputype`/`nouse-gputype` filters.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..k8s.objects import quantity_int
from .fit import tasks_on_node

REGISTER_ANNOTATION = "hami.io/node-nvidia-register"
ALLOCATED_ANNOTATION = "hami.io/vgpu-devices-allocated"
#: set by HAMi's scheduler on the pod before binding (pkg/util/types.go AssignedNodeAnnotations)
ASSIGNED_NODE_ANNOTATION = "hami.io/vgpu-node"
# HAMi's default resource names (charts/hami/values.yaml resourceName, resourceMem, ...)
RESOURCE_COUNT = "nvidia.com/gpu"
RESOURCE_MEM = "nvidia.com/gpumem"
RESOURCE_MEM_PERCENT = "nvidia.com/gpumem-percentage"
RESOURCE_CORES = "nvidia.com/gpucores"
GPU_IN_USE = "nvidia.com/use-gputype"
GPU_NO_USE = "nvidia.com/nouse-gputype"
_NO_PERCENT = 101  # HAMi's marker for "no gpumem-percentage given"


@dataclass(frozen=True)
class HamiDevice:
    id: str
    count: int  # task slots (deviceSplitCount)
    devmem: int  # MiB
    devcore: int  # percent of SMs, normally 100
    type: str
    health: bool


@dataclass
class DeviceUse:
    used: int = 0
    usedmem: int = 0
    usedcores: int = 0


@dataclass(frozen=True)
class HamiRequest:
    nums: int
    mem: int = 0
    mem_percent: int = _NO_PERCENT
    cores: int = 0
    use_types: tuple[str, ...] = ()
    nouse_types: tuple[str, ...] = ()


@dataclass
class NodeDevices:
    """One node's devices and what is allocated on them."""

    devices: list[HamiDevice]
    use: dict[str, DeviceUse] = field(default_factory=dict)
    estimated: bool = False  # some pods were placed by our guess, not by HAMi's annotation

    def usage(self, device_id: str) -> DeviceUse:
        return self.use.setdefault(device_id, DeviceUse())


def _bool(value: Any) -> bool:
    return value is True or str(value).lower() == "true"


def parse_node_devices(text: str | None) -> list[HamiDevice] | None:
    """The registration annotation's devices; None when absent or unreadable."""
    if not text or not text.strip():
        return None
    text = text.strip()
    devices: list[HamiDevice] = []
    try:
        if text.startswith("["):
            for item in json.loads(text):
                devices.append(
                    HamiDevice(
                        id=str(item["id"]),
                        count=int(item.get("count", 0)),
                        devmem=int(item.get("devmem", 0)),
                        devcore=int(item.get("devcore", 0)),
                        type=str(item.get("type", "")),
                        health=_bool(item.get("health", False)),
                    )
                )
        else:
            for entry in text.split(":"):
                if "," not in entry:
                    continue
                parts = entry.split(",")
                if len(parts) not in (7, 9):
                    return None
                devices.append(
                    HamiDevice(
                        id=parts[0],
                        count=int(parts[1]),
                        devmem=int(parts[2]),
                        devcore=int(parts[3]),
                        type=parts[4],
                        health=_bool(parts[6]),
                    )
                )
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    return devices or None


def parse_pod_devices(text: str | None) -> list[tuple[str, int, int]] | None:
    """(device id, MiB, cores) for each device a pod was given; None when unreadable."""
    if not text:
        return None
    out: list[tuple[str, int, int]] = []
    try:
        for container in text.split(";"):
            for entry in container.split(":"):
                if "," not in entry:
                    continue
                parts = entry.split(",")
                if len(parts) < 4:
                    return None
                # MIG-mode entries carry a "[template-index]" suffix on the uuid
                out.append((parts[0].split("[", 1)[0], int(parts[2]), int(parts[3])))
    except ValueError:
        return None
    return out


def request_from_resources(
    amounts: Mapping[str, Any], annotations: Mapping[str, str] | None = None
) -> HamiRequest | None:
    """HAMi's reading of a container's limits (`GenerateResourceRequests`); None: no GPU.

    Memory given neither in MiB nor percent means the whole device (percent 100), and a
    device count without cores means exclusive use (`defaultExclusiveCoreIfNeeded`).
    """
    nums = quantity_int(amounts.get(RESOURCE_COUNT, 0)) or 0
    if nums <= 0:
        return None
    mem = quantity_int(amounts.get(RESOURCE_MEM, 0)) or 0
    percent = _NO_PERCENT
    if RESOURCE_MEM_PERCENT in amounts:
        percent = quantity_int(amounts[RESOURCE_MEM_PERCENT]) or 0
        exclusive = percent == 100
    else:
        exclusive = mem == 0
    if percent == _NO_PERCENT and mem == 0:
        percent = 100
    if RESOURCE_CORES in amounts:
        cores = quantity_int(amounts[RESOURCE_CORES]) or 0
    else:
        cores = 100 if exclusive else 0
    annotations = annotations or {}
    return HamiRequest(
        nums=nums,
        mem=mem,
        mem_percent=percent,
        cores=min(cores, 100),
        use_types=_types(annotations.get(GPU_IN_USE)),
        nouse_types=_types(annotations.get(GPU_NO_USE)),
    )


def _types(value: str | None) -> tuple[str, ...]:
    return tuple(t.strip().upper() for t in value.split(",") if t.strip()) if value else ()


def _type_allowed(req: HamiRequest, device_type: str) -> bool:
    if not req.use_types and not req.nouse_types:
        return True
    kind = device_type.upper()
    if req.use_types and not any(t in kind for t in req.use_types):
        return False
    return not any(t in kind for t in req.nouse_types)


def memory_request(req: HamiRequest, dev: HamiDevice) -> int:
    """MiB a request takes on `dev`: its gpumem, else its percentage of the device's registered
    memory (computeMemreq in pkg/device/nvidia/fit_checks.go: Totalmem * percent / 100)."""
    if req.mem > 0:
        return req.mem
    if req.mem_percent != _NO_PERCENT:
        return dev.devmem * req.mem_percent // 100
    return 0


def device_fits(dev: HamiDevice, use: DeviceUse, req: HamiRequest) -> int:
    """How many more single-device tasks of `req` this device takes."""
    if not dev.health or not _type_allowed(req, dev.type):
        return 0
    limits = [dev.count - use.used]
    memreq = memory_request(req, dev)
    if memreq > 0:
        limits.append((dev.devmem - use.usedmem) // memreq)
    if req.cores > 0:
        limits.append((dev.devcore - use.usedcores) // req.cores)
    elif dev.devcore != 0 and use.usedcores >= dev.devcore:
        return 0
    if req.cores >= 100 and dev.devcore == 100:
        limits.append(0 if use.used > 0 else 1)
    return max(min(limits), 0)


def node_tasks(node: NodeDevices, req: HamiRequest) -> int:
    return tasks_on_node(
        (device_fits(d, node.use.get(d.id) or DeviceUse(), req) for d in node.devices), req.nums
    )


def node_total(node: NodeDevices, req: HamiRequest) -> int:
    return tasks_on_node((device_fits(d, DeviceUse(), req) for d in node.devices), req.nums)


def charge_allocation(node: NodeDevices, allocated: list[tuple[str, int, int]]) -> None:
    """Book a pod HAMi has annotated with its device allocation."""
    for device_id, mem, cores in allocated:
        use = node.usage(device_id)
        use.used += 1
        use.usedmem += mem
        use.usedcores += cores


def charge_estimate(node: NodeDevices, req: HamiRequest) -> None:
    """Book a bound pod HAMi never annotated (another scheduler bound it, or a stand-in
    cluster): place it on the first devices that fit, scanning from the last device as
    HAMi's Fit does. Marks the node's numbers as estimated."""
    node.estimated = True
    remaining = req.nums
    for dev in reversed(node.devices):
        if remaining == 0:
            break
        use = node.usage(dev.id)
        if device_fits(dev, use, req) <= 0:
            continue
        use.used += 1
        use.usedmem += memory_request(req, dev)
        use.usedcores += req.cores
        remaining -= 1
