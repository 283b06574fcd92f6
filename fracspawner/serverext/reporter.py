"""Push the GPU report to the culler, authenticated with this server's OWN token.

The culler never calls into a user's server (a user controls their server and could record the
culler's credentials): the server sends its report to the culler's endpoint
(`$FRACSPAWNER_CULLER_URL` + `api/reports`, set by FracSpawner) with `$JUPYTERHUB_API_TOKEN`,
the token JupyterHub gave this server, and the culler asks the hub whose token it is. The
server's name (`$JUPYTERHUB_SERVER_NAME`) says which of its user's servers it is. Nothing is
sent without both variables.

A culler that answers 429 says when to come back (`Retry-After`, seconds): the next report is
sent no sooner, and no later either (it may be a first report the culler was too busy for),
whatever `report_interval` is; a Retry-After over MAX_RETRY_AFTER is taken as that.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from traitlets import Float, Unicode, default

from .loop import BackgroundLoop

ENV_CULLER_URL = "FRACSPAWNER_CULLER_URL"
MAX_RETRY_AFTER = 3600.0  # seconds: a culler's Retry-After beyond this is capped


class GpuReporter(BackgroundLoop):
    """Sends the monitor's report to the culler every `report_interval` seconds."""

    culler_url = Unicode(
        config=True,
        help="The culler's base URL as this server reaches it (e.g. "
        "http://hub:10101/services/fracspawner-culler/); '' sends nothing. "
        "Default: $FRACSPAWNER_CULLER_URL (set by FracSpawner).",
    )
    report_interval = Float(
        60.0,
        config=True,
        help="Seconds between two reports; keep it well under the culler's max_staleness (300).",
    )
    request_timeout = Float(20.0, config=True, help="Seconds before a report request fails.")

    @default("culler_url")
    def _default_url(self) -> str:
        return os.environ.get(ENV_CULLER_URL, "")

    def __init__(
        self,
        *,
        report: Callable[[], dict],
        token: str | None = None,
        server_name: str | None = None,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.report = report
        self.token = os.environ.get("JUPYTERHUB_API_TOKEN", "") if token is None else token
        if server_name is None:
            server_name = os.environ.get("JUPYTERHUB_SERVER_NAME", "")
        self.server_name = server_name
        self.sent = 0
        self.last_error: str | None = None
        self.last_sent_at: datetime | None = None
        self.retry_after: float | None = None  # the culler's last 429 asked for this wait
        # the culler's answer to a report (200 with JSON: over-commit's swap orders) goes here
        self.on_answer: Callable[[dict], None] | None = None
        self.sooner: float | None = None  # seconds: the culler or swap.py want a report soon
        self._wake = asyncio.Event()

    @property
    def enabled(self) -> bool:
        return bool(self.culler_url and self.token)

    @property
    def endpoint(self) -> str:
        return self.culler_url.rstrip("/") + "/api/reports"

    def start(self) -> None:
        if self.enabled:
            self._start_loop()

    async def stop(self) -> None:
        await self._stop_loop()

    async def _run(self) -> None:
        while True:
            try:
                await self.push_once()
            except Exception:  # one failed report must not end reporting for the server's life
                self.log.exception("fracspawner: GPU report to the culler failed")
            self._wake.clear()
            try:  # report_soon may cut the wait short
                await asyncio.wait_for(self._wake.wait(), self.next_delay())
            except asyncio.TimeoutError:
                pass

    def next_delay(self) -> float:
        """Seconds until the next report: the culler's Retry-After after a 429, else
        report_interval, or sooner when asked (report_soon, the culler's report_in)."""
        if self.retry_after is not None:
            return self.retry_after
        sooner, self.sooner = self.sooner, None
        return self.report_interval if sooner is None else min(sooner, self.report_interval)

    def report_soon(self, seconds: float = 0.0) -> None:
        """Send the next report within `seconds` (not sooner than a 429's Retry-After allows)."""
        self.sooner = seconds if self.sooner is None else min(self.sooner, seconds)
        if seconds <= 0 and self.retry_after is None:
            self._wake.set()

    async def push_once(self) -> bool:
        """POST one report; True when the culler took it."""
        body = {**self.report(), "server_name": self.server_name}
        req = HTTPRequest(
            self.endpoint,
            method="POST",
            body=json.dumps(body, default=_iso),
            headers={
                "Authorization": f"token {self.token}",
                "Content-Type": "application/json",
            },
            request_timeout=self.request_timeout,
            follow_redirects=False,  # the token goes to the culler's URL and nowhere else
        )
        self.retry_after = None
        try:
            response = await AsyncHTTPClient().fetch(req)
        except (HTTPClientError, OSError) as exc:
            if isinstance(exc, HTTPClientError) and exc.code == 429:
                self.retry_after = _retry_after(exc)
            error = str(exc)
            if error != self.last_error:  # say it once, not every minute
                self.log.warning("fracspawner: the culler refused the GPU report: %s", error)
            self.last_error = error
            return False
        if self.last_error is not None:
            self.log.info("fracspawner: GPU reports reach the culler again")
        self.last_error = None
        self.sent += 1
        self.last_sent_at = datetime.now(timezone.utc)
        if response.code == 200 and response.body and self.on_answer is not None:
            try:
                answer = json.loads(response.body)
            except ValueError:
                answer = None
            if isinstance(answer, dict):
                self.on_answer(answer)
        return True

    def state(self) -> dict:
        """What `fracspawner doctor` shows: where reports go and how the last ones went."""
        return {
            "enabled": self.enabled,
            "endpoint": self.endpoint if self.culler_url else None,
            "sent": self.sent,
            "last_sent_at": _iso(self.last_sent_at) if self.last_sent_at else None,
            "last_error": self.last_error,
            "retry_after": self.retry_after,
        }


def _retry_after(exc: HTTPClientError) -> float:
    """A 429's Retry-After in seconds (RFC 9110 10.2.3: delay-seconds, or an HTTP date),
    between 1 and MAX_RETRY_AFTER; report_interval's default (60) when it has none."""
    value = (exc.response.headers.get("Retry-After", "") if exc.response else "").strip()
    seconds = 60.0
    if value.isdigit():
        seconds = float(value)
    elif value:
        try:
            when = parsedate_to_datetime(value)
            seconds = (when - datetime.now(timezone.utc)).total_seconds()
        except (TypeError, ValueError):
            pass
    return min(max(seconds, 1.0), MAX_RETRY_AFTER)


def _iso(value: object) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
