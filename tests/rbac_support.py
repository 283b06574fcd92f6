"""The chart's RBAC on a real control plane (issue 35 item 3): the ServiceAccounts, Roles,
ClusterRoles and bindings the chart renders, applied as they are, with z2jh's hub Role beside
them (the hub's ServiceAccount is z2jh's), and one kubeconfig per ServiceAccount holding a
token from the TokenRequest API. A component run with one of these kubeconfigs can do exactly
what the rendered rules grant: a missing verb is a 403 from the apiserver's RBAC authoriser.
tests/test_rbac_real.py; docs/controlplane.md "RBAC"."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from devcluster.controlplane import ControlPlane
from devcluster.controlplane.serviceaccounts import (
    RBAC_KINDS,
    apply,
    request_token,
    write_token_kubeconfig,
)
from tests.chart_support import NAMESPACE, RELEASE, objects, render

#: every part of the chart that talks to the API on: the hub culler and the live-offers service
#: (on by default), the Kubeflow webhook and culler, DRA pools (claims, slices, templates)
VALUES: dict[str, Any] = {
    "dra": {"enabled": True},
    "webhook": {"enabled": True},
    "kubeflowCuller": {"enabled": True},
}
HUB = "hub"  # z2jh's hub ServiceAccount (the chart's jupyterhub.hubServiceAccount.name)
CULLER, SERVICE = f"{RELEASE}-culler", f"{RELEASE}-service"
WEBHOOK, KUBEFLOW_CULLER = f"{RELEASE}-webhook", f"{RELEASE}-kubeflow-culler"


def rendered_rbac(values: Mapping[str, Any] | None = None) -> list[dict]:
    """The chart's ServiceAccounts, Roles, ClusterRoles and bindings, as rendered."""
    kinds = set(RBAC_KINDS) - {"Namespace"}
    return [o for o in objects(render(dict(VALUES if values is None else values)))
            if o["kind"] in kinds]  # fmt: skip


def z2jh_hub_rbac(namespace: str = NAMESPACE) -> list[dict]:
    """z2jh's hub ServiceAccount, Role and RoleBinding: the Role as
    jupyterhub/zero-to-jupyterhub-k8s jupyterhub/templates/hub/rbac.yaml (4.x) grants it to
    KubeSpawner: pods, PVCs, secrets and services get/watch/list/create/delete; events
    get/watch/list. The fracspawner chart binds its own roles to this same account."""
    meta = {"name": HUB, "namespace": namespace}
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": dict(meta),
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["pods", "persistentvolumeclaims", "secrets", "services"],
                "verbs": ["get", "watch", "list", "create", "delete"],
            },
            {"apiGroups": [""], "resources": ["events"], "verbs": ["get", "watch", "list"]},
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": dict(meta),
        "subjects": [{"kind": "ServiceAccount", "name": HUB, "namespace": namespace}],
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": HUB},
    }
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": dict(meta)}
    return [account, role, binding]


def without_verb(objs: list[dict], kind: str, name: str, resource: str, verb: str) -> dict:
    """A copy of the rendered `kind` `name` with `verb` taken off every rule on `resource`
    (a rule left without verbs goes: the apiserver refuses one)."""
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name, [o["metadata"]["name"] for o in objs])
    edited = copy.deepcopy(found[0])
    for rule in edited["rules"]:
        if resource in rule["resources"]:
            rule["verbs"] = [v for v in rule["verbs"] if v != verb]
    edited["rules"] = [r for r in edited["rules"] if r["verbs"]]  # a rule needs a verb
    return edited


def install(cp: ControlPlane, objs: list[dict], directory: Path) -> dict[str, Path]:
    """Apply `objs` (their namespaces created first) with the admin's client; then for each
    ServiceAccount among them a token and a kubeconfig `directory/<name>.kubeconfig`.
    Returns ServiceAccount name -> its kubeconfig."""
    namespaces = sorted({o["metadata"]["namespace"] for o in objs
                         if o["metadata"].get("namespace")})  # fmt: skip
    apply(cp.client, [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
                      for ns in namespaces])  # fmt: skip
    accounts = [o for o in objs if o["kind"] == "ServiceAccount"]
    apply(cp.client, accounts)  # before the bindings that name them
    apply(cp.client, [o for o in objs if o["kind"] != "ServiceAccount"])
    kubeconfigs = {}
    for account in accounts:
        name, namespace = account["metadata"]["name"], account["metadata"]["namespace"]
        token = request_token(cp.client, namespace, name)
        user = f"system:serviceaccount:{namespace}:{name}"
        path = directory / f"{name}.kubeconfig"
        kubeconfigs[name] = write_token_kubeconfig(
            path, cp.server, cp.pki.ca.cert, token, user, namespace
        )
    return kubeconfigs
