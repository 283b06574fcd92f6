"""The hub's pod reflector keeps, per pod, what kubespawner and FracSpawner read of it and no
more (issue 37: watch memory), and reads back in the API's shape."""

from __future__ import annotations

import copy
import gc
import tracemalloc
import uuid
from typing import Any

import pytest
from kubespawner import KubeSpawner

from fracspawner.k8s.podcache import PodCache


def _pod(i: int = 0, **status: Any) -> dict[str, Any]:
    """A single-user pod as the API server sends it (managedFields, env, volumes and all)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"jupyter-user{i}",
            "namespace": "jhub",
            "uid": str(uuid.UUID(int=i + 12345)),
            "resourceVersion": str(1000 + i),
            "creationTimestamp": "2026-11-29T01:53:59Z",
            "labels": {
                "component": "singleuser-server",
                "hub.jupyter.org/username": f"user{i}",
                "app": "jupyterhub",
            },
            "annotations": {"hub.jupyter.org/username": f"user{i}"},
            "managedFields": [{"manager": "kubespawner", "fieldsV1": {"f:spec": {}}}],
        },
        "spec": {
            "nodeName": f"node-{i % 7}",
            "containers": [
                {
                    "name": "notebook",
                    "image": "quay.io/jupyter/base-notebook",
                    "env": [{"name": "JUPYTERHUB_API_TOKEN", "value": "x" * 32}],
                    "ports": [{"name": "notebook-port", "containerPort": 8888, "protocol": "TCP"}],
                }
            ],
            "volumes": [{"name": "home", "emptyDir": {}}],
        },
        "status": {
            "phase": "Running",
            "podIP": f"10.1.{i // 250}.{i % 250}",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [
                {
                    "name": "notebook",
                    "ready": True,
                    "restartCount": 0,
                    "image": "quay.io/jupyter/base-notebook",
                    "state": {"running": {"startedAt": "2026-11-29T01:54:10Z"}},
                }
            ],
            **status,
        },
    }


def test_a_kept_pod_reads_back_as_what_kubespawner_reads():
    cache = PodCache()
    cache.put(_pod(3))
    assert cache["jhub/jupyter-user3"] == {
        "metadata": {
            "name": "jupyter-user3",
            "namespace": "jhub",
            "uid": str(uuid.UUID(int=12348)),
            "creationTimestamp": "2026-11-29T01:53:59Z",
        },
        "spec": {
            "nodeName": "node-3",
            "containers": [
                {
                    "name": "notebook",
                    "ports": [{"name": "notebook-port", "containerPort": 8888, "protocol": "TCP"}],
                }
            ],
        },
        "status": {
            "phase": "Running",
            "podIP": "10.1.0.3",
            "containerStatuses": [
                {"name": "notebook", "ready": True, "restartCount": 0, "state": {"running": {}}}
            ],
        },
    }
    assert list(cache) == ["jhub/jupyter-user3"] and len(cache) == 1
    assert "jhub/jupyter-user3" in cache and cache.get("jhub/other") is None


def _variants() -> list[dict[str, Any]]:
    pending = _pod(1, phase="Pending", podIP=None)
    del pending["spec"]["nodeName"]
    del pending["status"]["containerStatuses"]
    terminated = _pod(2, phase="Failed")
    terminated["status"]["containerStatuses"][0].update(
        ready=False, state={"terminated": {"exitCode": 3, "reason": "Error", "startedAt": "x"}}
    )
    deleting = _pod(4)
    deleting["metadata"]["deletionTimestamp"] = "2026-11-29T02:00:00Z"
    unready = _pod(5)
    unready["status"]["containerStatuses"][0]["ready"] = False
    odd = _pod(6, podIP="fd00::6")  # IPv6, a uid that is no UUID, a fractional timestamp
    odd["metadata"].update(uid="not-a-uuid", creationTimestamp="2026-11-29T01:53:59.25Z")
    no_ports = _pod(7)
    no_ports["spec"]["containers"][0].pop("ports")
    return [_pod(0), pending, terminated, deleting, unready, odd, no_ports]


def _containers_read(pod: dict[str, Any]) -> list[tuple] | None:
    statuses = pod["status"].get("containerStatuses")
    if statuses is None:
        return None
    return [(c["name"], c["ready"], "terminated" in c["state"]) for c in statuses]


@pytest.mark.parametrize("raw", _variants(), ids=lambda p: p["metadata"]["name"])
def test_kubespawner_reads_the_same_of_a_kept_pod_as_of_the_whole_pod(raw):
    cache = PodCache()
    cache.put(copy.deepcopy(raw))
    kept = cache[f"jhub/{raw['metadata']['name']}"]
    spawner = KubeSpawner.__new__(KubeSpawner)  # only its pure readers are called
    assert spawner.is_pod_running(kept) == spawner.is_pod_running(raw)
    assert spawner.pod_has_uid(kept) and kept["metadata"]["uid"] == raw["metadata"]["uid"]
    for part in ("phase", "podIP"):
        assert kept["status"][part] == raw["status"][part]
    assert _containers_read(kept) == _containers_read(raw)
    if "terminated" in str(raw["status"]):
        state = kept["status"]["containerStatuses"][0]["state"]["terminated"]
        assert state["exitCode"] == 3
    assert kept["metadata"]["creationTimestamp"] == raw["metadata"]["creationTimestamp"]
    assert ("deletionTimestamp" in kept["metadata"]) == ("deletionTimestamp" in raw["metadata"])
    assert kept["spec"].get("nodeName") == raw["spec"].get("nodeName")
    ports = raw["spec"]["containers"][0].get("ports")
    if ports:
        assert spawner._get_pod_port(kept) == 8888
    else:
        with pytest.raises(KeyError):
            spawner._get_pod_port(kept)


def test_a_read_is_a_fresh_copy_and_updates_and_drops_follow_the_watch():
    cache = PodCache()
    cache.put(_pod(1, phase="Pending"))
    first = cache["jhub/jupyter-user1"]
    first["status"]["phase"] = "Mangled"  # a reader changing its copy changes nothing kept
    assert cache["jhub/jupyter-user1"]["status"]["phase"] == "Pending"
    cache.put(_pod(1))
    assert cache["jhub/jupyter-user1"]["status"]["phase"] == "Running"
    cache.drop(_pod(1))
    assert "jhub/jupyter-user1" not in cache and len(cache) == 0
    cache.drop(_pod(1))  # dropping what is gone is no error


def test_a_listing_replaces_everything_kept():
    cache = PodCache([_pod(1), _pod(2)])
    assert sorted(cache) == ["jhub/jupyter-user1", "jhub/jupyter-user2"]
    assert [p["metadata"]["name"] for p in cache.values()] == ["jupyter-user1", "jupyter-user2"]


def test_a_kept_pod_costs_a_few_hundred_bytes():
    """kubespawner keeps each whole pod (several kB as parsed JSON, tens of kB on a real API
    server); the cache keeps what is read: measured here with tracemalloc, not timed."""
    raws = [_pod(i) for i in range(2000)]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        cache = PodCache(raws)
        del raws
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(cache) == 2000
    assert held / 2000 < 320, f"{held / 2000:.0f} bytes a pod"


def test_comparing_two_caches_reads_no_pod(monkeypatch):
    """traitlets compares a reflector's old `resources` with the new listing's: a Mapping's
    equality would build every kept pod (20,000 dicts at each list)."""
    old, new = PodCache([_pod(1)]), PodCache([_pod(1)])

    def unread(self, key):
        raise AssertionError(f"{key} read")

    monkeypatch.setattr(PodCache, "__getitem__", unread)
    assert old != new and old == old


def test_a_waiting_pod_keeps_what_the_scheduler_says_of_it():
    """FracSpawner tells a GPU wait from other waits by the PodScheduled condition
    (`_stuck_words`, `_unschedulable`) and names the pod's scheduler when none looks at it.
    Before, the cache kept neither: on a real hub every pod still waiting after
    SCHEDULER_GRACE_S read as "No scheduler has taken up your server ... (default-scheduler)"
    and left the line, and a pod that waited for CPU read as a GPU wait."""
    said = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    waiting = _pod(8, phase="Pending", podIP=None)
    del waiting["spec"]["nodeName"]
    del waiting["status"]["containerStatuses"]
    waiting["spec"]["schedulerName"] = "hami-scheduler"
    waiting["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": said,
         "lastTransitionTime": "2026-11-29T01:54:00Z"},
    ]  # fmt: skip
    cache = PodCache([waiting])
    read = cache["jhub/jupyter-user8"]
    assert read["status"]["conditions"] == [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": said}
    ]
    assert read["spec"]["schedulerName"] == "hami-scheduler"
    # once scheduled (and for the default scheduler) nothing more is kept than before
    waiting["spec"].update(nodeName="node-1", schedulerName="default-scheduler")
    waiting["status"]["conditions"] = [{"type": "PodScheduled", "status": "True"}]
    cache.put(waiting)
    read = cache["jhub/jupyter-user8"]
    assert "conditions" not in read["status"] and "schedulerName" not in read["spec"]


# ---------------------------------------------------------------- a pod that cannot start
IMAGE_REF = "quay.io/example/gone:1.0"
NOT_FOUND = (
    f'Back-off pulling image "{IMAGE_REF}": ErrImagePull: rpc error: code = NotFound desc = '
    f'failed to pull and unpack image "{IMAGE_REF}": not found'
)
UNAUTHORIZED = (
    f'failed to pull and unpack image "{IMAGE_REF}": failed to resolve reference '
    f'"{IMAGE_REF}": unexpected status from HEAD request to '
    "https://quay.io/v2/example/gone/manifests/1.0: 401 Unauthorized"
)


def _waiting(i: int, reason: str, message: str, **container: Any) -> dict[str, Any]:
    """A pod bound to its node whose notebook container waits (`reason`, `message`)."""
    pod = _pod(i, phase="Pending", podIP=None)
    pod["spec"]["containers"][0]["image"] = IMAGE_REF
    pod["status"]["containerStatuses"][0].update(
        ready=False,
        image=IMAGE_REF,
        state={"waiting": {"reason": reason, "message": message}},
        **container,
    )
    return pod


def _crashing(i: int, **terminated: Any) -> dict[str, Any]:
    pod = _waiting(
        i,
        "CrashLoopBackOff",
        f"back-off 40s restarting failed container=notebook pod=jupyter-user{i}_jhub(x)",
        restartCount=3,
        lastState={"terminated": {"startedAt": "2026-11-29T01:54:10Z", **terminated}},
    )
    pod["status"]["phase"] = "Running"
    return pod


def _init_pull_failure(i: int) -> dict[str, Any]:
    """The server's init container cannot be pulled: the notebook waits PodInitializing."""
    pod = _waiting(i, "PodInitializing", "")
    pod["status"]["initContainerStatuses"] = [
        {
            "name": "fetch-home",
            "ready": False,
            "restartCount": 0,
            "image": IMAGE_REF,
            "imageID": "",
            "state": {"waiting": {"reason": "ImagePullBackOff", "message": UNAUTHORIZED}},
        }
    ]
    return pod


