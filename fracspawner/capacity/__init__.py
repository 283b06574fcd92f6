"""Live capacity: free/total per pool and offer, and the watches feeding it.

`count` and `live` are pure (API dicts in, a frozen snapshot out; `live` keeps it up to date
event by event); `watch` keeps node and pod watches and imports kubernetes_asyncio, so it is
imported only where a hub runs.
"""

from .count import UNKNOWN, Capacity, OfferCapacity, compute_capacity, gpu_usage_by_user
from .live import LiveCapacity

__all__ = [
    "UNKNOWN",
    "Capacity",
    "LiveCapacity",
    "OfferCapacity",
    "compute_capacity",
    "gpu_usage_by_user",
]
