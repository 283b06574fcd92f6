"""GKE's own GPU sharing: time-sharing, MPS and MIG partitions, chosen by node selectors.

Sources: GKE docs "Share GPUs with multiple workloads using GPU time-sharing", "... using
NVIDIA MPS" and "Running multi-instance GPUs"; GoogleCloudPlatform/container-engine-accelerators
pkg/gpu/nvidia (mig.go partition sizes, MPS env). A pod asks for `nvidia.com/gpu: 1` (more is
rejected on shared nodes) and selects
- `cloud.google.com/gke-gpu-sharing-strategy: time-sharing | mps` and
  `cloud.google.com/gke-max-shared-clients-per-gpu: "<N>"` (the pool's `replicas`), or
- `cloud.google.com/gke-gpu-partition-size: <profile>` for MIG,
plus `cloud.google.com/gke-accelerator: <type>` (pool option `accelerator`, else from the model).
Time-sharing has no memory isolation; MPS pins total/N memory per client; MIG is hardware.
MPS pods run with `hostIPC: true`: GKE's plugin mounts only the pipe directory /tmp/nvidia-mps
into a client (pkg/gpu/nvidia/manager.go), not the control daemon's shared memory, so clients
reach the daemon through the host's IPC namespace (GKE docs "Deploy workloads that use NVIDIA
MPS with GPUs": the example pod sets `hostIPC: true`).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING, ClassVar

from ..model.errors import SliceError
from ..model.slices import Slice
from .base import TEXT, Backend, PodPlan, ReplicaBackend, gpu_limit, option, plugin_replicas

if TYPE_CHECKING:
    from ..model.catalog import Pool

STRATEGY = "cloud.google.com/gke-gpu-sharing-strategy"
MAX_CLIENTS = "cloud.google.com/gke-max-shared-clients-per-gpu"
PARTITION = "cloud.google.com/gke-gpu-partition-size"
ACCELERATOR = "cloud.google.com/gke-accelerator"
#: GKE accelerator names (GKE docs "GPUs": available GPU models)
ACCELERATORS = {
    "T4": "nvidia-tesla-t4",
    "L4": "nvidia-l4",
    "A100-40GB": "nvidia-tesla-a100",
    "A100-80GB": "nvidia-a100-80gb",
    "H100-80GB": "nvidia-h100-80gb",
    "H200-141GB": "nvidia-h200-141gb",
}
#: GKE MIG partition sizes per GPU (container-engine-accelerators pkg/gpu/nvidia/mig)
GKE_PARTITIONS = {
    "A100-40GB": frozenset({"1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"}),
    "A100-80GB": frozenset({"1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"}),
    "H100-80GB": frozenset({"1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "7g.80gb"}),
    "H200-141GB": frozenset({"1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"}),
}
#: GKE caps clients per GPU at 48 (time-sharing and MPS docs)
MAX_SHARED_CLIENTS = 48


def _accelerator(pool: Pool) -> dict[str, str]:
    value = option(pool, "accelerator") or ACCELERATORS.get(pool.gpu.name)
    return {ACCELERATOR: value} if value else {}


class GkeTimeSharingBackend(ReplicaBackend):
    name = "gke-timesharing"
    enforces_memory = False
    summary = "GKE GPU time-sharing: 1 of N clients, no memory isolation"
    pool_options = MappingProxyType({"accelerator": TEXT})
    strategy = "time-sharing"
    #: pod spec keys the strategy needs (MPS: the host's IPC namespace)
    pod_config: ClassVar[dict[str, bool]] = {}
    max_replicas = MAX_SHARED_CLIENTS
    replicas_of = "the node pool's max-shared-clients-per-gpu"

    def plan(self, s: Slice, pool: Pool) -> PodPlan:
        clients = str(plugin_replicas(pool))  # replicas x overcommit (base.py)
        selector = {STRATEGY: self.strategy, MAX_CLIENTS: clients, **_accelerator(pool)}
        return PodPlan(
            limits=gpu_limit(1), node_selector=selector, extra_pod_config=dict(self.pod_config)
        )


class GkeMpsBackend(GkeTimeSharingBackend):
    name = "gke-mps"
    enforces_memory = True
    summary = "GKE MPS: 1 of N clients, pinned memory total/N"
    strategy = "mps"
    # the MPS clients' shared memory with the control daemon is the host's (module docstring)
    pod_config: ClassVar[dict[str, bool]] = {"hostIPC": True}
    cannot_overcommit = (
        "GKE's MPS pins each client to the GPU's memory / max-shared-clients-per-gpu, so more "
        "clients would make every slice smaller instead of over-committing; use gke-timesharing"
    )


class GkeMigBackend(Backend):
    name = "gke-mig"
    enforces_memory = True
    modes = frozenset({"mig"})
    summary = "GKE MIG partitions: nvidia.com/gpu on nodes of one partition size"
    pool_options = MappingProxyType({"accelerator": TEXT})
    cannot_overcommit = (
        "MIG partitions are fixed in hardware, each with memory of its own, and the CUDA "
        "checkpoint API that swaps idle kernels out does not support MIG "
        "(NVIDIA/cuda-checkpoint #42)"
    )

    def check_offer(self, s: Slice, pool: Pool) -> None:
        super().check_offer(s, pool)
        sizes = GKE_PARTITIONS.get(pool.gpu.name)
        if sizes is not None and s.profile not in sizes:
            raise SliceError(
                f"{s}: GKE partitions a {pool.gpu.name} only as {', '.join(sorted(sizes))}"
            )
        if s.profile and "+" in s.profile:
            raise SliceError(f"{s}: GKE has no media-extension partitions")

    def plan(self, s: Slice, pool: Pool) -> PodPlan:
        assert s.profile is not None
        return PodPlan(
            limits=gpu_limit(1), node_selector={PARTITION: s.profile, **_accelerator(pool)}
        )
