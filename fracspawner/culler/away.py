"""Release the servers of people who left when someone waits for their slot. Pure.

The idle timeouts stop a server whose GPU and user have been idle for `server_gpu_idle` (1 h,
z2jh's culler timeout) whether or not anyone needs its slot. That hour is the right wait while
nobody does (its person may come back to their kernels), and the wrong one when another person
is already waiting: in the capacity benchmark's classroom (16 slots, two sections of 15 in
turns), section B arrives at 10:45 while section A, gone since 10:25-10:35 with their tabs
closed, still holds the slots: `gpu_busy` for the hour after their last GPU cell, then
`active` until an hour of no activity. Every student of B waited 20-50 minutes for a slot of
someone who had left.

So, where a server pod of a pool waits for a node (made and not scheduled: the hub's
admission "wait"; the culler's pod watch sees it, as for keep.py), the servers of that pool
whose person **left** at least `after` seconds ago are stopped for it, least recently active
first, until the slices they free cover the slices waiting (keep.released, after the slices
that other rules free this cycle). Left means, by the server's own fresh report:

- a tab of it reported its person once (`presence.last_present`): a JupyterLab user, whose
  leaving the browser tells. A server no tab ever reported on (VS Code, a script) is not
  released early: nothing says its person left;
- nobody present or in session at it now (every tab closed or gone: a hidden tab or a silent
  reader at a visible one keeps them in session for `Presence.session_timeout`, never
  released here);
- no activity of the user or the server, and no GPU work known, since `after` ago (unknown GPU
  activity is never idle); no kernel executing a cell; no resume waiting.

On an over-committed pool the slot is not what the waiting pod lacks where no GPU of the pool
has room for it (present users' and working kernels' memory: room.py, the answer the hub's
admission waits on): a slot released there seats nobody, and its person comes back to wait in
turn. So there it releases only where a GPU of the pool has room for the smallest slice
waiting (`room_for_waiting`); the capacity benchmark's breaks mix on half the GPUs went from
56 to 72 waits without this check.

Never a present or in-session user's server, never a busy one; a person who comes back finds
their server stopped as after `server_gpu_idle`, only sooner, and only where someone waited.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .decide import GpuFacts, ServerFacts

if TYPE_CHECKING:
    from ..model.catalog import Catalog
    from .placement import Placement
    from .reports import ServerReport

#: the decisions of servers that this rule may turn into a stop (kept for idleness only)
RELEASABLE = frozenset({"active", "gpu_busy", "hibernated"})


def left_at(report: ServerReport, facts: ServerFacts) -> float | None:
    """When the server's person left (the latest of their last moment seen at a tab, their
    activity and the server's), or None where they are not known to have left."""
    if report.last_present is None or facts.present or facts.in_session:
        return None
    if report.in_session or report.executing or facts.resume_waiting:
        return None
    times = [report.last_present, facts.user_activity, facts.activity]
    return max(t for t in times if t is not None)


def release_at(
    report: ServerReport | None,
    facts: ServerFacts,
    gpu: GpuFacts | None,
    after: float,
    now: float,
) -> float | None:
    """From when the server may be released for a waiting pod: `after` past both its person's
    leaving and its GPU's last known work; None where either is not known (no fresh report,
    GPU activity unknown or missing). The GPU's idle time is taken as of `now`, as
    decide_server does: the time since it was read (up to max_staleness) is not known idle."""
    if report is None or gpu is None or gpu.idle_for is None:
        return None
    left = left_at(report, facts)
    if left is None:
        return None
    return max(left, now - gpu.idle_for) + after


def smallest_waiting(pods: Iterable[tuple[str, Placement]], catalog: Catalog) -> dict[str, float]:
    """Per pool, the smallest slice (MiB) of the server pods waiting for a node (keep.py's
    `waiting_mib` counts their sum); a pod that states no slice counts as 0 here."""
    out: dict[str, float] = {}
    for _name, where in pods:
        if where.node is not None or where.pool not in catalog.pools:
            continue
        mib = where.memory_mib or 0.0
        out[where.pool] = min(out.get(where.pool, mib), mib)
    return out


def room_for_waiting(rooms: Iterable[Mapping[str, Any]], pool: str, smallest_mib: float) -> bool:
    """Whether a released slot on `pool` would seat a waiting pod: a GPU of it has room for the
    smallest slice waiting (`rooms`: the culler's room answer, room.py, which lists the GPUs of
    over-committed pools only). No GPU of the pool listed: the slot is what it lacks."""
    free = [float(r.get("free_mib") or 0.0) for r in rooms if r.get("pool") == pool]
    return not free or max(free) >= smallest_mib
