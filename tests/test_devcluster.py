"""devcluster conformance, driven through kubernetes_asyncio exactly as kubespawner drives it.

One devcluster subprocess (the CLI, via `devcluster_process`) serves the whole module. Each test
cleans up the pods it creates, so tests do not depend on each other's order.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.rest import ApiException

pytestmark = pytest.mark.e2e

CONTROL_PLANE = "python"  # tests the Python API server itself (issue 35 item 4)
NS = "default"
MIG = "nvidia.com/mig-1g.10gb"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
SLEEP = ["sleep", "600"]

# Four nodes, so scheduling failures read "0/4 nodes are available: ...": one MIG slot on the
# A100 (held by a pre-existing pod), a tainted T4, a CPU node and a cordoned MIG node.
TOPOLOGY = {
    "namespaces": ["selectors"],
    "images": {"example.org/echo:1": ["sh", "-c", "echo from-the-image-map"]},
    "nodes": [
        {
            "name": "gpu-a100-1",
            "labels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "zone": "a"},
            "capacity": {"cpu": "8", "memory": "32Gi", MIG: "1"},
        },
        {
            "name": "gpu-t4-1",
            "labels": {"nvidia.com/gpu.product": "Tesla-T4", "zone": "b"},
            "taints": [GPU_TAINT],
            "capacity": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "2"},
        },
        {
            "name": "cpu-1",
            "labels": {"node-role.fracspawner.io/cpu": "true", "zone": "b"},
            "capacity": {"cpu": "8", "memory": "32Gi"},
        },
        {
            "name": "cordoned-1",
            "unschedulable": True,
            "capacity": {"cpu": "8", "memory": "32Gi", MIG: "1"},
        },
    ],
    # pre-existing pods have no process behind them
    "pods": [
        {"name": "mig-holder", "node": "gpu-a100-1", "limits": {MIG: "1"}},
        {"name": "web-front", "namespace": "selectors", "node": "cpu-1",
         "labels": {"app": "web", "tier": "front"}},
        {"name": "web-back", "namespace": "selectors", "node": "cpu-1",
         "labels": {"app": "web", "tier": "back"}},
        {"name": "db", "namespace": "selectors", "node": "gpu-a100-1",
         "labels": {"app": "db"}},
        {"name": "batch", "namespace": "selectors", "node": "cpu-1", "phase": "Succeeded",
         "labels": {"app": "batch", "tier": "back"}},
    ],
}  # fmt: skip


# ---------------------------------------------------------------- helpers
@pytest.fixture(scope="module")
def kube_config(devcluster) -> Any:
    """kubespawner's own load_config, pointed at this module's devcluster."""
    from kubespawner.clients import load_config

    from fracspawner.cli.plan import use_kubeconfig

    saved = client.Configuration.get_default_copy()
    load_config.cache_clear()  # lru_cached: another module may have loaded another cluster
    with use_kubeconfig(devcluster.kubeconfig):
        load_config()
    yield client.Configuration.get_default_copy()
    load_config.cache_clear()
    client.Configuration.set_default(saved)


@pytest.fixture
async def api(kube_config) -> AsyncIterator[client.CoreV1Api]:
    async with client.ApiClient(kube_config) as api_client:
        yield client.CoreV1Api(api_client)


def pod_body(
    name: str,
    command: list[str] | None = SLEEP,
    *,
    image: str = "example.org/busybox:1",
    labels: dict[str, str] | None = None,
    limits: dict[str, str] | None = None,
    ports: list[int] | None = None,
    env: list[dict] | None = None,
    restart: str = "Never",
    **spec: Any,
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "notebook", "image": image}
    if command is not None:
        container["command"] = command
    if limits:
        container["resources"] = {"limits": limits}
    if ports:
        container["ports"] = [{"containerPort": p, "name": f"p{p}"} for p in ports]
    if env:
        container["env"] = env
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"containers": [container], "restartPolicy": restart, **spec},
    }


async def eventually(probe: Callable[[], Awaitable[Any]], what: str, timeout: float = 20) -> Any:
    """Poll `probe` until it returns something truthy (a deadline, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while True:
        result = await probe()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def raw_pod(api: client.CoreV1Api, name: str, ns: str = NS) -> dict | None:
    # unparsed JSON (dict), like kubespawner's reflectors; no exception is raised this way
    resp = await api.read_namespaced_pod(name, ns, _preload_content=False)
    body = json.loads(await resp.read())
    if resp.status == 404:
        return None
    assert resp.status == 200, body
    return body


async def phase_is(api: client.CoreV1Api, name: str, *phases: str) -> dict | None:
    pod = await raw_pod(api, name)
    return pod if pod and pod["status"].get("phase") in phases else None


async def gone(api: client.CoreV1Api, name: str, ns: str = NS) -> bool:
    return await raw_pod(api, name, ns) is None


async def delete_now(api: client.CoreV1Api, *names: str) -> None:
    for name in names:
        try:
            await api.delete_namespaced_pod(name, NS, grace_period_seconds=0)
        except ApiException as exc:
            assert exc.status == 404
    for name in names:
        await eventually(lambda n=name: gone(api, n), f"{name} deleted")


async def pod_log(api: client.CoreV1Api, name: str) -> str:
    return await api.read_namespaced_pod_log(name, NS)


def status_of(exc: ApiException) -> dict:
    return json.loads(exc.body)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purposes (its parent, the devcluster, reaps it)
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ", 1)[1][0] != "Z"


# ---------------------------------------------------------------- kubespawner's reflectors
async def test_kubespawner_reflectors_follow_a_spawn_stop_loop(api, caplog):
    from kubespawner.spawner import EventReflector, PodReflector

    log = logging.getLogger("test.reflector")
    caplog.set_level(logging.DEBUG, logger=log.name)
    # the labels/fields kubespawner uses; timeouts long enough that any reconnect is a restart
    common = {"namespace": NS, "log": log, "timeout_seconds": 300, "restart_seconds": 300}
    pods = PodReflector(labels={"component": "singleuser-server"}, **common)
    events = EventReflector(fields={"involvedObject.kind": "Pod"}, **common)
    await pods.start()
    await events.start()
    try:
        for i in range(3):
            name = f"jupyter-loop-{i}"
            # a tiny server on the container port, listening on "all interfaces" (rewritten)
            command = [sys.executable, "-m", "http.server", "--bind", "0.0.0.0", "8888"]
            body = pod_body(
                name,
                command,
                labels={"component": "singleuser-server"},
                ports=[8888],
                terminationGracePeriodSeconds=1,
            )
            await api.create_namespaced_pod(NS, body)
            key = f"{NS}/{name}"

            def ready(key: str = key) -> dict | None:
                pod = pods.pods.get(key)
                if not pod or pod["status"].get("phase") != "Running":
                    return None
                conditions = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
                return pod if conditions.get("Ready") == "True" else None

            async def ready_async(ready=ready) -> dict | None:
                return ready()

            pod = await eventually(ready_async, f"{name} Running and Ready in the reflector")
            ip = pod["status"]["podIP"]
            assert ip.startswith("127.") and ip != "127.0.0.1"
            with await asyncio.to_thread(
                urllib.request.urlopen, f"http://{ip}:8888/", timeout=5
            ) as r:
                assert r.status == 200

            # kubespawner deletes with a grace period in both the body and the query
            await api.delete_namespaced_pod(
                name,
                NS,
                body=client.V1DeleteOptions(grace_period_seconds=1),
                grace_period_seconds=1,
            )

            async def vanished(key: str = key) -> bool:
                return key not in pods.pods

            await eventually(vanished, f"{name} gone from the reflector")
            reasons = {e["reason"] for e in events.events if e["involvedObject"]["name"] == name}
            assert {"Scheduled", "Started"} <= reasons
        assert pods.first_load_future.done() and events.first_load_future.done()
        assert not pods.watch_task.done() and not events.watch_task.done()
        # checked before stop(), which itself logs "watcher finished" as a warning
        problems = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert not problems
        connects = [r.getMessage() for r in caplog.records if "Connecting" in r.getMessage()]
        assert len(connects) == 2, connects  # one per reflector: no restarts
    finally:
        await pods.stop()
        await events.stop()


# ---------------------------------------------------------------- Status objects
async def test_invalid_field_is_422_naming_the_field(api):
    body = pod_body("bad-port")
    body["spec"]["containers"][0]["ports"] = [{"containerPort": "eighty"}]
    with pytest.raises(ApiException) as info:
        await api.create_namespaced_pod(NS, body)
    assert info.value.status == 422
    status = status_of(info.value)
    assert status["kind"] == "Status" and status["status"] == "Failure"
    assert status["reason"] == "Invalid" and status["code"] == 422
    assert "spec.containers[0].ports[0].containerPort" in status["message"]
    assert status["details"]["causes"][0]["field"] == "spec.containers[0].ports[0].containerPort"

    # strict: an unknown field is refused too, not silently dropped
    body = pod_body("unknown-field")
    body["spec"]["containers"][0]["gpuSlice"] = "1/4"
    with pytest.raises(ApiException) as info:
        await api.create_namespaced_pod(NS, body)
    assert info.value.status == 422 and "gpuSlice" in status_of(info.value)["message"]
    assert await gone(api, "bad-port") and await gone(api, "unknown-field")


async def test_not_found_and_already_exists(api):
    with pytest.raises(ApiException) as info:
        await api.read_namespaced_pod("no-such-pod", NS)
    status = status_of(info.value)
    assert info.value.status == 404
    assert status == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'pods "no-such-pod" not found',
        "reason": "NotFound",
        "details": {"name": "no-such-pod", "kind": "pods"},
        "code": 404,
    }
    with pytest.raises(ApiException) as info:
        await api.create_namespaced_pod("no-such-namespace", pod_body("x"))
    assert info.value.status == 404 and status_of(info.value)["reason"] == "NotFound"

    await api.create_namespaced_pod(NS, pod_body("twice"))
    try:
        with pytest.raises(ApiException) as info:
            await api.create_namespaced_pod(NS, pod_body("twice"))
        assert info.value.status == 409
        status = status_of(info.value)
        assert status["reason"] == "AlreadyExists"
        assert status["message"] == 'pods "twice" already exists'
    finally:
        await delete_now(api, "twice")


