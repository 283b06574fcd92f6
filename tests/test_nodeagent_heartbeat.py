"""A node's Lease is renewed from a thread of its own, as the kubelet's lease controller does
(k8s.io/component-helpers apimachinery/lease, started by pkg/kubelet/kubelet.go on its own
goroutine): a pod watch or a reconcile that blocks (a slow apiserver, a loaded machine) must not
let kube-controller-manager's node-monitor-grace-period (50 s in 1.36) pass, or the node goes
Unknown and is tainted node.kubernetes.io/unreachable (NoSchedule, then NoExecute: its pods
evicted). Against a stand-in for the apiserver: no control plane needed."""

from __future__ import annotations

import copy
import threading
import time
from typing import Any

import pytest

from devcluster.nodeagent import agent as agent_module
from devcluster.nodeagent.agent import NodeAgent
from devcluster.topology import load_topology

NODE = "n1"
PODS = "/api/v1/pods"


class StuckApiserver:
    """One node's view of an apiserver whose pod status writes hang until `release` is set:
    the Node and its status kept as written, Lease renewals recorded, one pod bound."""

    def __init__(self) -> None:
        self.node: dict[str, Any] = {}
        self.renewals: list[str] = []
        self.stuck = threading.Event()  # a reconcile is blocked in a pod status write
        self.release = threading.Event()
        self.pod = {"metadata": {"name": "p", "namespace": "default", "uid": "u1",
                                 "resourceVersion": "1"},
                    "spec": {"nodeName": NODE, "containers": [{"name": "c", "image": "i"}]},
                    "status": {}}  # fmt: skip

    def get(self, path: str, **params: str) -> dict[str, Any]:
        if path == "/version":
            return {"gitVersion": "v1.36.3"}
        if path == PODS:
            return {"items": [copy.deepcopy(self.pod)], "metadata": {"resourceVersion": "1"}}
        if path == f"/api/v1/nodes/{NODE}":
            return copy.deepcopy(self.node)
        raise AssertionError(f"unexpected GET {path}")

    def create(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        if path == "/api/v1/nodes":
            self.node = {**copy.deepcopy(obj), "metadata": {**obj["metadata"], "uid": "nu"}}
            return copy.deepcopy(self.node)
        if path.endswith("/leases"):
            self.renewals.append(obj["spec"]["renewTime"])
            return obj
        raise AssertionError(f"unexpected POST {path}")

    def merge_patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        if "/leases/" in path:
            if not self.renewals:
                raise agent_module.ApiError(404, "PATCH", path, "{}")
            self.renewals.append(patch["spec"]["renewTime"])
            return {}
        if path == f"/api/v1/nodes/{NODE}/status":
            self.node["status"] = patch["status"]
            return copy.deepcopy(self.node)
        self.stuck.set()  # a pod's status: the reconcile path blocks here
        self.release.wait(60)
        return {}

    def watch(self, path: str, timeout_seconds: int, **params: str):
        time.sleep(0.1)
        return iter(())


def test_the_lease_is_renewed_while_the_pod_reconcile_is_blocked(
    monkeypatch: pytest.MonkeyPatch, tmp_path
):
    api = StuckApiserver()
    monkeypatch.setattr(agent_module, "RENEW_SECONDS", 0.2)
    monkeypatch.setattr(agent_module, "Client", lambda _kubeconfig: api)
    monkeypatch.setattr(agent_module, "node_kubeconfig", lambda *args: tmp_path / "kubeconfig")
    topology = load_topology({"nodes": [{"name": NODE, "capacity": {"cpu": "8"}}]})
    agent = NodeAgent._start(topology, "https://127.0.0.1:6443", None, tmp_path, print, None, None)
    try:
        assert api.stuck.wait(30), "the pod's reconcile never began"
        before = len(api.renewals)
        deadline = time.monotonic() + 30  # a hang guard: renewals come every 0.2 s
        while len(api.renewals) < before + 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(api.renewals) >= before + 3, (
            f"the Lease was renewed {len(api.renewals) - before} times in 30 s while a pod's "
            f"reconcile was blocked ({len(api.renewals)} in all)"
        )
        agent.check()  # no thread ended
    finally:
        api.release.set()
        agent.stop()
