"""One validation path for `user_options` from the spawn form and the REST API.

`resolve_choice` is pure: catalog + options + the user's rule/usage + a capacity snapshot in,
a `Choice` (slice, pool, image, PodPlan) or an `OptionsError` with a user-facing message out.
The spawner calls it before any Kubernetes object exists, so bad input never makes a pod.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..backends import plan_slice, resolve_offer
from ..backends.base import PodPlan
from ..model.access import allowed_pools, quota_left, within_quota
from ..model.catalog import AccessRule, Catalog, Image, Pool
from ..model.errors import OptionsError, SliceError, echo
from ..model.slices import Slice, parse_slice
from ..model.units import gpu_amount, gpu_share, slice_text

__all__ = [
    "OPTION_KEYS",
    "Choice",
    "OptionsError",
    "allowed_pools",
    "describe_offer",
    "expect_name",
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


def expect_name(key: str, value: Any) -> None:
    """A name or nothing (None) for `key`: REST JSON can send a list or a number where the form
    sends text."""
    if value is not None and not isinstance(value, str):
        raise OptionsError(f"{key}: expected a name (a string), got {type(value).__name__}.")


def _coerce_str(options: Mapping[str, Any], key: str) -> str | None:
    """The name given for `key`, exactly as given; None when the key is absent.

    A value the spawner would have to rewrite is refused, never normalised: the hub keeps the
    options as sent, and what reads them later (the culler's pool policy) must see what the pod
    is. The form strips its fields and leaves empty ones out (options_from_form)."""
    if key not in options:
        return None
    value = options[key]
    # no list unwrapping: the form's lists are unwrapped by the spawner's options_from_form,
    # so a list here came through the REST API, where the CONTRACT says one value
    if value is None or value == "":
        raise OptionsError(
            f"{key}: {json.dumps(value)} is not a name; leave the option out for the default."
        )
    expect_name(key, value)
    if value != value.strip():
        raise OptionsError(
            f"{key}: {echo(value)} has spaces around it; give the name exactly, "
            f"e.g. {echo(value.strip())}."
        )
    return value


#: unknown keys a message lists before "and N more"
_LIST_MAX = 5


def _listed(names: Sequence[str]) -> str:
    shown = ", ".join(echo(n) for n in names[:_LIST_MAX])
    return shown + (f" and {len(names) - _LIST_MAX} more" if len(names) > _LIST_MAX else "")


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
    holders: Mapping[str, float] | None = None,
) -> Choice:
    """Validate `options` and decide what to spawn; raise OptionsError when it cannot be done.

    `used_gpu` is what the user's other running servers hold (GPU-equivalents); `capacity`
    is a `fracspawner.capacity.Capacity` snapshot or None (unknown: no admission check).
    `extra_keys` are other accepted keys (kubespawner's profile fields when profile_list is set).
    `holders`: the user's other servers holding GPU quota (name -> GPU-equivalents; "" is the
    default server), named in a quota refusal so the user knows what to stop.
    An `image` among them belongs to a profile option (a catalog without images leaves the key
    to profile_list): it is not read as a catalog image.
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
            f"Unknown option(s): {_listed(unknown)}. "
            f"Allowed options: {', '.join(dict.fromkeys(OPTION_KEYS + tuple(extra_keys)))}."
        )
    # kubespawner's profile keys name a profile, a choice or an unlisted choice's text, as the
    # form sends them; REST JSON can send a list or a number, which its profile code met with
    # a TypeError (a 500, counted toward the hub's consecutive_failure_limit)
    for key in extra_keys:
        expect_name(key, options.get(key))

    raw_gpu = options.get("gpu")
    if isinstance(raw_gpu, (list, tuple, Mapping)):
        raise OptionsError(f'gpu: expected one value like "1/4", got a {type(raw_gpu).__name__}.')
    try:
        requested = parse_slice(raw_gpu, step=catalog.fraction_step)
    except SliceError as exc:
        raise OptionsError(f"gpu: {exc}") from None

    pool_name = _coerce_str(options, "pool")
    image_name = None if "image" in extra_keys else _coerce_str(options, "image")
    may_use = allowed_pools(catalog, rule, admin=admin)

    if image_name is not None and image_name not in catalog.images:
        if not catalog.images:
            raise OptionsError(
                "image: this hub offers no choice of image; leave the option out and the "
                "server's configured image is used."
            )
        raise OptionsError(
            f"image: unknown image {echo(image_name)}. Available: {', '.join(catalog.images)}."
        )

    if requested.kind == "none":
        if pool_name is not None:
            raise OptionsError(
                f"pool: {echo(pool_name)} is a GPU pool; choose a gpu slice, or no pool for a "
                "CPU-only server."
            )
        image = catalog.images[image_name] if image_name else catalog.default_image(None)
        return Choice(requested, None, image, plan_slice(requested, None, image))

    if pool_name is not None:
        if pool_name not in catalog.pools:
            # only the pools this user may use: naming others invites a second refusal
            names = ", ".join(p.name for p in may_use) or "none"
            raise OptionsError(f"pool: unknown pool {echo(pool_name)}. Available: {names}.")
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
            # only sizes the quota leaves room for (a size over it would be refused next)
            offered = sorted(
                {
                    str(o)
                    for p in may_use
                    for o in p.offers
                    if admin or within_quota(rule, used_gpu, plan_slice(o, p, None).gpu_equivalent)
                }
            )
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
        what = describe_offer(offer)
        # "MIG 1g.10gb (1/7 GPU)": a size not in GPU shares says what it counts as
        cost = gpu_amount(plan.gpu_equivalent)
        what += "" if what == cost else f" ({cost})"
        # advice that can be followed: a smaller size only when one fits what is left (or
        # the whole quota, once servers are stopped), the servers holding it by name
        smaller = _sizes_within(may_use, left)
        if used_gpu > 0:
            held = {n: g for n, g in (holders or {}).items() if g > 0}
            stop = "Stop a server on your Home page"
            if len(held) == 1:
                ((name, amount),) = held.items()
                stop = "Stop it on your Home page"
                holding = f"{_server_words(name)} holds {gpu_amount(amount)}"
            elif held:
                names = [f"{_server_words(n)} ({gpu_amount(g)})" for n, g in sorted(held.items())]
                stop = "Stop one of them on your Home page"
                listed = ", ".join(names[:-1]) + f" and {names[-1]}"
                holding = f"{listed} hold {gpu_amount(sum(held.values()))}"
            else:
                holding = f"your other servers hold {gpu_share(used_gpu)}"
            also = f" or choose a size that fits: {', '.join(smaller)}" if smaller else ""
            raise OptionsError(
                f"Quota: {what} on {pool.display_name} is more than the {gpu_amount(left)} "
                f"left of your {gpu_amount(rule.max_gpu)} ({holding}). {stop}{also}."
            )
        advice = (
            f"Choose a size that fits: {', '.join(smaller)}."
            if smaller
            else "No size you may use fits it; ask an admin for a larger quota."
        )
        raise OptionsError(
            f"Quota: {what} on {pool.display_name} is more than your limit of "
            f"{gpu_amount(rule.max_gpu)}. {advice}"
        )

    free = _capacity_free(capacity, pool, offer)
    if free == 0 and admission == "refuse":
        total = capacity.get(pool.name, str(offer)).total
        room = None if admin else quota_left(rule, used_gpu)
        held = getattr(capacity.get(pool.name, str(offer)), "held", None)
        taken = (
            f"all {total} are taken"
            if held is None or total is None or held >= total
            else f"{held} held there take{'s' if held == 1 else ''} the room of all {total}"
        )
        raise OptionsError(
            f"No {describe_offer(offer)} is free on {pool.display_name} right now "
            f"({taken}). "
            + free_elsewhere(catalog, may_use, capacity, wanted=(pool, offer), room=room)
        )
    return Choice(requested, pool, image, plan, offer)


