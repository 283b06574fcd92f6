"""FracSpawner next to Zero to JupyterHub (z2jh) 4.4.0: the pod z2jh's own hub config produces.

z2jh's chart cannot be fetched here; tests/z2jh_support.py reproduces the parts that matter
(its defaults, Helm's value composition, jupyterhub_config.py's user scheduler, metadata-block
init container, services, roles and extraConfig), citing z2jh's files. HAMi's admission
webhook is reproduced from Project-HAMi/HAMi pkg/scheduler/webhook.go (same module).
"""

from __future__ import annotations

import pytest
import yaml

from fracspawner.cli.plan import build_manifest
from tests.conftest import REPO
from tests.z2jh_support import hami_webhook, hub_config, merged_values

OVERLAY = yaml.safe_load((REPO / "examples" / "z2jh" / "values.yaml").read_text())
CATALOGS = REPO / "examples" / "catalogs"


async def z2jh_pod(catalog: str, options: dict, *config_layers: dict) -> dict:
    """The pod FracSpawner creates in a z2jh hub configured with the operator's values
    (`config_layers`) and then examples/z2jh/values.yaml, as `helm upgrade -f ... -f ...`."""
    values = merged_values(*config_layers, OVERLAY)
    path = str(CATALOGS / catalog)
    c = hub_config(values, release="jhub", catalog_file=path)
    return await build_manifest(path, options, admin=True, config=c)


# ------------------------------------------------------------------ item 1: own schedulers
@pytest.mark.parametrize(
    ("catalog", "options", "scheduler"),
    [
        ("hami.yaml", {"gpu": "1/4", "pool": "h100"}, "hami-scheduler"),
        ("hami.yaml", {"gpu": "10GiB", "pool": "h100"}, "hami-scheduler"),
        ("volcano.yaml", {"gpu": "1/4", "pool": "a100-volcano"}, "volcano"),
        ("runai.yaml", {"gpu": "1/4", "pool": "a100-runai"}, "runai-scheduler"),
        ("runai.yaml", {"gpu": "1/4", "pool": "l40s-kai"}, "kai-scheduler"),
    ],
)
async def test_backends_with_their_own_scheduler_name_it_under_z2jhs_user_scheduler(
    catalog, options, scheduler
):
    """z2jh's default `scheduling.userScheduler.enabled: true` sets
    c.KubeSpawner.scheduler_name = "<fullname>-user-scheduler"; a slice of a backend whose
    scheduler books the GPU must name that scheduler whatever z2jh set."""
    pod = await z2jh_pod(catalog, options, {})
    assert pod["spec"]["schedulerName"] == scheduler


async def test_a_hami_slice_under_z2jh_defaults_passes_hamis_webhook():
    """With z2jh's defaults (user scheduler + the privileged block-cloud-metadata init
    container) the pod HAMi's webhook receives is admitted and handed to HAMi's scheduler."""
    pod = await z2jh_pod("hami.yaml", {"gpu": "1/4", "pool": "h100"}, {})
    answer = hami_webhook(pod)
    assert answer["allowed"], answer["message"]
    assert answer["pod"]["spec"]["schedulerName"] == "hami-scheduler"
    init = [c["name"] for c in pod["spec"].get("initContainers") or []]
    assert "block-cloud-metadata" not in init


async def test_hami_slice_drops_the_metadata_block_even_when_the_operator_keeps_it():
    """An operator whose own config turns `blockWithIptables` back on (after the overlay,
    or an older overlay): FracSpawner leaves the privileged init container out of HAMi pods
    only (z2jh's singleuser NetworkPolicy still blocks the metadata IP)."""
    keep = {"singleuser": {"cloudMetadata": {"blockWithIptables": True}}}
    values = merged_values(OVERLAY, keep)
    assert values["singleuser"]["cloudMetadata"]["blockWithIptables"] is True
    path = str(CATALOGS / "hami.yaml")
    c = hub_config(values, catalog_file=path)
    pod = await build_manifest(path, {"gpu": "1/2", "pool": "h100"}, admin=True, config=c)
    assert hami_webhook(pod)["allowed"]
    init = [i["name"] for i in pod["spec"].get("initContainers") or []]
    assert "block-cloud-metadata" not in init
    # a CPU server of the same hub keeps z2jh's user scheduler and the metadata block
    cpu = await build_manifest(path, {"gpu": "none"}, admin=True, config=c)
    assert cpu["spec"]["schedulerName"] == "jhub-user-scheduler"
    (block,) = cpu["spec"]["initContainers"]
    assert block["name"] == "block-cloud-metadata" and block["securityContext"]["privileged"]


