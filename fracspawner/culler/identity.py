"""Whose server sent a report: ask the hub about the token the report came with.

A single-user server's `$JUPYTERHUB_API_TOKEN` is owned by its user and, by default (the hub's
`server` role), carries `users:activity!user` and `access:servers!server=<user>/<name>`.
`GET /hub/api/user` with that token answers with the owner's model, `kind: user`, and the
token's `scopes` (JupyterHub >= 3; apihandlers/users.py SelfAPIHandler). A report is accepted
for the server its body names only when the token is a user's and may access that server of its
owner (`access:servers!server=<user>/<name>`, `!user=<user>` or unfiltered): so a server can only
ever report about itself or its user's other servers, never anyone else's.

Answers are cached per token (by its SHA-256, for `ttl` seconds) so a report a minute from every
server costs the hub one request per server every few minutes; concurrent reports with one
token share one request.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from dataclasses import dataclass

from tornado.httpclient import AsyncHTTPClient, HTTPRequest


@dataclass(frozen=True)
class Identity:
    user: str
    server: str  # "" for the default server

    @property
    def log_name(self) -> str:
        return f"{self.user}/{self.server}" if self.server else self.user


class Refused(Exception):
    """The report is refused; `code` is the HTTP status to answer with."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def identity_from_model(model: dict, claimed: object) -> Identity:
    """The server a token's owner may report about (pure). Raises Refused."""
    if model.get("kind") != "user" or not isinstance(model.get("name"), str):
        raise Refused(403, "reports are sent with a single-user server's own token")
    user = model["name"]
    scopes = set(model.get("scopes") or [])
    servers = sorted(
        s.split("=", 1)[1].split("/", 1)[1]
        for s in scopes
        if s.startswith(f"access:servers!server={user}/")
    )
    if claimed is None:
        if len(servers) != 1:
            raise Refused(400, "say which server this is (server_name)")
        return Identity(user, servers[0])
    if not isinstance(claimed, str) or len(claimed) > 255:
        raise Refused(400, "server_name must be a server name")
    allowed = (
        claimed in servers or f"access:servers!user={user}" in scopes or "access:servers" in scopes
    )
    if not allowed:
        raise Refused(403, f"this token may not report about server {claimed!r} of {user}")
    return Identity(user, claimed)


class TokenVerifier:
    def __init__(
        self,
        hub_api_url: str,
        *,
        ttl: float = 300.0,
        refused_ttl: float = 30.0,
        timeout: float = 30.0,
        concurrency: int = 10,
    ):
        self.url = hub_api_url.rstrip("/") + "/user"
        self.ttl, self.refused_ttl, self.timeout = ttl, refused_ttl, timeout
        self.http = AsyncHTTPClient(force_instance=True, max_clients=max(concurrency, 1))
        self.semaphore = asyncio.Semaphore(max(concurrency, 1))
        self._cache: dict[str, tuple[float, asyncio.Future]] = {}
        self.requests = 0  # hub requests made

    def close(self) -> None:
        self.http.close()

    async def verify(self, token: str, claimed: object) -> Identity:
        return identity_from_model(await self.model(token), claimed)

    async def model(self, token: str) -> dict:
        key = hashlib.sha256(token.encode()).hexdigest()
        now = time.monotonic()
        cached = self._cache.get(key)
        if cached is None or cached[0] < now:
            future: asyncio.Future = asyncio.get_running_loop().create_future()
            self._cache[key] = (now + self.ttl, future)
            try:
                future.set_result(await self._ask(token))
            except Refused as exc:
                if exc.code == 503:  # the hub is down: ask again next time
                    self._cache.pop(key, None)
                else:
                    self._cache[key] = (now + self.refused_ttl, future)
                future.set_exception(exc)
            except asyncio.CancelledError:
                self._cache.pop(key, None)
                future.cancel()
                raise
            if len(self._cache) > 10000:  # tokens rotate with every spawn: drop expired ones
                self._cache = {k: v for k, v in self._cache.items() if v[0] >= now}
        else:
            future = cached[1]
        return await asyncio.shield(future)

    async def _ask(self, token: str) -> dict:
        req = HTTPRequest(
            self.url,
            headers={"Authorization": f"token {token}"},
            request_timeout=self.timeout,
            follow_redirects=False,
        )
        async with self.semaphore:
            self.requests += 1
            try:
                resp = await self.http.fetch(req, raise_error=False)
            except OSError as exc:
                raise Refused(503, f"the hub cannot be asked about the token: {exc}") from None
        if resp.code in (401, 403):
            raise Refused(403, "the hub does not know this token")
        if resp.code != 200:
            raise Refused(503, f"the hub answered {resp.code} about the token")
        try:
            return json.loads(resp.body)
        except ValueError:
            raise Refused(503, "the hub answered with non-JSON") from None