def _sizes_within(pools: Sequence[Pool], room: float, limit: int = 4) -> list[str]:
    """'1/8 GPU', ...: the sizes of `pools` that fit `room` GPU-equivalents, smallest first."""
    sizes: dict[str, float] = {}
    for pool in pools:
        for offer in pool.offers:
            size = plan_slice(offer, pool, None).gpu_equivalent
            if size <= room + 1e-9:
                sizes.setdefault(describe_offer(offer), size)
    return [w for w, _ in sorted(sizes.items(), key=lambda item: item[1])][:limit]


def _server_words(name: str) -> str:
    return f"your server {echo(name)}" if name else "your default server"


def describe_offer(offer: Slice) -> str:
    """Plain words for an offer, as the picker shows it: 'MIG 1g.10gb', '1/4 GPU', '10 GiB'."""
    return slice_text(
        offer.kind,
        fraction=str(offer) if offer.kind == "fraction" else "",
        memory_mib=offer.memory_mib or 0,
        profile=offer.profile or "",
        count=offer.count or 0,
    )


def _closeness(
    wanted: tuple[Pool, Slice] | None, size: float, pool: Pool, offer: Slice
) -> tuple[int, float]:
    """Sort key: the same size elsewhere first, then the next smaller sizes, then larger."""
    if wanted is None:
        return (0, 0.0)
    want_pool, want_offer = wanted
    want = plan_slice(want_offer, want_pool, None).gpu_equivalent
    if str(offer) == str(want_offer) or abs(size - want) < 1e-9:
        return (0, 0.0)
    return (1, want - size) if size < want else (2, size - want)


def free_elsewhere(
    catalog: Catalog,
    pools: Sequence[Pool],
    capacity: Any,
    limit: int = 3,
    *,
    wanted: tuple[Pool, Slice] | None = None,
    room: float | None = None,
) -> str:
    """'Free instead: 1/4 GPU on T4: 3 free; 1/8 GPU on H100 80GB: 12 free.'

    Only what the user could take now (free, and within `room` GPU of quota), closest to
    `wanted` first: the same size on another pool, then the next smaller sizes.
    """
    if capacity is None:
        return ""
    found = []
    for pool in pools:
        for offer in pool.offers:
            if wanted is not None and pool is wanted[0] and str(offer) == str(wanted[1]):
                continue
            free = _capacity_free(capacity, pool, offer)
            size = plan_slice(offer, pool, None).gpu_equivalent
            if not free or (room is not None and size > room + 1e-9):
                continue
            key = _closeness(wanted, size, pool, offer)
            found.append((key, f"{describe_offer(offer)} on {pool.display_name}: {free} free"))
    if not found:
        return "Nothing else you may use is free at the moment; try again in a few minutes."
    found.sort(key=lambda item: item[0])  # stable: catalog order breaks ties
    more = len(found) - limit
    listed = "; ".join(text for _, text in found[:limit])
    # "and 6 more" alone left "more what?" open
    choices = "choice" if more == 1 else "choices"
    rest = f"; and {more} more {choices} on the form" if more > 0 else ""
    return f"Free instead: {listed}{rest}."
