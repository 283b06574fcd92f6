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
  has not reported a device yet and its pod may be on the GPU: on each GPU its pod's allocation
  names, or, where it names none (time-slicing), once on its node, on the GPU where it leaves
  the least room (`gpu_rooms`);
- otherwise what the swap cannot take off: its resident memory less its idle, swappable kernels
  (the candidates of `pressure.plan_swaps`), plus what waits to resume there; within its slice;

Each server counts on top what the culler granted its kernels beyond its slice there and no swap
can free (`beyond`: present, stale, or busy), and the GPU what the smallest fresh device reading
shows beyond all servers' own memory (processes nobody reports, a kernel above its slice), where
the pods read the device (not on HAMi or MIG: `swapdesk.Seat.reading`). Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ..choice.admission import server_tag
from .pressure import KernelOnGpu, ReportedGpu
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
        asleep = gpu.asleep()
        holds = (
            max(gpu.resident_mib, 0.0)
            + max(gpu.waiting_mib, 0.0)
            + sum(k.hibernated_mib for k in asleep)
        )
        if holds <= 0 or any(k.hibernated_mib <= 0 for k in asleep):
            return cap
        return min(cap, holds * (1.0 + PRESENT_GROWTH))
    movable = sum(min(k.resident_mib, cap) for k in gpu.kernels if _movable(k))
    return min(cap, max(0.0, gpu.resident_mib - movable) + max(gpu.waiting_mib, 0.0))


def beyond(seat: Seat, gpu: ReportedGpu, granted: float) -> float:
    """Of what the culler `granted` a server's kernels on `gpu` beyond its slice, what no swap
    can free for a newcomer: all of it where its user is present (their kernels stay) or its
    report is stale (unknown is never free); where the user is away, what its kernels that no
    swap can take (busy, refused, of unknown use) hold beyond the slice, with what waits to
    resume (held_by counts up to the slice)."""
    if granted <= 0 or seat.present or not seat.fresh:
        return max(granted, 0.0)
    stays = sum(max(k.resident_mib, 0.0) for k in gpu.back() if not _movable(k))
    return min(granted, max(0.0, stays + max(gpu.waiting_mib, 0.0) - max(seat.cap_mib, 0.0)))


def _movable(k: KernelOnGpu) -> bool:
    """An idle kernel the swap may take off the GPU (pressure.plan_swaps' candidates)."""
    return (
        k.idle
        and not k.hibernated
        and not k.refused
        and k.resident_mib > 0
        and k.last_used is not None
    )


def gpu_rooms(
    seats: Iterable[tuple[str, Seat]],
    above: Callable[[Seat, ReportedGpu], float] | None = None,
    tag_key: str = "",
) -> list[GpuRoom]:
    """Each GPU a server of an over-committed pool reports (`(pool, seat)` pairs from
    swapdesk.seats_from), with what is held on it; sorted by pool and GPU.

    A server that names no GPU yet (no report, or none naming a device) counts its whole slice
    on each GPU its pod's allocation names; where the allocation names none (time-slicing's
    device plugin gives replicas, no UUID) its pod may be on any GPU of its node, and is on one:
    its slice counts once on the node (on each GPU, a 2-GPU node's one silent server took a
    slice on both, and the hub, summing the pool's room, waited for room that was there). It
    counts on the GPU where it leaves the least room, the largest such servers first: the hub
    lets a newcomer in where one GPU has room for it (hub/room.py), and no placement of one
    silent server leaves less room on the node's roomiest GPU than this one, so a GPU the answer
    shows with room has it wherever that server really is (unknown is never room; several are
    placed so one at a time, largest first, which is close to but not always the least room of
    all their placements). Where it is truly on the other GPU, that GPU's device reading shows
    what it holds there (counted on top, below), and the answer is the more cautious. Which
    GPU the newcomer itself lands on is the device plugin's choice (docs/culler.md,
    "Limits"). `above(seat, gpu)`: what a server's kernels back on a GPU hold beyond its slice
    by the culler's own grants (SwapDesk.above), counted on top of its word where no swap can
    free it (`beyond`). `tag_key`: the key of the servers' tags (`server_tag`), the hub's."""
    pairs = [(pool, s) for pool, s in seats if s.swaps]
    gpus: dict[str, _Tally] = {}
    for pool, s in pairs:
        for g in s.facts.gpus:
            size = s.size_mib or g.total_mib
            if size and g.uuid not in gpus:
                gpus[g.uuid] = _Tally(pool, size, tag_key=tag_key)
    roaming = []
    for _pool, s in pairs:
        named = {g.uuid: g for g in reversed(s.facts.gpus)}  # each GPU once (its first)
        for key, g in named.items():
            if key in gpus:
                gpus[key].count(s, g, extra=beyond(s, g, above(s, g)) if above else 0.0)
        if s.facts.gpus:
            continue
        on = sorted(k for k in gpus if s.may_be_on(k))
        if len(on) > 1 and s.placement is not None and s.placement.uuids is None:
            roaming.append((s, on))
        else:  # on the GPUs its allocation names
            for key in on:
                gpus[key].count(s, None)
    for s, on in sorted(roaming, key=lambda r: (-r[0].cap_mib, r[0].user, r[0].server)):
        _place(s, [gpus[k] for k in on])
    return [
        GpuRoom(t.pool, key, t.size_mib, t.held_with(0.0), len(t.people), tuple(t.tags))
        for key, t in sorted(gpus.items(), key=lambda kv: (kv[1].pool, kv[0]))
    ]


