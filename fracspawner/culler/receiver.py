"""`POST {prefix}api/reports`: where servers push their GPU reports (the culler's only endpoint
that user servers talk to; the culler itself never calls them).

401 without a token, 403 for a token the hub does not know or that may not speak for the named
server, 429 (Retry-After) for too many unknown tokens, 400 for a body that is not a report
(reports.REPORT: the schema and its limits), 503 while the hub cannot be asked, 204 when taken.
The token is checked before the body is parsed.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from typing import Any

from tornado import web
from tornado.httpserver import HTTPServer
from tornado.httputil import HTTPServerRequest
from tornado.iostream import IOStream
from tornado.log import access_log

from .identity import Identity, Refused, TokenVerifier, identity_from_model
from .reports import CulledKernel, ReportError, ReportStore, load_report, parse_report

MAX_BODY = 512 * 1024  # a report with hundreds of kernels is a few tens of kB

OnReport = Callable[[Identity, list[CulledKernel]], None]


def request_token(request: HTTPServerRequest) -> str | None:
    """The token of an `Authorization: token ...` (or `Bearer ...`) header; None without one."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() in ("token", "bearer") and token.strip():
        return token.strip()
    return None


class ReportHandler(web.RequestHandler):
    def initialize(self, verifier: TokenVerifier, store: ReportStore, on_report: OnReport) -> None:
        self.verifier, self.store, self.on_report = verifier, store, on_report

    def check_xsrf_cookie(self) -> None:  # token-authenticated API, no cookies
        pass

    def on_finish(self) -> None:
        self.verifier.limit.finished(self.request.remote_ip or "")

    def _refuse(self, code: int, message: str) -> None:
        # the message may quote the body: JSON only, never the status line or a header
        if code == 429:  # over its budget: close, so its next request meets ReportServer's gate
            connection = self.request.connection
            if hasattr(connection, "_disconnect_on_finish"):
                connection._disconnect_on_finish = True
        self.set_status(code)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"status": code, "message": message[:300]}))

    async def post(self) -> None:
        # who is asking comes first: nothing in the body is parsed for an unknown token
        token = request_token(self.request)
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
            report = parse_report(body, received_at=time.time(), checked=True)
            culled = self.store.put(who.user, who.server, report)
        except ReportError as exc:
            return self._refuse(400, f"not a report: {exc}")
        self.on_report(who, culled)
        self.set_status(204)


def _log_request(handler: web.RequestHandler) -> None:
    """Tornado's access log, with refusals at debug: random tokens must not flood the log."""
    status = handler.get_status()
    level = logging.DEBUG if status in (401, 403, 429) else logging.INFO
    if status >= 500:
        level = logging.ERROR
    request = handler.request
    access_log.log(
        level,
        "%d %s %s (%s) %.2fms",
        status,
        request.method,
        request.uri,
        request.remote_ip,
        1000.0 * request.request_time(),
    )


class ReportServer(HTTPServer):
    """The report endpoint's HTTP server: a connection from an address that has spent its
    budget of unknown tokens (identity.RateLimit.admit, counting requests in flight) is closed
    before its request is read, so a flood costs the culler's event loop an accept, not a
    parsed request, and a real server's report does not queue behind it."""

    verifier: TokenVerifier | None = None

    def handle_stream(self, stream: IOStream, address: tuple) -> None:
        verifier = self.verifier
        if verifier is not None and address and isinstance(address[0], str):
            if not verifier.limit.admit(address[0], time.monotonic()):
                verifier.limited += 1
                stream.close()
                return
        super().handle_stream(stream, address)


def receiver_app(
    prefix: str, verifier: TokenVerifier, store: ReportStore, on_report: OnReport
) -> web.Application:
    prefix = "/" + prefix.strip("/") + "/" if prefix.strip("/") else "/"
    args = {"verifier": verifier, "store": store, "on_report": on_report}
    return web.Application(
        [(f"{prefix}api/reports", ReportHandler, args)], log_function=_log_request
    )


def report_server(app: web.Application, verifier: TokenVerifier, **kwargs: Any) -> ReportServer:
    """The HTTP server for `app` (receiver_app's), gated by the verifier's rate limit."""
    server = ReportServer(app, **kwargs)
    server.verifier = verifier
    return server
