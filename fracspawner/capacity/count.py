"""Free/total per pool and offer from raw node and pod dicts, counted like each scheduler.

`compute_capacity` is pure (no I/O): the watcher feeds it its caches, the CLI one list call
of each kind, the tests hand-written dicts. Each backend counts its own offers
(`Backend.count`); docs/capacity.md says how each is counted and where each rule comes from.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from ..backends import get_backend, plan_slice
from ..backends.fit import UNKNOWN, CountedOffer, OfferCapacity
from ..k8s.index import ClusterIndex
from ..k8s.objects import annotations, is_active, meta, normalise_toleration

__all__ = ["UNKNOWN", "Capacity", "OfferCapacity", "compute_capacity", "gpu_usage_by_user"]

log = logging.getLogger(__name__)

GPU_EQUIVALENT_ANNOTATION = "fracspawner.io/gpu-equivalent"
#: kubespawner 7 sets it to the unescaped user name (KubeSpawner._build_common_annotations)
USERNAME_ANNOTATION = "hub.jupyter.org/username"


@dataclass(frozen=True)
class Capacity:
    pools: Mapping[str, Mapping[str, OfferCapacity]]
    nodes_seen: int

    def get(self, pool: str, spec: str) -> OfferCapacity:
        return self.pools.get(pool, {}).get(spec, UNKNOWN)


# --------------------------------------------------------------------------- entry points
def _pool_capacity(pool: Any, index: ClusterIndex) -> dict[str, OfferCapacity]:
    backend = get_backend(pool.backend)
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
        out[spec] = backend.count(CountedOffer(pool=pool, spec=spec, plan=plan, nodes=nodes), index)
    return out


def compute_capacity(
    catalog: Any, nodes: Iterable[dict[str, Any]], pods: Iterable[dict[str, Any]]
) -> Capacity:
    """Free/total per pool and offer. Pure: raw API dicts in, a frozen snapshot out."""
    index = ClusterIndex.build(nodes, pods)
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