# ---------------------------------------------------------------- scheduling
async def failed_scheduling(api: client.CoreV1Api, name: str) -> list[str]:
    events = await api.list_namespaced_event(
        NS, field_selector=f"involvedObject.name={name},reason=FailedScheduling"
    )
    return [e.message for e in events.items if e.type == "Warning"]


async def test_unschedulable_gpu_pod_waits_then_runs_when_capacity_frees(api):
    await api.create_namespaced_pod(NS, pod_body("wants-mig", limits={MIG: "1"}))
    try:
        messages = await eventually(
            lambda: failed_scheduling(api, "wants-mig"), "a FailedScheduling event"
        )
        assert messages[0] == (
            "0/4 nodes are available: 1 node(s) had untolerated taint "
            "{nvidia.com/gpu: present}, 1 node(s) were unschedulable, "
            f"2 Insufficient {MIG}. preemption: 0/4 nodes are available: "
            "2 No preemption victims found for incoming pod, "
            "2 Preemption is not helpful for scheduling.."
        )
        pod = await raw_pod(api, "wants-mig")
        assert pod["status"]["phase"] == "Pending" and not pod["spec"].get("nodeName")
        scheduled = next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")
        assert scheduled["status"] == "False" and scheduled["reason"] == "Unschedulable"

        # the pre-existing pod holding the only schedulable MIG slot goes away
        await api.delete_namespaced_pod("mig-holder", NS)
        pod = await eventually(lambda: phase_is(api, "wants-mig", "Running"), "wants-mig runs")
        assert pod["spec"]["nodeName"] == "gpu-a100-1"
    finally:
        await delete_now(api, "wants-mig")


