"""Free/total per pool and offer from raw node and pod dicts, counted like each scheduler.

`compute_capacity` is pure (no I/O): the watcher feeds it its caches, the CLI one list call
of each kind, the tests hand-written dicts. docs/capacity.md says how each backend is counted
and where each rule comes from.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from types import MappingProxyType
from typing import Any

from . import capacity_hami as hami
from .capacity_kube import (
    allocatable,
    annotations,
    bound_node,
    extended_requests,
    is_active,
    is_ready,
    labels,
    meta,
    normalise_toleration,
    quantity,
    quantity_int,
    selector_matches,
    taints_tolerated,
)

log = logging.getLogger(__name__)

GPU_EQUIVALENT_ANNOTATION = "fracspawner.io/gpu-equivalent"
#: kubespawner 7 sets it to the unescaped user name (KubeSpawner._build_common_annotations)
USERNAME_ANNOTATION = "hub.jupyter.org/username"
# Run:ai / KAI (kai-scheduler pkg/common/constants/constants.go)
RUNAI_FRACTION = "gpu-fraction"
RUNAI_MEMORY = "gpu-memory"
RUNAI_NUM_DEVICES = "gpu-fraction-num-devices"
RUNAI_GPU_GROUP = "runai-gpu-group"
# ClearML enterprise injector (allegroai clearml-fractional-gpu README)
CLEARML_FRACTION = "clearml-injector/fraction"
NVIDIA_GPU = "nvidia.com/gpu"
GFD_GPU_COUNT = "nvidia.com/gpu.count"
GFD_GPU_MEMORY = "nvidia.com/gpu.memory"
GFD_GPU_REPLICAS = "nvidia.com/gpu.replicas"
#: the ClearML injector's finest step is 1/16 (0.0625); count in sixteenths to stay exact
_CLEARML_UNITS = 16
_EPS = 1e-9


@dataclass(frozen=True)
class OfferCapacity:
    free: int | None  # None: unknown
    total: int | None
    note: str = ""


UNKNOWN = OfferCapacity(None, None)


@dataclass(frozen=True)
class Capacity:
    pools: Mapping[str, Mapping[str, OfferCapacity]]
    nodes_seen: int

    def get(self, pool: str, spec: str) -> OfferCapacity:
        return self.pools.get(pool, {}).get(spec, UNKNOWN)


# --------------------------------------------------------------------------- cluster index
@dataclass
class _Index:
    """Nodes and the pods holding resources on them, with per-node tallies computed once."""

    nodes: list[dict[str, Any]]
    pods_by_node: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: HAMi books a pod on a node before binding (annotation hami.io/vgpu-node)
    assumed_by_node: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    _ready: list[dict[str, Any]] | None = None
    _serving: dict[Any, list[dict[str, Any]]] = field(default_factory=dict)
    _requests: dict[str, dict[str, Decimal]] = field(default_factory=dict)
    _family: dict[tuple[str, str], Any] = field(default_factory=dict)

    @classmethod
    def build(cls, nodes: Iterable[dict[str, Any]], pods: Iterable[dict[str, Any]]) -> _Index:
        index = cls(nodes=list(nodes))
        for pod in pods:
            if not is_active(pod):
                continue
            name = bound_node(pod)
            if name:
                index.pods_by_node.setdefault(name, []).append(pod)
            else:
                assumed = annotations(pod).get(hami.ASSIGNED_NODE_ANNOTATION)
                if assumed:
                    index.assumed_by_node.setdefault(assumed, []).append(pod)
        return index

    def pods_on(self, node: Mapping[str, Any]) -> list[dict[str, Any]]:
        return self.pods_by_node.get(meta(node).get("name", ""), [])

    def ready(self) -> list[dict[str, Any]]:
        if self._ready is None:
            self._ready = [n for n in self.nodes if is_ready(n)]
        return self._ready

    def serving(self, selector: Mapping[str, Any], tolerations: list[dict[str, Any]]):
        key = (tuple(sorted(selector.items())), repr(tolerations))
        if key not in self._serving:
            self._serving[key] = [
                n
                for n in self.ready()
                if selector_matches(labels(n), selector) and taints_tolerated(n, tolerations)
            ]
        return self._serving[key]

    def requests_on(self, node: Mapping[str, Any]) -> dict[str, Decimal]:
        """Extended resources requested by the pods bound to `node`."""
        name = meta(node).get("name", "")
        if name not in self._requests:
            total: dict[str, Decimal] = {}
            for pod in self.pods_on(node):
                for res, q in extended_requests(pod).items():
                    total[res] = total.get(res, Decimal(0)) + q
            self._requests[name] = total
        return self._requests[name]

    def per_node(self, family: str, node: Mapping[str, Any], build: Callable[[], Any]) -> Any:
        key = (family, meta(node).get("name", ""))
        if key not in self._family:
            self._family[key] = build()
        return self._family[key]


# --------------------------------------------------------------------------- counters
@dataclass(frozen=True)
class _Offer:
    """One offer of one pool, with the plan fracspawner would apply for it."""

    pool: Any
    spec: str
    plan: Any
    nodes: list[dict[str, Any]]


def _extended(amounts: Mapping[str, Any]) -> dict[str, Decimal]:
    out = {}
    for name, value in amounts.items():
        q = quantity(value)
        if "/" in name and q is not None and q > 0:
            out[name] = q
    return out


def count_resources(offer: _Offer, index: _Index) -> OfferCapacity:
    """Allocatable of each resource the plan asks for, minus what bound pods request:
    kube-scheduler's NodeResourcesFit. Serves MIG, time-slicing, MPS, GKE, whole GPUs,
    Volcano and ClearML images (whatever the plan puts in limits)."""
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
    note = "node totals, not per-device fit" if offer.pool.backend == "volcano" else ""
    return OfferCapacity(min(free, total), total, note)


def _hami_node(node: Mapping[str, Any], index: _Index) -> hami.NodeDevices | None:
    devices = hami.parse_node_devices(annotations(node).get(hami.REGISTER_ANNOTATION))
    if devices is None:
        return None
    state = hami.NodeDevices(devices=devices)
    name = meta(node).get("name", "")
    for pod in [*index.pods_on(node), *index.assumed_by_node.get(name, [])]:
        allocated = hami.parse_pod_devices(annotations(pod).get(hami.ALLOCATED_ANNOTATION))
        if allocated:
            hami.charge_allocation(state, allocated)
            continue
        req = hami.request_from_resources(extended_requests(pod), annotations(pod))
        if req is not None:
            hami.charge_estimate(state, req)
    return state


def count_hami(offer: _Offer, index: _Index) -> OfferCapacity:
    req = hami.request_from_resources(offer.plan.limits, offer.plan.annotations)
    if req is None:
        return OfferCapacity(None, None, f"the plan requests no {hami.RESOURCE_COUNT}")
    free = total = seen = 0
    estimated = False
    for node in offer.nodes:
        state = index.per_node("hami", node, lambda node=node: _hami_node(node, index))
        if state is None:
            continue
        seen += 1
        estimated = estimated or state.estimated
        free += hami.node_tasks(state, req)
        total += hami.node_total(state, req)
    if not seen:
        return OfferCapacity(None, None, f"no matching node has {hami.REGISTER_ANNOTATION}")
    note = "HAMi per-device fit" + (", some placements estimated" if estimated else "")
    return OfferCapacity(min(free, total), total, note)


def _node_gpus(node: Mapping[str, Any]) -> int | None:
    """Physical GPUs: GFD's gpu.count label, else allocatable nvidia.com/gpu per replica."""
    count = quantity_int(labels(node).get(GFD_GPU_COUNT))
    if count is not None:
        return count
    alloc = quantity_int(allocatable(node).get(NVIDIA_GPU))
    if alloc is None:
        return None
    replicas = quantity_int(labels(node).get(GFD_GPU_REPLICAS)) or 1
    return alloc // max(replicas, 1)


