"""`GET .../api/state`: the culler's view for the admin page (fracspawner.culler.state), as JSON;
`GET .../api/room`: room on over-committed GPUs for the hub's admission (room.py), as JSON.

Answered only for a token whose hub identity may read every server (`read:servers`, unfiltered:
the fracspawner service's own token, or an admin's): the state names every user's servers, no
more than such a token can already read from the hub. The token is checked with the hub
(`GET /hub/api/user`, cached like the report tokens); 401 without a token, 403 otherwise.
The room answer names nobody (counts, MiB, hashed server ids): any token the hub knows may read
it (`scope` None), as the hub sends the spawning server's own.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from tornado import web

from .identity import Refused, TokenVerifier
from .receiver import request_token

READ_SCOPE = "read:servers"


class StateHandler(web.RequestHandler):
    def initialize(
        self,
        verifier: Callable[[], TokenVerifier],
        state: Callable[[float], dict[str, Any]],
        gated: bool = False,
        scope: str | None = READ_SCOPE,
    ) -> None:
        self.verifier, self.state, self.gated, self.scope = verifier, state, gated, scope

    def on_finish(self) -> None:
        # behind the report server's door (receiver.ReportServer), which counts this request
        # as pending until it is answered, as ReportHandler does
        if self.gated:
            self.verifier().limit.finished(self.request.remote_ip or "")

    def _refuse(self, code: int, message: str) -> None:
        self.set_status(code)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"status": code, "message": message}))

    async def get(self) -> None:
        token = request_token(self.request)
        if token is None:
            return self._refuse(401, "send a token that may read every server")
        try:
            # by the caller's address, in the state API's own budget: unknown tokens spend
            # that address's bucket, and never the reports' (nor reports this one)
            verifier = self.verifier()
            model = await verifier.model(
                token, self.request.remote_ip or "", limit=verifier.state_limit
            )
        except Refused as exc:
            return self._refuse(exc.code, str(exc))
        if self.scope is not None and self.scope not in (model.get("scopes") or []):
            return self._refuse(403, f"this token may not {self.scope} of every user")
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(self.state(time.time())))


def state_handler(
    path: str,
    verifier: Callable[[], TokenVerifier],
    state: Callable[[float], dict[str, Any]],
    gated: bool = False,
    scope: str | None = READ_SCOPE,
) -> tuple[str, type, dict[str, Any]]:
    """The route; `gated`: served by the report server (receiver.report_server), whose door
    must hear when a request is answered; `scope`: what the token must carry (None: any)."""
    return (
        path,
        StateHandler,
        {"verifier": verifier, "state": state, "gated": gated, "scope": scope},
    )
