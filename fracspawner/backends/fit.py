"""Counting what still fits: the result type and the counting every backend can share.

A backend's `count(offer, index)` answers "how many more of this offer fit, out of how many"
for the nodes serving the offer. `count_resources` is kube-scheduler's NodeResourcesFit (serves
every backend whose plan puts a countable extended resource in limits); backends whose scheduler
books GPUs some other way (HAMi per device, Run:ai sharing groups, ClearML labels) count
themselves with the helpers below. docs/capacity.md says where each rule comes from.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from ..k8s.objects import allocatable, labels, quantity, quantity_int

if TYPE_CHECKING:
    from ..k8s.index import ClusterIndex
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


UNKNOWN = OfferCapacity(None, None)


@dataclass(frozen=True)
class CountedOffer:
    """One offer of one pool, with the plan fracspawner would apply and the nodes serving it."""

    pool: Any
    spec: str
    plan: PodPlan
    nodes: list[dict[str, Any]]


def _extended(amounts: Mapping[str, Any]) -> dict[str, Decimal]:
    out = {}
    for name, value in amounts.items():
        q = quantity(value)
        if "/" in name and q is not None and q > 0:
            out[name] = q
    return out


def count_resources(offer: CountedOffer, index: ClusterIndex, note: str = "") -> OfferCapacity:
    """Allocatable of each resource the plan asks for, minus what bound pods request:
    kube-scheduler's NodeResourcesFit."""
    need = _extended(offer.plan.limits)
    if not need:
        return OfferCapacity(None, None, "the plan requests no countable resource")
    free = total = seen = 0
    for node in offer.nodes:
        alloc = allocatable(node)
        if not any(res in alloc for res in need):
            continue
        seen += 1
        used = index.requests_on(node)
        node_total = node_free = None
        for res, amount in need.items():
            have = quantity(alloc.get(res, 0)) or Decimal(0)
            left = max(have - used.get(res, Decimal(0)), Decimal(0))
            t, f = math.floor(have / amount), math.floor(left / amount)
            node_total = t if node_total is None else min(node_total, t)
            node_free = f if node_free is None else min(node_free, f)
        total += node_total or 0
        free += node_free or 0
    if not seen:
        return OfferCapacity(None, None, f"no matching node publishes {', '.join(sorted(need))}")
    return OfferCapacity(min(free, total), total, note)


def tasks_on_node(per_device: Iterable[int], nums: int) -> int:
    """Pods needing `nums` distinct devices each, given how many tasks each device takes."""
    fits = [f for f in per_device if f > 0]
    if nums <= 1:
        return sum(fits)
    pods = sum(fits) // nums
    while pods > 0 and sum(min(f, pods) for f in fits) < nums * pods:
        pods -= 1
    return pods


def node_gpus(node: Mapping[str, Any]) -> int | None:
    """Physical GPUs: GFD's gpu.count label, else allocatable nvidia.com/gpu per replica."""
    count = quantity_int(labels(node).get(GFD_GPU_COUNT))
    if count is not None:
        return count
    alloc = quantity_int(allocatable(node).get(NVIDIA_GPU))
    if alloc is None:
        return None
    replicas = quantity_int(labels(node).get(GFD_GPU_REPLICAS)) or 1
    return alloc // max(replicas, 1)


def node_gpu_memory(node: Mapping[str, Any], pool: Any) -> int | None:
    """MiB per GPU: GFD's gpu.memory label, else the pool's GPU model."""
    mem = quantity_int(labels(node).get(GFD_GPU_MEMORY))
    return mem if mem else getattr(getattr(pool, "gpu", None), "memory_mib", None)
