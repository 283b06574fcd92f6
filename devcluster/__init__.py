"""devcluster: a local stand-in for Kubernetes, for fracspawner's demo and tests.

An HTTP server speaking the Kubernetes REST API subset that kubernetes_asyncio (kubespawner)
and kubectl use, with strict schema validation, a scheduler for nodeSelector/affinity/taints
and extended resources, and a kubelet that runs each pod's command as a local process on its
own loopback address. A test double: the product never depends on it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DevCluster", "K8S_VERSION"]


def __getattr__(name: str) -> Any:
    """`from devcluster import DevCluster` imports the Python API server only when asked for:
    the demo and the real control plane's node agent (devcluster/realcluster.py) never use it,
    and importing it (jsonschema, the schemas) took 4-8 s of every `fracspawner demo` start."""
    if name == "DevCluster":
        from .cluster import DevCluster

        return DevCluster
    if name == "K8S_VERSION":
        from .validation import K8S_VERSION

        return K8S_VERSION
    raise AttributeError(f"module 'devcluster' has no attribute {name!r}")
