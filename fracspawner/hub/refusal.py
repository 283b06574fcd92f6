"""A refused spawn as JupyterHub shows it: a person's sentence, not "HTTP 400: Bad Request (...)".

JupyterHub's spawn page prints `str(exception)` unless the exception carries
`jupyterhub_message` (jupyterhub.utils.format_exception; the API's write_error reads it too, in
JupyterHub 4+), so the REST API answers 400 with the same sentence as its message.
"""

from __future__ import annotations

import logging
import weakref

from tornado import web

__all__ = [
    "ExpectedRefusals",
    "capacity_refusal",
    "gave_up",
    "install_log_filter",
    "refused",
    "start_failed",
]


def refused(message: str) -> web.HTTPError:
    """A 400 whose message, on the form ("Error: <message>", escaped by JupyterHub's template)
    and in the REST API's JSON, is just the sentence."""
    error = web.HTTPError(400, "%s", message)  # "%s": a '%' in user text is not a format
    return _expected(error, message)


def gave_up(message: str) -> web.HTTPError:
    """A queued spawn that waited its whole `queue_timeout`: 429, the status of JupyterHub's
    own refusals for capacity (`concurrent_spawn_limit`, `active_server_limit`:
    jupyterhub/handlers/base.py), shown as "Spawn failed: <message>" on the pending page
    (jupyterhub/apihandlers/users.py's progress handler words the spawn's exception with
    format_exception, which prefers `jupyterhub_message`).

    Not a 5xx: JupyterHub counts a spawn that ends in a 5xx toward
    `Spawner.consecutive_failure_limit` and exits at it ("increment on error only, not on
    handled rejections", base.py `_track_failure_count`). z2jh sets that limit to 5
    (hub.consecutiveFailureLimit), so five people in a row giving up their place in a full
    pool restarted the hub, and everyone else's place in line went with it."""
    return capacity_refusal(message)


def capacity_refusal(message: str) -> web.HTTPError:
    """A spawn refused for want of capacity, after the form: 429, in the user's words."""
    error = web.HTTPError(429, "%s", message)
    return _expected(error, message)


def start_failed(message: str) -> web.HTTPError:
    """A spawn whose pod can never start by itself (an image that is not in its registry, a
    server that exits at once): 500, shown as "Spawn failed: <message>" on the pending page.
    Not a refusal: the hub logs it at ERROR, for the administrator it asks to act, and it
    counts toward `consecutive_failure_limit` as the start_timeout it replaces did."""
    error = web.HTTPError(500, "%s", message)
    error.jupyterhub_message = message  # type: ignore[attr-defined]
    return error


#: fracspawner's refusals not yet collected: JupyterHub's "Error starting" lines carry only the
#: text of the exception, so a line is fracspawner's when it ends with one of these (alive while
#: JupyterHub logs it: the spawn's future holds it)
_LIVE: weakref.WeakSet[web.HTTPError] = weakref.WeakSet()


def _expected(error: web.HTTPError, message: str) -> web.HTTPError:
    # both the spawn form and the API's write_error prefer this to str(error)
    error.jupyterhub_message = message  # type: ignore[attr-defined]
    error.fracspawner_expected = True  # type: ignore[attr-defined]
    _LIVE.add(error)
    return error


def _is_ours(line: str) -> bool:
    """Whether a logged line ends with one of fracspawner's live refusals, as it reads now
    (JupyterHub sets its `reason` to 'error' between its two lines)."""
    return any(line.endswith(f": {error}") for error in list(_LIVE))


class ExpectedRefusals(logging.Filter):
    """A refused spawn is the spawner doing its job: one line at INFO, not ERROR + traceback.

    JupyterHub logs every spawn the spawner refuses twice at ERROR, once with a traceback:
    `User.spawn` ("Error starting <user>'s server: HTTP 400: ...", jupyterhub/user.py) and the
    form's SpawnHandler.post ("Failed to spawn single-user server with form", exc_info=True,
    jupyterhub/handlers/pages.py). For fracspawner's own refusals (`refused`, `gave_up`) this
    filter turns the first into INFO, the second into one INFO line with the reason, and
    leaves every other error as it is."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.ERROR:
            return True
        exc = record.exc_info[1] if record.exc_info else None
        if getattr(exc, "fracspawner_expected", False):
            said = record.getMessage()
            record.msg = "%s (refused by fracspawner): %s"
            record.args = (said, getattr(exc, "jupyterhub_message", exc))
            record.exc_info = record.exc_text = None
            _downgrade(record)
        elif isinstance(record.msg, str) and record.msg.startswith("Error starting "):
            # "... server: HTTP 400: Bad Request (<message>)", logged without the exception:
            # only a line about one of fracspawner's own refusals; any other 400/429 (JupyterHub's,
            # kubespawner's, a hook's) stays ERROR
            if _is_ours(record.getMessage()):
                _downgrade(record)
        return True


def _downgrade(record: logging.LogRecord) -> None:
    record.levelno = logging.INFO
    record.levelname = logging.getLevelName(logging.INFO)


#: JupyterHub's logger (traitlets names it after the app class) and tornado's, which
#: jupyterhub/user.py logs to (`log = app_log`)
HUB_LOGGERS = ("JupyterHub", "tornado.application")


def install_log_filter(logger: logging.Logger | None = None) -> None:
    """Add ExpectedRefusals once to `logger`, or to the hub's loggers; `fracspawner.configure`
    and FracSpawner itself call it."""
    for target in [logger] if logger is not None else map(logging.getLogger, HUB_LOGGERS):
        if not any(isinstance(f, ExpectedRefusals) for f in target.filters):
            target.addFilter(ExpectedRefusals())
