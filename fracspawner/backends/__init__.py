"""GPU-sharing backends, `plan_slice` (the one pure function from a slice to pod fields) and
`load_catalog` (a catalog checked by the backends its pools name).

Backends are looked up by name: the built-ins below first (so they work without installed
entry points, e.g. from a source checkout), then the `fracspawner.backends` entry point group,
where a third party registers `name = "package.module:BackendClass"`.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from functools import cache, lru_cache
from importlib.metadata import entry_points
from types import MappingProxyType
from typing import Any

from ..model.catalog import Catalog, Image, Pool
from ..model.errors import CatalogError, SliceError
from ..model.slices import Slice, gpu_equivalent, slice_memory_mib
from .base import COMMON_OPTIONS, Backend, PodPlan, decimal
from .fit import UNKNOWN, CountedOffer, OfferCapacity

__all__ = [
    "BUILTIN_BACKENDS",
    "RESERVED_ENV",
    "UNKNOWN",
    "Backend",
    "CountedOffer",
    "OfferCapacity",
    "PodPlan",
    "backend_names",
    "check_pool",
    "get_backend",
    "is_reserved_env",
    "load_catalog",
    "plan_slice",
    "resolve_offer",
    "safe_env",
    "scheduler_for",
]

ENTRY_POINT_GROUP = "fracspawner.backends"

#: name -> "module:Class"; the same lines belong in pyproject's entry points
BUILTIN_BACKENDS: dict[str, str] = {
    "mig-mixed": "fracspawner.backends.mig:MigMixedBackend",
    "mig-single": "fracspawner.backends.mig:MigSingleBackend",
    "timeslicing": "fracspawner.backends.nvidia:TimeSlicingBackend",
    "mps": "fracspawner.backends.nvidia:MpsBackend",
    "hami": "fracspawner.backends.hami:HamiBackend",
    "runai": "fracspawner.backends.runai:RunaiBackend",
    "kai": "fracspawner.backends.runai:KaiBackend",
    "clearml-injector": "fracspawner.backends.clearml:ClearmlInjectorBackend",
    "clearml-image": "fracspawner.backends.clearml:ClearmlImageBackend",
    "volcano": "fracspawner.backends.volcano:VolcanoBackend",
    "gke-timesharing": "fracspawner.backends.gke:GkeTimeSharingBackend",
    "gke-mps": "fracspawner.backends.gke:GkeMpsBackend",
    "gke-mig": "fracspawner.backends.gke:GkeMigBackend",
    "whole": "fracspawner.backends.whole:WholeGpuBackend",
    "dra": "fracspawner.backends.dra:DraBackend",
}

#: Env a user, profile or admin config must never set on a GPU pod: each either switches a
#: backend's isolation off or widens what the container sees. The spawner strips these from
#: user-controlled config; a trailing '*' is a prefix. The backend's own values always win.
RESERVED_ENV: frozenset[str] = frozenset(
    {
        # HAMi (docs/config.md "Container configs"; HAMi-core README): CUDA_DISABLE_CONTROL
        # turns enforcement off, GPU_CORE_UTILIZATION_POLICY=disable ignores gpucores, the
        # limits themselves are CUDA_DEVICE_MEMORY_LIMIT[_i] / CUDA_DEVICE_SM_LIMIT
        "CUDA_DISABLE_CONTROL",
        "CUDA_DEVICE_MEMORY_LIMIT*",
        "CUDA_DEVICE_SM_LIMIT",
        "CUDA_DEVICE_MEMORY_SHARED_CACHE",
        "CUDA_OVERSUBSCRIBE",
        "GPU_CORE_UTILIZATION_POLICY",
        "CUDA_TASK_PRIORITY",
        # MPS (NVIDIA/k8s-device-plugin, GKE): pipe, thread and pinned-memory limits
        "CUDA_MPS_*",
        # preloaded interposers (HAMi's libvgpu.so, ClearML's driver shim) and device exposure
        "LD_PRELOAD",
        "NVIDIA_VISIBLE_DEVICES",
        "NVIDIA_DRIVER_CAPABILITIES",
        "NVIDIA_MIG_CONFIG_DEVICES",
        "NVIDIA_MIG_MONITOR_DEVICES",
        "CUDA_VISIBLE_DEVICES",
        # ClearML fractional images read their limit from here
        "GPU_MEM_LIMIT_GB",
        # what fracspawner itself tells the notebook (choice/notebook_env.py): the slice, the
        # idle policy the server applies to its own kernels, where it reports to the culler
        "FRACSPAWNER_GPU_MEMORY_MIB",
        "FRACSPAWNER_GPU_SLICE",
        "FRACSPAWNER_GPU_POOL",
        "FRACSPAWNER_GPU_POOL_DISPLAY",
        "FRACSPAWNER_GPU_OVERCOMMIT",
        "FRACSPAWNER_KERNEL_GPU_IDLE_SECONDS",
        "FRACSPAWNER_KERNEL_GPU_HIBERNATE_SECONDS",
        "FRACSPAWNER_SERVER_GPU_IDLE_SECONDS",
        "FRACSPAWNER_SERVER_IDLE_SECONDS",
        "FRACSPAWNER_SERVER_UNATTENDED_SECONDS",
        "FRACSPAWNER_MAX_AGE_SECONDS",
        "FRACSPAWNER_SERVER_STARTED",
        "FRACSPAWNER_CULLER_URL",
        # the demo's simulated GPU (devcluster only): never on a pod FracSpawner spawns
        "FRACSPAWNER_SIMULATED_GPU",
    }
)

#: the CONTRACT keys of design.md
LABEL_POOL = "fracspawner.io/pool"
LABEL_GPU = "fracspawner.io/gpu"
ANNOTATION_EQUIVALENT = "fracspawner.io/gpu-equivalent"
ANNOTATION_MEMORY = "fracspawner.io/gpu-memory-mib"
ENV_MEMORY = "FRACSPAWNER_GPU_MEMORY_MIB"
ENV_OVERCOMMIT = "FRACSPAWNER_GPU_OVERCOMMIT"
#: backends whose pools may resolve a fraction/memory request to a MIG profile
MIG_BACKENDS = frozenset({"mig-mixed", "mig-single", "gke-mig"})


#: RESERVED_ENV's prefix entries, without the '*' (checked for every env name of every spawn)
_RESERVED_PREFIXES = tuple(sorted(p[:-1] for p in RESERVED_ENV if p.endswith("*")))


def is_reserved_env(name: str) -> bool:
    """Whether `name` is in RESERVED_ENV (prefix entries end in '*')."""
    return name in RESERVED_ENV or name.startswith(_RESERVED_PREFIXES)


def safe_env(user_env: dict[str, str] | None, plan: PodPlan) -> dict[str, str]:
    """User/profile env without reserved names, with the plan's env on top (it always wins)."""
    env = {k: v for k, v in (user_env or {}).items() if not is_reserved_env(k)}
    env.update(plan.env)
    return env


