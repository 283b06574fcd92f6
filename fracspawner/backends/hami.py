"""HAMi (Project-HAMi/HAMi): virtual GPUs with a hard memory limit and an SM share.

Source: Project-HAMi/HAMi charts/hami/values.yaml (resource names), pkg/device/nvidia/device.go
(annotations), docs/config.md. A pod asks for
- `nvidia.com/gpu`: number of physical GPUs (vGPUs) — 1 for a slice,
- `nvidia.com/gpumem`: device memory in MiB, or `nvidia.com/gpumem-percentage` (0-100),
- `nvidia.com/gpucores`: percent of the GPU's SMs (0-100); 100 means the device exclusively.
HAMi-core (libvgpu.so, preloaded) enforces the memory limit (OOM beyond it) and throttles SMs.
Annotation `nvidia.com/use-gputype` restricts the GPU types a pod may land on.

Pool options:
- `memory: mib | percentage` — state memory as MiB (default) or as gpumem-percentage;
- `gpucores: proportional | none | <0-100>` — SM share: the slice's share of the GPU (default),
  none (HAMi's default: no SM limit), or a fixed percent;
- `use_gputype: "A100,H100"`, `nouse_gputype`, `gpu_scheduler_policy: binpack|spread`,
  `node_scheduler_policy: binpack|spread` — passed on as HAMi's annotations.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..slices import Slice, SliceError, gpu_equivalent, slice_memory_mib
from .base import Backend, PodPlan, option

if TYPE_CHECKING:
    from ..catalog import Pool

GPU = "nvidia.com/gpu"
GPUMEM = "nvidia.com/gpumem"
GPUMEM_PERCENT = "nvidia.com/gpumem-percentage"
GPUCORES = "nvidia.com/gpucores"
_ANNOTATIONS = {
    "use_gputype": "nvidia.com/use-gputype",
    "nouse_gputype": "nvidia.com/nouse-gputype",
    "gpu_scheduler_policy": "hami.io/gpu-scheduler-policy",
    "node_scheduler_policy": "hami.io/node-scheduler-policy",
}


def _cores(s: Slice, pool: Pool) -> int | None:
    policy = option(pool, "gpucores", "proportional")
    if policy == "none":
        return None
    if policy == "proportional":
        # at least 1%: 0 would mean "no limit" to HAMi
        return max(1, min(100, math.floor(gpu_equivalent(s, pool.gpu) * 100)))
    return int(policy)


class HamiBackend(Backend):
    name = "hami"
    enforces_memory = True
    modes = frozenset({"fraction", "memory", "whole"})
    summary = "HAMi vGPU: memory limit (MiB) and SM percentage, enforced by HAMi-core"

    def check_pool(self, pool: Pool) -> None:
        if option(pool, "memory", "mib") not in ("mib", "percentage"):
            raise ValueError("options.memory: use mib or percentage")
        cores = option(pool, "gpucores", "proportional")
        if cores not in ("proportional", "none") and not (
            isinstance(cores, int) and not isinstance(cores, bool) and 1 <= cores <= 100
        ):
            raise ValueError("options.gpucores: use proportional, none or a percent 1-100")

    def check_offer(self, s: Slice, pool: Pool) -> None:
        super().check_offer(s, pool)
        if s.kind == "memory" and option(pool, "memory", "mib") == "percentage":
            assert s.memory_mib is not None
            if (s.memory_mib * 100) % pool.gpu.memory_mib:
                raise SliceError(
                    f"{s} is not a whole percent of a {pool.gpu.name}; with memory: percentage "
                    "offer fractions or memory sizes that are whole percents"
                )

    def plan(self, s: Slice, pool: Pool) -> PodPlan:
        limits: dict[str, str] = {}
        if s.kind == "whole":
            # exclusive devices: HAMi's fit check treats gpucores 100 as "wants this card
            # exclusively" (pkg/device/nvidia/device.go), and all of its memory
            limits = {GPU: str(s.count), GPUMEM_PERCENT: "100", GPUCORES: "100"}
        else:
            limits[GPU] = "1"
            mib = slice_memory_mib(s, pool.gpu)
            if option(pool, "memory", "mib") == "percentage":
                limits[GPUMEM_PERCENT] = str(math.floor(mib * 100 / pool.gpu.memory_mib))
            else:
                limits[GPUMEM] = str(mib)
            cores = _cores(s, pool)
            if cores is not None:
                limits[GPUCORES] = str(cores)
        annotations = {
            key: str(option(pool, opt)) for opt, key in _ANNOTATIONS.items() if option(pool, opt)
        }
        return PodPlan(limits=limits, annotations=annotations)
