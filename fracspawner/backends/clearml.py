"""ClearML fractional GPUs: the enterprise injector and the open-source limited images.

Sources: allegroai/clearml-fractional-gpu README (images, hostPID, drivers) and
allegroai/clearml-docs (fractional GPU injector "Usage": the label and its valid values; the
agent k8s glue example pairing the label with an `nvidia.com/gpu: 1` limit).

- clearml-injector: pod LABEL `clearml-injector/fraction` with exactly one of "0.0625",
  "0.125", "0.250", "0.375", "0.500", "0.625", "0.750", "0.875", or whole GPUs "1.000", "2.000";
  the injector hard-limits memory. Pool option `gpu_limit: one | eighths | none` — the
  `nvidia.com/gpu` limit to add: 1 shared device (default, as in the docs' example), the number
  of eighths (injectors before 1.3.0 on time-slicing with 8 replicas), or none.
- clearml-image: the container image itself carries a driver-level memory limit:
  `clearml/fractional-gpu:<os>-<cuda>-<size>` with size 2gb/4gb/8gb/12gb. A slice gets the
  smallest image holding it. The pod MUST run with `hostPID: true` (otherwise the limit applies
  to the whole node). The plan SETS the image: users' image choice does not apply on such pools.
  Pool options: `os` (u22, u20), `cuda` (cu12.3, cu11.7, cu11.1), `repository`.
"""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction
from types import MappingProxyType
from typing import TYPE_CHECKING

from ..k8s.objects import quantity_int
from ..model.errors import SliceError
from ..model.slices import Slice, slice_memory_mib
from .base import CHECKED, TEXT, Backend, PodPlan, gpu_limit, option
from .fit import (
    GFD_GPU_REPLICAS,
    NVIDIA_GPU,
    CountedOffer,
    NodeCount,
    NotCountable,
    OfferCounter,
    SummedCounter,
    node_gpus,
)

if TYPE_CHECKING:
    from ..k8s.index import NodeSlot
    from ..model.catalog import Pool

LABEL = "clearml-injector/fraction"
#: the exact strings the injector accepts (clearml-docs, fractional GPU injector "Usage": the
#: eight fractions below and whole GPUs as "1.000", "2", "2.0"); no other fraction has a value
INJECTOR_VALUES: dict[Fraction, str] = {
    Fraction(1, 16): "0.0625",
    Fraction(1, 8): "0.125",
    Fraction(1, 4): "0.250",
    Fraction(3, 8): "0.375",
    Fraction(1, 2): "0.500",
    Fraction(5, 8): "0.625",
    Fraction(3, 4): "0.750",
    Fraction(7, 8): "0.875",
}
#: image sizes in GiB (clearml-fractional-gpu README, "Containers" table)
IMAGE_SIZES_GIB = (2, 4, 8, 12)
#: (os, cuda) variants published for every size (same table)
IMAGE_VARIANTS = frozenset(
    {("u22", "cu12.3"), ("u20", "cu12.3"), ("u22", "cu11.7"), ("u20", "cu11.1")}
)


class ClearmlInjectorBackend(Backend):
    name = "clearml-injector"
    enforces_memory = True
    modes = frozenset({"fraction", "whole"})
    summary = "ClearML fractional GPU injector: clearml-injector/fraction label"
    pool_options = MappingProxyType({"gpu_limit": CHECKED})

    def check_pool(self, pool: Pool) -> None:
        if option(pool, "gpu_limit", "one") not in ("one", "eighths", "none"):
            raise ValueError("options.gpu_limit: use one, eighths or none")

    def check_offer(self, s: Slice, pool: Pool) -> None:
        super().check_offer(s, pool)
        if s.kind == "fraction" and s.fraction not in INJECTOR_VALUES:
            # not "multiples of 1/16": 3/16 is one, and the injector has no label value for it
            takes = ", ".join(f"{f.numerator}/{f.denominator}" for f in INJECTOR_VALUES)
            raise SliceError(
                f"{s}: the ClearML injector takes only {takes} of a GPU (its label values "
                f"{', '.join(INJECTOR_VALUES.values())}) or whole GPUs"
            )
        if s.kind == "fraction" and option(pool, "gpu_limit", "one") == "eighths":
            assert s.fraction is not None
            if (s.fraction * 8).denominator != 1:
                raise SliceError(f"{s}: gpu_limit eighths needs multiples of 1/8")

    def plan(self, s: Slice, pool: Pool) -> PodPlan:
        if s.kind == "whole":
            return PodPlan(labels={LABEL: f"{s.count}.000"}, limits=gpu_limit(s.count))
        assert s.fraction is not None
        mode = option(pool, "gpu_limit", "one")
        limits = {}
        if mode == "one":
            limits = gpu_limit(1)
        elif mode == "eighths":
            limits = gpu_limit(int(s.fraction * 8))
        return PodPlan(labels={LABEL: INJECTOR_VALUES[s.fraction]}, limits=limits)

    count_pod_labels = (LABEL,)

    def counter(self, offer: CountedOffer) -> OfferCounter:
        """ClearML fractions (pod labels) against each node's GPU count, in sixteenths."""
        need = _units(offer.plan.labels.get(LABEL))
        if not need or need <= 0:
            return NotCountable(f"the plan has no {LABEL} label")
        return ClearmlCounter(need)


