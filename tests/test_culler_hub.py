"""The culler against a real JupyterHub with real single-user servers, real kernels and the
extension (simulated GPU), plus a real Prometheus: one culling cycle at a time.

Servers here are local processes (SimpleLocalProcessSpawner); tests/test_culler_e2e.py runs the
same culler against FracSpawner on the devcluster, where stopping a server deletes its pod.
"""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from devcluster.localhub import free_port
from fracspawner.culler import Culler
from tests.test_culler_support import DcgmExporter, LocalProcessHub, Prometheus, wait_for

pytestmark = pytest.mark.e2e

POLICY = {"kernel_gpu_idle": "2", "server_gpu_idle": "4", "server_idle": "600"}


@pytest.fixture(scope="module")
def gpu_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpu") / "gpu.json"
    path.write_text("{}")
    return path


@pytest.fixture(scope="module")
def hub(tmp_path_factory, gpu_file):
    h = LocalProcessHub(tmp_path_factory.mktemp("hub"), gpu_file)
    try:
        yield h
    finally:
        h.stop()


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


def set_gpu(gpu_file, kernels: dict) -> None:
    tmp = gpu_file.with_suffix(".tmp")
    tmp.write_text(json.dumps({"kernels": kernels}))
    tmp.replace(gpu_file)


def culler(hub: LocalProcessHub, **traits) -> Culler:
    c = Culler(
        url=hub.api_url,
        api_token=hub.culler_token,
        max_staleness=30,
        **{**POLICY, **traits},
    )
    c.initialize([])
    c.log.propagate = True  # into pytest's caplog
    return c


def new_kernel(hub: LocalProcessHub, user: str) -> str:
    status, body = hub.server_api(user, "POST", "/api/kernels", {"name": "python3"})
    assert status == 201, body
    return body["id"]


def kernel_ids(hub: LocalProcessHub, user: str) -> set[str]:
    status, body = hub.server_api(user, "GET", "/api/kernels")
    assert status == 200, body
    return {k["id"] for k in body}


def gpu_report(hub, user) -> dict:
    return hub.server_api(user, "GET", "/api/fracspawner/gpu")[1]


def wait_gpu_reading(hub, user, kernel_id, memory) -> None:
    wait_for(
        lambda: any(
            k["id"] == kernel_id and k["gpu_memory_mib"] == memory
            for k in gpu_report(hub, user).get("kernels", [])
        ),
        15,
        f"{user}'s kernel {kernel_id} with {memory} MiB",
    )


async def test_idle_gpu_kernel_shut_down_busy_one_kept_then_idle_server_stopped(
    hub, gpu_file, caplog
):
    hub.spawn("alice", {"gpu": "1/4", "pool": "h100"})
    idle, busy = new_kernel(hub, "alice"), new_kernel(hub, "alice")
    # a silent training loop: the busy kernel sends no message at all, only the GPU works
    set_gpu(gpu_file, {idle: {"memory_mib": 2048}, busy: {"memory_mib": 4096, "utilization": 90}})
    wait_gpu_reading(hub, "alice", idle, 2048)
    wait_gpu_reading(hub, "alice", busy, 4096)
    await asyncio.sleep(4.5)  # longer than every timeout of the policy (2 s, 4 s)

    c = culler(hub, server_url=hub.url)
    with caplog.at_level(logging.INFO):
        result = await c.cull_once()
    assert kernel_ids(hub, "alice") == {busy}, hub.logs()
    assert hub.ready("alice")  # the server and the user's files stay
    (outcome,) = result.outcomes
    assert outcome.decision.reason == "gpu_busy"
    reasons = {k.id: d.reason for k, d in outcome.kernels}
    assert reasons == {idle: "kernel_gpu_idle", busy: "gpu_busy"}
    assert f"shut down kernel {idle}" in caplog.text and "GPU idle" in caplog.text

    # a second cycle later still keeps the silent busy kernel and its server
    await asyncio.sleep(1)
    result = await c.cull_once()
    assert kernel_ids(hub, "alice") == {busy} and hub.ready("alice")

    # the GPU goes idle: after server_gpu_idle the server is stopped (its memory reclaimed)
    set_gpu(gpu_file, {busy: {"memory_mib": 4096, "utilization": 0}})
    wait_for(
        lambda: (
            next(k for k in gpu_report(hub, "alice")["kernels"] if k["id"] == busy)[
                "gpu_utilization"
            ]
            == 0
        ),
        15,
        "idle reading",
    )
    await asyncio.sleep(4.5)
    result = await c.cull_once()
    (outcome,) = result.outcomes
    assert outcome.decision.reason == "gpu_idle", outcome.decision.message
    wait_for(lambda: not hub.running("alice"), 30, "alice stopped")
    metrics = c.metrics.registry
    assert (
        metrics.get_sample_value("fracspawner_culls_total", {"reason": "gpu_idle", "pool": "h100"})
        == 1
    )
    assert (
        metrics.get_sample_value(
            "fracspawner_culls_total", {"reason": "kernel_gpu_idle", "pool": "h100"}
        )
        == 1
    )
    assert (
        metrics.get_sample_value("fracspawner_reclaimed_gpu_memory_mib_total", {"pool": "h100"})
        == 2048 + 4096
    )


