"""KubeSpawner's own internal-SSL Secret and per-server Service on the devcluster (issue 29
acceptance, without a hub): KubeSpawner creates the pod first, then the Secret and Service
(kubespawner/objects.py make_secret, make_service) owned by the pod (make_owner_reference:
blockOwnerDeletion true). So the pod mounting the Secret waits in ContainerCreating with a
FailedMount event until the Secret exists; the server then reads its key at the env's
mountPath; a readinessProbe makes it Ready only once it listens; deleting the pod collects the
Secret and Service, as the garbage collector does for KubeSpawner on a real cluster.
"""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.rest import ApiException
from kubespawner.objects import make_owner_reference, make_secret, make_service

from devcluster import DevCluster
from tests.devcluster_helpers import NS, ONE_NODE, eventually

pytestmark = pytest.mark.e2e

SSL = "/etc/jupyterhub/ssl"  # KubeSpawner's internal_ssl mount path
# once argv[1] exists, answers every GET with the key file KubeSpawner's env names
SERVE = r"""
import os, sys, time, http.server
while not os.path.exists(sys.argv[1]):
    time.sleep(0.1)
key = open(os.environ["JUPYTERHUB_SSL_KEYFILE"], "rb").read()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(key)
http.server.HTTPServer(("0.0.0.0", 8888), H).serve_forever()
"""


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[client.CoreV1Api]:
    async with DevCluster(ONE_NODE, state_dir=tmp_path / "state") as cluster:
        async with client.ApiClient(client.Configuration(host=cluster.url)) as api_client:
            yield client.CoreV1Api(api_client)


async def test_kubespawners_ssl_secret_and_service_on_the_devcluster(api, tmp_path):
    listen = tmp_path / "listen"
    name = "jupyter-ann"
    pod = {
        "metadata": {"name": name, "labels": {"component": "singleuser-server"}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "volumes": [{"name": "jupyterhub-internal-certs", "secret": {"secretName": name}}],
            "containers": [
                {
                    "name": "notebook",
                    "image": "x",
                    "command": ["python", "-c", SERVE, str(listen)],
                    "env": [
                        {"name": "JUPYTERHUB_SSL_KEYFILE", "value": f"{SSL}/ssl.key"},
                        {"name": "JUPYTERHUB_SSL_CERTFILE", "value": f"{SSL}/ssl.crt"},
                    ],
                    "volumeMounts": [{"name": "jupyterhub-internal-certs", "mountPath": SSL}],
                    "readinessProbe": {
                        "httpGet": {"path": "/", "port": 8888},
                        "periodSeconds": 1,
                    },
                }
            ],
        },
    }
    created = await api.create_namespaced_pod(NS, pod)

    async def failed_mount() -> list[str]:
        events = await api.list_namespaced_event(NS)
        return [e.message for e in events.items if e.reason == "FailedMount"]

    assert (await eventually(failed_mount, "FailedMount"))[0] == (
        f'MountVolume.SetUp failed for volume "jupyterhub-internal-certs" : '
        f'secret "{name}" not found'
    )
    for part in ("keyfile", "certfile", "cafile", "hubca"):
        (tmp_path / part).write_text(f"-----{part}-----\n")
    owner = [make_owner_reference(name, created.metadata.uid)]
    paths = {p: str(tmp_path / p) for p in ("keyfile", "certfile", "cafile")}
    secret = make_secret(name, "ann", paths, str(tmp_path / "hubca"), owner)
    await api.create_namespaced_secret(NS, secret)
    service = make_service(name, 8888, {"component": "singleuser-server"}, owner)
    await api.create_namespaced_service(NS, service)

    async def running_not_ready() -> Any:
        p = await api.read_namespaced_pod(name, NS)
        return p if p.status.phase == "Running" else None

    started = await eventually(running_not_ready, "the pod to start once its Secret exists")
    await eventually(
        lambda: _unhealthy(api, name), "the readiness probe to fail while nothing listens"
    )
    assert not any(c.type == "Ready" and c.status == "True" for c in started.status.conditions)
    listen.touch()

    async def ready() -> bool:
        p = await api.read_namespaced_pod(name, NS)
        return any(c.type == "Ready" and c.status == "True" for c in p.status.conditions)

    await eventually(ready, "Ready once the server listens")
    url = f"http://{started.status.pod_ip}:8888/"
    body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read())
    assert body == b"-----keyfile-----\n"  # the Secret's key at the env's mountPath

    await api.delete_namespaced_pod(name, NS)

    async def collected() -> bool:
        gone = []
        for read in (api.read_namespaced_secret, api.read_namespaced_service):
            try:
                await read(name, NS)
                gone.append(False)
            except ApiException as exc:
                gone.append(exc.status == 404)
        return all(gone)

    await eventually(collected, "the Secret and Service to be collected with the pod")


async def _unhealthy(api: client.CoreV1Api, name: str) -> list[str]:
    events = await api.list_namespaced_event(NS)
    return [e.message for e in events.items if e.reason == "Unhealthy"]
