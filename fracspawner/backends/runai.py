"""Run:ai and the open-source KAI scheduler: fractions and memory as pod annotations.

Sources: Run:ai docs ("GPU fractions"); NVIDIA/KAI-Scheduler pkg/common/constants/constants.go
(DefaultQueueLabel "kai.scheduler/queue", DefaultSchedulerName "kai-scheduler") and
docs/gpu-sharing (example pod: annotation `gpu-fraction: "0.5"`, schedulerName kai-scheduler);
run-ai/runai-cli cmd/util/const.go (RUNAI_QUEUE_LABEL "runai/queue", "gpu-fraction").
- `gpu-fraction: "0.25"` (0 < f < 1, written with a decimal point) or `gpu-memory: "<MiB>"`;
  no `nvidia.com/gpu` limit for fractions (the scheduler binds a shared device itself);
- whole GPUs are a plain `nvidia.com/gpu: N` limit;
- the pod must name the scheduler and carry a queue (project) label.
Run:ai enforces GPU memory; KAI alone does not (only with HAMi's kai-resource-isolator, see
pool option `enforced: true`).

Pool options: `queue` (the project/queue name; without it the namespace or a webhook must
supply the label), `queue_label` (override the label key), `enforced` (kai only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..slices import Slice, slice_memory_mib
from .base import Backend, PodPlan, decimal, gpu_limit, option

if TYPE_CHECKING:
    from ..catalog import Pool

FRACTION = "gpu-fraction"
MEMORY = "gpu-memory"


class RunaiBackend(Backend):
    name = "runai"
    enforces_memory = True
    modes = frozenset({"fraction", "memory", "whole"})
    summary = "Run:ai fractions: gpu-fraction / gpu-memory annotations, runai-scheduler"
    scheduler = "runai-scheduler"
    queue_label = "runai/queue"

    def plan(self, s: Slice, pool: Pool) -> PodPlan:
        # a pod is scheduled only in a queue (project); without the option, the queue comes
        # from elsewhere (Run:ai derives it from a project's namespace, or a webhook sets it)
        queue = option(pool, "queue")
        labels = {option(pool, "queue_label", self.queue_label): str(queue)} if queue else {}
        if s.kind == "whole":
            return PodPlan(limits=gpu_limit(s.count), labels=labels, scheduler_name=self.scheduler)
        if s.kind == "fraction":
            assert s.fraction is not None
            annotations = {FRACTION: decimal(float(s.fraction))}
        else:
            annotations = {MEMORY: str(slice_memory_mib(s, pool.gpu))}
        return PodPlan(labels=labels, annotations=annotations, scheduler_name=self.scheduler)


class KaiBackend(RunaiBackend):
    name = "kai"
    enforces_memory = False
    summary = "KAI scheduler fractions: gpu-fraction / gpu-memory annotations, kai-scheduler"
    scheduler = "kai-scheduler"
    queue_label = "kai.scheduler/queue"

    def enforced(self, pool: Pool) -> bool:
        # only with HAMi's kai-resource-isolator installed; the admin says so per pool
        return bool(option(pool, "enforced", False))
