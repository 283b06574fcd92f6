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

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
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


# ------------------------------------------------------------------ item 2: saying what is missing
class RealHub:
    """A JupyterHub process (no servers spawned) with the two services and the roles a test
    gives them; `GET /hub/api/user` answers each token's scopes as the hub expands them."""

    def __init__(self, tmp: Path, roles: list[dict[str, Any]]):
        from devcluster.localhub import find_proxy, free_port

        self.tmp, self.port = tmp, free_port()
        self.api_url = f"http://127.0.0.1:{self.port}/hub/api"
        services = [{"name": n, "api_token": t} for n, t in TOKENS.items()]
        (tmp / "jupyterhub_config.py").write_text(
            f"""
c = get_config()  # noqa
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = {self.port}
c.JupyterHub.hub_port = {free_port()}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{free_port()}"
c.ConfigurableHTTPProxy.command = [{find_proxy()!r}]
c.JupyterHub.db_url = "sqlite:///{tmp}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = "{tmp}/cookie_secret"
c.JupyterHub.pid_file = "{tmp}/jupyterhub.pid"
c.ConfigurableHTTPProxy.pid_file = "{tmp}/proxy.pid"
c.JupyterHub.authenticator_class = "dummy"
c.JupyterHub.services = {services!r}
c.JupyterHub.load_roles = {roles!r}
"""
        )
        self.log = open(tmp / "hub.log", "wb")  # noqa: SIM115
        self.process = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", str(tmp / "jupyterhub_config.py")],
            cwd=tmp, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        from tests.test_culler_support import wait_for

        wait_for(self._up, 90, "jupyterhub")

    def _up(self) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError((self.tmp / "hub.log").read_text()[-3000:])
        try:
            with urllib.request.urlopen(self.api_url + "/", timeout=5) as resp:
                return resp.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # the proxy, should it be left
        except ProcessLookupError:
            pass
        self.log.close()


@pytest.fixture(scope="module")
def wiped_hub(tmp_path_factory):
    """The services' roles lost (an operator's load_roles replaced them): the culler keeps
    only list:users (it sees users, no servers, and stops nothing: quietly useless), the
    service has no role at all."""
    hub = RealHub(
        tmp_path_factory.mktemp("hub"),
        [{"name": "ops", "scopes": ["list:users"], "services": ["fracspawner-culler"]}],
    )
    yield hub
    hub.stop()


async def _get(url: str) -> tuple[int, str]:
    from tornado.httpclient import AsyncHTTPClient

    resp = await AsyncHTTPClient().fetch(url, raise_error=False)
    return resp.code, resp.body.decode() if resp.body else ""


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


async def test_the_culler_says_at_start_which_scopes_its_token_lacks(wiped_hub):
    from devcluster.localhub import free_port
    from fracspawner.culler import Culler

    port = free_port()
    culler = Culler(api_token=TOKENS["fracspawner-culler"], url=wiped_hub.api_url,
                    metrics_port=port, metrics_ip="127.0.0.1", cull_every=3600)  # fmt: skip
    culler.initialize([])
    errors = Lines()
    culler.log.addHandler(errors)  # the culler's log does not propagate (traitlets)
    task = asyncio.ensure_future(culler.run())
    try:
        health = f"http://127.0.0.1:{port}/health"
        for _ in range(1200):  # until the culler has started and checked its token
            try:
                code, body = await _get(health)
            except OSError:
                code, body = 0, ""
            if code == 503:
                break
            await asyncio.sleep(0.1)
        assert code == 503, (code, body)
        answer = json.loads(body)
        metrics = (await _get(f"http://127.0.0.1:{port}/metrics"))[1]
    finally:
        task.cancel()
    missing = ["read:users:activity", "read:servers", "delete:servers"]
    assert answer["missing"] == missing
    assert "delete:servers (stop idle servers)" in answer["message"]
    assert 'fracspawner_culler_missing_scope{scope="delete:servers"} 1.0' in metrics
    assert 'fracspawner_culler_missing_scope{scope="list:users"} 0.0' in metrics
    culler.log.removeHandler(errors)
    assert any("delete:servers" in e and "fracspawner.add_service_roles" in e for e in errors.lines)
    state = culler.state_json(0)
    assert state["scopes_missing"] == missing and "delete:servers" in state["problems"][0]


