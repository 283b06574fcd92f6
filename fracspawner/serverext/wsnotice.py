"""A notice to the notebook on a kernel's websocket: a stderr stream under a request's cell.

Sent on the iopub channel with the request's header as its parent, so JupyterLab shows it in
that cell's output as if the kernel had printed it (resume.py: a restore that fails; oomnote.py:
why a cell ran out of GPU memory). Both of jupyter-server's websocket protocols are spoken: the
v1 binary one JupyterLab uses (jupyter_server/services/kernels/connection/base.py) and JSON.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

V1 = "v1.kernel.websocket.jupyter.org"


def send_stderr(connection: Any, parent: dict, text: str) -> None:
    """Write `text` as a stderr stream under `parent` (a request's header) to `connection`'s
    websocket (a ZMQChannelsWebsocketConnection)."""
    session = connection.session
    msg = session.msg("stream", {"name": "stderr", "text": text + "\n"}, parent=parent)
    msg["header"]["date"] = datetime.now(timezone.utc).isoformat()
    if connection.subprotocol == V1:
        from jupyter_server.services.kernels.connection.base import serialize_msg_to_ws_v1

        parts = [
            session.pack(msg["header"]),
            session.pack(msg["parent_header"]),
            session.pack(msg["metadata"]),
            session.pack(msg["content"]),
        ]
        connection.write_message(serialize_msg_to_ws_v1(parts, "iopub"), binary=True)
    else:
        msg["channel"], msg["buffers"] = "iopub", []
        connection.write_message(json.dumps(msg, default=str))
