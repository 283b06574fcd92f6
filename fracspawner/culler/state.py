"""What the culler knows, kept for the admin page (`GET {prefix}api/state`): each server's GPU
state and what the culler will do next, from the last cycle, and what it ended in the last 24 h.

Bounded: the server view is the last cycle's (one entry per ready server), the history at most
`HISTORY_LIMIT` server stops and as many kernel shutdowns, none older than `HISTORY_SECONDS`;
both live in memory, so after a restart the history starts again (`since` says when). Server
stops are the culler's own acts; kernel shutdowns are what servers report (their own word), so
they are kept apart: a flood of reports cannot push a real stop out, and one user's kernel
events take at most `USER_SHARE` of their part (the user's oldest go first). Pure apart from
the clock the caller passes in.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from .decide import Decision, GpuFacts, Policy, Reading, ServerFacts, server_deadlines

HISTORY_SECONDS = 24 * 3600.0
HISTORY_LIMIT = 10_000  # events; a class of 500 culled every hour for a day is 12,000
USER_SHARE = 0.05  # of the kernel history one user's servers may fill (500 of 10,000)
CAME_BACK_SECONDS = 30 * 60.0


@dataclass
class CullEvent:
    at: float
    user: str
    server: str
    pool: str
    slice: str
    # "server" (stopped by the culler), "kernel" (shut down by its server) or "hibernate" (its
    # GPU memory parked in host memory by its server; kept like kernel events)
    kind: str
    reason: str
    message: str
    gpu_memory_mib: float
    gpu_equivalent: float  # what the stop gave back (0 for a kernel: the slice stays held)
    came_back_at: float | None = None  # the user's next server start after this event


def gpu_state(gpu: GpuFacts | None) -> tuple[str, float | None]:
    """("busy" | "idle" | "unknown", seconds idle) of one reading: unknown is never idle."""
    if gpu is None or gpu.idle_for is None:
        return "unknown", None
    if gpu.idle_for <= 0:
        return "busy", None
    return "idle", gpu.idle_for


def next_step(
    facts: ServerFacts, reading: Reading, decision: Decision, policy: Policy, now: float
) -> dict[str, Any] | None:
    """What the culler will do to this server next and the earliest moment, if nothing
    changes (the GPU stays as it is, nobody uses the server); None: nothing is due.
    The moments are `server_deadlines`', the ones `decide_server` stops by."""
    if decision.cull:
        return {"action": "stop", "reason": decision.reason, "at": now}
    if decision.reason in ("not_ready", "exempt", "excluded"):
        return None
    due = server_deadlines(facts, reading, policy)
    if not due:
        return None
    # the earliest; at a tie the first in the rules' order, the reason decide_server gives
    at, reason = min(due, key=lambda d: d[0])
    return {"action": "stop", "reason": reason, "at": max(at, now)}


