"""The API requests of the user's other clients, told apart from a JupyterLab page's polling.

While a tab reports presence, activity.py leaves jupyter-server's `api_last_activity` out: an
open JupyterLab page polls the REST API every 10 s whether anyone looks at it or not. But the
same server also serves the user's other clients - VS Code's Jupyter extension (it runs in
VS Code's Node extension host), scripts, `jupyter console` and other REST clients - and their
requests are the user's work (issue 36, item 3: they stopped counting while a tab reported).

A browser marks every request with Fetch Metadata (W3C "Fetch Metadata Request Headers":
`Sec-Fetch-Site`, `Sec-Fetch-Mode`; Chrome 76, Firefox 90, Safari 16.4), which a page's script
cannot set or remove (forbidden header names). A page's own `fetch()` of this server's API is
`Sec-Fetch-Site: same-origin` with a mode other than `navigate`: that is the polling presence
stands in for (over plain HTTP, where browsers send no Fetch Metadata, a `Referer` of this
host marks a page's request). Every other request that jupyter-server counts as activity - no
Fetch Metadata at all (another program), a navigation (a person opening a URL), another site's
page - is kept under CLIENT_ACTIVITY_KEY: jupyter-server's `last_activity()` reads every
`*_last_activity` setting, and activity.py keeps this one where presence is known.

A program that sends a page's headers only hides its own requests: they stay its user's own.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

from tornado import web

from .presence import utcnow

CLIENT_ACTIVITY_KEY = "fracspawner_client_last_activity"


def from_page(headers: Any) -> bool:
    """Whether a request is a same-origin page's fetch: its Fetch Metadata says so, or, where a
    browser sends none (Fetch Metadata goes only to secure origins: HTTPS or localhost, so not to
    a hub served over plain HTTP), a `Referer` of this very host, which browsers send with a
    page's same-origin requests and programs do not."""
    site = (headers.get("Sec-Fetch-Site") or "").strip().lower()
    mode = (headers.get("Sec-Fetch-Mode") or "").strip().lower()
    if site or mode:
        return site == "same-origin" and mode not in ("", "navigate")
    referer = urlsplit((headers.get("Referer") or "").strip())
    host = (headers.get("Host") or "").strip().lower()
    return bool(host) and referer.scheme in ("http", "https") and referer.netloc.lower() == host


def counts_as_api_activity(handler: Any) -> bool:
    """jupyter-server's own rule (`APIHandler.update_api_activity`, jupyter_server/base/
    handlers.py): an authenticated API request that does not opt out (`?no_track_activity`)."""
    from jupyter_server.base.handlers import APIHandler

    return (
        isinstance(handler, APIHandler)
        and bool(getattr(handler, "_track_activity", False))
        and bool(getattr(handler, "_jupyter_current_user", None))
        and handler.get_argument("no_track_activity", None) is None
    )


def record(handler: Any) -> None:
    """After a request: keep its time where it was another client's activity."""
    if counts_as_api_activity(handler) and not from_page(handler.request.headers):
        handler.settings[CLIENT_ACTIVITY_KEY] = utcnow()


def install(web_app: Any, log: Any) -> None:
    """Look at every finished request: tornado calls `settings["log_function"]` once per
    request, after `finish()` (where jupyter-server counts it); the log goes on as before."""
    previous: Callable[[Any], None] | None = web_app.settings.get("log_function")

    def log_function(handler: Any) -> None:
        try:
            record(handler)
        except Exception:  # never fail a request's log for this
            log.debug("fracspawner: could not tell a request's client", exc_info=True)
        if previous is not None:
            previous(handler)
        else:  # tornado's own access log
            web.Application.log_request(SimpleNamespace(settings={}), handler)  # type: ignore[arg-type]

    web_app.settings["log_function"] = log_function
