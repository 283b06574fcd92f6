"""What a user is told while a server fails to start (review 56): a pod that can never start
ends the spawn at once in words that say what happened and who fixes it, start_timeout says
what the pod was stuck on, and a pod that waits for something other than a GPU is not told,
nor counted, as waiting in line for one. Stand-ins: real JupyterHub users and spawners
(tests/hub_support.py), kubespawner's `_start` and `progress` replaced, the pod watch a dict."""

from __future__ import annotations

import asyncio
import time
import types

import pytest
from kubespawner import KubeSpawner
from tornado.web import HTTPError

from fracspawner.hub import spawner as spawner_module
from fracspawner.hub.progress import human_step, pod_failure, scheduling_trouble
from fracspawner.hub.spawner import FracSpawner
from fracspawner.hub.waiting import WaitingSpawns
from fracspawner.k8s.podcache import PodCache
from tests.hub_support import HubUsers, begin_spawn, refusal
from tests.test_waiting_line import CATALOG

IMAGE_REF = "quay.io/jupyter/base-notebook"
GPU_FULL = (
    "0/5 nodes are available: 4 Insufficient nvidia.com/gpu, 1 node(s) didn't match Pod's "
    "node affinity/selector. preemption: 0/5 nodes are available: 5 No preemption victims "
    "found for incoming pod."
)
CPU_SHORT = (
    "0/5 nodes are available: 1 Insufficient cpu, 4 node(s) didn't match Pod's node "
    "affinity/selector. preemption: 0/5 nodes are available: 5 Preemption is not helpful "
    "for scheduling."
)
NO_MATCH = (
    "0/3 nodes are available: 1 node(s) had untolerated taint {nvidia.com/gpu: present}, 2 "
    "node(s) didn't match Pod's node affinity/selector. preemption: 0/3 nodes are available: "
    "3 Preemption is not helpful for scheduling."
)


@pytest.fixture(autouse=True)
def empty_line():
    WaitingSpawns.shared().keys.clear()
    yield
    WaitingSpawns.shared().keys.clear()


def stamp(seconds_ago: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - seconds_ago))


async def spawn_with_pod(
    monkeypatch, admission: str, pod: dict, start_timeout: int = 300, watch: type = dict
):
    """A spawner admitted for 1/4 GPU on the T4, its pod (`pod`, a dict the test may change)
    in a stand-in watch, kubespawner's `_start` waiting for ever. `watch`: dict holds the pod
    whole; PodCache as the hub's pod reflector keeps it (what a real hub reads)."""
    hub = HubUsers({"FracSpawner": {"catalog": CATALOG, "admission": admission}})
    spawner = hub.spawner(hub.user("ann"))
    await begin_spawn(spawner, {"gpu": "1/4", "pool": "t4"})
    pod.setdefault("metadata", {}).setdefault("name", spawner.pod_name)
    if watch is PodCache:
        pod["metadata"].setdefault("namespace", spawner.namespace)
        pods = PodCache([pod])
    else:
        pods = {f"{spawner.namespace}/{spawner.pod_name}": pod}
    reflector = types.SimpleNamespace(pods=pods)
    monkeypatch.setattr(FracSpawner, "pod_reflector", property(lambda self: reflector))

    async def pending_for_ever(self):
        await asyncio.Event().wait()

    monkeypatch.setattr(KubeSpawner, "_start", pending_for_ever)
    spawner._startup_timeout = start_timeout
    return spawner


def pulling(reason: str, message: str) -> dict:
    return {
        "spec": {"nodeName": "t4-0"},
        "status": {
            "phase": "Pending",
            "containerStatuses": [
                {
                    "name": "notebook",
                    "image": IMAGE_REF,
                    "ready": False,
                    "state": {"waiting": {"reason": reason, "message": message}},
                }
            ],
        },
    }


# ---------------------------------------------------------------- the image cannot be pulled
NOT_FOUND = (
    f'Back-off pulling image "{IMAGE_REF}": ErrImagePull: rpc error: code = NotFound desc = '
    f'failed to pull and unpack image "{IMAGE_REF}:latest": not found'
)


