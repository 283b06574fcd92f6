"""The few JupyterHub REST API calls the culler makes, with bounded concurrency and a counter.

Scopes (docs/culler.md): `list:users` + `read:users:activity` + `read:servers` to list ready
servers with their last_activity and user_options; `delete:servers` to stop them;
`read:users:groups` only when groups are exempt. Never `access:servers`: the culler does not
call into user servers, and its token is only ever sent to the hub.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import quote, urlencode

from dateutil.parser import isoparse
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest, HTTPResponse

from .decide import ServerFacts

PAGINATION = "application/jupyterhub-pagination+json"  # JupyterHub >= 2.0


def _ts(value: str | None) -> float | None:
    return None if not value else isoparse(value).timestamp()


@dataclass(frozen=True)
class HubServer:
    facts: ServerFacts
    url: str  # the server's path (or full URL with subdomains), e.g. /user/alice/gpu/


def servers_from_users(users: list[dict]) -> Iterator[HubServer]:
    """Every server in a list of user models (pure)."""
    for user in users:
        # the hub leaves `groups` out of the model without read:users:groups: unknown, not none
        groups = tuple(user.get("groups") or ()) if "groups" in user else None
        for name, server in (user.get("servers") or {}).items():
            facts = ServerFacts(
                user=user["name"],
                name=name,
                user_options=server.get("user_options") or {},
                started=_ts(server.get("started")),
                last_activity=_ts(server.get("last_activity")),
                ready=bool(server.get("ready", bool(server.get("url")))),
                pending=server.get("pending"),
                groups=groups,
            )
            yield HubServer(facts, server.get("full_url") or server.get("url") or "")


class HubClient:
    def __init__(
        self,
        url: str,
        token: str,
        *,
        concurrency: int = 10,
        page_size: int = 200,
        request_timeout: float = 60.0,
    ):
        self.url = url.rstrip("/")
        self.token = token
        self.page_size = page_size
        self.request_timeout = request_timeout
        self.semaphore = asyncio.Semaphore(max(concurrency, 1))
        self.http = AsyncHTTPClient(force_instance=True, max_clients=max(concurrency, 1))
        self.requests = 0  # every HTTP request this client made (hub, Prometheus)

    def close(self) -> None:
        self.http.close()

    async def fetch(self, req: HTTPRequest, raise_error: bool = True) -> HTTPResponse:
        req.headers.setdefault("Authorization", f"token {self.token}")
        async with self.semaphore:
            self.requests += 1
            return await self.http.fetch(req, raise_error=raise_error)

    async def _page(self, offset: int, limit: int | None) -> dict | list:
        params: dict[str, str | int] = {"state": "ready", "offset": offset}
        if limit:
            params["limit"] = limit
        req = HTTPRequest(
            f"{self.url}/users?{urlencode(params)}",
            headers={"Accept": PAGINATION},
            request_timeout=self.request_timeout,
        )
        return json.loads((await self.fetch(req)).body)

    async def ready_servers(self) -> list[HubServer]:
        """All ready servers: the first page gives the total, the rest are fetched concurrently."""
        first = await self._page(0, self.page_size or None)
        if isinstance(first, list):  # a hub without pagination
            return list(servers_from_users(first))
        users = list(first["items"])
        info = first["_pagination"]
        limit, total = int(info["limit"]), int(info["total"])
        if info.get("next") and limit > 0:
            offsets = range(int(info["offset"]) + limit, total, limit)
            pages = await asyncio.gather(*(self._page(o, limit) for o in offsets))
            for page in pages:
                users.extend(page["items"])
        # a user who started/stopped between pages may appear twice: keep one
        unique = {u["name"]: u for u in users}
        return list(servers_from_users(list(unique.values())))

    async def stop_server(self, user: str, server: str, remove: bool = False) -> int:
        """DELETE the server; 202 means the hub is still stopping it."""
        if server:
            path = f"/users/{quote(user, safe='')}/servers/{quote(server, safe='')}"
        else:
            path = f"/users/{quote(user, safe='')}/server"
        req = HTTPRequest(
            self.url + path,
            method="DELETE",
            body=json.dumps({"remove": True}) if (server and remove) else None,
            allow_nonstandard_methods=True,
            request_timeout=self.request_timeout,
        )
        try:
            return (await self.fetch(req)).code
        except HTTPClientError as exc:
            if exc.code == 404:  # already gone: someone else stopped it
                return 404
            raise
