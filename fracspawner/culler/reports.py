"""GPU reports that servers push to the culler: parsing (pure) and the latest one per server.

A report is the notebook extension's JSON (fracspawner.serverext, docs/serverext.md). It is the
server's own word, so it may only ever help its own server: the identity comes from the token
it was sent with (identity.py), never from the body, and every time in it is clamped to the
moment it arrived. An "unavailable" report (no GPU readable) still carries the server's own
activity, which is kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dateutil.parser import isoparse

from .decide import GpuFacts, ServerFacts


class ReportError(ValueError):
    """The body is not a report; the message says what is wrong."""


def _ts(report: dict, key: str, ceiling: float) -> float | None:
    value = report.get(key)
    if value in (None, ""):
        return None
    if not isinstance(value, str):
        raise ReportError(f"{key}: expected an ISO 8601 time, got {type(value).__name__}")
    try:
        return min(isoparse(value).timestamp(), ceiling)
    except (ValueError, OverflowError):
        raise ReportError(f"{key}: {value[:40]!r} is not an ISO 8601 time") from None


def _number(report: dict, key: str) -> float:
    value = report.get(key) or 0
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ReportError(f"{key}: expected a number >= 0")
    return float(value)


@dataclass(frozen=True)
class CulledKernel:
    id: str
    at: float
    gpu_memory_mib: float


@dataclass(frozen=True)
class ServerReport:
    received_at: float
    monitor_started: float | None
    server_last_activity: float | None  # the server's activity, GPU work included
    user_last_activity: float | None  # the same without GPU work
    gpu: GpuFacts | None  # None: the server could not read its GPU (the reason says why)
    reason: str = ""
    culled_kernels: tuple[CulledKernel, ...] = ()
    pool: str = ""  # the pool the server says it is in (FRACSPAWNER_GPU_POOL): a label only


def parse_report(report: object, received_at: float) -> ServerReport:
    """The extension's JSON -> facts (pure). Raises ReportError for anything malformed."""
    if not isinstance(report, dict):
        raise ReportError("the report must be a JSON object")
    ts = lambda key: _ts(report, key, received_at)  # noqa: E731
    culled = []
    for entry in report.get("culled_kernels") or []:
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
            raise ReportError("culled_kernels: expected objects with an id")
        culled.append(
            CulledKernel(
                entry["id"][:64], _ts(entry, "at", received_at) or received_at,
                _number(entry, "gpu_memory_mib"),
            )
        )  # fmt: skip
    slice_info = report.get("slice") if isinstance(report.get("slice"), dict) else {}
    pool = slice_info.get("pool")
    common = dict(
        pool=pool[:63] if isinstance(pool, str) else "",
        received_at=received_at,
        monitor_started=ts("monitor_started"),
        server_last_activity=ts("server_last_activity"),
        user_last_activity=ts("user_last_activity"),
        culled_kernels=tuple(culled),
    )
    if not report.get("available"):
        reason = str(report.get("reason") or "unavailable")[:200]
        return ServerReport(gpu=None, reason=reason, **common)
    observed = ts("sampled_at")
    if observed is None:
        raise ReportError("sampled_at: required when available")
    started = common["monitor_started"] or observed
    memory = _number(report, "gpu_memory_mib")
    if report.get("gpu_activity_known") is False:
        reasons = report.get("gpu_unknown_reasons") or ["unknown"]
        note = "; ".join(str(r)[:120] for r in reasons[:3])
        gpu = GpuFacts("extension", observed, memory, None, None, note)
    else:
        # never seen busy or unknown: idle at least since the monitor started watching
        since = ts("gpu_idle_since") or ts("last_gpu_activity") or started
        gpu = GpuFacts(
            source="extension",
            observed_at=observed,
            memory_mib=memory,
            idle_for=max(0.0, observed - since),
            covered_for=max(0.0, observed - started),
        )
    return ServerReport(gpu=gpu, **common)


@dataclass
class _Entry:
    report: ServerReport
    counted: set[str] = field(default_factory=set)  # culled kernels already counted


class ReportStore:
    """The latest report of every server, keyed by (user, server name); in memory."""

    def __init__(self) -> None:
        self._entries: dict[tuple[str, str], _Entry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, user: str, server: str, report: ServerReport) -> list[CulledKernel]:
        """Keep the report; return the kernel culls it is the first to tell of."""
        entry = self._entries.get((user, server))
        if entry is None or (
            entry.report.monitor_started != report.monitor_started
        ):  # a new incarnation of the server
            entry = self._entries[(user, server)] = _Entry(report)
        entry.report = report
        new = [k for k in report.culled_kernels if k.id not in entry.counted]
        entry.counted.update(k.id for k in new)
        return new

    def for_server(self, facts: ServerFacts, slack: float = 60.0) -> ServerReport | None:
        """The report of this incarnation of the server (a previous one's does not count)."""
        entry = self._entries.get((facts.user, facts.name))
        if entry is None:
            return None
        started = entry.report.monitor_started
        if facts.started is not None and started is not None and started < facts.started - slack:
            return None
        return entry.report

    def prune(self, before: float) -> None:
        """Forget servers that have not reported since `before` (stopped, or silent)."""
        for key, entry in list(self._entries.items()):
            if entry.report.received_at < before:
                del self._entries[key]

    def forget(self, user: str, server: str) -> None:
        self._entries.pop((user, server), None)
