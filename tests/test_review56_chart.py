"""Review s56 of the Helm chart (charts/fracspawner), on the manifests Helm's own code renders
(helm-python-sdk, tests/chart_support.render).

- The hub asks the culler for room on over-committed pools at `culler_url` + `api/room`, the
  culler's report port (NOTES's culler_url): the culler's NetworkPolicy must admit the hub's
  pods there, not only the user pods that push reports.
- Values rendered into YAML unquoted: a string the schema took could carry a newline (more
  command-line flags, another RBAC subject), `: ` (a map where a flag was) or ` #` (a value cut
  short). Each is refused by the schema with its path, or rendered as the one string it is.
"""

from __future__ import annotations

import re

import pytest

from tests.chart_support import NAMESPACE, objects, one, render

WEBHOOK = {"webhook": {"enabled": True}}


def _command(objs: list[dict], component: str) -> list:
    return one(objs, "Deployment", component)["spec"]["template"]["spec"]["containers"][0][
        "command"
    ]


# ------------------------------------------------------------------ the hub reaches api/room
def test_the_hub_may_reach_the_culler_where_it_asks_for_room():
    """FracSpawner.culler_room_url defaults to culler_url + "api/room" (hub/spawner.py), and
    the culler serves api/room on its report port next to api/reports (culler/app.py). The
    hub's request comes from the hub pod; before, the culler's ingress admitted only the
    singleuser pods to that port, so every room question timed out and over-committed pools
    were admitted by slot counts alone ("no answer: admitted as before")."""
    rendered = render({})
    notes = rendered["fracspawner/templates/NOTES.txt"]
    (url,) = re.findall(r'c\.FracSpawner\.culler_url = "([^"]+)"', notes)
    objs = objects(rendered)
    culler = one(objs, "Deployment", "culler")["spec"]["template"]["spec"]["containers"][0]
    port_name = next(
        p["name"] for p in culler["ports"] if url.rstrip("/").endswith(f":{p['containerPort']}")
    )
    assert port_name == "reports"
    policy = one(objs, "NetworkPolicy", "culler")
    admitted = [
        peer["podSelector"]["matchLabels"]
        for rule in policy["spec"]["ingress"]
        if "reports" in {p["port"] for p in rule["ports"]}
        for peer in rule["from"]
    ]
    assert {"app": "jupyterhub", "component": "hub"} in admitted
    assert {"app": "jupyterhub", "component": "singleuser-server"} in admitted
    # user pods still reach no other port of the culler (metrics, /api/state there)
    for rule in policy["spec"]["ingress"]:
        if {p["port"] for p in rule["ports"]} != {"reports"}:
            assert {"app": "jupyterhub", "component": "singleuser-server"} not in [
                peer.get("podSelector", {}).get("matchLabels") for peer in rule["from"]
            ]


# ------------------------------------------------------------------ values rendered unquoted
def _client_auth(*names: str) -> dict:
    return {
        "webhook": {
            "enabled": True,
            "clientAuth": {"caSecret": "apiserver-ca", "names": list(names),
                           "detailedRefusals": False},
        }
    }  # fmt: skip


#: values the schema must refuse (a Kubernetes name cannot be these), with the path Helm names
REFUSED = [
    (
        {"jupyterhub": {"hubServiceAccount": {
            "name": "hub\n  - kind: Group\n    name: system:authenticated", "namespace": ""}}},
        "/jupyterhub/hubServiceAccount/name",
    ),
    ({"jupyterhub": {"hubServiceAccount": {"name": "hub", "namespace": "a: b"}}},
     "/jupyterhub/hubServiceAccount/namespace"),
    ({"webhook": {"enabled": True, "trustedPodNamespaces": [
        "kube-system\n            - --detailed-refusals"]}},
     "/webhook/trustedPodNamespaces/0"),
    ({"kubeflowCuller": {"enabled": True, "clusterDomain": "c\n" + " " * 12 + "- --dry-run"}},
     "/kubeflowCuller/clusterDomain"),
    ({"webhook": {"enabled": True, "clusterDomain": "cluster local"}}, "/webhook/clusterDomain"),
    ({"webhook": {"enabled": True, "clientAuth": {
        "caSecret": "ca\n    evil: true", "names": [], "detailedRefusals": False}}},
     "/webhook/clientAuth/caSecret"),
]  # fmt: skip


