"""Kubernetes DRA objects as the scheduler's allocator reads them, and how many more claims fit.

Pure: slim records of ResourceSlice devices and ResourceClaim allocation results, and the fit
of one device request onto one node's devices. Sources (kubernetes/kubernetes, 1.34+):
- staging/src/k8s.io/api/resource/v1/types.go: ResourceSlice (`spec.driver`, `spec.pool`
  {name, generation}, `spec.nodeName`, `spec.devices[]` {name, attributes, capacity
  {value, requestPolicy {default, validValues, validRange {min, max, step}}},
  allowMultipleAllocations, consumesCounters [{counterSet, counters}]}, `spec.sharedCounters`
  [{name, counters}]), ResourceClaim `status.allocation.devices.results[]` {request, driver,
  pool, device, consumedCapacity, shareID};
- DeviceCapacity.requestPolicy: a request without an entry for a capacity consumes its
  `default`; without a policy, the full capacity (types.go, KEP-5075 consumable capacity); an
  amount is rounded up to the policy's step from its min, or to the next validValues entry;
- staging/src/k8s.io/dynamic-resource-allocation/structured/allocator.go: only the newest
  generation of a pool counts; a device that is not allowMultipleAllocations is taken by one
  allocation; a multi-allocatable device takes allocations while the sum of what they consume
  stays within its capacity; a device's counters (KEP-4815 partitionable devices) are taken
  from its counter set while it holds an allocation, once however many it holds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from ..k8s.objects import quantity

#: a device: (driver, pool, device name)
DeviceKey = tuple[str, str, str]
#: a counter set: (driver, pool, counter set name)
CounterKey = tuple[str, str, str]


@dataclass(frozen=True)
class Policy:
    default: Decimal | None = None
    minimum: Decimal | None = None
    maximum: Decimal | None = None
    step: Decimal | None = None
    valid_values: tuple[Decimal, ...] = ()

    def consumed(self, requested: Decimal | None, value: Decimal) -> Decimal | None:
        """What a request of `requested` (None: none named) consumes; None: not allowed."""
        if requested is None:
            return self.default if self.default is not None else value
        if self.valid_values:
            fitting = [v for v in sorted(self.valid_values) if v >= requested]
            return fitting[0] if fitting else None
        amount = max(requested, self.minimum or Decimal(0))
        if self.step:
            base = self.minimum or Decimal(0)
            amount = base + math.ceil((amount - base) / self.step) * self.step
        if self.maximum is not None and amount > self.maximum:
            return None
        return amount


@dataclass(frozen=True)
class Capacity:
    value: Decimal
    policy: Policy | None = None

    def consumed(self, requested: Decimal | None) -> Decimal | None:
        if self.policy is not None:
            return self.policy.consumed(requested, self.value)
        return self.value if requested is None else requested


@dataclass(frozen=True)
class Device:
    key: DeviceKey
    node: str | None
    attributes: Mapping[str, Any] = field(hash=False)
    capacity: Mapping[str, Capacity] = field(hash=False)
    multi: bool = False
    consumes: tuple[tuple[CounterKey, Mapping[str, Decimal]], ...] = field(default=(), hash=False)

    def attribute(self, name: str) -> Any:
        """An attribute by its name in the driver's domain ('productName' or
        'gpu.nvidia.com/productName': unqualified names are the driver's)."""
        if name in self.attributes:
            return self.attributes[name]
        prefix = self.key[0] + "/"
        if name.startswith(prefix):
            return self.attributes.get(name[len(prefix) :])
        return self.attributes.get(prefix + name)


@dataclass(frozen=True)
class SliceRecord:
    name: str
    driver: str
    pool: str
    generation: int
    devices: tuple[Device, ...]
    counters: Mapping[CounterKey, Mapping[str, Decimal]] = field(hash=False)

    def nodes(self) -> set[str]:
        return {d.node for d in self.devices if d.node}


@dataclass(frozen=True)
class Allocation:
    """One allocation result of a claim: which device, and what it consumes of it."""

    device: DeviceKey
    consumed: Mapping[str, Decimal] | None = field(default=None, hash=False)  # None: unrecorded


