"""ResourceSlices as NVIDIA's DRA kubelet plugin for GPUs publishes them, from a topology node's
`dra:` section (the DeviceClasses its Helm chart installs are the launcher's manifests).

Sources (kubernetes-sigs/dra-driver-nvidia-gpu at 9593204, Aug 2026):

- cmd/gpu-kubelet-plugin/deviceinfo.go, GpuInfo.Attributes / GetDevice: a GPU is device
  `gpu-<minor>` with attributes `type: gpu`, `uuid`, `productName`, `brand`, `architecture`,
  `cudaComputeCapability`, `driverVersion`, `cudaDriverVersion` (the last three versions) and
  capacity `memory` in bytes (partitions.go fullGpuCapacity). `index` and `minor` are no longer
  published (commit 36fc80ab "Remove GPU index for CDI spec generation / attribute
  advertisement"); the demo's gpu-test6.yaml still selects on `index`.
- cmd/gpu-kubelet-plugin/mig.go, CommonAttributesMig / CommonCapacitiesMig / ToCanonicalName: a
  MIG device is `gpu-<parent minor>-mig-<profile without dots>-<GI profile id>-<placement
  start>` with `type: mig`, `parentUUID`, `profile`, the parent's product attributes, its own
  `uuid` (static MIG), and capacities `multiprocessors`, `memory` (MiB x 2^20) and (static MIG,
  deviceinfo.go MigDeviceInfo.GetDevice) `memorySlice<N>` = 1 for each memory slice it holds.
- cmd/gpu-kubelet-plugin/consumable_shares.go, applyConsumableShares (`--consumable-shares`,
  feature gate ConsumableShares): `allowMultipleAllocations: true`; memory rounded down to 1Mi;
  `memory` mode: requestPolicy default = all memory, validRange min 1Mi, step 1Mi, max all;
  `unlimited`: default 0, min 0; an integer N: memory as unlimited plus capacity `shares` = N
  with default 1, min 1, max N, step 1.
- cmd/gpu-kubelet-plugin/partitions.go (feature gate DynamicMIG, KEP-4815): one counter set
  `gpu-<minor>-counter-set` per GPU holding its capacities as counters (camelToDNSName) and
  `memory-slice-<i>` = 1 per memory slice; the full GPU consumes all of them, each possible MIG
  placement (devices with no uuid: made when allocated) consumes its profile's capacities and
  its memory slices. Modelled counters: `memory`, `multiprocessors`, `memory-slice-<i>` (the
  copy/decode/encode/jpeg/ofa engine counters are left out: no profile here is short of them
  before it is short of memory slices).
- deployments/helm/dra-driver-nvidia-gpu/templates/deviceclass-gpu.yaml, deviceclass-mig.yaml:
  the DeviceClasses. The gpu class's `extendedResourceName: nvidia.com/gpu` is left out: it
  needs the DRAExtendedResource feature gate (alpha in 1.34, off), without which the apiserver
  drops the field.

A topology node declares, e.g.:

    dra: {gpus: 2, model: H100-80GB, consumableShares: memory}      # memory | unlimited | N
    dra: {gpus: 1, model: A100-80GB, mig: dynamic}
    dra: {gpus: 8, model: A100-40GB, mig: static, migGpus: [0, 1, 2, 3],
          migDevices: [1g.5gb, 1g.5gb, 2g.10gb, 3g.20gb]}

(`migGpus`: which GPUs have MIG enabled, default all, as a nvidia-mig-parted config's
`devices:` list; the others are published as full GPUs.) Also accepted, as the product helper's
proposal spells them: `product:` (NVML name) with `memory_mib:` instead of `model:`,
`consumable_shares:`, `dynamic_mig: true`, `driver: gpu.nvidia.com`.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

DRIVER = "gpu.nvidia.com"
MIB = 1024 * 1024


@dataclass(frozen=True)
class Profile:
    name: str
    gi_profile_id: int  # NVML GPU instance profile id (nvml.h NVML_GPU_INSTANCE_PROFILE_*)
    memory_mib: int
    multiprocessors: int
    placements: tuple[tuple[int, int], ...]  # (memory slice start, size)


@dataclass(frozen=True)
class Model:
    product: str  # NVML's device name, what `productName` carries
    memory_mib: int  # NVML's total memory
    architecture: str
    compute_capability: str
    profiles: tuple[Profile, ...] = ()


def _profiles(memory: tuple[int, int, int, int, int], sms: tuple[int, ...], names: tuple[str, ...]):
    # NVIDIA MIG user guide: 8 memory slices; 1g at 0..6, 2g at 0/2/4, 3g at 0/4, 4g at 0, 7g at 0
    placements = (
        tuple((i, 1) for i in range(7)),
        ((0, 2), (2, 2), (4, 2)),
        ((0, 4), (4, 4)),
        ((0, 4),),
        ((0, 8),),
    )
    ids = (19, 14, 9, 5, 0)  # NVML_GPU_INSTANCE_PROFILE_1_SLICE, _2_, _3_, _4_, _7_SLICE
    return tuple(
        Profile(n, i, m, s, p)
        for n, i, m, s, p in zip(names, ids, memory, sms, placements, strict=True)
    )


#: GPU models a topology may name (fracspawner's model names): productName as NVML names the
#: device, memory as NVML reports it (fracspawner.model.gpumodels NVML_MEMORY_MIB, with its
#: sources), architecture as go-nvlib's GetArchFamily words it (pkg/nvlib/device/device.go).
#: MIG profiles' memory is NVML's MemorySizeMB (MiB), what the plugin publishes: A100-40GB from
#: shared/reference/gpu-backends.md (4864, 9856, 19968, 19968, 40192), A100-80GB from the GFD
#: labels of devcluster/topologies/demo.yaml (9856, 19968, 40192; 7g.80gb nominal: not found),
#: H100 from nvidia-smi's GiB figures there (9.75, 19.62, 39.50, 79.25 GiB); SMs from the MIG
#: user guide
MODELS: dict[str, Model] = {
    "H100-80GB": Model(
        "NVIDIA H100 80GB HBM3", 81559, "Hopper", "9.0",
        _profiles((9984, 20096, 40448, 40448, 81152), (16, 32, 60, 64, 132),
                  ("1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")),
    ),
    "A100-80GB": Model(
        "NVIDIA A100-SXM4-80GB", 81920, "Ampere", "8.0",
        _profiles((9856, 19968, 40192, 40192, 81920), (14, 28, 42, 56, 98),
                  ("1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")),
    ),
    "A100-40GB": Model(
        "NVIDIA A100-SXM4-40GB", 40960, "Ampere", "8.0",
        _profiles((4864, 9856, 19968, 19968, 40192), (14, 28, 42, 56, 98),
                  ("1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb")),
    ),
    "H200-141GB": Model("NVIDIA H200", 143771, "Hopper", "9.0"),
    "L40S": Model("NVIDIA L40S", 46068, "Ada Lovelace", "8.9"),
    "L4": Model("NVIDIA L4", 23034, "Ada Lovelace", "8.9"),
    "A10": Model("NVIDIA A10", 23028, "Ampere", "8.6"),
    "T4": Model("Tesla T4", 15360, "Turing", "7.5"),
}  # fmt: skip
MODELS["H200"] = MODELS["H200-141GB"]
DRIVER_VERSION = "580.65.6"
CUDA_DRIVER_VERSION = "13.0.0"


class TopologyError(ValueError):
    pass


def gpu_uuid(node: str, minor: int) -> str:
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{node}.gpu{minor}.devcluster"))


def mig_uuid(node: str, minor: int, start: int, profile: str) -> str:
    return "MIG-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{node}.gpu{minor}.{profile}.{start}"))


def _common(model: Model, kind: str) -> dict[str, Any]:
    return {
        "type": {"string": kind},
        "productName": {"string": model.product},
        "brand": {"string": "Nvidia"},
        "architecture": {"string": model.architecture},
        "cudaComputeCapability": {"version": f"{model.compute_capability}.0"},
        "driverVersion": {"version": DRIVER_VERSION},
        "cudaDriverVersion": {"version": CUDA_DRIVER_VERSION},
    }


def _shares(device: dict[str, Any], mode: str) -> None:
    """applyConsumableShares."""
    if mode in ("", "disabled"):
        return
    device["allowMultipleAllocations"] = True
    memory = device.get("capacity", {}).get("memory")
    if memory is None:
        return
    total = f"{int(memory['value']) // MIB}Mi"
    memory["value"] = total
    if mode == "memory":
        memory["requestPolicy"] = {
            "default": total,
            "validRange": {"min": "1Mi", "max": total, "step": "1Mi"},
        }
        return
    memory["requestPolicy"] = {
        "default": "0",
        "validRange": {"min": "0", "max": total, "step": "1Mi"},
    }
    if mode != "unlimited":
        n = int(mode)
        device["capacity"]["shares"] = {
            "value": str(n),
            "requestPolicy": {
                "default": "1",
                "validRange": {"min": "1", "max": str(n), "step": "1"},
            },
        }


def _profile(model: Model, name: str) -> Profile:
    for profile in model.profiles:
        if profile.name == name:
            return profile
    known = ", ".join(p.name for p in model.profiles) or "none"
    raise TopologyError(f"dra: the {model.product} has no MIG profile {name!r} (known: {known})")


def _model(spec: Mapping[str, Any]) -> Model:
    """`model:` (a name of MODELS), or `product:` (an NVML product name, e.g. "NVIDIA H100 80GB
    HBM3") with an optional `memory_mib:` overriding the model's memory."""
    if "model" in spec:
        model = MODELS.get(str(spec["model"]))
        if model is None:
            raise TopologyError(
                f"dra: unknown model {spec['model']!r} (known: {', '.join(MODELS)})"
            )
        return model
    product = spec.get("product")
    if product is None:
        return MODELS["H100-80GB"]
    known = next((m for m in MODELS.values() if m.product == product), None)
    memory = spec.get("memory_mib")
    if known is not None:
        return known if memory is None else replace(known, memory_mib=int(memory))
    if memory is None:
        raise TopologyError(f"dra: product {product!r} is not a known model: give memory_mib")
    return Model(str(product), int(memory), str(spec.get("architecture", "")), "8.0")


def node_slice(node: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    """The one ResourceSlice the plugin publishes for a node (pool = the node's name)."""
    if spec.get("driver", DRIVER) != DRIVER:
        raise TopologyError(
            f"dra: only NVIDIA's driver ({DRIVER}) is simulated, not {spec['driver']!r}"
        )
    model = _model(spec)
    gpus = int(spec.get("gpus", 1))
    mig = str(spec.get("mig", "dynamic" if spec.get("dynamic_mig") else "none"))
    shares = str(spec.get("consumableShares", spec.get("consumable_shares", "disabled")))
    if mig not in ("none", "static", "dynamic"):
        raise TopologyError(f"dra: mig must be none, static or dynamic, not {mig!r}")
    if shares not in ("disabled", "memory", "unlimited") and not shares.isdigit():
        raise TopologyError(f"dra: consumableShares must be memory, unlimited or N, not {shares!r}")
    mig_gpus = {int(i) for i in spec.get("migGpus", range(gpus))}
    devices: list[dict[str, Any]] = []
    counter_sets: list[dict[str, Any]] = []
    for minor in range(gpus):
        parent = gpu_uuid(node, minor)
        full = {
            "name": f"gpu-{minor}",
            "attributes": {**_common(model, "gpu"), "uuid": {"string": parent}},
            "capacity": {"memory": {"value": str(model.memory_mib * MIB)}},
        }
        if mig == "static" and minor in mig_gpus:
            for start_profile in _static_layout(model, spec.get("migDevices") or []):
                start, profile = start_profile
                device = _mig_device(model, profile, minor, parent, start)
                device["attributes"]["uuid"] = {
                    "string": mig_uuid(node, minor, start, profile.name)
                }
                for i in range(start, start + _size(profile, start)):
                    device["capacity"][f"memorySlice{i}"] = {"value": "1"}
                _shares(device, shares)
                devices.append(device)
            continue
        if mig == "dynamic":
            counter_set = f"gpu-{minor}-counter-set"
            largest = model.profiles[-1] if model.profiles else None
            if largest is None:
                raise TopologyError(f"dra: the {model.product} has no MIG profiles")
            everything = _counters(largest, 0, 8)
            counter_sets.append({"name": counter_set, "counters": everything})
            full["consumesCounters"] = [{"counterSet": counter_set, "counters": everything}]
            devices.append(full)
            for profile in model.profiles:
                for start, size in profile.placements:
                    device = _mig_device(model, profile, minor, parent, start)
                    device["consumesCounters"] = [
                        {"counterSet": counter_set, "counters": _counters(profile, start, size)}
                    ]
                    devices.append(device)
            continue
        _shares(full, shares)
        devices.append(full)
    spec_out: dict[str, Any] = {
        "driver": DRIVER,  # the classes and attributes are the NVIDIA driver's: no other name
        "nodeName": node,
        "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
        "devices": devices,
    }
    if counter_sets:
        spec_out["sharedCounters"] = counter_sets
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": f"{node}-{DRIVER}-"},
        "spec": spec_out,
    }


def _size(profile: Profile, start: int) -> int:
    return dict(profile.placements)[start]


def _static_layout(model: Model, names: list[str]) -> list[tuple[int, Profile]]:
    """Place the listed MIG devices on one GPU at placements NVML allows (as nvidia-mig-parted
    applies a layout: 3g.20gb + 2g.10gb + 2 x 1g.5gb fits only with the 3g at slice 4); a layout
    that cannot fit is a topology error."""
    wanted = sorted((_profile(model, n) for n in names), key=lambda p: -p.memory_mib)

    def place(i: int, taken: frozenset[int]) -> list[tuple[int, Profile]] | None:
        if i == len(wanted):
            return []
        for start, size in wanted[i].placements:
            slots = frozenset(range(start, start + size))
            if not slots & taken:
                rest = place(i + 1, taken | slots)
                if rest is not None:
                    return [(start, wanted[i]), *rest]
        return None

    layout = place(0, frozenset())
    if layout is None:
        raise TopologyError(f"dra: MIG layout {names} does not fit one {model.product}")
    return sorted(layout, key=lambda sp: (sp[1].memory_mib, sp[0]))


def _mig_device(model: Model, profile: Profile, minor: int, parent: str, start: int) -> dict:
    return {
        "name": f"gpu-{minor}-mig-{profile.name.replace('.', '')}-{profile.gi_profile_id}-{start}",
        "attributes": {
            **_common(model, "mig"),
            "parentUUID": {"string": parent},
            "profile": {"string": profile.name},
        },
        "capacity": {
            "multiprocessors": {"value": str(profile.multiprocessors)},
            "memory": {"value": str(profile.memory_mib * MIB)},
        },
    }


def _counters(profile: Profile, start: int, size: int) -> dict[str, dict[str, str]]:
    counters = {
        "memory": {"value": str(profile.memory_mib * MIB)},
        "multiprocessors": {"value": str(profile.multiprocessors)},
    }
    for i in range(start, start + size):
        counters[f"memory-slice-{i}"] = {"value": "1"}
    return counters