def test_the_overlay_turns_the_iptables_metadata_block_off():
    """examples/z2jh/values.yaml says what to turn off: z2jh's NetworkPolicy
    (egressAllowRules.cloudMetadataServer: false, its default) already blocks the IP."""
    values = merged_values({}, OVERLAY)
    assert values["singleuser"]["cloudMetadata"]["blockWithIptables"] is False
    assert values["singleuser"]["networkPolicy"]["egressAllowRules"]["cloudMetadataServer"] is False


# ------------------------------------------------------------------ the fracspawner chart
def _chart_objects(values: dict) -> list[dict]:
    from tests.chart_support import objects, render

    return objects(render(values))


def _container(objs: list[dict], component: str) -> dict:
    from tests.chart_support import one

    return one(objs, "Deployment", component)["spec"]["template"]["spec"]["containers"][0]


def test_the_hub_api_url_follows_z2jhs_base_url():
    """z2jh's hub.baseUrl moves the hub API: z2jh's own culler is started with
    `--url=http://localhost:8081` + url_path_join(base_url, "hub/api")
    (jupyterhub/files/hub/jupyterhub_config.py, its `cull.enabled` block). The chart's
    service and culler call the same path when given only jupyterhub.baseUrl."""
    objs = _chart_objects({"jupyterhub": {"baseUrl": "/jhub/"}})
    culler = _container(objs, "culler")
    assert "--url=http://hub:8081/jhub/hub/api" in culler["command"]
    env = {e["name"]: e.get("value") for e in _container(objs, "service")["env"]}
    assert env["JUPYTERHUB_API_URL"] == "http://hub:8081/jhub/hub/api"
    assert env["JUPYTERHUB_SERVICE_PREFIX"] == "/jhub/services/fracspawner/"
    # the default and an explicit URL are what they were
    default = _container(_chart_objects({}), "culler")
    assert "--url=http://hub:8081/hub/api" in default["command"]
    explicit = _chart_objects({"jupyterhub": {"apiUrl": "http://hub.jhub.svc:8081/x/hub/api"}})
    assert "--url=http://hub.jhub.svc:8081/x/hub/api" in _container(explicit, "culler")["command"]


def test_values_follow_z2jhs_conventions():
    """Where the chart's values overlap z2jh's they take z2jh's shapes
    (jupyterhub/values.yaml and values.schema.yaml): image {name, tag, pullPolicy},
    imagePullSecrets as names or {name} objects, extraEnv as a map or a list, and core pods
    tolerate z2jh's `hub.jupyter.org/dedicated=core` taint (scheduling.corePods.tolerations)."""
    import kubernetes_validate

    objs = _chart_objects(
        {
            "image": {"name": "registry.example.org/fracspawner", "tag": "1.2.3"},
            "imagePullSecrets": ["regcred", {"name": "other"}],
            "culler": {"extraEnv": {"TZ": "UTC", "FROM_SECRET": {"valueFrom": {
                "secretKeyRef": {"name": "s", "key": "k"}}}}},
            "service": {"extraEnv": [{"name": "TZ", "value": "UTC"}]},
        }
    )  # fmt: skip
    culler = _container(objs, "culler")
    assert culler["image"] == "registry.example.org/fracspawner:1.2.3"
    assert culler["imagePullPolicy"] == "IfNotPresent"
    env = {e["name"]: e for e in culler["env"]}
    assert env["TZ"] == {"name": "TZ", "value": "UTC"}
    assert env["FROM_SECRET"]["valueFrom"]["secretKeyRef"] == {"name": "s", "key": "k"}
    assert {"name": "TZ", "value": "UTC"} in _container(objs, "service")["env"]
    from tests.chart_support import one

    spec = one(objs, "Deployment", "culler")["spec"]["template"]["spec"]
    assert spec["imagePullSecrets"] == [{"name": "regcred"}, {"name": "other"}]
    core = {"key": "hub.jupyter.org/dedicated", "operator": "Equal", "value": "core"}
    assert {**core, "effect": "NoSchedule"} in spec["tolerations"]
    for obj in objs:
        if obj["kind"] in ("Deployment", "Pod", "Secret", "ConfigMap", "Service"):
            kubernetes_validate.validate(obj, "1.33.0", strict=True)


