"""The offer model: what one user may choose right now, as plain JSON-able data.

The server-rendered form and the picker's JSON endpoint both render this one model, so the
page without JavaScript and the live picker can never disagree about what is allowed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..backends import plan_slice
from ..model.access import allowed_pools
from ..model.catalog import AccessRule, Catalog, Pool
from ..model.errors import SliceError
from ..model.slices import Slice, parse_slice
from ..model.units import gib, gpu_amount, gpu_share
from .options import OPTION_KEYS, describe_offer

MODE_LABELS = {
    "fraction": "Fraction of a GPU",
    "memory": "GPU memory",
    "mig": "MIG profile",
    "whole": "Whole GPUs",
}
BACKEND_NAMES = {
    "mig-mixed": "MIG",
    "mig-single": "MIG",
    "gke-mig": "GKE MIG",
    "hami": "HAMi",
    "mps": "MPS",
    "gke-mps": "GKE MPS",
    "runai": "Run:ai",
    "kai": "KAI",
    "clearml-image": "ClearML",
    "clearml-injector": "ClearML",
    "volcano": "Volcano vGPU",
    "timeslicing": "time-slicing",
    "gke-timesharing": "GKE time-sharing",
    "whole": "a whole GPU",
}
_EPSILON = 1e-9


def _gib(mib: int) -> str:
    return gib(mib)


def size_label(offer: Slice) -> str:
    """A size as its radio shows it: '1/8' (under "Fraction of a GPU"), '10 GiB', 'MIG 1g.10gb',
    '2 GPUs' — one unit style everywhere (the spec, e.g. '10GiB', stays the submitted value)."""
    if offer.kind == "fraction":
        return str(offer)
    return describe_offer(offer)


def _sms(offer: Slice, pool: Pool, gpu_equivalent: float) -> int | None:
    """SMs the slice gets: a MIG profile's own count (NVIDIA's MIG tables: 16 on an H100's
    1g.10gb, not 132/7), else the GPU's SMs times the share."""
    if offer.kind == "mig" and offer.profile in pool.gpu.mig_profiles:
        own = pool.gpu.mig_profiles[offer.profile].sms
        if own:
            return own
    return round(pool.gpu.sms * gpu_equivalent) if pool.gpu.sms else None


def _article(model: str) -> str:
    """'an H100', 'an L4', 'an RTX-6000', 'a T4': initials are read letter by letter."""
    return "an" if model[:1].upper() in "AEFHILMNORSX" else "a"


def summary(offer: Slice, pool: Pool, memory_mib: int, enforced: bool) -> str:
    """One line in plain words a person can check before pressing Start: what, how much
    memory, how isolated; no technology names, no SMs (those are in `details`, issue 13 #8).

    '1/4 of an H100-80GB: 19.9 GiB of GPU memory, memory limit enforced'
    """
    model = pool.gpu.name
    if offer.kind == "fraction":
        what = f"{offer} of {_article(model)} {model}"
    elif offer.kind == "memory":
        what = f"{_gib(offer.memory_mib or 0)} of {_article(model)} {model}"
    elif offer.kind == "mig":
        what = f"MIG {offer.profile} on {_article(model)} {model}"
    else:
        what = f"{offer.count} × {model}"
    if offer.kind == "whole":
        isolation = "the GPUs to yourself" if (offer.count or 1) > 1 else "the GPU to yourself"
    elif offer.kind == "mig" and enforced:
        isolation = "isolated in hardware"
    elif enforced:
        isolation = "memory limit enforced"
    else:
        isolation = "memory shared with others, not isolated"
    return f"{what}: {_gib(memory_mib)} of GPU memory, {isolation}"


_SM_WORDS = "streaming multiprocessors, the GPU's compute units"


