"""A pod no node takes on an autoscaled cluster waits for the node being added for it.

On GKE, EKS and AKS a GPU node pool often scales from zero: with no node in it, the scheduler
says "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector" (only
other pools' nodes exist), or "Insufficient cpu" where the pool's nodes are full. The pending
pod is what makes a node autoscaler add a node, and it says so with an event on the pod: the
cluster autoscaler's "TriggeredScaleUp" ("pod triggered scale-up: [{<group> 0->1 (max: N)}]")
or "NotTriggerScaleUp" ("pod didn't trigger scale-up: <reasons>"), from
cluster-autoscaler/processors/status/eventing_scale_up_processor.go; Karpenter's "Nominated"
("Pod should schedule on: nodeclaim/<name>") or its own "FailedScheduling" ("Failed to
schedule pod, <why>"), from pkg/controllers/provisioning/scheduling/events.go.

Before (642fc49 .. 7953682) such a pod was told at once "No node takes your server ... This
does not change by itself: tell an administrator." and under admission "wait" it held no
place in line: start_timeout (z2jh: 300 s) ended a spawn waiting for a GPU node's scale-up
(5-10 min). Now a scale-up is a wait in line; within SCHEDULER_GRACE_S of the pod's creation
with no autoscaler's word yet the words do not say it is hopeless; after it, or where the
autoscaler says it adds no node, the hard words stay. Stand-ins as in
tests/test_review56_progress.py; the pod's events a list."""

from __future__ import annotations

import asyncio

import pytest
from tornado.web import HTTPError

from fracspawner.hub import spawner as spawner_module
from fracspawner.hub.progress import node_autoscaling, scheduling_trouble, scheduling_wait
from fracspawner.hub.spawner import FracSpawner
from fracspawner.hub.waiting import WaitingSpawns
from tests.hub_support import refusal
from tests.test_review56_progress import (
    CPU_SHORT,
    GPU_FULL,
    progress_of,
    spawn_with_pod,
    stamp,
    unschedulable,
)

#: a GPU pool at zero nodes: only the other pools' nodes exist, and they do not match
NO_NODE = (
    "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector. "
    "preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."
)
GKE_GROUP = (
    "https://www.googleapis.com/compute/v1/projects/lab/zones/us-central1-a/instanceGroups/"
    "gke-hub-t4-pool-1a2b3c4d-grp"
)
OLD = spawner_module.SCHEDULER_GRACE_S + 30
HARD = (
    "No node takes your server: the pool's nodes do not match what the pod asks for (their "
    "labels or taints), or they are closed to new pods. This does not change by itself: tell "
    "an administrator."
)
ADDING = (
    "A node is being added for your server (the cluster autoscaler is scaling up "
    "gke-hub-t4-pool-1a2b3c4d-grp from 0 to 1 nodes); it starts by itself once the node is "
    "ready, usually within a few minutes (your place is kept for 30 minutes)."
)


def event(reason: str, message: str, seconds_ago: float = 1, type_: str = "Normal") -> dict:
    return {
        "metadata": {"uid": f"uid-{reason}-{seconds_ago}"},
        "involvedObject": {"kind": "Pod", "name": "jupyter-ann"},
        "reason": reason,
        "type": type_,
        "message": message,
        "lastTimestamp": stamp(seconds_ago),
        "eventTime": None,
    }


TRIGGERED = event("TriggeredScaleUp", f"pod triggered scale-up: [{{{GKE_GROUP} 0->1 (max: 4)}}]")
NOT_TRIGGERED = event(
    "NotTriggerScaleUp", "pod didn't trigger scale-up: 1 max node group size reached"
)
NOMINATED = event("Nominated", "Pod should schedule on: nodeclaim/gpu-t4-x7k2p")


def failed_scheduling(message: str) -> dict:
    raw = {"reason": "FailedScheduling", "type": "Warning", "message": message}
    return {"progress": 30, "raw_event": raw, "message": "x"}


async def pending(monkeypatch, message: str, events: list, *, age: float, admission="wait", **kw):
    """A spawn for 1/4 T4 whose pod, made `age` s ago, the scheduler placed on no node
    (`message`), with `events` (a list the test may change) as the pod's events."""
    pod = unschedulable(message, seconds_ago=age)
    spawner = await spawn_with_pod(monkeypatch, admission, pod, **kw)
    monkeypatch.setattr(FracSpawner, "events", property(lambda self: list(events)))
    return spawner


# ---------------------------------------------------------------- the words
def test_the_autoscalers_latest_word_is_read():
    assert node_autoscaling([]) is None
    assert node_autoscaling([event("Scheduled", "Successfully assigned")]) is None
    assert node_autoscaling([NOT_TRIGGERED, TRIGGERED]).adding
    assert not node_autoscaling([TRIGGERED, NOT_TRIGGERED]).adding
    karpenter_failed = event("FailedScheduling", "Failed to schedule pod, no nodepool matched")
    assert not node_autoscaling([NOMINATED, karpenter_failed]).adding
    # kube-scheduler's own FailedScheduling is not an autoscaler's word
    assert node_autoscaling([event("FailedScheduling", NO_NODE)]) is None


