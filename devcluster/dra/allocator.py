"""The scheduler's structured-parameters allocation, after Kubernetes'
k8s.io/dynamic-resource-allocation/structured (allocator.go, the "experimental" allocator of
1.34 with consumable capacity and partitionable devices).

For one node it allocates every still-unallocated claim of a pod at once, or none:

- devices are the node's ResourceSlices (`spec.nodeName`, or `allNodes`), the newest
  `pool.generation` of each pool only (an older generation is stale: allocator.go
  GatherPools);
- a request is `exactly` (class + selectors, `allocationMode` ExactCount with `count`
  (default 1) or All) or `firstAvailable` (the first subrequest that can be satisfied, in
  order; its result is named `<request>/<subrequest>`);
- a device matches when every CEL selector of its DeviceClass and of the request is true
  (cel.py);
- a device is free unless an allocated claim holds it, except a device with
  `allowMultipleAllocations: true` (KEP-5075 consumable capacity): each allocation consumes
  capacity, what the request asks (`capacity.requests`) fitted to the capacity's
  `requestPolicy` (below the `validRange.min` is raised to it, rounded up to `step` from
  min, or up to the next of `validValues`; above `max` or the largest valid value: no fit),
  or the policy's `default`, or, for a capacity without policy, all of it; the sum over the
  device's allocations stays within its value; each such result gets a `shareID` and its
  `consumedCapacity`. On a device without multiple allocations, `capacity.requests` is a
  minimum the device's capacity must meet;
- a device that `consumesCounters` (KEP-4815 partitionable devices) needs those counters
  left in the pool's `sharedCounters` set, after what allocated devices consumed;
- `constraints[].matchAttribute`: every device allocated for the named requests (all when
  `requests` is empty) has the attribute, with one value;
- the search backtracks, as allocator.go's allocateOne does: a later request that cannot be
  satisfied undoes an earlier choice and tries the next device.

`constraints[].distinctAttribute` (KEP-5075): no value twice among those devices.

Not modelled: device taints and tolerations, admin access, binding conditions, pools split
over several slices (each slice is taken as its own complete pool), and the per-node scoring
(the first fitting node in least-allocated order is taken).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, Decimal
from typing import Any

from ..scheduler import quantity
from . import cel

#: (slice uid, slice resourceVersion, device, expression) -> True, False or the CEL error: a
#: slice's devices change only with a new resourceVersion, and a pending pod is tried again on
#: every change in the cluster (celpy takes ~0.5 ms per evaluation)
_MATCHES: dict[tuple[str, str, str, str], bool | str] = {}
_MATCHES_MAX = 200_000


def _evaluate(expression: str, device: Device) -> bool | str:
    meta = device.slice.get("metadata") or {}
    key = (meta.get("uid", ""), meta.get("resourceVersion", ""), device.name, expression)
    if not key[0] or not key[1]:  # not from the store (a test's own slice): no caching
        key = ("", "", "", "")
    outcome = _MATCHES.get(key) if key[0] else None
    if outcome is None:
        try:
            outcome = cel.matches(expression, cel.device_activation(device.driver, device.spec))
        except cel.CelError as exc:
            outcome = str(exc)
        if key[0]:
            if len(_MATCHES) >= _MATCHES_MAX:
                _MATCHES.clear()
            _MATCHES[key] = outcome
    return outcome


class AllocationError(Exception):
    """What stops the allocation attempt outright (allocator.go returns an error, not "no")."""


@dataclass(frozen=True)
class Device:
    driver: str
    pool: str
    name: str
    spec: Mapping[str, Any] = field(compare=False, hash=False)
    slice: Mapping[str, Any] = field(compare=False, hash=False)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.driver, self.pool, self.name)

    @property
    def multi(self) -> bool:
        return bool(self.spec.get("allowMultipleAllocations"))

    def attribute(self, qualified: str) -> Any:
        """A `matchAttribute` value: `domain/name`, where `name` alone in the slice is in the
        driver's domain."""
        attributes = self.spec.get("attributes") or {}
        domain, _, short = qualified.rpartition("/")
        for key in (qualified, short) if domain == self.driver else (qualified,):
            if key in attributes:
                value = attributes[key]
                return next(iter(value.items())) if value else None
        return None


