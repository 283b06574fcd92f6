"""Counting what still fits: the result type and the counting every backend can share.

A backend's `counter(offer)` says how one offer is counted: `count_node(slot)` gives one
node's contribution (free and total units there, from the node and the pods on it) and
`result(tally)` turns the sums over the nodes serving the offer into an `OfferCapacity`. The
capacity layer keeps those sums and, after a watch event, recounts only the nodes it touched
(fracspawner.capacity.live), so a contribution must depend on its node and that node's pods
only. `ResourceFit` is kube-scheduler's NodeResourcesFit (serves every backend whose plan puts
a countable extended resource in limits); backends whose scheduler books GPUs some other way
(HAMi per device, Run:ai sharing groups, ClearML labels) count themselves with the helpers
below. docs/capacity.md says where each rule comes from.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from ..k8s.objects import quantity, quantity_int

if TYPE_CHECKING:
    from ..k8s.index import NodeSlot
    from ..k8s.records import NodeRecord
    from .base import PodPlan

NVIDIA_GPU = "nvidia.com/gpu"
# GPU Feature Discovery's node labels (NVIDIA/k8s-device-plugin docs/gpu-feature-discovery)
GFD_GPU_COUNT = "nvidia.com/gpu.count"
GFD_GPU_MEMORY = "nvidia.com/gpu.memory"
GFD_GPU_REPLICAS = "nvidia.com/gpu.replicas"
EPS = 1e-9


@dataclass(frozen=True)
class OfferCapacity:
    free: int | None  # None: unknown
    total: int | None
    note: str = ""
    #: slices (claims, pods) holding the devices that serve it, where the count knows: with
    #: slices of several sizes, one may take the room of many (None: not counted)
    held: int | None = None
    #: ready nodes serve it, and none publishes what it is counted from (the GPU resource in
    #: allocatable, HAMi's registration, DRA ResourceSlices): the device plugin or DRA driver
    #: is not running there. Free and total are then unknown, but no GPU can be had
    unpublished: bool = False
    #: set where ready nodes serve it and none offers a unit (total 0, or `unpublished`), and
    #: no other node of the pool is on its way (joined, not Ready yet): the Unix time the
    #: newest of those nodes became Ready (0.0: unknown), as a node's GPUs register minutes
    #: after (driver, device plugin). None elsewhere: no node at all serves it (an autoscaled
    #: pool at zero: the autoscaler adds one for a pending pod), or the counts say otherwise
    unoffered_since: float | None = None


UNKNOWN = OfferCapacity(None, None)


@dataclass(frozen=True)
class CountedOffer:
    """One offer of one pool, with the plan fracspawner would apply."""

    pool: Any
    spec: str
    plan: PodPlan


@dataclass(frozen=True)
class NodeCount:
    """One node's contribution to an offer: units free and units in all there."""

    free: int
    total: int
    #: some pods' placement on devices was guessed (HAMi pods without its annotation)
    estimated: bool = False
    #: slices holding this node's devices that serve the offer (None: not counted)
    held: int | None = None


#: a node's count that could not be read (its registration in a form not understood, or the
#: counting failed): unlike None (the node publishes nothing), it says nothing either way
UNREADABLE = NodeCount(0, 0)


@dataclass
class Tally:
    """Sums over the nodes serving one offer (kept incrementally by the capacity layer)."""

    serving: int = 0  # ready nodes matching the offer's selector and tolerating its taints
    seen: int = 0  # of those, nodes that said something (count_node gave a NodeCount)
    free: int = 0
    total: int = 0
    estimated: int = 0
    held: int = 0
    held_counted: int = 0  # nodes whose count said what is held
    unreadable: int = 0  # nodes whose count could not be read (`UNREADABLE`)

    def add(self, count: NodeCount | None, sign: int = 1) -> None:
        """Add (sign 1) or take away (sign -1) one serving node's contribution."""
        self.serving += sign
        if count is UNREADABLE:
            self.unreadable += sign
        elif count is not None:
            self.seen += sign
            self.free += sign * count.free
            self.total += sign * count.total
            self.estimated += sign * int(count.estimated)
            if count.held is not None:
                self.held += sign * count.held
                self.held_counted += sign


