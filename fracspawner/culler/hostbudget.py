"""Host memory per node: how much hibernated GPU state the culler lets a node's servers keep.

A hibernated kernel is kept rather than shut down (issue 36, item 2): it holds no GPU memory,
and comes back on its next cell. What it costs is host memory, on its pod's node. So the culler
keeps the hibernated state of each node's servers within a budget (`Culler.host_memory_budget`):
when a node's servers together hold more, the oldest hibernated kernels are shut down until it
fits, each by its own server (told in the answer to its report: `{"swap": {"shutdown":
[{"kernel_id", "reason"}]}}`, serverext/swap.py) and counted as a kernel shutdown. Shutting a
kernel down is the last resort: never one whose resume waits for room (its cell is waiting),
never one of a user present or in session (`Holder.present`: a tab of theirs open and reporting,
seen within the session timeout; serverext/presence.py), never one of a server not heard from
(`Holder.silent`: its report stale or missing, it counts at its whole share, and nobody's kernel
is shut down on its account: unknown is never free, and never culls).

A report is its server's word: each kernel counts at most its server's slice, all its kernels
together at most what its pod can hold on the GPUs it is bound to (`Holder.share_mib`), and the
kernels of servers holding more than an equal share of the budget go first (oldest first among
them), so one server's inflated word shuts its own kernels down before anyone else's. Pure: no
I/O.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import datetime

#: the extension's hibernation states of a kernel whose GPU state is in host memory, or being
#: copied there or back (`HibernatedKernel.copying`). A copy is slow (measured on an H200: a
#: checkpoint at 1.4-1.9 GiB/s, a restore at 3.4-5.5 GiB/s; docs/serverext.md): 80 GiB fill
#: host memory for about a minute, and stay there the 15-25 s their restore takes
IN_HOST = frozenset({"hibernating", "hibernated", "resuming", "restore_failed"})


@dataclass(frozen=True)
class HibernatedKernel:
    kernel_id: str
    # GPU state it keeps in host memory, or is copying there (a server before this word said 0
    # while its checkpoint was under way: the room held for it counts it then, hostroom.py)
    mib: float
    since: float  # unix seconds: hibernated since
    waiting: bool = False  # its resume waits for room on the GPU: its cell is waiting
    state: str = "hibernated"  # its hibernation state by its server's word (hibernate.py)

    @property
    def copying(self) -> bool:
        """Its checkpoint or its restore is under way: never shut down meanwhile (its server
        would not, and a restore means its person has just run a cell)."""
        return self.state in ("hibernating", "resuming")


@dataclass(frozen=True)
class Holder:
    """One server's hibernated kernels, on the node its pod is on."""

    user: str
    server: str
    node: str
    cap_mib: float  # its slice's memory: the most one of its kernels counts for
    present: bool = False  # its user is present or in session: never shut down
    kernels: tuple[HibernatedKernel, ...] = ()
    # the most all its kernels together count for: its pod's GPUs' memory (Culler.host_share),
    # so one report listing many kernels takes at most its own share of the node's budget
    share_mib: float = math.inf
    # its report is stale or missing while its pod is on the node (its reporter stuck, a
    # network partition, the culler restarted): it may hold anything up to `share_mib` in host
    # memory, so it counts at that (unknown is never free), and none of its kernels is ordered
    # (it would not hear), nor anyone's kernel shut down on its account (its kernels may be back)
    silent: bool = False
    # silent and counted at its whole share, which bounds the room held for it too; False for
    # one the culler cannot size (no GPU slice): its last word, and the room held for it
    whole_share: bool = True

    def said_mib(self) -> float:
        """What its report says its kernels hold, each at most `cap_mib`."""
        return sum(min(k.mib, self.cap_mib) for k in self.kernels)

    def held_mib(self) -> float:
        """What it counts for on its node: its word, at most `share_mib`; silent, `share_mib`."""
        return self.share_mib if self.silent else min(self.said_mib(), self.share_mib)


@dataclass(frozen=True)
class Eviction:
    user: str
    server: str
    kernel_id: str
    mib: float
    reason: str


def hibernated_kernels(report: dict, received_at: float) -> tuple[HibernatedKernel, ...]:
    """A checked report's kernels whose GPU state is in host memory, or on its way there or
    back (reports.REPORT checked the types); a time in the future counts as the report's
    arrival."""
    out = []
    for k in report.get("kernels") or []:
        h = k.get("hibernation") or {}
        if h.get("state") not in IN_HOST:
            continue
        mib = float(h.get("hibernated_gpu_memory_mib") or 0.0)
        since = _unix(h.get("hibernated_since"), received_at)
        waiting = bool(h.get("waiting_for_gpu"))
        out.append(HibernatedKernel(str(k["id"]), max(0.0, mib), since, waiting, h["state"]))
    return tuple(out)


