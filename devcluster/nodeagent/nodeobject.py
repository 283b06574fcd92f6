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
