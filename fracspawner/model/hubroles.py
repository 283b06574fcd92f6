"""The JupyterHub roles fracspawner's own services need, and how to tell what a token lacks.

One place for both: the z2jh overlay and NOTES grant these roles (fracspawner.add_service_roles, in
hub.extraConfig), and the culler and the service check their own token against the same lists
at start and on a 403 (`GET /hub/api/user` answers the token's `scopes`, expanded by the hub:
jupyterhub/apihandlers/users.py SelfAPIHandler), so a role that went missing is said in words
instead of a culler that quietly does nothing. Pure; imports nothing of JupyterHub.
"""

from __future__ import annotations

from collections.abc import Iterable

#: the culler: list ready servers with their activity (and users' groups, for
#: exempt_groups), stop them; never access:servers (it does not call into user servers)
CULLER_SCOPES: tuple[str, ...] = (
    "list:users",
    "read:users:activity",
    "read:users:groups",
    "read:servers",
    "delete:servers",
)
#: the live-offers service's own token: the active servers for its admin page, and the
#: culler's state API, which answers tokens that may read every server
SERVICE_SCOPES: tuple[str, ...] = ("list:users", "read:servers")

#: what each scope is for, in the words a log line and the admin page use
PURPOSE = {
    "list:users": "list the users with running servers",
    "read:users:activity": "read when each server was last used",
    "read:users:groups": "read users' groups (exempt_groups)",
    "read:servers": "read the servers' models (when each started, its GPU slice)",
    "delete:servers": "stop idle servers",
}


def culler_role(service: str) -> dict[str, object]:
    return {
        "name": service,
        "description": "The GPU-aware culler",
        "scopes": list(CULLER_SCOPES),
        "services": [service],
    }


def service_role(service: str) -> dict[str, object]:
    return {
        "name": f"{service}-service",
        "description": "The fracspawner service's admin page",
        "scopes": list(SERVICE_SCOPES),
        "services": [service],
    }


def missing_scopes(granted: Iterable[str], required: Iterable[str]) -> list[str]:
    """The required scopes the token does not hold unfiltered (`granted`: the hub's expanded
    scopes of the token; a filtered `read:servers!user=x` is not `read:servers`)."""
    have = set(granted)
    return [scope for scope in required if scope not in have]


def scope_problem(who: str, missing: list[str], role: str) -> str:
    """The sentence a log line, the admin page and /health say; "" when nothing is missing."""
    if not missing:
        return ""
    needs = "; ".join(f"{s} ({PURPOSE.get(s, 'needed')})" for s in missing)
    return (
        f"the {who}'s hub token lacks the scopes {needs}. Its role {role!r} is not loaded: "
        "give it in c.JupyterHub.load_roles; with z2jh, hub.config.JupyterHub.load_roles "
        "replaces hub.loadRoles, so keep fracspawner.add_service_roles(...) in "
        "hub.extraConfig (examples/z2jh/values.yaml), which z2jh runs in the order of its "
        "keys: an entry of yours whose key sorts after 'fracspawner' and assigns "
        "c.JupyterHub.load_roles wipes the roles again (append to the list there instead, "
        "or give that entry a key sorting before 'fracspawner')"
    )
