"""GPU reports that servers push to the culler: parsing (pure) and the latest one per server.

A report is the notebook extension's JSON (fracspawner.serverext, docs/serverext.md). It is the
server's own word, so it may only ever help its own server: the identity comes from the token
it was sent with (identity.py), never from the body, and every time in it is clamped to the
moment it arrived. An "unavailable" report (no GPU readable) still carries the server's own
activity, which is kept.
"""

from __future__ import annotations

import json
import math
from collections import Counter, OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from dateutil.parser import isoparse

from .decide import GpuFacts, ServerFacts
from .hostbudget import HibernatedKernel, Want, hibernated_kernels
from .pressure import SwapFacts, swap_facts


class ReportError(ValueError):
    """The body is not a report; the message says what is wrong."""


# --- the schema: every field the culler reads, its type and limits, in one place ------------
# A report is checked against this before anything in it is used: a field of the wrong type,
# a number that is not finite or out of range, a text or list too long is refused with a 400
# naming the field. Fields not listed (the extension's kernels, processes, devices, warnings,
# policy...) are not read by the culler: they are only bounded by the body's size (receiver.py's
# MAX_BODY), MAX_DEPTH and finite numbers. To read a new field, declare it here first.
MAX_DEPTH = 8  # nesting of objects and lists anywhere in the body
MAX_MIB = 16 * 1024 * 1024  # GPU memory in MiB: 16 TiB, far above any server's
MAX_CULLED = 64  # culled_kernels per report (the extension sends its last 50)
MAX_TIME_TEXT = 64  # an ISO 8601 time
MAX_PROCESSES = 1024  # GPU processes and kernels per report
MAX_DEVICES = 128  # devices per report: 8 GPUs x 7 MIG instances with room to spare


@dataclass(frozen=True)
class Spec:
    """One field: `kind` is "bool", "number", "text", "time", "list" or "object"; None (null)
    is allowed for a field and means absent (never for a list's item). `size`: most
    characters (text) or items (list); `low`/`high`: the range of a number; `items`: a list's
    item; `fields`: an object's."""

    kind: str
    size: int = 0
    low: float = 0.0
    high: float = MAX_MIB
    items: Spec | None = None
    fields: Mapping[str, Spec] = field(default_factory=dict)
    required: tuple[str, ...] = ()  # of an object's fields: must be there and not null


