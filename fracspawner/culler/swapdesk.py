"""What the culler answers a server's report on an over-committed GPU: which of its idle kernels
to swap out now, and how soon to report again while the GPU is under pressure.

The decision is pressure.plan_swaps over every server whose fresh report names the same
physical GPU; this module keeps what was asked (so one pressure asks once, and again only if a
kernel is still resident after pressure.ASK_AGAIN_AFTER) and builds the answer. The answer goes
back in the HTTP response to the server's own report (receiver.py): the culler never calls
into a user server, and it names only that server's own kernels, by the ids its report gave.

It also gives the room on the GPU to the kernels waiting to resume (grants.py): `swap.resume:
[{"kernel_id", "gpu_memory_mib"}]` for those that may restore now, `swap.wait: [{"kernel_id",
"reason"}]` for the others, whose cells are told they wait. A server restores nothing without
room (serverext/room.py): on an over-committed pool or under HAMi-core, not without a grant.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..backends import get_backend
from ..model.slices import slice_memory_mib
from .grants import GRANT_SECONDS, Key, Waiter, plan_grants
from .placement import Placement
from .policy import slice_memory_cap
from .pressure import (
    ASK_AGAIN_AFTER,
    CHECKPOINT_MIB_PER_S,
    RESTORE_MIB_PER_S,
    KernelOnGpu,
    Pressure,
    ReportedGpu,
    ServerOnGpu,
    SwapFacts,
    copy_seconds,
    plan_swaps,
    resident_of,
)
from .reports import this_incarnation

#: how long before the desk first saw a kernel waiting its server may say the wait began (a
#: report interval: the agent reports a wait at once, and reports may be a minute apart)
CLAIM_SLACK = 60.0
FORGET_WAIT_SECONDS = 3600.0  # a kernel not seen waiting this long: its wait is over

if TYPE_CHECKING:
    from ..model.catalog import Catalog, Pool
    from .decide import ServerFacts
    from .reports import ServerReport


#: how soon a server whose waiting kernel the culler could not yet decide reports again (s)
UNSURE_REPORT_IN = 3.0


@dataclass(frozen=True)
class Seat:
    """One server as the culler knows it: the hub's record (its pool's size and over-commit,
    its slice's memory) and its latest report's facts."""

    user: str
    server: str
    facts: SwapFacts
    fresh: bool  # its latest report is within max_staleness
    cap_mib: float  # its slice's memory (the hub's record; unknown: the pool's largest slice)
    size_mib: float | None  # the pool's GPU model's memory (None: take the report's)
    margin_mib: float
    present: bool = False
    swaps: bool = True  # its pool over-commits: its idle kernels may be swapped out
    # where its pod is (the culler's pod watch: placement.py); None: not known
    placement: Placement | None = None
    # its pool's backend hard-limits GPU memory to the slice (Backend.enforced): its kernels
    # can never hold more than its slice, and its pod's NVML is not the device's (`reading`)
    enforced: bool = False
    pool: str | None = None  # its pool's name (None: not known)

    def reading(self, gpu: ReportedGpu) -> float | None:
        """Its pod's NVML reading of what `gpu` holds, where that is the device's: a floor of
        the GPU's memory (processes nobody reports, kernels above their slice). None where it
        is stale or not the device's: on a pool that limits memory to the slice the pod reads
        its own view (a MIG instance's; HAMi-core's count of what its processes allocated,
        which keeps a hibernated kernel's memory: cuda-checkpoint frees it through no hook of
        HAMi-core's, Project-HAMi/HAMi-core src/nvml/hook.c). Where it is the device's, the
        server also checks its own reading before it restores (serverext/room.py)."""
        if not self.fresh or self.enforced or gpu.used_mib is None:
            return None
        return gpu.used_mib

    def may_be_on(self, key: str) -> bool:
        """Whether its pod may hold GPU `key` (node/uuid), by its placement alone."""
        p = self.placement
        if p is None or p.node is None or not key.startswith(p.node + "/"):
            return False
        return p.uuids is None or key[len(p.node) + 1 :] in p.uuids


def gpu_key(node: str | None, uuid: str) -> str:
    """A GPU as the culler groups servers: its node and NVML UUID (the UUID alone where the
    node is not known)."""
    return f"{node}/{uuid}" if node else uuid


def bind(facts: SwapFacts, placement: Placement | None, cap_mib: float, gpus: int) -> SwapFacts:
    """A report's devices as far as its pod allows (placement.py): only those its allocation
    names (where it names them), at most as many as it may see (those where it claims the most
    first), each keyed by its node and UUID, and its claim on all of them together (resident
    and waiting) bounded by its slice."""
    kept = list(facts.gpus)
    if placement is not None and placement.uuids is not None:
        kept = [g for g in kept if g.uuid in placement.uuids]
    kept.sort(key=lambda g: -(g.resident_mib + g.waiting_mib))
    kept = kept[: placement.gpus if placement is not None else gpus]
    node = placement.node if placement is not None else None
    budget, out = max(cap_mib, 0.0), []
    for g in kept:
        resident = min(max(g.resident_mib, 0.0), budget)
        waiting = min(max(g.waiting_mib, 0.0), budget - resident)
        budget -= resident + waiting
        out.append(
            replace(g, uuid=gpu_key(node, g.uuid), resident_mib=resident, waiting_mib=waiting)
        )
    return SwapFacts(tuple(out))


class SwapDesk:
    """Pending asks and the answers to reports."""

    def under_pressure(self) -> int:
        """GPUs whose latest look found them under pressure."""
        return sum(p.under_pressure for p in self.last.values())

    def __init__(
        self,
        report_in: float = 20.0,
        ask_again_after: float = ASK_AGAIN_AFTER,
        grant_margin_mib: float = 0.0,
    ) -> None:
        self.report_in = report_in
        # MiB of each GPU never granted to a waiting resume (grants.py; Culler.grant_margin_mib)
        self.grant_margin_mib = grant_margin_mib
        self.ask_again_after = ask_again_after
        # (user, server, kernel id) -> (MiB it held, when it was asked)
        self.asked: dict[tuple[str, str, str], tuple[float, float]] = {}
        # swaps done lately: (user, server, kernel id) -> (GPU uuid, MiB it freed, when seen
        # done). Other servers' device readings may predate them for a report interval: the
        # reading floor must not count that memory again (one swap per need, not two)
        self.freed: dict[tuple[str, str, str], tuple[str, float, float]] = {}
        self._asked_on: dict[tuple[str, str, str], str] = {}  # kernel -> GPU uuid asked on
        self.last: dict[str, Pressure] = {}  # GPU uuid -> its latest pressure (metrics)
        self.granted: dict[Key, tuple[float, float]] = {}  # grants in force: (MiB, when)
        # when the desk first and last saw each kernel waiting (`_since`): a report's own
        # `since` is the server's word, and the line is first come, first served
        self._seen_waiting: dict[Key, tuple[float, float]] = {}
        # kernels granted beyond their server's slice: (GPU uuid, MiB above the slice), while
        # their server's report shows them waiting or back. A report's word counts at most its
        # slice (bind), yet such a kernel holds more on the device, and where HAMi-core
        # virtualises NVML no reading shows it: uncounted, it took the grant margin and the
        # next restore met CUDA out of memory (#44: lost; the culler benchmark, breaks)
        self.beyond: dict[Key, tuple[str, float]] = {}
        # the last answer's server, its time and the MiB its GPUs have free by the culler's
        # count, where its pod cannot read that itself (HAMi-core's NVML is the slice's): the
        # meter says it where less than the slice has left (`free_told`)
        self._free: tuple[str, str, float, float] | None = None
        # the pool of each server with an ask or a grant in force, when it was made (`_judged`)
        self._pools: dict[tuple[str, str], str | None] = {}

    def _judged(self, seats: list[Seat]) -> set[tuple[str, str]]:
        """The servers whose asks and grants `seats` can end: each seated one, and each of a
        pool the seats cover that has no seat (stopped). A report's seats are the over-committed
        pools' and its own pool's only: another pool's server is not among them, which says
        nothing of its kernels, and its grants stay in force (forgotten, their room was granted
        again: two restores into room for one, NVIDIA/cuda-checkpoint#44)."""
        pools = {s.pool for s in seats}
        judged = {(s.user, s.server) for s in seats}
        judged.update(key for key, pool in self._pools.items() if pool in pools)
        return judged

    def _still_asked(
        self, seats: list[Seat], judged: set[tuple[str, str]], now: float
    ) -> dict[tuple[str, str, str], float]:
        """Asks whose kernel the latest report still shows resident and idle, not refused
        (a kernel that got busy or was refused will not go: the next one is asked instead), or
        on its way out (its checkpoint under way: a minute for 80 GiB), and not too old; a
        server not `judged` keeps its asks until they are too old. An ask lasts
        `ask_again_after`, and while its kernel's copy is under way as long as that copy may
        take (`copy_seconds`): dropped meanwhile, the memory still on the GPU read as a new
        pressure and another kernel was asked out for the same need."""
        resident = _kernels(
            seats, lambda k: k.resident_mib > 0 and k.idle and not k.hibernated and not k.refused
        )
        copying = _kernels(seats, lambda k: k.copying_out)
        hibernated = _kernels(seats, lambda k: k.hibernated and not k.copying_out)
        for key, (mib, at) in list(self.asked.items()):
            gone = key[:2] in judged and key not in resident and key not in copying
            last = self.ask_again_after
            if key in copying:
                last += copy_seconds(mib, CHECKPOINT_MIB_PER_S)
            if gone or now - at > last:
                del self.asked[key]
                uuid = self._asked_on.pop(key, None)
                if key in hibernated and uuid is not None:
                    self.freed[key] = (uuid, mib, now)
        for key, (_uuid, _mib, at) in list(self.freed.items()):
            if now - at > self.report_in:
                del self.freed[key]
        return {key: mib for key, (mib, _at) in self.asked.items()}

    def _still_beyond(self, seats: list[Seat], judged: set[tuple[str, str]]) -> None:
        """Forget kernels granted beyond their slice that their `judged` server's report no
        longer shows waiting or resident on the GPU they were granted (hibernated, ended,
        gone); a stale report keeps them (unknown is never free)."""
        held = set()
        for s in seats:
            for g in s.facts.gpus:
                for k in g.kernels if not s.fresh else g.back():
                    held.add((s.user, s.server, k.kernel_id, g.uuid))
                held.update((s.user, s.server, w.kernel_id, g.uuid) for w in g.waiting)
        for key, (uuid, _mib) in list(self.beyond.items()):
            if key[:2] in judged and (*key, uuid) not in held:
                del self.beyond[key]

    def above(self, seat: Seat, gpu: ReportedGpu) -> float:
        """What `seat`'s kernels back on `gpu` hold beyond its slice, as far as the culler
        granted that (`beyond`): never more on a report's word alone (issue 36, item 6).
        Where its report is stale, all it was granted there and has not been seen to give
        back (`_still_beyond` keeps those): unknown is never free."""
        if not seat.fresh:
            return self._beyond_on(seat, gpu.uuid)
        back = gpu.back()
        granted = self._beyond_on(seat, gpu.uuid, {k.kernel_id for k in back})
        return min(granted, max(0.0, sum(k.resident_mib for k in back) - seat.cap_mib))

    def _beyond_on(self, seat: Seat, uuid: str, ids: set[str] | None = None) -> float:
        """MiB granted beyond `seat`'s slice on GPU `uuid` (to its kernels `ids`, or any)."""
        return sum(
            mib
            for (u, sv, kid), (at, mib) in self.beyond.items()
            if (u, sv) == (seat.user, seat.server) and at == uuid and (ids is None or kid in ids)
        )

    def _on_gpu(self, seat: Seat, gpu: ReportedGpu) -> ServerOnGpu:
        """`seat` on `gpu` as pressure and grants count it: its word bounded by its slice,
        and on top what the culler granted it beyond its slice that is back there (`above`)."""
        above = self.above(seat, gpu)
        if not seat.fresh:  # its slice, and what it was granted beyond it (unknown: held)
            cap = seat.cap_mib + above
            return ServerOnGpu(seat.user, seat.server, cap, None, present=seat.present)
        # `above` > 0 only where its kernels back there hold more than its slice: the slice
        # and what was granted beyond it, at most
        resident = max(gpu.resident_mib, seat.cap_mib + above) if above > 0 else gpu.resident_mib
        return ServerOnGpu(
            user=seat.user,
            server=seat.server,
            cap_mib=seat.cap_mib + above,
            resident_mib=resident,
            waiting_mib=gpu.waiting_mib,
            present=seat.present,
            kernels=gpu.kernels,
        )

    def _freed_on(self, uuid: str) -> float:
        """MiB that swaps on GPU `uuid` freed within the last report interval."""
        return sum(mib for (u, mib, _at) in self.freed.values() if u == uuid)

    def answer(self, user: str, server: str, seats: Iterable[Seat], now: float) -> dict | None:
        """The answer to `user`/`server`'s report: {"swap": {"hibernate": [...], "report_in":
        s}} when it has kernels to swap out or its GPU is under pressure; None otherwise."""
        seats = list(seats)
        self._free = None
        me = next((s for s in seats if (s.user, s.server) == (user, server)), None)
        if me is None or not me.fresh:
            return None
        judged = self._judged(seats)
        asked = self._still_asked(seats, judged, now)
        granted = self._still_granted(seats, judged, now)
        self._still_beyond(seats, judged)
        live = {key[:2] for key in (*self.asked, *self.granted, *self.beyond)}
        self._pools = {key: pool for key, pool in self._pools.items() if key in live}
        self._pools[(user, server)] = me.pool  # its asks and grants, made below
        self._seen_waiting = {
            key: seen
            for key, seen in self._seen_waiting.items()
            if now - seen[1] <= FORGET_WAIT_SECONDS
        }
        orders: list[dict] = []
        resume: list[dict] = []
        wait: list[dict] = []
        pressed = unsure = False
        free: float | None = None
        for gpu in me.facts.gpus:
            on_it = []
            readings = []
            for s in seats:
                if not s.facts.gpus and s.may_be_on(gpu.uuid):
                    # no devices reported (no report yet, none readable): its whole slice
                    # counts on each GPU its pod may be on; unknown memory is never free
                    on_it.append(ServerOnGpu(s.user, s.server, s.cap_mib, None))
                for g in s.facts.gpus:
                    if g.uuid != gpu.uuid:
                        continue
                    if (read := s.reading(g)) is not None:
                        readings.append(read)
                    on_it.append(self._on_gpu(s, g))
            size = me.size_mib if me.size_mib else gpu.total_mib
            if not size:
                continue
            # the grant margin on this GPU (0 where the pod's own reading checks the room), and
            # on every pool the slices of present people whose first cell has not allocated
            # yet: a pod's own reading keeps a restore out of a full GPU, but not out of the
            # room such a cell takes a moment later (CUDA out of memory in that cell)
            margin = grant_margin(self.grant_margin_mib, size, me.enforced)
            unborn = first_allocations(seats, gpu.uuid, (user, server))
            if self._grant(
                user, server, gpu.uuid, size, margin, unborn, seats, on_it, granted, now,
                resume, wait,
            ):  # fmt: skip
                unsure = True
            if not me.swaps:
                continue
            # the smallest fresh device reading: what the whole GPU holds (kernels above their
            # slice, processes nobody reports), never one server's inflated word
            reading = min(readings) if readings else None
            if reading is not None:  # a reading older than a swap just done still holds it
                reading = max(0.0, reading - self._freed_on(gpu.uuid))
            # a resume waits: it is granted only with the grant margin free, so pressure keeps
            # that much free too (a swap margin set below it would leave the kernel waiting)
            keep = me.margin_mib
            if any(s.waiting_mib > 0 for s in on_it):
                keep = max(keep, margin + unborn)
            pressure = plan_swaps(gpu.uuid, size, on_it, keep, asked, reading)
            self.last[gpu.uuid] = pressure
            if me.enforced:  # its pod reads its slice only: what the GPU has free, as counted
                free = (free or 0.0) + max(0.0, size - pressure.resident_mib)
            pressed = pressed or pressure.under_pressure
            for swap in pressure.swaps:
                if (swap.user, swap.server) != (user, server):
                    continue  # told in the answer to its own server's report
                self.asked[(user, server, swap.kernel_id)] = (swap.mib, now)
                self._asked_on[(user, server, swap.kernel_id)] = gpu.uuid
                orders.append({"kernel_id": swap.kernel_id, "reason": swap.reason})
        # only GPUs some server names now (uuids come from reports: never kept without bound)
        named = {g.uuid for s in seats for g in s.facts.gpus}
        for uuid in [u for u in self.last if u not in named]:
            del self.last[uuid]
        self._free = None if free is None else (user, server, now, free)
        if not orders and not pressed and not resume and not wait and not unsure:
            return None
        body: dict = {
            "report_in": min(self.report_in, UNSURE_REPORT_IN) if unsure else self.report_in
        }
        if orders:
            body["hibernate"] = orders
        if resume:
            body["resume"] = resume
        if wait:
            body["wait"] = wait
        return {"swap": body}

    def free_told(self, user: str, server: str, now: float) -> float | None:
        """MiB free on `user`/`server`'s GPUs by the culler's count (servers' words within
        their slices, unknown ones at their whole slice), as its answer at `now` found them,
        where its pod's NVML is the slice's (HAMi-core) and cannot show it; None elsewhere."""
        if self._free is None or self._free[:3] != (user, server, now):
            return None
        return self._free[3]

    def _since(self, key: Key, claimed: float, now: float) -> float:
        """When `key` began to wait, for its place in line: its server's word, but no earlier
        than `CLAIM_SLACK` before the desk first saw it waiting. A server that claimed a wait
        of hours went ahead of every other; its agent reports a wait as it begins."""
        first, last = self._seen_waiting.get(key, (now, now))
        if now - last > FORGET_WAIT_SECONDS:  # not seen waiting for that long: a new wait
            first = now
        self._seen_waiting[key] = (first, now)
        return max(claimed, first - CLAIM_SLACK)

    def _still_granted(
        self, seats: list[Seat], judged: set[tuple[str, str]], now: float
    ) -> dict[Key, float]:
        """Grants whose kernel still waits by its server's fresh report, and not too old; a
        server not `judged` keeps its grants until they are too old. A grant lasts
        GRANT_SECONDS, and while its server reports the restore under way as long as that may
        take (`copy_seconds`: a whole H200's restore takes 26-42 s): lapsed meanwhile, the
        kernel was planned again as a new wait, found its own memory there, and its cell was
        told the GPU is full while it was coming back."""
        waiting = {
            (s.user, s.server, w.kernel_id)
            for s in seats
            if s.fresh
            for g in s.facts.gpus
            for w in g.waiting
        }
        restoring = _kernels([s for s in seats if s.fresh], lambda k: k.copying_in)
        for key, (mib, at) in list(self.granted.items()):
            last = GRANT_SECONDS
            if key in restoring:
                last += copy_seconds(mib, RESTORE_MIB_PER_S)
            if (key[:2] in judged and key not in waiting) or now - at > last:
                del self.granted[key]
        return {key: mib for key, (mib, _at) in self.granted.items()}

    def _grant(
        self,
        user: str,
        server: str,
        uuid: str,
        size: float,
        margin: float,
        unborn: float,
        seats: list[Seat],
        on_it: list[ServerOnGpu],
        granted: dict[Key, float],
        now: float,
        resume: list[dict],
        wait: list[dict],
    ) -> bool:
        """Room on GPU `uuid` for `user`/`server`'s waiting kernels (grants.py); True when the
        culler is not sure yet (its sources disagree): the server should report again soon.
        `margin`: MiB of the GPU never granted (grant_margin); `unborn`: MiB the first
        allocations of present people's servers may take (first_allocations), never granted.
        The pods' device readings (`Seat.reading`, none on a pool whose pods read only their
        own slice) may show room the reports do not yet."""
        waiters, readings = [], []
        for s in seats:
            if not s.fresh:
                continue
            left = slice_left(s)
            for g in s.facts.gpus:
                if g.uuid != uuid:
                    continue
                if (read := s.reading(g)) is not None:
                    readings.append(read)
                waiters += [
                    Waiter(s.user, s.server, w.kernel_id, w.mib,
                           self._since((s.user, s.server, w.kernel_id), w.since, now),
                           left[w.kernel_id])
                    for w in g.waiting
                ]  # fmt: skip
        mine = [w for w in waiters if (w.user, w.server) == (user, server)]
        if not mine:
            return False
        on_gpu = max(resident_of(on_it), min(readings) if readings else 0.0) + unborn
        go = set(plan_grants(size, on_gpu, waiters, granted, margin))
        # by the readings alone there would be room: a report from before a swap still counts
        # its kernel resident. Neither grant nor "wait" (the cell would be told the GPU is full
        # when it is not): its server reports again soon. Never by a pod's view of its own
        # slice (no readings there): one pod's memory, never the device's, it always showed
        # room, and the kernel was never told it waits (replayed on HAMi: a report every 3 s)
        maybe = (
            set(plan_grants(size, min(readings) + unborn, waiters, granted, margin))
            if readings
            else go
        )
        unsure = False
        # who holds the GPU: people present at a server with memory on it (their kernels are
        # never swapped out: pressure.py), as the hub's admission words it (hub/room.py)
        present = {
            s.user
            for s in seats
            if s.fresh and s.present and (s.user, s.server) != (user, server)
            for g in s.facts.gpus
            if g.uuid == uuid and g.resident_mib > 0
        }
        line = sorted(
            (w for w in waiters if w.key not in go),
            key=lambda w: (w.since, w.user, w.server, w.kernel_id),
        )
        for w in mine:
            if w.key in go:
                mib = min(max(w.mib, 0.0), size)
                self.granted.setdefault(w.key, (mib, now))
                if mib > w.cap_mib:
                    self.beyond[w.key] = (uuid, mib - max(w.cap_mib, 0.0))
                resume.append({"kernel_id": w.kernel_id, "gpu_memory_mib": mib})
            elif w.key in maybe:
                unsure = True
            else:
                ahead = {(o.user, o.server) for o in line[: line.index(w)]} - {(user, server)}
                wait.append(
                    {"kernel_id": w.kernel_id, "reason": wait_reason(len(present), len(ahead))}
                )
        return unsure


def _kernels(
    seats: Iterable[Seat], which: Callable[[KernelOnGpu], bool]
) -> dict[tuple[str, str, str], float]:
    """(user, server, kernel id) -> MiB on the GPU of the seats' kernels `which` picks."""
    return {
        (s.user, s.server, k.kernel_id): k.resident_mib
        for s in seats
        for g in s.facts.gpus
        for k in g.kernels
        if which(k)
    }


def grant_margin(margin_mib: float, size_mib: float, enforced: bool) -> float:
    """The grant margin on a GPU of `size_mib`: at most 1/16 of it (960 MiB of a T4's 15,360,
    4,096 of an H100's 81,559 unchanged), so a small GPU's slices are not held up by a margin
    as large as one of them; 0 where the pool does not limit memory to the slice (`enforced`
    False: time-slicing, MPS): there the pod's NVML sees the whole GPU and the server restores
    on a grant only once its own reading, a moment old, shows the room (serverext/room.py),
    growth and first allocations since the reports included. Under HAMi-core the pod's NVML
    is its slice's: the grant is the only check, and the culler's view is up to a report
    interval old."""
    if not enforced:
        return 0.0
    return max(0.0, min(margin_mib, size_mib / 16))


def first_allocations(seats: Iterable[Seat], uuid: str, besides: tuple[str, str]) -> float:
    """MiB on GPU `uuid` that present people's servers may take at their first cell: the
    slice of each (other than `besides`, the one asking) whose fresh report shows nothing
    resident there, less what its kernels bring back from hibernation (those restore through a
    grant of their own). The hub's admission counts such a server at its whole slice too
    (room.held_by); where the grant is the only check before a restore (HAMi), a grant into
    that room met the first cell's allocation: the capacity replay's research mix lost a
    kernel's GPU state so (NVIDIA/cuda-checkpoint#44). Where the pod's own reading checks the
    room too (time-slicing) the restore is safe, but the first cell that comes after it meets
    CUDA out of memory: kept from grants there as well."""
    total = 0.0
    for s in seats:
        if not (s.fresh and s.present) or (s.user, s.server) == besides:
            continue
        held = sum(max(g.resident_mib, 0.0) for g in s.facts.gpus)  # its slice is for all
        for g in s.facts.gpus:
            if g.uuid != uuid or g.resident_mib > 0:
                continue
            asleep = sum(max(k.hibernated_mib, 0.0) for k in g.asleep())
            total += max(0.0, s.cap_mib - held - max(g.waiting_mib, 0.0) - asleep)
    return total


def _people(n: int) -> str:
    return "1 person" if n == 1 else f"{n} people"


def wait_reason(present: int, ahead: int) -> str:
    """Why a resume waits, in the hub's words for a new server (hub/room.py): who holds the
    GPU (people present: nothing of theirs is swapped out) and the place in line."""
    if ahead:
        place = f"; {_people(ahead)} {'is' if ahead == 1 else 'are'} ahead of you"
    else:
        place = "; you are next" if present else ""
    words = f"the GPU is in use by {_people(present)} now" if present else "the GPU is full"
    return words + place


def slice_left(seat: Seat) -> dict[str, float]:
    """What is left of a server's slice for each of its waiting kernels (kernel id -> MiB),
    in the order of their wait: its slice less what it holds on all its GPUs, less what its
    kernels that waited longer ask (grants.py: one server's claim is its slice)."""
    left = max(0.0, seat.cap_mib - sum(max(g.resident_mib, 0.0) for g in seat.facts.gpus))
    out = {}
    waiting = sorted(
        (w for g in seat.facts.gpus for w in g.waiting), key=lambda w: (w.since, w.kernel_id)
    )
    for w in waiting:
        out[w.kernel_id] = left
        left = max(0.0, left - max(w.mib, 0.0))
    return out


def seats_from(
    reports: Iterable[tuple[str, str, ServerReport]],
    known: Mapping[tuple[str, str], ServerFacts],
    catalog: Catalog,
    now: float,
    max_staleness: float,
    margin_mib: float | None = None,
    also_pool: str | None = None,
    placement: Callable[[str, str], Placement | None] | None = None,
) -> list[Seat]:
    """The servers on over-committed pools, each from the hub's record (pool, slice) and its
    latest report. A server the hub has not listed, or in a pool that does not over-commit,
    takes no part, unless it is `also_pool` (a waiting resume there needs the culler's grant).
    A server the hub lists that has not reported counts too (its whole slice, where its pod's
    placement says which GPUs it may be on), as does one whose report is from before its
    pod or its start by the hub's record (a restarted server's previous incarnation's:
    reports.this_incarnation). Each report is bound to its pod (`bind`):
    `placement(user, server)` is where the pod watch has it (None: not known). `margin_mib`
    None: each pool's `default_margin_mib`."""
    seats = []
    latest = {(user, server): report for user, server, report in reports}
    for (user, server), facts in known.items():
        if not facts.pool or facts.pool not in catalog.pools or facts.gpu_slice is None:
            continue
        pool = catalog.pools[facts.pool]
        if pool.overcommit <= 1 and facts.pool != also_pool:
            continue
        largest = largest_slice_mib(pool)
        # a slice the catalog cannot size counts as the pool's largest: never as nothing
        cap = slice_memory_cap(catalog, facts.pool, facts.gpu_slice) or largest
        margin = default_margin_mib(pool) if margin_mib is None else margin_mib
        size = float(pool.gpu.device_memory_mib)
        where = placement(user, server) if placement is not None else None
        # the hub's record is up to a cycle old: a pod made since is a new incarnation
        made = where.created if where is not None else None
        report = this_incarnation(latest.get((user, server)), facts.started, made)
        gpus = max(1, math.ceil(cap / size)) if size > 0 else 1
        seats.append(
            Seat(
                user=user,
                server=server,
                facts=bind(report.swap, where, cap, gpus) if report else SwapFacts(),
                fresh=report is not None and now - report.received_at <= max_staleness,
                cap_mib=cap,
                size_mib=size,
                margin_mib=min(margin, pool.gpu.device_memory_mib),
                present=bool(report and report.present),
                swaps=pool.overcommit > 1,
                placement=where,
                enforced=pool_enforced(pool),
                pool=facts.pool,
            )
        )
    return seats


def largest_slice_mib(pool: Pool) -> float:
    """The memory of `pool`'s largest offer (MiB; 0 for a pool that offers nothing)."""
    return float(max((slice_memory_mib(o, pool.gpu) for o in pool.offers), default=0))


def default_margin_mib(pool: Pool) -> float:
    """GPU memory kept free on each GPU of an over-committed `pool` by default: its largest
    slice (one more of it can start, or come back, at once), at most half the GPU. A pool that
    offers whole GPUs would otherwise keep the whole GPU free: every GPU holding anything
    "full", and every idle kernel of a user away swapped out, and with the node's host budget
    spent shut down, though nobody needed its memory (issue 36 item 2; the culler benchmark's
    classroom on HAMi's `h100`, tests/test_overcommit_swap_margin.py)."""
    size = float(pool.gpu.device_memory_mib)
    largest = largest_slice_mib(pool)
    return min(largest, size / 2) if size > 0 else largest


def pool_enforced(pool: Pool) -> bool:
    """Whether `pool`'s backend hard-limits GPU memory (an unknown backend: not): `Seat.enforced`
    for listed and unlisted servers alike."""
    try:
        return bool(get_backend(pool.backend).enforced(pool))
    except (KeyError, ValueError):
        return False