def _cannot_start() -> list[tuple[str, dict[str, Any], str]]:
    return [
        ("pull-not-found", _waiting(11, "ErrImagePull", NOT_FOUND),
         f"The image Py ({IMAGE_REF}) could not be downloaded: it does not exist in its registry."),
        ("pull-backoff-not-found", _waiting(12, "ImagePullBackOff", NOT_FOUND),
         f"The image Py ({IMAGE_REF}) could not be downloaded: it does not exist in its registry."),
        ("oom", _crashing(13, exitCode=137, reason="OOMKilled"),
         "Your server ran out of memory while starting, again after each restart."),
        ("exit-127", _crashing(14, exitCode=127, reason="Error"),
         "Your server stopped right after starting (exit code 127), and again each time "
         "Kubernetes restarted it. A program it runs is missing from the image Py (is "
         "jupyterhub-singleuser installed?)."),
        ("exec-not-found", _crashing(15, exitCode=128, reason="StartError", message=(
            'failed to create containerd task: exec: "jupyterhub-singleuser": executable file '
            "not found in $PATH: unknown")),
         "Your server stopped right after starting (exit code 128), and again each time "
         "Kubernetes restarted it. A program it runs is missing from the image Py"),
        ("init-pull-unauthorized", _init_pull_failure(16),
         f"The image {IMAGE_REF} of your server's 'fetch-home' container could not be "
         "downloaded: its registry refused to send it (no access)."),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("raw", "said"), [(raw, said) for _, raw, said in _cannot_start()],
    ids=[name for name, _, _ in _cannot_start()],
)  # fmt: skip
def test_a_pod_that_cannot_start_reads_the_same_through_the_cache(raw, said):
    """FracSpawner ends a spawn at once, in words, for an image its registry does not have or
    refuses, or a server that exits at each restart (hub/progress.py `pod_failure`), reading
    the pod the hub's watch keeps. Before, the cache kept of a container state only its
    reason and exit code: no waiting message (which says "not found"), no lastState (exit
    code, OOMKilled), no image, no init containers; on a real hub a missing image was never
    recognised (the user waited start_timeout for "Timeout") and a crash loop's words lacked
    its cause."""
    from fracspawner.hub.progress import pod_failure

    whole = pod_failure(copy.deepcopy(raw), image="Py")
    assert whole is not None and whole.startswith(said), whole
    cache = PodCache([copy.deepcopy(raw)])
    assert pod_failure(cache[f"jhub/{raw['metadata']['name']}"], image="Py") == whole


