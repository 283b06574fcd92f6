"""Which idle policy applies to a server: its pool's (from the catalog), found without I/O.

A server's pool is its `user_options["pool"]`, which FracSpawner writes back with the pool the
pod is on (also when the spawn left it out, and again after a hub restart), refusing names it
would have to rewrite. A server whose model names no pool (spawned before that) may be on any
pool offering its slice: the most lenient of their policies applies, so no server is culled
sooner than its actual pool allows.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..choice.options import offer_for
from ..model.catalog import IDLE_KEYS, Catalog, IdlePolicy
from ..model.slices import SliceError, parse_slice, slice_memory_mib

FIELDS = IDLE_KEYS


@dataclass(frozen=True)
class PoolPolicy:
    pool: str  # the pool name, "" when unknown; several candidates are joined with "|"
    policy: IdlePolicy

    def astuple(self) -> tuple[str, IdlePolicy]:
        return self.pool, self.policy


def lenient(policies: list[IdlePolicy]) -> IdlePolicy:
    """Per limit the longest; a limit that is off (None) in any policy stays off."""
    values = {}
    for name in FIELDS:
        limits = [getattr(p, name) for p in policies]
        values[name] = None if any(v is None for v in limits) else max(limits)
    return IdlePolicy(**values)


def candidate_pools(catalog: Catalog, gpu_slice: str | None) -> list[str]:
    """Pools with an offer serving the slice, in catalog order ([] if it cannot be parsed)."""
    if not gpu_slice:
        return []
    try:
        requested = parse_slice(gpu_slice, step=catalog.fraction_step)
    except SliceError:
        return []
    return [name for name, pool in catalog.pools.items() if offer_for(pool, requested)]


def policy_for_server(catalog: Catalog, pool: str | None, gpu_slice: str | None) -> PoolPolicy:
    if pool and pool in catalog.pools:
        return PoolPolicy(pool, catalog.idle_for(pool))
    if pool:  # a pool since removed from the catalog: the catalog-wide policy
        return PoolPolicy(pool, catalog.idle)
    names = candidate_pools(catalog, gpu_slice)
    if not names:
        return PoolPolicy("", catalog.idle)
    return PoolPolicy("|".join(names), lenient([catalog.idle_for(n) for n in names]))


def metrics_pool(catalog: Catalog, pool: str) -> str:
    """A `pool` metrics label: the catalog's names only (candidates joined with "|"
    included), else "": a pool name the catalog lacks may be anyone's text (a Kubeflow pod's
    label is its namespace's to write) and must not make series of its own."""
    names = pool.split("|") if pool else []
    return pool if names and all(name in catalog.pools for name in names) else ""


def gpu_windows(policies: Iterable[IdlePolicy]) -> list[int]:
    """The look-back windows (whole seconds, ascending, each once) the GPU query must cover to
    decide under these policies: their server_gpu_idle and server_idle limits that are on."""
    return sorted({int(w) for p in policies for w in (p.server_gpu_idle, p.server_idle) if w})


def slice_memory_cap(catalog: Catalog, pool: str | None, gpu_slice: str | None) -> float | None:
    """The most GPU memory (MiB) a server's slice can hold: the offer serving it on its pool
    (on any candidate pool when its model names none, the largest); None when the catalog
    cannot tell (no slice, a pool it lacks, no offer). What a server reports of its kernels'
    memory is believed only up to this."""
    if not gpu_slice:
        return None
    try:
        requested = parse_slice(gpu_slice, step=catalog.fraction_step)
    except SliceError:
        return None
    if pool:
        names = [pool] if pool in catalog.pools else []
    else:
        names = candidate_pools(catalog, gpu_slice)
    sizes = []
    for name in names:
        offer = offer_for(catalog.pools[name], requested)
        if offer is not None:
            sizes.append(slice_memory_mib(offer, catalog.pools[name].gpu))
    return float(max(sizes)) if sizes else None
