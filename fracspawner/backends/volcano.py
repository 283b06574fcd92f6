"""Volcano vGPU (volcano-sh/devices, HAMi-core underneath).

Source: volcano-sh/volcano docs/user-guide/how_to_use_volcano_vgpu.md and the
volcano-vgpu-device-plugin README: limits `volcano.sh/vgpu-number` (vGPUs),
`volcano.sh/vgpu-memory` (MiB) or `volcano.sh/vgpu-memory-percentage`, `volcano.sh/vgpu-cores`
(percent of SMs); schedulerName `volcano`. HAMi-core enforces memory.

Pool options: `memory: mib | percentage`, `gpucores: proportional | none | <percent>` (as hami).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import Backend
from .hami import HamiBackend

if TYPE_CHECKING:
    from ..model.catalog import Pool

NUMBER = "volcano.sh/vgpu-number"
MEMORY = "volcano.sh/vgpu-memory"
MEMORY_PERCENT = "volcano.sh/vgpu-memory-percentage"
CORES = "volcano.sh/vgpu-cores"


class VolcanoBackend(HamiBackend):
    """HAMi's plan under Volcano's resource names and scheduler; counted against node
    allocatable (Volcano's device plugin publishes totals per node)."""

    name = "volcano"
    summary = "Volcano vGPU: vgpu-number/-memory/-cores, scheduler volcano"
    resources = (NUMBER, MEMORY, MEMORY_PERCENT, CORES)
    scheduler = "volcano"
    count_note = "node totals, not per-device fit"
    counter = Backend.counter  # the default: allocatable minus requests

    def plan_annotations(self, pool: Pool) -> dict[str, str]:
        return {}  # HAMi's type/policy annotations mean nothing to Volcano