def test_a_waiting_containers_message_is_kept_bounded():
    """A kubelet message is short, but the cache keeps no unbounded text of a pod."""
    raw = _waiting(17, "ErrImagePull", NOT_FOUND + " " + "x" * 100_000)
    raw["status"]["containerStatuses"][0]["lastState"] = {
        "terminated": {"exitCode": 1, "reason": "Error", "message": "y" * 100_000}
    }
    read = PodCache([raw])["jhub/jupyter-user17"]["status"]["containerStatuses"][0]
    assert read["state"]["waiting"]["message"].startswith(NOT_FOUND)
    assert len(read["state"]["waiting"]["message"]) == 1000
    assert len(read["lastState"]["terminated"]["message"]) == 1000


def test_a_running_pod_is_kept_as_before():
    """What a running pod costs is unchanged: no image, no lastState (of a container that
    was restarted once and runs now), no message: its shape is the one kept before, so
    thousands of running pods still share it."""
    restarted = _pod(18)
    restarted["status"]["containerStatuses"][0].update(
        restartCount=1,
        lastState={"terminated": {"exitCode": 137, "reason": "OOMKilled", "message": "m"}},
    )
    restarted["status"]["initContainerStatuses"] = [
        {"name": "fetch-home", "ready": True, "restartCount": 0, "image": IMAGE_REF,
         "state": {"terminated": {"exitCode": 0, "reason": "Completed", "message": "done"}}},
    ]  # fmt: skip
    cache = PodCache([_pod(3), restarted])
    ports = ((("name", "notebook-port"), ("containerPort", 8888), ("protocol", "TCP")),)
    assert cache._pods["jhub/jupyter-user3"].shape == (
        "Running", "node-3", None, (("notebook", ports),),
        (("notebook", True, 0, (("running", ()),)),), None, None,
    )  # fmt: skip
    status = cache["jhub/jupyter-user18"]["status"]
    assert status["containerStatuses"] == [
        {"name": "notebook", "ready": True, "restartCount": 1, "state": {"running": {}}}
    ]
    assert "initContainerStatuses" not in status
