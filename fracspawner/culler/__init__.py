"""The GPU-aware idle culler: see docs/culler.md."""

from .app import Culler, CycleResult
from .decide import (
    Decision,
    GpuFacts,
    Reading,
    Rules,
    ServerFacts,
    combine,
    decide_server,
)

__all__ = [
    "Culler",
    "CycleResult",
    "Decision",
    "GpuFacts",
    "Reading",
    "Rules",
    "ServerFacts",
    "combine",
    "decide_server",
]
