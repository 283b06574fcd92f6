"""Pod hostnames on the devcluster (issue 29 item 6, the part this machine allows): where it
runs as root with util-linux's unshare, each pod process gets a UTS namespace of its own whose
hostname is the pod's name, as a container runtime's pod sandbox does (kubelet
GeneratePodHostNameAndDomain: the pod name, cut to 63 characters), and `kubectl exec` runs in
it; the devcluster says at start what it cannot model (its own network namespace per pod,
Service names in pods).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from devcluster import DevCluster
from devcluster.kubelet import uts_namespaces

pytestmark = pytest.mark.e2e

ONE_NODE = {"nodes": [{"name": "node-1", "capacity": {"cpu": "4", "memory": "8Gi"}}]}
NS = "default"
PRINT_HOSTNAME = ["python", "-c", "import socket; print(socket.gethostname())"]


@pytest.fixture
async def cluster(tmp_path: Path, caplog) -> AsyncIterator[DevCluster]:
    caplog.set_level(logging.INFO, logger="devcluster")
    async with DevCluster(ONE_NODE, state_dir=tmp_path / "state") as running:
        yield running


async def finished_log(api: client.CoreV1Api, name: str) -> str:
    deadline = asyncio.get_running_loop().time() + 60
    while (await api.read_namespaced_pod(name, NS)).status.phase not in ("Succeeded", "Failed"):
        assert asyncio.get_running_loop().time() < deadline, f"{name} never finished"
        await asyncio.sleep(0.1)
    return await api.read_namespaced_pod_log(name, NS)


@pytest.mark.skipif(not uts_namespaces(), reason="needs root and util-linux unshare")
async def test_a_pods_hostname_is_its_name(cluster, caplog):
    name = "a-pod-with-a-name-longer-than-sixty-three-characters-is-cut-to-63-x"
    async with client.ApiClient(client.Configuration(host=cluster.url)) as api_client:
        api = client.CoreV1Api(api_client)
        for pod in ("box", name):
            body = {
                "metadata": {"name": pod},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "c", "image": "x", "command": PRINT_HOSTNAME}],
                },
            }
            await api.create_namespaced_pod(NS, body)
        assert await finished_log(api, "box") == "box\n"
        assert await finished_log(api, name) == name[:63].rstrip("-.") + "\n"
    said = [r.getMessage() for r in caplog.get_records("setup")]  # at start
    assert any("does not model: pods share the host's network" in m for m in said)
    assert not any("hostname" in m for m in said)


@pytest.mark.skipif(not uts_namespaces(), reason="needs root and util-linux unshare")
@pytest.mark.skipif(not shutil.which("kubectl"), reason="kubectl: make system-deps")
async def test_kubectl_exec_runs_in_the_pods_uts_namespace(cluster):
    async with client.ApiClient(client.Configuration(host=cluster.url)) as api_client:
        api = client.CoreV1Api(api_client)
        body = {
            "metadata": {"name": "sleeper"},
            "spec": {"containers": [{"name": "c", "image": "x", "command": ["sleep", "600"]}]},
        }
        await api.create_namespaced_pod(NS, body)
        deadline = asyncio.get_running_loop().time() + 60
        while (await api.read_namespaced_pod("sleeper", NS)).status.phase != "Running":
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.1)
    done = await asyncio.to_thread(
        subprocess.run,
        ["kubectl", "--kubeconfig", str(cluster.kubeconfig_path), "exec", "sleeper", "--",
         *PRINT_HOSTNAME],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert (done.returncode, done.stdout) == (0, "sleeper\n"), done.stderr
