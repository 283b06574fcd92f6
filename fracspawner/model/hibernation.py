"""Where GPU hibernation helps: the names this module gave its rule before kernel_gpu_idle
followed the same one (model/idle_defaults.py, where the rule now lives)."""

from __future__ import annotations

from .idle_defaults import (
    HIBERNATE_DEFAULT,
    SHARED_MEMORY_BACKENDS,
    backend_default,
    frees_usable_memory,
    why_not_usable,
)

__all__ = [
    "HIBERNATE_DEFAULT",
    "SHARED_MEMORY_BACKENDS",
    "default_hibernate",
    "hibernation_helps",
    "why_it_cannot_help",
]


def hibernation_helps(backend: str, overcommit: float = 1.0) -> bool:
    """Whether memory a hibernated kernel frees on this pool's GPUs is usable by others."""
    return frees_usable_memory(backend, overcommit)


def default_hibernate(backend: str, overcommit: float = 1.0) -> float | None:
    """kernel_gpu_hibernate for a pool whose catalog does not set it (seconds; None = off)."""
    return backend_default("kernel_gpu_hibernate", backend, overcommit)


def why_it_cannot_help(backend: str) -> str:
    """Why hibernation frees nothing usable on a pool of this backend without over-commit."""
    return why_not_usable(backend, "kernel_gpu_hibernate")
