"""Kubernetes Dynamic Resource Allocation (resource.k8s.io/v1) with NVIDIA's DRA driver.

Source: kubernetes-sigs/dra-driver-nvidia-gpu (snapshot of Aug 2026):
- DeviceClasses `gpu.nvidia.com` (`device.attributes['gpu.nvidia.com'].type == 'gpu'`) and
  `mig.nvidia.com` (`type == 'mig'`): deployments/helm/dra-driver-nvidia-gpu/templates/
  deviceclass-gpu.yaml, deviceclass-mig.yaml;
- device attributes `type`, `uuid`, `productName` (NVML's name, e.g. "NVIDIA H100 80GB HBM3"),
  `architecture`, `cudaComputeCapability`...; MIG devices add `profile` and `parentUUID`, and
  carry their parent's productName: cmd/gpu-kubelet-plugin/deviceinfo.go `Attributes`,
  mig.go `CommonAttributesMig`; capacity `memory` in bytes (NVML's total);
- consumable shares (feature gate ConsumableShares, `--consumable-shares=memory|unlimited|N`):
  devices announce `allowMultipleAllocations: true` and a request policy on `memory` (memory:
  default = all of it, so a claim without a request takes the whole device; unlimited and N:
  default 0) and, for N, a `shares` capacity of N with default 1 (cmd/gpu-kubelet-plugin/
  consumable_shares.go `applyConsumableShares`, demo/specs/consumable-shares/README.md);
- the scheduler keeps the sum of what claims consume within the device (KEP-5075); nothing at
  run time limits a process to what its claim booked (MPS is refused with consumable shares:
  device_state.go "MPS sharing is not supported when consumable shares is enabled"), so a
  memory share is booked, not enforced: soft caps apply as for time-slicing;
- MIG devices, pre-made (static) or made on demand (feature gate DynamicMIG: each possible
  placement is a device consuming its parent's counters, partitions.go) are claimed alike,
  by a CEL selector on `profile`; MIG isolates in hardware;
- opaque config `GpuConfig` of `resource.nvidia.com/v1beta1` (api/nvidia.com/resource/v1beta1/
  gpuconfig.go, sharing.go): `sharing.strategy` TimeSlicing (`timeSlicingConfig.interval`
  Default/Short/Medium/Long) or MPS (`mpsConfig.defaultActiveThreadPercentage`,
  `defaultPinnedDeviceMemoryLimit`).

A slice becomes a ResourceClaimTemplate (one per offer, `claim_template_name`) that the pod
names in `spec.resourceClaims`, and a `resources.claims` entry on the GPU container; no
extended resource is requested. The hub makes the template in the server's namespace before
the pod (capacity/templates.py); so does the Kubeflow webhook for a notebook it maps, and
Kubeflow export writes them per profile namespace.

Pool options (`options:`; the catalog schema lists them under `$defs.dra_options`):
- `driver` (gpu.nvidia.com), `device_class` (gpu.nvidia.com), `mig_device_class`
  (mig.nvidia.com);
- `sharing`: the consumable-shares mode the nodes' kubelet plugin runs: `memory`, `shares`
  (with `shares: N`), `unlimited`, or `none` (default: each claim gets whole devices);
- `mig`: `none` (default), `static` (pre-made MIG devices) or `dynamic` (DynamicMIG);
- `product_name`: the NVML product name the CEL selector matches (default from the GPU model;
  `any`: no selector on the model);
- `selectors`: more CEL expressions every request carries;
- `time_slicing`: Default | Short | Medium | Long (a GpuConfig with TimeSlicing);
- `mps: true`: a GpuConfig with MPS (whole-GPU offers only, `sharing: none`).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from fractions import Fraction
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar

from ..k8s.objects import quantity
from ..model.errors import SliceError
from ..model.slices import Slice, slice_memory_mib
from .base import CHECKED, Backend, PodPlan, option
from .dra_devices import DeviceRequest, NodeDevices, fit_node
from .fit import (
    CountedOffer,
    NodeCount,
    NotCountable,
    OfferCapacity,
    OfferCounter,
    SummedCounter,
    Tally,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..k8s.index import NodeSlot
    from ..model.catalog import Pool

API_VERSION = "resource.k8s.io/v1"
GPU_CONFIG_API = "resource.nvidia.com/v1beta1"
DEFAULT_DRIVER = "gpu.nvidia.com"
DEFAULT_GPU_CLASS = "gpu.nvidia.com"
DEFAULT_MIG_CLASS = "mig.nvidia.com"
#: the pod's claim and the request in it
CLAIM_NAME = "gpu"
REQUEST_NAME = "gpu"
#: template labels/annotations: who made it, and a digest of its spec (the hub replaces a
#: template whose digest differs from the plan's)
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "fracspawner"
TEMPLATE_DIGEST = "fracspawner.io/template-digest"
SHARING_MODES = ("memory", "shares", "unlimited", "none")
MIG_MODES = ("none", "static", "dynamic")
TIME_SLICES = ("Default", "Short", "Medium", "Long")

#: NVML product names (what the driver publishes as `productName`) of the built-in models;
#: GFD's `nvidia.com/gpu.product` is this with spaces as '-', which cannot be undone
#: ("NVIDIA A100-SXM4-80GB"). Sources: nvidia-smi listings of each card (SXM variants); the
#: H200's read on one (nvidia-smi --query-gpu=name: "NVIDIA H200", 143771 MiB, driver
#: 580.159.04; the driver's productName is NVML's nvmlDeviceGetName, deviceinfo.go).
PRODUCT_NAMES: Mapping[str, str] = {
    "A100-40GB": "NVIDIA A100-SXM4-40GB",
    "A100-80GB": "NVIDIA A100-SXM4-80GB",
    "A30-24GB": "NVIDIA A30",
    "H100-80GB": "NVIDIA H100 80GB HBM3",
    "H100-NVL-94GB": "NVIDIA H100 NVL",
    "H200-141GB": "NVIDIA H200",
    "L4": "NVIDIA L4",
    "L40S": "NVIDIA L40S",
    "T4": "Tesla T4",
    "A10": "NVIDIA A10",
}


def _opt(pool: Pool, key: str) -> Any:
    defaults = {
        "driver": DEFAULT_DRIVER,
        "device_class": DEFAULT_GPU_CLASS,
        "mig_device_class": DEFAULT_MIG_CLASS,
        "sharing": "none",
        "mig": "none",
    }
    return option(pool, key, defaults.get(key))


def product_name(pool: Pool) -> str | None:
    """The productName the pool's selector matches; None: any model (`product_name: any`)."""
    name = option(pool, "product_name")
    if name == "any":
        return None
    return name or PRODUCT_NAMES.get(pool.gpu.name)