TIME = Spec("time", MAX_TIME_TEXT)
MIB = Spec("number")
KERNEL_ID = Spec("text", 64)
GPU_EVENT = Spec(
    "object",
    fields={"kernel_id": KERNEL_ID, "at": TIME, "gpu_memory_mib": MIB,
            "seconds": Spec("number", high=86400.0), "why": Spec("text", 200)},
    required=("kernel_id", "at"),
)  # fmt: skip
REPORT = Spec(
    "object",
    fields={
        "server_name": Spec("text", 255),
        "available": Spec("bool"),
        "reason": Spec("text", 4096),
        "sampled_at": TIME,
        "monitor_started": TIME,
        "server_last_activity": TIME,
        "user_last_activity": TIME,
        "gpu_idle_since": TIME,
        "last_gpu_activity": TIME,
        "gpu_memory_mib": MIB,
        "gpu_activity_known": Spec("bool"),
        "gpu_unknown_reasons": Spec("list", 32, items=Spec("text", 500)),
        "culled_kernels": Spec(
            "list",
            MAX_CULLED,
            items=Spec(
                "object",
                fields={"id": KERNEL_ID, "at": TIME, "gpu_memory_mib": MIB},
                required=("id",),
            ),
        ),
        "slice": Spec("object", fields={"pool": Spec("text", 63)}),
        # where the readings come from: "nvml", "simulated" (the demo's GPU), ...
        "source": Spec("text", 32),
        # whether a person is at a JupyterLab tab of the server (serverext/presence.py)
        "presence": Spec(
            "object",
            fields={
                "known": Spec("bool"),
                "present": Spec("bool"),
                "in_session": Spec("bool"),
                "elsewhere": Spec("bool"),
                # the last moment a person was seen at a tab of it (away.py)
                "last_present": TIME,
            },
        ),
        # over-commit and swap (issue 26; culler/pressure.py): the physical GPUs the server
        # sees (NVML UUID, size, the device's used memory), its processes on each, its kernels'
        # idleness and the kernels waiting to resume for want of room (serverext/swap.py)
        "devices": Spec(
            "list",
            MAX_DEVICES,
            items=Spec(
                "object",
                fields={
                    "index": Spec("text", 16),
                    "uuid": Spec("text", 96),
                    "memory_total_mib": MIB,
                    "memory_used_mib": MIB,
                },
            ),
        ),
        "processes": Spec(
            "list",
            MAX_PROCESSES,
            items=Spec(
                "object",
                fields={
                    "kernel_id": KERNEL_ID,
                    "device": Spec("text", 16),
                    "gpu_memory_mib": MIB,
                    "matched": Spec("bool"),
                },
            ),
        ),
        "kernels": Spec(
            "list",
            MAX_PROCESSES,
            items=Spec(
                "object",
                fields={
                    "id": KERNEL_ID,
                    "execution_state": Spec("text", 32),
                    "last_activity": TIME,
                    "last_gpu_activity": TIME,
                    "gpu_memory_mib": MIB,
                    "gpu_utilization": Spec("number", high=100.0 * 16),
                    "gpu_activity_known": Spec("bool"),
                    "hibernation": Spec(
                        "object",
                        fields={
                            "state": Spec("text", 32),
                            "next_try": TIME,
                            # host memory per node (hostbudget.py)
                            "hibernated_gpu_memory_mib": MIB,
                            "hibernated_since": TIME,
                            "waiting_for_gpu": Spec("bool"),
                        },
                    ),
                },
                required=("id",),
            ),
        ),
        "swap": Spec(
            "object",
            fields={
                "waiting": Spec(
                    "list",
                    MAX_CULLED,
                    items=Spec(
                        "object",
                        fields={
                            "kernel_id": KERNEL_ID,
                            "gpu_memory_mib": MIB,
                            "since": TIME,
                            "device": Spec("text", 96),
                        },
                        required=("kernel_id",),
                    ),
                ),
                # kernels it would hibernate, waiting for room in its node's host memory
                # budget (hostbudget.plan_room; serverext/swap.py `host_gate`)
                "hibernate_wanted": Spec(
                    "list",
                    MAX_CULLED,
                    items=Spec(
                        "object",
                        fields={"kernel_id": KERNEL_ID, "gpu_memory_mib": MIB},
                        required=("kernel_id",),
                    ),
                ),
            },
        ),
        # GPU hibernation (issue 22; fracspawner/serverext/hibernate.py): GPU memory its
        # suspended kernels hold in host memory, and its recent suspends and resumes
        "hibernated_gpu_memory_mib": MIB,
        "hibernation": Spec(
            "object",
            fields={
                "hibernated_gpu_memory_mib": MIB,
                "hibernations": Spec("list", MAX_CULLED, items=GPU_EVENT),
                "resumes": Spec("list", MAX_CULLED, items=GPU_EVENT),
            },
        ),
    },
)


def check(value: object, spec: Spec, where: str) -> None:
    """Raise ReportError naming `where` when `value` does not fit `spec` (None fits a field,
    never a list's item)."""
    if value is None:
        return
    kind = spec.kind
    if kind == "bool" and not isinstance(value, bool):
        raise ReportError(f"{where}: expected true or false")
    if kind == "number":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ReportError(f"{where}: expected a number")
        if not (math.isfinite(value) and spec.low <= value <= spec.high):
            raise ReportError(f"{where}: expected a number from {spec.low:g} to {spec.high:g}")
    if kind in ("text", "time"):
        if not isinstance(value, str):
            raise ReportError(f"{where}: expected a string, got {type(value).__name__}")
        if len(value) > spec.size:
            raise ReportError(f"{where}: at most {spec.size} characters")
    if kind == "list":
        if not isinstance(value, list):
            raise ReportError(f"{where}: expected a list, got {type(value).__name__}")
        if len(value) > spec.size:
            raise ReportError(f"{where}: at most {spec.size} items")
        for i, item in enumerate(value):
            if item is None:  # null means absent for a field; a list has no absent items
                raise ReportError(f"{where}[{i}]: expected a value, got null")
            check(item, spec.items or Spec("text"), f"{where}[{i}]")
    if kind == "object":
        if not isinstance(value, dict):
            raise ReportError(f"{where}: expected an object, got {type(value).__name__}")
        for name in spec.required:
            if value.get(name) is None:
                raise ReportError(f"{where}.{name}: required")
        for name, sub in spec.fields.items():
            check(value.get(name), sub, f"{where}.{name}" if where else name)


