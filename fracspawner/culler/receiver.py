"""`POST {prefix}api/reports`: where servers push their GPU reports (the culler's only endpoint
that user servers talk to; the culler itself never calls them).

401 without a token, 403 for a token the hub does not know or that may not speak for the named
server, 429 (Retry-After) for too many unknown tokens or too many reports from one sender, 413
for a body over MAX_BODY, 400 for a body that is not a report (reports.REPORT: the schema and
its limits), 503 while the hub cannot be asked, 204 when taken; 200 with a JSON body when the
culler has something to say to the server about its own kernels (over-commit's swap orders:
swapdesk.py), which the extension acts on (fracspawner.serverext.swap).

Who is asking is settled before the body is read, not only before it is parsed: the handler
streams its body (`tornado.web.stream_request_body`), so tornado runs `prepare()` as soon as
the headers are in (tornado/web.py `_HandlerDelegate.headers_received` calls `execute()` for
such handlers, and `RequestHandler._execute` waits for the body only after `prepare()`);
a refusal there finishes the response while the body is unread, and tornado then closes the
connection instead of reading it (tornado/http1connection.py `HTTP1Connection.finish`: "Closing
the connection is the only way to avoid reading the whole input body"). Without streaming,
tornado reads the whole body before any handler code runs.

Reports are rate-limited per sender (ReportRate): the extension reports once a minute, so a
token, and a server, may send a few a minute (bursts for restarts); more get 429 with
Retry-After, which the extension honours (fracspawner.serverext.reporter).
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

from .identity import Buckets, Identity, Refused, TokenVerifier, identity_from_model, token_key
from .reports import CulledKernel, ReportError, ReportStore, load_report, parse_report

MAX_BODY = 512 * 1024  # a report with hundreds of kernels is a few tens of kB

OnReport = Callable[[Identity, list[CulledKernel]], None]
#: what the culler answers a report (200 with this JSON; None: 204): Culler.answer_report's
#: words for that server alone (its own kernels' swap orders and grants, host room, its user at
#: another server, what its GPUs have free where its pod cannot read that)
Answer = Callable[[Identity], dict | None]


class ReportRate:
    """Reports per sender: a bucket per token (checked before the body is read) and one per
    server (user/server, after the body names it: a user may mint several tokens)."""

    def __init__(self, per_minute: float = 3.0, burst: float = 5.0) -> None:
        self.per_minute, self.burst = per_minute, burst
        self.buckets = Buckets(per_minute / 60.0, burst)
        self.limited = 0  # reports refused for their sender's rate

    def take(self, key: str) -> float:
        wait = self.buckets.take(key, time.monotonic())
        self.limited += wait > 0
        return wait


def request_token(request: HTTPServerRequest) -> str | None:
    """The token of an `Authorization: token ...` (or `Bearer ...`) header; None without one."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() in ("token", "bearer") and token.strip():
        return token.strip()
    return None


@web.stream_request_body
class ReportHandler(web.RequestHandler):
    def initialize(
        self,
        verifier: TokenVerifier,
        store: ReportStore,
        on_report: OnReport,
        rate: ReportRate,
        answer: Answer | None = None,
    ) -> None:
        self.verifier, self.store, self.on_report, self.rate = verifier, store, on_report, rate
        self.answer = answer
        self.chunks: list[bytes] = []
        self.size = 0
        self.model: dict | None = None

    def check_xsrf_cookie(self) -> None:  # token-authenticated API, no cookies
        pass

    def on_finish(self) -> None:
        self.verifier.limit.finished(self.request.remote_ip or "")

    def _refuse(self, code: int, message: str, retry_after: float = 0.0) -> None:
        # the message may quote the body: JSON only, never the status line or a header
        if code == 429:  # over its budget: close, so its next request meets ReportServer's gate
            connection = self.request.connection
            if hasattr(connection, "_disconnect_on_finish"):
                connection._disconnect_on_finish = True
        if retry_after:
            self.set_header("Retry-After", str(max(1, math.ceil(retry_after))))
        self.set_status(code)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"status": code, "message": message[:300]}))

    async def prepare(self) -> None:
        """Who is asking, before a byte of the body is read (see the module docstring)."""
        if self.request.method != "POST":
            return  # tornado answers 405
        token = request_token(self.request)
        if token is None:
            return self._refuse(401, "send the server's own token: Authorization: token ...")
        length = self.request.headers.get("Content-Length", "")
        if length.isdigit() and int(length) > MAX_BODY:
            return self._refuse(413, f"a report is at most {MAX_BODY} bytes")
        try:
            self.model = await self.verifier.model(token, self.request.remote_ip or "")
        except Refused as exc:
            return self._refuse(exc.code, str(exc), exc.retry_after)
        wait = self.rate.take("token " + token_key(token))
        if wait:
            return self._refuse(429, _too_often(self.rate, wait), wait)

    def data_received(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size <= MAX_BODY:  # beyond it, nothing more is kept (413 in post)
            self.chunks.append(chunk)

    async def post(self) -> None:
        if self.size > MAX_BODY or self.model is None:
            return self._refuse(413, f"a report is at most {MAX_BODY} bytes")
        raw, self.chunks = b"".join(self.chunks), []
        try:
            body = load_report(raw)
        except ReportError as exc:
            return self._refuse(400, f"not a report: {exc}")
        try:
            who = identity_from_model(self.model, body.get("server_name"))
        except Refused as exc:
            return self._refuse(exc.code, str(exc))
        wait = self.rate.take(f"server {who.user}/{who.server}")
        if wait:
            return self._refuse(429, _too_often(self.rate, wait), wait)
        try:
            report = parse_report(body, received_at=time.time(), checked=True)
            culled = self.store.put(who.user, who.server, report)
        except ReportError as exc:
            return self._refuse(400, f"not a report: {exc}")
        self.on_report(who, culled)
        body = self.answer(who) if self.answer is not None else None
        if body is None:
            self.set_status(204)
            return
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(body))


def _too_often(rate: ReportRate, wait: float) -> str:
    return (
        f"too many reports from this server (at most {rate.per_minute:g} a minute); "
        f"try again in {math.ceil(wait)} s"
    )


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
    prefix: str,
    verifier: TokenVerifier,
    store: ReportStore,
    on_report: OnReport,
    rate: ReportRate | None = None,
    answer: Answer | None = None,
) -> web.Application:
    prefix = "/" + prefix.strip("/") + "/" if prefix.strip("/") else "/"
    rate = rate if rate is not None else ReportRate()
    args = {
        "verifier": verifier, "store": store, "on_report": on_report, "rate": rate,
        "answer": answer,
    }  # fmt: skip
    return web.Application(
        [(f"{prefix}api/reports", ReportHandler, args)], log_function=_log_request
    )


def report_server(app: web.Application, verifier: TokenVerifier, **kwargs: Any) -> ReportServer:
    """The HTTP server for `app` (receiver_app's), gated by the verifier's rate limit."""
    server = ReportServer(app, **kwargs)
    server.verifier = verifier
    return server
