"""The roles fracspawner asks of a hub, loaded by the real JupyterHub (issue 28 items 2 and 3).

Role loading is JupyterHub's own code, run in-process on an in-memory database:
`JupyterHub.init_role_creation` (load_roles, the default roles, `extra_user_scopes`), then
`init_services`, `init_api_tokens` and `init_role_assignment`, and each token's scopes as the
hub expands them (`jupyterhub.scopes.get_scopes_for`, what `GET /hub/api/user` answers). The
hub config comes from tests/z2jh_support.py's model of z2jh's jupyterhub_config.py, whose
`hub.config` pass-through runs after hub.loadRoles (and can replace it), and hub.extraConfig
last. The culler's and the service's own scope checks ask a real JupyterHub process.
"""

from __future__ import annotations

import tempfile
from typing import Any

import pytest
import yaml
from traitlets.config import Config

import fracspawner
from fracspawner.model.hubroles import CULLER_SCOPES, SERVICE_SCOPES
from tests.conftest import REPO
from tests.z2jh_support import hub_config, merged_values

OVERLAY = yaml.safe_load((REPO / "examples" / "z2jh" / "values.yaml").read_text())
CATALOG = str(REPO / "examples" / "catalogs" / "demo.yaml")
TOKENS = {"fracspawner": "s" * 32, "fracspawner-culler": "c" * 32}
OFFERS = "access:services!service=fracspawner"


async def load_roles(c: Config) -> dict[str, Any]:
    """What the real JupyterHub makes of `c`'s roles: {"user": the `user` role's scopes,
    "roles": every role's name, <service>: its token's expanded scopes}."""
    from jupyterhub import orm, scopes
    from jupyterhub.app import JupyterHub

    c = Config(c)
    tmp = tempfile.mkdtemp()
    c.JupyterHub.db_url = "sqlite:///:memory:"
    c.JupyterHub.cookie_secret_file = f"{tmp}/cookie_secret"
    c.JupyterHub.authenticator_class = "dummy"
    # z2jh gives each service its token from its Secret (get_secret_value)
    services = [dict(s) for s in c.JupyterHub.get("services", [])]
    for service in services:
        if service["name"] in TOKENS:
            service["api_token"] = TOKENS[service["name"]]
    c.JupyterHub.services = services
    app = JupyterHub(config=c)
    app.init_db()
    app.init_hub()
    app.init_oauth()
    await app.init_role_creation()
    await app.init_users()
    await app.init_groups()
    app.init_services()
    await app.init_api_tokens()
    await app.init_role_assignment()
    found: dict[str, Any] = {
        "user": sorted(orm.Role.find(app.db, "user").scopes),
        "roles": {r.name for r in app.db.query(orm.Role)},
    }
    for name, token in TOKENS.items():
        orm_token = orm.APIToken.find(app.db, token)
        found[name] = set() if orm_token is None else set(scopes.get_scopes_for(orm_token))
    app.db.close()
    return found


def z2jh(*operator: dict) -> Config:
    """The hub config z2jh builds from the operator's values, then the overlay."""
    return hub_config(merged_values(*operator, OVERLAY), catalog_file=CATALOG)


# ------------------------------------------------------------------ item 2: the services' roles
OPS_ROLE = {"name": "ops", "scopes": ["admin:users"], "users": ["ops"]}


@pytest.mark.parametrize(
    "operator",
    [
        {},
        {"hub": {"loadRoles": {"ops": {"scopes": ["admin:users"], "users": ["ops"]}}}},
        # z2jh applies hub.config after hub.loadRoles: this list replaces every role there
        {"hub": {"config": {"JupyterHub": {"load_roles": [OPS_ROLE]}}}},
        # a role of the culler's name with less in it: the culler still gets what it needs
        {
            "hub": {
                "config": {
                    "JupyterHub": {
                        "load_roles": [
                            OPS_ROLE,
                            {"name": "fracspawner-culler", "scopes": ["list:users"]},
                        ]
                    }
                }
            }
        },
    ],
    ids=["no-roles", "hub.loadRoles", "hub.config.JupyterHub.load_roles", "a-narrower-role"],
)
async def test_the_services_tokens_get_their_scopes_whatever_key_holds_the_operators_roles(
    operator,
):
    loaded = await load_roles(z2jh(operator))
    assert set(CULLER_SCOPES) <= loaded["fracspawner-culler"], loaded["fracspawner-culler"]
    assert set(SERVICE_SCOPES) <= loaded["fracspawner"], loaded["fracspawner"]
    assert "access:servers" not in loaded["fracspawner-culler"]  # never into user servers
    if operator:
        assert "ops" in loaded["roles"]  # the operator's roles are kept
    assert OFFERS in loaded["user"]  # users still reach the live-offers service


# ------------------------------------------------------------------ item 3: the `user` role
async def test_the_operators_extra_user_scopes_are_kept():
    """JupyterHub >= 6 adds `extra_user_scopes` to the default `user` role, and ignores them
    when load_roles has a `user` role with scopes (jupyterhub/app.py init_role_creation): the
    overlay must not make one."""
    from jupyterhub.app import JupyterHub

    assert "extra_user_scopes" in JupyterHub.class_trait_names()  # JupyterHub 6, installed here
    grafana = "access:services!service=grafana"
    extra = {"hub": {"config": {"JupyterHub": {"extra_user_scopes": [grafana]}}}}
    loaded = await load_roles(z2jh(extra))
    assert set(loaded["user"]) >= {"self", grafana, OFFERS}, loaded["user"]


async def test_an_operators_empty_user_role_stays_without_self():
    """An operator who took `self` away from every user (scopes: []) keeps it away: only the
    live-offers service is added."""
    empty = {"hub": {"loadRoles": {"user": {"scopes": []}}}}
    loaded = await load_roles(z2jh(empty))
    assert loaded["user"] == [OFFERS]
    # the same through hub.config
    empty = {"hub": {"config": {"JupyterHub": {"load_roles": [{"name": "user", "scopes": []}]}}}}
    assert (await load_roles(z2jh(empty)))["user"] == [OFFERS]


async def test_the_operators_user_role_keeps_its_scopes_and_gains_the_service():
    grafana = "access:services!service=grafana"
    mine = {"hub": {"loadRoles": {"user": {"scopes": ["self", grafana]}}}}
    assert set((await load_roles(z2jh(mine)))["user"]) == {"self", grafana, OFFERS}


async def test_on_a_hub_without_extra_user_scopes_the_default_role_is_extended(monkeypatch):
    """JupyterHub 5 has no extra_user_scopes: the `user` role is the only way, with the
    default role's `self`."""
    monkeypatch.setattr(fracspawner, "hub_has_extra_user_scopes", lambda: False)
    c = Config()
    fracspawner.add_user_scopes(c, OFFERS)
    assert c.JupyterHub.load_roles == [{"name": "user", "scopes": ["self", OFFERS]}]
    assert set((await load_roles(c))["user"]) == {"self", OFFERS}
