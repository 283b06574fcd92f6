"""Review s56, GPU backends: what a plan emits, against each backend's upstream source.

Each test names the upstream fact it checks.
"""

from __future__ import annotations

import pytest

from fracspawner.backends import get_backend, load_catalog, plan_slice
from fracspawner.backends.fit import CountedOffer
from fracspawner.backends.volcano import _shares
from fracspawner.model.catalog import CatalogError
from fracspawner.model.slices import parse_slice


def make_pool(backend: str, gpu: str, offers: list, **extra):
    raw = {"gpu": gpu, "backend": backend, "offers": offers, **extra}
    catalog = load_catalog({"pools": {"p": raw}, "images": {"i": {"image": "busybox"}}})
    return catalog.pools["p"]


# --------------------------------------------------------------------------- GKE MPS
# GKE's device plugin gives an MPS client only the pipe directory (container-engine-accelerators
# pkg/gpu/nvidia/manager.go: mountPaths += {HostPath: /tmp/nvidia-mps}), not the control
# daemon's /dev/shm, which NVIDIA's plugin mounts into every client (k8s-device-plugin
# internal/plugin/mps.go: ContainerPath daemon.ShmDir()). MPS clients share memory with the
# server, so GKE's MPS pods run in the host's IPC namespace: GKE docs "Share GPUs with multiple
# workloads using NVIDIA MPS", "Deploy workloads", whose example pod sets `hostIPC: true`.
def test_gke_mps_pods_share_the_host_ipc_namespace():
    pool = make_pool("gke-mps", "T4", ["1/2"], replicas=2)
    plan = plan_slice(parse_slice("1/2"), pool, None)
    assert plan.extra_pod_config.get("hostIPC") is True


@pytest.mark.parametrize(
    ("backend", "gpu", "extra", "offer"),
    [
        ("gke-timesharing", "L4", {"replicas": 4}, "1/4"),
        ("mps", "T4", {"replicas": 2}, "1/2"),  # NVIDIA's plugin mounts the daemon's shm
        ("gke-mig", "A100-40GB", {}, "mig-1g.5gb"),
    ],
)
def test_no_host_ipc_where_no_mps_daemon_needs_it(backend, gpu, extra, offer):
    plan = plan_slice(parse_slice(offer), make_pool(backend, gpu, [offer], **extra), None)
    assert "hostIPC" not in plan.extra_pod_config


# --------------------------------------------------------------------------- Volcano vGPU
# volcano-vgpu-device-plugin pkg/plugin/register.go registers each GPU's memory as
# `Total MiB / gpuMemoryFactor` and pkg/plugin/server.go injects
# CUDA_DEVICE_MEMORY_LIMIT = `Usedmem * GPUMemoryFactor` "m": `volcano.sh/vgpu-memory` counts
# units of gpuMemoryFactor MiB. doc/design.md: every unit is one device and a node must stay at
# or under 60000 of them, so "a single 80GB card needs a factor of 2, a node with eight of them
# needs 11". A plan stating MiB there asks factor times the offer.
def test_volcano_memory_is_stated_in_the_plugins_memory_units():
    pool = make_pool("volcano", "A100-80GB", ["10GiB"], options={"memory_factor": 2})
    plan = plan_slice(parse_slice("10GiB"), pool, None)
    assert plan.limits["volcano.sh/vgpu-memory"] == "5120"
    assert plan.memory_mib == 10240


def test_volcano_memory_units_round_down_and_say_so():
    # 10 GiB in units of 11 MiB: 930 units = 10230 MiB, never 931 (10241 MiB, more than offered)
    pool = make_pool("volcano", "H100-80GB", ["10GiB"], options={"memory_factor": 11})
    plan = plan_slice(parse_slice("10GiB"), pool, None)
    assert plan.limits["volcano.sh/vgpu-memory"] == "930"
    assert plan.memory_mib == 930 * 11
    assert any("10230 MiB" in note for note in plan.notes), plan.notes


def test_volcano_memory_factor_leaves_fractions_alone():
    # vgpu-memory-percentage is a percentage of the registered memory, whatever its unit
    pool = make_pool("volcano", "A100-80GB", ["1/4", "1"], options={"memory_factor": 2})
    plan = plan_slice(parse_slice("1/4"), pool, None)
    assert plan.limits["volcano.sh/vgpu-memory-percentage"] == "25"
    assert "volcano.sh/vgpu-memory" not in plan.limits


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_volcano_memory_factor_must_be_a_positive_integer(bad):
    with pytest.raises(CatalogError, match="memory_factor"):
        make_pool("volcano", "A100-80GB", ["10GiB"], options={"memory_factor": bad})


def test_volcano_capacity_reads_memory_in_the_plugins_units():
    pool = make_pool("volcano", "A100-80GB", ["10GiB"], options={"memory_factor": 2})
    plan = plan_slice(parse_slice("10GiB"), pool, None)
    counter = get_backend("volcano").counter(CountedOffer(pool=pool, spec="10GiB", plan=plan))
    # 5120 units of 2 MiB on a GPU of 81920 MiB: 12.5 % of it, as 10 GiB is
    need = _shares(counter.limits, 81920, counter.factor)
    assert need is not None
    assert float(need[1]) == pytest.approx(12.5)