def test_the_wait_words():
    adding = node_autoscaling([TRIGGERED])
    assert scheduling_wait(NO_NODE, adding, early=False, kept="30 minutes") == ADDING
    assert scheduling_wait(CPU_SHORT, adding, early=False, kept="30 minutes") == ADDING
    assert scheduling_wait(NO_NODE, node_autoscaling([NOMINATED]), early=False) == (
        "A node is being added for your server (Karpenter is starting nodeclaim/gpu-t4-x7k2p); "
        "it starts by itself once the node is ready, usually within a few minutes."
    )
    # no autoscaler's word yet, the pod young: nothing said hopeless
    assert scheduling_wait(NO_NODE, None, early=True) == (
        "None of the cluster's nodes now takes your server (their labels or taints); checking "
        "whether the cluster adds a node for it (up to a minute)."
    )
    assert scheduling_wait(CPU_SHORT, None, early=True) == (
        "No node has the CPU or memory your server asks for free right now; checking whether "
        "the cluster adds a node for it (up to a minute)."
    )
    # the hard words stand: after the grace, where the autoscaler adds none, or no node mends it
    assert scheduling_wait(NO_NODE, None, early=False) is None
    assert scheduling_wait(NO_NODE, node_autoscaling([NOT_TRIGGERED]), early=True) is None
    assert scheduling_wait(GPU_FULL, node_autoscaling([TRIGGERED]), early=True) is None
    storage = "0/1 nodes are available: 1 node(s) had volume node affinity conflict."
    assert scheduling_wait(storage, None, early=True) is None
    assert scheduling_trouble(NO_NODE, node_autoscaling([NOT_TRIGGERED])) == (
        f"{HARD} The cluster autoscaler adds no node for it (1 max node group size reached)."
    )


# ---------------------------------------------------------------- a node is being added
@pytest.mark.parametrize("message", [NO_NODE, CPU_SHORT], ids=["pool-at-zero", "cpu-short"])
async def test_a_scale_up_is_a_wait_in_line(monkeypatch, message):
    """Before: the hard words (or the CPU ones), and no place in line."""
    spawner = await pending(monkeypatch, message, [TRIGGERED], age=OLD)
    assert await progress_of(spawner, [failed_scheduling(message)]) == [ADDING]
    # the autoscaler's event itself, and kubespawner's patience messages, say the same
    said = await progress_of(
        spawner, [{"progress": 40, "raw_event": TRIGGERED, "message": "x"}, {"message": "slow"}]
    )
    assert said == [ADDING, ADDING]
    assert spawner._stuck_words() is None
    assert spawner._in_line()


async def test_a_scale_up_counts_against_queue_timeout_not_start_timeout(monkeypatch):
    """Before: start_timeout (1 s here) ended it with "did not start in 1 seconds. No node
    takes your server ..."; now its place in line is kept for queue_timeout (2 s here)."""
    spawner = await pending(monkeypatch, NO_NODE, [TRIGGERED], age=OLD, start_timeout=1)
    spawner.queue_timeout = 2
    task = asyncio.ensure_future(spawner._start())
    await asyncio.wait([task], timeout=1.6)
    assert not task.done()  # past start_timeout
    assert len(WaitingSpawns.shared()) == 1  # its place in line
    with pytest.raises(HTTPError) as caught:
        await asyncio.wait_for(task, timeout=5)
    assert "your place is given up" in refusal(caught.value)


async def test_karpenter_nominating_a_node_is_a_wait(monkeypatch):
    spawner = await pending(monkeypatch, NO_NODE, [NOMINATED], age=OLD)
    (said,) = await progress_of(spawner, [failed_scheduling(NO_NODE)])
    assert said.startswith("A node is being added for your server (Karpenter is starting")
    assert spawner._in_line()


async def test_start_timeout_under_refuse_says_a_node_is_being_added(monkeypatch):
    """Under "refuse" no place in line is kept: start_timeout ends it, saying what it was on."""
    spawner = await pending(monkeypatch, NO_NODE, [TRIGGERED], age=OLD, admission="refuse",
                            start_timeout=1)  # fmt: skip
    with pytest.raises(asyncio.TimeoutError) as caught:
        await asyncio.wait_for(spawner._start(), timeout=5)
    said = str(caught.value)
    assert said.startswith("ann did not start in 1 seconds. A node is being added for your"), said
    assert said.endswith("usually within a few minutes."), said  # no place in line kept


# ---------------------------------------------------------------- no node is being added
async def test_an_autoscaler_that_adds_no_node_keeps_the_hard_words(monkeypatch):
    spawner = await pending(monkeypatch, NO_NODE, [TRIGGERED, NOT_TRIGGERED], age=5)
    words = f"{HARD} The cluster autoscaler adds no node for it (1 max node group size reached)."
    assert await progress_of(spawner, [failed_scheduling(NO_NODE)]) == [words]
    said = await progress_of(
        spawner, [{"progress": 40, "raw_event": NOT_TRIGGERED, "message": "x"}]
    )
    assert said == [words]
    assert spawner._stuck_words() == words
    assert not spawner._in_line()


async def test_within_the_grace_without_an_autoscalers_word_nothing_is_said_hopeless(monkeypatch):
    """The autoscaler looks every 10 s (--scan-interval): a pod seconds old has no word from
    it yet. Before: the hard words at once."""
    events: list = []
    spawner = await pending(monkeypatch, NO_NODE, events, age=5)
    (said,) = await progress_of(spawner, [failed_scheduling(NO_NODE)])
    assert "does not change by itself" not in said
    assert said == scheduling_wait(NO_NODE, None, early=True)
    assert spawner._stuck_words() is None and spawner._in_line()
    events.append(TRIGGERED)  # then the autoscaler's word
    assert await progress_of(spawner, [failed_scheduling(NO_NODE)]) == [ADDING]


async def test_after_the_grace_without_an_autoscalers_word_the_hard_words_stay(monkeypatch):
    """No autoscaler runs (or it does not watch this pool): what 642fc49 said, kept."""
    spawner = await pending(monkeypatch, NO_NODE, [], age=OLD)
    assert await progress_of(spawner, [failed_scheduling(NO_NODE)]) == [HARD]
    assert spawner._stuck_words() == HARD
    assert not spawner._in_line()
