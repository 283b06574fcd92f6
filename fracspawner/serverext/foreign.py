"""Resume a hibernated kernel that someone reaches without this server's websocket.

resume.py sees every message the browser sends through jupyter-server. A client may instead
talk to the kernel's ZMQ ports directly (`jupyter console --existing kernel-<id>.json`, any
jupyter_client on the connection file), and code in the kernel may work from a thread: neither
passes the websocket, and their next CUDA call would block in the locked process until someone
resumes it. Both show on the kernel's iopub channel, which every client of a kernel sees: a
kernel publishes `status: busy` (with the request as parent) before it handles a request, and a
thread's output is a `stream` message. So while a kernel is hibernated the server subscribes to
its iopub (the kernel manager's `connect_iopub`, as jupyter-server's own activity watch does in
`MappingKernelManager.start_watching_activity`) and any message resumes it, except the
replies to requests that run no user code (the kernel_info a reconnecting browser's websocket
asks for itself, `nudge`; what JupyterLab asks as a notebook opens, let through by resume.py)
and the welcome a kernel sends a new subscriber, which touch no CUDA.

A thread that makes a CUDA call silently (no output, no request) is not seen here: the
hibernator does not suspend a kernel whose process uses the CPU while no cell runs (the probe in
hibernate.py), and such a call waits for the next message or Resume in the meter otherwise.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from jupyter_client.session import Session

# requests that run no user code and touch no CUDA (ipykernel answers them from its own state):
# the server's own nudge, and what JupyterLab asks a kernel it connects to as a notebook opens
# (resume.py says which part asks which). They neither resume a hibernated kernel through the
# websocket (resume.py) nor, seen here as the parent of its replies, through this watch.
HARMLESS_REQUESTS = frozenset(
    {"kernel_info_request", "comm_info_request", "history_request", "is_complete_request"}
)
HARMLESS_PARENTS = HARMLESS_REQUESTS
#: the debugger's questions about itself (JupyterLab asks `debugInfo` as a notebook opens);
#: the rest (evaluate, variables, ...) may run the user's code
HARMLESS_DEBUG_COMMANDS = frozenset({"debugInfo"})


#: where the websocket (resume.py) notes the harmless requests it let through to a hibernated
#: kernel, by msg_id, so that their replies here do not resume it (a few hundred recent ones)
PASSED_KEY = "fracspawner_harmless_requests"


def harmless_debug_request(content: Any) -> bool:
    """Whether a debug_request's content asks only about the debugger itself."""
    return isinstance(content, dict) and content.get("command") in HARMLESS_DEBUG_COMMANDS


def note_harmless(settings: dict, header: dict) -> None:
    """The websocket let this harmless request through to a hibernated kernel."""
    msg_id = header.get("msg_id")
    if msg_id:
        settings.setdefault(PASSED_KEY, deque(maxlen=256)).append(msg_id)


def _passed_harmless(settings: dict, parent: dict) -> bool:
    msg_id = parent.get("msg_id")
    return bool(msg_id) and msg_id in settings.get(PASSED_KEY, ())


# what a kernel publishes to a new subscriber (JEP 65's iopub_welcome, ipykernel 7): this
# watch's own subscription, or a client connecting, is not yet a request
HARMLESS_TYPES = frozenset({"iopub_welcome"})


def watch_iopub(
    settings: dict, hibernator: Any, kernel_id: str, log: Any = None
) -> Callable[[], None] | None:
    """Subscribe to the kernel's iopub until it is resumed; returns what closes the stream."""
    km = settings.get("kernel_manager")
    try:
        kernel = km.get_kernel(kernel_id)
        stream = kernel.connect_iopub()
    except Exception:  # gone, or a kernel that is not local (a gateway): nothing to watch
        return None
    session = Session(config=kernel.session.config, key=kernel.session.key)

    def on_message(parts: list) -> None:
        try:
            _idents, fed = session.feed_identities(parts)
            msg = session.deserialize(fed, content=False)
        except Exception:  # not a message this session signed: not evidence of use
            return
        parent_header = msg.get("parent_header") or {}
        parent = parent_header.get("msg_type")
        if parent in HARMLESS_PARENTS or msg["header"].get("msg_type") in HARMLESS_TYPES:
            return
        if _passed_harmless(settings, parent_header):
            return
        if log is not None:
            log.info(
                "fracspawner: kernel %s reached outside this server (%s for %s): resuming",
                kernel_id,
                msg["header"].get("msg_type"),
                parent or "no request",
            )
        hibernator.resume(kernel_id, "a client outside this server's websocket")

    stream.on_recv(on_message)

    def close() -> None:
        if not stream.closed():
            stream.close()

    return close
