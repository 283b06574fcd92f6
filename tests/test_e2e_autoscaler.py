"""End to end: a GPU pool at zero nodes on an autoscaled cluster, on the real control plane.
The T4 pool has no node (an autoscaled node pool scaled to zero): kube-scheduler says the
other pools' nodes "didn't match Pod's node affinity/selector". The cluster autoscaler's
answer is an event on the pod, created here through the API as it creates it
(cluster-autoscaler/processors/status/eventing_scale_up_processor.go: reason
TriggeredScaleUp, "pod triggered scale-up: [{<group> 0->1 (max: N)}]"). The pending page then
says a node is being added, and start_timeout does not end the spawn: it waits in line. The
pure side is tests/test_progress_autoscaler.py."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from devcluster.localhub import http_json
from tests.e2e_helpers import (
    demo_topology_with_t4_jobs,
    ensure_group,
    progress_events,
    server_pods,
    spawn,
    stop,
    wait_until,
)

pytestmark = pytest.mark.e2e


def _t4_pool_at_zero() -> dict:
    topology = demo_topology_with_t4_jobs(0)
    topology["nodes"] = [n for n in topology["nodes"] if n["name"] != "gpu-t4-1"]
    return topology


TOPOLOGY = _t4_pool_at_zero()
HUB_EXTRA_CONFIG = """
c.FracSpawner.admission = "wait"
c.KubeSpawner.start_timeout = 15
c.KubeSpawner.slow_spawn_message_threshold = 2
# the grace for a node autoscaler's first word (60 s): shorter here
import fracspawner.hub.spawner as _fs_spawner
_fs_spawner.SCHEDULER_GRACE_S = 2
"""
GROUP = "gke-lab-t4-pool-1a2b3c4d-grp"
SAID = (
    f"A node is being added for your server (the cluster autoscaler is scaling up {GROUP} from "
    "0 to 1 nodes); it starts by itself once the node is ready, usually within a few minutes "
    "(your place is kept for 30 minutes)."
)


def _stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _unschedulable(devcluster, user: str) -> dict | None:
    found = server_pods(devcluster, user)
    conditions = (found[0]["status"].get("conditions") or []) if found else []
    if any(c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
           for c in conditions):  # fmt: skip
        return found[0]
    return None


def _scale_up(devcluster, pod: dict) -> None:
    """What the cluster autoscaler records on a pod it adds a node for."""
    namespace = pod["metadata"]["namespace"]
    group = f"https://www.googleapis.com/compute/v1/projects/lab/zones/z/instanceGroups/{GROUP}"
    event = {
        "metadata": {"name": f"{pod['metadata']['name']}.{uuid.uuid4().hex[:12]}"},
        "involvedObject": {
            "kind": "Pod",
            "namespace": namespace,
            "name": pod["metadata"]["name"],
            "uid": pod["metadata"]["uid"],
            "apiVersion": "v1",
        },
        "reason": "TriggeredScaleUp",
        "message": f"pod triggered scale-up: [{{{group} 0->1 (max: 4)}}]",
        "type": "Normal",
        "source": {"component": "cluster-autoscaler"},
        "firstTimestamp": _stamp(),
        "lastTimestamp": _stamp(),
        "count": 1,
    }
    url = f"{devcluster.url}/api/v1/namespaces/{namespace}/events"
    status, body = http_json("POST", url, event)
    assert status == 201, body


def test_a_node_being_added_is_a_wait_past_start_timeout(hub, devcluster):
    """The autoscaler answers seconds after the scheduler (its scan interval, 10 s): here as
    soon as the pod is unschedulable, while JupyterHub still holds the spawn's POST (its
    slow_spawn_timeout, 10 s)."""
    ensure_group(hub, "ml-research", "olga")
    seen: list[dict] = []

    def autoscaler() -> None:
        pod = wait_until(
            lambda: _unschedulable(devcluster, "olga"), what="olga's pod unschedulable"
        )
        seen.append(pod)
        _scale_up(devcluster, pod)

    answering = threading.Thread(target=autoscaler, daemon=True)
    answering.start()
    status, body = spawn(hub, "olga", {"gpu": "1/4", "pool": "t4"})
    assert status == 202, body
    answering.join(timeout=60)
    (pod,) = seen
    assert "didn't match Pod's node affinity/selector" in str(pod["status"]["conditions"])

    # past start_timeout (15 s) and the grace: still waiting, and saying for what
    events = progress_events(hub, "olga", timeout=20)
    messages = [e.get("message", "") for e in events]
    assert not [e for e in events if e.get("failed")], messages
    assert SAID in messages, messages
    assert messages[-1] == SAID, messages
    assert not [m for m in messages if "does not change by itself" in m], messages
    status, model = hub.api("GET", "/users/olga")
    assert status == 200 and model["servers"][""]["pending"] == "spawn", model
    stop(hub, "olga", cluster=devcluster)
