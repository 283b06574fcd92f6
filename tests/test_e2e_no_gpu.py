"""End to end: a pool whose node offers no GPU to Kubernetes (its device plugin never
registered, so the node's allocatable has no nvidia.com/gpu) is not said to wait for a free
one, on the real control plane: kube-scheduler says "Insufficient nvidia.com/gpu" as for a
full pool, the hub's pod watch sees the node publish none, and the pending page says so; the
spawn holds no place in line past the grace and start_timeout ends it in those words. The
pure side is tests/test_progress_no_gpu.py."""

from __future__ import annotations

import pytest

from tests.e2e_helpers import demo_topology_with_t4_jobs, ensure_group, progress_events, spawn

pytestmark = pytest.mark.e2e


def _without_t4_gpus() -> dict:
    topology = demo_topology_with_t4_jobs(0)
    for node in topology["nodes"]:
        if node["name"] == "gpu-t4-1":
            node["capacity"].pop("nvidia.com/gpu")
    return topology


TOPOLOGY = _without_t4_gpus()
HUB_EXTRA_CONFIG = """
c.FracSpawner.admission = "wait"
c.KubeSpawner.start_timeout = 20
c.KubeSpawner.slow_spawn_message_threshold = 2
# the grace a node that has just joined has to register its GPUs (60 s): shorter here
import fracspawner.hub.spawner as _fs_spawner
_fs_spawner.SCHEDULER_GRACE_S = 4
# and the one a node's GPUs have after it became Ready (10 min): the node is seconds old
_fs_spawner.NODE_GPU_GRACE_S = 4
"""
SAID = "None of the nodes of T4 16GB (time-sliced) offers a GPU to Kubernetes now"


def test_a_pool_without_gpus_says_so_and_ends_at_start_timeout(hub, devcluster):
    ensure_group(hub, "ml-research", "nell")
    status, body = spawn(hub, "nell", {"gpu": "1/4", "pool": "t4"})
    assert status == 202, body
    events = progress_events(hub, "nell", timeout=120)
    messages = [e.get("message", "") for e in events]
    assert events[-1].get("failed"), messages
    assert not [m for m in messages if "starts by itself" in m], messages
    assert [m for m in messages if m.startswith(SAID)], messages
    assert SAID in events[-1]["message"], events[-1]
    assert "did not start in 20 seconds" in events[-1]["message"], events[-1]
