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


def summary(
    offer: Slice, pool: Pool, memory_mib: int, gpu_equivalent: float, enforced: bool
) -> str:
    """One line a person can check before pressing Start.

    '1/4 of an H100-80GB: 20 GiB of GPU memory, memory limit enforced (HAMi), ~33 SMs'
    """
    model = pool.gpu.name
    if offer.kind == "fraction":
        what = f"{offer} of {'an' if model[:1] in 'AEIOUH' else 'a'} {model}"
    elif offer.kind == "memory":
        what = f"{_gib(offer.memory_mib or 0)} of {'an' if model[:1] in 'AEIOUH' else 'a'} {model}"
    elif offer.kind == "mig":
        what = f"MIG {offer.profile} on {'an' if model[:1] in 'AEIOUH' else 'a'} {model}"
    else:
        what = f"{offer.count} × {model}"
    # plain words first (memory, isolation), the technical detail (SMs) last (issue 13 item 8)
    parts = [f"{_gib(memory_mib)} of GPU memory"]
    backend = BACKEND_NAMES.get(pool.backend, pool.backend)
    if offer.kind == "whole":
        parts.append("the GPU to yourself")
    elif offer.kind == "mig" and enforced:
        parts.append(f"isolated in hardware ({backend})")
    elif enforced:
        parts.append(f"memory limit enforced ({backend})")
    else:
        parts.append(f"memory shared with others ({backend}), not isolated")
    sms = _sms(offer, pool, gpu_equivalent)
    if sms:
        parts.append(f"~{sms} SMs" if offer.kind in ("fraction", "memory") else f"{sms} SMs")
    return f"{what}: {', '.join(parts)}"


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
    used_gpu: float,
    capacity: Any = None,
    admin: bool = False,
    previous: Mapping[str, Any] | None = None,
    stale: bool = False,
) -> dict[str, Any]:
    """Everything the picker shows, for one user, from caches only (no API call).

    A stale capacity snapshot (the cluster watch lost the API server) keeps its last counts,
    marked `stale` with `stale_seconds`; a count of 0 from it does not disable an offer.
    """
    stale = stale or bool(getattr(capacity, "stale", False))
    stale_seconds = round(getattr(capacity, "age_seconds", 0) or 0) if stale else None
    may_use = {p.name for p in allowed_pools(catalog, rule, admin=admin)}
    limit = None if admin else rule.max_gpu
    remaining = None if limit is None else max(limit - used_gpu, 0.0)
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
            if not pool_allowed:
                reason = "Your access rules do not include this pool."
            elif remaining is not None and plan.gpu_equivalent > remaining + _EPSILON:
                reason = (
                    f"Needs {gpu_amount(plan.gpu_equivalent)}; "
                    f"your quota has {gpu_amount(remaining)} left."
                )
            elif free == 0 and not stale:  # a frozen 0 is unknown, not "full"
                reason = "None free right now."
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
                    "summary": summary(
                        offer, pool, plan.memory_mib, plan.gpu_equivalent, plan.enforced
                    ),
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
            "used_gpu": round(used_gpu, 6),
            "remaining_gpu": None if remaining is None else round(remaining, 6),
            # the same numbers in the units people think in ("1/8 GPU", "1 6/7 GPUs")
            "used_text": gpu_share(used_gpu),
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
    }