@pytest.mark.parametrize("watch", [dict, PodCache], ids=["whole", "podcache"])
@pytest.mark.parametrize("admission", ["refuse", "wait"])
async def test_an_image_not_in_its_registry_ends_the_spawn_at_once_in_words(
    monkeypatch, admission, watch
):
    """Before: the kubelet's back-off went on until start_timeout (5 min in z2jh), the page
    saying "could not be downloaded; retrying" and "Your server could not start: Error:
    ImagePullBackOff", then "Spawn failed: Timeout". Through a PodCache (the hub's pod watch)
    it did so still: the cache kept no waiting message, so "not found" was never read."""
    pulls = pulling("ImagePullBackOff", NOT_FOUND)
    spawner = await spawn_with_pod(monkeypatch, admission, pulls, watch=watch)
    image = spawner.choice.image.display_name
    with pytest.raises(HTTPError) as caught:
        await asyncio.wait_for(spawner._start(), timeout=5)
    assert caught.value.status_code == 500
    assert (
        caught.value.jupyterhub_message
        == refusal(caught.value)
        == (
            f"The image {image} ({IMAGE_REF}) could not be downloaded: it does not exist in its "
            "registry. This is for an administrator to fix: choose another image, or tell them."
        )
    )
    assert len(WaitingSpawns.shared()) == 0


async def test_a_pull_that_may_pass_on_a_retry_is_not_a_failure(monkeypatch):
    rate_limited = f'Back-off pulling image "{IMAGE_REF}": 429 Too Many Requests'
    spawner = await spawn_with_pod(monkeypatch, "refuse", pulling("ImagePullBackOff", rate_limited))
    task = asyncio.ensure_future(spawner._start())
    await asyncio.wait([task], timeout=2.5)
    assert not task.done()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def test_docker_hubs_ambiguous_refusal_is_not_called_a_missing_image():
    """Docker Hub answers a private repository the node may not read as it answers one that does
    not exist; the words said "it does not exist in its registry" for both."""
    said = (
        f'failed to pull and unpack image "docker.io/{IMAGE_REF}:latest": failed to resolve '
        "reference: pull access denied, repository does not exist or may require authorization: "
        "server message: insufficient_scope: authorization failed"
    )
    words = pod_failure(pulling("ImagePullBackOff", said), image="Py")
    assert words is not None
    assert "does not exist in its registry, or the registry refused to send it (no access)" in words


def test_a_command_missing_from_the_image_under_cri_o_ends_the_spawn():
    """CRI-O answers a command that is not in the image with CreateContainerError, which the
    kubelet tries again for ever; it waited until start_timeout ("Timeout")."""
    said = (
        'container create failed: exec: "jupyterhub-singleuser": executable file not found in $PATH'
    )
    words = pod_failure(pulling("CreateContainerError", said), image="Py")
    assert words == (
        "Your server cannot start: a program it runs is missing from the image Py (is "
        "jupyterhub-singleuser installed?). This is for an administrator to fix: choose another "
        "image, or tell them."
    )
    # a config error (a missing Secret, a ConfigMap key) is another matter: not this
    for other in ('secret "x" not found', 'error mounting "/data": no such file or directory'):
        assert pod_failure(pulling("CreateContainerError", other)) is None, other


def test_pull_events_read_as_the_image_not_as_a_failed_server():
    for message in (f'Failed to pull image "{IMAGE_REF}": not found', "Error: ErrImagePull",
                    "Error: ImagePullBackOff"):  # fmt: skip
        got = human_step({"reason": "Failed", "type": "Warning", "message": message}, image="Py")
        assert got == "The image Py could not be downloaded; retrying.", message


# ---------------------------------------------------------------- the server exits at once
@pytest.mark.parametrize("watch", [dict, PodCache], ids=["whole", "podcache"])
async def test_a_server_that_exits_at_once_ends_the_spawn_and_says_what_is_missing(
    monkeypatch, watch
):
    """Before: "Your server stopped right after starting; Kubernetes is retrying." until
    start_timeout, then "Spawn failed: Timeout". Through a PodCache the words had neither the
    exit code nor what is missing: the cache kept no lastState."""
    pod = pulling("CrashLoopBackOff", "back-off 40s restarting failed container=notebook")
    pod["status"]["phase"] = "Running"
    pod["status"]["containerStatuses"][0]["lastState"] = {
        "terminated": {"exitCode": 127, "reason": "Error"}
    }
    spawner = await spawn_with_pod(monkeypatch, "refuse", pod, watch=watch)
    image = spawner.choice.image.display_name
    with pytest.raises(HTTPError) as caught:
        await asyncio.wait_for(spawner._start(), timeout=5)
    assert caught.value.jupyterhub_message == (
        "Your server stopped right after starting (exit code 127), and again each time "
        f"Kubernetes restarted it. A program it runs is missing from the image {image} (is "
        "jupyterhub-singleuser installed?). This is for an administrator to fix: choose another "
        "image, or tell them."
    )


def test_out_of_memory_at_start_says_so():
    pod = pulling("CrashLoopBackOff", "")
    pod["status"]["containerStatuses"][0]["lastState"] = {
        "terminated": {"exitCode": 137, "reason": "OOMKilled"}
    }
    assert pod_failure(pod).startswith("Your server ran out of memory while starting")


