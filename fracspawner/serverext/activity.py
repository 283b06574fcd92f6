"""The server's activity with and without GPU work, from jupyter-server's own settings.

jupyter-server's `ServerWebApplication.last_activity()` is the newest of the start time, the
kernels' activity (`kernel_manager.last_kernel_activity`), every settings key ending in
`_last_activity` (API requests, terminals, extensions: ours writes GPU work there) and
`last_activity_times`. The user's activity is the same without our GPU key: GPU work keeps a
server alive, but is not a user at the keyboard (a neighbour's work on a shared GPU, a job
nobody watches).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

GPU_ACTIVITY_KEY = "fracspawner_gpu_last_activity"  # monitor.SETTINGS_KEY


def _sources(settings: Mapping[str, Any], skip: frozenset[str]) -> list[datetime]:
    times: list[datetime | None] = [settings.get("started")]
    km = settings.get("kernel_manager")
    times.append(getattr(km, "last_kernel_activity", None))
    times += [v for k, v in settings.items() if k.endswith("_last_activity") and k not in skip]
    times += list((settings.get("last_activity_times") or {}).values())
    return [t for t in times if isinstance(t, datetime)]


def server_activity(settings: Mapping[str, Any]) -> datetime | None:
    """What `ServerApp.last_activity()` says (GPU work included), None if nothing is known."""
    times = _sources(settings, frozenset())
    return max(times) if times else None


def user_activity(settings: Mapping[str, Any]) -> datetime | None:
    """The newest activity that is not GPU work: API requests, kernel messages, terminals."""
    times = _sources(settings, frozenset({GPU_ACTIVITY_KEY}))
    return max(times) if times else None