def backend_names() -> list[str]:
    """Built-in backends, then those registered as entry points."""
    names = list(BUILTIN_BACKENDS)
    names += sorted(ep.name for ep in _entry_points() if ep.name not in BUILTIN_BACKENDS)
    return names


def _entry_points():
    try:
        return entry_points(group=ENTRY_POINT_GROUP)
    except Exception:  # a broken distribution's metadata must not break the built-ins
        return ()


@cache
def get_backend(name: str) -> Backend:
    """The backend registered under `name`; ValueError (listing the known ones) otherwise."""
    if not isinstance(name, str):
        raise ValueError(f"backend must be a name, not {type(name).__name__}")
    target = BUILTIN_BACKENDS.get(name)
    if target is not None:
        module, _, attr = target.partition(":")
        cls = getattr(importlib.import_module(module), attr)
    else:
        matches = [ep for ep in _entry_points() if ep.name == name]
        if not matches:
            raise ValueError(
                f"unknown backend {name!r}; known backends: {', '.join(backend_names())}"
            )
        cls = matches[0].load()
    backend = cls() if isinstance(cls, type) else cls
    if not isinstance(backend, Backend):
        raise ValueError(f"backend {name!r} ({cls!r}) is not a fracspawner Backend")
    return backend


def scheduler_for(plan: PodPlan, pool: Pool | None) -> str | None:
    """The scheduler a slice pod must name: the plan's, else the one the pool's backend's own
    webhook would set (HAMi: hami-scheduler), which that webhook leaves out for a pod already
    naming another scheduler (z2jh's user scheduler) or seen before it carried the backend's
    resources. The hub's pods and the Kubeflow webhook's alike."""
    if plan.scheduler_name or pool is None:  # no pool: a CPU server, no backend
        return plan.scheduler_name
    return getattr(get_backend(pool.backend), "own_scheduler", None)


