"""Per-namespace quota bookkeeping for concurrent admissions.

The API server creates a pod only after every webhook answered, so two CREATEs in one namespace
arriving together would each see the other's pod missing from the pod list and both fit under
the quota. Admissions of one namespace therefore run one at a time (a lock per namespace), and
an admitted pod's GPU-equivalents stay reserved until the pod shows up in the list, or until
`ttl` seconds passed (the API server gave up on it: a later webhook refused it, or a dry run).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass


@dataclass
class _Reservation:
    name: str  # the pod's name ('' for a generateName pod: then only the ttl ends it)
    amount: float
    expires: float


class QuotaLedger:
    def __init__(self, ttl: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self.clock = clock
        self._locks: dict[str, asyncio.Lock] = {}
        self._reserved: dict[str, dict[str, _Reservation]] = {}

    @asynccontextmanager
    async def namespace(self, namespace: str) -> AsyncIterator[None]:
        """Hold the namespace's lock while its pods are counted and a reservation is made."""
        lock = self._locks.setdefault(namespace, asyncio.Lock())
        async with lock:
            yield

    def pending(self, namespace: str, listed: Iterable[str], key: str) -> float:
        """GPU-equivalents admitted but not yet among the `listed` pod names, other than the
        reservation `key` (a second call for the same pod replaces its own reservation)."""
        now = self.clock()
        seen = set(listed)
        held = self._reserved.get(namespace, {})
        for k in [k for k, r in held.items() if r.expires <= now or (r.name and r.name in seen)]:
            del held[k]
        if not held:
            self._reserved.pop(namespace, None)
        return sum(r.amount for k, r in held.items() if k != key)

    def reserve(self, namespace: str, key: str, name: str, amount: float) -> None:
        self._reserved.setdefault(namespace, {})[key] = _Reservation(
            name, amount, self.clock() + self.ttl
        )

    def total(self) -> float:
        """Everything reserved now (for the metrics)."""
        return sum(r.amount for held in self._reserved.values() for r in held.values())