@dataclass
class _Tally:
    """The servers counted on one GPU, as gpu_rooms adds them up."""

    pool: str
    size_mib: float
    tag_key: str = ""  # `server_tag`'s key
    held_mib: float = 0.0
    resident_mib: float = 0.0  # of the device readings, what the servers' own word explains
    readings: list[float] = field(default_factory=list)
    people: set[str] = field(default_factory=set)
    tags: list[str] = field(default_factory=list)

    def count(
        self,
        seat: Seat,
        gpu: ReportedGpu | None,
        share: float | None = None,
        extra: float = 0.0,
    ) -> None:
        """Count `seat` here: by its report's `gpu` (and `extra` MiB it holds beyond its
        slice there), or (None) its whole slice, or `share`."""
        held = (held_by(seat, gpu) if share is None else share) + extra
        self.held_mib += held
        self.tags.append(server_tag(seat.user, seat.server, self.tag_key))
        if seat.present and seat.fresh:
            self.people.add(seat.user)
        if gpu is not None and seat.fresh:
            self.resident_mib += min(max(gpu.resident_mib, 0.0), seat.cap_mib) + extra
            if (read := seat.reading(gpu)) is not None:
                self.readings.append(read)
        else:  # stale or unreported: its slice, as the readings may show it
            self.resident_mib += max(seat.cap_mib, 0.0) if share is None else share

    def held_with(self, extra_mib: float) -> float:
        """Held, with `extra_mib` more of an unreported server's slice counted here: the
        servers' figures, and on top what the smallest fresh device reading shows beyond all
        their own memory (processes nobody reports, a kernel above its slice)."""
        held = self.held_mib + extra_mib
        if self.readings:
            held += max(0.0, min(self.readings) - self.resident_mib - extra_mib)
        return min(self.size_mib, held)

    def free_with(self, extra_mib: float) -> float:
        return max(0.0, self.size_mib - self.held_with(extra_mib))


def _place(seat: Seat, node: list[_Tally]) -> None:
    """Count an unreported `seat` whose pod may be on any of `node`'s GPUs where it leaves the
    least room on the roomiest of them (a pod of n devices: a share of its slice on each of n)."""
    n = min(max(seat.placement.gpus if seat.placement else 1, 1), len(node))
    share, left = max(seat.cap_mib, 0.0) / n, list(node)

    def least_room(t: _Tally) -> tuple[float, float]:
        """The node's most room with the share on `t` (the least first), then `t`'s room."""
        others = [o.free_with(0.0) for o in node if o is not t]
        return max([t.free_with(share), *others]), -t.free_with(0.0)

    for _ in range(n):
        there = min(left, key=least_room)  # ties: the first (GPUs sorted by key)
        there.count(seat, None, share)
        left.remove(there)