def _gpu_memory(node: Mapping[str, Any], pool: Any) -> int | None:
    mem = quantity_int(labels(node).get(GFD_GPU_MEMORY))
    return mem if mem else getattr(getattr(pool, "gpu", None), "memory_mib", None)


def _runai_fraction(annos: Mapping[str, str], gpu_mem: int | None) -> float | None:
    if RUNAI_FRACTION in annos:
        try:
            return float(annos[RUNAI_FRACTION])
        except ValueError:
            return None
    if RUNAI_MEMORY in annos and gpu_mem:
        mem = quantity_int(annos[RUNAI_MEMORY])
        return None if mem is None else min(mem / gpu_mem, 1.0)
    return None


@dataclass
class _SharedGpus:
    gpus: int
    whole_used: int
    groups: dict[str, float]  # GPU sharing group -> fraction used

    def fits(self, fraction: float) -> list[int]:
        """Tasks of `fraction` each GPU still takes: untouched GPUs first, then groups."""
        untouched = max(self.gpus - self.whole_used - len(self.groups), 0)
        per_gpu = math.floor(1 / fraction + _EPS)
        return [per_gpu] * untouched + [
            max(math.floor((1 - used) / fraction + _EPS), 0) for used in self.groups.values()
        ]


def _runai_node(node: Mapping[str, Any], pool: Any, index: _Index) -> _SharedGpus | None:
    """Run:ai/KAI keep fractions off the resource books: a reservation pod holds the GPU
    (nvidia.com/gpu: 1, label runai-gpu-group) and fractional pods share its group label."""
    gpus = _node_gpus(node)
    if gpus is None:
        return None
    gpu_mem = _gpu_memory(node, pool)
    whole = 0
    groups: dict[str, float] = {}
    for pod in index.pods_on(node):
        pod_labels, annos = labels(pod), annotations(pod)
        group_keys = [
            k for k in pod_labels if k == RUNAI_GPU_GROUP or k.startswith(RUNAI_GPU_GROUP + "/")
        ]
        fraction = _runai_fraction(annos, gpu_mem)
        names = [pod_labels[k] for k in group_keys]
        if fraction is not None and not names:
            # not placed in a group yet: count it alone on its own GPUs, the safe side
            devices = quantity_int(annos.get(RUNAI_NUM_DEVICES)) or 1
            uid = meta(pod).get("uid") or meta(pod).get("name", "")
            names = [f"{uid}/{i}" for i in range(devices)]
        if names:
            for name in names:
                groups[name] = groups.get(name, 0.0) + (fraction or 0.0)
            continue
        whole += quantity_int(extended_requests(pod).get(NVIDIA_GPU, 0)) or 0
    return _SharedGpus(gpus=gpus, whole_used=whole, groups=groups)