async def test_adding_a_node_through_the_api_schedules_a_waiting_pod(api):
    # the A100's slot is taken by a running pod; a second one waits for a new node
    await api.create_namespaced_pod(NS, pod_body("mig-a", limits={MIG: "1"}))
    await api.create_namespaced_pod(NS, pod_body("mig-b", limits={MIG: "1"}))
    try:
        await eventually(lambda: failed_scheduling(api, "mig-b"), "mig-b unschedulable")
        node = {
            "metadata": {"name": "gpu-a100-2", "labels": {"zone": "c"}},
            "status": {
                "capacity": {MIG: "1", "pods": "110"},
                "allocatable": {MIG: "1", "pods": "110"},
            },
        }
        await api.create_node(node)
        pod = await eventually(lambda: phase_is(api, "mig-b", "Running"), "mig-b runs")
        assert pod["spec"]["nodeName"] == "gpu-a100-2"
        held = await raw_pod(api, "mig-a")
        assert held["spec"]["nodeName"] == "gpu-a100-1"
    finally:
        await delete_now(api, "mig-a", "mig-b")
        await api.delete_node("gpu-a100-2")


async def test_taints_tolerations_selectors_and_affinity(api):
    toleration = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    wants_t4 = {"nvidia.com/gpu.product": "Tesla-T4"}
    affinity_zone_b_not_gpu = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "zone", "operator": "In", "values": ["b"]},
                            {"key": "nvidia.com/gpu.product", "operator": "DoesNotExist"},
                        ]
                    }
                ]
            }
        }
    }
    cases = {
        # tainted T4: refused without a toleration, taken with one
        "t4-untolerated": pod_body("t4-untolerated", nodeSelector=wants_t4),
        "t4-tolerated": pod_body("t4-tolerated", nodeSelector=wants_t4, tolerations=toleration),
        "affinity": pod_body("affinity", affinity=affinity_zone_b_not_gpu),
        # extended resources: the T4 has 2 GPUs; 3 do not fit anywhere
        "t4-two": pod_body("t4-two", limits={"nvidia.com/gpu": "2"}, tolerations=toleration),
        "t4-three": pod_body("t4-three", limits={"nvidia.com/gpu": "3"}, tolerations=toleration),
        "no-such-label": pod_body("no-such-label", nodeSelector={"zone": "mars"}),
    }
    for body in cases.values():
        await api.create_namespaced_pod(NS, body)
    try:
        for name, node in [("t4-tolerated", "gpu-t4-1"), ("affinity", "cpu-1")]:
            pod = await eventually(lambda n=name: phase_is(api, n, "Running"), f"{name} runs")
            assert pod["spec"]["nodeName"] == node
        # t4-tolerated holds no GPU, so both T4 GPUs are free for t4-two
        pod = await eventually(lambda: phase_is(api, "t4-two", "Running"), "t4-two runs")
        assert pod["spec"]["nodeName"] == "gpu-t4-1"

        expected = {
            "t4-untolerated": "1 node(s) had untolerated taint {nvidia.com/gpu: present}, "
            "1 node(s) were unschedulable, 2 node(s) didn't match Pod's node affinity/selector",
            "t4-three": "1 node(s) were unschedulable, 3 Insufficient nvidia.com/gpu",
            "no-such-label": "1 node(s) had untolerated taint {nvidia.com/gpu: present}, "
            "1 node(s) were unschedulable, 2 node(s) didn't match Pod's node affinity/selector",
        }
        for name, reasons in expected.items():
            messages = await eventually(lambda n=name: failed_scheduling(api, n), name)
            assert messages[-1].startswith(f"0/4 nodes are available: {reasons}."), messages
            assert (await raw_pod(api, name))["status"]["phase"] == "Pending"

        # accounting: once t4-two is gone its GPUs are free again, and a 1-GPU pod fits
        await delete_now(api, "t4-two")
        await api.create_namespaced_pod(
            NS, pod_body("t4-one", limits={"nvidia.com/gpu": "1"}, tolerations=toleration)
        )
        pod = await eventually(lambda: phase_is(api, "t4-one", "Running"), "t4-one runs")
        assert pod["spec"]["nodeName"] == "gpu-t4-1"
        assert (await raw_pod(api, "t4-three"))["status"]["phase"] == "Pending"
    finally:
        await delete_now(api, *cases, "t4-one")


