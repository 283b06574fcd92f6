"""The Kubeflow objects a catalog stands for, as plain dicts. Pure: the CLI writes them.

Notebooks 1.x (docs/kubeflow.md, facts from kubeflow/notebooks `notebooks-v1` and
kubeflow/dashboard):
- one PodDefault (`kubeflow.org/v1alpha1`) per (pool, offer) a profile namespace may use. The
  notebook form lists a namespace's PodDefaults as "Configurations": the first key of
  `spec.selector.matchLabels` is what ticking one sets to "true" on the Notebook, the controller
  copies Notebook labels to the pod, and Kubeflow's PodDefault webhook then adds `spec.labels`,
  here the slice labels. A PodDefault cannot set resources, so the fracspawner webhook turns
  those labels into the slice's pod plan;
- a spawner_ui_config fragment: MIG-mixed profiles as `gpus.value.vendors` (the form writes
  `limits[limitsKey] = num`);
- the MutatingWebhookConfiguration of `fracspawner webhook`.
Notebooks 2.0 (`kubeflow.org/v1beta1`, v2.0.0-beta.0): a WorkspaceKind patch with one podConfig
value per offer, `filterRules` from the access rules, `activityRules` from the idle policy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..backends import LABEL_GPU, LABEL_POOL, get_backend, plan_slice
from ..backends.base import PodPlan
from ..model.access import allowed_pools, namespace_rule
from ..model.catalog import AccessRule, Catalog, Pool
from ..model.profiles import NamespaceMatch
from ..model.slices import Slice
from .names import (
    PROFILE_LABEL,
    describe,
    offer_words,
    podconfig_id,
    poddefault_desc,
    poddefault_name,
)

#: the label the apiserver puts on every namespace (Kubernetes >= 1.21): names in selectors
NAME_LABEL = "kubernetes.io/metadata.name"
#: Kubeflow's own PodDefault webhook configuration; ours must sort after it (below)
PODDEFAULT_WEBHOOK = "poddefaults-webhook-mutating-webhook-configuration"
#: The apiserver calls mutating webhook configurations in order of their NAMES
#: (k8s.io/apiserver pkg/admission/configuration/mutating_webhook_manager.go sorts them), so
#: this name, after PODDEFAULT_WEBHOOK's, lets us see the labels a PodDefault added even when an
#: objectSelector keeps us from the first round; reinvocationPolicy IfNeeded covers the rest.
WEBHOOK_NAME = "slices.webhook.fracspawner.io"
#: the second webhook of the configuration: slice labels and quota annotations stay as admitted
GUARD_NAME = "guard.slices.webhook.fracspawner.io"
MANAGED_BY = {"app.kubernetes.io/managed-by": "fracspawner"}
#: Notebooks 2.0: ActivityRuleConfig.secondsSinceActive has Minimum 16
MIN_SECONDS_SINCE_ACTIVE = 16


class ExportError(ValueError):
    """What cannot be exported; the message says what to change."""


@dataclass(frozen=True)
class ProfileNamespace:
    """A profile namespace as the export knows it (labels/annotations from a namespaces file)."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    #: False when only the name was given: label and owner entries cannot be checked
    described: bool = True


@dataclass(frozen=True)
class WebhookTarget:
    """Where the API server reaches `fracspawner webhook`, and how it fails."""

    service: str = "fracspawner-webhook"
    namespace: str = "kubeflow"
    port: int = 443
    ca_bundle: str | None = None  # base64 of the PEM CA that signed the serving certificate
    inject_ca_from: str | None = None  # cert-manager Certificate "<namespace>/<name>"
    failure_policy: str = "Fail"
    timeout_seconds: int = 10
    #: send only pods that carry fracspawner.io/pool (others pass even while the webhook is
    #: down); then MIG requests made through the form's GPU field are not checked
    slice_pods_only: bool = False


