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
token share one request. Any pod can reach the culler, so asking the hub is bounded: a token the
hub has never vouched for costs a hub request only within a token bucket per source address and
one overall (beyond them: 429, nothing asked). A token the hub once accepted is re-checked when
its answer expires without spending the buckets, so random tokens cannot keep a real server's
report waiting.

Vouched and refused tokens are remembered apart (issue 34 item 9), each in an LRU of at most
`max_entries` (O(1) eviction): a refusal (kept `refused_ttl`) only ever evicts another refusal,
so a flood of random tokens, however long, cannot make the culler forget a real server's token
and then refuse its report for the flood's spent budget. The tokens named in `reserved` (the
fracspawner service's: its admin page's state calls) spend a bucket of their own before the hub
has vouched for them (after a culler restart), never the one a flood spends.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
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

    def __init__(self, code: int, message: str, retry_after: float = 0.0):
        super().__init__(message)
        self.code = code
        self.retry_after = retry_after  # 429: seconds until a request may succeed


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


PENDING_S = 10.0  # seconds after which requests let in at the door count no more


class Bucket:
    """A token bucket: `rate` per second, at most `burst` at once."""

    __slots__ = ("level", "at", "pending", "since")

    def __init__(self, burst: float, now: float):
        self.level, self.at = burst, now
        self.pending, self.since = 0, now  # let in at the door, not finished (RateLimit.admit)

    def wait(self, rate: float, burst: float, now: float) -> float:
        """Seconds until one can be taken (0: now); refills first."""
        self.level = min(burst, self.level + max(0.0, now - self.at) * rate)
        self.at = max(self.at, now)
        return 0.0 if self.level >= 1 else (1 - self.level) / rate if rate > 0 else math.inf


class RateLimit:
    """A bucket per key (the source address) and one overall. The per-key buckets are an LRU
    of at most `keys`: an evicted key starts again with a full bucket, which the overall one
    still bounds.

    An address `known(address)` says is a server pod's (the culler's pod watch, podwatch.py)
    spends a bucket of its own (`known_rate`, `known_burst`) and never the overall one: random
    tokens from other addresses cannot make a real server's first report wait (after a culler
    restart every server's token is unvouched), and a hostile server pod spends only its own.
    The hub requests known pods can cause are bounded by their number times `known_rate`."""

    def __init__(
        self,
        rate: float,
        burst: float,
        total_rate: float,
        total_burst: float,
        keys: int = 4096,
        *,
        known: Callable[[str], bool] = lambda address: False,
        known_rate: float = 0.2,
        known_burst: float = 5.0,
    ):
        self.rate, self.burst = rate, max(burst, 1.0)
        self.total_rate, self.total_burst = total_rate, max(total_burst, 1.0)
        self.keys = keys
        self.known = known
        self.known_rate, self.known_burst = known_rate, max(known_burst, 1.0)
        self._buckets: OrderedDict[str, Bucket] = OrderedDict()
        self._total: Bucket | None = None

    def _rates(self, key: str) -> tuple[str, float, float, bool]:
        """(bucket key, rate, burst, known) of a source address."""
        if key and self.known(key):
            return "known " + key, self.known_rate, self.known_burst, True
        return key, self.rate, self.burst, False

    def _bucket(self, key: str, now: float, burst: float | None = None) -> Bucket:
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = Bucket(self.burst if burst is None else burst, now)
            if len(self._buckets) > self.keys:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
        return bucket

    def admit(self, key: str, now: float) -> bool:
        """At the door, before a request is read: False when `key` has spent its budget,
        counting the requests let in and not finished yet (so a refill lets in as many as it
        refilled, not every connection waiting; a new address, as many as its burst).
        Pending counts are forgotten after PENDING_S without a new one (a connection that
        never sent a request)."""
        name, rate, burst, _known = self._rates(key)
        bucket = self._bucket(name, now, burst)
        if now - bucket.since > PENDING_S:
            bucket.pending = 0
        bucket.wait(rate, burst, now)  # refill
        if bucket.level - bucket.pending < 1:
            return False
        bucket.pending += 1
        bucket.since = now
        return True

    def finished(self, key: str) -> None:
        """A request `admit` let in has been answered."""
        bucket = self._buckets.get(self._rates(key)[0])
        if bucket is not None and bucket.pending > 0:
            bucket.pending -= 1

    def take(self, key: str, now: float) -> float:
        """0 and one taken from the address's bucket (and the overall one, unless the address
        is a known server pod's); else the seconds to wait (nothing taken)."""
        name, rate, burst, known = self._rates(key)
        bucket = self._bucket(name, now, burst)
        if known:
            wait = bucket.wait(rate, burst, now)
            if wait == 0:
                bucket.level -= 1
            return wait
        if self._total is None:
            self._total = Bucket(self.total_burst, now)
        wait = max(
            bucket.wait(rate, burst, now),
            self._total.wait(self.total_rate, self.total_burst, now),
        )
        if wait == 0:
            bucket.level -= 1
            self._total.level -= 1
        return wait


class Buckets:
    """A token bucket per key (`rate` per second, at most `burst` at once), in an LRU of at
    most `keys`: reports per sender (ReportRate), however many senders there are."""

    def __init__(self, rate: float, burst: float, keys: int = 8192):
        self.rate, self.burst, self.keys = rate, max(burst, 1.0), keys
        self._buckets: OrderedDict[str, Bucket] = OrderedDict()

    def take(self, key: str, now: float) -> float:
        """0 and one taken; else the seconds until one may be (nothing taken)."""
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = Bucket(self.burst, now)
            if len(self._buckets) > self.keys:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
        wait = bucket.wait(self.rate, self.burst, now)
        if wait == 0:
            bucket.level -= 1
        return wait


