"""HAMi (Project-HAMi/HAMi): virtual GPUs with a hard memory limit and an SM share.

Source: Project-HAMi/HAMi charts/hami/values.yaml (resource names), pkg/device/nvidia/device.go
(annotations), docs/config.md. A pod asks for
- `nvidia.com/gpu`: number of physical GPUs (vGPUs) — 1 for a slice,
- `nvidia.com/gpumem`: device memory in MiB, or `nvidia.com/gpumem-percentage` (0-100),
- `nvidia.com/gpucores`: percent of the GPU's SMs (0-100); 100 means the device exclusively.
HAMi-core (libvgpu.so, preloaded) enforces the memory limit (OOM beyond it) and throttles SMs.
Annotation `nvidia.com/use-gputype` restricts the GPU types a pod may land on.

Fractions are stated as `gpumem-percentage`, never as MiB: HAMi's device plugin registers the
memory NVML reports (81559 MiB on an H100 80GB, times deviceMemoryScaling; pkg/device-plugin/
nvidiadevice/nvinternal/plugin/register.go) and its scheduler turns a percentage into
`devmem * percent / 100` of the device it fits on (computeMemreq, pkg/device/nvidia/
fit_checks.go), so N x 1/N always fits, whatever the device registers. Nominal MiB (20480 for
1/4 of an H100) left the last quarter of every GPU unschedulable. HAMi takes whole percents:
1/8 is 12% (9787 MiB of an H100, 4% less than an exact eighth; the plan notes it).

Over-commit (catalog `overcommit: S`): the pool's nodes run HAMi's device plugin with
`deviceMemoryScaling: S` (HAMi docs/config.md: "can be greater than 1 (enable virtual device
memory)"; a GPU of M MiB registers S x M, register.go), so S times the slices fit per GPU by
HAMi's own bookkeeping, which the capacity count reads. A fraction is then stated as its share
of the REGISTERED memory divided by S (a "1/4" at S = 2 asks 12 %, of 2 x M: a quarter of the
physical GPU, not half of it); MiB offers are MiB and need no change. The culler keeps what is
resident within the physical GPU by swapping idle kernels out (culler/pressure.py).

Pool options:
- `memory: mib | percentage` — how memory-size offers (10GiB) are stated: exact MiB (default)
  or the smallest whole gpumem-percentage of the model's NVML memory holding the size;
- `gpucores: proportional | none | <0-100>` — SM share: the slice's share of the GPU (default),
  none (HAMi's default: no SM limit), or a fixed percent;
- `use_gputype: "A100,H100"`, `nouse_gputype`, `gpu_scheduler_policy: binpack|spread`,
  `node_scheduler_policy: binpack|spread` — passed on as HAMi's annotations.
"""

from __future__ import annotations

import math
from functools import lru_cache
from types import MappingProxyType
from typing import TYPE_CHECKING, ClassVar

from ..model.slices import Slice, gpu_equivalent, slice_memory_mib
from . import hami_devices as devices
from .base import CHECKED, TEXT, Backend, PodPlan, option
from .fit import (
    UNREADABLE,
    CountedOffer,
    NodeCount,
    NotCountable,
    OfferCounter,
    SummedCounter,
    Tally,
)

if TYPE_CHECKING:
    from ..k8s.index import NodeSlot
    from ..model.catalog import Pool

GPU = devices.RESOURCE_COUNT
GPUMEM = devices.RESOURCE_MEM
GPUMEM_PERCENT = devices.RESOURCE_MEM_PERCENT
GPUCORES = devices.RESOURCE_CORES
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
        # at least 1%: 0 would mean "no limit" to HAMi. Over-committed S times, S times the
        # slices share the SMs: HAMi books gpucores per device up to 100 (fit_checks.go), so a
        # share of 100 / S keeps its count of slices per GPU the memory's
        share = gpu_equivalent(s, pool.gpu) * 100 / pool.overcommit
        return max(1, min(100, math.floor(share)))
    return int(policy)


