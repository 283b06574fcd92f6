"""Pod volumes on the devcluster (issue 29 item 2): what the kubelet's configMap, secret,
projected, downwardAPI and emptyDir volume plugins write (kubernetes pkg/volume/configmap,
secret, projected, downwardapi, emptydir) reaches the pod's process at its mountPath (here: a
per-pod root the kubelet rewrites mountPaths to, devcluster/volumes.py), with `items`,
`defaultMode`, `subPath` and `optional`; a missing ConfigMap keeps the pod ContainerCreating with
the kubelet's FailedMount event until it is created.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from devcluster import DevCluster
from tests.devcluster_helpers import NS, ONE_NODE, eventually, finished

pytestmark = pytest.mark.e2e


# prints each file (mode, path, content) the pod sees under its mountPaths, then exits
SHOW = r"""
import os, stat, sys
for top in sys.argv[1:]:
    for base, dirs, files in sorted(os.walk(top, followlinks=True)):
        dirs.sort()
        for f in sorted(files):
            p = os.path.join(base, f)
            mode = oct(stat.S_IMODE(os.stat(p).st_mode))
            print(mode, p.replace(top, top.rsplit("/", 1)[-1]), open(p).read().strip())
print("HOSTPATH", os.environ["CONF"])
"""


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[DevCluster]:
    async with DevCluster(ONE_NODE, state_dir=tmp_path / "state") as running:
        yield running


@pytest.fixture
async def api(cluster: DevCluster) -> AsyncIterator[client.CoreV1Api]:
    async with client.ApiClient(client.Configuration(host=cluster.url)) as api_client:
        yield client.CoreV1Api(api_client)


def show_pod(name: str, volumes: list[dict], mounts: list[dict], *tops: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"app": "show"}},
        "spec": {
            "restartPolicy": "Never",
            "volumes": volumes,
            "containers": [
                {
                    "name": "c",
                    "image": "x",
                    "command": ["python", "-c", SHOW, *tops],
                    "env": [{"name": "CONF", "value": "/etc/jupyterhub/jupyterhub_config.py"}],
                    "volumeMounts": mounts,
                }
            ],
        },
    }


async def finished_log(api: client.CoreV1Api, name: str) -> str:
    phase, log = await finished(api, name)
    assert phase == "Succeeded", log
    return log


async def test_configmap_secret_projected_downward_and_emptydir_reach_the_process(api):
    await api.create_namespaced_config_map(
        NS,
        {
            "metadata": {"name": "hub-config"},
            "data": {"jupyterhub_config.py": "c.X = 1", "other": "o", "values.yaml": "v: 1"},
        },
    )
    secret = {"ssl.key": base64.b64encode(b"KEY").decode(), "ssl.crt": "Q1JU"}
    await api.create_namespaced_secret(NS, {"metadata": {"name": "ssl"}, "data": secret})
    volumes = [
        {"name": "config", "configMap": {"name": "hub-config", "items": [
            {"key": "jupyterhub_config.py", "path": "jupyterhub_config.py"},
            {"key": "other", "path": "sub/renamed", "mode": 0o600},
        ]}},
        {"name": "ssl", "secret": {"secretName": "ssl", "defaultMode": 0o400}},
        {"name": "nothing", "configMap": {"name": "absent", "optional": True}},
        {"name": "both", "projected": {"sources": [
            {"configMap": {"name": "hub-config", "items": [{"key": "other", "path": "o"}]}},
            {"secret": {"name": "ssl", "items": [{"key": "ssl.crt", "path": "crt"}]}},
            {"downwardAPI": {"items": [
                {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}]}},
        ]}},
        {"name": "info", "downwardAPI": {"items": [
            {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
            {"path": "ns", "fieldRef": {"fieldPath": "metadata.namespace"}},
        ]}},
        {"name": "scratch", "emptyDir": {}},
    ]  # fmt: skip
    mounts = [
        {"name": "config", "mountPath": "/etc/jupyterhub"},
        {"name": "ssl", "mountPath": "/etc/jupyterhub-ssl"},
        {"name": "nothing", "mountPath": "/opt/nothing"},
        {"name": "both", "mountPath": "/var/both"},
        {"name": "info", "mountPath": "/etc/podinfo"},
        {"name": "scratch", "mountPath": "/scratch"},
        {"name": "config", "mountPath": "/srv/values.yaml", "subPath": "jupyterhub_config.py"},
    ]
    tops = ["/etc/jupyterhub", "/etc/jupyterhub-ssl", "/opt/nothing", "/var/both",
            "/etc/podinfo", "/scratch"]  # fmt: skip
    await api.create_namespaced_pod(NS, show_pod("show", volumes, mounts, *tops))
    log = await finished_log(api, "show")
    lines = log.splitlines()
    assert "0o644 jupyterhub/jupyterhub_config.py c.X = 1" in lines
    assert "0o600 jupyterhub/sub/renamed o" in lines
    assert not any("values.yaml" in line for line in lines)  # only the items
    assert "0o400 jupyterhub-ssl/ssl.key KEY" in lines
    assert "0o400 jupyterhub-ssl/ssl.crt CRT" in lines
    assert "0o644 both/o o" in lines
    assert "0o644 both/crt CRT" in lines
    assert "0o644 both/name show" in lines
    assert '0o644 podinfo/labels app="show"' in lines
    assert "0o644 podinfo/ns default" in lines
    assert not any(" nothing/" in line or " scratch/" in line for line in lines)
    # the env's mountPath is where the process finds the file
    conf = next(line for line in lines if line.startswith("HOSTPATH ")).split(" ", 1)[1]
    assert Path(conf).read_text() == "c.X = 1"


async def test_a_missing_configmap_keeps_the_pod_container_creating_until_it_exists(api):
    volumes = [{"name": "config", "configMap": {"name": "later"}}]
    mounts = [{"name": "config", "mountPath": "/etc/jupyterhub"}]
    await api.create_namespaced_pod(NS, show_pod("waits", volumes, mounts, "/etc/jupyterhub"))

    async def failed_mount() -> list[str]:
        events = await api.list_namespaced_event(NS)
        return [
            e.message
            for e in events.items
            if e.involved_object.name == "waits" and e.reason == "FailedMount"
        ]

    messages = await eventually(failed_mount, "a FailedMount event")
    assert messages[0] == (
        'MountVolume.SetUp failed for volume "config" : configmap "later" not found'
    )
    pod = await api.read_namespaced_pod("waits", NS)
    assert pod.status.phase == "Pending"
    assert pod.status.container_statuses[0].state.waiting.reason == "ContainerCreating"
    await api.create_namespaced_config_map(
        NS, {"metadata": {"name": "later"}, "data": {"jupyterhub_config.py": "late"}}
    )
    log = await finished_log(api, "waits")
    assert "0o644 jupyterhub/jupyterhub_config.py late" in log.splitlines()


async def test_a_missing_key_in_items_is_the_kubelets_failed_mount(api):
    await api.create_namespaced_config_map(NS, {"metadata": {"name": "partial"}, "data": {}})
    volumes = [
        {"name": "v", "configMap": {"name": "partial", "items": [{"key": "k", "path": "k"}]}}
    ]
    mounts = [{"name": "v", "mountPath": "/etc/x"}]
    await api.create_namespaced_pod(NS, show_pod("nokey", volumes, mounts, "/etc/x"))

    async def failed_mount() -> list[str]:
        events = await api.list_namespaced_event(NS)
        return [e.message for e in events.items if e.reason == "FailedMount"]

    messages = await eventually(failed_mount, "a FailedMount event")
    assert messages[0] == (
        'MountVolume.SetUp failed for volume "v" : configmap references non-existent config key: k'
    )
