"""End to end: a real JupyterHub + proxy + FracSpawner on the real control plane (kube-apiserver,
kube-scheduler with HAMi's extender, the node agent running the pods), real single-user servers.

Each documented form path and REST call yields the pod its backend documents; the kubespawner#546
leak sequence; quotas across named servers; access rules; capacity exhaustion; messages shown to
the user. Pods are checked in devcluster itself.
"""

from __future__ import annotations

import copy

import pytest
import yaml
from dateutil.parser import isoparse

from devcluster.localhub import http_json
from tests.conftest import DEMO_CATALOG, DEMO_TOPOLOGY
from tests.e2e_helpers import (
    Browserless,
    container,
    ensure_group,
    env_of,
    error_on_page,
    fracspawner_marks,
    gpu_keys,
    port_open,
    processes_of_user,
    server_pods,
    spawn,
    stop,
    the_pod,
    wait_until,
)

pytestmark = pytest.mark.e2e

# The demo catalog plus a clearml-image pool on an L4 node, so the four backends of the
# acceptance list (mig-mixed, hami, timeslicing, clearml-image) all spawn for real.
CATALOG = yaml.safe_load(DEMO_CATALOG.read_text())
CATALOG["pools"]["l4-clearml"] = {
    "display_name": "L4 24GB (ClearML fractional images)",
    "gpu": "L4",
    "backend": "clearml-image",
    "node_selector": {"nvidia.com/gpu.product": "NVIDIA-L4"},
    "offers": ["2GiB", "4GiB", "8GiB"],
}
CATALOG["access"]["groups"]["ml-research"] = {"pools": "all", "max_gpu": 2}

TOPOLOGY = yaml.safe_load(DEMO_TOPOLOGY.read_text())
_L4_NODE = {
    "name": "gpu-l4-1",
    "labels": {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": "NVIDIA-L4",
        "nvidia.com/gpu.memory": "23034",
        "nvidia.com/gpu.count": "1",
    },
    "capacity": {"cpu": "16", "memory": "64Gi", "pods": "110", "nvidia.com/gpu": "1"},
}


def _with_l4(topology: dict) -> dict:
    topology = copy.deepcopy(topology)
    topology.setdefault("nodes", []).append(_L4_NODE)
    return topology


TOPOLOGY = _with_l4(TOPOLOGY)


def test_rest_spawn_on_hami_pool_serves_through_proxy(hub, devcluster):
    status, body = spawn(hub, "alice", {"gpu": "1/4", "pool": "h100"})
    assert status in (201, 202), body
    hub.wait_ready("alice")

    # the real single-user server answers through the real proxy with a token
    status, model = http_json("GET", f"{hub.url}/user/alice/api/status", token=hub.admin_token)
    assert status == 200 and "started" in model

    pod = the_pod(devcluster, "alice")
    # HAMi keys (Project-HAMi/HAMi pkg/device/nvidia/device.go): 1 vGPU, a quarter of the
    # memory the device registered (as a percentage, so four fit), percent of SMs
    assert gpu_keys(pod) == {
        "nvidia.com/gpu": "1",
        "nvidia.com/gpumem-percentage": "25",
        "nvidia.com/gpucores": "25",
    }
    assert fracspawner_marks(pod) == {
        "fracspawner.io/pool": "h100",
        "fracspawner.io/gpu": "0.25",
        "fracspawner.io/gpu-equivalent": "0.25",
        "fracspawner.io/gpu-memory-mib": "20389",  # 25% of the 81559 MiB an H100 reports
    }
    assert env_of(pod)["FRACSPAWNER_GPU_MEMORY_MIB"] == "20389"
    # the hub's start time, from which the culler counts max_age: the meter warns before it
    _, user = http_json("GET", f"{hub.url}/hub/api/users/alice", token=hub.admin_token)
    started = env_of(pod)["FRACSPAWNER_SERVER_STARTED"]
    assert isoparse(started) == isoparse(user["servers"][""]["started"])
    # HAMi's scheduler extender put it on one device, as HAMi annotates its pods
    allocated = pod["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"]
    assert allocated.endswith(",NVIDIA,20389,25:;")
    assert "CUDA_DISABLE_CONTROL" not in env_of(pod)
    assert pod["spec"]["nodeName"] == "gpu-h100-1"
    ip = pod["status"]["podIP"]
    assert port_open(ip, 8888)
    assert processes_of_user("alice")

    stop(hub, "alice", cluster=devcluster)
    assert not port_open(ip, 8888)
    wait_until(lambda: not processes_of_user("alice"), what="alice's processes to end")