async def test_dry_run_changes_nothing(hub, gpu_file, caplog):
    hub.spawn("dora", {"gpu": "1/4"})
    kernel = new_kernel(hub, "dora")
    set_gpu(gpu_file, {kernel: {"memory_mib": 1024}})
    wait_gpu_reading(hub, "dora", kernel, 1024)
    await asyncio.sleep(4.5)
    c = culler(hub, server_url=hub.url, dry_run=True, server_gpu_idle="600")
    with caplog.at_level(logging.INFO):
        result = await c.cull_once()
    (outcome,) = [o for o in result.outcomes if o.server.facts.user == "dora"]
    assert [d.action for _, d in outcome.kernels] == ["shutdown"]
    assert "[dry run] would shut down kernel" in caplog.text
    assert kernel_ids(hub, "dora") == {kernel} and hub.ready("dora")
    c = culler(hub, dry_run=True, server_idle="1")
    result = await c.cull_once()
    assert [o.decision.action for o in result.outcomes] == ["stop"]
    assert hub.ready("dora")
    assert (
        c.metrics.registry.get_sample_value(
            "fracspawner_culls_total", {"reason": "idle", "pool": ""}
        )
        is None
    )
    hub.api("DELETE", "/users/dora/server")
    wait_for(lambda: not hub.running("dora"), 30, "dora stopped")


async def test_prometheus_down_no_gpu_culls_then_up_culls(hub, prometheus, exporter, caplog):
    hub.spawn("bob", {"gpu": "1/2", "pool": "h100"})
    await asyncio.sleep(4.5)  # idle past server_gpu_idle, far from server_idle
    down = culler(hub, prometheus_url=f"http://127.0.0.1:{free_port()}")
    with caplog.at_level(logging.INFO):
        result = await down.cull_once()
    (outcome,) = result.outcomes
    assert outcome.decision.action == "keep" and outcome.decision.gpu_failsafe
    assert result.sources == {"prometheus": False}
    assert "prometheus is down" in caplog.text and "not culled on GPU grounds" in caplog.text
    assert hub.ready("bob")

    # Prometheus up but the pod's series missing: still no GPU cull
    up = culler(hub, prometheus_url=prometheus.url, scrape_interval=1.0, min_coverage=0.5)
    result = await up.cull_once()
    assert result.outcomes[0].decision.gpu_failsafe and hub.ready("bob")

    # dcgm-exporter reports bob's pod (kubespawner 7's name) busy: kept, although idle by messages
    exporter.set("jupyter-bob", util=75, memory=8192)
    prometheus.wait_scraped(3)
    wait_for(
        lambda: prometheus.query('DCGM_FI_DEV_GPU_UTIL{exported_pod="jupyter-bob"}'),
        30,
        "bob's series",
    )
    up = culler(
        hub,
        prometheus_url=prometheus.url,
        scrape_interval=1.0,
        min_coverage=0.5,
        pod_label="exported_pod",
        namespace_label="exported_namespace",
    )
    result = await up.cull_once()
    assert result.outcomes[0].decision.reason == "gpu_busy", result.outcomes[0].decision.message

    # the GPU goes idle long enough: stopped on GPU grounds
    exporter.set("jupyter-bob", util=0, memory=8192)

    async def stopped() -> bool:
        r = await up.cull_once()
        return bool(r.outcomes) and r.outcomes[0].decision.reason == "gpu_idle"

    for _ in range(40):
        if await stopped():
            break
        await asyncio.sleep(0.5)
    wait_for(lambda: not hub.running("bob"), 30, "bob stopped")
    assert (
        up.metrics.registry.get_sample_value(
            "fracspawner_reclaimed_gpu_memory_mib_total", {"pool": "h100"}
        )
        == 8192
    )
