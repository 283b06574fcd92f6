"""What Kubeflow Notebooks 2.0's own admission webhook checks when a WorkspaceKind is written,
for tests of `fracspawner kubeflow export --notebooks v2`. kube-apiserver checks the kind against
the upstream CRD (its schema, its CEL rules, server-side apply's field ownership: the tests ask
it, devcluster/controlplane/manifests/crds), but these checks are the Kubeflow controller's
validating webhook, a Go program the test cluster does not run, so they are reproduced here,
each cited (kubeflow/notebooks branch `notebooks-v2`, tag v2.0.0-beta.0; paths under
workspaces/controller/):

- internal/webhook/workspacekind_webhook.go `ValidateUpdate`: a podConfig value's `spec` may
  not change while a Workspace uses it ("podConfig value %q is in use and cannot be changed"),
  a used value may not be removed ("... cannot be removed"), the default podConfig must exist
  (`validateDefaultPodConfig`), redirect targets must exist and form no cycle
  (`validatePodConfigRedirects`), activity rules are validated (`validateActivityRules`).
  Usage is counted from the Workspaces' `spec.podTemplate.options.podConfig`
  (`getOptionsUsageCounts`). `redirect` and `spawner` are not part of `spec`: they may change.
- manifests/kustomize/base/crd/kubeflow.org_workspacekinds.yaml (the CRD's descriptions, which
  the webhook enforces; the CRD itself has no rule for them): at most one catch-all activity
  rule, and it must be last (spec.activityRules description); `effect.pauseWorkspace: true` is
  refused without `podTemplate.activityProbe` (the CRD's pauseWorkspace description: "the
  webhook rejects rules with pauseWorkspace: true when no activityProbe is configured").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def _values(kind: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    options = kind["spec"]["podTemplate"]["options"]["podConfig"]
    return {v["id"]: v for v in options.get("values") or []}


def update_errors(
    old: Mapping[str, Any], new: Mapping[str, Any], workspaces: Iterable[Mapping[str, Any]]
) -> list[str]:
    """The errors the kind's validating webhook answers an UPDATE from `old` to `new` with,
    while `workspaces` (Workspace objects of this kind) exist; [] when it is admitted."""
    usage: dict[str, int] = {}
    for ws in workspaces:
        chosen = ws["spec"]["podTemplate"]["options"]["podConfig"]
        usage[chosen] = usage.get(chosen, 0) + 1
    before, after = _values(old), _values(new)
    errors = []
    for vid, value in after.items():
        if vid in before and before[vid].get("spec") != value.get("spec") and usage.get(vid):
            errors.append(f"podConfig value {vid!r} is in use and cannot be changed")
    for vid in before:
        if vid not in after and usage.get(vid):
            errors.append(f"podConfig value {vid!r} is in use and cannot be removed")
    default = new["spec"]["podTemplate"]["options"]["podConfig"]["spawner"]["default"]
    if default not in after:
        errors.append(f"default podConfig {default!r} not found")
    redirects = {vid: v["redirect"]["to"] for vid, v in after.items() if v.get("redirect")}
    for vid, target in redirects.items():
        if target not in after:
            errors.append(f"target podConfig {target!r} does not exist")
        seen, at = {vid}, target
        while at in redirects:
            if at in seen:
                errors.append(f"podConfig redirect cycle detected: {vid}")
                break
            seen.add(at)
            at = redirects[at]
    rules = new["spec"].get("activityRules") or []
    catch_alls = [i for i, r in enumerate(rules) if not r.get("match")]
    if len(catch_alls) > 1 or (catch_alls and catch_alls[0] != len(rules) - 1):
        errors.append("a catch-all activity rule must be the only one and the last")
    probe = new["spec"]["podTemplate"].get("activityProbe")
    if not probe and any((r.get("effect") or {}).get("pauseWorkspace") for r in rules):
        errors.append("pauseWorkspace rules need spec.podTemplate.activityProbe")
    return errors