# ---------------------------------------------------------------- selectors and watches
async def names(api: client.CoreV1Api, **selectors: str) -> set[str]:
    pods = await api.list_namespaced_pod("selectors", **selectors)
    return {p.metadata.name for p in pods.items}


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("app=web", {"web-front", "web-back"}),
        ("app==web", {"web-front", "web-back"}),
        ("app!=web", {"db", "batch"}),  # != also matches pods without the label
        ("tier in (front, back)", {"web-front", "web-back", "batch"}),
        ("tier notin (front)", {"web-back", "db", "batch"}),
        ("tier", {"web-front", "web-back", "batch"}),
        ("!tier", {"db"}),
        ("app=web,tier!=front", {"web-back"}),
        ("app in (web,db),!tier", {"db"}),
    ],
)
async def test_label_selectors(api, selector, expected):
    assert await names(api, label_selector=selector) == expected


async def test_field_selectors(api):
    assert await names(api, field_selector="metadata.name=db") == {"db"}
    assert await names(api, field_selector="spec.nodeName=gpu-a100-1") == {"db"}
    assert await names(api, field_selector="status.phase=Succeeded") == {"batch"}
    assert await names(api, field_selector="status.phase!=Succeeded,spec.nodeName=cpu-1") == {
        "web-front",
        "web-back",
    }
    assert await names(
        api, label_selector="app=web", field_selector="metadata.name!=web-front"
    ) == {"web-back"}
    with pytest.raises(ApiException) as info:
        await names(api, field_selector="spec.containers=x")
    assert info.value.status == 400

    await api.create_namespaced_pod(NS, pod_body("evented"))
    try:
        await eventually(lambda: phase_is(api, "evented", "Running"), "evented runs")
        events = await api.list_namespaced_event(NS, field_selector="involvedObject.name=evented")
        assert events.items and {e.involved_object.name for e in events.items} == {"evented"}
        by_reason = {e.reason: e for e in events.items}
        from_kubelet = await api.list_namespaced_event(
            NS, field_selector="involvedObject.name=evented,source=kubelet"
        )
        assert {e.reason for e in from_kubelet.items} == {"Pulled", "Created", "Started"}
        assert {"Scheduled", "Pulled", "Created", "Started"} <= set(by_reason)
        assert by_reason["Scheduled"].source.component == "default-scheduler"
        assert by_reason["Created"].message == "Created container: notebook"
        assert by_reason["Started"].source.component == "kubelet"
    finally:
        await delete_now(api, "evented")