def token_key(token: str) -> str:
    """How a token is remembered: its SHA-256, never the token itself."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass
class _Cached:
    expires: float
    future: asyncio.Future


class _Lru:
    """At most `size` entries, the least recently used evicted first (O(1))."""

    def __init__(self, size: int) -> None:
        self.size = max(size, 1)
        self.entries: OrderedDict[str, _Cached] = OrderedDict()

    def get(self, key: str) -> _Cached | None:
        entry = self.entries.get(key)
        if entry is not None:
            self.entries.move_to_end(key)
        return entry

    def put(self, key: str, entry: _Cached) -> None:
        self.entries[key] = entry
        self.entries.move_to_end(key)
        while len(self.entries) > self.size:
            self.entries.popitem(last=False)

    def pop(self, key: str) -> None:
        self.entries.pop(key, None)


#: a reserved token (the service's) before the hub vouches for it: 1 a second, bursts of 10
RESERVED_RATE, RESERVED_BURST = 1.0, 10.0


class TokenVerifier:
    def __init__(
        self,
        hub_api_url: str,
        *,
        ttl: float = 300.0,
        refused_ttl: float = 30.0,
        timeout: float = 30.0,
        concurrency: int = 10,
        max_entries: int = 10000,
        unknown_rate: float = 5.0,
        unknown_burst: float = 50.0,
        unknown_total_rate: float = 20.0,
        unknown_total_burst: float = 200.0,
        known: Callable[[str], bool] = lambda address: False,
        reserved: Iterable[str] = (),
    ):
        self.url = hub_api_url.rstrip("/") + "/user"
        self.ttl, self.refused_ttl, self.timeout = ttl, refused_ttl, timeout
        self.http = AsyncHTTPClient(force_instance=True, max_clients=max(concurrency, 1))
        self.semaphore = asyncio.Semaphore(max(concurrency, 1))
        self._vouched = _Lru(max_entries)  # the hub accepted them: answers with the model
        self._refused = _Lru(max_entries)  # the hub said no: kept apart, so never evicts the above
        self._asking: dict[str, _Cached] = {}  # in flight (bounded by the buckets)
        self.limit = RateLimit(
            unknown_rate, unknown_burst, unknown_total_rate, unknown_total_burst, known=known
        )
        # the state API's callers (the admin page's service, admins) have budgets of their
        # own: a flood of report tokens cannot refuse the admin page its first state call
        self.state_limit = RateLimit(
            unknown_rate, unknown_burst, unknown_total_rate, unknown_total_burst
        )
        # reserved tokens (by SHA-256): a bucket each, spent only by whoever holds the token
        self.reserved = frozenset(reserved)
        self.reserved_limit = Buckets(
            RESERVED_RATE, RESERVED_BURST, keys=max(len(self.reserved), 1)
        )
        self.requests = 0  # hub requests made
        self.limited = 0  # unknown tokens refused without asking the hub

    @property
    def max_entries(self) -> int:
        return self._vouched.size

    @max_entries.setter
    def max_entries(self, size: int) -> None:
        self._vouched.size = self._refused.size = max(size, 1)

    def __len__(self) -> int:
        return len(self._vouched.entries) + len(self._refused.entries)

    def close(self) -> None:
        self.http.close()

    async def verify(self, token: str, claimed: object, source: str = "") -> Identity:
        return identity_from_model(await self.model(token, source), claimed)

    def _budget(self, key: str, source: str, limit: RateLimit | None, now: float) -> float:
        """Seconds to wait before a token the hub has not vouched for may be asked about (0:
        now, and one taken): a reserved token's own bucket, else `source`'s in `limit`."""
        if key in self.reserved:
            return self.reserved_limit.take(key, now)
        return (limit or self.limit).take(source, now)

    async def model(self, token: str, source: str = "", limit: RateLimit | None = None) -> dict:
        """The hub's model of the token's owner (cached). Raises Refused: 403 unknown token,
        429 too many unknown tokens from `source` or overall (in `limit`, else the reports'),
        503 hub unreachable."""
        key = token_key(token)
        now = time.monotonic()
        asking = self._asking.get(key)
        if asking is not None:  # concurrent requests with one token share one hub request
            return await asyncio.shield(asking.future)
        vouched = self._vouched.get(key)
        if vouched is not None and vouched.expires >= now:
            return await asyncio.shield(vouched.future)
        refused = self._refused.get(key)
        if refused is not None and refused.expires >= now:
            return await asyncio.shield(refused.future)
        if vouched is None:
            wait = self._budget(key, source, limit, now)
            if wait:
                self.limited += 1
                raise Refused(
                    429,
                    "too many reports with tokens the hub has not vouched for; "
                    f"try again in {math.ceil(wait)} s",
                    retry_after=wait,
                )
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        entry = self._asking[key] = _Cached(now + self.ttl, future)
        try:
            future.set_result(await self._ask(token))
            self._refused.pop(key)
            self._vouched.put(key, entry)
        except Refused as exc:
            if exc.code != 503:  # the hub said no: remembered briefly, no longer vouched for
                entry.expires = now + self.refused_ttl
                self._vouched.pop(key)
                self._refused.put(key, entry)
            # 503, the hub is down: ask again next time (a vouched token stays vouched)
            future.set_exception(exc)
        except asyncio.CancelledError:
            future.cancel()
            raise
        finally:
            self._asking.pop(key, None)
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