def node_devices(slices: Iterable[Mapping[str, Any]], node: str) -> list[Device]:
    """The devices a node can use, newest pool generation only, in slice order."""
    newest: dict[tuple[str, str], int] = {}
    mine = []
    for s in slices:
        spec = s.get("spec") or {}
        if spec.get("nodeName") != node and not spec.get("allNodes"):
            continue
        pool = spec.get("pool") or {}
        key = (spec.get("driver", ""), pool.get("name", ""))
        newest[key] = max(newest.get(key, 0), int(pool.get("generation") or 0))
        mine.append(s)
    devices = []
    for s in sorted(mine, key=lambda s: s["metadata"]["name"]):
        spec = s["spec"]
        pool = spec.get("pool") or {}
        if int(pool.get("generation") or 0) != newest[(spec.get("driver", ""), pool.get("name"))]:
            continue
        for d in spec.get("devices") or []:
            devices.append(Device(spec.get("driver", ""), pool.get("name", ""), d["name"], d, s))
    return devices


@dataclass
class InUse:
    """What allocated claims hold: exclusive devices, consumed capacity of shared ones, and
    consumed counters per (driver, pool, counter set)."""

    exclusive: set[tuple[str, str, str]] = field(default_factory=set)
    consumed: dict[tuple[str, str, str], dict[str, Decimal]] = field(default_factory=dict)
    counters: dict[tuple[str, str, str], dict[str, Decimal]] = field(default_factory=dict)

    def copy(self) -> InUse:
        return InUse(
            set(self.exclusive),
            {k: dict(v) for k, v in self.consumed.items()},
            {k: dict(v) for k, v in self.counters.items()},
        )


def in_use(claims: Iterable[Mapping[str, Any]], devices_by_key: Mapping[tuple, Device]) -> InUse:
    """From every allocated claim's `status.allocation.devices.results`."""
    used = InUse()
    for claim in claims:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or []:
            key = (result.get("driver", ""), result.get("pool", ""), result.get("device", ""))
            device = devices_by_key.get(key)
            _book(used, key, device, result.get("shareID"), result.get("consumedCapacity"))
    return used


def _book(
    used: InUse,
    key: tuple[str, str, str],
    device: Device | None,
    share_id: str | None,
    consumed: Mapping[str, Any] | None,
) -> None:
    if share_id or (device is not None and device.multi):
        totals = used.consumed.setdefault(key, {})
        for name, value in (consumed or {}).items():
            totals[name] = totals.get(name, Decimal(0)) + quantity(value)
    else:
        used.exclusive.add(key)
    if device is not None:
        for consumption in device.spec.get("consumesCounters") or []:
            counters = used.counters.setdefault(
                (device.driver, device.pool, consumption.get("counterSet", "")), {}
            )
            for name, counter in (consumption.get("counters") or {}).items():
                counters[name] = counters.get(name, Decimal(0)) + quantity(counter.get("value"))


def consumed_capacity(
    device: Mapping[str, Any], requests: Mapping[str, Any]
) -> dict[str, Decimal] | None:
    """What one allocation of a multi-allocatable device consumes per capacity, after the
    request policies (KEP-5075; structured/internal/experimental consumablecapacity.go);
    None when a request cannot be met by the policy."""
    capacity = device.get("capacity") or {}
    if any(name not in capacity for name in requests):
        return None
    out: dict[str, Decimal] = {}
    for name, cap in capacity.items():
        total = quantity(cap.get("value"))
        policy = cap.get("requestPolicy")
        if name in requests:
            wanted = quantity(requests[name])
        elif policy and policy.get("default") is not None:
            wanted = quantity(policy["default"])
        else:
            wanted = total
        if policy:
            fitted = _fit_policy(wanted, policy)
            if fitted is None:
                return None
            wanted = fitted
        out[name] = wanted
    return out


def _fit_policy(wanted: Decimal, policy: Mapping[str, Any]) -> Decimal | None:
    valid = sorted(quantity(v) for v in policy.get("validValues") or [])
    if valid:
        return next((v for v in valid if v >= wanted), None)
    span = policy.get("validRange")
    if not span:
        return wanted
    low = quantity(span.get("min", 0))
    if wanted < low:
        wanted = low
    step = span.get("step")
    if step is not None and quantity(step) > 0:
        size = quantity(step)
        steps = ((wanted - low) / size).to_integral_value(rounding=ROUND_CEILING)
        wanted = low + steps * size
    if span.get("max") is not None and wanted > quantity(span["max"]):
        return None
    return wanted


@dataclass
class Request:
    """One request (or firstAvailable subrequest) as the allocator sees it."""

    name: str  # what results carry: "gpu" or "gpu/small"
    parent: str  # the claim's request name
    class_name: str
    selectors: list[str]
    mode: str
    count: int
    capacity: Mapping[str, Any]
    claim: str = ""  # namespace/name, for error messages


