"""The culler on the product path: a real JupyterHub with FracSpawner on devcluster, real
single-user servers and ipykernel kernels in devcluster "pods", the notebook extension on a
simulated GPU pushing its reports to the culler with each server's own token, and a real
Prometheus scraping a dcgm-format exporter. One culling cycle at a time.

The policy comes from the catalog the hub itself loads (`--catalog`): the h100 pool overrides the
catalog's hour-long limits with seconds, so one idle server is culled and the other is not.
FracSpawner puts the pool's policy in each pod's environment: servers shut their own idle GPU
kernels down by it.

Trust: every request a user's server receives is recorded by a config file in the server's
config path, as a user could do in their home directory; through a whole culling cycle the
server sees no token but its own.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from pathlib import Path

import pytest
import yaml
from dateutil.parser import isoparse

from devcluster.localhub import free_port, http_json
from fracspawner.culler import Culler
from tests.conftest import DEMO_CATALOG, REPO
from tests.e2e_helpers import Browserless, env_of, pods, spawn, stop, the_pod, wait_until
from tests.test_culler_support import CULLER_SCOPES

pytestmark = pytest.mark.e2e

CATALOG = yaml.safe_load(DEMO_CATALOG.read_text())
CATALOG["access"]["default"] = {"pools": "all", "max_gpu": 1}
CATALOG["idle"] = {"kernel_gpu_idle": "1h", "server_gpu_idle": "1h", "server_idle": "8h"}
CATALOG["pools"]["h100"]["idle"] = {"kernel_gpu_idle": "2s", "server_gpu_idle": "4s"}
H100_SERVER_GPU_IDLE = 4.0

CULLER_TOKEN = uuid.uuid4().hex
REPORT_PORT = free_port()
PREFIX = "/services/gpu-culler/"
# The hub runs with its state dir as working directory: the simulated GPU file and the servers'
# jupyter config live there. FracSpawner keeps this admin environment in every pod it plans.
HUB_EXTRA_CONFIG = f"""
import os as _os
c.KubeSpawner.environment = {{
    "FRACSPAWNER_GPU_SOURCE": "sim:" + _os.path.join(_os.getcwd(), "gpu.json"),
    "JUPYTER_CONFIG_PATH": _os.path.join(_os.getcwd(), "server-config"),
    "PYTHONPATH": {str(REPO)!r},
    # a user or admin cannot take over what fracspawner tells the notebook: dropped
    "FRACSPAWNER_KERNEL_GPU_IDLE_SECONDS": "0",
}}
c.FracSpawner.culler_url = "http://127.0.0.1:{REPORT_PORT}{PREFIX}"
c.JupyterHub.services.append({{"name": "gpu-culler", "api_token": {CULLER_TOKEN!r}}})
c.JupyterHub.load_roles.append(
    {{"name": "gpu-culler", "scopes": {CULLER_SCOPES!r}, "services": ["gpu-culler"]}}
)
"""

# what a user can put in their own server's config: log every request it receives, headers too
RECORDER = """
import json, os, time
from jupyter_server.log import log_request

_path = os.path.join({where!r}, "requests-%s-%s.jsonl" % (
    os.environ.get("JUPYTERHUB_USER", "?"), os.environ.get("JUPYTERHUB_SERVER_NAME", "")))
_own = os.environ.get("JUPYTERHUB_API_TOKEN", "")

def _record(handler):
    r = handler.request
    with open(_path, "a") as f:
        f.write(json.dumps({{"t": time.time(), "method": r.method, "uri": r.uri,
                            "headers": dict(r.headers), "own": _own}}) + "\\n")
    log_request(handler)