def count_runai(offer: _Offer, index: _Index) -> OfferCapacity:
    annos = offer.plan.annotations
    devices = quantity_int(annos.get(RUNAI_NUM_DEVICES)) or 1
    whole = quantity_int(offer.plan.limits.get(NVIDIA_GPU, 0)) or 0
    if RUNAI_FRACTION not in annos and RUNAI_MEMORY not in annos and whole <= 0:
        return OfferCapacity(None, None, "the plan asks for no GPU")
    free = total = seen = 0
    for node in offer.nodes:
        state = index.per_node(
            "runai", node, lambda node=node: _runai_node(node, offer.pool, index)
        )
        if state is None:
            continue
        seen += 1
        if RUNAI_FRACTION in annos or RUNAI_MEMORY in annos:
            fraction = _runai_fraction(annos, _gpu_memory(node, offer.pool))
            if not fraction or fraction <= 0:
                continue
            free += hami.tasks_on_node(state.fits(fraction), devices)
            total += hami.tasks_on_node([math.floor(1 / fraction + _EPS)] * state.gpus, devices)
        else:
            untouched = max(state.gpus - state.whole_used - len(state.groups), 0)
            free += untouched // whole
            total += state.gpus // whole
    if not seen:
        return OfferCapacity(None, None, "no matching node reports its GPU count")
    return OfferCapacity(min(free, total), total, "GPU sharing groups from pod labels")


def _clearml_units(value: str | None) -> int | None:
    try:
        return round(float(value) * _CLEARML_UNITS) if value is not None else None
    except ValueError:
        return None


def _clearml_node(node: Mapping[str, Any], index: _Index) -> tuple[int, int] | None:
    """(capacity, used) in sixteenths of a GPU on one node."""
    gpus = _node_gpus(node)
    if gpus is None:
        return None
    replicas = quantity_int(labels(node).get(GFD_GPU_REPLICAS)) or 1
    used = 0
    for pod in index.pods_on(node):
        units = _clearml_units(labels(pod).get(CLEARML_FRACTION))
        if units is None:
            # a plain time-sliced pod: each replica is 1/replicas of a GPU
            replicas_held = extended_requests(pod).get(NVIDIA_GPU, Decimal(0))
            units = math.ceil(replicas_held * _CLEARML_UNITS / replicas)
        used += units
    return gpus * _CLEARML_UNITS, used


