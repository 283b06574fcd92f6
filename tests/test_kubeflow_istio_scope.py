"""Issue 28 item 10 (the mesh): the chart's AuthorizationPolicy for the GPU culler never turns
the rest of the mesh deny-by-default.

Istio's rules, modelled (istio.io docs, security/authorization "Authorization policy": "If any
allow policies apply to a workload, access to that workload is denied by default"; "a policy
in the root namespace applies to all workloads in the mesh", meshConfig.rootNamespace
istio-system; a policy without a selector applies to every workload of its namespace). Path and
principal matching: exact, `*suffix`, `prefix*` (the same page, "Exact match, prefix match,
suffix match and presence match"). The profile's own policy is the one Kubeflow's profile
controller writes (tests/test_kubeflow_export.py _profile_policy).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.chart_support import by_kind, objects, render
from tests.test_kubeflow_export import _profile_policy

ROOT = "istio-system"
CULLER = "cluster.local/ns/fracspawner/sa/fracspawner-kubeflow-culler"
BASE = {
    "jupyterhub": {"enabled": False},
    "service": {"enabled": False},
    "culler": {"enabled": False},
    "kubeflowCuller": {"enabled": True, "istio": {"enabled": True}},
}


def _match(value: str, patterns: list[str]) -> bool:
    return any(
        p in ("*", value)
        or (p.startswith("*") and value.endswith(p[1:]))
        or (p.endswith("*") and value.startswith(p[:-1]))
        for p in patterns
    )


def _rule_matches(rule: dict[str, Any], request: dict[str, Any]) -> bool:
    for src in rule.get("from", []):
        if not _match(request["principal"], src["source"].get("principals", ["*"])):
            return False
    for to in rule.get("to", []):
        op = to["operation"]
        if request["method"] not in op.get("methods", [request["method"]]):
            return False
        if not _match(request["path"], op.get("paths", ["*"])):
            return False
    for cond in rule.get("when", []):
        if cond["key"] == "source.namespace":
            if request["source_namespace"] not in cond["values"]:
                return False
        else:
            header = cond["key"][len("request.headers[") : -1]
            if request.get("headers", {}).get(header) not in cond["values"]:
                return False
    return True


def allowed(policies: list[dict[str, Any]], request: dict[str, Any]) -> bool:
    """Istio's decision for a request to a workload in request["namespace"], ALLOW policies
    only: none applying means allowed; else allowed when a rule of one of them matches."""
    applying = [
        p
        for p in policies
        if p["metadata"]["namespace"] in (ROOT, request["namespace"])
        and not (p["spec"].get("selector"))
    ]
    if not applying:
        return True
    return any(_rule_matches(r, request) for p in applying for r in p["spec"]["rules"])


def policies(values: dict[str, Any]) -> list[dict[str, Any]]:
    out = by_kind(objects(render(values)), "AuthorizationPolicy")
    for policy in out:
        policy["spec"]["rules"][0]["from"][0]["source"]["principals"] = [CULLER]
    return out


def request(namespace: str, path: str, principal: str = "cluster.local/ns/kubeflow/sa/x"):
    return {
        "namespace": namespace,
        "source_namespace": principal.split("/ns/")[1].split("/")[0],
        "principal": principal,
        "method": "GET",
        "path": path,
    }


@pytest.mark.parametrize(
    "values",
    [
        {"kubeflowCuller": {"namespaces": ["team-a"]}},  # the culler's own namespaces
        {"kubeflow": {"namespaces": [{"name": "team-a"}]}},  # the profiles the chart knows
    ],
    ids=["culler-namespaces", "kubeflow-namespaces"],
)
def test_the_culler_gets_through_and_nothing_else_changes(values):
    merged = {**BASE, **values}
    merged["kubeflowCuller"] = {**BASE["kubeflowCuller"], **values.get("kubeflowCuller", {})}
    ours = policies(merged)
    assert [p["metadata"]["namespace"] for p in ours] == ["team-a"]
    profile = [_profile_policy("team-a", "alice@example.com")]
    status = "/notebook/team-a/nb/api/status"
    assert not allowed(profile, request("team-a", status, CULLER))  # what the culler met
    assert allowed(profile + ours, request("team-a", status, CULLER))
    # a workload elsewhere, with no policy of its own (the central dashboard, a pipeline
    # API server, a model server): open before, open after
    dashboard = request("kubeflow", "/api/workgroup/env-info")
    assert allowed(profile, dashboard) and allowed(profile + ours, dashboard)


def test_no_mesh_wide_policy_unless_asked():
    with pytest.raises(Exception, match="kubeflowCuller.istio.meshWide"):
        render(BASE)  # nowhere to put it: refused in words, nothing rendered
    mesh = {
        **BASE,
        "kubeflowCuller": {"enabled": True, "istio": {"enabled": True, "meshWide": True}},
    }
    ours = policies(mesh)
    assert [p["metadata"]["namespace"] for p in ours] == [ROOT]
    # what meshWide means, and why it is not the default: every workload without a policy of
    # its own now refuses everyone but the culler
    assert not allowed(ours, request("kubeflow", "/api/workgroup/env-info"))