async def test_watch_with_selectors_timeout_and_bookmarks(api):
    listed = await api.list_namespaced_pod(NS, _preload_content=False)
    since = json.loads(await listed.read())["metadata"]["resourceVersion"]
    await api.create_namespaced_pod(NS, pod_body("watched", labels={"watch": "me"}))
    await api.create_namespaced_pod(NS, pod_body("ignored", labels={"watch": "not-me"}))
    try:
        seen: list[tuple[str, str, str]] = []
        w = watch.Watch()
        # the server ends the watch after timeoutSeconds; the stream then simply stops
        async with w.stream(
            api.list_namespaced_pod,
            NS,
            label_selector="watch=me",
            resource_version=since,
            allow_watch_bookmarks=True,
            timeout_seconds=2,
        ) as stream:
            async for event in stream:
                obj = event["raw_object"]
                seen.append((event["type"], obj["metadata"].get("name", ""), obj["kind"]))
        names_seen = {name for kind, name, _ in seen if kind != "BOOKMARK"}
        assert names_seen == {"watched"}
        assert seen[0][:2] == ("ADDED", "watched")
        assert all(kind == "Pod" for _, _, kind in seen)
    finally:
        await delete_now(api, "watched", "ignored")


# ---------------------------------------------------------------- PATCH
async def test_patch_merge_strategic_and_json(api):
    body = pod_body("patched", labels={"keep": "yes", "drop": "yes"})
    body["metadata"]["annotations"] = {"a": "1"}
    await api.create_namespaced_pod(NS, body)
    try:
        # kubernetes_asyncio sends a dict body as a strategic merge patch by default
        await api.patch_namespaced_pod(
            "patched", NS, {"metadata": {"labels": {"drop": None, "new": "1"}}}
        )
        await api.patch_namespaced_pod(
            "patched",
            NS,
            {"metadata": {"annotations": {"b": "2"}}},
            _content_type="application/merge-patch+json",
        )
        await api.patch_namespaced_pod(
            "patched",
            NS,
            [{"op": "add", "path": "/metadata/labels/json", "value": "patch"}],
        )
        pod = await raw_pod(api, "patched")
        assert pod["metadata"]["labels"] == {"keep": "yes", "new": "1", "json": "patch"}
        assert pod["metadata"]["annotations"] == {"a": "1", "b": "2"}
        # a patch that breaks the schema is refused and changes nothing
        with pytest.raises(ApiException) as info:
            await api.patch_namespaced_pod(
                "patched",
                NS,
                {"metadata": {"labels": {"n": 5}}},
                _content_type="application/merge-patch+json",
            )
        assert info.value.status == 422 and "metadata.labels" in status_of(info.value)["message"]
        assert (await raw_pod(api, "patched"))["metadata"]["labels"].get("n") is None

        # a pod's spec is immutable but for a few fields, as the apiserver enforces
        with pytest.raises(ApiException) as info:
            await api.patch_namespaced_pod(
                "patched", NS, {"spec": {"containers": [{"name": "notebook", "args": ["x"]}]}}
            )
        assert info.value.status == 422 and "pod updates may not change" in info.value.body
        # the status belongs to the kubelet: a PATCH of the pod leaves it alone
        await eventually(lambda: phase_is(api, "patched", "Running"), "patched runs")
        await api.patch_namespaced_pod(
            "patched",
            NS,
            {"status": {"phase": "Failed"}},
            _content_type="application/merge-patch+json",
        )
        assert (await raw_pod(api, "patched"))["status"]["phase"] == "Running"
        # a write based on an older resourceVersion is a 409 Conflict
        stale = {"metadata": {"resourceVersion": "1", "labels": {"late": "yes"}}}
        with pytest.raises(ApiException) as info:
            await api.patch_namespaced_pod(
                "patched", NS, stale, _content_type="application/merge-patch+json"
            )
        assert info.value.status == 409 and status_of(info.value)["reason"] == "Conflict"
        # a JSON patch that does not apply is refused, not a server error
        with pytest.raises(ApiException) as info:
            await api.patch_namespaced_pod(
                "patched", NS, [{"op": "remove", "path": "/metadata/labels/no-such-label"}]
            )
        assert info.value.status == 422
    finally:
        await delete_now(api, "patched")