def count_clearml_injector(offer: _Offer, index: _Index) -> OfferCapacity:
    need = _clearml_units(offer.plan.labels.get(CLEARML_FRACTION))
    if not need or need <= 0:
        return OfferCapacity(None, None, f"the plan has no {CLEARML_FRACTION} label")
    free = total = seen = 0
    for node in offer.nodes:
        state = index.per_node("clearml", node, lambda node=node: _clearml_node(node, index))
        if state is None:
            continue
        seen += 1
        capacity, used = state
        total += capacity // need
        free += max(capacity - used, 0) // need
    if not seen:
        return OfferCapacity(None, None, "no matching node reports its GPU count")
    return OfferCapacity(min(free, total), total, "ClearML fractions against node GPU count")


COUNTERS: dict[str, Callable[[_Offer, _Index], OfferCapacity]] = {
    "hami": count_hami,
    "runai": count_runai,
    "kai": count_runai,
    "clearml-injector": count_clearml_injector,
}


# --------------------------------------------------------------------------- entry points
def _pool_capacity(pool: Any, index: _Index) -> dict[str, OfferCapacity]:
    from .backends import plan_slice

    counter = COUNTERS.get(pool.backend, count_resources)
    pool_selector = dict(getattr(pool, "node_selector", None) or {})
    pool_tolerations = [normalise_toleration(t) for t in getattr(pool, "tolerations", ()) or ()]
    out: dict[str, OfferCapacity] = {}
    for offer in pool.offers:
        spec = str(offer)
        try:
            plan = plan_slice(offer, pool, None)
        except Exception as exc:  # a broken offer shows as unknown, never breaks the form
            log.warning("Cannot plan %s on pool %s for capacity: %s", spec, pool.name, exc)
            out[spec] = OfferCapacity(None, None, "cannot plan this offer")
            continue
        selector = {**pool_selector, **dict(plan.node_selector or {})}
        tolerations = [
            *pool_tolerations,
            *(normalise_toleration(t) for t in plan.tolerations or ()),
        ]
        nodes = index.serving(selector, tolerations)
        if not nodes:
            out[spec] = OfferCapacity(0, 0, "no ready node matches this pool")
            continue
        out[spec] = counter(_Offer(pool=pool, spec=spec, plan=plan, nodes=nodes), index)
    return out


def compute_capacity(
    catalog: Any, nodes: Iterable[dict[str, Any]], pods: Iterable[dict[str, Any]]
) -> Capacity:
    """Free/total per pool and offer. Pure: raw API dicts in, a frozen snapshot out."""
    index = _Index.build(nodes, pods)
    pools: dict[str, Mapping[str, OfferCapacity]] = {}
    for name, pool in catalog.pools.items():
        if not index.nodes:
            pools[name] = MappingProxyType(
                {str(o): OfferCapacity(None, None, "no nodes visible") for o in pool.offers}
            )
            continue
        pools[name] = MappingProxyType(_pool_capacity(pool, index))
    return Capacity(pools=MappingProxyType(pools), nodes_seen=len(index.nodes))


def gpu_usage_by_user(pods: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """GPU-equivalents held by each user's active pods (fracspawner's quota currency)."""
    usage: dict[str, float] = {}
    for pod in pods:
        annos = annotations(pod)
        user = annos.get(USERNAME_ANNOTATION)
        if not user or not is_active(pod) or GPU_EQUIVALENT_ANNOTATION not in annos:
            continue
        raw = annos[GPU_EQUIVALENT_ANNOTATION]
        try:
            value = float(raw)
            if not math.isfinite(value) or value < 0:
                raise ValueError(raw)
        except (TypeError, ValueError):
            log.warning(
                "Pod %s/%s: ignoring malformed %s=%r",
                meta(pod).get("namespace"),
                meta(pod).get("name"),
                GPU_EQUIVALENT_ANNOTATION,
                raw,
            )
            value = 0.0
        usage[user] = usage.get(user, 0.0) + value
    return usage
