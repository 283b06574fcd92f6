"""docs/admin-guide.md's plain-JupyterHub service snippet, run as a `jupyterhub_config.py` runs,
grants what the service needs: the scopes are computed with JupyterHub's own scope code
(jupyterhub.scopes.expand_scopes, _intersect_expanded_scopes: an OAuth token acts with what its
client may be granted AND what its owner holds, jupyterhub/oauth/provider.py validate_scopes and
jupyterhub/scopes.py get_scopes_for)."""

from __future__ import annotations

import re
import sys
from typing import Any

import pytest
import yaml
from traitlets.config import Config

from fracspawner.hub.admin import ADMIN_SCOPE
from tests.conftest import REPO

GUIDE = REPO / "docs" / "admin-guide.md"
OVERLAY = REPO / "examples" / "z2jh" / "values.yaml"


def _snippet() -> str:
    section = GUIDE.read_text().split("## Live counts in the picker", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    return code


def _run_snippet() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The service entry and load_roles the snippet configures."""
    c = Config()
    exec(compile(_snippet(), str(GUIDE), "exec"), {"c": c, "sys": sys})  # noqa: S102
    services = c.JupyterHub.services.get_value([])
    (service,) = [s for s in services if s["name"] == "fracspawner"]
    return service, list(c.JupyterHub.load_roles)


def _token_scopes(allowed: list[str], owner_scopes: list[str]) -> frozenset[str]:
    from jupyterhub import orm
    from jupyterhub.scopes import _intersect_expanded_scopes, expand_scopes

    user = orm.User(name="ada")
    return frozenset(
        _intersect_expanded_scopes(
            expand_scopes(allowed, owner=user), expand_scopes(owner_scopes, owner=user)
        )
    )


@pytest.mark.filterwarnings("ignore:Not expanding !user filter")
def test_the_documented_service_opens_the_admin_page_for_admins_only():
    from jupyterhub.roles import get_default_roles

    service, _ = _run_snippet()
    allowed = service["oauth_client_allowed_scopes"]
    roles = {r["name"]: r["scopes"] for r in get_default_roles()}
    # the admin page's gate (fracspawner/hub/admin.py): every server readable, unfiltered
    assert ADMIN_SCOPE in _token_scopes(allowed, roles["admin"]), allowed
    assert ADMIN_SCOPE not in _token_scopes(allowed, roles["user"])
    # and what the picker needs of a user's token: their groups and their own servers
    user_token = _token_scopes(allowed, roles["user"])
    assert {"read:users:groups!user=ada", "read:servers!user=ada"} <= user_token, user_token


@pytest.mark.filterwarnings("ignore:Not expanding !user filter")
def test_the_documented_roles_grant_the_service_what_the_z2jh_overlay_grants():
    """The service's own token reads the active servers (admin page) and the culler's state:
    the z2jh overlay's `fracspawner-service` role, which tests/test_z2jh.py holds to the chart."""
    from jupyterhub.scopes import expand_scopes

    service, roles = _run_snippet()
    overlay = yaml.safe_load(OVERLAY.read_text())["hub"]
    z2jh_service = overlay["services"]["fracspawner"]
    assert set(service["oauth_client_allowed_scopes"]) == set(
        z2jh_service["oauth_client_allowed_scopes"]
    )
    # the overlay grants the service's role from here (fracspawner.add_service_roles)
    from fracspawner.model.hubroles import SERVICE_SCOPES

    assert "add_service_roles(c, service=" in overlay["extraConfig"]["fracspawner"]
    needed = expand_scopes(list(SERVICE_SCOPES))
    granted: set[str] = set()
    for role in roles:
        if "fracspawner" in role.get("services", []):
            granted |= expand_scopes(role["scopes"])
    assert needed <= granted, sorted(needed - granted)
    # users still reach the service, and the snippet grants users nothing else new
    (user,) = [r for r in roles if r["name"] == "user"]
    assert "access:services!service=fracspawner" in user["scopes"]
