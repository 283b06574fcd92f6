"""NVIDIA MIG through the k8s-device-plugin's two strategies.

Source: NVIDIA/k8s-device-plugin internal/rm/rm.go and tests/expected-output-mig-*.txt;
GPU Feature Discovery README (labels).
- mixed: each profile is its own resource, `nvidia.com/mig-<profile>`; "+me" profiles become
  ".me" in the resource name (`nvidia.com/mig-1g.10gb.me`).
- single: every MIG device is an `nvidia.com/gpu`; which profile a node serves shows in the GFD
  label `nvidia.com/gpu.product=<product>-MIG-<profile>`, so a node selector picks it.
MIG isolates memory and compute in hardware.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING

from ..model.errors import SliceError
from ..model.slices import Slice
from .base import TEXT, Backend, PodPlan, gpu_limit, option

if TYPE_CHECKING:
    from ..model.catalog import Pool


#: MIG cannot over-commit (Backend.cannot_overcommit)
MIG_NO_OVERCOMMIT = (
    "MIG instances are fixed in hardware, each with memory of its own, and the CUDA checkpoint "
    "API that swaps idle kernels out does not support MIG (NVIDIA/cuda-checkpoint #42)"
)


def mig_resource(profile: str) -> str:
    """`nvidia.com/mig-<profile>`, with '+me' written '.me' as the device plugin names it."""
    return "nvidia.com/mig-" + profile.replace("+", ".")


class MigMixedBackend(Backend):
    name = "mig-mixed"
    enforces_memory = True
    modes = frozenset({"mig"})
    summary = "NVIDIA MIG, mixed strategy: one resource per profile"
    cannot_overcommit = MIG_NO_OVERCOMMIT
    pool_options = MappingProxyType({})

    def check_pool(self, pool: Pool) -> None:
        if not pool.gpu.mig_profiles:
            raise ValueError(f"gpu: {pool.gpu.name} has no MIG profiles")

    def plan(self, s: Slice, pool: Pool) -> PodPlan:
        assert s.profile is not None
        return PodPlan(limits={mig_resource(s.profile): "1"})


class MigSingleBackend(Backend):
    name = "mig-single"
    enforces_memory = True
    modes = frozenset({"mig"})
    summary = "NVIDIA MIG, single strategy: nvidia.com/gpu on nodes labelled with the profile"
    cannot_overcommit = MIG_NO_OVERCOMMIT
    pool_options = MappingProxyType({"product": TEXT})

    def check_pool(self, pool: Pool) -> None:
        if not pool.gpu.mig_profiles:
            raise ValueError(f"gpu: {pool.gpu.name} has no MIG profiles")
        if not (option(pool, "product") or pool.gpu.product):
            raise ValueError(
                "options.product: the GFD product name (e.g. NVIDIA-A100-SXM4-80GB) is needed "
                "to select nodes by MIG profile"
            )

    def check_offer(self, s: Slice, pool: Pool) -> None:
        super().check_offer(s, pool)
        if s.profile and "+" in s.profile:
            # GFD names a MIG device in the product label by its slices and memory alone
            # (gpu-feature-discovery getMigDeviceName: "<g>g.<gb>gb"), so a node of +me
            # instances reads as the plain profile: no label selects them
            plain = s.profile.split("+")[0]
            raise SliceError(
                f"{s}: mig-single cannot select media-extension instances: GPU Feature Discovery "
                f"labels such a node {plain!r}, like one of plain {plain} instances. Offer "
                f"mig-{plain}, or use mig-mixed, where {s.profile} is its own resource "
                f"({mig_resource(s.profile)})"
            )

    def plan(self, s: Slice, pool: Pool) -> PodPlan:
        product = option(pool, "product") or pool.gpu.product
        return PodPlan(
            limits=gpu_limit(1),
            node_selector={"nvidia.com/gpu.product": f"{product}-MIG-{s.profile}"},
        )
