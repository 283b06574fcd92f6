"""Which waiting resumes may restore now (pure): the culler's grants of room on one GPU.

A hibernated kernel's state is restored only into room on the physical GPU (serverext/room.py):
on current drivers a restore refused for want of room loses it for good (NVIDIA/cuda-checkpoint
#44). The servers on a GPU cannot see each other; the culler sees all of them, so on an
over-committed pool, and wherever HAMi-core virtualises the pods' NVML, the room is the
culler's to give. The rule, per GPU:

- on the GPU now: the larger of the servers' resident memory (each bounded by its slice, a
  server without a fresh report counted at its slice: pressure.resident_of) and the smallest
  device reading a fresh report gives (what NVML of the whole device shows, a kernel above its
  slice included; the smallest, since readings of different moments disagree around a swap
  and one server's word must not hold the room; the server itself restores only once its own
  reading shows the room, where NVML is not virtualised: serverext/room.py);
- room: the GPU's size less that, less the grants still in force (granted, not yet seen back),
  less a margin (the culler's `grant_margin_mib`) that is never granted: what the culler
  counts is up to a report interval old, and a co-tenant that grew since, or made its first
  allocation, holds memory no report has shown yet. Never more than the GPU leaves beyond
  the kernel: a kernel of the whole GPU still comes back onto an empty one;
- the waiting kernels, oldest wait first, are granted while they fit. The first that does not
  fit stops the walk (a large kernel is not overtaken for ever by small ones) unless it asks
  for more than its slice: such a claim waits for room without holding up the others;
- a server's claim on the GPUs together is its slice: what it holds and what its kernels that
  waited longer ask count against it (swapdesk.py gives each waiter what is left of its
  server's slice as `cap_mib`), and a kernel beyond it is served only after every kernel
  within its server's slice, with the room they leave (it may still come back: time-slicing
  enforces nothing, and only a grant restores it). Four kernels of one server waiting a slice
  each do not take the room of a neighbour who waited after the first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

#: how long a grant holds its room (the server restores at once; its next report shows it)
GRANT_SECONDS = 30.0

Key = tuple[str, str, str]  # (user, server, kernel id)


@dataclass(frozen=True)
class Waiter:
    """A kernel of `user`/`server` waiting to resume on the GPU."""

    user: str
    server: str
    kernel_id: str
    mib: float
    since: float
    cap_mib: float  # its server's slice

    @property
    def key(self) -> Key:
        return (self.user, self.server, self.kernel_id)


def plan_grants(
    size_mib: float,
    on_gpu_mib: float,
    waiters: Iterable[Waiter],
    granted: Mapping[Key, float],
    margin_mib: float = 0.0,
) -> list[Key]:
    """The waiting kernels that may restore now: grants in force first, then new ones in the
    order of their wait, as the module says; `margin_mib` of the GPU is left ungranted."""
    waiters = sorted(waiters, key=lambda w: (w.since, w.user, w.server, w.kernel_id))
    live = {w.key for w in waiters}
    room = size_mib - on_gpu_mib - sum(m for k, m in granted.items() if k in live)
    out = [w.key for w in waiters if w.key in granted]
    new = [w for w in waiters if w.key not in granted]

    def within(w: Waiter) -> bool:
        return min(max(w.mib, 0.0), size_mib) <= w.cap_mib

    # those within their server's slice first, in the order of their wait; then the others
    for w in [w for w in new if within(w)] + [w for w in new if not within(w)]:
        need = min(max(w.mib, 0.0), size_mib)
        if need + min(max(margin_mib, 0.0), size_mib - need) <= room:
            out.append(w.key)
            room -= need
        elif within(w):
            break  # first come, first served
    return out
