"""What capacity reads return: a frozen snapshot of free/total per pool and offer, with its
freshness, and the CONTRACT annotations quotas are counted from."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from ..backends.fit import UNKNOWN, OfferCapacity

__all__ = [
    "GPU_EQUIVALENT_ANNOTATION",
    "UNKNOWN",
    "SERVERNAME_ANNOTATION",
    "USERNAME_ANNOTATION",
    "Capacity",
    "OfferCapacity",
    "parse_gpu_equivalent",
]

GPU_EQUIVALENT_ANNOTATION = "fracspawner.io/gpu-equivalent"
#: kubespawner 7 sets it to the unescaped user name (KubeSpawner._build_common_annotations)
USERNAME_ANNOTATION = "hub.jupyter.org/username"
#: and, for a named server, its name (the admin page's server column)
SERVERNAME_ANNOTATION = "hub.jupyter.org/servername"


@dataclass(frozen=True)
class Capacity:
    """Free/total per pool and offer.

    `stale`: the watches feeding it have lost the API server (since `age_seconds` ago), so
    the counts are the last ones known, not the cluster's now. A stale snapshot is shown as
    such and never used to refuse or admit a spawn on counts (unknown capacity).
    """

    pools: Mapping[str, Mapping[str, OfferCapacity]]
    nodes_seen: int
    stale: bool = False
    age_seconds: float = 0.0

    def get(self, pool: str, spec: str) -> OfferCapacity:
        return self.pools.get(pool, {}).get(spec, UNKNOWN)


def parse_gpu_equivalent(raw: Any) -> Decimal | None:
    """A `fracspawner.io/gpu-equivalent` value as an exact Decimal; None when malformed
    (not a finite number, or negative)."""
    try:
        value = Decimal(str(raw).strip())
    except (InvalidOperation, ValueError, TypeError):
        return None
    if not value.is_finite() or value < 0:
        return None
    return value
