"""Volcano vGPU (volcano-sh/devices, HAMi-core underneath).

Source: volcano-sh/volcano docs/user-guide/how_to_use_volcano_vgpu.md, the
volcano-vgpu-device-plugin README and pkg/scheduler/api/devices/nvidia/vgpu: limits
`volcano.sh/vgpu-number` (vGPUs), `volcano.sh/vgpu-memory` (MiB) or
`volcano.sh/vgpu-memory-percentage`, `volcano.sh/vgpu-cores` (percent of SMs); schedulerName
`volcano`. HAMi-core enforces memory.

`volcano.sh/vgpu-memory` counts units of the device plugin's `gpuMemoryFactor` MiB (default 1):
the plugin registers `total MiB / factor` per GPU (pkg/plugin/register.go) and injects
`CUDA_DEVICE_MEMORY_LIMIT = units * factor` MiB (pkg/plugin/server.go); its doc/design.md asks
for a factor of 2 or more on 80 GB cards (at most 60000 units per node). Pool option
`memory_factor` says which; a memory size is stated in whole units, rounded down (the plan notes
what it gets).

As with HAMi, fractions are stated as `vgpu-memory-percentage`: Volcano's device fit turns it
into `device memory * percent / 100` of the memory the device plugin registered
(checkNodeGPUSharingPredicateAndScore in vgpu/utils.go), so N x 1/N fits a device whatever
memory it reports.

Pool options: `memory: mib | percentage`, `gpucores: proportional | none | <percent>` (as hami),
`memory_factor` (the plugin's gpuMemoryFactor, default 1).
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ..k8s.objects import quantity
from ..model.errors import SliceError
from ..model.slices import Slice
from .base import CHECKED, option
from .fit import (
    CountedOffer,
    NodeCount,
    NotCountable,
    OfferCounter,
    SummedCounter,
    node_gpu_memory,
    node_gpus,
)
from .hami import HamiBackend

if TYPE_CHECKING:
    from ..k8s.index import NodeSlot
    from ..k8s.records import NodeRecord
    from ..model.catalog import Pool

NUMBER = "volcano.sh/vgpu-number"
MEMORY = "volcano.sh/vgpu-memory"
MEMORY_PERCENT = "volcano.sh/vgpu-memory-percentage"
CORES = "volcano.sh/vgpu-cores"


class VolcanoBackend(HamiBackend):
    """HAMi's plan under Volcano's resource names and scheduler, counted from node totals."""

    name = "volcano"
    summary = "Volcano vGPU: vgpu-number/-memory/-cores, scheduler volcano"
    #: HAMi's type/policy annotations mean nothing to Volcano (plan_annotations)
    pool_options = MappingProxyType(
        {"memory": CHECKED, "gpucores": CHECKED, "memory_factor": CHECKED}
    )
    resources = (NUMBER, MEMORY, MEMORY_PERCENT, CORES)
    scheduler = "volcano"
    denies_privileged = False  # that rule is HAMi's own webhook's, not installed with Volcano
    count_note = "node totals, not per-device fit"
    cannot_overcommit = (
        "fracspawner counts Volcano's vGPU capacity from node totals, which do not show a "
        "device memory scaling; use hami"
    )

    has_memory_factor = True

    def check_offer(self, s: Slice, pool: Pool) -> None:
        super().check_offer(s, pool)
        factor = self.memory_factor(pool)
        if s.kind == "memory" and option(pool, "memory", "mib") == "mib":
            assert s.memory_mib is not None
            if s.memory_mib < factor:
                raise SliceError(
                    f"{s}: under one unit of volcano.sh/vgpu-memory ({factor} MiB, "
                    "options.memory_factor)"
                )

    def plan_annotations(self, pool: Pool) -> dict[str, str]:
        return {}  # HAMi's type/policy annotations mean nothing to Volcano

    def counter(self, offer: CountedOffer) -> OfferCounter:
        """Volcano checks only vgpu-number against node allocatable and fits memory and cores
        per device itself (GetIgnoredDevices lists memory, memory-percentage and cores), and
        the plugin publishes no percentage resource; so count vGPU slots from allocatable and
        memory and cores as shares of each node's GPUs (node totals, not per-device fit)."""
        if _shares(offer.plan.limits, None) is None:
            return NotCountable(f"the plan requests no {NUMBER}")
        return VolcanoCounter(offer, self.count_note, self.memory_factor(offer.pool))


class VolcanoCounter(SummedCounter):
    unseen = f"no matching node publishes {NUMBER}"

    def __init__(self, offer: CountedOffer, note: str, factor: int = 1) -> None:
        self.pool = offer.pool
        self.limits = dict(offer.plan.limits)
        self.note = note
        #: MiB per unit of vgpu-memory on the pool's nodes (the plugin's gpuMemoryFactor)
        self.factor = factor

    def count_node(self, slot: NodeSlot) -> NodeCount | None:
        assert slot.node is not None
        budget = _node_budget(slot.node)
        gpu_memory = node_gpu_memory(slot.node, self.pool)
        need = _shares(self.limits, gpu_memory, self.factor)
        if budget is None or need is None:
            return None
        held = slot.derived(
            ("volcano", gpu_memory, self.factor), lambda: _held(slot, gpu_memory, self.factor)
        )
        left = tuple(b - h for b, h in zip(budget, held, strict=True))
        return NodeCount(_fits(left, need), _fits(budget, need))  # type: ignore[arg-type]


# (vGPU slots, percent of one GPU's memory, percent of one GPU's SMs), summed over a node
Shares = tuple[Decimal, Decimal, Decimal]


def _shares(amounts: Mapping[str, Any], gpu_memory: int | None, factor: int = 1) -> Shares | None:
    """What a pod (or a plan) holds: slots, memory and cores in percent of one GPU
    (`gpu_memory` MiB; vgpu-memory counts units of `factor` MiB)."""
    nums = quantity(amounts.get(NUMBER))
    if not nums or nums <= 0:
        return None
    if MEMORY_PERCENT in amounts:
        memory = quantity(amounts[MEMORY_PERCENT]) or Decimal(0)
    elif MEMORY in amounts and gpu_memory:
        memory = (quantity(amounts[MEMORY]) or Decimal(0)) * factor * 100 / gpu_memory
    elif MEMORY in amounts:
        memory = Decimal(0)  # MiB on a node whose GPU memory is unknown: slots still count
    else:
        memory = Decimal(100)  # neither: the whole device (resourcereqs in vgpu/utils.go)
    cores = quantity(amounts.get(CORES)) or Decimal(0)
    return nums, nums * memory, nums * cores


def _node_budget(node: NodeRecord) -> Shares | None:
    slots = node.allocatable.get(NUMBER)
    gpus = node_gpus(node)
    if slots is None or not gpus:
        return None
    return slots, Decimal(100 * gpus), Decimal(100 * gpus)


def _held(slot: NodeSlot, gpu_memory: int | None, factor: int = 1) -> Shares:
    held = [Decimal(0)] * 3
    for pod in slot.pods.values():
        shares = _shares(pod.requests, gpu_memory, factor)
        if shares is not None:
            held = [h + s for h, s in zip(held, shares, strict=True)]
    return held[0], held[1], held[2]


def _fits(left: Shares, need: Shares) -> int:
    counts = [int(have // want) for have, want in zip(left, need, strict=True) if want > 0]
    return max(min(counts), 0) if counts else 0
