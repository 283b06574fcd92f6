"""Review s56, GPU backends: what a plan emits, against each backend's upstream source.

Each test names the upstream fact it checks.
"""

from __future__ import annotations

import pytest

from fracspawner.backends import load_catalog, plan_slice
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