def _requests_of(claim: Mapping[str, Any]) -> list[list[Request]]:
    """Per claim request, the alternatives to try (one for `exactly`)."""
    out = []
    for req in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
        alternatives = []
        options = (
            [(req["name"], req["exactly"])]
            if req.get("exactly")
            else [(f"{req['name']}/{sub['name']}", sub) for sub in req.get("firstAvailable") or []]
        )
        for name, exact in options:
            alternatives.append(
                Request(
                    name=name,
                    parent=req["name"],
                    class_name=exact.get("deviceClassName", ""),
                    selectors=[
                        s["cel"]["expression"] for s in exact.get("selectors") or [] if s.get("cel")
                    ],
                    mode=exact.get("allocationMode") or "ExactCount",
                    count=int(exact.get("count") or 1),
                    capacity=(exact.get("capacity") or {}).get("requests") or {},
                    claim="{}/{}".format(
                        claim.get("metadata", {}).get("namespace", ""),
                        claim.get("metadata", {}).get("name", ""),
                    ),
                )
            )
        out.append(alternatives)
    return out


class Allocator:
    """Allocates a pod's claims on one node; `allocate` returns per claim its
    `status.allocation`, or None with the reason."""

    def __init__(
        self,
        devices: list[Device],
        classes: Mapping[str, Mapping[str, Any]],
        used: InUse,
    ) -> None:
        self.devices = devices
        self.classes = classes
        self.used = used
        self.counter_sets: dict[tuple[str, str, str], dict[str, Decimal]] = {}
        for device in devices:
            spec = device.slice.get("spec") or {}
            for counter_set in spec.get("sharedCounters") or []:
                self.counter_sets[(device.driver, device.pool, counter_set["name"])] = {
                    n: quantity(c.get("value"))
                    for n, c in (counter_set.get("counters") or {}).items()
                }

    # ------------------------------------------------------------ matching
    def _matches(self, request: Request, device: Device) -> bool:
        """The class's selectors, then the request's (allocator.go selectorsMatch); a CEL
        runtime error is an AllocationError worded as upstream's."""
        klass = self.classes.get(request.class_name)
        if klass is None:
            return False
        class_selectors = [
            s["cel"]["expression"]
            for s in (klass.get("spec") or {}).get("selectors") or []
            if s.get("cel")
        ]
        for who, expressions in (
            (f"class {request.class_name}", class_selectors),
            (f"claim {request.claim}", request.selectors),
        ):
            for i, expression in enumerate(expressions):
                outcome = _evaluate(expression, device)
                if isinstance(outcome, str):
                    raise AllocationError(f"{who}: selector #{i}: {outcome}")
                if not outcome:
                    return False
        return True

    def _fits(
        self, request: Request, device: Device, used: InUse
    ) -> tuple[bool, dict[str, Decimal] | None]:
        """Whether the device can take one more allocation for the request now, and what it
        would consume of its capacity (multi-allocation devices)."""
        consumed = None
        capacity = device.spec.get("capacity") or {}
        if device.multi:
            consumed = consumed_capacity(device.spec, request.capacity)
            if consumed is None:
                return False, None
            so_far = used.consumed.get(device.key, {})
            for name, amount in consumed.items():
                if so_far.get(name, Decimal(0)) + amount > quantity(capacity[name].get("value")):
                    return False, None
        else:
            if device.key in used.exclusive or device.key in used.consumed:
                return False, None
            for name, amount in request.capacity.items():
                if name not in capacity or quantity(capacity[name].get("value")) < quantity(amount):
                    return False, None
        # a device already shared out counts its counters once (booked on first use)
        first_use = device.key not in used.consumed and device.key not in used.exclusive
        if first_use:
            for consumption in device.spec.get("consumesCounters") or []:
                key = (device.driver, device.pool, consumption.get("counterSet", ""))
                have = self.counter_sets.get(key)
                if have is None:
                    return False, None
                taken = used.counters.get(key, {})
                for name, counter in (consumption.get("counters") or {}).items():
                    need = quantity(counter.get("value"))
                    if taken.get(name, Decimal(0)) + need > have.get(name, Decimal(0)):
                        return False, None
        return True, consumed

    # ------------------------------------------------------------ search
    def allocate(self, claims: list[Mapping[str, Any]], node: str) -> list[dict[str, Any]] | None:
        """Allocations for all `claims` on `node` (in order), or None."""
        slots: list[tuple[int, list[Request]]] = []
        for index, claim in enumerate(claims):
            for alternatives in _requests_of(claim):
                slots.append((index, alternatives))
                for request in alternatives:  # allocator.go newRequestData: the class must exist
                    if request.class_name not in self.classes:
                        raise AllocationError(
                            f"claim {request.claim}, request {request.name}: could not retrieve "
                            f"device class {request.class_name}: deviceclass.resource.k8s.io "
                            f'"{request.class_name}" not found'
                        )
        picks: list[tuple[int, Request, Device, dict | None]] = []

        def constraints_ok() -> bool:
            """matchAttribute: one value among the devices of the named requests;
            distinctAttribute (KEP-5075): no value twice among them; both need the attribute."""
            for index, claim in enumerate(claims):
                for constraint in ((claim.get("spec") or {}).get("devices") or {}).get(
                    "constraints"
                ) or []:
                    attribute = constraint.get("matchAttribute") or constraint.get(
                        "distinctAttribute"
                    )
                    if not attribute:
                        continue
                    names = set(constraint.get("requests") or [])
                    values = []
                    for i, request, device, _ in picks:
                        if i != index or (
                            names and request.parent not in names and request.name not in names
                        ):
                            continue
                        value = device.attribute(attribute)
                        if value is None:
                            return False
                        values.append(value)
                    if constraint.get("matchAttribute") and len(set(values)) > 1:
                        return False
                    if constraint.get("distinctAttribute") and len(set(values)) < len(values):
                        return False
            return True

        def book(used: InUse, device: Device, consumed: dict | None) -> InUse:
            after = used.copy()
            _book(after, device.key, device, "x" if device.multi else None,
                  {k: str(v) for k, v in (consumed or {}).items()})  # fmt: skip
            return after

        def place(slot: int, used: InUse) -> bool:
            if slot == len(slots):
                return True
            index, alternatives = slots[slot]
            for request in alternatives:
                candidates = [d for d in self.devices if self._matches(request, d)]
                if request.mode == "All":
                    if not candidates:
                        continue
                    state, chosen = used, []
                    for device in candidates:
                        ok, consumed = self._fits(request, device, state)
                        if not ok:
                            break
                        chosen.append((index, request, device, consumed))
                        state = book(state, device, consumed)
                    else:
                        picks.extend(chosen)
                        if constraints_ok() and place(slot + 1, state):
                            return True
                        del picks[len(picks) - len(chosen) :]
                    continue
                if pick_count(index, request, candidates, request.count, used, slot):
                    return True
            return False

        def pick_count(
            index: int, request: Request, candidates: list[Device], left: int, used: InUse,
            slot: int, start: int = 0,
        ) -> bool:  # fmt: skip
            if left == 0:
                return place(slot + 1, used)
            for i in range(start, len(candidates)):
                device = candidates[i]
                # one request never takes the same device twice
                if any(p[2].key == device.key and p[0] == index and p[1] is request for p in picks):
                    continue
                ok, consumed = self._fits(request, device, used)
                if not ok:
                    continue
                picks.append((index, request, device, consumed))
                if constraints_ok() and pick_count(
                    index, request, candidates, left - 1, book(used, device, consumed), slot, i + 1
                ):
                    return True
                picks.pop()
            return False

        if not place(0, self.used):
            return None
        allocations = []
        for index, claim in enumerate(claims):
            results = []
            for i, request, device, consumed in picks:
                if i != index:
                    continue
                result: dict[str, Any] = {
                    "request": request.name,
                    "driver": device.driver,
                    "pool": device.pool,
                    "device": device.name,
                }
                if device.multi:
                    result["shareID"] = str(uuid.uuid4())
                    result["consumedCapacity"] = {
                        k: _format(v) for k, v in (consumed or {}).items()
                    }
                results.append(result)
            allocation: dict[str, Any] = {"devices": {"results": results}}
            config = _config(
                claim,
                [self.classes.get(p[1].class_name) for p in picks if p[0] == index],
                picks,
                index,
            )
            if config:
                allocation["devices"]["config"] = config
            allocation["nodeSelector"] = {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            }
            allocations.append(allocation)
        return allocations


def _config(
    claim: Mapping[str, Any], classes: list[Any], picks: list, index: int
) -> list[dict[str, Any]]:
    """The opaque configuration of the classes used (source FromClass) then of the claim
    (FromClaim), as AllocationResult.devices.config records it."""
    out: list[dict[str, Any]] = []
    seen = set()
    for klass in classes:
        if not klass or klass["metadata"]["name"] in seen:
            continue
        seen.add(klass["metadata"]["name"])
        requests = [
            p[1].name
            for p in picks
            if p[0] == index and p[1].class_name == klass["metadata"]["name"]
        ]
        for entry in (klass.get("spec") or {}).get("config") or []:
            out.append({"source": "FromClass", "requests": requests, **entry})
    for entry in ((claim.get("spec") or {}).get("devices") or {}).get("config") or []:
        out.append({"source": "FromClaim", **entry})
    return out


def _format(value: Decimal) -> str:
    """A Quantity as the apiserver prints a canonical binary one (bytes as Mi/Gi where exact)."""
    number = int(value) if value == value.to_integral_value() else None
    if number is None:
        return str(value)
    for suffix, size in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if number and number % size == 0:
            return f"{number // size}{suffix}"
    return str(number)