def test_the_culler_role_lets_exempt_groups_work(tmp_path):
    """`--Culler.exempt_groups` (the chart's suggested culler.extraArgs) needs each user's
    groups: JupyterHub's user model carries `groups` only for a token with read:users or
    read:users:groups (jupyterhub/apihandlers/base.py `user_model`, its access_map). The
    culler role the overlay's and NOTES' hub.extraConfig add (fracspawner.add_service_roles),
    expanded by JupyterHub's own scope code, must grant it."""
    from jupyterhub.scopes import expand_scopes

    from tests.chart_support import render

    notes = render({})["fracspawner/templates/NOTES.txt"]
    printed = yaml.safe_load(
        notes.split("in the same namespace:\n", 1)[1].split("\nz2jh generates", 1)[0]
    )
    for overlay in (OVERLAY, printed):
        c = hub_config(merged_values({}, overlay), catalog_file=str(CATALOGS / "demo.yaml"))
        (role,) = [r for r in c.JupyterHub.load_roles if r["name"] == "fracspawner-culler"]
        assert role["services"] == ["fracspawner-culler"]
        granted = expand_scopes(role["scopes"])
        assert {"read:users:groups", "read:users"} & granted, granted
        assert "access:servers" not in granted  # still never into user servers
    assert "exempt_groups" in (REPO / "charts/fracspawner/values.yaml").read_text()


# ------------------------------------------------------------------ item 3: Helm replaces lists
#: an operator's own z2jh config with lists the overlay also touches
OPERATOR = {
    "hub": {
        "loadRoles": {
            "user": {"scopes": ["self", "access:services!service=grafana"]},
        },
        "extraConfig": {"00-site": "c.JupyterHub.admin_access = False\n"},
    },
    "singleuser": {
        "networkPolicy": {
            "egress": [{"to": [{"ipBlock": {"cidr": "10.20.0.0/16"}}], "ports": [{"port": 5432}]}]
        }
    },
}


def test_the_overlay_after_the_operators_config_drops_none_of_its_lists():
    """`helm upgrade -f config.yaml -f overlay.yaml`: Helm replaces a list of a later file
    whole. The operator's singleuser egress and their `user` role's scopes survive, and the
    hub still grants users the live-offers service (added to their role, not replacing it)."""
    values = merged_values(OPERATOR, OVERLAY)
    assert (
        values["singleuser"]["networkPolicy"]["egress"]
        == (OPERATOR["singleuser"]["networkPolicy"]["egress"])
    )
    assert values["hub"]["loadRoles"]["user"] == OPERATOR["hub"]["loadRoles"]["user"]
    c = hub_config(values, catalog_file=str(CATALOGS / "demo.yaml"))
    (user,) = [r for r in c.JupyterHub.load_roles if r["name"] == "user"]
    assert set(user["scopes"]) == {
        "self",
        "access:services!service=grafana",
        "access:services!service=fracspawner",
    }
    # without a `user` role of the operator's, JupyterHub's default one gains the scope
    # through extra_user_scopes (JupyterHub >= 6; tests/test_hub_roles.py loads the roles)
    c = hub_config(merged_values({}, OVERLAY), catalog_file=str(CATALOGS / "demo.yaml"))
    assert not [r for r in c.JupyterHub.load_roles if r["name"] == "user"]
    assert "access:services!service=fracspawner" in c.JupyterHub.extra_user_scopes


def test_the_overlay_has_no_list_but_the_hub_volumes_which_install_md_says_to_merge():
    """What the overlay still sets as lists are the hub's catalog volume and mount; the overlay
    and docs/install.md tell the operator to add them to their own lists where they have them."""

    def lists(node, path=""):
        if isinstance(node, list):
            yield path
        elif isinstance(node, dict):
            for key, value in node.items():
                yield from lists(value, f"{path}.{key}" if path else key)

    found = {p for p in lists(OVERLAY) if not p.startswith("hub.services")}
    # (the services' roles are added by hub.extraConfig, not hub.loadRoles: issue 28 #2)
    assert found == {"hub.extraVolumes", "hub.extraVolumeMounts"}
    text = (REPO / "docs" / "install.md").read_text()
    assert "hub.extraVolumes" in text and "Helm replaces lists" in text


def test_the_chart_lets_user_pods_reach_the_culler_without_z2jhs_egress_list():
    """Instead of the overlay's singleuser.networkPolicy.egress (a list that would replace the
    operator's), the chart adds its own egress NetworkPolicy for z2jh's user pods:
    NetworkPolicies add up, so the pods may reach the culler's report port."""
    from tests.chart_support import one

    objs = _chart_objects({})
    policies = [
        o for o in objs
        if o["kind"] == "NetworkPolicy"
        and o["spec"]["podSelector"].get("matchLabels", {}).get("component") == "singleuser-server"
    ]  # fmt: skip
    (policy,) = policies
    assert policy["spec"]["policyTypes"] == ["Egress"]
    culler = one(objs, "Deployment", "culler")["spec"]["template"]["metadata"]["labels"]
    (rule,) = policy["spec"]["egress"]
    selector = rule["to"][0]["podSelector"]["matchLabels"]
    assert all(culler.get(k) == v for k, v in selector.items())
    assert rule["ports"] == [{"port": 10101, "protocol": "TCP"}]
    assert "networkPolicy" not in OVERLAY["singleuser"]


