"""A refused spawn as JupyterHub shows it: a person's sentence, not "HTTP 400: Bad Request (...)".

JupyterHub's spawn page prints `str(exception)` unless the exception carries
`jupyterhub_message` (jupyterhub.utils.format_exception; the API's write_error reads it too, in
JupyterHub 4+), so the REST API answers 400 with the same sentence as its message.
"""

from __future__ import annotations

from tornado import web

__all__ = ["gave_up", "refused"]


def refused(message: str) -> web.HTTPError:
    """A 400 whose message, on the form ("Error: <message>", escaped by JupyterHub's template)
    and in the REST API's JSON, is just the sentence."""
    error = web.HTTPError(400, "%s", message)  # "%s": a '%' in user text is not a format
    # both the spawn form and the API's write_error prefer this to str(error)
    error.jupyterhub_message = message  # type: ignore[attr-defined]
    return error


def gave_up(message: str) -> web.HTTPError:
    """A queued spawn that waited its whole `queue_timeout`: 503 (nothing was wrong with the
    request; no slot freed), shown as "Spawn failed: <message>" on the pending page
    (jupyterhub/apihandlers/users.py's progress handler words the spawn's exception with
    format_exception, which prefers `jupyterhub_message`)."""
    error = web.HTTPError(503, "%s", message)
    error.jupyterhub_message = message  # type: ignore[attr-defined]
    return error