def test_form_spawn_on_mig_pool(hub, devcluster):
    ensure_group(hub, "ml-research", "mira")
    browser = Browserless(hub, "mira")
    html = browser.spawn_form()
    assert 'name="gpu"' in html and 'value="mig-1g.10gb"' in html
    assert "free" in html  # counts are shown next to each offer

    response = browser.submit({"gpu": "mig-1g.10gb", "pool": "a100-mig", "image": "pytorch"})
    assert response.status_code == 200, response.text[-2000:]
    hub.wait_ready("mira")
    pod = the_pod(devcluster, "mira")
    # MIG mixed strategy (NVIDIA/k8s-device-plugin internal/rm/rm.go): one resource per profile
    assert gpu_keys(pod) == {"nvidia.com/mig-1g.10gb": "1"}
    assert fracspawner_marks(pod)["fracspawner.io/gpu"] == "mig-1g.10gb"
    assert pod["spec"]["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"

    # previously chosen options are pre-selected on the next form
    stop(hub, "mira", cluster=devcluster)
    html = browser.spawn_form()
    assert 'value="mig-1g.10gb"\n' in html or 'value="mig-1g.10gb" ' in html
    assert "checked" in html.split('value="mig-1g.10gb"', 1)[1].split(">", 1)[0]


def test_rest_spawn_on_timeslicing_pool(hub, devcluster):
    ensure_group(hub, "ml-research", "tim")
    status, body = spawn(hub, "tim", {"gpu": "1/4", "pool": "t4"})
    assert status in (201, 202), body
    hub.wait_ready("tim")
    pod = the_pod(devcluster, "tim")
    # time-slicing (NVIDIA/k8s-device-plugin README): one replica of nvidia.com/gpu
    assert gpu_keys(pod) == {"nvidia.com/gpu": "1"}
    assert pod["spec"]["nodeSelector"]["nvidia.com/gpu.replicas"] == "4"
    env = env_of(pod)
    # no memory isolation: framework soft caps
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.25"
    stop(hub, "tim", cluster=devcluster)


def test_rest_spawn_on_clearml_image_pool(hub, devcluster):
    ensure_group(hub, "ml-research", "cleo")
    status, body = spawn(hub, "cleo", {"gpu": "3GiB", "pool": "l4-clearml"})
    # 3GiB is not offered: refused before any pod exists
    assert status == 400 and "does not offer" in body["message"]
    assert not server_pods(devcluster, "cleo")

    status, body = spawn(hub, "cleo", {"gpu": "4GiB", "pool": "l4-clearml"})
    assert status in (201, 202), body
    hub.wait_ready("cleo")
    pod = the_pod(devcluster, "cleo")
    # allegroai/clearml-fractional-gpu README: image per memory size, hostPID required
    assert container(pod)["image"].startswith("clearml/fractional-gpu:")
    assert container(pod)["image"].endswith("-4gb")
    assert pod["spec"]["hostPID"] is True
    assert gpu_keys(pod) == {"nvidia.com/gpu": "1"}
    stop(hub, "cleo", cluster=devcluster)


def test_gpu_then_failed_then_cpu_spawn_carries_no_gpu(hub, devcluster):
    """kubespawner#546: nothing of a GPU spawn may leak into a later CPU spawn."""
    ensure_group(hub, "ml-research", "lee")
    status, body = spawn(hub, "lee", {"gpu": "mig-2g.20gb", "pool": "a100-mig"})
    assert status in (201, 202), body
    hub.wait_ready("lee")
    assert gpu_keys(the_pod(devcluster, "lee")) == {"nvidia.com/mig-2g.20gb": "1"}
    stop(hub, "lee", cluster=devcluster)

    status, body = spawn(hub, "lee", {"gpu": "mig-7g.80gb", "pool": "a100-mig"})
    assert status == 400, body
    assert not server_pods(devcluster, "lee")

    status, body = spawn(hub, "lee", {"gpu": "none"})
    assert status in (201, 202), body
    hub.wait_ready("lee")
    pod = the_pod(devcluster, "lee")
    assert gpu_keys(pod) == {}
    assert fracspawner_marks(pod) == {}
    assert not any(k.startswith("nvidia.com/") for k in pod["spec"].get("nodeSelector") or {})
    assert not [t for t in pod["spec"].get("tolerations") or [] if "nvidia" in str(t)]
    assert "FRACSPAWNER_GPU_MEMORY_MIB" not in env_of(pod)
    stop(hub, "lee", cluster=devcluster)


def test_quota_across_named_servers(hub, devcluster):
    # default access in the demo catalog: pool h100, max 0.25 GPU across all servers
    for name in ("one", "two"):
        status, body = spawn(hub, "quinn", {"gpu": "1/8", "pool": "h100"}, server=name)
        assert status in (201, 202), body
        hub.wait_ready("quinn", name)
    status, body = spawn(hub, "quinn", {"gpu": "1/8", "pool": "h100"}, server="three")
    assert status == 400
    assert "Quota" in body["message"] and "1/4 GPU" in body["message"]
    assert not server_pods(devcluster, "quinn", "three")
    for name in ("one", "two"):
        stop(hub, "quinn", name, cluster=devcluster)


def test_pool_without_access_is_refused_on_form_and_rest(hub, devcluster):
    status, body = spawn(hub, "nora", {"gpu": "mig-1g.10gb", "pool": "a100-mig"})
    assert status == 400
    assert "may not use pool 'a100-mig'" in body["message"]
    browser = Browserless(hub, "nora")
    html = browser.spawn_form()
    # shown, but disabled with the reason
    assert "Your access rules do not include this pool." in html
    response = browser.submit({"gpu": "mig-1g.10gb", "pool": "a100-mig"})
    assert "may not use pool" in error_on_page(response.text)
    assert not server_pods(devcluster, "nora")


def test_unknown_option_and_injection_attempts_are_refused(hub, devcluster):
    for options in (
        {"gpu": "1/4", "pool": "h100", "environment": {"CUDA_DISABLE_CONTROL": "true"}},
        {"gpu": "1/4", "extra_resource_limits": {"nvidia.com/gpu": "8"}},
        {"gpu": "1/4", "image": "evil/image:latest"},
        {"gpu": "0.3"},
        {"gpu": "1/4", "pool": "h100", "profile": "x"},
    ):
        status, body = spawn(hub, "ivan", options)
        assert status == 400, (options, body)
        assert body["message"]
    assert not server_pods(devcluster, "ivan")