class ClearmlCounter(SummedCounter):
    note = "ClearML fractions against node GPU count"

    def __init__(self, need: int) -> None:
        self.need = need

    def count_node(self, slot: NodeSlot) -> NodeCount | None:
        state = slot.derived("clearml", lambda: _node_units(slot))
        if state is None:
            return None
        capacity, used = state
        return NodeCount(max(capacity - used, 0) // self.need, capacity // self.need)


#: the injector's finest step is 1/16 (0.0625); count in sixteenths to stay exact
_UNITS = 16


def _units(value: str | None) -> int | None:
    try:
        return round(float(value) * _UNITS) if value is not None else None
    except ValueError:
        return None


def _node_units(slot: NodeSlot) -> tuple[int, int] | None:
    """(capacity, used) in sixteenths of a GPU on one node."""
    assert slot.node is not None
    gpus = node_gpus(slot.node)
    if gpus is None:
        return None
    replicas = quantity_int(slot.node.labels.get(GFD_GPU_REPLICAS)) or 1
    used = 0
    for pod in slot.pods.values():
        units = _units(pod.labels.get(LABEL))
        if units is None:
            # a plain time-sliced pod: each replica is 1/replicas of a GPU
            replicas_held = pod.requests.get(NVIDIA_GPU, Decimal(0))
            units = math.ceil(replicas_held * _UNITS / replicas)
        used += units
    return gpus * _UNITS, used


def image_size_gib(memory_mib: int) -> int | None:
    """The smallest published image size holding `memory_mib`, or None."""
    for size in IMAGE_SIZES_GIB:
        if size * 1024 >= memory_mib:
            return size
    return None


class ClearmlImageBackend(Backend):
    name = "clearml-image"
    enforces_memory = True
    modes = frozenset({"memory", "fraction"})
    summary = "ClearML fractional-gpu images: memory limit in the image, hostPID"
    pool_options = MappingProxyType(
        {"os": TEXT, "cuda": TEXT, "repository": TEXT, "resource": TEXT}
    )

    def check_pool(self, pool: Pool) -> None:
        variant = (option(pool, "os", "u22"), option(pool, "cuda", "cu12.3"))
        if variant not in IMAGE_VARIANTS:
            known = ", ".join(f"{o}/{c}" for o, c in sorted(IMAGE_VARIANTS))
            raise ValueError(f"options.os/cuda: no image {variant[0]}-{variant[1]}; use {known}")

    def check_offer(self, s: Slice, pool: Pool) -> None:
        super().check_offer(s, pool)
        mib = slice_memory_mib(s, pool.gpu)
        if image_size_gib(mib) is None:
            raise SliceError(
                f"{s} ({mib} MiB) is more than the largest ClearML image "
                f"({IMAGE_SIZES_GIB[-1]} GiB)"
            )

    def plan(self, s: Slice, pool: Pool) -> PodPlan:
        mib = slice_memory_mib(s, pool.gpu)
        size = image_size_gib(mib)
        assert size is not None
        repository = option(pool, "repository", "clearml/fractional-gpu")
        variant = f"{option(pool, 'os', 'u22')}-{option(pool, 'cuda', 'cu12.3')}"
        image = f"{repository}:{variant}-{size}gb"
        notes = ()
        if size * 1024 != mib:
            notes = (f"{s} served by the {size} GiB image ({image})",)
        return PodPlan(
            limits=gpu_limit(1, option(pool, "resource", "nvidia.com/gpu")),
            image=image,
            extra_pod_config={"hostPID": True},
            memory_mib=size * 1024,
            notes=notes,
        )