@dataclass(frozen=True)
class ClaimRecord:
    key: str  # namespace/name
    labels: Mapping[str, str] = field(hash=False)
    #: "namespace/name" of the pod it was made for (its controller ownerReference), if any
    owner: str | None = None
    #: only what counting reads: a status change that leaves these alone (status.reservedFor
    #: as pods come and go, conditions) changes no record and recounts nothing
    allocations: tuple[Allocation, ...] = ()


def _attribute_value(raw: Any) -> Any:
    if not isinstance(raw, Mapping):
        return None
    for kind in ("string", "version", "int", "bool"):
        if kind in raw:
            return raw[kind]
    return None


def _policy(raw: Any) -> Policy | None:
    if not isinstance(raw, Mapping):
        return None
    valid = raw.get("validRange") or {}
    return Policy(
        default=quantity(raw.get("default")) if raw.get("default") is not None else None,
        minimum=quantity(valid.get("min")) if valid.get("min") is not None else None,
        maximum=quantity(valid.get("max")) if valid.get("max") is not None else None,
        step=quantity(valid.get("step")) if valid.get("step") is not None else None,
        valid_values=tuple(
            q for q in (quantity(v) for v in raw.get("validValues") or ()) if q is not None
        ),
    )


def _counters(raw: Any) -> dict[str, Decimal]:
    out = {}
    for name, counter in (raw or {}).items():
        value = quantity((counter or {}).get("value"))
        if value is not None:
            out[name] = value
    return out


def slice_record(obj: Mapping[str, Any]) -> SliceRecord | None:
    """A ResourceSlice, slim: None when it is not one a scheduler could allocate from."""
    spec = obj.get("spec") or {}
    driver = spec.get("driver")
    pool = (spec.get("pool") or {}).get("name")
    if not driver or not pool:
        return None
    node = spec.get("nodeName")
    devices = []
    for raw in spec.get("devices") or ():
        name = raw.get("name")
        if not name:
            continue
        capacity = {}
        for cap_name, cap in (raw.get("capacity") or {}).items():
            value = quantity((cap or {}).get("value"))
            if value is not None:
                capacity[cap_name] = Capacity(value, _policy((cap or {}).get("requestPolicy")))
        devices.append(
            Device(
                key=(driver, pool, name),
                node=raw.get("nodeName") or node,
                attributes={
                    k: _attribute_value(v) for k, v in (raw.get("attributes") or {}).items()
                },
                capacity=capacity,
                multi=bool(raw.get("allowMultipleAllocations")),
                consumes=tuple(
                    ((driver, pool, c.get("counterSet", "")), _counters(c.get("counters")))
                    for c in raw.get("consumesCounters") or ()
                ),
            )
        )
    counters = {
        (driver, pool, s.get("name", "")): _counters(s.get("counters"))
        for s in spec.get("sharedCounters") or ()
    }
    return SliceRecord(
        name=(obj.get("metadata") or {}).get("name", ""),
        driver=driver,
        pool=pool,
        generation=int((spec.get("pool") or {}).get("generation") or 0),
        devices=tuple(devices),
        counters=counters,
    )


def claim_record(obj: Mapping[str, Any]) -> ClaimRecord:
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or ()
    allocations = []
    for r in results:
        if not (r.get("driver") and r.get("pool") and r.get("device")):
            continue
        consumed = r.get("consumedCapacity")
        allocations.append(
            Allocation(
                device=(r["driver"], r["pool"], r["device"]),
                consumed=(
                    {k: q for k, q in ((k, quantity(v)) for k, v in consumed.items()) if q}
                    if isinstance(consumed, Mapping)
                    else None
                ),
            )
        )
    owner = next(
        (
            f"{meta.get('namespace')}/{r.get('name')}"
            for r in meta.get("ownerReferences") or ()
            if r.get("kind") == "Pod" and r.get("controller")
        ),
        None,
    )
    return ClaimRecord(
        key=f"{meta.get('namespace')}/{meta.get('name')}",
        labels=dict(meta.get("labels") or {}),
        owner=owner,
        allocations=tuple(allocations),
    )


