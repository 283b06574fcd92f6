"""pods/exec and pods/attach on the devcluster (issue 29 item 5), over the websocket channel
protocol (v5.channel.k8s.io / v4.channel.k8s.io: client-go tools/remotecommand/websocket.go,
apiserver util/wsstream): `kubectl exec` prints the command's output and exits with its code,
stdin reaches the command (v5's close of stdin ends it), and kubernetes_asyncio's `stream`
client (WsApiClient, v4) gets stdout and stderr.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.stream import WsApiClient

from devcluster import DevCluster
from tests.devcluster_helpers import NS, ONE_NODE

pytestmark = pytest.mark.e2e


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[DevCluster]:
    async with DevCluster(ONE_NODE, state_dir=tmp_path / "state") as running:
        async with client.ApiClient(client.Configuration(host=running.url)) as api_client:
            api = client.CoreV1Api(api_client)
            await api.create_namespaced_pod(
                NS,
                {
                    "metadata": {"name": "box"},
                    "spec": {
                        "containers": [
                            {
                                "name": "c",
                                "image": "x",
                                "command": ["sleep", "600"],
                                "env": [{"name": "GREETING", "value": "hello from the pod"}],
                            }
                        ]
                    },
                },
            )
            deadline = asyncio.get_running_loop().time() + 60
            while (await api.read_namespaced_pod("box", NS)).status.phase != "Running":
                assert asyncio.get_running_loop().time() < deadline, "the pod never ran"
                await asyncio.sleep(0.1)
        yield running


def kubectl(cluster: DevCluster, *args: str, stdin: str | None = None):
    return subprocess.run(
        ["kubectl", "--kubeconfig", str(cluster.kubeconfig_path), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.skipif(not shutil.which("kubectl"), reason="kubectl: make system-deps")
async def test_kubectl_exec_returns_the_output_and_the_exit_code(cluster):
    done = await asyncio.to_thread(kubectl, cluster, "exec", "box", "--", "echo", "hi")
    assert (done.returncode, done.stdout, done.stderr) == (0, "hi\n", "")
    env = await asyncio.to_thread(kubectl, cluster, "exec", "box", "--", "sh", "-c",
                                  'echo "$GREETING"')  # fmt: skip
    assert env.stdout == "hello from the pod\n"  # the container's environment
    failed = await asyncio.to_thread(kubectl, cluster, "exec", "box", "--", "sh", "-c", "exit 3")
    assert failed.returncode == 3
    assert failed.stderr == "command terminated with exit code 3\n"
    piped = await asyncio.to_thread(kubectl, cluster, "exec", "-i", "box", "--", "cat",
                                    stdin="through stdin\n")  # fmt: skip
    assert (piped.returncode, piped.stdout) == (0, "through stdin\n")


async def test_kubernetes_asyncio_stream_gets_stdout_and_stderr(cluster):
    async with WsApiClient(client.Configuration(host=cluster.url)) as ws:
        api = client.CoreV1Api(ws)
        out = await api.connect_get_namespaced_pod_exec(
            "box", NS, command=["sh", "-c", "echo out; echo err >&2"],
            stdout=True, stderr=True, stdin=False, tty=False,
        )  # fmt: skip
        assert out == "out\nerr\n"
        # a missing pod refuses the upgrade: 404 (aiohttp's handshake error in this client)
        with pytest.raises(aiohttp.WSServerHandshakeError) as caught:
            await api.connect_get_namespaced_pod_exec(
                "nobody", NS, command=["true"], stdout=True, stderr=True, stdin=False, tty=False
            )
        assert caught.value.status == 404
