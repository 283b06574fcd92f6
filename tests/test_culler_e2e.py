"""The culler on the product path: a real JupyterHub with FracSpawner on devcluster, real
single-user servers and ipykernel kernels in devcluster "pods", the notebook extension on a
simulated GPU, and a real Prometheus scraping a dcgm-format exporter. One culling cycle at a time.

The policy comes from the catalog the hub itself loads (`--catalog`): the h100 pool overrides the
catalog's hour-long limits with seconds, so one idle server is culled and the other is not.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from pathlib import Path

import pytest
import yaml

from devcluster.localhub import free_port, http_json
from fracspawner.culler import Culler
from tests.conftest import DEMO_CATALOG, REPO
from tests.e2e_helpers import pods, spawn, stop, the_pod, wait_until
from tests.test_culler_support import CULLER_SCOPES, DcgmExporter, Prometheus

pytestmark = pytest.mark.e2e

CATALOG = yaml.safe_load(DEMO_CATALOG.read_text())
CATALOG["access"]["default"] = {"pools": "all", "max_gpu": 1}
CATALOG["idle"] = {"kernel_gpu_idle": "1h", "server_gpu_idle": "1h", "server_idle": "8h"}
CATALOG["pools"]["h100"]["idle"] = {"kernel_gpu_idle": "2s", "server_gpu_idle": "4s"}
H100_SERVER_GPU_IDLE = 4.0

CULLER_TOKEN = uuid.uuid4().hex
# The hub runs with its state dir as working directory: the simulated GPU file and the servers'
# jupyter config live there. FracSpawner keeps this admin environment in every pod it plans.
HUB_EXTRA_CONFIG = f"""
import os as _os
c.KubeSpawner.environment = {{
    "FRACSPAWNER_GPU_SOURCE": "sim:" + _os.path.join(_os.getcwd(), "gpu.json"),
    "JUPYTER_CONFIG_PATH": _os.path.join(_os.getcwd(), "server-config"),
    "PYTHONPATH": {str(REPO)!r},
}}
c.JupyterHub.services.append({{"name": "gpu-culler", "api_token": {CULLER_TOKEN!r}}})
c.JupyterHub.load_roles.append(
    {{"name": "gpu-culler", "scopes": {CULLER_SCOPES!r}, "services": ["gpu-culler"]}}
)
"""


@pytest.fixture(scope="module")
def gpu_file(hub) -> Path:
    config = hub.state_dir / "server-config"
    config.mkdir(exist_ok=True)
    # read the (simulated) GPU five times a second instead of every 5 s
    (config / "jupyter_server_config.json").write_text(
        json.dumps({"GpuMonitor": {"poll_interval": 0.2, "unavailable_retry": 0.2}})
    )
    path = hub.state_dir / "gpu.json"
    path.write_text("{}")
    return path


@pytest.fixture(scope="module")
def exporter():
    e = DcgmExporter()
    yield e
    e.stop()


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory, exporter):
    p = Prometheus(tmp_path_factory.mktemp("prometheus"), exporter.port)
    yield p
    p.stop()


def set_gpu(gpu_file: Path, kernels: dict) -> None:
    tmp = gpu_file.with_suffix(".tmp")
    tmp.write_text(json.dumps({"kernels": kernels}))
    tmp.replace(gpu_file)


def culler(hub, prometheus_url: str) -> Culler:
    """The culler as `fracspawner culler` would run beside this hub, from its command line."""
    c = Culler(api_token=CULLER_TOKEN)
    c.initialize(
        [
            f"--url={hub.api_url}",
            f"--catalog={hub.state_dir / 'catalog.yaml'}",  # the file the hub loaded
            f"--server-url={hub.url}",
            f"--prometheus-url={prometheus_url}",
            "--namespace=default",
            # the test Prometheus scrapes the exporter as a ServiceMonitor target would
            "--Culler.pod_label=exported_pod",
            "--Culler.namespace_label=exported_namespace",
            "--Culler.scrape_interval=1",
            "--Culler.min_coverage=0.5",
        ]
    )
    c.log.propagate = True  # into pytest's caplog
    return c


def server_api(hub, user: str, method: str, path: str, body=None, server: str = ""):
    base = f"{hub.url}/user/{user}/" + (f"{server}/" if server else "")
    return http_json(method, base + path.lstrip("/"), body, token=hub.admin_token, timeout=60)


def kernel_ids(hub, user: str) -> set[str]:
    status, body = server_api(hub, user, "GET", "/api/kernels")
    assert status == 200, body
    return {k["id"] for k in body}


def spawn_ready(hub, user: str, options: dict, server: str = "") -> None:
    status, body = spawn(hub, user, options, server)
    assert status in (201, 202), body
    hub.wait_ready(user, server)


def wait_kernel_memory(hub, user: str, kernel_id: str, memory: float) -> None:
    def seen() -> bool:
        status, report = server_api(hub, user, "GET", "/api/fracspawner/gpu")
        return status == 200 and any(
            k["id"] == kernel_id and k["gpu_memory_mib"] == memory
            for k in report.get("kernels", [])
        )

    wait_until(seen, 20, f"{user}'s kernel {kernel_id} holding {memory} MiB")


async def test_idle_gpu_kernel_shut_down_busy_silent_kernel_kept_server_and_pod_stay(
    hub, devcluster, gpu_file, exporter, prometheus, caplog
):
    spawn_ready(hub, "alice", {"gpu": "1/4", "pool": "h100"})
    pod = the_pod(devcluster, "alice")
    idle = server_api(hub, "alice", "POST", "/api/kernels", {"name": "python3"})[1]["id"]
    busy = server_api(hub, "alice", "POST", "/api/kernels", {"name": "python3"})[1]["id"]
    # a silent training loop: the busy kernel sends no message, only its GPU works
    set_gpu(gpu_file, {idle: {"memory_mib": 2048}, busy: {"memory_mib": 4096, "utilization": 90}})
    exporter.set(pod["metadata"]["name"], util=90, memory=6144)
    wait_kernel_memory(hub, "alice", idle, 2048)
    wait_kernel_memory(hub, "alice", busy, 4096)
    await asyncio.sleep(2.5)  # past the h100 pool's kernel_gpu_idle (2 s)

    c = culler(hub, prometheus.url)
    with caplog.at_level(logging.INFO):
        result = await c.cull_once()
    (outcome,) = result.outcomes
    assert outcome.decision.reason == "gpu_busy", outcome.decision.message
    assert {k.id: d.reason for k, d in outcome.kernels} == {
        idle: "kernel_gpu_idle",
        busy: "gpu_busy",
    }
    assert kernel_ids(hub, "alice") == {busy}
    assert f"shut down kernel {idle} on alice" in caplog.text
    # the server, its pod and the user's files stay
    assert hub.wait_ready("alice", timeout=1)
    assert the_pod(devcluster, "alice")["metadata"]["uid"] == pod["metadata"]["uid"]
    assert (
        c.metrics.registry.get_sample_value(
            "fracspawner_reclaimed_gpu_memory_mib_total", {"pool": "h100"}
        )
        == 2048
    )
    stop(hub, "alice", cluster=devcluster)


async def test_idle_gpu_server_stopped_and_pod_deleted_unless_prometheus_is_down(
    hub, devcluster, gpu_file, exporter, prometheus, caplog
):
    # a user name kubespawner must slug ('.' is not allowed in a pod name) and a named server
    user, server = "bob.smith", "train"
    for args in (
        # no pool: FracSpawner places half a GPU on h100, the only pool serving it (4 s policy)
        (user, {"gpu": "1/2"}, server),
        ("carol", {"gpu": "1/4", "pool": "t4"}, ""),  # the catalog's hour
    ):
        status, body = spawn(hub, *args)
        assert status in (201, 202), body
    hub.wait_ready(user, server)
    hub.wait_ready("carol")

    # the culler's pod names are the pods devcluster has (kubespawner's jupyter-{user_server})
    c = culler(hub, prometheus.url)
    listed = await c_servers(c)
    names = {s.facts.log_name: c.pod_of(s) for s in listed}
    in_cluster = {p["metadata"]["name"] for p in pods(devcluster)}
    assert set(names.values()) <= in_cluster, (names, in_cluster)
    bob_pod = names[f"{user}/{server}"]
    (placed,) = [p for p in pods(devcluster) if p["metadata"]["name"] == bob_pod]
    assert placed["metadata"]["labels"]["fracspawner.io/pool"] == "h100"
    assert bob_pod.startswith("jupyter-bob-smith-") and bob_pod.endswith("--train")
    exporter.set(bob_pod, util=0, memory=8192)
    exporter.set(names["carol"], util=0, memory=4096)
    await asyncio.sleep(H100_SERVER_GPU_IDLE + 1)  # scraped idle for the whole window

    # Prometheus down: the extension alone may not stop a GPU server
    down = culler(hub, f"http://127.0.0.1:{free_port()}")
    with caplog.at_level(logging.INFO):
        result = await down.cull_once()
    assert result.sources == {"prometheus": False, "extension": True}
    decisions = {o.server.facts.log_name: o.decision for o in result.outcomes}
    assert decisions[f"{user}/{server}"].action == "keep"
    assert decisions[f"{user}/{server}"].gpu_failsafe
    assert "not culled on GPU grounds" in caplog.text
    assert bob_pod in {p["metadata"]["name"] for p in pods(devcluster)}
    assert hub.wait_ready(user, server, timeout=1)

    # Prometheus up: one cycle stops the idle h100 server; the t4 one is within its pool's hour
    result = await c.cull_once()
    decisions = {o.server.facts.log_name: o.decision for o in result.outcomes}
    assert decisions[f"{user}/{server}"].reason == "gpu_idle", decisions[f"{user}/{server}"]
    assert decisions["carol"].action == "keep", decisions["carol"]
    hub.wait_stopped(user, server)
    wait_until(
        lambda: bob_pod not in {p["metadata"]["name"] for p in pods(devcluster)},
        30,
        f"pod {bob_pod} deleted",
    )
    assert names["carol"] in {p["metadata"]["name"] for p in pods(devcluster)}
    metrics = c.metrics.registry
    assert (
        metrics.get_sample_value("fracspawner_culls_total", {"reason": "gpu_idle", "pool": "h100"})
        == 1
    )
    assert (
        metrics.get_sample_value("fracspawner_reclaimed_gpu_memory_mib_total", {"pool": "h100"})
        == 8192
    )
    stop(hub, "carol", cluster=devcluster)


async def c_servers(c: Culler):
    from fracspawner.culler.hubapi import HubClient

    hub = HubClient(c.url, c.api_token)
    try:
        return await hub.ready_servers()
    finally:
        hub.close()