# ------------------------------------------------------------------ item 8: the hub image
def test_the_hub_image_keeps_the_kubespawner_z2jh_ships():
    """images/hub installs fracspawner[hub] with the base image's own packages as pip
    constraints, so z2jh's kubespawner (and JupyterHub) are never upgraded underneath it; the
    [hub] extra admits the kubespawner 7.0 of z2jh 4.x's hub image and 7.1, bounded below 8."""
    import re

    import tomllib
    from packaging.requirements import Requirement

    text = (REPO / "images" / "hub" / "Dockerfile").read_text()
    assert re.search(r"pip list --format=freeze > (\S+)", text), text
    constraints = re.search(r"pip list --format=freeze > (\S+)", text)[1]
    install = re.search(r"pip install [^\n]*(?:\\\n[^\n]*)*", text)[0]
    assert f"--constraint {constraints}" in install, install
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    for extra in ("hub", "culler"):
        (req,) = [
            Requirement(r)
            for r in project["optional-dependencies"][extra]
            if Requirement(r).name == "jupyterhub-kubespawner"
        ]
        assert req.specifier.contains("7.0.0") and req.specifier.contains("7.1.0"), req
        assert not req.specifier.contains("8.0.0"), req
    docs = (REPO / "docs" / "install.md").read_text()
    assert "kubespawner 7.0.0" in docs and "7.1.0" in docs  # the versions tested, said


# ------------------------------------------------------------------ item 6: one source of truth
def _docs() -> dict[str, str]:
    pages = {p.name: p.read_text() for p in (REPO / "docs").glob("*.md")}
    pages["README.md"] = (REPO / "README.md").read_text()
    return pages


def test_the_docs_z2jh_advice_is_the_overlays():
    """The admin guide's z2jh section points at examples/z2jh/values.yaml instead of carrying
    its own variant; no page routes the culler through proxy-public (the chart's culler has no
    proxy route: it is its own Service), installs fracspawner without the extra the hub needs,
    or mounts the catalog anywhere but the overlay's path."""
    import re

    guide = _docs()["admin-guide.md"]
    section = guide.split("## Zero to JupyterHub (z2jh)", 1)[1].split("\n## ", 1)[0]
    assert "examples/z2jh/values.yaml" in section
    assert "```yaml" not in section  # no second overlay to drift from the first
    overlay_catalog = "/etc/fracspawner/catalog.yaml"
    assert overlay_catalog in OVERLAY["hub"]["extraConfig"]["fracspawner"]
    for name, text in _docs().items():
        assert "proxy-public/services/fracspawner-culler" not in text, name
        assert "fracspawner-catalog.yaml" not in text, name  # one catalog path
    for name in ("admin-guide.md", "install.md"):  # the pages that install a hub
        assert not re.search(r"pip install (-e )?'?(fracspawner|\.)(?!\[)", _docs()[name]), name


def test_exempt_groups_never_cull_when_the_token_cannot_read_groups():
    """A culler whose role lacks read:users:groups (an older overlay) gets user models without
    `groups` (jupyterhub/apihandlers/base.py `user_model`): with exempt_groups set, that is
    "groups unknown", and a server is kept, never culled as if its user were in no group."""
    import time

    from fracspawner.culler.decide import Rules, decide_server
    from fracspawner.culler.hubapi import servers_from_users
    from fracspawner.model.catalog import IdlePolicy

    now = time.time()
    idle = "2000-01-01T00:00:00Z"
    model = {"name": "ada", "servers": {"": {"ready": True, "url": "/user/ada/",
             "started": idle, "last_activity": idle, "user_options": {}}}}  # fmt: skip
    policy = IdlePolicy(None, None, 3600, None)
    rules = Rules(exempt_groups=frozenset({"admins"}))
    (without,) = servers_from_users([model])
    decision = decide_server(without.facts, None, policy, now, rules)
    assert decision.action == "keep", decision
    assert "read:users:groups" in decision.message
    # with the groups readable, the same idle server of a user in no exempt group is stopped
    (readable,) = servers_from_users([{**model, "groups": ["students"]}])
    assert decide_server(readable.facts, None, policy, now, rules).action == "stop"
    # and without exempt_groups nothing needs them
    assert decide_server(without.facts, None, policy, now, Rules()).action == "stop"