c.ServerApp.tornado_settings = {{"log_function": _record}}
"""


@pytest.fixture(scope="module")
def gpu_file(hub) -> Path:
    config = hub.state_dir / "server-config"
    config.mkdir(exist_ok=True)
    # read the (simulated) GPU five times a second and report twice a second
    (config / "jupyter_server_config.json").write_text(
        json.dumps(
            {
                "GpuMonitor": {"poll_interval": 0.2, "unavailable_retry": 0.2},
                "GpuReporter": {"report_interval": 0.5},
            }
        )
    )
    (config / "jupyter_server_config.py").write_text(RECORDER.format(where=str(hub.state_dir)))
    path = hub.state_dir / "gpu.json"
    path.write_text("{}")
    return path


# `exporter` (a stand-in dcgm-exporter) and `prometheus` are tests/conftest.py's


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
            f"--report-url=http://127.0.0.1:{REPORT_PORT}",
            f"--Culler.report_prefix={PREFIX}",
            f"--prometheus-url={prometheus_url}",
            "--namespace=default",
            # the test Prometheus scrapes the exporter as a ServiceMonitor target would
            "--Culler.pod_label=exported_pod",
            "--Culler.namespace_label=exported_namespace",
            "--Culler.coverage_step=1",
            "--Culler.max_sample_gap=5",
            "--Culler.max_staleness=30",
            # the servers here report twice a second (gpu_file): let them, as the extension's
            # once a minute is let through by the default (3 a minute)
            "--Culler.report_rate=600",
            "--Culler.report_burst=60",
        ]
    )
    c.log.propagate = True  # into pytest's caplog
    return c


def server_api(hub, user: str, method: str, path: str, body=None, server="", token=None):
    """A call to the user's server through the proxy; polls say `no_track_activity`."""
    base = f"{hub.url}/user/{user}/" + (f"{server}/" if server else "")
    return http_json(
        method, base + path.lstrip("/"), body, token=token or hub.admin_token, timeout=60
    )


def kernel_ids(hub, user: str, token=None) -> set[str]:
    status, body = server_api(hub, user, "GET", "/api/kernels?no_track_activity=1", token=token)
    assert status == 200, body
    return {k["id"] for k in body}


def spawn_ready(hub, user: str, options: dict, server: str = "") -> None:
    status, body = spawn(hub, user, options, server)
    assert status in (201, 202), body
    hub.wait_ready(user, server)


def gpu_report(hub, user: str, token=None) -> dict:
    return server_api(hub, user, "GET", "/api/fracspawner/gpu", token=token)[1]


def wait_kernel_memory(hub, user: str, kernel_id: str, memory: float, token=None) -> None:
    wait_until(
        lambda: any(
            k["id"] == kernel_id and k["gpu_memory_mib"] == memory
            for k in gpu_report(hub, user, token).get("kernels", [])
        ),
        20,
        f"{user}'s kernel {kernel_id} holding {memory} MiB",
    )


async def reports_from(c: Culler, *servers: tuple[str, str]) -> None:
    for _ in range(100):
        if all(c.reports.for_server(_facts(u, s)) for u, s in servers):
            return
        await asyncio.sleep(0.2)
    raise TimeoutError(f"no report from {servers}")


def _facts(user: str, server: str):
    from fracspawner.culler.decide import ServerFacts

    return ServerFacts(user, server)


