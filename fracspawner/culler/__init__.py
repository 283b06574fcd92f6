"""The GPU-aware idle culler: see docs/culler.md."""

from .app import Culler, CycleResult
from .decide import (
    Decision,
    GpuFacts,
    KernelFacts,
    Rules,
    ServerFacts,
    decide_kernel,
    decide_server,
)

__all__ = [
    "Culler",
    "CycleResult",
    "Decision",
    "GpuFacts",
    "KernelFacts",
    "Rules",
    "ServerFacts",
    "decide_kernel",
    "decide_server",
]
