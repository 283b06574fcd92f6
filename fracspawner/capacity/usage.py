"""Who holds which GPU slices, per pool and per server, from the capacity watches' pod records
(or one list of pods): the tables of the admin page and of `fracspawner usage`. Pure: no I/O.

A pod counts for a pool when it carries the CONTRACT label `fracspawner.io/pool`: held once it is
bound to a node (or booked on one by a scheduler extender), waiting before that. Its slice, its
GPU-equivalent and its memory entitlement come from the CONTRACT label and annotations
(`fracspawner.io/gpu`, `fracspawner.io/gpu-equivalent`, `fracspawner.io/gpu-memory-mib`); the
user and server from kubespawner's annotations (`hub.jupyter.org/username`, `.../servername`).

Free, per pool, is the most of the pool one could still hand out, in GPU-equivalents; unknown
when no offer's count is known. Where every offer is a MIG profile, each free MIG device is a
partition of its own, so free is their sum (an idle A100 in its MIG layout reads "1 GPU", not
the largest profile's 6/7). Elsewhere the sizes are cut from the same GPU memory and do not add
up: free is, over the offers, the largest free count times its size (the finest offer usually).
`free_means` says which, in words, where the number is shown (issue 27 #6).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..backends import ANNOTATION_EQUIVALENT, ANNOTATION_MEMORY, LABEL_GPU, LABEL_POOL, plan_slice
from ..model.errors import SliceError
from ..model.slices import ALLOWED_STEPS, parse_slice
from ..model.units import slice_text
from .snapshot import SERVERNAME_ANNOTATION, USERNAME_ANNOTATION, Capacity, parse_gpu_equivalent

__all__ = [
    "Holder",
    "OfferFree",
    "PoolUsage",
    "holders_from_pods",
    "memory_words",
    "pool_usage",
    "slice_words",
]


@dataclass(frozen=True)
class Holder:
    """One pod holding (or waiting for) a GPU slice."""

    user: str
    server: str  # "" for the default server
    pool: str
    gpu: str  # the normalised slice label, e.g. "0.25", "10Gi", "mig-1g.10gb"
    gpu_equivalent: float | None
    memory_limit_mib: int | None
    pod: str  # namespace/name
    node: str | None
    waiting: bool
    since: float | None = None  # unix seconds the server started (the hub's word), if known


@dataclass(frozen=True)
class OfferFree:
    spec: str
    free: int | None
    total: int | None
    gpu_equivalent: float
    label: str = ""  # the picker's words: "1/4", "10 GiB", "MIG 1g.10gb", "2 GPUs"


def offer_label(offer: Any) -> str:
    """An offer as the picker's size list shows it (choice/offers.py size_label's words)."""
    kind = getattr(offer, "kind", "")
    if kind == "fraction":
        return str(offer)
    return slice_text(
        kind,
        memory_mib=getattr(offer, "memory_mib", 0) or 0,
        profile=getattr(offer, "profile", "") or "",
        count=getattr(offer, "count", 0) or 0,
    )


def slice_words(label: str) -> str:
    """A held slice's label in the picker's words ('0.125' -> '1/8', '10Gi' -> '10 GiB',
    'mig-1g.10gb' -> 'MIG 1g.10gb'); the label itself where it is odd. The finest fraction step,
    not the catalog's: these are words for what a pod holds, not a check of what may be asked."""
    try:
        return offer_label(parse_slice(label, step=max(ALLOWED_STEPS)))
    except (SliceError, ValueError):
        return label


def memory_words(mib: float | None) -> str:
    """GPU memory as the admin page and the picker say it: '9.6 GiB', '512 MiB', '?'."""
    if mib is None:
        return "?"
    return f"{mib / 1024:.1f} GiB" if mib >= 1024 else f"{mib:.0f} MiB"


@dataclass
class PoolUsage:
    name: str
    display_name: str
    held: int = 0  # slices (pods) bound to a node
    waiting: int = 0  # slices (pods) not placed yet
    held_gpu: float = 0.0  # GPU-equivalents those held pods carry
    waiting_gpu: float = 0.0
    free_gpu: float | None = None
    offers: list[OfferFree] = field(default_factory=list)
    free_means: str = ""  # what `free_gpu` counts, in words


FREE_MEANS_MIG = "the MIG devices not in use, added up (each is a partition of its own)"
FREE_MEANS_SHARED = (
    "the most that can still be handed out, in the size that fits most "
    "(the sizes are cut from the same GPU memory, so they do not add up)"
)


