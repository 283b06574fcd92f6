"""One validation path for `user_options` from the spawn form and the REST API.

`resolve_choice` is pure: catalog + options + the user's rule/usage + a capacity snapshot in,
a `Choice` (slice, pool, image, PodPlan) or an `OptionsError` with a user-facing message out.
The spawner calls it before any Kubernetes object exists, so bad input never makes a pod.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..backends import plan_slice, resolve_offer
from ..backends.base import PodPlan
from ..model.access import allowed_pools, quota_left, within_quota
from ..model.catalog import AccessRule, Catalog, Image, Pool
from ..model.errors import OptionsError, SliceError
from ..model.slices import Slice, parse_slice

__all__ = [
    "OPTION_KEYS",
    "Choice",
    "OptionsError",
    "allowed_pools",
    "describe_offer",
    "free_elsewhere",
    "offer_for",
    "resolve_choice",
]

#: The CONTRACT keys of design.md, shared by form fields and REST `user_options`.
OPTION_KEYS = ("gpu", "pool", "image")


@dataclass(frozen=True)
class Choice:
    slice: Slice
    pool: Pool | None
    image: Image | None
    plan: PodPlan
    #: e.g. the offer a memory request on a MIG pool resolved to; shown in progress messages
    offer: Slice | None = None


def _fmt_gpu(value: float) -> str:
    return f"{value:g}"


def offer_for(pool: Pool, requested: Slice) -> Slice | None:
    """The pool offer that serves `requested` (MIG pools resolve sizes to a profile), or None."""
    try:
        return resolve_offer(requested, pool)[0]
    except SliceError:
        return None


def _capacity_free(capacity: Any, pool: Pool, offer: Slice) -> int | None:
    # a stale snapshot (its watch lost the API server) is unknown capacity: frozen counts
    # neither refuse a spawn nor rank pools
    if capacity is None or getattr(capacity, "stale", False):
        return None
    return capacity.get(pool.name, str(offer)).free


def _coerce_str(options: Mapping[str, Any], key: str) -> str | None:
    value = options.get(key)
    if value is None or value == "":
        return None
    if isinstance(value, list) and len(value) == 1:  # tornado form data arrives as lists
        value = value[0]
    if not isinstance(value, str):
        raise OptionsError(f"{key}: expected a name (a string), got {type(value).__name__}.")
    return value.strip() or None


def resolve_choice(
    catalog: Catalog,
    options: Mapping[str, Any],
    *,
    rule: AccessRule,
    used_gpu: float = 0.0,
    capacity: Any = None,
    admin: bool = False,
    admission: str = "refuse",
    extra_keys: Sequence[str] = (),
) -> Choice:
    """Validate `options` and decide what to spawn; raise OptionsError when it cannot be done.

    `used_gpu` is what the user's other running servers hold (GPU-equivalents); `capacity`
    is a `fracspawner.capacity.Capacity` snapshot or None (unknown: no admission check).
    `extra_keys` are other accepted keys (kubespawner's profile fields when profile_list is set).
    """
    if not isinstance(options, Mapping):
        raise OptionsError("user_options must be a JSON object with the keys gpu, pool, image.")
    allowed = set(OPTION_KEYS) | set(extra_keys)
    unknown = sorted(
        str(k)
        for k in options
        if k not in allowed and not (str(k).startswith("profile-option-") and "profile" in allowed)
    )
    if unknown:
        raise OptionsError(
            f"Unknown option(s): {', '.join(map(repr, unknown))}. "
            f"Allowed options: {', '.join(OPTION_KEYS + tuple(extra_keys))}."
        )

    raw_gpu = options.get("gpu")
    if isinstance(raw_gpu, list) and len(raw_gpu) == 1:
        raw_gpu = raw_gpu[0]
    try:
        requested = parse_slice(raw_gpu, step=catalog.fraction_step)
    except SliceError as exc:
        raise OptionsError(f"gpu: {exc}") from None

    pool_name = _coerce_str(options, "pool")
    image_name = _coerce_str(options, "image")
    may_use = allowed_pools(catalog, rule, admin=admin)

    if image_name is not None and image_name not in catalog.images:
        raise OptionsError(
            f"image: unknown image {image_name!r}. Available: {', '.join(catalog.images)}."
        )

    if requested.kind == "none":
        if pool_name is not None:
            raise OptionsError(
                f"pool: {pool_name!r} is a GPU pool; choose a gpu slice, or no pool for a CPU-only "
                "server."
            )
        image = catalog.images[image_name] if image_name else catalog.default_image(None)
        return Choice(requested, None, image, plan_slice(requested, None, image))

    if pool_name is not None:
        if pool_name not in catalog.pools:
            raise OptionsError(
                f"pool: unknown pool {pool_name!r}. Available: {', '.join(catalog.pools)}."
            )
        pool = catalog.pools[pool_name]
        if pool not in may_use:
            names = ", ".join(p.name for p in may_use) or "none"
            raise OptionsError(
                f"pool: you may not use pool {pool_name!r}. Pools you may use: {names}."
            )
        offer = offer_for(pool, requested)
        if offer is None:
            offers = ", ".join(str(o) for o in pool.offers)
            raise OptionsError(
                f"gpu: pool {pool_name!r} does not offer {requested}. It offers: {offers}."
            )
    else:
        candidates = [(p, o) for p in may_use if (o := offer_for(p, requested)) is not None]
        if not candidates:
            offered = sorted({str(o) for p in may_use for o in p.offers})
            raise OptionsError(
                f"gpu: no pool you may use offers {requested}. "
                f"You may choose: {', '.join(offered) or 'no GPU (none)'}."
            )

        def rank(item: tuple[Pool, Slice]) -> tuple[int, int]:
            free = _capacity_free(capacity, *item)
            # most free first; unknown after every known count; catalog order breaks ties (stable)
            return (0, -free) if free is not None else (1, 0)

        pool, offer = sorted(candidates, key=rank)[0]

    image = catalog.images[image_name] if image_name else catalog.default_image(pool)
    plan = plan_slice(offer, pool, image)

    if not admin and not within_quota(rule, used_gpu, plan.gpu_equivalent):
        left = quota_left(rule, used_gpu) or 0.0
        raise OptionsError(
            f"Quota: {offer} on {pool.name} counts as {_fmt_gpu(plan.gpu_equivalent)} GPU; "
            f"your servers already hold {_fmt_gpu(used_gpu)} of your "
            f"{_fmt_gpu(rule.max_gpu)} GPU limit ({_fmt_gpu(left)} left). "
            "Stop a server or choose a smaller slice."
        )

    free = _capacity_free(capacity, pool, offer)
    if free == 0 and admission == "refuse":
        total = capacity.get(pool.name, str(offer)).total
        raise OptionsError(
            f"No free {describe_offer(offer)} in pool {pool.name} right now (0 of {total} free). "
            + free_elsewhere(catalog, may_use, capacity)
        )
    return Choice(requested, pool, image, plan, offer)


def describe_offer(offer: Slice) -> str:
    """Human words for an offer: '1g.10gb MIG slice', '1/4 GPU', '10 GiB GPU slice'."""
    if offer.kind == "mig":
        return f"{offer.profile} MIG slice"
    if offer.kind == "fraction":
        return f"{offer} GPU"
    if offer.kind == "memory":
        return f"{offer} GPU slice"
    if offer.kind == "whole":
        return f"{offer.count} whole GPU" + ("s" if offer.count > 1 else "")
    return "CPU-only server"


def free_elsewhere(catalog: Catalog, pools: Sequence[Pool], capacity: Any, limit: int = 6) -> str:
    """'Free now: h100 1/4 (12), t4 1/4 (3).' — what the user could take instead."""
    if capacity is None:
        return ""
    free_now = []
    for pool in pools:
        for offer in pool.offers:
            free = _capacity_free(capacity, pool, offer)
            if free:
                free_now.append(f"{pool.name} {offer} ({free})")
    if not free_now:
        return "Nothing you may use is free at the moment; try again later."
    more = len(free_now) - limit
    listed = ", ".join(free_now[:limit]) + (f" and {more} more" if more > 0 else "")
    return f"Free now: {listed}."
