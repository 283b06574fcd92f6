"""End to end (issue 14, items 10, 13, 14): simultaneous REST spawns through a real JupyterHub
cannot over-admit a pool or a quota, and what JupyterHub's hooks set for a spawn reaches its pod
while nothing of an earlier spawn does. Pods are checked in devcluster itself."""

from __future__ import annotations

import pytest

from tests.e2e_helpers import (
    env_of,
    fracspawner_marks,
    gpu_keys,
    pods,
    server_pods,
    spawn,
    spawn_all,
    stop,
    stop_all,
    the_pod,
)

pytestmark = pytest.mark.e2e

# Hooks as admins write them (in-place changes to the spawner's traits). JupyterHub runs the
# auth_state_hook and the pre_spawn_hook before Spawner.start (jupyterhub/user.py User.spawn).
HUB_EXTRA_CONFIG = """
def _auth_state_hook(spawner, auth_state):
    spawner.environment["FROM_AUTH_STATE_HOOK"] = spawner.user.name
    spawner.extra_labels["example.org/auth-state-hook"] = "ran"

def _pre_spawn_hook(spawner):
    spawner.environment["FROM_PRE_SPAWN_HOOK"] = "yes"
    if spawner.user_options.get("gpu", "none") != "none":
        spawner.extra_labels["example.org/gpu-user"] = "yes"
        spawner.volumes.append({"name": "scratch", "emptyDir": {}})
        spawner.volume_mounts.append({"name": "scratch", "mountPath": "/scratch"})

c.KubeSpawner.auth_state_hook = _auth_state_hook
c.KubeSpawner.pre_spawn_hook = _pre_spawn_hook
"""


def test_twelve_simultaneous_spawns_for_four_slots_make_four_pods(hub, devcluster):
    users = [f"class{i:02d}" for i in range(12)]
    hub.api("POST", "/groups/ml-research", {})  # 201, or 409 when it exists
    hub.api("POST", "/users", {"usernames": users})
    status, body = hub.api("POST", "/groups/ml-research/users", {"users": users})
    assert status == 200, body

    results = spawn_all(hub, [(u, {"gpu": "1/4", "pool": "t4"}, "") for u in users])

    admitted = [u for u, (status, _) in zip(users, results, strict=True) if status in (201, 202)]
    refused = [(u, body) for u, (status, body) in zip(users, results, strict=True) if status == 400]
    assert len(admitted) == 4 and len(refused) == 8, results
    for user, body in refused:
        # a capacity refusal naming the offer and the pool (words: fracspawner.choice.options)
        assert "1/4" in body["message"] and "T4" in body["message"].upper(), body
        assert not body["message"].startswith("Quota"), body
        assert not server_pods(devcluster, user)
    # the T4's four time-slicing replicas: four pods, all scheduled on it, none left Pending
    t4_pods = pods(devcluster, **{"fracspawner.io/pool": "t4"})
    assert sorted(
        p["metadata"]["annotations"]["hub.jupyter.org/username"] for p in t4_pods
    ) == sorted(admitted)
    for user in admitted:
        hub.wait_ready(user)
        assert the_pod(devcluster, user)["spec"]["nodeName"] == "gpu-t4-1"
    stop_all(hub, devcluster, [(u, "") for u in admitted])


def test_three_named_servers_of_a_quarter_at_once_one_passes(hub, devcluster):
    # the demo's default rule: pool h100, at most 0.25 GPU across all of a user's servers
    results = spawn_all(
        hub, [("quinn", {"gpu": "1/4", "pool": "h100"}, name) for name in ("one", "two", "three")]
    )
    passed = [
        name
        for name, (status, _) in zip(("one", "two", "three"), results, strict=True)
        if status != 400
    ]
    assert len(passed) == 1, results
    for status, body in results:
        if status == 400:
            assert body["message"].startswith("Quota:") and "hold" in body["message"], body
    for name in ("one", "two", "three"):
        assert len(server_pods(devcluster, "quinn", name)) == (name in passed)
    hub.wait_ready("quinn", passed[0])
    stop(hub, "quinn", passed[0], cluster=devcluster)


def test_hooks_reach_the_pod_and_a_later_cpu_spawn_carries_no_gpu(hub, devcluster):
    status, body = spawn(hub, "hana", {"gpu": "1/8", "pool": "h100"})
    assert status in (201, 202), body
    hub.wait_ready("hana")
    pod = the_pod(devcluster, "hana")
    env = env_of(pod)
    assert env["FROM_AUTH_STATE_HOOK"] == "hana" and env["FROM_PRE_SPAWN_HOOK"] == "yes"
    labels = pod["metadata"]["labels"]
    assert labels["example.org/auth-state-hook"] == "ran"
    assert labels["example.org/gpu-user"] == "yes"
    assert "scratch" in {v["name"] for v in pod["spec"]["volumes"]}
    assert fracspawner_marks(pod)["fracspawner.io/gpu"] == "0.125"
    assert gpu_keys(pod)
    stop(hub, "hana", cluster=devcluster)

    status, body = spawn(hub, "hana", {"gpu": "none"})
    assert status in (201, 202), body
    hub.wait_ready("hana")
    pod = the_pod(devcluster, "hana")
    env = env_of(pod)
    assert env["FROM_AUTH_STATE_HOOK"] == "hana" and env["FROM_PRE_SPAWN_HOOK"] == "yes"
    assert "FRACSPAWNER_GPU_MEMORY_MIB" not in env
    assert "example.org/gpu-user" not in pod["metadata"]["labels"]
    assert "scratch" not in {v["name"] for v in pod["spec"].get("volumes") or []}
    assert gpu_keys(pod) == {} and fracspawner_marks(pod) == {}
    stop(hub, "hana", cluster=devcluster)