def _float(raw: Any) -> float | None:
    value = parse_gpu_equivalent(raw) if raw is not None else None
    return None if value is None else float(value)


def _int(raw: Any) -> int | None:
    try:
        value = int(str(raw).strip())
    except (TypeError, ValueError):
        return None
    return value if value >= 0 else None


def holders_from_pods(
    pods: Iterable[Any], started: Mapping[tuple[str, str], float] | None = None
) -> list[Holder]:
    """Every pod with a pool label, as a Holder. `pods` are PodRecords (the watch's) or
    anything with their `key`, `node`, `assumed`, `labels`, `annotations`; `started` maps
    (user, server) to when the hub says the server started."""
    out = []
    for pod in pods:
        labels = pod.labels or {}
        pool = labels.get(LABEL_POOL)
        if not pool:
            continue
        annotations = pod.annotations or {}
        user = annotations.get(USERNAME_ANNOTATION) or ""
        server = annotations.get(SERVERNAME_ANNOTATION) or ""
        placed = pod.node or getattr(pod, "assumed", None)
        out.append(
            Holder(
                user=user,
                server=server,
                pool=pool,
                gpu=labels.get(LABEL_GPU) or "",
                gpu_equivalent=_float(annotations.get(ANNOTATION_EQUIVALENT)),
                memory_limit_mib=_int(annotations.get(ANNOTATION_MEMORY)),
                pod=pod.key,
                node=placed or None,
                waiting=not placed,
                since=(started or {}).get((user, server)),
            )
        )
    out.sort(key=lambda h: (h.pool, h.user, h.server))
    return out


def _offer_sizes(catalog: Any) -> dict[tuple[str, str], float]:
    sizes = {}
    for pool in catalog.pools.values():
        for offer in pool.offers:
            try:
                sizes[(pool.name, str(offer))] = plan_slice(offer, pool, None).gpu_equivalent
            except Exception:  # an offer that cannot be planned counts as unknown
                continue
    return sizes


_SIZES: dict[int, tuple[Any, dict[tuple[str, str], float]]] = {}


def offer_sizes(catalog: Any) -> dict[tuple[str, str], float]:
    """(pool, offer) -> GPU-equivalents of one slice; memoized per catalog object."""
    cached = _SIZES.get(id(catalog))
    if cached is None or cached[0] is not catalog:
        cached = _SIZES[id(catalog)] = (catalog, _offer_sizes(catalog))
    return cached[1]


def pool_usage(
    catalog: Any, capacity: Capacity | None, holders: Iterable[Holder]
) -> list[PoolUsage]:
    """Per catalog pool: slices held and waiting, their GPU-equivalents, and what is free."""
    sizes = offer_sizes(catalog)
    pools = {
        name: PoolUsage(name, getattr(pool, "display_name", name) or name)
        for name, pool in catalog.pools.items()
    }
    for holder in holders:
        usage = pools.get(holder.pool)
        if usage is None:  # a pool the catalog no longer has
            usage = pools[holder.pool] = PoolUsage(holder.pool, holder.pool)
        if holder.waiting:
            usage.waiting += 1
            usage.waiting_gpu += holder.gpu_equivalent or 0.0
        else:
            usage.held += 1
            usage.held_gpu += holder.gpu_equivalent or 0.0
    for name, pool in catalog.pools.items():
        usage = pools[name]
        free_known = []
        # MIG made on demand (DRA's dynamic MIG) is not a layout of partitions: each profile's
        # count is what the same GPUs' counters could still make, so they do not add up
        dynamic = pool.backend == "dra" and (pool.options or {}).get("mig") == "dynamic"
        partitions = (
            bool(pool.offers)
            and not dynamic
            and all(getattr(offer, "kind", "") == "mig" for offer in pool.offers)
        )
        usage.free_means = FREE_MEANS_MIG if partitions else FREE_MEANS_SHARED
        for offer in pool.offers:
            spec = str(offer)
            counts = capacity.get(name, spec) if capacity is not None else None
            size = sizes.get((name, spec), 0.0)
            free = None if counts is None else counts.free
            total = None if counts is None else counts.total
            usage.offers.append(OfferFree(spec, free, total, size, offer_label(offer)))
            if free is not None and size:
                free_known.append(free * size)
        if free_known:
            usage.free_gpu = round(sum(free_known) if partitions else max(free_known), 6)
        usage.held_gpu = round(usage.held_gpu, 6)
        usage.waiting_gpu = round(usage.waiting_gpu, 6)
    return list(pools.values())
