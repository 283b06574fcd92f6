"""Idle defaults per backend: where the GPU memory an idle kernel gives up is usable by others.

Two idle settings free an idle kernel's GPU memory: `kernel_gpu_hibernate` moves it to host
memory (the kernel lives on), `kernel_gpu_idle` shuts the kernel down (its state is lost). Both
are worth their cost (host memory; a user who comes back to a dead kernel) only where someone
else can then use the memory freed on the GPU:

- time-slicing and MPS (NVIDIA's device plugin, GKE's time-sharing and MPS): pods share the
  whole GPU's memory, nothing is reserved per pod, so what one kernel frees another allocates;
- any pool that over-commits (`overcommit` > 1): the culler swaps idle kernels out so that the
  memory committed beyond the GPU's fits (docs/culler.md, "Over-commit and swap").

Elsewhere it frees nothing anyone can use: a MIG instance is a hardware partition (and the CUDA
checkpoint API does not support MIG: NVIDIA/cuda-checkpoint #42), a whole GPU is the pod's alone,
and reserving backends (HAMi, Run:ai / KAI, Volcano, ClearML, DRA shares) keep a slice's memory
for its pod whether its kernels hold it or not: only stopping the server (`server_gpu_idle`)
gives the slice back. There both default to off; the catalog may still turn them on
(catalog-wide or per pool), and `fracspawner check` warns that they cannot help there.

One rule (`frees_usable_memory`) decides both settings, so they cannot drift apart.
"""

from __future__ import annotations

from types import MappingProxyType

#: kernel_gpu_idle where it helps, and catalog-wide when the catalog does not set it (30 min)
KERNEL_GPU_IDLE_DEFAULT = 30 * 60.0
#: kernel_gpu_hibernate where it helps (10 min: before kernel_gpu_idle's 30 min)
HIBERNATE_DEFAULT = 600.0

#: the idle settings decided per pool by its backend when the catalog leaves them unset, and
#: their value where the memory they free is usable by others (off elsewhere)
PER_BACKEND = MappingProxyType(
    {"kernel_gpu_idle": KERNEL_GPU_IDLE_DEFAULT, "kernel_gpu_hibernate": HIBERNATE_DEFAULT}
)

#: backends whose pods share the GPU's memory without a per-pod reservation
SHARED_MEMORY_BACKENDS = frozenset({"timeslicing", "mps", "gke-timesharing", "gke-mps"})

_MIG = "a MIG instance is a hardware partition: the GPU memory an idle kernel frees is usable by "
_WHY_NOT = {
    "mig-mixed": _MIG,
    "mig-single": _MIG,
    "gke-mig": _MIG,
    "whole": "a whole GPU is its pod's alone: the GPU memory an idle kernel frees is usable by ",
}
#: what hibernation on MIG adds to the reason (the checkpoint API itself refuses there)
_MIG_CHECKPOINT = " (and the CUDA checkpoint API does not support MIG: NVIDIA/cuda-checkpoint #42)"


def frees_usable_memory(backend: str, overcommit: float = 1.0) -> bool:
    """Whether GPU memory an idle kernel frees on this pool's GPUs is usable by others."""
    return backend in SHARED_MEMORY_BACKENDS or overcommit > 1


def backend_default(key: str, backend: str, overcommit: float = 1.0) -> float | None:
    """A PER_BACKEND idle setting for a pool whose catalog leaves it unset (seconds; None: off)."""
    return PER_BACKEND[key] if frees_usable_memory(backend, overcommit) else None


def why_not_usable(backend: str, key: str = "kernel_gpu_idle") -> str:
    """Why the GPU memory an idle kernel frees on a pool of this backend without over-commit is
    usable by no one else (`key`: the setting the reason is for)."""
    start = _WHY_NOT.get(backend)
    if start is not None:
        extra = _MIG_CHECKPOINT if start is _MIG and key == "kernel_gpu_hibernate" else ""
        return f"{start}no one else{extra}"
    return (
        f"the {backend} backend reserves a slice's GPU memory for its pod whether its kernels "
        "hold it or not, so the memory an idle kernel frees is usable by no one else unless the "
        "pool over-commits (overcommit > 1)"
    )
