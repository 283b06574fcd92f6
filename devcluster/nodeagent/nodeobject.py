"""What a kubelet writes about its node, as pure functions of the topology's node: the Node it
registers (kubelet's initialNode: labels, taints, capacity, allocatable), the status it reports
(conditions, addresses, daemonEndpoints, nodeInfo) and its heartbeat Lease in kube-node-lease
(pkg/kubelet/nodelease: holderIdentity and owner the node, leaseDurationSeconds 40)."""

from __future__ import annotations

import copy
import datetime
from collections.abc import Mapping
from typing import Any

LEASE_NAMESPACE = "kube-node-lease"
LEASE_DURATION_SECONDS = 40  # the kubelet's --node-lease-duration-seconds default
#: the kubelet's port; daemonEndpoints says where the apiserver would find the kubelet API
KUBELET_PORT = 10250


def now(micro: bool = False) -> str:
    t = datetime.datetime.now(datetime.timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ" if micro else "%Y-%m-%dT%H:%M:%SZ")


def registration(node: Mapping[str, Any]) -> dict[str, Any]:
    """The Node to create: the topology's metadata (labels, HAMi's registration annotations),
    spec (taints, unschedulable) and status capacity/allocatable."""
    meta = node["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": meta["name"],
            "labels": dict(meta.get("labels") or {}),
            "annotations": dict(meta.get("annotations") or {}),
        },
        "spec": copy.deepcopy(dict(node.get("spec") or {})),
        "status": {
            "capacity": dict(node["status"]["capacity"]),
            "allocatable": dict(node["status"]["allocatable"]),
        },
    }


def _condition(kind: str, status: str, reason: str, message: str, t: str) -> dict[str, str]:
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastHeartbeatTime": t,
        "lastTransitionTime": t,
    }


def status(
    node: Mapping[str, Any], version: str, port: int = KUBELET_PORT, address: str = "127.0.0.1"
) -> dict[str, Any]:
    """The node's status as the kubelet's setters report it (pkg/kubelet/nodestatus): the four
    conditions, InternalIP and Hostname, the kubelet endpoint, nodeInfo with the server's
    version (the kubelet reports its own; the agent stands in at the control plane's)."""
    t = now()
    name = node["metadata"]["name"]
    return {
        "capacity": dict(node["status"]["capacity"]),
        "allocatable": dict(node["status"]["allocatable"]),
        "conditions": [
            _condition(
                "MemoryPressure",
                "False",
                "KubeletHasSufficientMemory",
                "kubelet has sufficient memory available",
                t,
            ),
            _condition(
                "DiskPressure",
                "False",
                "KubeletHasNoDiskPressure",
                "kubelet has no disk pressure",
                t,
            ),
            _condition(
                "PIDPressure",
                "False",
                "KubeletHasSufficientPID",
                "kubelet has sufficient PID available",
                t,
            ),
            _condition(
                "Ready", "True", "KubeletReady", "devcluster node agent is posting ready status", t
            ),
        ],  # fmt: skip
        "addresses": [
            {"type": "InternalIP", "address": address},
            {"type": "Hostname", "address": name},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
        "nodeInfo": {
            "machineID": "",
            "systemUUID": "",
            "bootID": "",
            "kernelVersion": "",
            "osImage": "devcluster node agent",
            "containerRuntimeVersion": "devcluster://1",
            "kubeletVersion": version,
            "kubeProxyVersion": "",
            "operatingSystem": "linux",
            "architecture": "amd64",
        },
    }


def lease(name: str, node_uid: str) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": name,
            "namespace": LEASE_NAMESPACE,
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node_uid}
            ],
        },
        "spec": {
            "holderIdentity": name,
            "leaseDurationSeconds": LEASE_DURATION_SECONDS,
            "renewTime": now(micro=True),
        },
    }


#: the prefix of the taints the control plane keeps on a node by its conditions: the apiserver's
#: TaintNodesByCondition admission plugin puts `node.kubernetes.io/not-ready:NoSchedule` on every
#: Node it creates (plugin/pkg/admission/nodetaint), kube-controller-manager's node lifecycle
#: controller removes it once it sees the node Ready and adds `unreachable` when its Lease runs
#: out (pkg/controller/nodelifecycle: doNoScheduleTaintingPass, doNoExecuteTaintingPass)
CONDITION_TAINTS = "node.kubernetes.io/"
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"


def _taint(taint: Mapping[str, Any]) -> str:
    value = f"={taint['value']}" if taint.get("value") else ""
    return f"{taint['key']}{value}:{taint['effect']}"


def _expected_taints(node: Mapping[str, Any], current: Mapping[str, Any]) -> set[tuple[str, str]]:
    """The taints the node registered with, and the controller's `unschedulable` one while the
    Node is cordoned (by its topology, or by an admin before a restarted agent: not transient)."""
    own = {(t["key"], t["effect"]) for t in registration(node)["spec"].get("taints") or []}
    if (current.get("spec") or {}).get("unschedulable"):
        own.add((UNSCHEDULABLE_TAINT, "NoSchedule"))
    return own


def scheduling_blockers(node: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """Why kube-scheduler would not place a pod on the Node `current` (as read back) that the
    agent registered from the topology's `node`: its Ready condition not True, or a
    `node.kubernetes.io/` taint it did not register with (but for a cordoned Node's
    `unschedulable`). Empty: it can place there."""
    why = []
    conditions = (current.get("status") or {}).get("conditions") or []
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    if ready is None:
        why.append("no Ready condition")
    elif ready.get("status") != "True":
        why.append(f"Ready={ready.get('status')}")
    own = _expected_taints(node, current)
    for taint in (current.get("spec") or {}).get("taints") or []:
        if taint["key"].startswith(CONDITION_TAINTS) and (taint["key"], taint["effect"]) not in own:
            why.append(f"taint {_taint(taint)}")
    return why


def describe(current: Mapping[str, Any]) -> str:
    """A Node's conditions and taints in one line, for an error message."""
    conditions = ", ".join(
        f"{c.get('type')}={c.get('status')} ({c.get('reason', '')}: {c.get('message', '')})"
        for c in (current.get("status") or {}).get("conditions") or []
    )
    taints = ", ".join(_taint(t) for t in (current.get("spec") or {}).get("taints") or [])
    return f"conditions {conditions or 'none'}; taints {taints or 'none'}"
