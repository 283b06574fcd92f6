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

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ..k8s.objects import quantity_int
from ..model.slices import Slice, slice_memory_mib
from .base import FLAG, TEXT, Backend, PodPlan, decimal, gpu_limit, option
from .fit import (
    EPS,
    NVIDIA_GPU,
    CountedOffer,
    NodeCount,
    NotCountable,
    OfferCounter,
    SummedCounter,
    node_gpu_memory,
    node_gpus,
    tasks_on_node,
)

if TYPE_CHECKING:
    from ..k8s.index import NodeSlot
    from ..model.catalog import Pool

# kai-scheduler pkg/common/constants/constants.go
FRACTION = "gpu-fraction"
MEMORY = "gpu-memory"
NUM_DEVICES = "gpu-fraction-num-devices"
GPU_GROUP = "runai-gpu-group"


class RunaiBackend(Backend):
    name = "runai"
    enforces_memory = True
    modes = frozenset({"fraction", "memory", "whole"})
    summary = "Run:ai fractions: gpu-fraction / gpu-memory annotations, runai-scheduler"
    cannot_overcommit = (
        "Run:ai over-commits with its own GPU memory swap, a cluster setting of Run:ai "
        "(docs.run.ai, 'GPU memory swap'): turn that on there and leave overcommit at 1"
    )
    scheduler = "runai-scheduler"
    queue_label = "runai/queue"
    pool_options = MappingProxyType({"queue": TEXT, "queue_label": TEXT})

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

    count_pod_labels = (GPU_GROUP, GPU_GROUP + "/*")
    count_pod_annotations = (FRACTION, MEMORY, NUM_DEVICES)

    def counter(self, offer: CountedOffer) -> OfferCounter:
        """Run:ai/KAI keep fractions off the resource books: a reservation pod holds the GPU
        (nvidia.com/gpu: 1, label runai-gpu-group) and fractional pods share its group label."""
        annos = offer.plan.annotations
        whole = quantity_int(offer.plan.limits.get(NVIDIA_GPU, 0)) or 0
        if FRACTION not in annos and MEMORY not in annos and whole <= 0:
            return NotCountable("the plan asks for no GPU")
        return RunaiCounter(offer.pool, annos, whole)


class RunaiCounter(SummedCounter):
    """Fractions fitted into each node's untouched GPUs and sharing groups."""

    note = "GPU sharing groups from pod labels"

    def __init__(self, pool: Any, annos: Mapping[str, str], whole: int) -> None:
        self.pool = pool
        self.annos = dict(annos)
        self.whole = whole
        self.devices = quantity_int(annos.get(NUM_DEVICES)) or 1
        self.fractional = FRACTION in annos or MEMORY in annos

    def count_node(self, slot: NodeSlot) -> NodeCount | None:
        assert slot.node is not None
        gpu_mem = node_gpu_memory(slot.node, self.pool)
        # the state depends on the GPU memory `gpu-memory` pods are read against
        state = slot.derived(("runai", gpu_mem), lambda: _node_state(slot, gpu_mem))
        if state is None:
            return None
        if self.fractional:
            fraction = _fraction(self.annos, gpu_mem)
            if not fraction or fraction <= 0:
                return NodeCount(0, 0)
            return NodeCount(
                tasks_on_node(state.fits(fraction), self.devices),
                tasks_on_node([math.floor(1 / fraction + EPS)] * state.gpus, self.devices),
            )
        untouched = max(state.gpus - state.whole_used - len(state.groups), 0)
        return NodeCount(untouched // self.whole, state.gpus // self.whole)


def _fraction(annos: Mapping[str, str], gpu_mem: int | None) -> float | None:
    if FRACTION in annos:
        try:
            return float(annos[FRACTION])
        except ValueError:
            return None
    if MEMORY in annos and gpu_mem:
        mem = quantity_int(annos[MEMORY])
        return None if mem is None else min(mem / gpu_mem, 1.0)
    return None


@dataclass
class _SharedGpus:
    gpus: int
    whole_used: int
    groups: dict[str, float]  # GPU sharing group -> fraction used

    def fits(self, fraction: float) -> list[int]:
        """Tasks of `fraction` each GPU still takes: untouched GPUs first, then groups."""
        untouched = max(self.gpus - self.whole_used - len(self.groups), 0)
        per_gpu = math.floor(1 / fraction + EPS)
        return [per_gpu] * untouched + [
            max(math.floor((1 - used) / fraction + EPS), 0) for used in self.groups.values()
        ]


def _node_state(slot: NodeSlot, gpu_mem: int | None) -> _SharedGpus | None:
    assert slot.node is not None
    gpus = node_gpus(slot.node)
    if gpus is None:
        return None
    whole = 0
    groups: dict[str, float] = {}
    for pod in slot.bound():
        group_keys = [k for k in pod.labels if k == GPU_GROUP or k.startswith(GPU_GROUP + "/")]
        fraction = _fraction(pod.annotations, gpu_mem)
        names = [pod.labels[k] for k in sorted(group_keys)]
        if fraction is not None and not names:
            # not placed in a group yet: count it alone on its own GPUs, the safe side
            devices = quantity_int(pod.annotations.get(NUM_DEVICES)) or 1
            names = [f"{pod.uid or pod.key}/{i}" for i in range(devices)]
        if names:
            for name in names:
                groups[name] = groups.get(name, 0.0) + (fraction or 0.0)
            continue
        whole += quantity_int(pod.requests.get(NVIDIA_GPU, 0)) or 0
    return _SharedGpus(gpus=gpus, whole_used=whole, groups=groups)


class KaiBackend(RunaiBackend):
    name = "kai"
    enforces_memory = False
    summary = "KAI scheduler fractions: gpu-fraction / gpu-memory annotations, kai-scheduler"
    scheduler = "kai-scheduler"
    queue_label = "kai.scheduler/queue"
    pool_options = MappingProxyType({**RunaiBackend.pool_options, "enforced": FLAG})

    def enforced(self, pool: Pool) -> bool:
        # only with HAMi's kai-resource-isolator installed; the admin says so per pool
        return bool(option(pool, "enforced", False))
