"""Where GPU hibernation helps: the per-backend default of `idle.kernel_gpu_hibernate`.

A hibernated kernel's GPU memory moves to host memory. That is worth its host memory only where
someone else can then use the memory it freed on the GPU:

- time-slicing and MPS (NVIDIA's device plugin, GKE's time-sharing and MPS): pods share the
  whole GPU's memory, nothing is reserved per pod, so what one kernel frees another allocates;
- any pool that over-commits (`overcommit` > 1): the culler swaps idle kernels out so that the
  memory committed beyond the GPU's fits (docs/culler.md, "Over-commit and swap").

Elsewhere it frees nothing anyone can use: a MIG instance is a hardware partition (and the CUDA
checkpoint API does not support MIG: NVIDIA/cuda-checkpoint #42), a whole GPU is the pod's alone,
and reserving backends (HAMi, Run:ai / KAI, Volcano, ClearML, DRA shares) keep a slice's memory
for its pod whether the kernel is on the GPU or in host memory. There the default is off; the
catalog may still turn it on (catalog-wide or per pool), and `fracspawner check` warns that it
only costs host memory there.
"""

from __future__ import annotations

#: minutes-scale default where hibernation helps (10 min: before kernel_gpu_idle's 30 min)
HIBERNATE_DEFAULT = 600.0

#: backends whose pods share the GPU's memory without a per-pod reservation
SHARED_MEMORY_BACKENDS = frozenset({"timeslicing", "mps", "gke-timesharing", "gke-mps"})

_WHY_NOT = {
    "mig-mixed": "a MIG instance is a hardware partition: the memory a hibernated kernel frees "
    "is usable by no one else (and the CUDA checkpoint API does not support MIG: "
    "NVIDIA/cuda-checkpoint #42)",
    "mig-single": "a MIG instance is a hardware partition: the memory a hibernated kernel frees "
    "is usable by no one else (and the CUDA checkpoint API does not support MIG: "
    "NVIDIA/cuda-checkpoint #42)",
    "gke-mig": "a MIG instance is a hardware partition: the memory a hibernated kernel frees "
    "is usable by no one else (and the CUDA checkpoint API does not support MIG: "
    "NVIDIA/cuda-checkpoint #42)",
    "whole": "a whole GPU is its pod's alone: the memory a hibernated kernel frees is usable "
    "by no one else",
}


def hibernation_helps(backend: str, overcommit: float = 1.0) -> bool:
    """Whether memory a hibernated kernel frees on this pool's GPUs is usable by others."""
    return backend in SHARED_MEMORY_BACKENDS or overcommit > 1


def default_hibernate(backend: str, overcommit: float = 1.0) -> float | None:
    """kernel_gpu_hibernate for a pool whose catalog does not set it (seconds; None = off)."""
    return HIBERNATE_DEFAULT if hibernation_helps(backend, overcommit) else None


def why_it_cannot_help(backend: str) -> str:
    """Why hibernation frees nothing usable on a pool of this backend without over-commit."""
    return _WHY_NOT.get(
        backend,
        f"the {backend} backend reserves a slice's GPU memory for its pod whether the kernel "
        "is on the GPU or in host memory, so the memory it frees is usable by no one else "
        "unless the pool over-commits (overcommit > 1)",
    )
