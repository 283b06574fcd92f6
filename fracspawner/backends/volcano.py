"""Volcano vGPU (volcano-sh/devices, HAMi-core underneath).

Source: volcano-sh/volcano docs/user-guide/how_to_use_volcano_vgpu.md and the
volcano-vgpu-device-plugin README: limits `volcano.sh/vgpu-number` (vGPUs),
`volcano.sh/vgpu-memory` (MiB) or `volcano.sh/vgpu-memory-percentage`, `volcano.sh/vgpu-cores`
(percent of SMs); schedulerName `volcano`. HAMi-core enforces memory.

Pool options: `memory: mib | percentage`, `gpucores: proportional | none | <percent>` (as hami).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..slices import Slice, slice_memory_mib
from .base import PodPlan, option
from .hami import HamiBackend, _cores

if TYPE_CHECKING:
    from ..catalog import Pool

NUMBER = "volcano.sh/vgpu-number"
MEMORY = "volcano.sh/vgpu-memory"
MEMORY_PERCENT = "volcano.sh/vgpu-memory-percentage"
CORES = "volcano.sh/vgpu-cores"


class VolcanoBackend(HamiBackend):
    name = "volcano"
    summary = "Volcano vGPU: vgpu-number/-memory/-cores, scheduler volcano"

    def plan(self, s: Slice, pool: Pool) -> PodPlan:
        if s.kind == "whole":
            limits = {NUMBER: str(s.count), MEMORY_PERCENT: "100", CORES: "100"}
        else:
            limits = {NUMBER: "1"}
            mib = slice_memory_mib(s, pool.gpu)
            if option(pool, "memory", "mib") == "percentage":
                limits[MEMORY_PERCENT] = str(math.floor(mib * 100 / pool.gpu.memory_mib))
            else:
                limits[MEMORY] = str(mib)
            cores = _cores(s, pool)
            if cores is not None:
                limits[CORES] = str(cores)
        return PodPlan(limits=limits, scheduler_name="volcano")
