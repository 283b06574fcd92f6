"""Free/total per pool and offer from raw node and pod dicts, counted like each scheduler.

`compute_capacity` is pure (no I/O): the CLI feeds it one list call of each kind, the tests
hand-written dicts. It is the same counting the watches keep up to date event by event
(`LiveCapacity`), fed all at once. Each backend counts its own offers (`Backend.counter`);
docs/capacity.md says how each is counted and where each rule comes from.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from ..k8s.objects import annotations, is_active, meta
from .live import LiveCapacity
from .snapshot import (
    GPU_EQUIVALENT_ANNOTATION,
    UNKNOWN,
    USERNAME_ANNOTATION,
    Capacity,
    OfferCapacity,
    parse_gpu_equivalent,
)

__all__ = [
    "GPU_EQUIVALENT_ANNOTATION",
    "UNKNOWN",
    "USERNAME_ANNOTATION",
    "Capacity",
    "OfferCapacity",
    "compute_capacity",
    "gpu_usage_by_user",
]

log = logging.getLogger(__name__)


def compute_capacity(
    catalog: Any,
    nodes: Iterable[dict[str, Any]],
    pods: Iterable[dict[str, Any]],
    slices: Iterable[dict[str, Any]] = (),
    claims: Iterable[dict[str, Any]] = (),
) -> Capacity:
    """Free/total per pool and offer. Pure: raw API dicts in, a frozen snapshot out
    (ResourceSlices and ResourceClaims for DRA pools)."""
    live = LiveCapacity(catalog)
    live.replace_nodes(nodes)
    live.replace_pods(pods)
    live.replace_slices(slices)
    live.replace_claims(claims)
    return live.snapshot()


def gpu_usage_by_user(pods: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """GPU-equivalents held by each user's active pods (fracspawner's quota currency)."""
    usage: dict[str, float] = {}
    for pod in pods:
        annos = annotations(pod)
        user = annos.get(USERNAME_ANNOTATION)
        if not user or not is_active(pod) or GPU_EQUIVALENT_ANNOTATION not in annos:
            continue
        raw = annos[GPU_EQUIVALENT_ANNOTATION]
        value = parse_gpu_equivalent(raw)
        if value is None:
            log.warning(
                "Pod %s/%s: ignoring malformed %s=%r",
                meta(pod).get("namespace"),
                meta(pod).get("name"),
                GPU_EQUIVALENT_ANNOTATION,
                raw,
            )
        usage[user] = usage.get(user, 0.0) + float(value or 0)
    return usage
