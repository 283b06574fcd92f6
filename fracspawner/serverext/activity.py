"""The server's activity with and without GPU work, from jupyter-server's own settings.

jupyter-server's `ServerWebApplication.last_activity()` is the newest of the start time, the
kernels' activity (`kernel_manager.last_kernel_activity`), every settings key ending in
`_last_activity` (API requests, terminals, extensions: ours writes GPU work and the person's
presence there) and `last_activity_times`. The user's activity is the same without our GPU key:
GPU work keeps a server alive, but is not a user at the keyboard (a neighbour's work on a shared
GPU, a job nobody watches).

Where a JupyterLab tab reports presence (presence.py), the API requests (`api_last_activity`)
are left out of both: an open tab polls the REST API every 10 s whether anyone looks at it or
not, and the person's presence, kernel messages and terminals say what is real. The requests
of the user's other clients (VS Code, scripts, `jupyter console`: no browser page behind them,
clients.py) still count, under their own key. Where no tab reports, every API request counts as
before (an older JupyterLab: unknown is never idle).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from .presence import SETTINGS_KEY, Presence, utcnow

GPU_ACTIVITY_KEY = "fracspawner_gpu_last_activity"  # monitor.SETTINGS_KEY
API_ACTIVITY_KEY = "api_last_activity"  # jupyter_server.base.handlers.APIHandler


def presence_of(settings: Mapping[str, Any]) -> Presence | None:
    found = settings.get(SETTINGS_KEY)
    return found if isinstance(found, Presence) else None


def _sources(settings: Mapping[str, Any], skip: set[str], now: datetime | None) -> list[datetime]:
    presence = presence_of(settings)
    if presence is not None and presence.known(now):
        skip = skip | {API_ACTIVITY_KEY}  # the tab's polling is not a person
    times: list[datetime | None] = [settings.get("started")]
    km = settings.get("kernel_manager")
    times.append(getattr(km, "last_kernel_activity", None))
    times += [v for k, v in settings.items() if k.endswith("_last_activity") and k not in skip]
    times += list((settings.get("last_activity_times") or {}).values())
    if presence is not None:
        times.append(presence.last_present(now))
    return [t for t in times if isinstance(t, datetime)]


def server_activity(settings: Mapping[str, Any], now: datetime | None = None) -> datetime | None:
    """What `ServerApp.last_activity()` says (GPU work included), the polling left out where a
    tab reports presence; None if nothing is known."""
    times = _sources(settings, set(), now or utcnow())
    return max(times) if times else None


def user_activity(settings: Mapping[str, Any], now: datetime | None = None) -> datetime | None:
    """The newest activity that is not GPU work: presence, kernel messages, terminals, API
    requests (these only where no tab reports presence)."""
    times = _sources(settings, {GPU_ACTIVITY_KEY}, now or utcnow())
    return max(times) if times else None


def in_session(settings: Mapping[str, Any], now: datetime | None = None) -> bool:
    """Whether a person is in session at this server (presence.py): present, or a tab of theirs
    open and hidden while they were seen within the session timeout. Their kernels may then be
    hibernated, never shut down."""
    presence = presence_of(settings)
    return presence is not None and presence.in_session(now or utcnow())


def presence_json(settings: Mapping[str, Any], now: datetime | None = None) -> dict | None:
    """The presence part of the report (None: the extension keeps no presence)."""
    presence = presence_of(settings)
    return None if presence is None else presence.as_json(now)
