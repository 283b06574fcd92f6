"""Whole GPUs, no sharing: `nvidia.com/gpu: N` (Kubernetes "Schedule GPUs" docs)."""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING

from ..model.slices import Slice
from .base import TEXT, Backend, PodPlan, gpu_limit, option

if TYPE_CHECKING:
    from ..model.catalog import Pool


class WholeGpuBackend(Backend):
    name = "whole"
    enforces_memory = True  # nobody else is on the device
    modes = frozenset({"whole"})
    summary = "whole GPUs, no sharing"
    pool_options = MappingProxyType({"resource": TEXT})
    cannot_overcommit = "a whole GPU is one server's: what it leaves idle no other server could use"

    def plan(self, s: Slice, pool: Pool) -> PodPlan:
        return PodPlan(limits=gpu_limit(s.count, option(pool, "resource", "nvidia.com/gpu")))