@pytest.mark.parametrize(("values", "path"), REFUSED, ids=[p for _, p in REFUSED])
def test_names_that_would_change_the_manifests_are_refused(values, path):
    """Before, the schema took these (minLength only) and Helm rendered them unquoted: a newline
    in the hub's ServiceAccount name bound the capacity ClusterRole (pods and nodes, cluster-wide)
    to `system:authenticated`; one in trustedPodNamespaces or the Kubeflow culler's clusterDomain
    added `--detailed-refusals` or `--dry-run` to the command."""
    import helm_python as helm

    with pytest.raises(helm.HelmValuesError) as info:
        render(values)
    assert path in str(info.value), str(info.value)


@pytest.mark.parametrize(
    ("values", "component", "arg"),
    [
        # a client certificate's common name may hold any character: it is passed as it is
        (_client_auth("kube-apiserver #1"), "webhook", "--client-name=kube-apiserver #1"),
        (_client_auth("API server: prod"), "webhook", "--client-name=API server: prod"),
        (
            _client_auth("a\n            - --detailed-refusals"),
            "webhook",
            "--client-name=a\n            - --detailed-refusals",
        ),
        (
            {"culler": {"prometheusUrl": "http://prometheus:9090/#x"}},
            "culler",
            "--prometheus-url=http://prometheus:9090/#x",
        ),
        (
            {"culler": {"prometheusUrl": "http://prometheus: 9090"}},
            "culler",
            "--prometheus-url=http://prometheus: 9090",
        ),
        (
            {"kubeflowCuller": {"enabled": True, "prometheusUrl": "http://p #x"}},
            "kubeflow-culler",
            "--prometheus-url=http://p #x",
        ),
    ],
    ids=["cn-hash", "cn-colon", "cn-newline", "url-fragment", "url-colon", "kf-url-hash"],
)
def test_free_text_values_reach_the_command_as_one_argument(values, component, arg):
    """Before: `--client-name=kube-apiserver #1` became `--client-name=kube-apiserver` (a YAML
    comment: the webhook then accepted a certificate named `kube-apiserver`), `: ` made the
    argument a map (an install error far from the value), a newline added flags."""
    objs = objects(render(values))
    command = _command(objs, component)
    assert arg in command, command
    assert all(isinstance(a, str) for a in command), command
    if component == "webhook":
        assert "--detailed-refusals" not in command


def test_the_capacity_binding_names_exactly_the_hub_service_account():
    objs = objects(
        render({"jupyterhub": {"hubServiceAccount": {"name": "hub.x-1", "namespace": "other"}}})
    )
    binding = one(objs, "ClusterRoleBinding", "capacity")
    assert binding["subjects"][0] == {"kind": "ServiceAccount", "name": "hub.x-1",
                                      "namespace": "other"}  # fmt: skip
    assert {s["kind"] for s in binding["subjects"]} == {"ServiceAccount"}
    assert all(s["namespace"] in ("other", NAMESPACE) for s in binding["subjects"])


# ------------------------------------------------------------------ the webhook's PDB
@pytest.mark.parametrize(("replicas", "pdb"), [(1, False), (2, True), (3, True)])
def test_the_webhook_pdb_never_forbids_every_eviction(replicas, pdb):
    """A PodDisruptionBudget with minAvailable 1 over one replica forbids evicting it at all:
    `kubectl drain` of its node waits forever (eviction answers 429). Before, webhook.replicas=1
    rendered exactly that; now the budget is rendered only where an eviction can be allowed."""
    objs = objects(render({"webhook": {"enabled": True, "replicas": replicas}}))
    budgets = [o for o in objs if o["kind"] == "PodDisruptionBudget"]
    assert bool(budgets) == pdb
    for budget in budgets:
        assert budget["spec"]["minAvailable"] < replicas
    # a percentage is the operator's own arithmetic: kept as given
    percent = {"enabled": True, "minAvailable": "50%"}
    objs = objects(
        render({"webhook": {"enabled": True, "replicas": 1, "podDisruptionBudget": percent}})
    )
    assert one(objs, "PodDisruptionBudget", "webhook")["spec"]["minAvailable"] == "50%"