# ------------------------------------------------------------------------------ fitting
@dataclass(frozen=True)
class DeviceRequest:
    """What one claim of an offer asks: `count` devices of `driver` whose attributes equal
    `match`, consuming `capacity` of each (the request's capacity.requests)."""

    driver: str
    match: Mapping[str, Any] = field(hash=False)
    capacity: Mapping[str, Decimal] = field(hash=False, default_factory=dict)
    count: int = 1

    def matches(self, device: Device) -> bool:
        if device.key[0] != self.driver:
            return False
        if any(device.attribute(k) != v for k, v in self.match.items()):
            return False
        # a capacity the device does not have cannot be consumed from it
        return all(name in device.capacity for name in self.capacity)


@dataclass
class NodeDevices:
    """One node's devices, what claims hold of them, and its counter sets."""

    devices: list[Device]
    #: device -> what each allocation on it consumes (None: unrecorded)
    held: Mapping[DeviceKey, list[Mapping[str, Decimal] | None]]
    counters: Mapping[CounterKey, Mapping[str, Decimal]]


def _per_claim(device: Device, request: DeviceRequest) -> dict[str, Decimal] | None:
    """What one allocation of `request` consumes of each capacity of `device`."""
    out = {}
    for name, cap in device.capacity.items():
        amount = cap.consumed(request.capacity.get(name))
        if amount is None:
            return None
        out[name] = amount
    return out


def _remaining(device: Device, held: Iterable[Mapping[str, Decimal] | None]) -> dict[str, Decimal]:
    left = {name: cap.value for name, cap in device.capacity.items()}
    for consumed in held:
        for name, cap in device.capacity.items():
            # an unrecorded consumption counts as the policy's default: what the allocator
            # charges a request that names nothing
            amount = (consumed or {}).get(name) if consumed is not None else cap.consumed(None)
            left[name] -= amount or Decimal(0)
    return left


def _fits_on_device(device: Device, request: DeviceRequest, held: list[Any]) -> int:
    per = _per_claim(device, request)
    if per is None:
        return 0
    if not device.multi:
        if held:
            return 0
        return int(all(per[n] <= device.capacity[n].value for n in request.capacity))
    left = _remaining(device, held)
    limits = [math.floor(left[n] / amount) for n, amount in per.items() if amount > 0]
    if not limits:
        return 1  # consumes nothing countable: say one, never "unlimited"
    return max(min(limits), 0)


def _take_counters(
    counters: dict[CounterKey, dict[str, Decimal]], device: Device, commit: bool
) -> bool:
    for key, amounts in device.consumes:
        have = counters.get(key)
        if have is None:
            return False  # its counter set is not published (yet): cannot be allocated
        if any(have.get(n, Decimal(0)) < v for n, v in amounts.items()):
            return False
    if commit:
        for key, amounts in device.consumes:
            for n, v in amounts.items():
                counters[key][n] -= v
    return True


def fit_node(node: NodeDevices, request: DeviceRequest, *, empty: bool = False) -> int:
    """How many more claims of `request` the allocator could place on this node (`empty`:
    with nothing allocated: the node's total). Greedy in device-name order, taking counters
    as it goes: for MIG made on demand, what the counters still allow."""
    counters = {k: dict(v) for k, v in node.counters.items()}
    devices = sorted(node.devices, key=lambda d: d.key)
    if not empty:
        for device in devices:
            if node.held.get(device.key):
                _take_counters(counters, device, commit=True)
    per_device = []
    for device in devices:
        if not request.matches(device):
            continue
        held = [] if empty else list(node.held.get(device.key) or ())
        fits = _fits_on_device(device, request, held)
        if fits and device.consumes and not held:
            fits = fits if _take_counters(counters, device, commit=True) else 0
        per_device.append(fits)
    if request.count <= 1:
        return sum(per_device)
    from .fit import tasks_on_node

    return tasks_on_node(per_device, request.count)
