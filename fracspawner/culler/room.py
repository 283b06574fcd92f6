"""Room for a new server on over-committed GPUs, as present users hold them (issue 36, item 5).

Over-commit (catalog `overcommit: 2`) puts twice as many slices on a GPU as its memory holds,
safe while the culler can swap idle kernels out (pressure.py). A present person may run a cell
at any moment, so their kernels are not "idle memory" to count on: in a lab where everyone is
present, the 5th..8th new servers of a 4-slot GPU over-committed twice met CUDA out-of-memory in
their cells with no word why (issue 36, bug 4). The hub's admission asks this view before a new
server's pod is made (hub/room.py): per GPU, what cannot be made free for a newcomer.

Per GPU (node/UUID as swapdesk binds reports to pods), each server counts:

- where its user is present (at a tab of it: presence.py) and its pool's backend limits
  memory to the slice (HAMi, MIG, ...: `Seat.enforced`), what its kernels physically hold on
  the GPU or bring back to it (waiting to resume or not: a hibernated kernel at what its report
  says it brings back, `hibernated_gpu_memory_mib`) and half again for them to grow into
  (`PRESENT_GROWTH`), within its slice (the issue's words: a newcomer waits where it "would
  exceed the physical memory held by present users' kernels"); its whole slice while its
  kernels hold nothing there yet (a first cell allocates at any moment: bug 4's lab) or a
  hibernated one's size is not reported (unknown is never free);
- its whole slice where its user is present on a pool that does not limit memory
  (time-slicing: a first allocation or growth may exceed the slice, so the rest of it is no
  newcomer's room; replayed, counting what those kernels hold there met more CUDA
  out-of-memory errors in present users' cells, benchmarks/bench_culler.py);
- its whole slice where its report is stale or missing (unknown is never free), or where it
  has not reported a device yet and its pod may be on the GPU;
- otherwise what the swap cannot take off: its resident memory less its idle, swappable kernels
  (the candidates of `pressure.plan_swaps`), plus what waits to resume there; within its slice;

and the GPU counts on top what the smallest fresh device reading shows beyond all servers' own
memory (processes nobody reports, a kernel above its slice). Pure.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..choice.admission import server_tag
from .pressure import ReportedGpu
from .swapdesk import Seat

__all__ = ["PRESENT_GROWTH", "GpuRoom", "gpu_rooms", "held_by", "server_tag"]

#: how much more than they hold a present user's kernels may grow into before a newcomer gets
#: the GPU (a share of what they hold): caches and bigger batches grow a working kernel, and a
#: cell meeting CUDA out-of-memory because a newcomer took that room is a loss
PRESENT_GROWTH = 0.5


@dataclass(frozen=True)
class GpuRoom:
    """One GPU of an over-committed pool: what present users and busy kernels hold on it."""

    pool: str
    gpu: str  # node/uuid (swapdesk.gpu_key)
    size_mib: float
    held_mib: float
    present: int  # people present at a server on it
    servers: tuple[str, ...]  # `server_tag` of each server counted on it

    @property
    def free_mib(self) -> float:
        return max(0.0, self.size_mib - self.held_mib)

    def to_json(self) -> dict:
        return {
            "pool": self.pool,
            "gpu": self.gpu,
            "size_mib": round(self.size_mib, 1),
            "held_mib": round(self.held_mib, 1),
            "free_mib": round(self.free_mib, 1),
            "present": self.present,
            "servers": list(self.servers),
        }


def held_by(seat: Seat, gpu: ReportedGpu | None) -> float:
    """What one server holds on a GPU that no swap can free for a newcomer (MiB)."""
    cap = max(seat.cap_mib, 0.0)
    if gpu is None or not seat.fresh:
        return cap
    if seat.present and not seat.enforced:
        return cap  # no limit at the slice: a first allocation or growth may exceed it
    if seat.present:
        # what its kernels physically hold, or bring back from hibernation (waiting to resume
        # or not), and half again to grow into (PRESENT_GROWTH), within its slice; its whole
        # slice while they hold nothing yet (the first cell allocates: bug 4) or a hibernated
        # one's size is not reported (unknown is never free)
        waits = {w.kernel_id for w in gpu.waiting}
        asleep = [k for k in gpu.kernels if k.hibernated and k.kernel_id not in waits]
        holds = (
            max(gpu.resident_mib, 0.0)
            + max(gpu.waiting_mib, 0.0)
            + sum(k.hibernated_mib for k in asleep)
        )
        if holds <= 0 or any(k.hibernated_mib <= 0 for k in asleep):
            return cap
        return min(cap, holds * (1.0 + PRESENT_GROWTH))
    movable = sum(
        min(k.resident_mib, cap)
        for k in gpu.kernels
        if k.idle
        and not k.hibernated
        and not k.refused
        and k.resident_mib > 0
        and k.last_used is not None
    )
    return min(cap, max(0.0, gpu.resident_mib - movable) + max(gpu.waiting_mib, 0.0))


def gpu_rooms(seats: Iterable[tuple[str, Seat]]) -> list[GpuRoom]:
    """Each GPU a server of an over-committed pool reports (`(pool, seat)` pairs from
    swapdesk.seats_from), with what is held on it; sorted by pool and GPU."""
    pairs = [(pool, s) for pool, s in seats if s.swaps]
    gpus: dict[str, tuple[str, float]] = {}
    for pool, s in pairs:
        for g in s.facts.gpus:
            size = s.size_mib or g.total_mib
            if size:
                gpus.setdefault(g.uuid, (pool, size))
    rooms = []
    for key, (pool, size) in sorted(gpus.items(), key=lambda kv: (kv[1][0], kv[0])):
        held = resident = 0.0
        readings = []
        people: set[str] = set()
        tags = []
        for _pool, s in pairs:
            mine = next((g for g in s.facts.gpus if g.uuid == key), None)
            if mine is None and not (not s.facts.gpus and s.may_be_on(key)):
                continue
            held += held_by(s, mine)
            tags.append(server_tag(s.user, s.server))
            if s.present and s.fresh:
                people.add(s.user)
            if mine is not None and s.fresh:
                resident += min(max(mine.resident_mib, 0.0), s.cap_mib)
                if mine.used_mib is not None:
                    readings.append(mine.used_mib)
            else:  # stale or unreported: its slice, as the readings may show it
                resident += max(s.cap_mib, 0.0)
        # memory the device shows and no server's word accounts for (the smallest reading)
        unreported = max(0.0, min(readings) - resident) if readings else 0.0
        rooms.append(
            GpuRoom(pool, key, size, min(size, held + unreported), len(people), tuple(tags))
        )
    return rooms