# ------------------------------------------------------------------ the webhook's own namespace
def _selects(selector: dict, name: str, labels: dict[str, str]) -> bool:
    """Whether a LabelSelector (matchLabels and matchExpressions ANDed) selects a namespace
    `name` carrying `labels` (and kubernetes.io/metadata.name, which the API server sets)."""
    labels = {**labels, "kubernetes.io/metadata.name": name}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


PROFILE = {"app.kubernetes.io/part-of": "kubeflow-profile"}
EXCLUDED = ("kube-system", NAMESPACE)


@pytest.mark.parametrize(
    "selector",
    [
        None,  # the default: profile namespaces
        {},  # merged by Helm with the default
        {"matchLabels": None},  # what an admin writes to select every namespace
        {"matchLabels": None, "matchExpressions": [{"key": "team", "operator": "Exists"}]},
        {"matchLabels": {"team": "a"}},  # Helm adds it to the default's
    ],
)
def test_the_webhook_never_selects_kube_system_nor_its_own_namespace(selector):
    """failurePolicy Fail with a selector that takes kube-system or the webhook's own namespace
    is the self-hosted webhook deadlock (Kubernetes docs, "Avoiding deadlocks in self-hosted
    webhooks"): while no webhook pod runs, no pod there can be created, the webhook's own
    replacement and CoreDNS's included. Before, webhook.namespaceSelector was used as given,
    and an admin's selector without matchLabels sent every pod of the cluster. Every webhook of
    the configuration now excludes both namespaces by name, whatever else the admin selects,
    and keeps the admin's own terms."""
    values: dict = {"enabled": True}
    if selector is not None:
        values["namespaceSelector"] = selector
    objs = objects(render({"webhook": values}))
    hooks = one(objs, "MutatingWebhookConfiguration", "webhook")["webhooks"]
    assert hooks
    for hook in hooks:
        chosen = hook["namespaceSelector"]
        for name in EXCLUDED:
            for labels in ({}, PROFILE, {**PROFILE, "team": "a"}):
                assert not _selects(chosen, name, labels), (hook["name"], name, chosen)
        # the admin's own terms are kept: a namespace they select (not excluded) still is
        if selector is None or selector == {}:
            assert _selects(chosen, "team-a", PROFILE) and not _selects(chosen, "team-a", {})
        elif selector == {"matchLabels": {"team": "a"}}:
            assert _selects(chosen, "team-a", {**PROFILE, "team": "a"})
            assert not _selects(chosen, "team-b", PROFILE)
        elif "matchExpressions" in selector:
            assert _selects(chosen, "team-a", {"team": "b"}) and not _selects(chosen, "x", {})
        else:
            assert _selects(chosen, "team-a", {}) and _selects(chosen, "default", {})


@pytest.mark.parametrize("namespace", ["kubeflow", "fracspawner-system"])
@pytest.mark.parametrize("claims", [False, True])
def test_the_exported_webhook_never_selects_kube_system_nor_its_own_namespace(namespace, claims):
    """`fracspawner kubeflow export` writes the chart's configuration for plain-manifest
    installs: the same exclusion, of kube-system and the namespace its Service is in
    (--webhook-service NS/NAME)."""
    from fracspawner.kubeflow.export import WebhookTarget, webhook_configuration

    for only in (False, True):
        target = WebhookTarget(namespace=namespace, slice_pods_only=only)
        for hook in webhook_configuration(target, claims=claims)["webhooks"]:
            chosen = hook["namespaceSelector"]
            for name in ("kube-system", namespace):
                assert not _selects(chosen, name, PROFILE), (hook["name"], name, chosen)
            assert _selects(chosen, "team-a", PROFILE) and not _selects(chosen, "team-a", {})