def mib_quantity(mib: int) -> str:
    """A Kubernetes quantity for `mib` MiB: '10Gi' where whole GiB, else '10000Mi'."""
    return f"{mib // 1024}Gi" if mib % 1024 == 0 else f"{mib}Mi"


def _cel_string(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _attr(driver: str, name: str) -> str:
    return f"device.attributes[{_cel_string(driver)}].{name}"


def _dns_label_part(text: str) -> str:
    out = re.sub(r"[^a-z0-9.-]+", "-", text.lower())
    out = re.sub(r"\.{2,}", ".", out)
    return re.sub(r"(^[^a-z0-9]+)|([^a-z0-9]+$)", "", out) or "x"


def claim_template_name(pool_name: str, label: str) -> str:
    """The ResourceClaimTemplate of one offer: `fracspawner-<pool>-<slice>`, a DNS subdomain.
    Where the pool's name had to be changed to fit (upper case, '_'), a digest of it keeps
    two pools apart."""
    part = _dns_label_part(pool_name)
    if part != pool_name:
        part += "-" + hashlib.sha256(pool_name.encode()).hexdigest()[:6]
    name = f"fracspawner-{part}-{_dns_label_part(label)}"
    return name[:253].rstrip("-.")


def fraction_mib(fraction: Fraction, device_mib: int) -> int:
    """MiB of a fraction of the device, rounded down: N claims of 1/N always fit (the driver
    publishes NVML's total rounded down to 1Mi, consumable_shares.go)."""
    return math.floor(fraction * device_mib)


class DraBackend(Backend):
    name = "dra"
    enforces_memory = False
    modes = frozenset({"fraction", "memory", "mig", "whole"})
    summary = (
        "Kubernetes DRA (resource.k8s.io/v1) with NVIDIA's DRA driver: a ResourceClaim per "
        "server; memory shares are booked by the scheduler, MIG is isolated in hardware"
    )
    #: the catalog schema's dra_options says each (keys and values) already
    pool_options = MappingProxyType(
        dict.fromkeys(
            ("driver", "device_class", "mig_device_class", "sharing", "shares", "mig",
             "product_name", "selectors", "time_slicing", "mps"),
            CHECKED,
        )
    )  # fmt: skip
    #: DRA counts from ResourceSlices and ResourceClaims (capacity/dra.py), not node fields
    uses_dra: ClassVar[bool] = True

    # ------------------------------------------------------------------ checks
    def check_pool(self, pool: Pool) -> None:
        sharing = _opt(pool, "sharing")
        if sharing not in SHARING_MODES:
            raise ValueError(f"options.sharing: use one of {', '.join(SHARING_MODES)}")
        if sharing == "shares":
            shares = option(pool, "shares")
            if not isinstance(shares, int) or isinstance(shares, bool) or shares < 2:
                raise ValueError(
                    "options.shares: with sharing: shares, set it to the N of the driver's "
                    "--consumable-shares=N (2 or more)"
                )
        if _opt(pool, "mig") not in MIG_MODES:
            raise ValueError(f"options.mig: use one of {', '.join(MIG_MODES)}")
        if option(pool, "product_name") is None and pool.gpu.name not in PRODUCT_NAMES:
            raise ValueError(
                "options.product_name: the NVML product name the driver publishes as "
                "productName (e.g. 'NVIDIA H100 80GB HBM3'), or 'any'; "
                f"{pool.gpu.name} is not a built-in model"
            )
        interval = option(pool, "time_slicing")
        if interval is not None and interval not in TIME_SLICES:
            raise ValueError(f"options.time_slicing: use one of {', '.join(TIME_SLICES)}")
        if option(pool, "mps"):
            if interval is not None:
                raise ValueError(
                    "options.mps: a GpuConfig has one strategy, not MPS and time_slicing"
                )
            if sharing != "none":
                # device_state.go: "MPS sharing is not supported when consumable shares is enabled"
                raise ValueError(
                    "options.mps: the NVIDIA DRA driver refuses MPS with consumable shares; "
                    "use sharing: none"
                )
            if _opt(pool, "mig") == "dynamic":
                # featuregates.go: DynamicMIG is mutually exclusive with MPSSupport
                raise ValueError("options.mps: the driver's DynamicMIG excludes MPS")
        selectors = option(pool, "selectors")
        if selectors is not None and (
            not isinstance(selectors, list) or not all(isinstance(s, str) and s for s in selectors)
        ):
            raise ValueError("options.selectors: a list of CEL expressions (strings)")

    def check_offer(self, s: Slice, pool: Pool) -> None:
        super().check_offer(s, pool)
        sharing = _opt(pool, "sharing")
        if s.kind == "mig" and _opt(pool, "mig") == "none":
            raise SliceError(
                f"{s}: set options.mig to static or dynamic (how the nodes make MIG devices)"
            )
        if s.kind in ("fraction", "memory") and sharing == "none":
            raise SliceError(
                f"{s}: claims on this pool get whole devices; set options.sharing to the "
                "driver's --consumable-shares mode (memory, shares, unlimited) to share one"
            )
        if s.kind == "fraction" and sharing == "shares":
            assert s.fraction is not None
            shares = option(pool, "shares")
            if (s.fraction * shares).denominator != 1:
                raise SliceError(
                    f"{s}: a pool of {shares} shares per GPU offers multiples of 1/{shares}"
                )
        if s.kind == "mig" and sharing == "unlimited":
            # applyConsumableShares covers MIG devices too: with a request policy default of
            # 0, claims asking nothing would share the MIG device with this one
            raise SliceError(
                f"{s}: with sharing: unlimited a MIG device is shared with every claim that "
                "asks no memory; use sharing: memory (or none) on MIG pools"
            )
        if s.kind != "whole" and option(pool, "mps"):
            raise SliceError(f"{s}: an MPS GpuConfig pool offers whole GPUs only")

    def enforced(self, pool: Pool) -> bool:
        return bool(option(pool, "mps"))

    # ------------------------------------------------------------------ the plan
    def request(self, s: Slice, pool: Pool) -> tuple[dict[str, Any], int]:
        """The claim's one device request and the memory (MiB) the slice entitles to."""
        driver = _opt(pool, "driver")
        selectors: list[str] = []
        product = product_name(pool)
        if product is not None:
            selectors.append(f"{_attr(driver, 'productName')} == {_cel_string(product)}")
        device = pool.gpu.device_memory_mib
        capacity: dict[str, str] = {}
        count = 1
        if s.kind == "mig":
            assert s.profile is not None
            selectors.append(f"{_attr(driver, 'profile')} == {_cel_string(s.profile)}")
            device_class = _opt(pool, "mig_device_class")
            memory = slice_memory_mib(s, pool.gpu)
            if _opt(pool, "sharing") == "shares":
                # MIG devices get the shares capacity too: all of them keeps the device whole
                capacity["shares"] = str(option(pool, "shares"))
        else:
            device_class = _opt(pool, "device_class")
            sharing = _opt(pool, "sharing")
            if s.kind == "whole":
                count = s.count or 1
                memory = device
                if sharing == "shares":
                    capacity["shares"] = str(option(pool, "shares"))
                elif sharing == "unlimited":
                    # the request policy's default is 0 there: a claim without it shares
                    capacity["memory"] = mib_quantity(device)
            elif s.kind == "fraction" and sharing == "shares":
                assert s.fraction is not None
                capacity["shares"] = str(int(s.fraction * option(pool, "shares")))
                memory = fraction_mib(s.fraction, device)
            else:
                memory = (
                    fraction_mib(s.fraction, device)
                    if s.kind == "fraction" and s.fraction is not None
                    else slice_memory_mib(s, pool.gpu)
                )
                capacity["memory"] = mib_quantity(memory)
        selectors += list(option(pool, "selectors") or ())
        exactly: dict[str, Any] = {"deviceClassName": device_class}
        if selectors:
            exactly["selectors"] = [{"cel": {"expression": e}} for e in selectors]
        if count != 1:
            exactly["allocationMode"] = "ExactCount"
            exactly["count"] = count
        if capacity:
            exactly["capacity"] = {"requests": capacity}
        return {"name": REQUEST_NAME, "exactly": exactly}, memory

    def config(self, s: Slice, pool: Pool, memory: int) -> list[dict[str, Any]]:
        """The claim's opaque GpuConfig (TimeSlicing or MPS), if the pool asks for one."""
        if s.kind == "mig":
            return []  # GpuConfig configures full GPUs; MIG devices take MigDeviceConfig
        sharing: dict[str, Any] | None = None
        interval = option(pool, "time_slicing")
        if interval is not None:
            sharing = {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}}
        elif option(pool, "mps"):
            sharing = {
                "strategy": "MPS",
                "mpsConfig": {"defaultPinnedDeviceMemoryLimit": mib_quantity(memory)},
            }
        if sharing is None:
            return []
        return [
            {
                "requests": [REQUEST_NAME],
                "opaque": {
                    "driver": _opt(pool, "driver"),
                    "parameters": {
                        "apiVersion": GPU_CONFIG_API,
                        "kind": "GpuConfig",
                        "sharing": sharing,
                    },
                },
            }
        ]

    def plan(self, s: Slice, pool: Pool) -> PodPlan:
        request, memory = self.request(s, pool)
        devices: dict[str, Any] = {"requests": [request]}
        config = self.config(s, pool, memory)
        if config:
            devices["config"] = config
        name = claim_template_name(pool.name, s.label)
        spec = {"devices": devices}
        labels = {
            MANAGED_BY: MANAGER,
            "fracspawner.io/pool": pool.name,
            "fracspawner.io/gpu": s.label,
        }
        template = {
            "apiVersion": API_VERSION,
            "kind": "ResourceClaimTemplate",
            "metadata": {
                "name": name,
                "labels": labels,
                "annotations": {TEMPLATE_DIGEST: template_digest(spec, labels)},
            },
            # claims made from it carry the pool and slice (the capacity watch and the
            # Kubeflow webhook read them)
            "spec": {"metadata": {"labels": dict(labels)}, "spec": spec},
        }
        return PodPlan(
            memory_mib=memory,
            extra_pod_config={
                "resourceClaims": [{"name": CLAIM_NAME, "resourceClaimTemplateName": name}]
            },
            container_claims=({"name": CLAIM_NAME},),
            claim_templates=(template,),
            # MIG is split in hardware; MPS pins each client's memory
            enforced=s.kind == "mig" or bool(option(pool, "mps")),
        )

    # ------------------------------------------------------------------ counting
    def device_request(self, s: Slice, pool: Pool) -> DeviceRequest:
        """What the scheduler's allocator matches for one claim of `s`: the attributes the
        class and the CEL selectors name (type, productName, profile) and the capacity asked.
        Extra `selectors` of the pool are not evaluated here (no CEL in the hub): counts
        assume they match."""
        request, _ = self.request(s, pool)
        exactly = request["exactly"]
        match: dict[str, Any] = {"type": "mig" if s.kind == "mig" else "gpu"}
        product = product_name(pool)
        if product is not None:
            match["productName"] = product
        if s.kind == "mig":
            match["profile"] = s.profile
        capacity = {
            name: q
            for name, q in (
                (n, quantity(v))
                for n, v in (exactly.get("capacity") or {}).get("requests", {}).items()
            )
            if q is not None
        }
        return DeviceRequest(
            driver=_opt(pool, "driver"),
            match=match,
            capacity=capacity,
            count=int(exactly.get("count", 1)),
        )

    def counter(self, offer: CountedOffer) -> OfferCounter:
        pool = offer.pool
        s = next((o for o in pool.offers if str(o) == offer.spec), None)
        if s is None:
            return NotCountable("not an offer of the pool")
        dynamic = s.kind in ("mig", "whole") and _opt(pool, "mig") == "dynamic"
        return DraCounter(self.device_request(s, pool), dynamic=dynamic)