class HamiBackend(Backend):
    name = "hami"
    enforces_memory = True
    modes = frozenset({"fraction", "memory", "whole"})
    summary = "HAMi vGPU: memory limit (MiB) and SM percentage, enforced by HAMi-core"
    pool_options = MappingProxyType(
        {"memory": CHECKED, "gpucores": CHECKED, **dict.fromkeys(_ANNOTATIONS, TEXT)}
    )
    #: resource names (count, MiB, percent of memory, percent of SMs) and scheduler; Volcano's
    #: vGPU device plugin is HAMi-core under other names
    resources: ClassVar[tuple[str, str, str, str]] = (GPU, GPUMEM, GPUMEM_PERCENT, GPUCORES)
    #: the plan names no scheduler: HAMi's webhook sets its own on pods asking its resources
    #: (Kubeflow's pods name none). Pool option `scheduler_name` names one.
    scheduler: ClassVar[str | None] = None
    #: HAMi's chart's `schedulerName`, which FracSpawner names on hub pods: HAMi's webhook
    #: leaves alone a pod that names another scheduler (pkg/scheduler/webhook.go), as z2jh's
    #: pods do by default (its user scheduler, which knows nothing of HAMi's devices)
    own_scheduler: ClassVar[str | None] = "hami-scheduler"
    #: HAMi's webhook denies a pod asking its resources with any privileged container, init
    #: containers included ("container <name> is privileged", pkg/scheduler/webhook.go)
    denies_privileged: ClassVar[bool] = True

    #: deviceMemoryScaling over-commits (module docstring)
    cannot_overcommit = ""
    #: whether pool option `memory_factor` says in how many MiB the memory resource counts
    #: (Volcano's gpuMemoryFactor); HAMi's plan states MiB
    has_memory_factor: ClassVar[bool] = False

    def memory_factor(self, pool: Pool) -> int:
        """MiB per unit of the memory resource (1: the resource counts MiB)."""
        return int(option(pool, "memory_factor", 1)) if self.has_memory_factor else 1

    def check_overcommit(self, pool: Pool) -> None:
        super().check_overcommit(pool)
        for offer in pool.offers:
            if offer.kind == "fraction" and offer.fraction is not None:
                if math.floor(offer.fraction * 100 / pool.overcommit) < 1:
                    raise ValueError(
                        f"{offer} over-committed {pool.overcommit:g} times is under 1 % of the "
                        f"memory HAMi registers ({self.name} takes whole percents)"
                    )

    def check_pool(self, pool: Pool) -> None:
        if option(pool, "memory", "mib") not in ("mib", "percentage"):
            raise ValueError("options.memory: use mib or percentage")
        cores = option(pool, "gpucores", "proportional")
        if cores not in ("proportional", "none") and not (
            isinstance(cores, int) and not isinstance(cores, bool) and 1 <= cores <= 100
        ):
            raise ValueError("options.gpucores: use proportional, none or a percent 1-100")
        if self.has_memory_factor:
            factor = option(pool, "memory_factor", 1)
            if not (isinstance(factor, int) and not isinstance(factor, bool) and factor >= 1):
                raise ValueError(
                    "options.memory_factor: the device plugin's gpuMemoryFactor, MiB per unit "
                    "of memory (a whole number, 1 or more)"
                )

    def plan(self, s: Slice, pool: Pool) -> PodPlan:
        count, mem, mem_percent, cores_key = self.resources
        notes: tuple[str, ...] = ()
        memory = 0
        if s.kind == "whole":
            # exclusive devices: HAMi's fit check treats gpucores 100 as "wants this card
            # exclusively" (pkg/device/nvidia/device.go), and all of its memory
            limits = {count: str(s.count), mem_percent: "100", cores_key: "100"}
        else:
            limits = {count: "1"}
            device = pool.gpu.device_memory_mib
            if s.kind == "fraction":
                assert s.fraction is not None
                # over-committed nodes register scale x the memory (deviceMemoryScaling): the
                # slice's share of the physical GPU is fraction / scale of what HAMi books
                scale = pool.overcommit
                percent = math.floor(s.fraction * 100 / scale)
                limits[mem_percent] = str(percent)
                # what computeMemreq grants on this model, registered at scale x its memory
                memory = math.floor(device * scale) * percent // 100
                if percent != s.fraction * 100 / scale:
                    of = "the GPU's memory" if scale == 1 else f"{scale:g} x the GPU's memory"
                    notes = (f"{s} is {percent}% of {of} ({self.name} takes whole percents)",)
            elif option(pool, "memory", "mib") == "percentage":
                assert s.memory_mib is not None
                # the smallest whole percent holding the size: at least what the offer says
                percent = min(math.ceil(s.memory_mib * 100 / device), 100)
                limits[mem_percent] = str(percent)
                memory = device * percent // 100
                notes = (f"{s} is stated as {percent}% of a {pool.gpu.name} ({memory} MiB)",)
            else:
                memory = slice_memory_mib(s, pool.gpu)
                # the resource counts units of `factor` MiB: whole units, rounded down so a
                # slice never gets more than its offer, and the plan says what it gets
                factor = self.memory_factor(pool)
                units = memory // factor
                limits[mem] = str(units)
                if units * factor != memory:
                    notes = (
                        f"{s} is {units} units of {factor} MiB ({units * factor} MiB; "
                        f"{self.name} counts memory in units of {factor} MiB)",
                    )
                    memory = units * factor
            cores = _cores(s, pool)
            if cores is not None:
                limits[cores_key] = str(cores)
        return PodPlan(
            limits=limits,
            annotations=self.plan_annotations(pool),
            scheduler_name=self.scheduler,
            memory_mib=memory,
            notes=notes,
        )

    def plan_annotations(self, pool: Pool) -> dict[str, str]:
        return {
            key: str(option(pool, opt)) for opt, key in _ANNOTATIONS.items() if option(pool, opt)
        }

    # what HAMi's own bookkeeping says (hami_devices): the pod annotations it writes and reads
    count_pod_annotations = (
        devices.ALLOCATED_ANNOTATION,
        devices.ASSIGNED_NODE_ANNOTATION,
        devices.GPU_IN_USE,
        devices.GPU_NO_USE,
    )
    count_node_annotations = (devices.REGISTER_ANNOTATION,)

    def counter(self, offer: CountedOffer) -> OfferCounter:
        """Per-device fit as HAMi's scheduler does it, from its node registration annotation
        and its pods' allocation annotations (hami_devices)."""
        req = devices.request_from_resources(offer.plan.limits, offer.plan.annotations)
        if req is None:
            return NotCountable(f"the plan requests no {devices.RESOURCE_COUNT}")
        return HamiCounter(req)


