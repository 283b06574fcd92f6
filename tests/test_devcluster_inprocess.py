"""devcluster behaviours that need its knobs or a big topology: an in-process DevCluster per test
(it starts in milliseconds), driven through kubernetes_asyncio; plus `devcluster_process`'s own
promise that nothing it started outlives it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
import time
import urllib.error
import urllib.request
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import pytest
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.rest import ApiException

from devcluster import DevCluster
from devcluster.kubelet import SETPRIV
from devcluster.network import LoopbackPool
from devcluster.testing import devcluster_process
from devcluster.topology import generate_large

pytestmark = pytest.mark.e2e

ONE_NODE = {"nodes": [{"name": "node-1", "capacity": {"cpu": "4", "memory": "8Gi"}}]}


@pytest.fixture
async def cluster(tmp_path: Path, request) -> AsyncIterator[DevCluster]:
    topology = getattr(request, "param", ONE_NODE)
    async with DevCluster(topology, state_dir=tmp_path / "state") as running:
        yield running


@pytest.fixture
async def api(cluster: DevCluster) -> AsyncIterator[client.CoreV1Api]:
    config = client.Configuration(host=cluster.url)
    async with client.ApiClient(config) as api_client:
        yield client.CoreV1Api(api_client)


def configmap(name: str) -> dict:
    return {"metadata": {"name": name}, "data": {"k": name}}


async def collect(stream: watch.Watch) -> list[dict]:
    return [{"type": e["type"], **e["raw_object"]} async for e in stream]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ", 1)[1][0] != "Z"


async def wait_for(probe, what: str, timeout: float = 20):
    deadline = time.monotonic() + timeout
    while not (result := await probe()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)
    return result


# ---------------------------------------------------------------- watch history
async def test_watch_from_a_compacted_version_is_410_expired(cluster, api):
    cluster.store.history = deque(maxlen=3)  # keep only the last 3 events, like a compacted etcd
    versions = []
    for i in range(6):
        created = await api.create_namespaced_config_map("default", configmap(f"cm-{i}"))
        versions.append(created.metadata.resource_version)

    with pytest.raises(ApiException) as info:
        await collect(
            watch.Watch().stream(
                api.list_namespaced_config_map,
                "default",
                resource_version=versions[0],
                timeout_seconds=1,
            )
        )
    assert info.value.status == 410 and "Expired" in info.value.reason

    # on the wire, as the apiserver's watch cache does it: a 200 stream with one ERROR event
    # carrying the 410 Status, then the end of the stream
    url = (
        f"{cluster.url}/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={versions[0]}"
    )
    with await asyncio.to_thread(urllib.request.urlopen, url, timeout=5) as resp:
        assert resp.status == 200
        lines = (await asyncio.to_thread(resp.read)).splitlines()
    assert len(lines) == 1
    event = json.loads(lines[0])
    assert event["type"] == "ERROR"
    status = event["object"]
    assert (status["kind"], status["status"], status["reason"], status["code"]) == (
        "Status",
        "Failure",
        "Expired",
        410,
    )
    assert status["message"].startswith(f"too old resource version: {versions[0]}")

    # a version still inside the window resumes with exactly what came after it
    events = await collect(
        watch.Watch().stream(
            api.list_namespaced_config_map,
            "default",
            resource_version=versions[4],
            timeout_seconds=1,
        )
    )
    assert [(e["type"], e["metadata"]["name"]) for e in events] == [("ADDED", "cm-5")]


async def test_a_restarted_api_server_never_resumes_a_watch_from_the_old_history(tmp_path):
    """An apiserver restart keeps etcd's revision but starts its watch cache empty: a client's
    version from before the restart is older than anything the cache can replay, so the watch
    gets 410 and the client relists (k8s.io/apiserver pkg/storage/cacher/watch_cache.go,
    getAllEventsSinceLocked; KEP-1904). A devcluster that started its versions at 0 again
    let an old version resume with nothing replayed: the capacity watch kept counts from
    before the outage and called them current (the flaky test_capacity_outage run)."""
    state = tmp_path / "state"
    async with DevCluster(ONE_NODE, state_dir=state) as first:
        async with client.ApiClient(client.Configuration(host=first.url)) as c:
            listing = await client.CoreV1Api(c).list_namespaced_config_map("default")
            before = listing.metadata.resource_version

    # the cluster changed while its API was away: the restart loads one more object
    topology = {
        **ONE_NODE,
        "pods": [
            {
                "metadata": {"name": "arrived"},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]},
            }
        ],
    }
    async with DevCluster(topology, state_dir=state) as second:
        assert second.store.rv > int(before)  # versions go on, as etcd's revision does
        async with client.ApiClient(client.Configuration(host=second.url)) as c:
            api = client.CoreV1Api(c)
            with pytest.raises(ApiException) as old:
                await collect(
                    watch.Watch().stream(
                        api.list_namespaced_pod,
                        "default",
                        resource_version=before,
                        timeout_seconds=1,
                    )
                )
            assert old.value.status == 410 and "too old resource version" in old.value.reason

            # a version this API server never issued is refused too, not waited on forever
            with pytest.raises(ApiException) as future:
                await collect(
                    watch.Watch().stream(
                        api.list_namespaced_pod,
                        "default",
                        resource_version=str(second.store.rv + 100),
                        timeout_seconds=1,
                    )
                )
            assert future.value.status == 504 and "Too large resource version" in (
                future.value.reason
            )

            # the relist sees what arrived, and a watch from its version works
            pods = await api.list_namespaced_pod("default")
            assert [p.metadata.name for p in pods.items] == ["arrived"]
            events = await collect(
                watch.Watch().stream(
                    api.list_namespaced_pod,
                    "default",
                    resource_version=pods.metadata.resource_version,
                    timeout_seconds=1,
                )
            )
            assert events == []


async def test_bookmarks_only_when_allowed(cluster, api):
    cluster.bookmark_interval = 0.2
    await api.create_namespaced_config_map("default", configmap("marked"))
    rv = str(cluster.store.rv)

    def stream(**kwargs) -> watch.Watch:
        return watch.Watch().stream(
            api.list_namespaced_config_map,
            "default",
            resource_version=rv,
            timeout_seconds=1,
            **kwargs,
        )

    with_bookmarks = await collect(stream(allow_watch_bookmarks=True))
    assert with_bookmarks and {e["type"] for e in with_bookmarks} == {"BOOKMARK"}
    assert with_bookmarks[0]["kind"] == "ConfigMap"
    assert with_bookmarks[0]["metadata"]["resourceVersion"] == rv
    assert await collect(stream()) == []  # the watch simply ends after timeoutSeconds


async def test_watch_sees_objects_enter_and_leave_its_selectors(cluster, api, tmp_path):
    """A pod that finishes leaves a `status.phase!=Succeeded` watch as DELETED (capacity
    watchers rely on it); a label added by PATCH brings an object into a label-selected watch."""
    go = tmp_path / "go"
    wait_for_go = ["sh", "-c", f"while [ ! -e {go} ]; do sleep 0.05; done"]
    body = {
        "metadata": {"name": "finishes", "labels": {"team": "a"}},
        "spec": {
            "containers": [{"name": "c", "image": "x", "command": wait_for_go}],
            "restartPolicy": "Never",
        },
    }
    rv = str(cluster.store.rv)

    async def watch_events(**selectors: str) -> list[tuple[str, str]]:
        stream = watch.Watch().stream(
            api.list_namespaced_pod, "default", resource_version=rv, timeout_seconds=2, **selectors
        )
        return [(e["type"], e["raw_object"]["status"].get("phase", "")) async for e in stream]

    active = asyncio.ensure_future(
        watch_events(field_selector="status.phase!=Succeeded,status.phase!=Failed")
    )
    labelled = asyncio.ensure_future(watch_events(label_selector="watched=yes"))
    await api.create_namespaced_pod("default", body)
    await wait_for(lambda: _eq(_phase(api, "finishes"), "Running"), "finishes runs")
    await api.patch_namespaced_pod(
        "finishes", "default", {"metadata": {"labels": {"watched": "yes"}}}
    )
    go.touch()
    await wait_for(lambda: _eq(_phase(api, "finishes"), "Succeeded"), "finishes completes")
    events = await active
    assert events[0][0] == "ADDED" and events[-1] == ("DELETED", "Running")
    assert {kind for kind, _ in events[1:-1]} == {"MODIFIED"}
    events = await labelled
    assert events[0][0] == "ADDED" and events[-1] == ("MODIFIED", "Succeeded")
    await api.delete_namespaced_pod("finishes", "default")


async def _phase(api: client.CoreV1Api, name: str, namespace: str = "default") -> str:
    return (await api.read_namespaced_pod(name, namespace)).status.phase


async def test_delete_answers_like_the_apiserver(api):
    # most kinds answer a Success Status; pods (and PVCs, services...) the deleted object
    created = await api.create_namespaced_config_map("default", configmap("doomed"))
    status = await api.delete_namespaced_config_map("doomed", "default")
    assert (status.kind, status.status) == ("Status", "Success")
    assert (status.details.name, status.details.uid) == ("doomed", created.metadata.uid)
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
    pod["spec"]["schedulerName"] = "nobody"  # stays Pending, no process
    await api.create_namespaced_pod("default", pod)
    deleted = await api.delete_namespaced_pod("p", "default", _preload_content=False)
    assert json.loads(await deleted.read())["metadata"]["name"] == "p"
    with pytest.raises(ApiException) as info:
        await api.delete_namespaced_config_map("doomed", "default")
    assert info.value.status == 404


async def test_who_schedules_a_pod(cluster, api):
    """The scheduler a pod names reports on it; a pod created bound skips scheduling."""

    def body(name: str, **spec: str) -> dict:
        container = {"name": "c", "image": "x", "command": ["sleep", "600"]}
        return {"metadata": {"name": name}, "spec": {"containers": [container], **spec}}

    async def events(name: str) -> dict[str, str]:
        listed = await api.list_namespaced_event(
            "default", field_selector=f"involvedObject.name={name}"
        )
        return {e.reason: e.source.component for e in listed.items}

    await api.create_namespaced_pod("default", body("unserved", schedulerName="my-scheduler"))
    await api.create_namespaced_pod("default", body("hami", schedulerName="hami-scheduler"))
    await api.create_namespaced_pod("default", body("bound", nodeName="node-1"))
    await api.create_namespaced_pod("default", body("nowhere", nodeName="no-such-node"))
    for name in ("hami", "bound"):
        await wait_for(lambda n=name: _eq(_phase(api, n), "Running"), f"{name} runs")
    assert (await events("hami"))["Scheduled"] == "hami-scheduler"
    bound = await events("bound")
    assert "Scheduled" not in bound and bound["Started"] == "kubelet"
    assert await _phase(api, "nowhere") == "Pending"  # no such node: no kubelet runs it
    # a scheduler nobody runs: Pending, untouched, no event (as in a real cluster)
    unserved = await api.read_namespaced_pod("unserved", "default")
    assert unserved.status.phase == "Pending" and not unserved.status.conditions
    assert await events("unserved") == {}
    for name in ("unserved", "hami", "bound", "nowhere"):
        await api.delete_namespaced_pod(name, "default", grace_period_seconds=0)


async def test_deleting_a_namespace_deletes_what_is_in_it(cluster, api):
    await api.create_namespace({"metadata": {"name": "team-x"}})
    pod = {
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "x", "command": ["sleep", "600"]}]},
    }
    await api.create_namespaced_pod("team-x", pod)
    await api.create_namespaced_config_map("team-x", configmap("cm"))
    await wait_for(lambda: _eq(_phase(api, "p", "team-x"), "Running"), "the pod runs")
    process = cluster.kubelet.running[("team-x", "p")].process.pid

    deleted = await api.delete_namespace("team-x", _preload_content=False)
    assert json.loads(await deleted.read())["status"]["phase"] == "Terminating"
    with pytest.raises(ApiException) as info:  # no new content while it terminates
        await api.create_namespaced_config_map("team-x", configmap("late"))
    assert info.value.status in (403, 404)

    async def namespace_gone() -> bool:
        names = {n.metadata.name for n in (await api.list_namespace()).items}
        return "team-x" not in names

    await wait_for(namespace_gone, "the namespace is gone")
    assert not (await api.list_namespaced_pod("team-x")).items
    assert not (await api.list_namespaced_config_map("team-x")).items
    await wait_for(lambda: asyncio.to_thread(lambda: not alive(process)), "the pod's process ends")
    with pytest.raises(ApiException) as info:
        await api.delete_namespace("default")
    assert info.value.status == 403


async def test_server_filled_fields(api):
    """generateName, qosClass and the other fields the apiserver fills in."""

    def body(resources: dict) -> dict:
        container = {"name": "c", "image": "x", "resources": resources}
        spec = {"containers": [container], "schedulerName": "nobody"}  # stays Pending
        return {"metadata": {"generateName": "jupyter-"}, "spec": spec}

    cases = {
        "BestEffort": {"limits": {"nvidia.com/gpu": "1"}},  # only cpu and memory count
        "Burstable": {"requests": {"cpu": "100m"}},
        "Guaranteed": {"limits": {"cpu": "1", "memory": "1Gi"}},
    }
    names = set()
    for qos, resources in cases.items():
        pod = await api.create_namespaced_pod("default", body(resources))
        assert pod.status.qos_class == qos
        assert pod.metadata.name.startswith("jupyter-") and len(pod.metadata.name) == 13
        assert pod.metadata.uid and pod.metadata.creation_timestamp
        assert int(pod.metadata.resource_version) > 0
        names.add(pod.metadata.name)
    assert len(names) == 3
    for name in names:
        await api.delete_namespaced_pod(name, "default")


async def test_env_from_secrets_config_maps_and_fields(cluster, api):
    show = "import os, sys; print(*[os.environ.get(k, '-') for k in sys.argv[1:]])"
    names = ["TOKEN", "COLOUR", "CFG_SIZE", "POOL", "HOST_IP"]
    container = {
        "name": "c",
        "image": "x",
        "command": [sys.executable, "-c", show, *names],
        "envFrom": [{"configMapRef": {"name": "settings"}, "prefix": "CFG_"}],
        "env": [
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
            {
                "name": "COLOUR",
                "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "colour"}},
            },
            {
                "name": "POOL",
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['fracspawner.io/pool']"}},
            },
            {"name": "HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
        ],
    }
    pod = {
        "metadata": {"name": "env", "labels": {"fracspawner.io/pool": "h100"}},
        "spec": {"containers": [container], "restartPolicy": "Never"},
    }
    await api.create_namespaced_config_map(
        "default", {"metadata": {"name": "settings"}, "data": {"colour": "blue", "SIZE": "3"}}
    )
    await api.create_namespaced_pod("default", pod)

    async def waiting_reason() -> str | None:
        statuses = (await api.read_namespaced_pod("env", "default")).status.container_statuses
        return statuses and statuses[0].state.waiting and statuses[0].state.waiting.reason

    # the secret does not exist yet: the kubelet cannot create the container
    assert await wait_for(waiting_reason, "a waiting reason") == "CreateContainerConfigError"
    assert await _phase(api, "env") == "Pending"
    # once it exists (stringData, stored base64 in data), the container starts
    await api.create_namespaced_secret(
        "default", {"metadata": {"name": "creds"}, "stringData": {"token": "s3cret"}}
    )
    stored = await api.read_namespaced_secret("creds", "default")
    assert stored.data == {"token": "czNjcmV0"} and not stored.string_data
    await wait_for(lambda: _eq(_phase(api, "env"), "Succeeded"), "env completes")
    log = await api.read_namespaced_pod_log("env", "default")
    assert log.split() == ["s3cret", "blue", "3", "h100", "127.0.0.1"]
    await api.delete_namespaced_pod("env", "default")


async def test_bad_selectors_are_400(api):
    for kwargs in ({"label_selector": "a in b"}, {"field_selector": "spec.bogus=1"}):
        with pytest.raises(ApiException) as info:
            await api.list_namespaced_pod("default", **kwargs)
        assert info.value.status == 400
        assert json.loads(info.value.body)["reason"] == "BadRequest"


async def test_a_verb_rbac_withholds_is_403_forbidden_worded_as_the_apiserver(cluster, api):
    """`cluster.forbidden` stands in for a role without a verb; the apiserver's authorization
    filter answers with this Status (kubernetes/kubernetes staging/src/k8s.io/apiserver/pkg/
    endpoints/handlers/responsewriters/errors.go, forbiddenMessage)."""
    cluster.forbidden.add(("watch", "pods"))
    await api.list_pod_for_all_namespaces()  # list is still granted
    with pytest.raises(ApiException) as info:
        await collect(watch.Watch().stream(api.list_pod_for_all_namespaces, timeout_seconds=1))
    assert info.value.status == 403
    with pytest.raises(ApiException) as info:
        await api.list_namespaced_pod("default", watch=True, _preload_content=True)
    status = json.loads(info.value.body)
    assert (status["kind"], status["status"], status["reason"], status["code"]) == (
        "Status",
        "Failure",
        "Forbidden",
        403,
    )
    assert status["details"] == {"kind": "pods"}
    assert status["message"] == (
        'pods is forbidden: User "system:admin" cannot watch resource "pods" in API group "" '
        'in the namespace "default"'
    )


# ---------------------------------------------------------------- capacity freed by a finished pod
WIDGET = "example.com/widget"
ONE_WIDGET = {"nodes": [{"name": "node-1", "capacity": {"cpu": "4", WIDGET: "1"}}]}


@pytest.mark.parametrize("cluster", [ONE_WIDGET], indirect=True)
async def test_a_pod_finishing_lets_a_waiting_pod_schedule(cluster, api, tmp_path):
    go = tmp_path / "go"
    wait_for_go = f"while [ ! -e {go} ]; do sleep 0.05; done"

    def body(name: str, command: list[str]) -> dict:
        container = {"name": "c", "image": "x", "command": command}
        container["resources"] = {"limits": {WIDGET: "1"}}
        return {
            "metadata": {"name": name},
            "spec": {"containers": [container], "restartPolicy": "Never"},
        }

    async def phase(name: str) -> str:
        return (await api.read_namespaced_pod(name, "default")).status.phase

    await api.create_namespaced_pod("default", body("first", ["sh", "-c", wait_for_go]))
    await wait_for(lambda: _eq(phase("first"), "Running"), "first runs")
    await api.create_namespaced_pod("default", body("second", ["sleep", "600"]))

    async def failed_scheduling() -> bool:
        events = await api.list_namespaced_event(
            "default", field_selector="involvedObject.name=second,reason=FailedScheduling"
        )
        return bool(events.items)

    await wait_for(failed_scheduling, "second unschedulable")
    assert await phase("second") == "Pending"
    go.touch()  # first exits 0: Succeeded, its widget is free again
    await wait_for(lambda: _eq(phase("first"), "Succeeded"), "first completes")
    await wait_for(lambda: _eq(phase("second"), "Running"), "second runs on the freed widget")
    await api.delete_namespaced_pod("second", "default", grace_period_seconds=0)


@pytest.mark.parametrize("cluster", [ONE_WIDGET], indirect=True)
async def test_waiting_pods_are_served_first_come_first_served(cluster, api):
    def body(name: str) -> dict:
        container = {"name": "c", "image": "x", "command": ["sleep", "600"]}
        container["resources"] = {"limits": {WIDGET: "1"}}
        return {"metadata": {"name": name}, "spec": {"containers": [container]}}

    await api.create_namespaced_pod("default", body("holder"))
    await wait_for(lambda: _eq(_phase(api, "holder"), "Running"), "holder runs")
    waiting = [f"waiting-{i}" for i in range(6)]
    for name in waiting:
        await api.create_namespaced_pod("default", body(name))
    for name in waiting:
        await wait_for(lambda n=name: failed_scheduling(api, n), f"{name} unschedulable")
    for turn, name in enumerate(waiting[:3]):
        previous = "holder" if turn == 0 else waiting[turn - 1]
        await api.delete_namespaced_pod(previous, "default", grace_period_seconds=0)
        await wait_for(lambda n=name: _eq(_phase(api, n), "Running"), f"{name} runs next")
        phases = [await _phase(api, other) for other in waiting[turn + 1 :]]
        assert set(phases) == {"Pending"}
    for name in waiting[2:]:
        await api.delete_namespaced_pod(name, "default", grace_period_seconds=0)


async def failed_scheduling(api: client.CoreV1Api, name: str) -> bool:
    events = await api.list_namespaced_event(
        "default", field_selector=f"involvedObject.name={name},reason=FailedScheduling"
    )
    return bool(events.items)


async def _eq(value: Awaitable, expected: object) -> bool:
    return await value == expected


# ---------------------------------------------------------------- a 20,000-pod cluster
LARGE = generate_large(nodes=1000, pods=20000)


@pytest.mark.parametrize("cluster", [LARGE], indirect=True)
async def test_large_topology_loads_and_lists(cluster, api):
    async def listed(method, *args, **kwargs) -> list[dict]:
        # kubespawner's reflectors list with _preload_content=False and parse the JSON themselves
        resp = await method(*args, _preload_content=False, **kwargs)
        return json.loads(await resp.read())["items"]

    pods = await listed(api.list_pod_for_all_namespaces)
    assert len(pods) == 20000
    assert len({p["metadata"]["name"] for p in pods}) == 20000
    assert len(await listed(api.list_node)) == 1000
    assert len(await listed(api.list_namespaced_pod, "default")) == 20000

    by_pool = Counter(p["labels"].get("fracspawner.io/pool") for p in LARGE["pods"])
    by_node = Counter(p["node"] for p in LARGE["pods"])
    for pool in ("a100-mig", "h100", "t4"):
        got = await listed(
            api.list_namespaced_pod, "default", label_selector=f"fracspawner.io/pool={pool}"
        )
        assert len(got) == by_pool[pool] > 0
    got = await listed(api.list_namespaced_pod, "default", label_selector="!fracspawner.io/pool")
    assert len(got) == by_pool[None]
    node = "h100-0001"
    got = await listed(api.list_namespaced_pod, "default", field_selector=f"spec.nodeName={node}")
    assert len(got) == by_node[node] and {p["spec"]["nodeName"] for p in got} == {node}
    # the typed path kubernetes_asyncio users take, on a selected subset
    typed = await api.list_namespaced_pod(
        "default", label_selector="fracspawner.io/gpu=mig-1g.10gb,app=jupyterhub"
    )
    assert len(typed.items) == by_pool["a100-mig"]
    assert all(p.status.phase == "Running" for p in typed.items)


# ---------------------------------------------------------------- processes
PRINT_PID_AND_SLEEP = "import os, time; print(os.getpid(), flush=True); time.sleep(600)"
ESCAPE = (
    "import subprocess, sys; "
    "child = subprocess.Popen(['sleep', '600'], start_new_session=True); "
    "print(child.pid, flush=True); subprocess.run(['sleep', '600'])"
)


async def test_deleting_a_pod_ends_what_it_started_outside_its_group(cluster, api):
    """Jupyter starts kernels in their own session; deleting the pod still ends them."""
    body = {
        "metadata": {"name": "escaper"},
        "spec": {
            "containers": [{"name": "c", "image": "x", "command": [sys.executable, "-c", ESCAPE]}]
        },
    }
    await api.create_namespaced_pod("default", body)

    async def child_pid() -> int | None:
        log = await api.read_namespaced_pod_log("escaper", "default")
        return int(log.split()[0]) if log.strip() else None

    pid = await wait_for(child_pid, "the escaped child's pid")
    try:
        assert alive(pid)
        await api.delete_namespaced_pod("escaper", "default", grace_period_seconds=0)
        await wait_for(lambda: asyncio.to_thread(lambda: not alive(pid)), "the escaped child ends")
    finally:
        if alive(pid):  # the test failed: still leave nothing behind
            os.kill(pid, signal.SIGKILL)


def test_pod_addresses_skip_those_whose_port_is_taken():
    # another devcluster's pod (or anything) listening there must not be mistaken for ours
    first = LoopbackPool(seed=7).take([18888])
    with socket.socket() as other:
        other.bind((first, 18888))
        other.listen()
        assert LoopbackPool(seed=7).take([18888]) != first
        assert LoopbackPool(seed=7).take([18889]) == first


def test_devcluster_process_leaves_no_process_behind(tmp_path):
    topology = {**ONE_NODE, "images": {"example.org/escaper:1": [sys.executable, "-c", ESCAPE]}}
    with devcluster_process(topology, tmp_path, control_plane="python") as running:
        api = running.client()
        status, body = api.request(
            "POST",
            "/api/v1/namespaces/default/pods",
            {
                "metadata": {"name": "p"},
                "spec": {"containers": [{"name": "c", "image": "example.org/escaper:1"}]},
            },
        )
        assert status == 201, body
        log = running.state_dir / "pods" / "default" / "p" / "container.log"
        deadline = time.monotonic() + 20
        while not (log.exists() and log.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.05)
        escaped = int(log.read_text().split()[0])
        devcluster_pid = running.process.pid
        assert alive(escaped)
        assert [n["metadata"]["name"] for n in api.list("nodes")] == ["node-1"]
        started = api.list("events", "default", fieldSelector="reason=Started")
        assert [e["involvedObject"]["name"] for e in started] == ["p"]
        everywhere = [(p["metadata"]["namespace"], p["metadata"]["name"]) for p in api.list("pods")]
        assert everywhere == [("default", "p")]
    # the context's own check passed (it raises if it had to kill anything)
    assert not alive(escaped)
    assert running.process.returncode is not None and not alive(devcluster_pid)


@pytest.mark.skipif(SETPRIV is None, reason="needs util-linux setpriv")
def test_pod_processes_die_with_a_killed_devcluster(tmp_path):
    """Even a SIGKILLed devcluster (no clean-up at all) leaves no pod process running."""
    with devcluster_process(ONE_NODE, tmp_path, control_plane="python") as running:
        status, body = running.client().request(
            "POST",
            "/api/v1/namespaces/default/pods",
            {
                "metadata": {"name": "orphan"},
                "spec": {
                    "containers": [
                        {
                            "name": "c",
                            "image": "x",
                            "command": [sys.executable, "-c", PRINT_PID_AND_SLEEP],
                        }
                    ]
                },
            },
        )
        assert status == 201, body
        log = running.state_dir / "pods" / "default" / "orphan" / "container.log"
        deadline = time.monotonic() + 20
        while not (log.exists() and log.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.05)
        pid = int(log.read_text().split()[0])
        assert alive(pid)
        running.process.kill()
        running.process.wait(10)
        deadline = time.monotonic() + 10
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(pid)


def test_devcluster_process_shows_the_log_when_the_devcluster_cannot_start(tmp_path):
    with pytest.raises(RuntimeError) as info:
        with devcluster_process({"nodes": "not a list"}, tmp_path, control_plane="python"):
            pass
    assert "did not start (exited 2" in str(info.value)
    assert "nodes" in str(info.value)  # the devcluster's own one-line reason


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(5, "5s"), (119, "119s"), (200, "3m20s"), (600, "10m"), (3 * 3600 + 300, "3h5m"),
     (30 * 3600, "30h"), (5 * 86400, "5d")],
)  # fmt: skip
def test_ages_read_like_kubectl(seconds, shown):
    from datetime import datetime, timedelta, timezone

    from devcluster.tables import human_age

    now = datetime(2026, 1, 10, tzinfo=timezone.utc)
    created = (now - timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert human_age(created, now) == shown


# ---------------------------------------------------------------- secrets
async def test_a_secret_with_only_data_is_created_as_sent(api):
    """Most manifests (KubeSpawner's internal-SSL secret among them) send base64 `data` and no
    `stringData`; the apiserver stores it as sent (pkg/registry/core/secret/strategy.go
    PrepareForCreate touches neither). Folding `stringData` must not empty such a body: it was
    a 500 (KeyError on metadata)."""
    body = {"metadata": {"name": "certs"}, "data": {"ssl.key": "a2V5", "ssl.crt": "Y3J0"}}
    created = await api.create_namespaced_secret("default", body)
    assert created.data == {"ssl.key": "a2V5", "ssl.crt": "Y3J0"}
    read = await api.read_namespaced_secret("certs", "default")
    assert read.data == body["data"]
    mixed = {"metadata": {"name": "mixed"}, "data": {"a": "YQ=="}, "stringData": {"b": "b"}}
    created = await api.create_namespaced_secret("default", mixed)
    assert created.data == {"a": "YQ==", "b": "Yg=="} and not created.string_data
