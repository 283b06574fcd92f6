"""The node agent in place of the kubelet (issue 35 item 2): registers a topology's nodes with
the real control plane (devcluster/controlplane) with each node's own credentials, renews their
Leases, publishes NVIDIA's DRA ResourceSlices as the driver's kubelet plugin does on 1.36, and
reports the pods bound to them as Running without running them. docs/controlplane.md
"Node agent"; `python -m devcluster.nodeagent --kubeconfig ... --topology ...`."""

from __future__ import annotations

from .agent import NodeAgent
from .client import ApiError, Client

__all__ = ["ApiError", "Client", "NodeAgent"]