def _unix(text: object, default: float) -> float:
    if not isinstance(text, str):
        return default
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return default
    return min(value, default)


def plan_evictions(holders: Iterable[Holder], budget_mib: float) -> list[Eviction]:
    """Per node, the hibernated kernels to shut down until the node's total is within
    `budget_mib`: first those of servers above an equal share of it, oldest first; then any,
    oldest first. Never a kernel whose resume waits or whose copy is under way, nor a present
    user's. Silent holders are left out: what they hold is not known (their kernels may be
    back on the GPU), and no one's kernel is shut down on unknown data."""
    by_node: dict[str, list[Holder]] = {}
    for h in holders:
        if h.silent:
            continue
        by_node.setdefault(h.node, []).append(h)
    out: list[Eviction] = []
    for node, group in sorted(by_node.items()):
        said = {id(h): h.said_mib() for h in group}
        held = {id(h): h.held_mib() for h in group}
        total = sum(held.values())
        if total <= budget_mib:
            continue
        share = budget_mib / len(group)
        left = [
            (h, k)
            for h in group
            if not h.present
            for k in h.kernels
            if not k.waiting and not k.copying and k.mib > 0
        ]
        while total > budget_mib and left:
            above = [(h, k) for h, k in left if held[id(h)] > share]
            h, k = min(above or left, key=lambda e: (e[1].since, e[0].user, e[1].kernel_id))
            left.remove((h, k))
            mib = min(k.mib, h.cap_mib)
            said[id(h)] -= mib
            freed = held[id(h)] - min(said[id(h)], h.share_mib)  # 0 while above its share
            held[id(h)] -= freed
            total -= freed
            out.append(
                Eviction(
                    h.user,
                    h.server,
                    k.kernel_id,
                    mib,
                    f"the hibernated kernels on node {node} held {total + freed:.0f} MiB of host "
                    f"memory, over its budget of {budget_mib:.0f} MiB, and this one was the "
                    "oldest",
                )
            )
    return out


# --- hibernation within the budget -----------------------------------------------------------
# The budget bounds hibernation itself, not only shut-downs afterwards: a kernel is hibernated
# only with room for it in its node's budget, counting every hibernated kernel on the node (the
# spared ones of users present or in session included, which the budget may never shut down).
# Otherwise a present user's hidden tab could fill the node and the budget would then take the
# away users' kernels, or nothing, after the fact.


WAITS_FOR = "waits for "  # a want's wait for shut-downs that make its room


@dataclass(frozen=True)
class Want:
    """A kernel its server would hibernate (idle past kernel_gpu_hibernate, or the culler's own
    swap order), waiting for room in its node's host budget."""

    kernel_id: str
    mib: float


@dataclass(frozen=True)
class RoomPlan:
    grants: tuple[Want, ...] = ()  # hibernate now: within the budget
    evictions: tuple[Eviction, ...] = ()  # away users' oldest kernels, to make room
    waits: tuple[tuple[str, str], ...] = ()  # (kernel_id, why): stays on the GPU
    # (kernel_id, indices into `evictions`): the shut-downs a waiting want waits for
    relies: tuple[tuple[str, tuple[int, ...]], ...] = ()


def node_held(holders: Iterable[Holder]) -> float:
    """Host memory the hibernated kernels of `holders` keep, each at most its cap, each
    holder's together at most its share."""
    return sum(h.held_mib() for h in holders)


