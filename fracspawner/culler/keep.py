"""Keep rather than kill where memory can be moved (issue 36 item 2): which idle servers stay
because their kernels are all hibernated and nobody waits for what they hold. Pure.

On a pool where hibernation frees memory others use (time-slicing, MPS, any over-committed
pool: `model.idle_defaults.frees_usable_memory`), a server whose kernels are all hibernated
holds no GPU memory: its kernels' state is in host memory, which the node's budget bounds
(hostbudget.py). What it still holds is its slot (a time-sliced replica, an over-committed
slice) and that host memory. Stopping it for `server_gpu_idle` gives the slot to nobody when
nobody waits for one, and shuts its user's kernels down: the capacity benchmark's classroom
(time-sliced, half the GPUs) stopped 10 students' servers at 13:40, when the session their
open tab kept ran out, 20-30 min before they came back for the 14:00 lab; nobody was waiting.

So such a server is stopped for GPU idleness only while something needs what it holds:

- a slot: a server pod of its pool waits for a node (made, not scheduled: under admission
  "wait" FracSpawner makes the pod and it stays Pending until a slot frees). The kept servers
  past their `server_gpu_idle` are stopped until the slices they free cover the slices
  waiting (`released`): those whose person closed every tab first (left on purpose: a tab
  still open, hidden or on a desk past its session, may have its person back in minutes),
  least recently active first within each; the others stay. One with a tab still open goes
  only once a pod of its pool has waited `Culler.release_tab_open_after` (5 min:
  `releasable`);
- host memory: the node's budget shuts the oldest hibernated kernels of users away down when
  another kernel needs the room (hostbudget.plan_room); a server left with no hibernated kernel
  is no longer kept, and its idle timeouts stop it as before.

Otherwise only the plain `server_idle` (8 h by default), `server_unattended` and `max_age` stop
it (decide.py). Without the pod watch nobody waiting can be seen, so nothing is kept: the
servers are stopped as before. A spawn refused at once (admission "refuse") makes no pod, so it
is not seen either: under "refuse", a pool full of kept servers refuses newcomers until their
`server_idle`; admission "wait" is what lets the culler see them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..model.idle_defaults import frees_usable_memory
from .placement import Placement
from .swapdesk import largest_slice_mib

if TYPE_CHECKING:
    from ..model.catalog import Catalog
    from .reports import ServerReport


@dataclass(frozen=True)
class Kept:
    """An idle server kept hibernated that its idle timeouts would stop now."""

    key: tuple[str, str]  # (user, server)
    pool: str
    activity: float  # its last activity (unix seconds): the least recent goes first
    slice_mib: float  # what stopping it frees for a pod waiting on its pool
    # its person closed every tab of it (`tabs_closed`): left on purpose, released first
    tabs_closed: bool = False


def tabs_closed(report: ServerReport | None) -> bool:
    """Whether a server's person closed every tab of it, by its report: a tab reported them
    once (`last_present`) and none reports now (presence unknown). A tab still open and
    reporting, hidden or a desk past its session, may have its person back in minutes; a
    server no tab ever reported on says nothing either way."""
    return report is not None and report.present is None and report.last_present is not None


def may_keep(report: ServerReport | None, pool: str | None, catalog: Catalog) -> bool:
    """Whether a server may be kept hibernated: its pool (the hub's record) frees usable memory
    by hibernation, and its report says it holds no GPU memory, has a hibernated kernel, and
    no resume of it waits (a waiting resume keeps it anyway: decide.py) nor any copy of its
    kernels is under way (a restore: its person has just run a cell)."""
    if report is None or report.gpu is None or pool not in catalog.pools:
        return False
    where = catalog.pools[pool]
    if not frees_usable_memory(where.backend, where.overcommit):
        return False
    waits = any(g.waiting for g in report.swap.gpus)
    held = report.hibernated_kernels
    if not held or any(k.copying for k in held):
        return False
    return report.gpu.memory_mib <= 0 and not waits


def waiting_mib(pods: Iterable[tuple[str, Placement]], catalog: Catalog) -> dict[str, float]:
    """Per pool, the slices (MiB) of the server pods waiting for a node: made, not scheduled.
    A pod that states no slice counts as its pool's largest."""
    out: dict[str, float] = defaultdict(float)
    for _name, where in pods:
        if where.node is not None or where.pool not in catalog.pools:
            continue
        out[where.pool] += where.memory_mib or largest_slice_mib(catalog.pools[where.pool])
    return dict(out)


def waited(pods: Iterable[tuple[str, Placement]], now: float) -> dict[str, float]:
    """Per pool, how long its longest-waiting server pod has waited for a node (seconds since
    it was made); a pod whose making is not known has not waited yet."""
    out: dict[str, float] = {}
    for _name, where in pods:
        if where.node is not None or where.pool is None:
            continue
        since = 0.0 if where.created is None else max(0.0, now - where.created)
        out[where.pool] = max(out.get(where.pool, 0.0), since)
    return out


def releasable(
    kept: Iterable[Kept], waited: Mapping[str, float], tab_open_after: float
) -> list[Kept]:
    """The servers that may be released for the pods waiting on their pools: those whose
    person closed every tab at once; those with a tab still open (hidden, or on a desk past its
    session) only once a pod of their pool has waited `tab_open_after` seconds. Such a tab's
    person is often back within minutes: replayed (the culler benchmark's classroom on half the
    GPUs, both families), 5 of the 12 people whose kept servers went for a newcomer and who came
    back within 30 minutes had left a tab open, and were back 3-10 minutes later; released only
    once the newcomer had waited 5 minutes, none of those 5 was (waits there 20 and 53 to 20 and
    48; one more each without over-commit, time-sliced classroom and research)."""
    return [k for k in kept if k.tabs_closed or waited.get(k.pool, 0.0) >= tab_open_after]


def released(kept: Iterable[Kept], waiting: Mapping[str, float]) -> set[tuple[str, str]]:
    """The kept servers to stop for the pods waiting on their pools: those whose person closed
    every tab first (left on purpose), then the others (a tab still open, or none ever); least
    recently active first within each; until the slices they free cover the slices waiting
    (at least one per pool where something waits). Slices are whole MiB, each floored
    (model/slices.py: two eighths of an H100 are its quarter less 1 MiB), so n slices freed
    cover what waits within n MiB: else one more server was stopped for that MiB."""
    out: set[tuple[str, str]] = set()
    freed: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for k in sorted(kept, key=lambda k: (not k.tabs_closed, k.activity, k.key)):
        need = waiting.get(k.pool, 0.0)
        if need > 0 and freed[k.pool] + count[k.pool] < need:
            out.add(k.key)
            freed[k.pool] += max(k.slice_mib, 0.0)
            count[k.pool] += 1
    return out
