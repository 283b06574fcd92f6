"""Host memory per node: how much hibernated GPU state the culler lets a node's servers keep.

A hibernated kernel is kept rather than shut down (issue 36, item 2): it holds no GPU memory,
and comes back on its next cell. What it costs is host memory, on its pod's node. So the culler
keeps the hibernated state of each node's servers within a budget (`Culler.host_memory_budget`):
when a node's servers together hold more, the oldest hibernated kernels are shut down until it
fits, each by its own server (told in the answer to its report: `{"swap": {"shutdown":
[{"kernel_id", "reason"}]}}`, serverext/swap.py) and counted as a kernel shutdown. Shutting a
kernel down is the last resort: never one whose resume waits for room (its cell is waiting),
never one of a user present or in session (`Holder.present`: a tab of theirs open and reporting,
seen within the session timeout; serverext/presence.py).

A report is its server's word: each kernel counts at most its server's slice, and the kernels of
servers holding more than an equal share of the budget go first (oldest first among them), so
one server's inflated word shuts its own kernels down before anyone else's. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

#: the extension's hibernation state of a kernel whose GPU state is in host memory
IN_HOST = frozenset({"hibernated", "restore_failed"})


@dataclass(frozen=True)
class HibernatedKernel:
    kernel_id: str
    mib: float  # GPU state it keeps in host memory
    since: float  # unix seconds: hibernated since
    waiting: bool = False  # its resume waits for room on the GPU: its cell is waiting


@dataclass(frozen=True)
class Holder:
    """One server's hibernated kernels, on the node its pod is on."""

    user: str
    server: str
    node: str
    cap_mib: float  # its slice's memory: the most one of its kernels counts for
    present: bool = False  # its user is present or in session: never shut down
    kernels: tuple[HibernatedKernel, ...] = ()


@dataclass(frozen=True)
class Eviction:
    user: str
    server: str
    kernel_id: str
    mib: float
    reason: str


def hibernated_kernels(report: dict, received_at: float) -> tuple[HibernatedKernel, ...]:
    """A checked report's kernels whose GPU state is in host memory (reports.REPORT checked the
    types); a time in the future counts as the report's arrival."""
    out = []
    for k in report.get("kernels") or []:
        h = k.get("hibernation") or {}
        if h.get("state") not in IN_HOST:
            continue
        mib = float(h.get("hibernated_gpu_memory_mib") or 0.0)
        since = _unix(h.get("hibernated_since"), received_at)
        waiting = bool(h.get("waiting_for_gpu"))
        out.append(HibernatedKernel(str(k["id"]), max(0.0, mib), since, waiting))
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
    oldest first. Never a kernel whose resume waits, nor a present user's."""
    by_node: dict[str, list[Holder]] = {}
    for h in holders:
        by_node.setdefault(h.node, []).append(h)
    out: list[Eviction] = []
    for node, group in sorted(by_node.items()):
        held = {id(h): sum(min(k.mib, h.cap_mib) for k in h.kernels) for h in group}
        total = sum(held.values())
        if total <= budget_mib:
            continue
        share = budget_mib / len(group)
        left = [
            (h, k) for h in group if not h.present for k in h.kernels if not k.waiting and k.mib > 0
        ]
        while total > budget_mib and left:
            above = [(h, k) for h, k in left if held[id(h)] > share]
            h, k = min(above or left, key=lambda e: (e[1].since, e[0].user, e[1].kernel_id))
            left.remove((h, k))
            mib = min(k.mib, h.cap_mib)
            held[id(h)] -= mib
            total -= mib
            out.append(
                Eviction(
                    h.user,
                    h.server,
                    k.kernel_id,
                    mib,
                    f"the hibernated kernels on node {node} held {total + mib:.0f} MiB of host "
                    f"memory, over its budget of {budget_mib:.0f} MiB, and this one was the "
                    "oldest",
                )
            )
    return out
