"""The fracspawner JupyterHub service: live offers for the picker, as JSON.

`GET /services/fracspawner/api/offers` answers the logged-in user's offer model (the same
model the spawn form is rendered from): pools they may use, free/total counts from the node
and pod watches, their remaining quota. Authentication is JupyterHub's HubOAuth, so a user only
ever sees their own rules and usage.

What the user's servers hold comes from the pod watch while it can be believed; without it
(`--no-live-capacity`, a stale or never-listed watch) from the hub's REST API, asked with the
user's own OAuth token (`read:servers!user` among the service's
`oauth_client_allowed_scopes`: the server models with their `user_options`). When neither can
tell, the model says unknown, never 0 in use.

Free counts are taken as the hub's form takes them: the hub's server pods the watch shows
Pending on no node claim their slots (`claimed_capacity`), so a refresh agrees with the form
while they wait. The hub's in-flight admissions (its memory, until their pods are made) are
not seen here; Start checks again.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Mapping
from typing import Any

from jupyterhub.services.auth import HubOAuthCallbackHandler, HubOAuthenticated
from jupyterhub.utils import url_path_join
from tornado import web
from tornado.httpserver import HTTPServer
from tornado.log import app_log, enable_pretty_logging

from ..backends import load_catalog
from ..choice.admission import claimed_capacity, server_holdings, user_usage, watch_usable
from ..choice.offers import build_offer_model
from ..model.access import allowed_pools
from ..model.catalog import Catalog, Pool
from ..stopsignal import honour_sigint
from .form import render_service_page


class OffersHandler(HubOAuthenticated, web.RequestHandler):
    """The offer model for the current user."""

    def initialize(self, catalog: Catalog, watcher: Any) -> None:
        self.catalog = catalog
        self.watcher = watcher

    def check_xsrf_cookie(self) -> None:  # GET only; nothing to protect
        return None

    @web.authenticated
    async def get(self) -> None:
        model = await self.user_model()
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(model))

    async def user_model(self) -> dict[str, Any]:
        user = self.current_user
        name = user["name"]
        groups = user.get("groups") or []
        capacity = None
        used: float | None = None
        if self.watcher is not None:
            await self.watcher.start()
            capacity = claimed_capacity(self.catalog, self.watcher, self.watcher.snapshot())
            if watch_usable(capacity):
                used = self.watcher.usage_by_user().get(name, 0.0)
        rule = self.catalog.rule_for(name, groups)
        if used is None:
            may_use = allowed_pools(self.catalog, rule, admin=bool(user.get("admin")))
            used = await self.hub_usage(name, may_use)
        model = build_offer_model(
            self.catalog,
            rule=rule,
            used_gpu=used,
            capacity=capacity,
            admin=bool(user.get("admin")),
            # the picker says which admission its hub uses (the spawner enforces it either way)
            full_waits=self.get_argument("admission", "refuse") == "wait",
        )
        return model

    async def hub_usage(self, name: str, may_use: list[Pool]) -> float | None:
        """What the user's active servers hold, from their `user_options` in the hub's server
        models (asked afresh: HubOAuth caches the user model for minutes); None when the token
        may not read servers, the hub does not answer, or a server's options do not tell."""
        if "servers" not in self.current_user:  # the token may not read servers: don't ask
            return None
        token = self.hub_auth.get_token(self)
        if not token:
            return None
        try:
            fresh = await self.hub_auth.user_for_token(token, use_cache=False, sync=False)
        except Exception as exc:  # unknown, not 0: the page still works
            app_log.warning("fracspawner service: no server list from the hub: %s", exc)
            return None
        if not isinstance(fresh, Mapping) or fresh.get("name") != name:
            return None
        servers = fresh.get("servers")
        if not isinstance(servers, Mapping):  # a token without read:servers!user
            return None
        # a server started on "any pool" was placed on one of the user's pools
        usage = user_usage(server_holdings(self.catalog, servers, may_use))
        return usage.gpu if usage.known else None


class PoolsPageHandler(OffersHandler):
    """The service's root, which the hub lists under Services: the pools and what is free, for
    this user, as a page (issue 13: never a bare 404 from the navbar)."""

    @web.authenticated
    async def get(self) -> None:
        model = await self.user_model()
        hub_prefix = os.environ.get("JUPYTERHUB_BASE_URL", "/").rstrip("/") + "/hub/"
        self.set_header("Cache-Control", "no-store")
        self.finish(
            render_service_page(model, user=self.current_user["name"], hub_prefix=hub_prefix)
        )