def check_pool(pool: Pool, where: str) -> None:
    """The catalog's PoolCheck: the pool's backend exists and can serve every offer."""
    try:
        backend = get_backend(pool.backend)
    except ValueError as exc:
        raise CatalogError(f"{where}.backend: {exc}") from None
    _check_options(backend, pool, where)
    try:
        backend.check_pool(pool)
    except (SliceError, ValueError) as exc:
        raise CatalogError(f"{where}: {exc}") from None
    try:
        backend.check_overcommit(pool)
    except ValueError as exc:
        raise CatalogError(f"{where}.overcommit: {exc}") from None
    for i, offer in enumerate(pool.offers):
        try:
            backend.check_offer(offer, pool)
        except SliceError as exc:
            raise CatalogError(f"{where}.offers[{i}]: {exc}") from None


def _check_options(backend: Backend, pool: Pool, where: str) -> None:
    """The pool's `options` are ones its backend reads, each of the kind it takes: a typo
    (`schedular_name`) or an option of another backend is not silently ignored, nor is
    `enforced: "no"` read as true."""
    own = backend.pool_options
    known = {**COMMON_OPTIONS, **(own if own is not None else {})}
    for key, value in (pool.options or {}).items():
        kind = known.get(key)
        if kind is None:
            if own is None:
                continue  # a backend that does not say which it reads
            from ..model.check import did_you_mean

            raise CatalogError(
                f"{where}.options.{key}: unknown option {key!r}{did_you_mean(key, known)}; "
                f"the {backend.name} backend's options: {', '.join(known)}"
            )
        if not kind.accepts(value):
            raise CatalogError(f"{where}.options.{key}: must be {kind.words}, not {value!r}")


def load_catalog(source: str | os.PathLike[str] | Mapping[str, Any]) -> Catalog:
    """A catalog from a YAML path or a dict, checked by the schema, the model and the backends
    its pools name; CatalogError names the path of the first problem."""
    return Catalog.load(source, check_pool=check_pool)


def resolve_offer(s: Slice, pool: Pool) -> tuple[Slice, tuple[str, ...]]:
    """The pool offer that serves `s`, with a note when a request was resolved.

    An exact offer wins. On MIG pools a fraction or memory request resolves to the smallest
    OFFERED profile holding it (memory first, then compute), like Run:ai's dynamic MIG; the
    resolved profile must itself be an offer, so a pool never hands out what it did not list.
    Raises SliceError when nothing offered fits.
    """
    if s in pool.offers:
        return s, ()
    if pool.backend in MIG_BACKENDS and s.kind in ("fraction", "memory"):
        need_mem = slice_memory_mib(s, pool.gpu)
        need_eq = gpu_equivalent(s, pool.gpu)
        fitting = [
            o
            for o in pool.offers
            if o.kind == "mig"
            and slice_memory_mib(o, pool.gpu) >= need_mem
            and (s.kind == "memory" or gpu_equivalent(o, pool.gpu) + 1e-9 >= need_eq)
        ]
        if fitting:
            best = min(
                fitting,
                key=lambda o: (slice_memory_mib(o, pool.gpu), gpu_equivalent(o, pool.gpu), str(o)),
            )
            return best, (f"{s} resolved to MIG profile {best.profile}",)
    offered = ", ".join(str(o) for o in pool.offers)
    raise SliceError(f"pool {pool.name} does not offer {s}; it offers: {offered}")


def _soft_caps(memory_mib: int, total_mib: int) -> dict[str, str]:
    """Framework env that keeps a well-behaved notebook inside its share (no enforcement)."""
    return {
        # JAX: preallocating 75% of the GPU would take other users' memory; cap at our share
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
        "XLA_PYTHON_CLIENT_MEM_FRACTION": decimal(min(memory_mib / total_mib, 1.0)),
        # TensorFlow maps all GPU memory at start unless told to grow
        "TF_FORCE_GPU_ALLOW_GROWTH": "true",
        # CuPy's memory pool limit, in bytes
        "CUPY_GPU_MEMORY_LIMIT": str(memory_mib * 1024 * 1024),
    }


