"""The real Kubernetes control plane for tests and the demo (issue 35): etcd, kube-apiserver,
kube-scheduler and kube-controller-manager from k8s.io/kubernetes at the pin in
controlplane/go.mod, built by `make controlplane` into one binary, started here per cluster with
its own certificates, service-account keys, kubeconfigs and loopback ports.

    with ControlPlane.start(state_dir) as cp:
        subprocess.run(["kubectl", "--kubeconfig", cp.kubeconfig, "get", "ns"])

`python -m devcluster.controlplane` runs one in the foreground. docs/controlplane.md.
"""

from __future__ import annotations

from .binary import BinaryMissing, find_binary
from .launcher import ControlPlane, ControlPlaneError

__all__ = ["BinaryMissing", "ControlPlane", "ControlPlaneError", "find_binary"]
