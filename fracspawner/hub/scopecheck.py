"""The fracspawner service checks its own hub token: what it lacks, said in words.

Its own module because both the service's start (hub/service.py) and its admin page's data
(hub/admin.py, on the hub's 403) ask it.
"""

from __future__ import annotations

import json

from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.log import app_log

from ..model.hubroles import SERVICE_SCOPES, missing_scopes, scope_problem


async def own_scopes_missing(
    api_url: str, token: str, service: str = "fracspawner"
) -> tuple[list[str], str] | None:
    """What the service's own token lacks: (the missing scopes, the sentence saying so), ([],
    "") when nothing; None when it cannot be told (no token, the hub cannot be asked or
    answers oddly). `GET /hub/api/user` answers the token's scopes (expanded by the hub),
    checked against SERVICE_SCOPES (model/hubroles.py; the admin page and the culler's state
    API need them). Asked at start, on the hub's 403 (hub/admin.py) and by /health while
    something is missing (hub/service.py)."""
    if not token:
        return None
    http = AsyncHTTPClient(force_instance=True)
    req = HTTPRequest(
        api_url.rstrip("/") + "/user",
        headers={"Authorization": f"token {token}"},
        request_timeout=10,
        follow_redirects=False,
    )
    try:
        resp = await http.fetch(req, raise_error=False)
    except OSError as exc:
        app_log.warning("fracspawner service: the hub cannot be asked about its token: %s", exc)
        return None
    finally:
        http.close()
    if resp.code in (401, 403):
        return list(SERVICE_SCOPES), (
            "the fracspawner service's hub token ($JUPYTERHUB_API_TOKEN) is unknown to the "
            "hub: register the service with that token"
        )
    if resp.code != 200:
        return None
    try:
        granted = json.loads(resp.body).get("scopes") or []
    except (ValueError, AttributeError):
        return None
    missing = missing_scopes(granted, SERVICE_SCOPES)
    return missing, scope_problem("fracspawner service", missing, f"{service}-service")


async def own_scope_problem(api_url: str, token: str, service: str = "fracspawner") -> str:
    """What the service's own token lacks, in words ("" when nothing, or when the hub cannot
    be asked): own_scopes_missing's sentence."""
    found = await own_scopes_missing(api_url, token, service)
    return "" if found is None else found[1]
