"""Resume on use: every message a client sends a kernel passes here first.

jupyter-server routes each websocket message from the browser to the kernel through its
kernel websocket connection: `KernelWebsocketHandler.on_message` calls
`connection.handle_incoming_message` (jupyter_server/services/kernels/websocket.py), and the
class is `ServerApp.kernel_websocket_connection_class`, by default
`ZMQChannelsWebsocketConnection` (jupyter_server/services/kernels/connection/channels.py), kept
in `web_app.settings["kernel_websocket_connection_class"]`. The extension puts a subclass of
whatever class is there: a message for a hibernated kernel that may run the user's code
(execute, comm, inspect, complete, debug...) is held, the kernel is resumed, and the held
messages go on in their order. While a restore fails, the notebook is told on the kernel's iopub
channel (a stderr stream under the held request) and the messages wait: nothing is dropped.

Opening a notebook is not running it (issue 38 #6: the meter says "resumes when you run a
cell", and a workspace of several notebooks resumed them all at once on opening). JupyterLab
asks a kernel it connects to for `kernel_info_request` (@jupyterlab/services
KernelConnection._handleOpen / requestKernelInfo), the widget manager for `comm_info_request`,
the debugger for `debug_request` `debugInfo`, the console for `history_request`; none runs user
code or touches CUDA (ipykernel answers them from its own state), and a hibernated kernel's
process still runs everything but its CUDA calls (hibernate.py). They pass without resuming it
(foreign.py's HARMLESS_REQUESTS; the iopub watch lets their replies pass too: it is told each
one's msg_id, since a debug_request's replies do not say which command it was).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from jupyter_server.services.kernels.connection.channels import ZMQChannelsWebsocketConnection

from .foreign import HARMLESS_REQUESTS, harmless_debug_request, note_harmless
from .wsnotice import V1, send_stderr


def resuming_connection_class(base: type) -> type | None:
    """A subclass of `base` that resumes hibernated kernels; None where it cannot (a gateway)."""
    if not (isinstance(base, type) and issubclass(base, ZMQChannelsWebsocketConnection)):
        return None

    class ResumingConnection(base):  # type: ignore[misc,valid-type]
        _held: list | None = None

        @property
        def _hibernator(self) -> Any:
            monitor = self.websocket_handler.settings.get("fracspawner_gpu_monitor")
            return getattr(monitor, "hibernator", None)

        def handle_incoming_message(self, incoming_msg: Any) -> None:
            hib = self._hibernator
            if hib is None:
                return super().handle_incoming_message(incoming_msg)
            hib.note_message(self.kernel_id)
            if self._held is not None:  # resuming: keep the order
                self._held.append(incoming_msg)
                return None
            if hib.suspended(self.kernel_id) and self._harmless(incoming_msg):
                # answered as it sleeps; its replies on iopub are not a foreign client's either
                note_harmless(self.websocket_handler.settings, self._header_of(incoming_msg))
                return super().handle_incoming_message(incoming_msg)
            task = hib.resume(self.kernel_id, "a message to the kernel")
            if task is None:
                return super().handle_incoming_message(incoming_msg)
            self._held = [incoming_msg]
            hib.on_restore_failed.append(self._restore_failed)
            task.add_done_callback(lambda _t: self._flush())
            return None

        def _flush(self) -> None:
            held, self._held = self._held or [], None
            hib = self._hibernator
            if hib is not None and self._restore_failed in hib.on_restore_failed:
                hib.on_restore_failed.remove(self._restore_failed)
            for msg in held:
                super().handle_incoming_message(msg)

        def _restore_failed(self, kernel_id: str, text: str) -> None:
            if kernel_id != self.kernel_id or not self._held:
                return
            send_stderr(self, self._header_of(self._held[0]), text)

        def _harmless(self, raw: Any) -> bool:
            """A request that runs no user code (see the module's docstring)."""
            header = self._header_of(raw, missing={})
            kind = header.get("msg_type")
            if kind == "debug_request":
                return harmless_debug_request(self._content_of(raw))
            return kind in HARMLESS_REQUESTS

        def _content_of(self, raw: Any) -> Any:
            try:
                if self.subprotocol == V1:
                    from jupyter_server.services.kernels.connection.base import (
                        deserialize_msg_from_ws_v1,
                    )

                    _channel, parts = deserialize_msg_from_ws_v1(raw)
                    return self.session.unpack(parts[3])
                return json.loads(raw).get("content")
            except Exception:  # unreadable: not known to be harmless
                return None

        def _header_of(self, raw: Any, missing: dict | None = None) -> dict:
            try:
                if self.subprotocol == V1:
                    from jupyter_server.services.kernels.connection.base import (
                        deserialize_msg_from_ws_v1,
                    )

                    _channel, parts = deserialize_msg_from_ws_v1(raw)
                    return self.session.unpack(parts[0])
                return json.loads(raw).get("header") or {}
            except Exception:  # a notice without a parent still reaches the notebook's log
                return {"msg_id": uuid.uuid4().hex} if missing is None else missing

    ResumingConnection.__name__ = f"Resuming{base.__name__}"
    return ResumingConnection