@dataclass
class Export:
    #: relative path -> the objects of one YAML file (several documents) and its header comment
    files: dict[str, tuple[list[dict[str, Any]], str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- offers
def kubeflow_pools(catalog: Catalog) -> list[Pool]:
    """The pools Kubeflow sees (`kubeflow.pools`), in catalog order."""
    visible = catalog.kubeflow.pools
    return [p for p in catalog.pools.values() if visible is None or p.name in visible]


def offers_for(catalog: Catalog, rule: AccessRule | None) -> list[tuple[Pool, Slice, PodPlan]]:
    """(pool, offer, plan) a rule allows among the Kubeflow pools; None: every one."""
    pools = kubeflow_pools(catalog)
    if rule is not None:
        allowed = {p.name for p in allowed_pools(catalog, rule)}
        pools = [p for p in pools if p.name in allowed]
    return [(p, o, plan_slice(o, p, None)) for p in pools for o in p.offers]


def _check_unique(items: Iterable[tuple[Pool, Slice]]) -> None:
    seen: dict[str, str] = {}
    for pool, offer in items:
        name = poddefault_name(pool.name, offer)
        if name in seen:
            raise ExportError(
                f"pools.{pool.name} offer {offer} and {seen[name]} both become the Kubeflow name "
                f"{name!r}; rename one of the pools"
            )
        seen[name] = f"pools.{pool.name} offer {offer}"


# --------------------------------------------------------------------------- v1
def poddefault(pool: Pool, offer: Slice, plan: PodPlan, namespace: str | None) -> dict[str, Any]:
    name = poddefault_name(pool.name, offer)
    metadata: dict[str, Any] = {"name": name, "labels": dict(MANAGED_BY)}
    if namespace is not None:
        metadata["namespace"] = namespace
    return {
        "apiVersion": "kubeflow.org/v1alpha1",
        "kind": "PodDefault",
        "metadata": metadata,
        "spec": {
            # the chart's words too: both may be applied, and must not rewrite each other
            "desc": poddefault_desc(pool, offer),
            # the form sets exactly this label to "true" on the Notebook (JWA form.py
            # set_notebook_configurations); the key is the name, as Run:ai's PodDefaults do
            "selector": {"matchLabels": {name: "true"}},
            "labels": {LABEL_POOL: pool.name, LABEL_GPU: offer.label},
        },
    }


def spawner_ui_fragment(catalog: Catalog) -> dict[str, Any]:
    """The keys of spawner_ui_config.yaml's `spawnerFormDefaults` this catalog fills: the
    MIG-mixed profiles as GPU vendors. No `affinityConfig`/`tolerationGroup` options: the form's
    choice there is independent of the ticked slice (a user could pair one pool's placement with
    another pool's slice), and the webhook already gives a slice pod its pool's node selector
    and tolerations from the slice itself."""
    vendors: list[dict[str, str]] = []
    for pool in kubeflow_pools(catalog):
        if pool.backend == "mig-mixed":
            for offer in pool.offers:
                (key,) = plan_slice(offer, pool, None).limits  # nvidia.com/mig-<profile>
                if all(v["limitsKey"] != key for v in vendors):
                    vendors.append({"limitsKey": key, "uiName": f"{offer_words(pool, offer)}"})
    out: dict[str, Any] = {}
    if vendors:
        # num "none": the form's own default and its "None" choice (JWA form-gpus component;
        # spawner_ui_config.yaml gpus.value.num), which writes no GPU limit
        out["gpus"] = {
            "readOnly": False,
            "value": {"vendor": "", "vendors": vendors, "num": "none"},
        }
    return {"spawnerFormDefaults": out}


def webhook_configuration(target: WebhookTarget) -> dict[str, Any]:
    """The MutatingWebhookConfiguration (`admissionregistration.k8s.io/v1`)."""
    client: dict[str, Any] = {
        "service": {
            "name": target.service,
            "namespace": target.namespace,
            "path": "/mutate",
            "port": target.port,
        }
    }
    if target.ca_bundle:
        client["caBundle"] = target.ca_bundle
    webhook: dict[str, Any] = {
        "name": WEBHOOK_NAME,
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": target.failure_policy,
        "timeoutSeconds": target.timeout_seconds,
        # called again after a later webhook (Kubeflow's PodDefault webhook) changed the pod
        "reinvocationPolicy": "IfNeeded",
        "matchPolicy": "Equivalent",
        "clientConfig": client,
        "rules": [
            {
                "operations": ["CREATE"],
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "resources": ["pods"],
                "scope": "Namespaced",
            }
        ],
        "namespaceSelector": {"matchLabels": dict([PROFILE_LABEL])},
    }
    if target.slice_pods_only:
        webhook["objectSelector"] = {
            "matchExpressions": [{"key": LABEL_POOL, "operator": "Exists"}]
        }
    # the namespace's quota is counted from its pods' slice labels and annotations, which
    # anyone allowed to edit pods could otherwise change on a running pod; only pods carrying
    # a slice (before or after the update: objectSelector) are sent
    guard = {
        **{k: v for k, v in webhook.items() if k not in ("objectSelector", "reinvocationPolicy")},
        "name": GUARD_NAME,
        "reinvocationPolicy": "Never",
        "rules": [{**webhook["rules"][0], "operations": ["UPDATE"]}],
        "objectSelector": {"matchExpressions": [{"key": LABEL_POOL, "operator": "Exists"}]},
    }
    metadata: dict[str, Any] = {"name": WEBHOOK_NAME, "labels": dict(MANAGED_BY)}
    if target.inject_ca_from:
        metadata["annotations"] = {"cert-manager.io/inject-ca-from": target.inject_ca_from}
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": metadata,
        "webhooks": [webhook, guard],
    }


# --------------------------------------------------------------------------- v2
def _needs_webhook(pool: Pool, offer: Slice) -> list[str]:
    """What a backend puts on a pod that a podConfig (affinity, nodeSelector, tolerations,
    resources of the main container) cannot carry."""
    raw = get_backend(pool.backend).plan(offer, pool)
    missing = []
    if raw.annotations:
        missing.append("annotations " + ", ".join(sorted(raw.annotations)))
    if raw.labels:
        missing.append("labels " + ", ".join(sorted(raw.labels)))
    if raw.scheduler_name or (pool.options or {}).get("scheduler_name"):
        missing.append("schedulerName")
    if raw.env:
        missing.append("env " + ", ".join(sorted(raw.env)))
    if raw.extra_pod_config:
        missing.append(", ".join(sorted(raw.extra_pod_config)))
    if raw.extra_container_config:
        missing.append(", ".join(sorted(raw.extra_container_config)))
    if raw.image:
        missing.append("its image")
    return missing


def podconfig_value(pool: Pool, offer: Slice, plan: PodPlan) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if plan.limits:
        resources["limits"] = dict(plan.limits)
    if plan.requests:
        resources["requests"] = dict(plan.requests)
    spec: dict[str, Any] = {}
    if resources:
        spec["resources"] = resources
    if plan.node_selector:
        spec["nodeSelector"] = dict(plan.node_selector)
    if plan.tolerations:
        spec["tolerations"] = [dict(t) for t in plan.tolerations]
    display = f"{pool.display_name} · {offer}"
    return {
        "id": podconfig_id(pool.name, offer),
        "spawner": {
            "displayName": display[:128],
            "description": describe(pool, offer, plan)[:1024],
            # activityRules and filterRules select podConfigs by these (as a label map)
            "labels": [
                {"key": LABEL_POOL, "value": pool.name},
                {"key": LABEL_GPU, "value": offer.label},
            ],
        },
        "spec": spec,
    }


def _entry_selector(entry: NamespaceMatch) -> dict[str, str] | None:
    """The namespace labels an entry requires; None when it needs the owner annotation."""
    if not entry.by_labels_only:
        return None
    labels = dict(entry.labels)
    if entry.name is not None:
        labels[NAME_LABEL] = entry.name
    return labels


def _entry_allows(catalog: Catalog, entry: NamespaceMatch, pool: str) -> bool:
    rules = [catalog.access_groups[g] for g in entry.groups]
    return any(r.pools is None or pool in r.pools for r in rules)


def filter_rules(catalog: Catalog) -> tuple[list[dict[str, Any]], list[str]]:
    """POD_CONFIG deny rules: a pool's podConfigs are denied (and hidden) in namespaces whose
    catalog rule does not allow the pool. A namespace's rule is that of the entries it matches,
    else access.default; so pool P is denied where (some entry matches, or the default denies P)
    and no entry allowing P matches. A selector cannot see the `owner` annotation, so an owner
    entry is taken as not matching: its namespace is denied the pools only it allows, and keeps
    what the default allows (denying those everywhere would take them from every namespace).
    The webhook applies the exact rule to the pods."""
    entries = catalog.kubeflow.namespaces
    default = catalog.access_default
    notes = []
    if any(not e.by_labels_only for e in entries):
        notes.append(
            "filterRules: namespace selectors cannot see the profile owner (an annotation), so "
            "namespaces matched by `owner` entries are filtered as if unmatched; the webhook "
            "enforces their exact rule on the pods: run it"
        )
    rules = []
    for pool in kubeflow_pools(catalog):
        allowing = [e for e in entries if _entry_allows(catalog, e, pool.name)]
        denying = [e for e in entries if not _entry_allows(catalog, e, pool.name)]
        # each conjunct: a selector dict; disjunctions are expanded into several rules
        positive: list[dict[str, str]]
        if default.pools is None or pool.name in default.pools:
            # deny needs some entry to match (an owner entry cannot be seen: left out)
            positive = [sel for e in denying if (sel := _entry_selector(e)) is not None]
        else:
            positive = [{}]  # the default denies: deny unless an allowing entry matches
        # NOT(all labels of an allowing entry): one NotIn per label, any of them
        negatives = [_entry_selector(e) for e in allowing]
        alternatives: list[list[dict[str, Any]]] = [[]]
        for labels in negatives:
            if labels is None:  # an owner entry: assumed not to match (stricter)
                continue
            alternatives = [
                alt + [{"key": k, "operator": "NotIn", "values": [v]}]
                for alt in alternatives
                for k, v in sorted(labels.items())
            ]
        for pos in positive:
            for alt in alternatives:
                selector: dict[str, Any] = {}
                if pos:
                    selector["matchLabels"] = dict(pos)
                if alt:
                    selector["matchExpressions"] = alt
                match: list[dict[str, Any]] = [
                    {"matchPodConfig": {"selector": {"matchLabels": {LABEL_POOL: pool.name}}}}
                ]
                if selector:
                    match.append({"matchNamespace": {"selector": selector}})
                rule = {
                    "scope": "POD_CONFIG",
                    "effect": {
                        "ui": {"hide": True},
                        "api": {
                            "deny": True,
                            "denyMessage": {
                                "text": f"GPU pool {pool.display_name} is not available in this "
                                "namespace (fracspawner access rules)."
                            },
                        },
                    },
                    "match": match,
                }
                if rule not in rules:
                    rules.append(rule)
    return rules, notes


def activity_rules(catalog: Catalog) -> list[dict[str, Any]]:
    """Pause a GPU podConfig's Workspace after the pool's server_gpu_idle of user inactivity."""
    rules = []
    for pool in kubeflow_pools(catalog):
        limit = catalog.idle_for(pool.name).server_gpu_idle
        if limit is None:
            continue
        rules.append(
            {
                "config": {"secondsSinceActive": max(MIN_SECONDS_SINCE_ACTIVE, int(limit))},
                "match": {"matchPodConfig": {"selector": {"matchLabels": {LABEL_POOL: pool.name}}}},
                "effect": {"pauseWorkspace": True},
            }
        )
    return rules


def workspacekind_patch(catalog: Catalog, kind: str) -> tuple[dict[str, Any], list[str]]:
    """The WorkspaceKind fields this catalog fills, for `kubectl apply --server-side`."""
    values = []
    missing: dict[str, list[str]] = {}
    for pool, offer, plan in offers_for(catalog, None):
        values.append(podconfig_value(pool, offer, plan))
        for what in _needs_webhook(pool, offer):
            if what not in missing.setdefault(pool.name, []):
                missing[pool.name].append(what)
    notes = [
        f"pool {name} ({catalog.pools[name].backend}): its pods also need {'; '.join(what)}, "
        "which a podConfig cannot carry. Run the webhook, and give each Workspace of this pool "
        f"the pod labels {LABEL_POOL}={name} and {LABEL_GPU}=<the offer's label, as in the "
        "podConfig's spawner labels> (spec.podTemplate.podMetadata.labels)"
        for name, what in missing.items()
        if what
    ]
    rules, filter_notes = filter_rules(catalog)
    spec: dict[str, Any] = {"podTemplate": {"options": {"podConfig": {"values": values}}}}
    activity = activity_rules(catalog)
    if activity:
        spec["activityRules"] = activity
    if rules:
        spec["filterRules"] = rules
    patch = {
        "apiVersion": "kubeflow.org/v1beta1",
        "kind": "WorkspaceKind",
        "metadata": {"name": kind},
        "spec": spec,
    }
    return patch, filter_notes + notes


# --------------------------------------------------------------------------- the whole export
def _namespace_rule(catalog: Catalog, ns: ProfileNamespace, notes: list[str]) -> AccessRule:
    if not ns.described and any(
        e.labels or e.owner is not None for e in catalog.kubeflow.namespaces
    ):
        notes.append(
            f"namespace {ns.name}: its labels and owner are unknown (pass --namespaces-file), "
            "so only `name` entries of kubeflow.namespaces were applied"
        )
    return namespace_rule(catalog, ns.name, ns.labels, ns.annotations)


def export(
    catalog: Catalog,
    *,
    namespaces: Sequence[ProfileNamespace] = (),
    notebooks: str = "v1",
    webhook: WebhookTarget = WebhookTarget(),
    workspace_kind: str = "jupyterlab",
) -> Export:
    """Everything to apply for Kubeflow Notebooks `notebooks` ("v1" or "v2")."""
    if notebooks not in ("v1", "v2"):
        raise ExportError(f"--notebooks: {notebooks!r}; use v1 or v2")
    out = Export()
    _check_unique((p, o) for p, o, _ in offers_for(catalog, None))
    out.files["mutatingwebhookconfiguration.yaml"] = (
        [webhook_configuration(webhook)],
        "fracspawner webhook: gives pods labelled with a slice their pod plan, enforces access "
        "and quota per profile namespace",
    )
    if webhook.ca_bundle is None and webhook.inject_ca_from is None:
        out.notes.append(
            "mutatingwebhookconfiguration.yaml has no caBundle: pass --ca-bundle or "
            "--inject-ca-from, or the API server cannot verify the webhook's certificate"
        )
    if notebooks == "v2":
        patch, notes = workspacekind_patch(catalog, workspace_kind)
        out.files[f"workspacekind-{workspace_kind}.yaml"] = (
            [patch],
            f"Notebooks 2.0: merge into WorkspaceKind {workspace_kind} with "
            "`kubectl apply --server-side --field-manager=fracspawner`. podConfig values merge "
            "by id; activityRules and filterRules are atomic lists and REPLACE the kind's own",
        )
        out.notes += notes
        return out

    fragment = spawner_ui_fragment(catalog)
    out.files["spawner_ui_config.fragment.yaml"] = (
        [fragment],
        "merge into spawnerFormDefaults of the Jupyter web app's spawner_ui_config.yaml "
        "(ConfigMap jupyter-web-app-config); the vendors list replaces Kubeflow's default one",
    )
    if not namespaces:
        objects = [poddefault(p, o, plan, None) for p, o, plan in offers_for(catalog, None)]
        out.files["poddefaults.yaml"] = (
            objects,
            "one PodDefault per (pool, offer) of every Kubeflow pool, no namespace set: "
            "`kubectl apply -n <profile namespace> -f`; the webhook refuses what a namespace "
            "may not use",
        )
        return out
    for ns in namespaces:
        rule = _namespace_rule(catalog, ns, out.notes)
        objects = [poddefault(p, o, plan, ns.name) for p, o, plan in offers_for(catalog, rule)]
        if not objects:
            out.notes.append(f"namespace {ns.name}: its access rule allows no Kubeflow pool")
        out.files[f"poddefaults/{ns.name}.yaml"] = (
            objects,
            f"PodDefaults for profile namespace {ns.name}: the GPU slices its rule allows "
            f"(pools {', '.join(rule.pools) if rule.pools is not None else 'all'}, "
            f"max_gpu {'unlimited' if rule.max_gpu is None else f'{rule.max_gpu:g}'})",
        )
    return out