def plan_room(
    node: str,
    holders: Iterable[Holder],
    reserved_mib: float,
    wants: Iterable[Want],
    cap_mib: float,
    budget_mib: float,
    *,
    may_evict: bool,
    evicting: frozenset[str] = frozenset(),
    own_mib: float = 0.0,
    share_mib: float = math.inf,
    evict_for: Collection[str] | None = None,
) -> RoomPlan:
    """Which of one server's `wants` may hibernate on `node` now: those that fit in
    `budget_mib` less what the node's hibernated kernels hold (all of them) and `reserved_mib`
    (room granted to other kernels not yet hibernated). Where one does not fit and `may_evict`
    (its user is away), the oldest hibernated kernels of away users on the node are shut down
    to make room, only if that frees enough (the want waits until they are gone); otherwise it
    stays on the GPU. `evicting`: kernel ids already ordered out (not counted twice).
    `own_mib`: what the server's kernels hold and have room for already; with a want, at most
    `share_mib` (what its pod can hold on its GPUs): beyond it, the want stays on the GPU.
    `evict_for`: the wants that may shut kernels down (None: every one, where `may_evict`);
    the others stay on the GPU where they do not fit. What the shut-downs ordered free stays
    held until their servers report them gone: beyond the want they were ordered for, it lets
    only later wants wait for them (never hibernate now), so the node stays within the budget
    while both are in host memory. Silent holders count at their share (never free), their
    kernels are never shut down, and nobody's is for room they alone take: a want that fits
    but for them waits, and shut-downs for one that does not are made only where they make
    its room with the silent servers counted."""
    group = list(holders)
    room = budget_mib - node_held(group) - reserved_mib
    unknown = sum(h.held_mib() for h in group if h.silent)  # what only silent servers take
    silent = sum(h.silent for h in group)
    note = (
        f"; {silent} server(s) there that have not reported lately count at what their pods can "
        f"hold ({unknown:.0f} MiB) until they report or their pods are gone"
        if silent
        else ""
    )
    pending = 0.0  # what the shut-downs ordered here free beyond the wants waiting for them
    grants: list[Want] = []
    evictions: list[Eviction] = []
    waits: list[tuple[str, str]] = []
    relies: list[tuple[str, tuple[int, ...]]] = []
    said = {id(h): h.said_mib() for h in group}  # what shutting kernels down leaves of each
    spare = sorted(
        ((h, k) for h in group if not h.present and not h.silent for k in h.kernels
         if not k.waiting and not k.copying and k.mib > 0 and k.kernel_id not in evicting),
        key=lambda e: (e[1].since, e[0].user, e[1].kernel_id),
    )  # fmt: skip
    for want in wants:
        mib = min(max(want.mib, 0.0), cap_mib)
        if own_mib + mib > share_mib:
            waits.append((want.kernel_id, f"not hibernated: its server's hibernated kernels and "
                          f"room given hold {own_mib:.0f} MiB of the {share_mib:.0f} MiB its "
                          "pod's GPUs can hold; it stays on the GPU"))  # fmt: skip
            continue
        if mib <= room:
            grants.append(Want(want.kernel_id, mib))
            room -= mib
            own_mib += mib
            continue
        freed, picked, after = 0.0, [], dict(said)
        evict = may_evict and (evict_for is None or want.kernel_id in evict_for)
        # with the silent servers at nothing it fits: it waits for them, nobody goes for it
        evict = evict and mib > room + unknown
        if evict:
            # what silent servers may hold counts (room has it taken): shut-downs that would
            # make room only were they empty would shut a kernel down for nothing
            for h, k in spare:
                if room + pending + freed >= mib:
                    break
                picked.append((h, k))
                before = min(after[id(h)], h.share_mib)
                after[id(h)] -= min(k.mib, h.cap_mib)
                freed += before - min(after[id(h)], h.share_mib)  # 0 while above its share
        if evict and room + pending + freed >= mib:
            said = after
            for h, k in picked:
                spare.remove((h, k))
                evictions.append(
                    Eviction(
                        h.user, h.server, k.kernel_id, min(k.mib, h.cap_mib),
                        f"the host memory budget of node {node} ({budget_mib:.0f} MiB) is "
                        f"spent, and this was the oldest hibernated kernel of a user away: it "
                        f"makes room for another kernel to hibernate",
                    )
                )  # fmt: skip
            # the want takes what the shut-downs free first, then room: what they free is in
            # host memory until their servers report them gone, so it is never room now
            pending += freed
            use = min(pending, mib)
            pending -= use
            room -= mib - use
            own_mib += mib
            count = f"{len(picked)} " if picked else "the "
            waits.append((want.kernel_id, f"{WAITS_FOR}{count}older hibernated "
                          f"kernel(s) on node {node} to be shut down"))  # fmt: skip
            # it may take what earlier wants' shut-downs free too: it waits for all of them
            relies.append((want.kernel_id, tuple(range(len(evictions)))))
            continue
        waits.append(
            (
                want.kernel_id,
                f"not hibernated: the host memory budget of node {node} ({budget_mib:.0f} MiB) "
                f"has {max(room, 0.0):.0f} MiB left and it needs {mib:.0f} MiB{note}; it stays "
                "on the GPU",
            )
        )
    return RoomPlan(tuple(grants), tuple(evictions), tuple(waits), tuple(relies))