class DraCounter(SummedCounter):
    """One offer's claim fitted onto each node's ResourceSlice devices, less what allocated
    claims hold (backends.dra_devices.fit_node). `devices_of` is bound by the capacity layer
    (capacity/dra.py DraIndex.node_devices); unbound, nothing is known."""

    unseen = "no matching node publishes DRA devices (ResourceSlices) for this pool"

    def __init__(self, request: DeviceRequest, *, dynamic: bool = False) -> None:
        self.request = request
        self.dynamic = dynamic
        self.devices_of: Callable[[str], NodeDevices | None] | None = None
        self.note = (
            "MIG devices made on demand: what the GPUs' counters still allow"
            if dynamic
            else "DRA: what the scheduler could still allocate"
        )

    def count_node(self, slot: NodeSlot) -> NodeCount | None:
        if self.devices_of is None:
            return None
        devices = self.devices_of(slot.name)
        if devices is None:
            return None
        total = fit_node(devices, self.request, empty=True)
        if not total:
            return None  # this node has no device of the pool's kind
        held = sum(
            len(devices.held.get(d.key) or ()) for d in devices.devices if self.request.matches(d)
        )
        return NodeCount(fit_node(devices, self.request), total, held=held)

    def note_for(self, tally: Tally) -> str:
        return self.note

    def result(self, tally: Tally) -> OfferCapacity:
        if self.devices_of is None:  # no ResourceSlice watch: nothing is known
            return OfferCapacity(None, None, self.unseen)
        return super().result(tally)


def template_digest(spec: Mapping[str, Any], labels: Mapping[str, str]) -> str:
    text = json.dumps({"spec": spec, "labels": labels}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]
