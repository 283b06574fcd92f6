"""nodeobject.scheduling_blockers: what keeps kube-scheduler off a Node the agent registered
(pure; NodeAgent.wait_schedulable waits until it is empty)."""

from __future__ import annotations

from typing import Any

from devcluster.nodeagent import nodeobject
from devcluster.topology import load_topology

NOT_READY = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}


def _node(**raw: Any) -> dict[str, Any]:
    return load_topology({"nodes": [{"name": "n", "capacity": {"cpu": "1"}, **raw}]})["nodes"][0]


def _read_back(node: dict[str, Any], ready: str, *taints: dict[str, str]) -> dict[str, Any]:
    current = nodeobject.registration(node)
    current["spec"]["taints"] = [*current["spec"].get("taints", []), *taints]
    current["status"] = nodeobject.status(node, "v1.36.3")
    next(c for c in current["status"]["conditions"] if c["type"] == "Ready")["status"] = ready
    return current


def test_a_ready_node_with_only_its_own_taints_is_schedulable():
    gpu = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    node = _node(taints=[gpu])
    assert nodeobject.scheduling_blockers(node, _read_back(node, "True")) == []


def test_the_taint_the_apiserver_puts_on_a_new_node_blocks_until_removed():
    node = _node()
    current = _read_back(node, "True", NOT_READY)
    assert nodeobject.scheduling_blockers(node, current) == [
        "taint node.kubernetes.io/not-ready:NoSchedule"
    ]


def test_an_unreachable_node_is_named_with_its_condition_and_both_taints():
    node = _node()
    unreachable = "node.kubernetes.io/unreachable"
    current = _read_back(
        node, "Unknown", {"key": unreachable, "effect": "NoSchedule"},
        {"key": unreachable, "effect": "NoExecute"},
    )  # fmt: skip
    assert nodeobject.scheduling_blockers(node, current) == [
        "Ready=Unknown",
        f"taint {unreachable}:NoSchedule",
        f"taint {unreachable}:NoExecute",
    ]
    text = nodeobject.describe(current)
    assert "Ready=Unknown (KubeletReady: devcluster node agent is posting ready status)" in text
    assert text.endswith(f"taints {unreachable}:NoSchedule, {unreachable}:NoExecute"), text


def test_a_node_cordoned_by_its_topology_keeps_its_unschedulable_taint():
    node = _node(unschedulable=True)
    cordoned = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
    assert nodeobject.scheduling_blockers(node, _read_back(node, "True", cordoned)) == []


def test_a_node_an_admin_cordoned_before_the_agent_restarted_is_not_waited_for():
    node = _node()
    cordoned = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
    current = _read_back(node, "True", cordoned)
    assert nodeobject.scheduling_blockers(node, current) == [
        "taint node.kubernetes.io/unschedulable:NoSchedule"
    ]  # the taint outlived the cordon: the controller lifts it
    current["spec"]["unschedulable"] = True  # kept by a Node that already existed
    assert nodeobject.scheduling_blockers(node, current) == []


def test_a_node_without_a_ready_condition_is_not_schedulable():
    node = _node()
    current = _read_back(node, "True")
    current["status"]["conditions"] = []
    assert nodeobject.scheduling_blockers(node, current) == ["no Ready condition"]
    assert nodeobject.describe(current) == "conditions none; taints none"