# ---------------------------------------------------------------- start_timeout (refuse)
async def test_start_timeout_under_refuse_says_what_the_pod_was_stuck_on(monkeypatch):
    """Before: JupyterHub's own timer fired first, and the page said "Spawn failed: Timeout".
    The pod is past SCHEDULER_GRACE_S with no node autoscaler's word (within it, a node may
    yet be added: tests/test_progress_autoscaler.py)."""
    pod = unschedulable(NO_MATCH, seconds_ago=spawner_module.SCHEDULER_GRACE_S + 30)
    pod["spec"]["schedulerName"] = "hami-scheduler"
    spawner = await spawn_with_pod(monkeypatch, "refuse", pod, start_timeout=1)
    spawner.start_timeout = 1
    started = spawner.start()  # JupyterHub reads its limit after this: later than _start's own
    assert spawner.start_timeout > 1
    with pytest.raises(asyncio.TimeoutError) as caught:
        await asyncio.wait_for(started, timeout=5)
    said = str(caught.value)
    assert said.startswith("ann did not start in 1 seconds. No node takes your server"), said
    assert "besides" not in said and spawner.start_timeout == 1


# ---------------------------------------------------------------- not waiting for a GPU
def test_the_scheduler_reasons_tell_a_gpu_wait_from_other_ones():
    assert scheduling_trouble(GPU_FULL) is None
    assert scheduling_trouble("0/1 nodes are available: 1 cannot allocate all claims.") is None
    assert scheduling_trouble("something else") is None
    assert scheduling_trouble(CPU_SHORT).startswith("No node for your server has the CPU or")
    assert scheduling_trouble(NO_MATCH).startswith("No node takes your server")


def unschedulable(message: str, seconds_ago: float = 5) -> dict:
    return {
        "metadata": {"creationTimestamp": stamp(seconds_ago)},
        "spec": {"schedulerName": "default-scheduler"},
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": message,
                },
            ],  # fmt: skip
        },
    }


async def progress_of(spawner, events):
    async def kubespawner_progress(self):
        for event in events:
            yield event

    original = KubeSpawner.progress
    KubeSpawner.progress = kubespawner_progress
    try:
        return [e["message"] async for e in spawner.progress()]
    finally:
        KubeSpawner.progress = original


async def test_a_pod_short_of_cpu_is_not_said_to_wait_for_a_gpu_nor_in_line(monkeypatch):
    """Before: "Waiting for a free 1/4 GPU on t4 ...; it starts by itself as soon as one
    frees", and under admission "wait" it took a place in line and waited queue_timeout (30
    min) to fail with "No 1/4 GPU on t4 freed within 30 minutes". Past SCHEDULER_GRACE_S
    with no node autoscaler's word (tests/test_progress_autoscaler.py: within it, or while one
    adds a node, a wait)."""
    old = spawner_module.SCHEDULER_GRACE_S + 30
    spawner = await spawn_with_pod(monkeypatch, "wait", unschedulable(CPU_SHORT, old))
    raw = {"reason": "FailedScheduling", "type": "Warning", "message": CPU_SHORT}
    said = await progress_of(spawner, [{"progress": 30, "raw_event": raw, "message": "x"}])
    assert said == [scheduling_trouble(CPU_SHORT)]
    assert not spawner._in_line()
    assert len(WaitingSpawns.shared()) == 0
    # a GPU wait still is one
    spawner.pod_reflector.pods[f"{spawner.namespace}/{spawner.pod_name}"] = unschedulable(GPU_FULL)
    assert spawner._in_line()


async def test_a_pod_no_scheduler_looks_at_says_so_and_is_not_in_line(monkeypatch):
    """A pod whose schedulerName names a scheduler that is not running (HAMi's not installed)
    stays Pending with no event and no condition. Before: kubespawner's "Spawn taking longer
    than expected" and, under admission "wait", 30 minutes in line for a GPU."""
    pod = unschedulable("", seconds_ago=spawner_module.SCHEDULER_GRACE_S + 30)
    pod["spec"]["schedulerName"] = "hami-scheduler"
    del pod["status"]["conditions"]
    spawner = await spawn_with_pod(monkeypatch, "wait", pod)
    said = await progress_of(spawner, [{"message": "Spawn taking longer than expected (90 s)"}])
    assert said == [
        "No scheduler has taken up your server in 1 minute: the scheduler it needs "
        "(hami-scheduler) may not be installed or running. This does not change by itself: "
        "tell an administrator."
    ]
    assert not spawner._in_line()
    pod["metadata"]["creationTimestamp"] = stamp(2)  # just made: not yet
    assert spawner._stuck_words() is None and spawner._in_line()
