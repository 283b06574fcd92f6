"""`POST {prefix}api/reports`: where servers push their GPU reports (the culler's only endpoint
that user servers talk to; the culler itself never calls them).

401 without a token, 403 for a token the hub does not know or that may not speak for the named
server, 429 (Retry-After) for too many unknown tokens, 400 for a body that is not a report
(reports.REPORT: the schema and its limits), 503 while the hub cannot be asked, 204 when taken.
The token is checked before the body is parsed.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable

from tornado import web

from .identity import Identity, Refused, TokenVerifier, identity_from_model
from .reports import CulledKernel, ReportError, ReportStore, load_report, parse_report

MAX_BODY = 512 * 1024  # a report with hundreds of kernels is a few tens of kB

OnReport = Callable[[Identity, list[CulledKernel]], None]


class ReportHandler(web.RequestHandler):
    def initialize(self, verifier: TokenVerifier, store: ReportStore, on_report: OnReport) -> None:
        self.verifier, self.store, self.on_report = verifier, store, on_report

    def check_xsrf_cookie(self) -> None:  # token-authenticated API, no cookies
        pass

    def _token(self) -> str | None:
        scheme, _, token = self.request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() in ("token", "bearer") and token.strip():
            return token.strip()
        return None

    def _refuse(self, code: int, message: str) -> None:
        # the message may quote the body: JSON only, never the status line or a header
        self.set_status(code)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"status": code, "message": message[:300]}))

    async def post(self) -> None:
        # who is asking comes first: nothing in the body is parsed for an unknown token
        token = self._token()
        if token is None:
            return self._refuse(401, "send the server's own token: Authorization: token ...")
        if len(self.request.body) > MAX_BODY:
            return self._refuse(413, f"a report is at most {MAX_BODY} bytes")
        try:
            model = await self.verifier.model(token, self.request.remote_ip or "")
        except Refused as exc:
            if exc.retry_after:
                self.set_header("Retry-After", str(math.ceil(exc.retry_after)))
            return self._refuse(exc.code, str(exc))
        try:
            body = load_report(self.request.body)
        except ReportError as exc:
            return self._refuse(400, f"not a report: {exc}")
        try:
            who = identity_from_model(model, body.get("server_name"))
        except Refused as exc:
            return self._refuse(exc.code, str(exc))
        try:
            report = parse_report(body, received_at=time.time())
            culled = self.store.put(who.user, who.server, report)
        except ReportError as exc:
            return self._refuse(400, f"not a report: {exc}")
        self.on_report(who, culled)
        self.set_status(204)


def receiver_app(
    prefix: str, verifier: TokenVerifier, store: ReportStore, on_report: OnReport
) -> web.Application:
    prefix = "/" + prefix.strip("/") + "/" if prefix.strip("/") else "/"
    args = {"verifier": verifier, "store": store, "on_report": on_report}
    return web.Application([(f"{prefix}api/reports", ReportHandler, args)])