# ---------------------------------------------------------------- the kubelet
async def test_sigterm_ignored_is_killed_after_the_grace_period(api):
    stubborn = (
        "import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        "print('pid', os.getpid(), flush=True); time.sleep(600)"
    )
    await api.create_namespaced_pod(NS, pod_body("stubborn", [sys.executable, "-c", stubborn]))
    await eventually(lambda: phase_is(api, "stubborn", "Running"), "stubborn runs")

    async def pid() -> int | None:
        words = (await pod_log(api, "stubborn")).split()
        return int(words[1]) if len(words) > 1 else None

    process = await eventually(pid, "the pod's pid in its log")
    await api.delete_namespaced_pod("stubborn", NS, grace_period_seconds=1)
    # during the grace period the pod is still there, marked for deletion, its process alive
    pod = await raw_pod(api, "stubborn")
    assert pod is not None and pod["metadata"]["deletionTimestamp"]
    assert pod["metadata"]["deletionGracePeriodSeconds"] == 1
    assert pid_alive(process)
    events = await api.list_namespaced_event(NS, field_selector="involvedObject.name=stubborn")
    killing = {e.message for e in events.items if e.reason == "Killing"}
    assert killing == {"Stopping container notebook"}
    await eventually(lambda: gone(api, "stubborn"), "stubborn removed")
    assert not pid_alive(process)