class HamiCounter(SummedCounter):
    """One offer's HAMi request fitted onto each node's registered devices."""

    unseen = f"no matching node has {devices.REGISTER_ANNOTATION}"

    def __init__(self, req: devices.HamiRequest) -> None:
        self.req = req

    def count_node(self, slot: NodeSlot) -> NodeCount | None:
        state = slot.derived("hami", lambda: _node_state(slot))
        if state is None:
            assert slot.node is not None
            text = slot.node.annotations.get(devices.REGISTER_ANNOTATION)
            # a registration in a form not understood (another HAMi version) is unknown, not
            # a node without GPUs
            return UNREADABLE if text and text.strip() else None
        return NodeCount(
            devices.node_tasks(state, self.req),
            devices.node_total(state, self.req),
            state.estimated,
        )

    def note_for(self, tally: Tally) -> str:
        return "HAMi per-device fit" + (", some placements estimated" if tally.estimated else "")


@lru_cache(maxsize=4096)
def _registered(text: str | None) -> tuple[devices.HamiDevice, ...] | None:
    """The registration annotation, parsed once per distinct text (nodes re-register the same
    devices over and over)."""
    found = devices.parse_node_devices(text)
    return tuple(found) if found is not None else None


def _node_state(slot: NodeSlot) -> devices.NodeDevices | None:
    """A node's registered devices, charged with what its pods (and pods HAMi assigned to it
    before binding) hold."""
    assert slot.node is not None
    registered = _registered(slot.node.annotations.get(devices.REGISTER_ANNOTATION))
    if registered is None:
        return None
    state = devices.NodeDevices(devices=list(registered))
    for pod in [*slot.bound(), *slot.booked()]:
        allocated = devices.parse_pod_devices(pod.annotations.get(devices.ALLOCATED_ANNOTATION))
        if allocated:
            devices.charge_allocation(state, allocated)
            continue
        req = devices.request_from_resources(pod.requests, pod.annotations)
        if req is not None:
            devices.charge_estimate(state, req)
    return state