class HealthHandler(web.RequestHandler):
    """The readiness probe: 503 while the service's hub token lacks scopes it needs (the
    admin page and the culler's state API cannot work), saying which; 200 otherwise, also
    when the hub could not be asked (nothing known to be missing)."""

    def initialize(self, admin: Any) -> None:
        self.admin = admin

    async def get(self) -> None:
        missing = await self.admin.health()
        if missing:
            self.set_status(503)
            message = self.admin.problems[0] if self.admin.problems else ""
            self.finish({"status": "missing scopes", "missing": missing, "message": message})
        else:
            self.finish({"status": "ok"})


class LiveHandler(web.RequestHandler):
    """The liveness and startup probes: the process answers (a restart grants no scope)."""

    def get(self) -> None:
        self.finish({"status": "ok"})


def make_app(catalog: Catalog, watcher: Any, prefix: str, admin: Any = None) -> web.Application:
    """The service's routes; `admin` (hub/admin.py's AdminData) adds the admin page."""
    from .admin import AdminData, admin_handlers

    admin = admin if admin is not None else AdminData(catalog, watcher)
    return web.Application(
        [
            *admin_handlers(prefix, admin),
            (
                url_path_join(prefix, "api/offers"),
                OffersHandler,
                {"catalog": catalog, "watcher": watcher},
            ),
            (url_path_join(prefix, "health"), HealthHandler, {"admin": admin}),
            (url_path_join(prefix, "health/live"), LiveHandler),
            # the root, with or without its trailing slash
            (
                url_path_join(prefix, "?"),
                PoolsPageHandler,
                {"catalog": catalog, "watcher": watcher},
            ),
            (url_path_join(prefix, "oauth_callback"), HubOAuthCallbackHandler),
        ],
        cookie_secret=os.urandom(32),
    )


async def serve(
    catalog_path: str, live_capacity: bool, culler_url: str = "", history_interval: float = 60.0
) -> None:
    catalog = load_catalog(catalog_path)
    watcher = None
    if live_capacity:
        from kubespawner.clients import load_config

        from ..capacity.watch import CapacityWatcher

        load_config()
        watcher = CapacityWatcher.shared(catalog)
        await watcher.start()
    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/fracspawner/")
    url = os.environ.get("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:10101")
    from urllib.parse import urlparse

    parsed = urlparse(url)
    from .admin import AdminData

    admin = AdminData(catalog, watcher, culler_url=culler_url, interval=history_interval)
    await admin.check_scopes()  # logged, on the admin page and /health
    admin.start()
    server = HTTPServer(make_app(catalog, watcher, prefix, admin))
    server.listen(parsed.port or 80, parsed.hostname or "127.0.0.1")
    app_log.info("fracspawner service on %s%s", url.rstrip("/"), prefix)
    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="fracspawner service",
        description="Live offers for the GPU picker, as a JupyterHub service.",
    )
    parser.add_argument(
        "--catalog", default=os.environ.get("FRACSPAWNER_CATALOG"), help="catalog YAML file"
    )
    parser.add_argument(
        "--no-live-capacity", action="store_true", help="do not watch nodes and pods"
    )
    parser.add_argument(
        "--culler-url",
        default=os.environ.get("FRACSPAWNER_CULLER_URL", ""),
        help="where the culler serves api/state, for the admin page: its metrics port "
        "(http://fracspawner-culler:9090/) or its report URL and prefix",
    )
    parser.add_argument(
        "--history-interval",
        type=float,
        default=60.0,
        help="seconds between the admin page's history samples (at most 1,440 a pool are "
        "kept: 24 h at the default)",
    )
    args = parser.parse_args(argv)
    if not args.catalog:
        print("fracspawner service: --catalog or $FRACSPAWNER_CATALOG is required", file=sys.stderr)
        return 2
    enable_pretty_logging()
    honour_sigint()  # the hub stops its services with SIGINT first
    try:
        asyncio.run(
            serve(args.catalog, not args.no_live_capacity, args.culler_url, args.history_interval)
        )
    except KeyboardInterrupt:
        pass
    return 0
