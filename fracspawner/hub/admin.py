"""The admin page of the fracspawner service (`/services/fracspawner/admin`), its JSON
(`.../admin/api`) and the per-pool Prometheus gauges (`.../metrics`).

Who sees it: a user whose OAuth token may read every user's servers (`read:servers`,
unfiltered; the hub's admins have it through `admin:servers`), which is what the page shows.
Everyone else gets 403. The service lists `read:servers` in its `oauth_client_allowed_scopes`
so that an admin's token carries it (a user's carries only `read:servers!user`, their own).

Where the data comes from (nothing new is asked of a user's server):
- pools and holders: the capacity watches (pods with the CONTRACT pool label; capacity/usage.py),
  free counted as the hub's form counts it: the hub's server pods Pending on no node claim their
  slots (`claimed_capacity`);
- when each server started: the hub's REST API with the service's own token (`list:users`,
  `read:servers`: the models of active servers, nothing else);
- GPU busy/idle/unknown, memory in use, what the culler does next, and its last 24 h: the
  culler's `GET .../api/state` (fracspawner.culler.stateapi), with the same token.

History: one sample per pool every `interval` seconds, in memory, at most `HISTORY_SAMPLES`
per pool (24 h at one a minute); a restart starts it again, and the page says since when.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from jinja2 import Environment, PackageLoader, select_autoescape
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.log import app_log

from ..backends import plan_slice
from ..capacity.usage import Holder, holders_from_pods, pool_usage
from ..choice.admission import claimed_capacity, options_gpu_equivalent, watch_usable
from ..choice.offers import size_label
from ..choice.options import offer_for
from ..model.errors import SliceError
from ..model.slices import ALLOWED_STEPS, parse_slice
from ..model.units import gpu_share, utc_minute

__all__ = [
    "ADMIN_SCOPE",
    "HISTORY_SAMPLES",
    "AdminData",
    "admin_handlers",
    "build_admin_model",
    "render_admin_page",
]

#: the scope that shows the page: reading every user's servers (what the page shows)
ADMIN_SCOPE = "read:servers"
HISTORY_SECONDS = 24 * 3600
HISTORY_SAMPLES = 1440  # per pool: 24 h at one sample a minute
#: while the service's token lacks scopes, /health asks the hub again at most this often, so
#: the pod turns Ready once the role is granted (nobody reaches the page of an unready pod)
SCOPE_RECHECK_S = 30.0
PAGE_SIZE = 50
HISTORY_ROWS = 200  # the culler's events the page lists (newest first; the JSON has all)
SORT_KEYS = ("user", "server", "pool", "slice", "since", "memory", "gpu", "next")
_GPU_ORDER = {"unknown": 0, "idle": 1, "busy": 2}
#: the condition under which the culler's next step happens when its time comes
_IF = {
    "gpu_idle": "if its GPU and its user are idle until then",
    "idle": "if nobody uses it",
    "unattended": "if its user does not come back",
    "max_age": "whatever it does",
}


def _condition(reason: str, gpu_state: str) -> str:
    """The words for when a stop happens. Where the culler reads the server's GPU, its plain
    idle timeout also waits for that GPU to be idle (culler/decide.py server_deadlines, with
    `server_gpu_idle` off or the GPU history still short); unknown GPU data does not count."""
    if reason == "idle" and gpu_state in ("idle", "busy"):
        return "if nobody uses it and its GPU is idle until then"
    return _IF.get(reason, "if nothing changes")


# ----------------------------------------------------------------------------- pure model
def holders_from_servers(catalog: Any, users: Iterable[Mapping[str, Any]]) -> list[Holder]:
    """Holders from the hub's user models (no pod watch): each active server whose
    `user_options` name a slice; its memory and GPU-equivalents from the catalog."""
    out = []
    for user in users:
        for name, server in (user.get("servers") or {}).items():
            if not isinstance(server, Mapping) or server.get("stopped"):
                continue
            options = server.get("user_options") or {}
            try:
                requested = parse_slice(options.get("gpu"), step=catalog.fraction_step)
            except SliceError:
                continue
            if requested.kind == "none":
                continue
            pool_name = options.get("pool") if isinstance(options.get("pool"), str) else ""
            pool = catalog.pools.get(pool_name)
            memory = None
            if pool is not None and (offer := offer_for(pool, requested)) is not None:
                memory = plan_slice(offer, pool, None).memory_mib
            out.append(
                Holder(
                    user=str(user.get("name")),
                    server=str(name),
                    pool=pool_name or "",
                    gpu=str(options.get("gpu")),
                    gpu_equivalent=options_gpu_equivalent(catalog, options),
                    memory_limit_mib=memory,
                    pod="",
                    node=None,
                    waiting=not server.get("ready"),
                    since=_ts(server.get("started")),
                )
            )
    return out


def _ts(value: Any) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def started_by_server(users: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], float]:
    out = {}
    for user in users:
        for name, server in (user.get("servers") or {}).items():
            started = _ts((server or {}).get("started"))
            if started is not None:
                out[(str(user.get("name")), str(name))] = started
    return out


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    s = int(max(seconds, 0))
    if s < 90:
        return f"{s} s"
    if s < 5400:
        return f"{round(s / 60)} min"
    if s < 48 * 3600:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"


def _mib(value: float | None) -> str:
    if value is None:
        return "?"
    return f"{value / 1024:.1f} GiB" if value >= 1024 else f"{value:.0f} MiB"


def holder_rows(
    holders: Iterable[Holder], culler: Mapping[str, Any] | None, now: float
) -> list[dict[str, Any]]:
    """One row per holder: the pod's facts, joined with the culler's view of its server.
    The words (`row_texts`) are made only for the rows a page shows."""
    seen = {(r["user"], r["server"]): r for r in (culler or {}).get("servers") or []}
    rows = []
    for h in holders:
        c = seen.get((h.user, h.server))
        gpu = (c or {}).get("gpu") or {}
        state = gpu.get("state") or "unknown"
        since_state = gpu.get("since")
        nxt = (c or {}).get("next")
        if h.waiting:
            state, why = "waiting", "not placed on a node yet"
        elif c is None:
            why = "the culler has not seen this server" if culler else "no culler connected"
        else:
            why = gpu.get("note") or ""
        rows.append(
            {
                "user": h.user,
                "server": h.server,
                "pool": h.pool,
                "slice": h.gpu,
                "gpu_equivalent": h.gpu_equivalent,
                "since": h.since if h.since is not None else (c or {}).get("started"),
                "memory_used_mib": gpu.get("memory_mib"),
                "memory_limit_mib": h.memory_limit_mib,
                "gpu": state,
                "gpu_since": since_state,
                "gpu_for": None if since_state is None else max(now - since_state, 0),
                "gpu_why": why,
                "hibernated_mib": gpu.get("hibernated_mib"),
                "simulated": bool(gpu.get("simulated")),
                "seen_by_culler": c is not None,
                "kept_because": ((c or {}).get("decision") or {}).get("reason"),
                "next": nxt,
                "next_at": None if not nxt else nxt.get("at"),
            }
        )
    return rows


#: why the culler ended a server or kernel, in the page's words; the culler's own log line (with
#: its numbers) is the cell's tooltip (issue 38 #3: the Why column was that log line)
_WHY_WORDS = {
    "gpu_idle": "its GPU sat idle longer than an idle GPU server may keep it (server_gpu_idle)",
    "idle": "nobody used it for longer than an idle server is kept (server_idle)",
    "unattended": "nobody used it for longer than an unattended server is kept "
    "(server_unattended; GPU work does not count)",
    "max_age": "it ran as long as a server may run (max_age)",
    "needed": "its user had left and someone was waiting for its slot (release_away_after)",
    "kernel_gpu_idle": "the kernel held GPU memory and did nothing for longer than an idle "
    "kernel is kept (kernel_gpu_idle)",
    "kernel_gpu_hibernate": "the kernel held GPU memory and did nothing for longer than "
    "kernel_gpu_hibernate: its GPU memory went to host memory until its next cell",
}

#: why the culler keeps a server with nothing due, where that is the person (issue 38 #3: "nothing
#: due" alone for a server kept because its user was at it; culler/decide.py's reasons)
_KEPT_WORDS = {
    "present": "its user is at a JupyterLab tab of it",
    "in_session": "its user is in session (a hidden tab of it, seen lately)",
    "resume_waiting": "a cell of its user waits for its kernel to resume (the GPU is full)",
}


def row_texts(row: Mapping[str, Any], now: float) -> dict[str, Any]:
    """A holder row with its words for the page."""
    used, limit, nxt = row["memory_used_mib"], row["memory_limit_mib"], row["next"]
    since_state = row["gpu_since"]
    if nxt:
        when = (
            "now"
            if nxt["at"] <= now + 1
            else f"in {_duration(nxt['at'] - now)}, at {utc_minute(nxt['at'])}, "
            + _condition(nxt["reason"], row["gpu"])
        )
        next_text = f"stop ({nxt['reason'].replace('_', ' ')}) {when}"
    elif row["seen_by_culler"]:
        why = _KEPT_WORDS.get(row.get("kept_because") or "")
        next_text = f"nothing due: {why}" if why else "nothing due"
    else:
        next_text = ""
    return {
        **row,
        "since_text": utc_minute(row["since"]),
        "memory_text": f"{_mib(used)} of {_mib(limit)}",
        "gpu_text": row["gpu"]
        + (
            f" for {_duration(now - since_state)}"
            if since_state is not None and row["gpu"] != "waiting"
            else ""
        )
        # the demo's GPU is simulated: said wherever its readings show (issue 38 #3)
        + (" (simulated GPU)" if row.get("simulated") else ""),
        "next_text": next_text,
        "slice_text": _slice_words(row["slice"]),
    }


#: the finest step any catalog may use: every fraction a pod's label can carry parses with it,
#: also one made under an earlier, finer catalog than today's (its pod still holds that share)
_FINEST_STEP = max(ALLOWED_STEPS)


def _slice_words(label: str) -> str:
    """'0.25' -> '1/4', '10Gi' -> '10 GiB', as the picker says sizes; the label if odd.
    Not the catalog's `fraction_step`: these are words for what a pod holds, not a check of
    what may be asked for now."""
    try:
        return size_label(parse_slice(label, step=_FINEST_STEP))
    except (SliceError, ValueError):
        return label


def _sort_key(key: str):
    def by(row: Mapping[str, Any]) -> tuple:
        value: Any
        if key == "memory":
            value = row["memory_used_mib"] if row["memory_used_mib"] is not None else -1
        elif key == "gpu":
            value = (_GPU_ORDER.get(row["gpu"], -1), row["gpu_for"] or 0)
        elif key == "since":
            value = row["since"] if row["since"] is not None else float("inf")
        elif key == "next":
            value = row["next_at"] if row["next_at"] is not None else float("inf")
        else:
            value = row[key]
        return (value, row["user"], row["server"])

    return by


def sort_and_page(
    rows: list[dict[str, Any]], sort: str, order: str, page: int, size: int = PAGE_SIZE
) -> tuple[list[dict[str, Any]], int]:
    """One page of the rows, sorted; (rows, number of pages)."""
    key = sort if sort in SORT_KEYS else "user"
    ordered = sorted(rows, key=_sort_key(key), reverse=order == "desc")
    pages = max((len(ordered) + size - 1) // size, 1)
    page = min(max(page, 1), pages)
    return ordered[(page - 1) * size : page * size], pages


def build_admin_model(
    catalog: Any,
    capacity: Any,
    holders: list[Holder],
    culler: Mapping[str, Any] | None,
    history: Mapping[str, Any],
    now: float,
    *,
    culler_error: str = "",
    holders_known: bool = True,
    problems: list[str] | None = None,
) -> dict[str, Any]:
    """Everything the admin page shows, as plain data (the JSON API's answer too).
    `holders_known` False: neither the pod watch nor the hub could say who holds what, so the
    pools' held/waiting/idle-held are unknown (None), never 0."""
    problems = list(problems or [])
    rows = holder_rows(holders, culler, now)
    idle: dict[str, float] = {}
    for row in rows:
        if row["gpu"] == "idle":
            idle[row["pool"]] = idle.get(row["pool"], 0.0) + (row["gpu_equivalent"] or 0.0)
    pools = []
    for usage in pool_usage(catalog, capacity, holders):
        entry = asdict(usage)
        entry["idle_held_gpu"] = round(idle.get(usage.name, 0.0), 6) if culler else None
        if not holders_known:
            for key in ("held", "waiting", "held_gpu", "waiting_gpu", "idle_held_gpu"):
                entry[key] = None
        pools.append(entry)
    events = list((culler or {}).get("history") or [])
    events.reverse()  # newest first
    return {
        "now": now,
        "pools": pools,
        "servers": rows,
        "stale": bool(getattr(capacity, "stale", False)),
        "holders_known": holders_known,
        # what fracspawner's own services cannot do (their hub tokens lack scopes, issue 28)
        "problems": [*problems, *((culler or {}).get("problems") or [])],
        "culler": {
            "connected": culler is not None,
            "error": culler_error,
            "since": (culler or {}).get("since"),
            "last_cycle_at": (culler or {}).get("last_cycle_at"),
            "summary": (culler or {}).get("summary") or {},
            "history": events,
        },
        "history": history,
    }


# ----------------------------------------------------------------------------- rendering
def _env() -> Environment:
    env = Environment(
        loader=PackageLoader("fracspawner.hub", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
    )
    env.filters["clock"] = utc_minute
    env.filters["duration"] = _duration
    env.filters["mib"] = _mib
    # the picker's words for amounts ("1/7", "6/7", "1 1/2"), never "0.857" (issue 27 #6)
    env.filters["gpu"] = lambda v: "unknown" if v is None else gpu_share(v)
    return env


_ENV = _env()


def _json_for_script(value: Any) -> str:
    """JSON safe inside <script>: no '</' or '<!--' can end the element."""
    return (
        json.dumps(value, separators=(",", ":"))
        .replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
    )


def _table_rows(samples: list[list[float | None]], step: float = 1800) -> list[list[Any]]:
    """The chart's samples as table rows, at most one per `step` seconds (newest first)."""
    out: list[list[Any]] = []
    last = None
    for sample in reversed(samples):
        if last is None or last - sample[0] >= step:
            out.append(sample)
            last = sample[0]
    return out


def render_admin_page(
    model: Mapping[str, Any],
    *,
    user: str,
    hub_prefix: str,
    static_prefix: str,
    sort: str = "user",
    order: str = "asc",
    page: int = 1,
    history_info: Mapping[str, Any] | None = None,
) -> str:
    rows, pages = sort_and_page(list(model["servers"]), sort, order, page)
    rows = [row_texts(row, model["now"]) for row in rows]
    page = min(max(page, 1), pages)
    events = []
    for event in model["culler"]["history"][:HISTORY_ROWS]:
        back = event.get("came_back_at")
        events.append(
            {
                **event,
                "at_text": utc_minute(event["at"]),
                "why_text": _WHY_WORDS.get(event.get("reason") or "")
                or str(event.get("reason") or "").replace("_", " "),
                "came_back_text": "" if back is None else f"after {_duration(back - event['at'])}",
            }
        )

    def link(**changes: Any) -> str:
        args = {"sort": sort, "order": order, "page": page, **changes}
        return "?" + urlencode(args) + "#holders"

    tables = {name: _table_rows(samples) for name, samples in (model["history"] or {}).items()}
    return _ENV.get_template("admin_page.html").render(
        model=model,
        rows=rows,
        events=events,
        pages=pages,
        page=page,
        sort=sort if sort in SORT_KEYS else "user",
        order=order,
        link=link,
        user=user,
        hub_prefix=hub_prefix,
        static_prefix=static_prefix,
        history_json=_json_for_script(model["history"]),
        pool_names_json=_json_for_script({p["name"]: p["display_name"] for p in model["pools"]}),
        tables=tables,
        history_info={
            "since": None,
            "interval": 60,
            "samples": HISTORY_SAMPLES,
            **(history_info or {}),
        },
        total=len(model["servers"]),
        page_size=PAGE_SIZE,
    )


# ----------------------------------------------------------------------------- the service side
class PoolMetrics:
    """The per-pool gauges, in a registry of the service's own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._set: set[tuple[Gauge, tuple[str, ...]]] = set()  # the series the last update set
        self.slices = Gauge(
            "fracspawner_pool_slices",
            "GPU slices (pods) per pool: held (placed on a node) or waiting (not placed yet).",
            ["pool", "state"],
            registry=self.registry,
        )
        self.free_slices = Gauge(
            "fracspawner_pool_offer_free_slices",
            "Slices of each offer that would fit now, less those the hub's server pods Pending "
            "on no node claim, as the hub's form counts (absent while unknown).",
            ["pool", "offer"],
            registry=self.registry,
        )
        self.held = Gauge(
            "fracspawner_pool_gpu_equivalents_held",
            "GPU-equivalents held by placed pods, per pool.",
            ["pool"],
            registry=self.registry,
        )
        self.free = Gauge(
            "fracspawner_pool_gpu_equivalents_free",
            "GPU-equivalents that could still be handed out (the largest free offer times its "
            "size, free as fracspawner_pool_offer_free_slices counts it), per pool; absent "
            "while unknown.",
            ["pool"],
            registry=self.registry,
        )
        self.idle_held = Gauge(
            "fracspawner_pool_gpu_equivalents_idle_held",
            "GPU-equivalents held by servers the culler saw GPU-idle, per pool; absent "
            "without a culler.",
            ["pool"],
            registry=self.registry,
        )
        self.stale = Gauge(
            "fracspawner_capacity_stale",
            "1 while the node and pod watches have lost the API server (counts not current).",
            registry=self.registry,
        )

    def update(self, model: Mapping[str, Any]) -> None:
        self.stale.set(int(model["stale"]))
        seen: set[tuple[Gauge, tuple[str, ...]]] = set()
        for pool in model["pools"]:
            name = pool["name"]
            self._maybe(seen, self.slices, (name, "held"), pool["held"])
            self._maybe(seen, self.slices, (name, "waiting"), pool["waiting"])
            self._maybe(seen, self.held, (name,), pool["held_gpu"])
            self._maybe(seen, self.free, (name,), pool["free_gpu"])
            self._maybe(seen, self.idle_held, (name,), pool["idle_held_gpu"])
            for offer in pool["offers"]:
                self._maybe(seen, self.free_slices, (name, offer["spec"]), offer["free"])
        # a pool the model no longer lists (one gone from the catalog whose last pod ended)
        # loses its series: never its last value forever
        for gauge, labels in self._set - seen:
            self._remove(gauge, labels)
        self._set = seen

    def _maybe(
        self,
        seen: set[tuple[Gauge, tuple[str, ...]]],
        gauge: Gauge,
        labels: tuple[str, ...],
        value: float | None,
    ) -> None:
        if value is None:  # unknown is no number: the series goes, it never reads 0
            self._remove(gauge, labels)
        else:
            gauge.labels(*labels).set(value)
            seen.add((gauge, labels))

    @staticmethod
    def _remove(gauge: Gauge, labels: tuple[str, ...]) -> None:
        try:
            gauge.remove(*labels)
        except KeyError:
            pass


class AdminData:
    """Gathers the page's data (cached a few seconds), keeps the history, feeds the gauges."""

    def __init__(
        self,
        catalog: Any,
        watcher: Any,
        *,
        culler_url: str = "",
        hub_api_url: str | None = None,
        token: str | None = None,
        interval: float = 60.0,
        cache_seconds: float = 5.0,
    ) -> None:
        self.catalog = catalog
        self.watcher = watcher
        self.culler_url = culler_url.rstrip("/") + "/" if culler_url else ""
        self.hub_api_url = (
            hub_api_url or os.environ.get("JUPYTERHUB_API_URL", "http://127.0.0.1:8081/hub/api")
        ).rstrip("/")
        self.token = token if token is not None else os.environ.get("JUPYTERHUB_API_TOKEN", "")
        self.interval = interval
        self.cache_seconds = cache_seconds
        self.started_at = time.time()
        # bounded: at most HISTORY_SAMPLES a pool (24 h at the default one a minute)
        self.samples = max(min(int(HISTORY_SECONDS / max(interval, 1)), HISTORY_SAMPLES), 1)
        self.history: dict[str, deque[list[float | None]]] = {}
        self.metrics = PoolMetrics()
        self.http = AsyncHTTPClient(force_instance=True)
        self._cache: tuple[float, dict[str, Any]] | None = None
        self._lock = asyncio.Lock()
        self._task: asyncio.Task | None = None
        # what the service's own token lacks (check_scopes): the scopes, and in words
        self.scopes_missing: list[str] = []
        self.problems: list[str] = []
        self._scopes_checked = -SCOPE_RECHECK_S
        self.service = os.environ.get("JUPYTERHUB_SERVICE_NAME", "fracspawner")

    # -- the service's own token
    async def check_scopes(self) -> None:
        """Ask the hub what the service's own token lacks (hub/scopecheck.py), for the page
        and /health; what was known stays when the hub cannot tell."""
        from .scopecheck import own_scopes_missing

        self._scopes_checked = time.monotonic()
        found = await own_scopes_missing(self.hub_api_url, self.token, self.service)
        if found is None:
            return
        self.scopes_missing, problem = found
        if problem:
            app_log.error("fracspawner service: %s", problem)
        self.problems = [problem] if problem else []

    async def health(self) -> list[str]:
        """/health's answer, the scopes the token lacks ([]: none known): asked again while
        some are, at most every SCOPE_RECHECK_S."""
        if self.scopes_missing and time.monotonic() - self._scopes_checked >= SCOPE_RECHECK_S:
            await self.check_scopes()
        return list(self.scopes_missing)

    # -- sources
    async def _get_json(self, url: str, accept: str = "application/json") -> Any:
        # never follow a redirect with the service's token: a 3xx raises, as any failure does
        req = HTTPRequest(
            url,
            headers={"Authorization": f"token {self.token}", "Accept": accept},
            request_timeout=10,
            follow_redirects=False,
        )
        resp = await self.http.fetch(req)
        return json.loads(resp.body)

    async def hub_users(self) -> list[dict[str, Any]] | None:
        """Users with active servers (the service's own token: list:users, read:servers)."""
        if not self.token:
            return None
        users: list[dict[str, Any]] = []
        offset = 0
        try:
            while True:
                query = urlencode({"state": "active", "offset": offset, "limit": 200})
                page = await self._get_json(
                    f"{self.hub_api_url}/users?{query}", "application/jupyterhub-pagination+json"
                )
                if isinstance(page, list):  # a hub without pagination
                    return page
                users.extend(page["items"])
                nxt = (page.get("_pagination") or {}).get("next")
                if not nxt:
                    return users
                offset = int(nxt["offset"])
        except Exception as exc:
            app_log.warning("fracspawner admin: no server list from the hub: %s", exc)
            if getattr(exc, "code", None) == 403:  # say which scopes the token lacks
                await self.check_scopes()
            return None

    async def culler_state(self) -> tuple[dict[str, Any] | None, str]:
        if not self.culler_url:
            return None, "no culler connected (fracspawner service --culler-url)"
        try:
            return await self._get_json(self.culler_url + "api/state"), ""
        except Exception as exc:
            app_log.warning("fracspawner admin: the culler did not answer: %s", exc)
            return None, f"the culler did not answer ({type(exc).__name__})"

    # -- the model
    async def model(self) -> dict[str, Any]:
        async with self._lock:
            now = time.time()
            if self._cache is not None and now - self._cache[0] < self.cache_seconds:
                return self._cache[1]
            capacity = None
            if self.watcher is not None:
                await self.watcher.start()
                # free as the hub's form and the picker count it: a hub's server pod Pending
                # on no node claims its slot (its holder counts as waiting, beside)
                capacity = claimed_capacity(self.catalog, self.watcher, self.watcher.snapshot())
            users, (culler, error) = await asyncio.gather(self.hub_users(), self.culler_state())
            known = True
            if watch_usable(capacity):
                holders = holders_from_pods(self.watcher.pods(), started_by_server(users or []))
            elif users is not None:
                holders = holders_from_servers(self.catalog, users)
            else:  # neither the watch nor the hub can tell: unknown, never "nobody"
                holders, known = [], False
            model = build_admin_model(
                self.catalog,
                capacity,
                holders,
                culler,
                self.history_json(),
                now,
                culler_error=error,
                holders_known=known,
                problems=self.problems,
            )
            self.metrics.update(model)
            self._cache = (now, model)
            return model

    def history_json(self) -> dict[str, list[list[float | None]]]:
        return {pool: list(samples) for pool, samples in self.history.items()}

    def history_info(self) -> dict[str, Any]:
        return {
            "since": self.started_at,
            "interval": self.interval,
            "samples": self.samples,
        }

    async def sample(self) -> None:
        """One history sample per pool: [time, held, free, idle-held] (GPU-equivalents)."""
        self._cache = None
        model = await self.model()
        for pool in model["pools"]:
            samples = self.history.setdefault(pool["name"], deque(maxlen=self.samples))
            samples.append(
                [round(model["now"]), pool["held_gpu"], pool["free_gpu"], pool["idle_held_gpu"]]
            )
        self._cache = None

    async def _loop(self) -> None:
        while True:
            try:
                await self.sample()
            except Exception:  # the page and the offers must outlive a bad sample
                app_log.exception("fracspawner admin: sampling failed")
            await asyncio.sleep(self.interval)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._loop())


# ----------------------------------------------------------------------------- handlers
def _static_dir() -> Path:
    here = Path(__file__).resolve().parent
    for folder in (here / "static" / "admin", here.parent.parent / "frontend" / "admin"):
        if (folder / "admin.js").exists():
            return folder
    return here / "static" / "admin"


def _hub_prefix() -> str:
    return os.environ.get("JUPYTERHUB_BASE_URL", "/").rstrip("/") + "/hub/"


def may_see(user: Mapping[str, Any]) -> bool:
    """Whether a user model (HubOAuth's) may see the page: its token reads every server."""
    return ADMIN_SCOPE in (user.get("scopes") or ())


def _admin_base() -> type:
    from jupyterhub.services.auth import HubOAuthenticated

    class AdminBase(HubOAuthenticated, web.RequestHandler):
        def initialize(self, data: AdminData, prefix: str) -> None:
            self.data = data
            self.prefix = prefix

        def check_xsrf_cookie(self) -> None:  # GET only
            return None

        def refuse(self, page: bool = False) -> None:
            """403: a page of the hub for the page (issue 27 #9), plain text for the API."""
            self.set_status(403)
            if page:
                self.finish(
                    _ENV.get_template("admin_refused.html").render(
                        user=self.current_user.get("name", ""),
                        hub_prefix=_hub_prefix(),
                        scope=ADMIN_SCOPE,
                    )
                )
                return
            self.set_header("Content-Type", "text/plain; charset=utf-8")
            self.finish(
                f"403: the GPU admin page is for users who may read every user's servers "
                f"(scope {ADMIN_SCOPE}; the hub's admins have it)."
            )

    return AdminBase


def admin_handlers(prefix: str, data: AdminData) -> list[tuple[str, type, dict[str, Any]]]:
    """The routes to add to the service's application."""
    from jupyterhub.utils import url_path_join

    base = _admin_base()
    args = {"data": data, "prefix": prefix}

    class AdminPageHandler(base):  # type: ignore[misc, valid-type]
        @web.authenticated
        async def get(self) -> None:
            if not may_see(self.current_user):
                return self.refuse(page=True)
            model = await self.data.model()
            try:
                page = int(self.get_argument("page", "1"))
            except ValueError:
                page = 1
            self.set_header("Cache-Control", "no-store")
            self.finish(
                render_admin_page(
                    model,
                    user=self.current_user["name"],
                    hub_prefix=_hub_prefix(),
                    static_prefix=url_path_join(self.prefix, "admin/static/"),
                    sort=self.get_argument("sort", "user"),
                    order="desc" if self.get_argument("order", "asc") == "desc" else "asc",
                    page=page,
                    history_info=self.data.history_info(),
                )
            )

    class AdminApiHandler(base):  # type: ignore[misc, valid-type]
        @web.authenticated
        async def get(self) -> None:
            if not may_see(self.current_user):
                return self.refuse()
            model = await self.data.model()
            self.set_header("Content-Type", "application/json")
            self.set_header("Cache-Control", "no-store")
            self.finish(json.dumps({**model, "history_info": self.data.history_info()}))

    class MetricsHandler(web.RequestHandler):
        """Per-pool aggregates only (no user names): open, as Prometheus scrapes it."""

        async def get(self) -> None:
            await data.model()
            self.set_header("Content-Type", CONTENT_TYPE_LATEST)
            self.finish(generate_latest(data.metrics.registry))

    return [
        (url_path_join(prefix, "admin/?"), AdminPageHandler, args),
        (url_path_join(prefix, "admin/api"), AdminApiHandler, args),
        (
            url_path_join(prefix, "admin/static/(.*)"),
            web.StaticFileHandler,
            {"path": str(_static_dir())},
        ),
        (url_path_join(prefix, "metrics"), MetricsHandler, {}),
    ]