async def test_exit_codes_env_and_the_0000_rewrite(api):
    script = (
        "import os, sys; print(os.environ['GREETING'], os.environ['BIND'], "
        "os.environ['POD_IP'], os.environ['POD_NAME']); sys.exit(int(sys.argv[1]))"
    )
    env = [
        {"name": "GREETING", "value": "hello"},
        {"name": "BIND", "value": "0.0.0.0:8888"},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    for name, code in [("exits-0", "0"), ("exits-3", "3")]:
        await api.create_namespaced_pod(
            NS, pod_body(name, [sys.executable, "-c", script, code], env=env)
        )
    try:
        ok = await eventually(lambda: phase_is(api, "exits-0", "Succeeded", "Failed"), "exit 0")
        failed = await eventually(lambda: phase_is(api, "exits-3", "Succeeded", "Failed"), "exit 3")
        assert ok["status"]["phase"] == "Succeeded" and failed["status"]["phase"] == "Failed"
        terminated = ok["status"]["containerStatuses"][0]["state"]["terminated"]
        assert terminated["exitCode"] == 0 and terminated["reason"] == "Completed"
        terminated = failed["status"]["containerStatuses"][0]["state"]["terminated"]
        assert terminated["exitCode"] == 3 and terminated["reason"] == "Error"

        ip = ok["status"]["podIP"]
        greeting, bind, pod_ip, pod_name = (await pod_log(api, "exits-0")).split()
        assert (greeting, bind, pod_ip, pod_name) == ("hello", f"{ip}:8888", ip, "exits-0")
    finally:
        await delete_now(api, "exits-0", "exits-3")


async def test_a_missing_executable_fails_the_pod_like_a_container_runtime(api):
    await api.create_namespaced_pod(NS, pod_body("no-exe", ["no-such-notebook-command"]))
    try:
        pod = await eventually(lambda: phase_is(api, "no-exe", "Failed"), "no-exe fails")
        terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
        assert (terminated["exitCode"], terminated["reason"]) == (128, "StartError")
        assert '"no-such-notebook-command": executable file not found' in terminated["message"]
        events = await api.list_namespaced_event(NS, field_selector="involvedObject.name=no-exe")
        failed = [e for e in events.items if e.reason == "Failed"]
        assert failed and failed[0].type == "Warning" and failed[0].source.component == "kubelet"
    finally:
        await delete_now(api, "no-exe")


async def test_image_map_gives_a_command_to_images_without_one(api, devcluster):
    await api.create_namespaced_pod(NS, pod_body("mapped", None, image="example.org/echo:1"))
    try:
        await eventually(lambda: phase_is(api, "mapped", "Succeeded"), "mapped completes")
        assert (await pod_log(api, "mapped")).strip() == "from-the-image-map"
        logs = await asyncio.to_thread(kubectl, devcluster, "logs", "mapped")
        assert logs.strip() == "from-the-image-map"
    finally:
        await delete_now(api, "mapped")


async def test_kubectl_logs_follow_and_tail(api, devcluster):
    script = "import time; print('one', flush=True); time.sleep(1); print('two', flush=True)"
    await api.create_namespaced_pod(NS, pod_body("talker", [sys.executable, "-c", script]))
    try:
        await eventually(lambda: phase_is(api, "talker", "Running"), "talker runs")
        # -f follows the output until the container ends
        followed = await asyncio.to_thread(kubectl, devcluster, "logs", "-f", "talker")
        assert followed.split() == ["one", "two"]
        await eventually(lambda: phase_is(api, "talker", "Succeeded"), "talker completes")
        assert (await asyncio.to_thread(kubectl, devcluster, "logs", "--tail=1", "talker")) == (
            "two\n"
        )
    finally:
        await delete_now(api, "talker")


# ---------------------------------------------------------------- kubectl and the CLI
def kubectl(devcluster, *args: str) -> str:
    result = subprocess.run(
        ["/usr/bin/kubectl", "--kubeconfig", str(devcluster.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_kubectl_get_nodes_and_pods(devcluster):
    nodes = kubectl(devcluster, "get", "nodes", "-o", "name").split()
    assert {"node/gpu-a100-1", "node/gpu-t4-1", "node/cpu-1", "node/cordoned-1"} <= set(nodes)
    # server-side printing: kubectl's usual columns, not just NAME and AGE
    table = kubectl(devcluster, "get", "pods", "-A", "-o", "wide")
    rows = [line.split() for line in table.splitlines()]
    assert rows[0][:5] == ["NAMESPACE", "NAME", "READY", "STATUS", "RESTARTS"]
    assert "NODE" in rows[0] and "IP" in rows[0]
    by_name = {row[1]: row for row in rows[1:]}
    assert by_name["web-front"][:2] == ["selectors", "web-front"]
    assert by_name["web-front"][3] == "Running" and "cpu-1" in by_name["web-front"]
    assert by_name["batch"][3] == "Succeeded"
    nodes_table = kubectl(devcluster, "get", "nodes").splitlines()
    assert nodes_table[0].split()[:3] == ["NAME", "STATUS", "ROLES"]
    cordoned = next(line.split() for line in nodes_table if line.startswith("cordoned-1"))
    assert cordoned[1] == "Ready,SchedulingDisabled"
    # the short names kubectl learns from discovery
    assert "selectors" in kubectl(devcluster, "get", "ns", "-o", "name")
    described = json.loads(kubectl(devcluster, "get", "node", "gpu-t4-1", "-o", "json"))
    assert described["spec"]["taints"] == [GPU_TAINT]


@pytest.mark.parametrize(
    ("topology", "needle"),
    [("missing.yaml", "topology not found"), ("bad.yaml", "nodes")],
)
def test_cli_exits_2_with_one_line_on_a_bad_topology(tmp_path, topology, needle):
    (tmp_path / "bad.yaml").write_text("pods: []\n")
    result = subprocess.run(
        [sys.executable, "-m", "fracspawner", "devcluster", "--topology", str(tmp_path / topology),
         "--kubeconfig", str(tmp_path / "kubeconfig"), "--state-dir", str(tmp_path / "state")],
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], result.stderr
    assert not (tmp_path / "kubeconfig").exists()
