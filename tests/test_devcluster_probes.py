"""Probes and restarts on the devcluster (issue 29 item 3), as the kubelet's prober
(pkg/kubelet/prober: worker.go, prober.go; pkg/probe/http, tcp, exec) and crash-loop back-off
(pkg/kubelet/kuberuntime/kuberuntime_manager.go doBackOff) behave: a readinessProbe decides Ready
(also without container ports) with "Readiness probe failed: ..." events; an exited container
of a restartPolicy Always/OnFailure pod is restarted with back-off (CrashLoopBackOff,
restartCount, the pod Running); liveness and startup probes restart the container. The back-off
is the DevCluster's `restart_backoff` knob (upstream's 10 s to 5 min by default), short here.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from devcluster import DevCluster
from tests.devcluster_helpers import NS, ONE_NODE, eventually

pytestmark = pytest.mark.e2e

# serves HTTP on the pod's address once the file in argv[1] exists
SERVE_WHEN = r"""
import os, sys, time, http.server
while not os.path.exists(sys.argv[1]):
    time.sleep(0.1)
http.server.HTTPServer(("0.0.0.0", 8888), http.server.SimpleHTTPRequestHandler).serve_forever()
"""


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[DevCluster]:
    state = tmp_path / "state"
    async with DevCluster(ONE_NODE, state_dir=state, restart_backoff=(1, 2)) as running:
        yield running


@pytest.fixture
async def api(cluster: DevCluster) -> AsyncIterator[client.CoreV1Api]:
    async with client.ApiClient(client.Configuration(host=cluster.url)) as api_client:
        yield client.CoreV1Api(api_client)


def pod(name: str, command: list[str], policy: str = "Always", **probes: Any) -> dict:
    return {
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": policy,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": "x", "command": command, **probes}],
        },
    }


async def events(api: client.CoreV1Api, name: str, reason: str) -> list[str]:
    listed = await api.list_namespaced_event(NS)
    return [
        e.message for e in listed.items if e.involved_object.name == name and e.reason == reason
    ]


async def status(api: client.CoreV1Api, name: str) -> Any:
    return await api.read_namespaced_pod(name, NS)


def ready(p: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])


async def test_a_readiness_probe_decides_ready_for_a_container_without_ports(api, tmp_path):
    flag = tmp_path / "listen"
    probe = {"httpGet": {"path": "/", "port": 8888}, "periodSeconds": 1}
    await api.create_namespaced_pod(
        NS, pod("web", ["python", "-c", SERVE_WHEN, str(flag)], readinessProbe=probe)
    )
    failed = await eventually(lambda: events(api, "web", "Unhealthy"), "a failed probe event")
    running = await status(api, "web")
    ip = running.status.pod_ip
    assert running.status.phase == "Running"
    assert not ready(running)
    assert failed[0] == (
        f'Readiness probe failed: Get "http://{ip}:8888/": dial tcp {ip}:8888: '
        "connect: connection refused"
    )
    flag.touch()

    async def is_ready() -> bool:
        return ready(await status(api, "web"))

    await eventually(is_ready, "Ready once the server listens")
    assert (await status(api, "web")).status.container_statuses[0].ready


async def test_an_exec_readiness_probe_failing_keeps_the_pod_not_ready(api, tmp_path):
    probe = {"exec": {"command": ["sh", "-c", "echo not yet; exit 1"]}, "periodSeconds": 1}
    await api.create_namespaced_pod(NS, pod("execp", ["sleep", "600"], readinessProbe=probe))
    failed = await eventually(lambda: events(api, "execp", "Unhealthy"), "a failed probe event")
    assert failed[0] == "Readiness probe failed: not yet"
    assert not ready(await status(api, "execp"))


async def test_an_exiting_container_is_restarted_with_back_off(api):
    await api.create_namespaced_pod(NS, pod("crash", ["sh", "-c", "echo run; exit 3"]))

    async def crash_looping() -> Any:
        p = await status(api, "crash")
        entry = (p.status.container_statuses or [None])[0]
        waiting = entry and entry.state.waiting
        if entry and entry.restart_count >= 2 and waiting and waiting.reason == "CrashLoopBackOff":
            return p
        return None

    looping = await eventually(crash_looping, "CrashLoopBackOff after restarts")
    entry = looping.status.container_statuses[0]
    assert looping.status.phase == "Running"
    assert entry.last_state.terminated.exit_code == 3
    assert "restarting failed container=c pod=crash_default(" in entry.state.waiting.message
    assert await events(api, "crash", "BackOff")
    # OnFailure: a clean exit ends the pod
    await api.create_namespaced_pod(NS, pod("done", ["true"], policy="OnFailure"))

    async def succeeded() -> bool:
        return (await status(api, "done")).status.phase == "Succeeded"

    await eventually(succeeded, "an OnFailure pod that exits 0 to succeed")


async def test_liveness_and_startup_probes_restart_the_container(api, tmp_path):
    flag = tmp_path / "started"
    startup = {"exec": {"command": ["test", "-e", str(flag)]}, "periodSeconds": 1,
               "failureThreshold": 600}  # fmt: skip
    liveness = {"exec": {"command": ["sh", "-c", "echo dead; exit 1"]}, "periodSeconds": 1,
                "failureThreshold": 2}  # fmt: skip
    await api.create_namespaced_pod(
        NS, pod("live", ["sleep", "600"], startupProbe=startup, livenessProbe=liveness)
    )

    async def running_not_started() -> bool:
        p = await status(api, "live")
        statuses = p.status.container_statuses or []
        return bool(statuses) and statuses[0].state.running is not None

    await eventually(running_not_started, "the container to run")
    await asyncio.sleep(0)  # the liveness probe does not run before the startup probe passes
    entry = (await status(api, "live")).status.container_statuses[0]
    assert entry.started is False
    assert entry.restart_count == 0
    assert not await events(api, "live", "Killing")
    flag.touch()
    killing = await eventually(lambda: events(api, "live", "Killing"), "the liveness kill")
    assert killing[0] == "Container c failed liveness probe, will be restarted"
    assert "Liveness probe failed: dead" in await events(api, "live", "Unhealthy")

    async def restarted() -> bool:
        return (await status(api, "live")).status.container_statuses[0].restart_count >= 1

    await eventually(restarted, "the restart after the liveness kill")