def plan_slice(s: Slice, pool: Pool | None, image: Image | None) -> PodPlan:
    """Everything a spawn of `s` on `pool` puts on the pod. Pure.

    Backend keys + the CONTRACT labels/annotations + FRACSPAWNER_GPU_MEMORY_MIB + soft caps
    where the backend does not isolate memory + the pool's node selector and tolerations +
    the image. Slice("none"): no GPU anything (just the image). Raises SliceError when the
    pool does not offer `s` (after MIG resolution) or its backend cannot serve it.

    Memoized on the values of its arguments (every spawn, form render and admission check
    asks for the same few plans): a PodPlan is frozen and its mappings are read-only views,
    so one cached plan can be shared; a pool whose settings change (another catalog) is a
    different key, and errors are not cached.
    """
    try:
        return _plan_slice_cached(s, pool, image)
    except TypeError:  # unhashable arguments (a hand-built Pool with a list): uncached
        return _plan_slice(s, pool, image)


#: distinct (slice, pool, image) a hub plans for: a few per offer; bounded all the same
_PLAN_CACHE_SIZE = 1024


def _plan_slice(s: Slice, pool: Pool | None, image: Image | None) -> PodPlan:
    image_ref = image.image if image is not None else None
    if s.kind == "none":
        empty: Mapping[str, Any] = MappingProxyType({})
        return PodPlan(
            limits=empty,
            requests=empty,
            labels=empty,
            annotations=empty,
            env=empty,
            node_selector=empty,
            image=image_ref,
            extra_pod_config=empty,
            extra_container_config=empty,
        )
    if pool is None:
        raise SliceError(f"{s}: a GPU slice needs a pool")
    backend = get_backend(pool.backend)
    offer, notes = resolve_offer(s, pool)
    backend.check_offer(offer, pool)
    plan = backend.plan(offer, pool)

    equivalent = gpu_equivalent(offer, pool.gpu)
    memory = plan.memory_mib or slice_memory_mib(offer, pool.gpu)
    labels = {**plan.labels, LABEL_POOL: pool.name, LABEL_GPU: offer.label}
    annotations = {
        **plan.annotations,
        ANNOTATION_EQUIVALENT: decimal(equivalent),
        ANNOTATION_MEMORY: str(memory),
    }
    env: dict[str, str] = {}
    # a backend may say per offer (DRA: MIG is isolated, a memory share is only booked)
    enforced = backend.enforced(pool) or plan.enforced
    if not enforced and offer.kind != "whole":
        # JAX's fraction is of the memory the device reports, not of the marketing figure
        env.update(_soft_caps(memory, pool.gpu.device_memory_mib))
    env.update(plan.env)
    env[ENV_MEMORY] = str(memory)
    if pool.overcommit != 1:  # the server waits for room on a full GPU (serverext/swap.py)
        env[ENV_OVERCOMMIT] = decimal(pool.overcommit)

    scheduler = pool.options.get("scheduler_name") if pool.options else None
    return PodPlan(
        limits=MappingProxyType(dict(plan.limits)),
        requests=MappingProxyType(dict(plan.requests)),
        labels=MappingProxyType(labels),
        annotations=MappingProxyType(annotations),
        env=MappingProxyType(env),
        # the backend's selector wins over the pool's: it names the devices the keys need
        node_selector=MappingProxyType({**pool.node_selector, **plan.node_selector}),
        # read-only, like every mapping here: the plan is cached and shared (plan_slice)
        tolerations=tuple(pool.tolerations)
        + tuple(MappingProxyType(dict(t)) for t in plan.tolerations),
        scheduler_name=scheduler or plan.scheduler_name,
        image=plan.image or image_ref,
        extra_pod_config=MappingProxyType(dict(plan.extra_pod_config)),
        extra_container_config=MappingProxyType(dict(plan.extra_container_config)),
        gpu_equivalent=equivalent,
        memory_mib=memory,
        notes=notes + tuple(plan.notes),
        enforced=enforced,
        container_claims=tuple(MappingProxyType(dict(c)) for c in plan.container_claims),
        claim_templates=tuple(plan.claim_templates),
    )


_plan_slice_cached = lru_cache(maxsize=_PLAN_CACHE_SIZE)(_plan_slice)
