"""Live capacity: the cluster index, free/total per pool and offer, and the watches feeding it.

`count` is pure (API dicts in, a frozen snapshot out); `watch` keeps kubespawner reflectors of
nodes and pods and imports kubernetes_asyncio, so it is imported only where a hub runs.
"""

from .count import UNKNOWN, Capacity, OfferCapacity, compute_capacity, gpu_usage_by_user

__all__ = ["UNKNOWN", "Capacity", "OfferCapacity", "compute_capacity", "gpu_usage_by_user"]
