"""devcluster: a local stand-in for Kubernetes, for fracspawner's demo and tests.

An HTTP server speaking the Kubernetes REST API subset that kubernetes_asyncio (kubespawner)
and kubectl use, with strict schema validation, a scheduler for nodeSelector/affinity/taints
and extended resources, and a kubelet that runs each pod's command as a local process on its
own loopback address. A test double: the product never depends on it.
"""

from .cluster import DevCluster
from .validation import K8S_VERSION

__all__ = ["DevCluster", "K8S_VERSION"]
