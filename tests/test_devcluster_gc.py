"""The devcluster's garbage collector (issue 29 item 4): dependents follow their owners, as
kubernetes pkg/controller/garbagecollector does for the three propagation policies of
DeleteOptions (apiserver registry/generic/registry/store.go: Delete,
deletionFinalizersForGarbageCollection). KubeSpawner relies on it: its per-server Service and
internal-SSL Secret name the pod as owner and are left for the collector when the pod goes.
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.rest import ApiException

from devcluster import DevCluster
from tests.devcluster_helpers import NS, ONE_NODE
from tests.devcluster_helpers import eventually as _eventually

pytestmark = pytest.mark.e2e


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[DevCluster]:
    async with DevCluster(ONE_NODE, state_dir=tmp_path / "state") as running:
        yield running


@pytest.fixture
async def api(cluster: DevCluster) -> AsyncIterator[client.CoreV1Api]:
    async with client.ApiClient(client.Configuration(host=cluster.url)) as api_client:
        yield client.CoreV1Api(api_client)


# the garbage collector here has 30 s to do what it is waited for
eventually = functools.partial(_eventually, timeout=30)


def owner(obj: Any, kind: str = "Pod", block: bool | None = None) -> dict[str, Any]:
    ref: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": kind,
        "name": obj.metadata.name,
        "uid": obj.metadata.uid,
    }
    if block is not None:
        ref["blockOwnerDeletion"] = block
    return ref


def pod(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": "x", "command": ["sleep", "600"]}],
        },
    }


async def exists(read: Callable[[], Awaitable[Any]]) -> Any:
    try:
        return await read()
    except ApiException as exc:
        assert exc.status == 404, exc
        return None


async def test_a_deleted_pods_service_and_secret_are_collected_as_kubespawner_expects(api):
    """Background (the default): KubeSpawner's per-server Service and Secret (owner: the pod)
    go once the pod is deleted; an object that also has a live owner only loses the dangling
    reference (attemptToDeleteItem's solid owners)."""
    server = await api.create_namespaced_pod(NS, pod("jupyter-ann"))
    other = await api.create_namespaced_config_map(NS, {"metadata": {"name": "other"}})
    refs = [owner(server)]
    await api.create_namespaced_service(
        NS,
        {
            "metadata": {"name": "jupyter-ann", "ownerReferences": refs},
            "spec": {"ports": [{"port": 8888}], "selector": {"app": "x"}},
        },
    )
    await api.create_namespaced_secret(
        NS, {"metadata": {"name": "jupyter-ann-ssl", "ownerReferences": refs}, "data": {}}
    )
    await api.create_namespaced_config_map(
        NS,
        {
            "metadata": {
                "name": "shared",
                "ownerReferences": [*refs, owner(other, kind="ConfigMap")],
            }
        },
    )
    await api.delete_namespaced_pod("jupyter-ann", NS)

    async def collected() -> bool:
        service = await exists(lambda: api.read_namespaced_service("jupyter-ann", NS))
        secret = await exists(lambda: api.read_namespaced_secret("jupyter-ann-ssl", NS))
        return service is None and secret is None

    await eventually(collected, "the pod's Service and Secret to be collected")
    shared = await eventually(
        lambda: _with_owners(api, "shared", 1), "the shared config map to lose one owner"
    )
    assert [r.name for r in shared.metadata.owner_references] == ["other"]


async def _with_owners(api: client.CoreV1Api, name: str, count: int) -> Any:
    obj = await exists(lambda: api.read_namespaced_config_map(name, NS))
    assert obj is not None, f"{name} was deleted though it has a live owner"
    return obj if len(obj.metadata.owner_references or []) == count else None


async def test_orphan_propagation_keeps_the_dependents_without_the_reference(api):
    parent = await api.create_namespaced_config_map(NS, {"metadata": {"name": "parent"}})
    await api.create_namespaced_config_map(
        NS, {"metadata": {"name": "child", "ownerReferences": [owner(parent, "ConfigMap")]}}
    )
    await api.delete_namespaced_config_map(
        "parent", NS, body=client.V1DeleteOptions(propagation_policy="Orphan")
    )
    await eventually(
        lambda: _gone(lambda: api.read_namespaced_config_map("parent", NS)),
        "the orphaned owner to go once its finalizer is done",
    )
    child = await api.read_namespaced_config_map("child", NS)
    assert not child.metadata.owner_references
    assert child.metadata.deletion_timestamp is None


async def _gone(read: Callable[[], Awaitable[Any]]) -> bool:
    return await exists(read) is None


async def test_foreground_deletion_waits_for_blocking_dependents(api, cluster):
    """Foreground: the owner stays (deletionTimestamp, foregroundDeletion finalizer) while a
    dependent with blockOwnerDeletion is there; both go; a pod dependent is stopped first."""
    parent = await api.create_namespaced_config_map(NS, {"metadata": {"name": "fg-parent"}})
    child = pod("fg-child")
    child["metadata"]["ownerReferences"] = [owner(parent, "ConfigMap", block=True)]
    child["metadata"]["finalizers"] = ["example.org/hold"]  # lets the test see the wait
    await api.create_namespaced_pod(NS, child)
    await api.create_namespaced_config_map(
        NS,
        {
            "metadata": {
                "name": "fg-loose",
                "ownerReferences": [owner(parent, "ConfigMap", block=False)],
            }
        },
    )
    await api.delete_namespaced_config_map(
        "fg-parent", NS, body=client.V1DeleteOptions(propagation_policy="Foreground")
    )
    waiting = await api.read_namespaced_config_map("fg-parent", NS)
    assert waiting.metadata.deletion_timestamp is not None
    assert "foregroundDeletion" in waiting.metadata.finalizers
    await eventually(
        lambda: _gone(lambda: api.read_namespaced_config_map("fg-loose", NS)),
        "the non-blocking dependent to be deleted",
    )

    async def child_deleting() -> bool:
        obj = await api.read_namespaced_pod("fg-child", NS)
        return obj.metadata.deletion_timestamp is not None

    await eventually(child_deleting, "the blocking dependent to be deleted")
    # its own finalizer holds the pod, so the owner is still there
    assert (await api.read_namespaced_config_map("fg-parent", NS)).metadata.deletion_timestamp
    await api.patch_namespaced_pod("fg-child", NS, {"metadata": {"finalizers": None}})
    await eventually(
        lambda: _gone(lambda: api.read_namespaced_pod("fg-child", NS)), "the pod to go"
    )
    await eventually(
        lambda: _gone(lambda: api.read_namespaced_config_map("fg-parent", NS)),
        "the owner to go once its blocking dependents are gone",
    )


async def test_a_dependent_of_a_missing_owner_is_collected_and_a_bad_policy_is_invalid(api):
    await api.create_namespaced_config_map(
        NS,
        {
            "metadata": {
                "name": "stray",
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Pod", "name": "none", "uid": "no-such-uid"}
                ],
            }
        },
    )
    await eventually(
        lambda: _gone(lambda: api.read_namespaced_config_map("stray", NS)),
        "a dependent whose owner does not exist to be collected",
    )
    await api.create_namespaced_config_map(NS, {"metadata": {"name": "keep"}})
    with pytest.raises(ApiException) as caught:
        await api.delete_namespaced_config_map(
            "keep", NS, body=client.V1DeleteOptions(propagation_policy="Sideways")
        )
    assert caught.value.status == 422
    assert 'Unsupported value: "Sideways"' in json.loads(caught.value.body)["message"]
    assert await api.read_namespaced_config_map("keep", NS)