def details(offer: Slice, pool: Pool, gpu_equivalent: float, enforced: bool) -> list[str]:
    """The technical facts behind the summary, shown on demand: the sharing technology and
    what it does, the compute (SMs) and the whole GPU's memory.

    ['Sharing technology: HAMi (a memory limit per container)',
     "Compute: ~33 of 132 SMs (streaming multiprocessors, the GPU's compute units)",
     'GPU: H100-80GB with 79.6 GiB of memory']
    """
    gpu = pool.gpu
    backend = BACKEND_NAMES.get(pool.backend, pool.backend)
    if offer.kind == "whole":
        uses = "" if pool.backend == "whole" else f" (the pool uses {backend})"
        lines = [f"Sharing technology: none, whole GPUs are not shared{uses}"]
    elif offer.kind == "mig" and enforced:
        lines = [f"Sharing technology: {backend} (the GPU split in hardware)"]
    elif enforced:
        lines = [f"Sharing technology: {backend} (a memory limit per container)"]
    else:
        lines = [f"Sharing technology: {backend} (no memory limit per container)"]
    sms = _sms(offer, pool, gpu_equivalent)
    if sms and gpu.sms:
        if offer.kind == "whole":
            amount = f"all {gpu.sms} SMs" + (" of each GPU" if (offer.count or 1) > 1 else "")
        elif offer.kind == "mig":
            amount = f"{sms} of {gpu.sms} SMs"
        else:  # a share, not a partition: about this many on average
            amount = f"~{sms} of {gpu.sms} SMs"
        lines.append(f"Compute: {amount} ({_SM_WORDS})")
    each = " each" if offer.kind == "whole" and (offer.count or 1) > 1 else ""
    lines.append(f"GPU: {gpu.name} with {_gib(gpu.device_memory_mib)} of memory{each}")
    return lines


def known_previous(catalog: Catalog, previous: Mapping[str, Any] | None) -> dict[str, str]:
    """The last spawn's options as the form may preselect them: only valid, known values.

    JupyterHub saves a spawn's options even when fracspawner refused them, so they are user
    input: a NaN, a list or a 100 kB name must not reach the page (NaN would make the
    embedded JSON invalid and break the picker)."""
    out: dict[str, str] = {}
    previous = previous if isinstance(previous, Mapping) else {}
    gpu, pool, image = (previous.get(k) for k in OPTION_KEYS)
    if isinstance(gpu, str):
        try:
            out["gpu"] = str(parse_slice(gpu, step=catalog.fraction_step))
        except SliceError:
            pass
    if isinstance(pool, str) and pool in catalog.pools:
        out["pool"] = pool
    if isinstance(image, str) and image in catalog.images:
        out["image"] = image
    return out