def depth(value: object, limit: int = MAX_DEPTH) -> None:
    """Raise ReportError when objects and lists nest deeper than `limit` (no recursion)."""
    stack = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            if level > limit:
                raise ReportError(f"nested deeper than {limit} levels")
            children = item.values() if isinstance(item, dict) else item
            stack.extend((v, level + 1) for v in children)


def _not_finite(name: str) -> float:
    raise ReportError(f"{name} is not a number (JSON has no NaN or Infinity)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400 parses to inf
        raise ReportError(f"{text[:20]} is out of range")
    return value


def load_report(body: bytes) -> dict:
    """The body -> a report object checked against REPORT (strict JSON: no NaN, Infinity,
    overlong numbers, nesting deeper than MAX_DEPTH). Raises ReportError."""
    try:
        value = json.loads(body or b"null", parse_constant=_not_finite, parse_float=_finite_float)
    except RecursionError:
        raise ReportError(f"nested deeper than {MAX_DEPTH} levels") from None
    except ReportError:
        raise
    except ValueError as exc:  # also UnicodeDecodeError, and ints over 4300 digits
        raise ReportError(f"the body is not JSON ({str(exc)[:80]})") from None
    if not isinstance(value, dict):
        raise ReportError("the report must be a JSON object")
    depth(value)
    check(value, REPORT, "")
    return value


def shown(text: str) -> str:
    """Text from a report as it may appear in a log line: no line breaks or control characters
    (escaped as in Python literals), so a report cannot forge log lines."""
    if text.isprintable():
        return text
    escape = lambda c: c.encode("unicode_escape").decode("ascii")  # noqa: E731
    return "".join(c if c.isprintable() else escape(c) for c in text)


def _ts(report: dict, key: str, ceiling: float) -> float | None:
    value = report.get(key)
    if value in (None, ""):
        return None
    if not isinstance(value, str):
        raise ReportError(f"{key}: expected an ISO 8601 time, got {type(value).__name__}")
    try:
        return min(isoparse(value).timestamp(), ceiling)
    except (ValueError, OverflowError):
        raise ReportError(f"{key}: {shown(value[:40])!r} is not an ISO 8601 time") from None


def _number(report: dict, key: str) -> float:
    return float(report.get(key) or 0)  # checked against REPORT: finite, 0 to MAX_MIB


@dataclass(frozen=True)
class CulledKernel:
    id: str
    at: float
    gpu_memory_mib: float


@dataclass(frozen=True)
class GpuEvent:
    """A kernel hibernated or resumed by its server (counted once, like a culled kernel)."""

    kind: str  # "hibernate" | "resume"
    kernel_id: str
    at: float
    gpu_memory_mib: float
    seconds: float


@dataclass(frozen=True)
class ServerReport:
    received_at: float
    monitor_started: float | None
    server_last_activity: float | None  # the server's activity, GPU work included
    user_last_activity: float | None  # the same without GPU work
    gpu: GpuFacts | None  # None: the server could not read its GPU (the reason says why)
    reason: str = ""
    culled_kernels: tuple[CulledKernel, ...] = ()
    # the pool the server says it is in (FRACSPAWNER_GPU_POOL): never used for metrics or the
    # history, which take the pool from the hub's record of the server (app.Culler.claim)
    pool: str = ""
    # GPU memory its hibernated kernels hold in host memory, a copy under way included
    hibernated_mib: float = 0.0
    # its GPU is the demo's simulated one (the readings' source): the admin page says so
    simulated: bool = False
    gpu_events: tuple[GpuEvent, ...] = ()
    # a person at a tab of the server (True/False), None: no tab reports presence
    present: bool | None = None
    # a hidden tab of a person seen within the session timeout (serverext/presence.py)
    in_session: bool = False
    # in session only by the culler's word about another server of the user's (never evidence)
    elsewhere: bool = False
    # the last moment a person was seen at a tab of it (None: no tab of it ever reported one)
    last_present: float | None = None
    # a kernel of it executes code now (execution_state "busy"): a cell is running
    executing: bool = False
    # its devices and kernels as over-commit's swap reads them (pressure.swap_facts)
    swap: SwapFacts = SwapFacts()
    # its kernels whose GPU state is in host memory (hostbudget.py: the budget per node)
    hibernated_kernels: tuple[HibernatedKernel, ...] = ()
    # kernels it would hibernate, waiting for room in its node's host budget (hostbudget.py)
    host_wants: tuple[Want, ...] = ()


def host_wants(report: dict) -> tuple[Want, ...]:
    """A checked report's kernels waiting for host room to hibernate (each named once)."""
    out: dict[str, Want] = {}
    for w in (report.get("swap") or {}).get("hibernate_wanted") or []:
        out.setdefault(str(w["kernel_id"]), Want(str(w["kernel_id"]), _number(w, "gpu_memory_mib")))
    return tuple(out.values())


def parse_report(report: object, received_at: float, *, checked: bool = False) -> ServerReport:
    """The extension's JSON -> facts (pure). Raises ReportError for anything malformed.
    `checked`: `report` is what load_report returned (depth and schema already checked)."""
    if not isinstance(report, dict):
        raise ReportError("the report must be a JSON object")
    if not checked:
        depth(report)
        check(report, REPORT, "")
    ts = lambda key: _ts(report, key, received_at)  # noqa: E731
    culled = []
    for entry in report.get("culled_kernels") or []:
        culled.append(
            CulledKernel(
                shown(entry["id"]), _ts(entry, "at", received_at) or received_at,
                _number(entry, "gpu_memory_mib"),
            )
        )  # fmt: skip
    pool = (report.get("slice") or {}).get("pool")
    hibernation = report.get("hibernation") or {}
    events = [
        GpuEvent(
            kind, shown(e["kernel_id"]), _ts(e, "at", received_at) or received_at,
            _number(e, "gpu_memory_mib"), float(e.get("seconds") or 0),
        )
        for kind, key in (("hibernate", "hibernations"), ("resume", "resumes"))
        for e in hibernation.get(key) or []
    ]  # fmt: skip
    presence = report.get("presence") or {}
    present = bool(presence.get("present")) if presence.get("known") else None
    common = dict(
        swap=swap_facts(report, received_at),
        hibernated_kernels=hibernated_kernels(report, received_at),
        host_wants=host_wants(report),
        present=present,
        # in session by its own tabs: the culler's word about another server is not counted
        # here (it keeps kernels from shutdown, not an idle slice from server_gpu_idle)
        in_session=bool(
            presence.get("known") and presence.get("in_session") and not presence.get("elsewhere")
        ),
        elsewhere=bool(presence.get("elsewhere")),
        last_present=_ts(presence, "last_present", received_at),
        executing=any(
            isinstance(k, dict) and k.get("execution_state") == "busy"
            for k in report.get("kernels") or []
        ),
        hibernated_mib=_number(report, "hibernated_gpu_memory_mib"),
        simulated=report.get("source") == "simulated",
        gpu_events=tuple(events),
        pool=pool or "",
        received_at=received_at,
        monitor_started=ts("monitor_started"),
        server_last_activity=ts("server_last_activity"),
        user_last_activity=ts("user_last_activity"),
        culled_kernels=tuple(culled),
    )
    if not report.get("available"):
        reason = shown((report.get("reason") or "unavailable")[:200])
        return ServerReport(gpu=None, reason=reason, **common)
    observed = ts("sampled_at")
    if observed is None:
        raise ReportError("sampled_at: required when available")
    started = common["monitor_started"] or observed
    memory = _number(report, "gpu_memory_mib")
    if report.get("gpu_activity_known") is False:
        reasons = report.get("gpu_unknown_reasons") or ["unknown"]
        note = "; ".join(shown(r[:120]) for r in reasons[:3] if r is not None)
        gpu = GpuFacts("extension", observed, memory, None, None, note)
    else:
        # never seen busy or unknown: idle at least since the monitor started watching; and
        # never idle for longer than that: an idle start before it (a malformed or forged
        # report) would pass for a history the report does not cover
        since = max(ts("gpu_idle_since") or ts("last_gpu_activity") or started, started)
        gpu = GpuFacts(
            source="extension",
            observed_at=observed,
            memory_mib=memory,
            idle_for=max(0.0, observed - since),
            covered_for=max(0.0, observed - started),
        )
    return ServerReport(gpu=gpu, **common)


# --- what the store keeps per server: bounded, whatever the server sends ---------------------
KERNELS_KEPT = 512  # culled kernel ids remembered per server (to count each once)
KERNEL_AGE = 24 * 3600.0  # a cull older than this (by its clamped time) is neither counted nor kept
SERVERS_PER_USER = 64  # servers one user's tokens may keep reports for at once
EVENTS_PER_HOUR = 60  # kernel shutdowns (and as many hibernations) counted per server an hour


@dataclass
class _Entry:
    report: ServerReport
    # culled kernel id -> when: counted once per server, across its restarts; newest last
    counted: OrderedDict[str, float] = field(default_factory=OrderedDict)
    # hibernate/resume events seen ("kind kernel at" -> at), and those not yet taken for metrics
    events_seen: OrderedDict[str, float] = field(default_factory=OrderedDict)
    events_new: list[GpuEvent] = field(default_factory=list)
    # kernel culls told and not taken yet (taken once the hub has listed the server)
    culled_new: list[CulledKernel] = field(default_factory=list)
    # when culls and hibernation events were taken in the last hour (EVENTS_PER_HOUR)
    taken: dict[str, deque[float]] = field(
        default_factory=lambda: {"culled": deque(), "events": deque()}
    )


def _within(taken: deque[float], items: list, now: float, per_hour: int) -> list:
    """The first of `items` that fit in the hour's budget; `taken` holds when each was."""
    while taken and taken[0] <= now - 3600:
        taken.popleft()
    room = max(per_hour - len(taken), 0)
    kept = items[:room]
    taken.extend(now for _ in kept)
    return kept


#: how long before its server's start a report's monitor may have started and still be its
#: own (the hub's, the API server's and the server's clocks differ)
INCARNATION_SLACK = 60.0


def this_incarnation(
    report: ServerReport | None, *started: float | None, slack: float = INCARNATION_SLACK
) -> ServerReport | None:
    """`report` where it is the server's current incarnation's; None where its monitor started
    before the server did (`started`: when, by each source that knows, unix seconds; the latest
    counts). A restarted server keeps its name, and its previous incarnation's report says
    nothing of what the new one holds: it counts as no report (unknown is never free)."""
    began = report.monitor_started if report is not None else None
    known = [t for t in started if t is not None]
    if began is not None and known and began < max(known) - slack:
        return None
    return report


class ReportStore:
    """The latest report of every server, keyed by (user, server name); in memory.

    Bounded: one report per server, at most KERNELS_KEPT kernel ids per server, none older than
    KERNEL_AGE, at most SERVERS_PER_USER servers per user (their token names the server)."""

    def __init__(
        self,
        kernels_kept: int = KERNELS_KEPT,
        kernel_age: float = KERNEL_AGE,
        servers_per_user: int = SERVERS_PER_USER,
    ) -> None:
        self._entries: dict[tuple[str, str], _Entry] = {}
        self._per_user: Counter[str] = Counter()
        self.kernels_kept, self.kernel_age = kernels_kept, kernel_age
        self.servers_per_user = servers_per_user

    def __len__(self) -> int:
        return len(self._entries)

    def kernels_held(self) -> int:
        """Kernel ids remembered in all (for tests and metrics)."""
        return sum(len(e.counted) for e in self._entries.values())

    def put(self, user: str, server: str, report: ServerReport) -> list[CulledKernel]:
        """Keep the report; return the kernel culls it is the first to tell of (each counted
        once per server, also across restarts). Raises ReportError past SERVERS_PER_USER."""
        key = (user, server)
        entry = self._entries.get(key)
        if entry is None:
            if self._per_user[user] >= self.servers_per_user:
                raise ReportError(
                    f"reports are kept for at most {self.servers_per_user} servers per user"
                )
            entry = self._entries[key] = _Entry(report)
            self._per_user[user] += 1
        entry.report = report
        oldest = report.received_at - self.kernel_age
        counted = entry.counted
        while counted and next(iter(counted.values())) < oldest:
            counted.popitem(last=False)
        seen = entry.events_seen
        while seen and next(iter(seen.values())) < oldest:
            seen.popitem(last=False)
        for event in report.gpu_events:
            key = f"{event.kind} {event.kernel_id} {event.at}"
            if event.at < oldest or key in seen:
                continue
            seen[key] = event.at
            entry.events_new.append(event)
            if len(seen) > self.kernels_kept:
                seen.popitem(last=False)
        del entry.events_new[: -self.kernels_kept]
        new = []
        for kernel in report.culled_kernels:
            if kernel.at < oldest or kernel.id in counted:
                continue
            new.append(kernel)
            counted[kernel.id] = kernel.at
            if len(counted) > self.kernels_kept:
                counted.popitem(last=False)
        entry.culled_new.extend(new)
        del entry.culled_new[: -self.kernels_kept]
        return new

    def take_new(
        self, user: str, server: str, now: float, per_hour: int = EVENTS_PER_HOUR
    ) -> tuple[list[CulledKernel], list[GpuEvent], int]:
        """The kernel culls and hibernation events not taken before, each kind at most
        `per_hour` per server in any hour (by `now`, the culler's clock); and how many were
        dropped for that bound. Dropped ones are never taken later."""
        entry = self._entries.get((user, server))
        if entry is None:
            return [], [], 0
        culled, entry.culled_new = entry.culled_new, []
        events, entry.events_new = entry.events_new, []
        kept_culled = _within(entry.taken["culled"], culled, now, per_hour)
        kept_events = _within(entry.taken["events"], events, now, per_hour)
        return (
            kept_culled,
            kept_events,
            len(culled) + len(events) - len(kept_culled) - len(kept_events),
        )

    def latest(self) -> list[tuple[str, str, ServerReport]]:
        """(user, server, its latest report) of every server."""
        return [(u, s, e.report) for (u, s), e in self._entries.items()]

    def get(self, user: str, server: str) -> ServerReport | None:
        """The server's latest report, or None."""
        entry = self._entries.get((user, server))
        return None if entry is None else entry.report

    def waits(self, user: str, server: str) -> bool:
        """Whether the server's latest report has kernels waiting to resume for want of room."""
        entry = self._entries.get((user, server))
        return entry is not None and any(g.waiting for g in entry.report.swap.gpus)

    def hibernated(self) -> list[tuple[str, str, float]]:
        """(user, server, GPU memory its hibernated kernels hold) of every server's report."""
        return [(u, s, e.report.hibernated_mib) for (u, s), e in self._entries.items()]

    def for_server(
        self, facts: ServerFacts, slack: float = INCARNATION_SLACK
    ) -> ServerReport | None:
        """The report of this incarnation of the server (a previous one's does not count)."""
        entry = self._entries.get((facts.user, facts.name))
        report = entry.report if entry is not None else None
        return this_incarnation(report, facts.started, slack=slack)

    def prune(self, before: float) -> None:
        """Forget servers that have not reported since `before` (stopped, or silent)."""
        for key, entry in list(self._entries.items()):
            if entry.report.received_at < before:
                self.forget(*key)

    def forget(self, user: str, server: str) -> None:
        if self._entries.pop((user, server), None) is not None:
            self._per_user[user] -= 1
            if self._per_user[user] <= 0:
                del self._per_user[user]