class OfferCounter:
    """How one offer is counted. `count_node` must read only `slot` (its node and pods)."""

    def count_node(self, slot: NodeSlot) -> NodeCount | None:
        """This node's contribution, or None when it says nothing about this offer."""
        return None

    def result(self, tally: Tally) -> OfferCapacity:
        raise NotImplementedError


class NotCountable(OfferCounter):
    """An offer whose plan asks for nothing this technology's books show: always unknown."""

    def __init__(self, note: str) -> None:
        self.note = note

    def result(self, tally: Tally) -> OfferCapacity:
        return OfferCapacity(None, None, self.note)


class SummedCounter(OfferCounter):
    """Free and total summed over the nodes serving the offer; unknown when none said
    anything (`unseen` says why)."""

    unseen: str = "no matching node reports its GPUs"
    note: str = ""

    def note_for(self, tally: Tally) -> str:
        return self.note

    def result(self, tally: Tally) -> OfferCapacity:
        if not tally.seen:  # `result` runs only where ready nodes serve the offer
            # a node whose count could not be read may well offer GPUs: unknown, not none
            return OfferCapacity(None, None, self.unseen, unpublished=not tally.unreadable)
        held = tally.held if tally.held_counted == tally.seen else None
        free = min(tally.free, tally.total)
        return OfferCapacity(free, tally.total, self.note_for(tally), held=held)


def _extended(amounts: Mapping[str, Any]) -> dict[str, Decimal]:
    out = {}
    for name, value in amounts.items():
        q = quantity(value)
        if "/" in name and q is not None and q > 0:
            out[name] = q
    return out


class ResourceFit(SummedCounter):
    """Allocatable of each resource the plan asks for, minus what bound pods request:
    kube-scheduler's NodeResourcesFit."""

    def __init__(self, need: Mapping[str, Decimal], note: str = "") -> None:
        self.need = dict(need)
        self.note = note
        self.unseen = f"no matching node publishes {', '.join(sorted(need))}"

    def count_node(self, slot: NodeSlot) -> NodeCount | None:
        assert slot.node is not None
        alloc = slot.node.allocatable
        if not any(res in alloc for res in self.need):
            return None
        used = slot.requested()
        node_total = node_free = None
        for res, amount in self.need.items():
            have = alloc.get(res) or Decimal(0)
            left = max(have - used.get(res, Decimal(0)), Decimal(0))
            t, f = math.floor(have / amount), math.floor(left / amount)
            node_total = t if node_total is None else min(node_total, t)
            node_free = f if node_free is None else min(node_free, f)
        return NodeCount(node_free or 0, node_total or 0)


def count_resources(offer: CountedOffer, note: str = "") -> OfferCounter:
    """The NodeResourcesFit counter for what the offer's plan puts in limits."""
    need = _extended(offer.plan.limits)
    if not need:
        return NotCountable("the plan requests no countable resource")
    return ResourceFit(need, note)


def tasks_on_node(per_device: Iterable[int], nums: int) -> int:
    """Pods needing `nums` distinct devices each, given how many tasks each device takes."""
    fits = [f for f in per_device if f > 0]
    if nums <= 1:
        return sum(fits)
    pods = sum(fits) // nums
    while pods > 0 and sum(min(f, pods) for f in fits) < nums * pods:
        pods -= 1
    return pods


def node_gpus(node: NodeRecord) -> int | None:
    """Physical GPUs: GFD's gpu.count label, else allocatable nvidia.com/gpu per replica."""
    count = quantity_int(node.labels.get(GFD_GPU_COUNT))
    if count is not None:
        return count
    alloc = node.allocatable.get(NVIDIA_GPU)
    if alloc is None:
        return None
    replicas = quantity_int(node.labels.get(GFD_GPU_REPLICAS)) or 1
    return math.floor(alloc) // max(replicas, 1)


def node_gpu_memory(node: NodeRecord, pool: Any) -> int | None:
    """MiB per GPU: GFD's gpu.memory label, else what the pool's GPU model reports (NVML)."""
    mem = quantity_int(node.labels.get(GFD_GPU_MEMORY))
    return mem if mem else getattr(getattr(pool, "gpu", None), "device_memory_mib", None)