async def test_the_service_says_which_scopes_its_token_lacks_on_its_admin_page(wiped_hub):
    from fracspawner.backends import load_catalog
    from fracspawner.hub.admin import AdminData, render_admin_page
    from fracspawner.hub.scopecheck import own_scope_problem

    problem = await own_scope_problem(wiped_hub.api_url, TOKENS["fracspawner"])
    assert "list:users (list the users with running servers)" in problem
    assert "read:servers" in problem
    # the hub's 403 to the page's server list says it again, on the page
    admin = AdminData(load_catalog(CATALOG), None, hub_api_url=wiped_hub.api_url,
                      token=TOKENS["fracspawner"])  # fmt: skip
    model = await admin.model()
    assert model["problems"] == [problem]
    page = render_admin_page(model, user="admin", hub_prefix="/hub/", static_prefix="/s/")
    assert "list:users (list the users with running servers)" in page


# ------------------------------------------------------------------ issue 34 item 10: the probes
def test_the_charts_readiness_probes_fail_while_the_tokens_lack_scopes(wiped_hub, tmp_path):
    """The chart's service and culler containers, run as the kubelet runs them against a real
    hub whose roles for them were lost: their readiness probes answer 503 with what is missing
    (the pods leave the Service's endpoints and show not Ready), while their liveness probes
    still pass (a restart would not grant a scope)."""
    from devcluster.localhub import free_port
    from tests.chart_support import Container, objects, one, render

    values = {
        "catalog": yaml.safe_load(Path(CATALOG).read_text()),
        "service": {"port": free_port(), "liveCapacity": False},
        "culler": {"metricsPort": free_port(), "reportPort": 0, "cullEvery": 3600},
        "jupyterhub": {"apiUrl": wiped_hub.api_url},
        "networkPolicy": {"enabled": False},
    }
    objs = objects(render(values))
    secrets = {("hub", f"hub.services.{name}.apiToken"): t for name, t in TOKENS.items()}
    running: list[Container] = []
    try:
        for component in ("service", "culler"):
            deployment = one(objs, "Deployment", component)
            running.append(
                Container(
                    deployment,
                    objs,
                    tmp_path / component,
                    secrets=secrets,
                    fields={"metadata.namespace": "jhub"},
                )  # fmt: skip
            )
        service, culler = running
        for container, missing in ((service, list(SERVICE_SCOPES)),
                                   (culler, ["read:users:activity", "read:servers",
                                             "delete:servers"])):  # fmt: skip
            # the culler checks its token once it has started: until then its probe is 200
            status, body = container.probe(until=lambda status, body: status == 503)
            answer = json.loads(body)
            assert answer["missing"] == missing, answer
            assert "fracspawner.add_service_roles" in answer["message"]
            assert container.probe("livenessProbe")[0] == 200
    finally:
        for container in running:
            container.stop()


@pytest.mark.parametrize("key", ["00-mine", "zz-mine"])
async def test_an_extra_config_key_after_fracspawners_that_assigns_load_roles_wipes_them(key):
    """z2jh runs hub.extraConfig's entries in the order of their keys: an operator's entry
    sorting after the overlay's `fracspawner` that assigns load_roles replaces the services'
    roles (one sorting before it does not). Nothing in the hub's config can undo a later
    assignment, so the docs and the scope error say it, with what to do."""
    from fracspawner.model.hubroles import scope_problem

    mine = f"c.JupyterHub.load_roles = [{OPS_ROLE!r}]"
    loaded = await load_roles(z2jh({"hub": {"extraConfig": {key: mine}}}))
    assert "ops" in loaded["roles"]
    kept = set(CULLER_SCOPES) <= loaded["fracspawner-culler"]
    assert kept == (key < "fracspawner"), loaded["fracspawner-culler"]
    # the remedy the advice gives: append instead of assigning
    mine = f"c.JupyterHub.load_roles.append({OPS_ROLE!r})"
    loaded = await load_roles(z2jh({"hub": {"extraConfig": {key: mine}}}))
    assert set(CULLER_SCOPES) <= loaded["fracspawner-culler"]
    assert "ops" in loaded["roles"]
    advice = scope_problem("culler", ["delete:servers"], "fracspawner-culler")
    assert "fracspawner.add_service_roles" in advice  # the overlay's call, by its name
    assert "sorts after 'fracspawner'" in advice and "append" in advice
    install = (REPO / "docs" / "install.md").read_text()
    assert "sorts after `fracspawner`" in install
