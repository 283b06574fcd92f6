"""What a DRA claim request takes of a consumable-shares device, and whether it is an offer.

Pure. A request on a pool whose nodes run NVIDIA's DRA driver with `--consumable-shares`
consumes, per device, what the scheduler's allocator computes from the device's capacity
request policies, not what the request names:
- the driver's policies (kubernetes-sigs/dra-driver-nvidia-gpu cmd/gpu-kubelet-plugin/
  consumable_shares.go `applyConsumableShares`): `memory` mode: memory {default: all of it,
  validRange min 1Mi, step 1Mi}; `unlimited`: memory {default 0, min 0, step 1Mi}; N shares:
  memory as unlimited, plus `shares` {value N, default 1, min 1, step 1};
- the allocator (kubernetes staging/src/k8s.io/dynamic-resource-allocation/structured/
  internal/incubating/consumable_capacity.go `calculateConsumedCapacity`): a capacity the
  request does not name consumes the policy's default; a named one is rounded up to the
  validRange's min, then up to a whole step from min (`roundUpRange`); above max, or a
  capacity the device does not have, and the device cannot be allocated.
So on a shares pool `memory: 1Mi` takes a whole share (1/N of the GPU), and on a memory pool it
books 1Mi of a GPU that nothing limits it to at run time. fracspawner counts a request as the
offer it matches (as the hub counts that offer), and a size the pool does not offer as the
next offer up (the whole GPU above the largest); the webhook refuses such sizes outright.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import TYPE_CHECKING

from ..k8s.objects import quantity
from .base import option

if TYPE_CHECKING:
    from ..model.catalog import Pool

MIB = 1024 * 1024
SHARING_POOLS = ("memory", "shares", "unlimited")


@dataclass(frozen=True)
class Taken:
    """What one request takes of one device: shares and MiB (the allocator's amounts)."""

    shares: int
    memory_mib: int

    def fraction(self, pool: Pool) -> Fraction:
        """The larger of its share of the device's shares and of its memory."""
        device = pool.gpu.device_memory_mib
        part = Fraction(self.memory_mib, device)
        if _sharing(pool) == "shares":
            part = max(part, Fraction(self.shares, int(option(pool, "shares"))))
        return min(part, Fraction(1))


@dataclass(frozen=True)
class OfferSize:
    words: str  # "shares: 1 (1/8 GPU)"
    taken: Taken
    gpu_equivalent: float  # per device, as the hub counts the offer


def _sharing(pool: Pool) -> str:
    return str(option(pool, "sharing", "none"))


def taken(pool: Pool, requests: Mapping[str, Decimal]) -> Taken | None:
    """What a request naming `requests` (capacity -> amount) takes of one device of a sharing
    pool; None where no device of the pool can be allocated to it."""
    sharing = _sharing(pool)
    device = pool.gpu.device_memory_mib
    names = set(requests)
    if names - ({"memory", "shares"} if sharing == "shares" else {"memory"}):
        return None  # "some requested capacity has not been defined"
    if "memory" in requests:
        mib = math.ceil(requests["memory"] / MIB)
        mib = max(mib, 1) if sharing == "memory" else max(mib, 0)
    else:
        mib = device if sharing == "memory" else 0
    shares = 0
    if sharing == "shares":
        shares = max(math.ceil(requests["shares"]), 1) if "shares" in requests else 1
        if shares > int(option(pool, "shares")):
            return None
    if mib > device:
        return None
    return Taken(shares, mib)


def _gpu_words(value: float) -> str:
    f = Fraction(value).limit_denominator(64)
    return f"{f} GPU" if abs(float(f) - value) < 1e-9 else f"{value:g} GPU"


def offer_sizes(pool: Pool) -> list[OfferSize]:
    """The pool's fraction, memory and whole-GPU offers as claim sizes, smallest first."""
    from . import plan_slice
    from .dra import DraBackend

    backend = DraBackend()
    out = []
    for offer in pool.offers:
        if offer.kind not in ("fraction", "memory", "whole"):
            continue
        request, _ = backend.request(offer, pool)
        capacity = (request["exactly"].get("capacity") or {}).get("requests") or {}
        amounts = {k: quantity(v) for k, v in capacity.items()}
        size = taken(pool, {k: v for k, v in amounts.items() if v is not None})
        if size is None:
            continue
        per_device = plan_slice(offer, pool, None).gpu_equivalent / (offer.count or 1)
        named = ", ".join(f"{k}: {v}" for k, v in sorted(capacity.items())) or "no capacity"
        out.append(OfferSize(f"{named} ({_gpu_words(per_device)})", size, per_device))
    return sorted(out, key=lambda o: (o.gpu_equivalent, o.words))


def request_size(pool: Pool, requests: Mapping[str, Decimal]) -> tuple[float, bool]:
    """(GPU-equivalents per device, whether it is one of the pool's offers) of a request on a
    sharing pool: the offer it matches, else the next offer up from what it takes (the whole
    GPU above the largest, or where no device can take it)."""
    size = taken(pool, requests)
    if size is None:
        return 1.0, False
    offers = offer_sizes(pool)
    for offer in offers:
        if offer.taken == size:
            return offer.gpu_equivalent, True
    part = size.fraction(pool)
    up = [o.gpu_equivalent for o in offers if o.taken.fraction(pool) >= part]
    return (min(up) if up else 1.0), False
