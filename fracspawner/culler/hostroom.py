"""The host memory budget bounds hibernation itself (issue 36, item 2; hostbudget.py).

A kernel's server hibernates it only with room for it in its node's budget, which the culler
gives in the answer to the server's report (`{"swap": {"host_room": [{"kernel_id",
"gpu_memory_mib"}]}}`), counting every hibernated kernel on the node, those of users present or
in session included (the budget may never shut theirs down, so they must never push it over).
Where a kernel does not fit, its server is told why (`swap.host_wait`) and the kernel stays on
the GPU: for a user away, the oldest hibernated kernels of other users away on the node are shut
down first if that frees enough (the last resort, counted as a disruption), and the kernel
waits until they are gone; on an over-committed pool only for the culler's swap orders (the
GPU memory is needed), never for a kernel due to hibernate merely for idleness (`evict_for`).
The culler's own swap orders (pressure.py) pass the same check.

Room given is held for the kernel (`GRANT_SECONDS`, longer while shut-downs it waits for are
under way, and while its server reports its checkpoint under way: 80 GiB take about a minute to
copy, measured on an H200) until its server's report shows it hibernated: two servers on one
node cannot both take the same room. A kernel that waits for shut-downs is not planned again
while they are under way: its server reports every 20-60 s, the shut-down kernels' servers once
a minute, and each new plan would have ordered another user's kernel out for the same want.

What an ordered shut-down frees counts as held until its server's report shows the kernel
gone: a kernel waits for it, none hibernates into it meanwhile (both would be in host memory).
The memory peak per node is then within the budget by construction.

A shut-down is told to its server once (`tell`), and again only `EVICT_SECONDS` later: done,
its server's next report no longer lists the kernel; refused (its resume is under way: a cell
held, a restore being retried), the server reports at once with the kernel still there, and
an order told at each answer had it refuse and report again at once, until the report rate
limit held its reports back.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from .hostbudget import WAITS_FOR, Eviction, Holder, RoomPlan, Want, plan_room

KernelKey = tuple[str, str, str]  # (user, server, kernel_id)

GRANT_SECONDS = 30.0  # room given to a kernel is held this long for it to hibernate
EVICT_SECONDS = 180.0  # room that waits for shut-downs (their servers report once a minute)
LONGEST_SECONDS = 600.0  # room held for a server that does not report again
UNKNOWN_MIB = 2.0**40  # a kernel whose memory a report does not give: counted at its cap


@dataclass
class HostRoom:
    """Room given and shut-downs ordered, per node (the culler's state between reports)."""

    # (user, server, kernel_id) -> (node, MiB, given at: unix seconds, for how long)
    held: dict[tuple[str, str, str], tuple[str, float, float, float]] = field(default_factory=dict)
    # (user, server) -> {kernel_id: (reason, until)}: told in the answer to that server's report
    evicting: dict[tuple[str, str], dict[str, tuple[str, float]]] = field(default_factory=dict)
    # a want that waits for shut-downs -> the kernels shut down for it
    waits_for: dict[KernelKey, tuple[KernelKey, ...]] = field(default_factory=dict)
    # a kernel told shut down in the answer to its server's report -> when (`tell`)
    told: dict[KernelKey, float] = field(default_factory=dict)

    def reserved(self, node: str, holders: Iterable[Holder], now: float,
                 reported: Mapping[tuple[str, str], float]) -> float:  # fmt: skip
        """Room held on `node` for kernels not yet seen hibernated. Held until the kernel's
        server reports it hibernated (then its report counts it), or reports after the room
        ran out without it (`reported`: when each server's latest report came), never by time
        alone while it has not reported since (it may have hibernated the kernel meanwhile),
        nor while its report shows the kernel's checkpoint under way (a copy of 80 GiB takes
        about a minute: held 30 s, its room was given again while it filled) without saying
        what it copies (a server that does counts it in its report: held as well, it would
        count twice); at most `LONGEST_SECONDS`. Not counted for a silent holder (stale or no
        report) counted at its whole share already, which bounds its kernels and the room held
        for it (`Holder.whole_share`)."""
        holders = list(holders)
        seen = {(h.user, h.server, k.kernel_id): k for h in holders for k in h.kernels}
        silent = {(h.user, h.server) for h in holders if h.silent and h.whole_share}
        for key, (_n, _mib, at, hold) in list(self.held.items()):
            last = reported.get(key[:2])
            k = seen.get(key)
            copying = k is not None and k.state == "hibernating" and k.mib <= 0
            if (
                (key in seen and not copying)
                or (not copying and last is not None and last > at + hold)
                or now > at + LONGEST_SECONDS
            ):
                del self.held[key]
        for key in [k for k in self.waits_for if k not in self.held]:
            del self.waits_for[key]  # its room is no longer held: nothing waits for them
        return sum(
            mib
            for key, (n, mib, _at, _hold) in self.held.items()
            if n == node and key[:2] not in silent
        )

    def plan(
        self,
        user: str,
        server: str,
        node: str,
        holders: list[Holder],
        wants: Iterable[Want],
        cap_mib: float,
        budget_mib: float,
        now: float,
        reported: Mapping[tuple[str, str], float],
        *,
        away: bool,
        share_mib: float = math.inf,
        evict_for: Collection[str] | None = None,
    ) -> RoomPlan:
        """Room for one server's `wants` on its node now (hostbudget.plan_room), held for them;
        the shut-downs it needs are kept for their servers' next reports. What its kernels hold
        and the room held for it, with its wants, stay within `share_mib`; only the wants in
        `evict_for` (None: all) may have kernels shut down for them."""
        waiting: list[tuple[str, str]] = []  # wants whose shut-downs are still under way
        fresh: list[Want] = []
        for w in wants:
            key = (user, server, w.kernel_id)
            under_way = self._under_way(key, holders, now)
            if under_way and key in self.held:
                waiting.append((w.kernel_id, f"{WAITS_FOR}{under_way} older hibernated "
                                f"kernel(s) on node {node} to be shut down"))  # fmt: skip
                continue
            self.waits_for.pop(key, None)
            self.held.pop(key, None)  # planned again below
            fresh.append(w)
        wants = fresh
        reserved = self.reserved(node, holders, now, reported)
        # orders in force only: a lapsed one (its server has not reported since) frees nothing,
        # and leaving its kernel out had another user's kernel ordered out in its place
        evicting = frozenset(
            k for ks in self.evicting.values() for k, (_r, until) in ks.items() if until > now
        )
        own = sum(h.held_mib() for h in holders if (h.user, h.server) == (user, server))
        own += sum(m for key, (_n, m, _a, _h) in self.held.items() if key[:2] == (user, server))
        out = plan_room(
            node, holders, reserved, wants, cap_mib, budget_mib, may_evict=away,
            evicting=evicting, own_mib=own, share_mib=share_mib, evict_for=evict_for,
        )  # fmt: skip
        for w in out.grants:
            self.held[(user, server, w.kernel_id)] = (node, w.mib, now, GRANT_SECONDS)
        if out.evictions:
            self.order(out.evictions, now)
            relies = dict(out.relies)
            for w in wants:  # hold the room the shut-downs free for the kernels that wait
                if w.kernel_id in relies:
                    key = (user, server, w.kernel_id)
                    self.held[key] = (node, min(w.mib, cap_mib), now, EVICT_SECONDS)
                    self.waits_for[key] = tuple(
                        (e.user, e.server, e.kernel_id)
                        for e in (out.evictions[i] for i in relies[w.kernel_id])
                    )
        if waiting:
            out = RoomPlan(out.grants, out.evictions, out.waits + tuple(waiting), out.relies)
        return out

    def _under_way(self, want: KernelKey, holders: Iterable[Holder], now: float) -> int:
        """How many of the shut-downs ordered for `want` are still under way: ordered, in force,
        and their kernels still hibernated on the node by their servers' latest reports."""
        still = {(h.user, h.server, k.kernel_id) for h in holders for k in h.kernels}
        count = 0
        for u, s, kid in self.waits_for.get(want, ()):
            order = self.evicting.get((u, s), {}).get(kid)
            count += order is not None and order[1] > now and (u, s, kid) in still
        return count

    def order(self, evictions: Iterable[Eviction], now: float) -> None:
        for e in evictions:
            mine = self.evicting.setdefault((e.user, e.server), {})
            mine[e.kernel_id] = (e.reason, now + EVICT_SECONDS)

    def orders_for(self, user: str, server: str, now: float) -> dict[str, str]:
        """The shut-downs ordered for this server's kernels still in force: {kernel_id: why}."""
        mine = self.evicting.get((user, server), {})
        for kid in [k for k, (_r, until) in mine.items() if until <= now]:
            del mine[kid]
        if not mine:
            self.evicting.pop((user, server), None)
        return {kid: reason for kid, (reason, _until) in mine.items()}

    def tell(self, user: str, server: str, kernel_ids: Iterable[str], now: float) -> list[str]:
        """Of the shut-downs due for this server's kernels, those to tell in this answer: each
        once, and again only `EVICT_SECONDS` after it was told (a refused one, its resume under
        way, is asked again then, not at every answer)."""
        for key in [k for k, at in self.told.items() if now - at >= EVICT_SECONDS]:
            del self.told[key]
        out = []
        for kid in kernel_ids:
            key = (user, server, kid)
            if key not in self.told:
                self.told[key] = now
                out.append(kid)
        return out