async def test_server_shuts_its_idle_gpu_kernel_down_busy_silent_one_and_pod_stay(
    hub, devcluster, gpu_file, exporter, prometheus, caplog
):
    spawn_ready(hub, "alice", {"gpu": "1/4", "pool": "h100"})
    pod = the_pod(devcluster, "alice")
    env = env_of(pod)
    # the pool's policy and the culler's address, set by FracSpawner; the admin's "0" dropped
    assert env["FRACSPAWNER_KERNEL_GPU_IDLE_SECONDS"] == "2"
    assert env["FRACSPAWNER_SERVER_GPU_IDLE_SECONDS"] == "4"
    assert env["FRACSPAWNER_SERVER_UNATTENDED_SECONDS"] == "86400"
    assert (env["FRACSPAWNER_GPU_SLICE"], env["FRACSPAWNER_GPU_POOL"]) == ("1/4", "h100")
    assert env["FRACSPAWNER_CULLER_URL"] == f"http://127.0.0.1:{REPORT_PORT}{PREFIX}"
    idle = server_api(hub, "alice", "POST", "/api/kernels", {"name": "python3"})[1]["id"]
    busy = server_api(hub, "alice", "POST", "/api/kernels", {"name": "python3"})[1]["id"]
    # a silent training loop: the busy kernel sends no message, only its GPU works
    set_gpu(gpu_file, {idle: {"memory_mib": 2048}, busy: {"memory_mib": 4096, "utilization": 90}})
    exporter.set(pod["metadata"]["name"], util=90, memory=6144)
    wait_kernel_memory(hub, "alice", idle, 2048)

    c = culler(hub, prometheus.url)
    receiver = c.start_receiver()
    try:
        # the server itself shuts the idle kernel down after the pool's kernel_gpu_idle (2 s)
        wait_until(lambda: kernel_ids(hub, "alice") == {busy}, 30, "the idle kernel shut down")
        await reports_from(c, ("alice", ""))
        with caplog.at_level(logging.INFO):
            # until a report tells of the shut-down kernel and Prometheus has scraped the
            # exporter's reading of the pod (on a busy machine a scrape can come late)
            for _ in range(300):
                result = await c.cull_once()
                (outcome,) = result.outcomes
                scraped = "prometheus has no data" not in outcome.decision.message
                if scraped and "shut down its idle kernel" in caplog.text:
                    break
                await asyncio.sleep(0.2)
    finally:
        receiver.stop()
    assert outcome.decision.reason == "gpu_busy", outcome.decision.message
    assert outcome.gpu.source == "prometheus+extension"
    assert f"alice shut down its idle kernel {idle}" in caplog.text
    # shutting the kernel down was not activity: the server's activity is older than the cull
    report = gpu_report(hub, "alice")
    (culled,) = report["culled_kernels"]
    assert culled["id"] == idle
    assert isoparse(report["user_last_activity"]) < isoparse(culled["at"])
    # the server, its pod and the user's files stay
    assert hub.wait_ready("alice", timeout=1)
    assert the_pod(devcluster, "alice")["metadata"]["uid"] == pod["metadata"]["uid"]
    metrics = c.metrics.registry
    assert (
        metrics.get_sample_value(
            "fracspawner_culls_total", {"reason": "kernel_gpu_idle", "pool": "h100"}
        )
        == 1
    )
    assert (
        metrics.get_sample_value("fracspawner_reclaimed_gpu_memory_mib_total", {"pool": "h100"})
        == 2048
    )
    stop(hub, "alice", cluster=devcluster)


async def test_idle_gpu_server_stopped_and_pod_deleted_unless_a_source_fails(
    hub, devcluster, gpu_file, exporter, prometheus, caplog
):
    # a user name kubespawner must slug ('.' is not allowed in a pod name) and a named server
    user, server = "bob.smith", "train"
    for args in (
        # no pool: FracSpawner places a whole GPU on h100, the only pool serving it (4 s
        # policy). Whole, so DCGM's reading is the pod's own: on a shared slice it is the
        # device's and the culler counts the server's own report instead (culler/shared.py)
        (user, {"gpu": "1"}, server),
        ("carol", {"gpu": "1/4", "pool": "t4"}, ""),  # the catalog's hour
    ):
        status, body = spawn(hub, *args)
        assert status in (201, 202), body
    hub.wait_ready(user, server)
    hub.wait_ready("carol")
    set_gpu(gpu_file, {})

    c = culler(hub, prometheus.url)
    names = {s.facts.log_name: c.pod_of(s) for s in await c_servers(c)}
    in_cluster = {p["metadata"]["name"] for p in pods(devcluster)}
    assert set(names.values()) <= in_cluster, (names, in_cluster)
    bob_pod = names[f"{user}/{server}"]
    (placed,) = [p for p in pods(devcluster) if p["metadata"]["name"] == bob_pod]
    assert placed["metadata"]["labels"]["fracspawner.io/pool"] == "h100"
    assert bob_pod.startswith("jupyter-bob-smith-") and bob_pod.endswith("--train")
    exporter.set(bob_pod, util=0, memory=8192)
    exporter.set(names["carol"], util=0, memory=4096)
    await asyncio.sleep(H100_SERVER_GPU_IDLE + 1)  # scraped idle for the whole window

    # no report yet (the culler's endpoint is not up): a failed source, kept
    with caplog.at_level(logging.INFO):
        result = await c.cull_once()
    decision = {o.server.facts.log_name: o.decision for o in result.outcomes}[f"{user}/{server}"]
    assert decision.action == "keep" and decision.gpu_failsafe, decision.message
    assert "GPU source extension has no data" in caplog.text
    assert result.sources == {"prometheus": True, "extension": False}

    receiver = c.start_receiver()
    try:
        await reports_from(c, (user, server), ("carol", ""))
        # Prometheus down: the reports alone may not stop a GPU server
        down = culler(hub, f"http://127.0.0.1:{free_port()}")
        down.reports = c.reports
        result = await down.cull_once()
        assert result.sources == {"prometheus": False, "extension": True}
        decisions = {o.server.facts.log_name: o.decision for o in result.outcomes}
        assert decisions[f"{user}/{server}"].action == "keep"
        assert decisions[f"{user}/{server}"].gpu_failsafe
        assert bob_pod in {p["metadata"]["name"] for p in pods(devcluster)}

        # both up: one cycle stops the idle h100 server; the t4 one is within its pool's hour
        result = await c.cull_once()
    finally:
        receiver.stop()
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


