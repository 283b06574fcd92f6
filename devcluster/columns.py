"""Column helpers of server-side printing, shared by tables.py and the DRA kinds' printers
(dra/printers.py): a module of its own so that tables.py may import those printers without a
cycle."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any


def human_age(timestamp: str | None, now: datetime | None = None) -> str:
    """`5s`, `3m20s`, `2h10m`, `4d`, in the style of kubectl's AGE column."""
    if not timestamp:
        return "<unknown>"
    then = datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    seconds = int(((now or datetime.now(timezone.utc)) - then).total_seconds())
    if seconds < 0:
        return "0s"
    if seconds < 120:
        return f"{seconds}s"
    minutes, hours = seconds // 60, seconds // 3600
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    return f"{hours // 24}d"


def _column(name: str, kind: str = "string", priority: int = 0, fmt: str = "") -> dict[str, Any]:
    return {"name": name, "type": kind, "format": fmt, "description": "", "priority": priority}
