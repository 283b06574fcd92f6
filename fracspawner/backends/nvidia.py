"""NVIDIA k8s-device-plugin sharing: time-slicing and MPS.

Source: NVIDIA/k8s-device-plugin README ("Shared Access to GPUs"), api/config/v1 and
internal/plugin/mps.go. With `replicas: N` each GPU is advertised N times as `nvidia.com/gpu`
(or `nvidia.com/gpu.shared` with `renameByDefault: true`); a pod asks for ONE replica (asking for
more does not give proportionally more). So the only fraction such a pool offers is 1/N.
GFD labels the node `nvidia.com/gpu.replicas=<N>`, which the plan selects on so a pod lands on
a node sliced the way the catalog says.
- time-slicing: no memory or fault isolation (soft caps are added by plan_slice);
- MPS: the control daemon pins each client to total/N device memory and 100/N % of the SMs,
  so a replica is an enforced 1/N (labels `nvidia.com/gpu.sharing-strategy=mps`).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING

from ..model.slices import Slice
from .base import FLAG, PodPlan, ReplicaBackend, gpu_limit, option, plugin_replicas

if TYPE_CHECKING:
    from ..model.catalog import Pool

#: MPS: at most 48 clients per GPU on compute capability >= 7.5 (NVIDIA MPS docs)
MPS_MAX_REPLICAS = 48


def shared_resource(pool: Pool) -> str:
    """The resource name the device plugin advertises for this pool."""
    return "nvidia.com/gpu.shared" if option(pool, "rename_by_default") else "nvidia.com/gpu"


class TimeSlicingBackend(ReplicaBackend):
    name = "timeslicing"
    enforces_memory = False
    summary = "NVIDIA device-plugin time-slicing: 1 of N replicas, no memory isolation"
    pool_options = MappingProxyType({"rename_by_default": FLAG})
    strategy_label: str | None = None

    def plan(self, s: Slice, pool: Pool) -> PodPlan:
        # GFD labels the node with the plugin's replicas: replicas x overcommit (base.py)
        selector = {"nvidia.com/gpu.replicas": str(plugin_replicas(pool))}
        if self.strategy_label:
            selector["nvidia.com/gpu.sharing-strategy"] = self.strategy_label
        return PodPlan(limits=gpu_limit(1, shared_resource(pool)), node_selector=selector)


class MpsBackend(TimeSlicingBackend):
    name = "mps"
    enforces_memory = True
    summary = "NVIDIA device-plugin MPS: 1 of N replicas, memory and SMs limited to 1/N"
    strategy_label = "mps"
    # the control daemon pins every client to total/replicas of the device memory
    # (k8s-device-plugin internal/plugin/mps.go; shared/reference/gpu-backends.md): more
    # replicas would shrink each slice, enforced, instead of committing more than the GPU has
    cannot_overcommit = (
        "MPS limits each client to the GPU's memory / the device plugin's replicas, so more "
        "replicas would make every slice smaller instead of over-committing; use timeslicing"
    )

    def check_pool(self, pool: Pool) -> None:
        super().check_pool(pool)
        if pool.replicas and pool.replicas > MPS_MAX_REPLICAS:
            raise ValueError(f"replicas: MPS allows at most {MPS_MAX_REPLICAS} clients per GPU")