async def test_a_users_server_never_sees_a_token_but_its_own(
    hub, devcluster, gpu_file, exporter, prometheus
):
    # dave logs in and makes himself a token, as on the hub's token page
    browser = Browserless(hub, "dave")
    response = browser.session.post(
        f"{hub.url}/hub/api/users/dave/tokens",
        json={"note": "dave's own"},
        headers={"X-XSRFToken": browser.xsrf()},
        timeout=30,
    )
    assert response.status_code == 201, response.text
    own_user_token = response.json()["token"]
    spawn_ready(hub, "dave", {"gpu": "1/4", "pool": "h100"})
    pod = the_pod(devcluster, "dave")
    # dave works with his own token; then leaves an idle kernel holding GPU memory
    status, kernel = server_api(
        hub, "dave", "POST", "/api/kernels", {"name": "python3"}, token=own_user_token
    )
    assert status == 201, kernel
    set_gpu(gpu_file, {kernel["id"]: {"memory_mib": 1024}})
    exporter.set(pod["metadata"]["name"], util=0, memory=1024)
    wait_kernel_memory(hub, "dave", kernel["id"], 1024, token=own_user_token)
    record = hub.state_dir / "requests-dave-.jsonl"
    assert record.exists()  # the recorder works: dave's own requests are in it

    # a whole culling: reports pushed, the idle kernel shut down in the server, the server
    # stopped through the hub
    c = culler(hub, prometheus.url)
    receiver = c.start_receiver()
    try:
        for _ in range(100):
            result = await c.cull_once()
            if any(o.done for o in result.outcomes if o.server.facts.user == "dave"):
                break
            await asyncio.sleep(0.3)
        else:
            raise AssertionError("dave's idle server was not stopped")
    finally:
        receiver.stop()
    hub.wait_stopped("dave")
    requests = [json.loads(line) for line in record.read_text().splitlines()]
    own_server_token = requests[0]["own"]
    assert own_server_token
    seen = set()
    for r in requests:
        text = json.dumps(r["headers"]) + r["uri"]
        assert CULLER_TOKEN not in text and hub.admin_token not in text, r
        auth = r["headers"].get("Authorization", "")
        if auth:
            seen.add(auth.split()[-1])
        if "token=" in r["uri"]:
            seen.add(r["uri"].split("token=", 1)[1].split("&")[0])
    assert own_user_token in seen  # the recorder sees Authorization headers
    # dave's own token (his requests) and the server's own (if anything used it), nothing else
    assert seen <= {own_user_token, own_server_token}, seen


async def c_servers(c: Culler):
    from fracspawner.culler.hubapi import HubClient

    hub = HubClient(c.url, c.api_token)
    try:
        return await hub.ready_servers()
    finally:
        hub.close()