def build_offer_model(
    catalog: Catalog,
    *,
    rule: AccessRule,
    used_gpu: float | None,
    capacity: Any = None,
    admin: bool = False,
    previous: Mapping[str, Any] | None = None,
    stale: bool = False,
    full_waits: bool = False,
    line_known: bool = False,
    line_full: str | None = None,
) -> dict[str, Any]:
    """Everything the picker shows, for one user, from caches only (no API call).

    A stale capacity snapshot (the cluster watch lost the API server) keeps its last counts,
    marked `stale` with `stale_seconds`; a count of 0 from it does not disable an offer.
    With `full_waits` (`c.FracSpawner.admission = "wait"`) a full offer stays takeable, marked
    `waits`: its pod will wait in the queue for a slot instead of being refused.
    `used_gpu=None`: what the user's servers hold is not known here (the service without a
    usable pod watch or hub answer): no used or remaining amount is claimed, only sizes over
    the whole quota are ruled out (`over_quota`), and the hub checks the rest at Start.
    `line_known`: the caller knows the hub's waiting line (the hub itself; the service does
    not); `line_full`: the words of a full line ("3 servers already wait in line on this
    hub, ..."): a full offer then does not wait, it is ruled out with them, as Start would be.
    """
    stale = stale or bool(getattr(capacity, "stale", False))
    stale_seconds = round(getattr(capacity, "age_seconds", 0) or 0) if stale else None
    may_use = {p.name for p in allowed_pools(catalog, rule, admin=admin)}
    limit = None if admin else rule.max_gpu
    known = used_gpu is not None
    closed = None  # why a full offer cannot wait: the hub's line is full
    if full_waits and line_full:
        closed = f"None free right now. Waiting is closed for now: {line_full}."
    remaining = None if limit is None or used_gpu is None else max(limit - used_gpu, 0.0)
    pools: list[dict[str, Any]] = []
    modes: list[str] = []
    for pool in catalog.pools.values():
        pool_allowed = pool.name in may_use
        offers = []
        for offer in pool.offers:
            plan = plan_slice(offer, pool, None)
            counts = capacity.get(pool.name, str(offer)) if capacity is not None else None
            free = counts.free if counts else None
            total = counts.total if counts else None
            reason = None
            room = remaining if known else limit
            over_quota = room is not None and plan.gpu_equivalent > room + _EPSILON
            if not pool_allowed:
                reason = "Your access rules do not include this pool."
            elif over_quota:
                reason = f"Needs {gpu_amount(plan.gpu_equivalent)}; " + (
                    f"your quota has {gpu_amount(room)} left."
                    if known
                    else f"your quota is {gpu_amount(room)}."
                )
            elif free == 0 and not stale and not full_waits:  # a frozen 0 is unknown
                reason = "None free right now."
            elif free == 0 and not stale and closed:  # it would wait, but the line is full
                reason = closed
            mode = offer.kind
            if pool_allowed and mode not in modes:
                modes.append(mode)
            offers.append(
                {
                    "spec": str(offer),
                    "label": offer.label,
                    "display": size_label(offer),
                    "mode": mode,
                    "gpu_equivalent": round(plan.gpu_equivalent, 6),
                    "memory_mib": plan.memory_mib,
                    "free": free,
                    "total": total,
                    "note": counts.note if counts else "",
                    "allowed": reason is None,
                    "reason": reason,
                    # ruled out by the quota (a refresh that cannot tell usage keeps it so)
                    "over_quota": pool_allowed and over_quota,
                    # takeable although none is free now: the pod queues for a slot
                    "waits": reason is None and free == 0 and full_waits,
                    "summary": summary(offer, pool, plan.memory_mib, plan.enforced),
                    "details": details(offer, pool, plan.gpu_equivalent, plan.enforced),
                }
            )
        pools.append(
            {
                "name": pool.name,
                "display_name": pool.display_name,
                "description": pool.description,
                "gpu_model": pool.gpu.name,
                "gpu_memory_mib": pool.gpu.memory_mib,
                "backend": pool.backend,
                "backend_name": BACKEND_NAMES.get(pool.backend, pool.backend),
                "allowed": pool_allowed,
                "reason": None if pool_allowed else "Your access rules do not include this pool.",
                "offers": offers,
            }
        )
    order = list(MODE_LABELS)
    modes.sort(key=order.index)
    return {
        "quota": {
            "max_gpu": limit,
            # None: not known here (never a made-up 0)
            "used_gpu": round(used_gpu, 6) if used_gpu is not None else None,
            "remaining_gpu": None if remaining is None else round(remaining, 6),
            # the same numbers in the units people think in ("1/8 GPU", "1 6/7 GPUs")
            "used_text": gpu_share(used_gpu) if used_gpu is not None else "unknown",
            "max_text": None if limit is None else gpu_amount(limit),
            "remaining_text": None if remaining is None else gpu_amount(remaining),
        },
        "modes": [{"id": m, "label": MODE_LABELS[m]} for m in modes],
        "pools": pools,
        "images": [
            {
                "name": img.name,
                "display_name": img.display_name,
                "description": img.description,
                "default": img.default,
            }
            for img in catalog.images.values()
        ],
        "previous": known_previous(catalog, previous),
        "stale": stale,
        "stale_seconds": stale_seconds,
        # what Start does when a size is full (c.FracSpawner.admission): "refuse" or "wait"
        "admission": "wait" if full_waits else "refuse",
        # under "wait": whether the hub's line (max_waiting) has room, where that is known
        # (the hub's form; the service cannot tell: known false, and the picker keeps what
        # the page said)
        "waiting_line": {
            "known": bool(full_waits and line_known),
            "closed": closed is not None,
            "reason": closed,
        },
    }