class CullerState:
    """The last cycle's view of every server and the bounded history of what was ended."""

    def __init__(
        self, started_at: float, *, limit: int = HISTORY_LIMIT, user_share: float = USER_SHARE
    ) -> None:
        self.started_at = started_at
        self.limit = limit
        self.history: deque[CullEvent] = deque(maxlen=limit)  # server stops (the culler's)
        # kernel shutdowns the servers reported, and how many each user has there
        self.kernel_events: deque[CullEvent] = deque()
        self.per_user = max(1, int(limit * user_share))
        self._kernels_of: Counter[str] = Counter()
        self.servers: list[dict[str, Any]] = []
        self.last_cycle_at: float | None = None
        # (user, server) -> (gpu state, since): how long a server has been busy/unknown
        self._since: dict[tuple[str, str], tuple[str, float]] = {}

    def record(self, event: CullEvent) -> None:
        if event.kind == "server":
            self.history.append(event)
            return
        if self._kernels_of[event.user] >= self.per_user:
            # the user's share is full: their oldest event makes room, nobody else's
            for i, old in enumerate(self.kernel_events):
                if old.user == event.user:
                    del self.kernel_events[i]
                    self._kernels_of[event.user] -= 1
                    break
        elif len(self.kernel_events) >= self.limit:
            self._forget(self.kernel_events.popleft())
        self.kernel_events.append(event)
        self._kernels_of[event.user] += 1

    def _forget(self, event: CullEvent) -> None:
        self._kernels_of[event.user] -= 1
        if self._kernels_of[event.user] <= 0:
            del self._kernels_of[event.user]

    def prune(self, now: float) -> None:
        while self.history and self.history[0].at < now - HISTORY_SECONDS:
            self.history.popleft()
        # kernel events are kept in arrival order; their times may be older than the newest
        old = [e for e in self.kernel_events if e.at < now - HISTORY_SECONDS]
        if old:
            self.kernel_events = deque(
                e for e in self.kernel_events if e.at >= now - HISTORY_SECONDS
            )
            for event in old:
                self._forget(event)

    def events(self) -> list[CullEvent]:
        """Server stops and kernel shutdowns together, oldest first."""
        return sorted([*self.history, *self.kernel_events], key=lambda e: e.at)

    def cycle(
        self, rows: Iterable[dict[str, Any]], started: Iterable[ServerFacts], now: float
    ) -> None:
        """A cycle's server rows (`server_row`); `started`: every ready server's facts, to
        notice users who came back after a stop."""
        self.prune(now)
        self.last_cycle_at = now
        rows = list(rows)
        seen: dict[tuple[str, str], tuple[str, float]] = {}
        for row in rows:
            key = (row["user"], row["server"])
            state, idle_for = row["gpu"]["state"], row["gpu"]["idle_for"]
            before = self._since.get(key)
            if state == "idle" and idle_for is not None:
                since = now - idle_for
            elif before is not None and before[0] == state:
                since = before[1]
            else:
                since = now
            seen[key] = (state, since)
            row["gpu"]["since"] = since
        self._since = seen
        self.servers = rows
        started = list(started)
        for event in self.history:
            if event.kind != "server" or event.came_back_at is not None:
                continue
            back = [
                f.started
                for f in started
                if f.user == event.user and f.started is not None and f.started > event.at
            ]
            if back:
                event.came_back_at = min(back)

    def to_json(self, now: float) -> dict[str, Any]:
        self.prune(now)
        history = [asdict(e) for e in self.events()]
        return {
            "now": now,
            "since": self.started_at,
            "last_cycle_at": self.last_cycle_at,
            "history_limit": self.limit,
            "history_seconds": HISTORY_SECONDS,
            "servers": self.servers,
            "history": history,
            "summary": summarise(history, now),
        }


def server_row(
    facts: ServerFacts,
    reading: Reading,
    decision: Decision,
    policy: Policy,
    pool: str,
    now: float,
    hibernated_mib: float | None = None,
    simulated: bool = False,
) -> dict[str, Any]:
    """One server's row; `hibernated_mib`: GPU memory its hibernated kernels keep in host
    memory, from its own report (None: no report, so not known); `simulated`: its report says
    its GPU is the demo's simulated one."""
    state, idle_for = gpu_state(reading.gpu)
    gpu = reading.gpu
    return {
        "user": facts.user,
        "server": facts.name,
        "pool": pool,
        "slice": facts.gpu_slice or "",
        "started": facts.started,
        "activity": facts.activity,
        "gpu": {
            "state": state,
            "idle_for": idle_for,
            "memory_mib": None if gpu is None else gpu.memory_mib,
            "source": "" if gpu is None else gpu.source,
            "note": reading.missing or ("" if gpu is None else gpu.note),
            "hibernated_mib": hibernated_mib,
            "simulated": simulated,
        },
        "decision": {"action": decision.action, "reason": decision.reason},
        "next": next_step(facts, reading, decision, policy, now),
    }


def summarise(history: Iterable[dict[str, Any]], now: float) -> dict[str, Any]:
    """Totals of a history (the JSON events): servers stopped, kernels shut down, GPU memory
    and slice-hours given back, users back within 30 min. Slice-hours: the stopped slice's
    GPU-equivalents times the hours until its user started a server again (or until now)."""
    servers = kernels = hibernated = came_back = 0
    memory = slice_hours = 0.0
    for event in history:
        if event.get("kind") == "hibernate":  # parked, not given back: it comes back on use
            hibernated += 1
            continue
        memory += event.get("gpu_memory_mib") or 0.0
        if event.get("kind") == "kernel":
            kernels += 1
            continue
        servers += 1
        back = event.get("came_back_at")
        end = back if back is not None else now
        slice_hours += (event.get("gpu_equivalent") or 0.0) * max(end - event["at"], 0.0) / 3600
        if back is not None and back - event["at"] <= CAME_BACK_SECONDS:
            came_back += 1
    return {
        "servers_stopped": servers,
        "kernels_shut_down": kernels,
        "kernels_hibernated": hibernated,
        "gpu_memory_mib": memory,
        "slice_hours": round(slice_hours, 3),
        "came_back_30min": came_back,
    }
