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
Notebooks 2.0 (`kubeflow.org/v1beta1`, v2.0.0-beta.0): the WorkspaceKind, read from the cluster,
with one podConfig value per offer (keeping the kind's own CPU/memory), `filterRules` from the
access rules, `activityRules` from the idle policy, for `kubectl replace`
(see workspacekind_update).
"""

from __future__ import annotations

import copy
import hashlib
import json
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
from .quota import COUNTED_LABEL
from .recognise import V1_NOTEBOOK_LABEL, V2_WORKSPACE_LABEL

#: the label the apiserver puts on every namespace (Kubernetes >= 1.21): names in selectors
NAME_LABEL = "kubernetes.io/metadata.name"
#: namespaces no webhook of ours ever selects, with the one its Service runs in: with
#: failurePolicy Fail, a webhook whose pods are down would refuse every pod there, its own
#: replacement and CoreDNS's included (Kubernetes docs, "Avoiding deadlocks in self-hosted
#: webhooks"). The Helm chart adds the same term, with the release namespace.
NEVER_SELECTED = ("kube-system",)
#: Kubeflow's own PodDefault webhook configuration; ours must sort after it (below)
PODDEFAULT_WEBHOOK = "poddefaults-webhook-mutating-webhook-configuration"
#: The apiserver calls mutating webhook configurations in order of their NAMES
#: (k8s.io/apiserver pkg/admission/configuration/mutating_webhook_manager.go sorts them), so
#: this name, after PODDEFAULT_WEBHOOK's, lets us see the labels a PodDefault added even when an
#: objectSelector keeps us from the first round; reinvocationPolicy IfNeeded covers the rest.
WEBHOOK_NAME = "slices.webhook.fracspawner.io"
#: the guard webhook of the configuration: slice labels and quota annotations stay as admitted
GUARD_NAME = "guard.slices.webhook.fracspawner.io"
#: the guard for the pods the webhook marked counted (quota.COUNTED_LABEL): the GPU pods that
#: are no notebook, and the pods without a slice that KAI or Run:ai schedules
COUNTED_GUARD_NAME = "counted." + GUARD_NAME
#: the webhook refusing ephemeral containers (kubectl debug) that would see GPUs through env
EPHEMERAL_NAME = "ephemeral.slices.webhook.fracspawner.io"
#: Kubernetes DRA pools: ResourceClaims created in a profile namespace (directly, or by the
#: resourceclaim controller from a pod's template) are checked and counted (kubeflow/claims.py)
CLAIMS_NAME = "claims.slices.webhook.fracspawner.io"
#: the label of every exported object: the Helm chart's objects carry it too, with the same
#: value, and no key of the chart's labels (app.kubernetes.io/managed-by: Helm, ...) is set
#: differently here, so applying both rewrites neither (issue 19 item 8)
MANAGED_BY = {"app.kubernetes.io/part-of": "fracspawner"}
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


def _metadata(name: str, namespace: str | None) -> dict[str, Any]:
    """An exported object's name, our label, and its namespace where one is given."""
    return {
        "name": name,
        "labels": dict(MANAGED_BY),
        **({"namespace": namespace} if namespace is not None else {}),
    }


# --------------------------------------------------------------------------- v1
def poddefault(pool: Pool, offer: Slice, plan: PodPlan, namespace: str | None) -> dict[str, Any]:
    name = poddefault_name(pool.name, offer)
    return {
        "apiVersion": "kubeflow.org/v1alpha1",
        "kind": "PodDefault",
        "metadata": _metadata(name, namespace),
        "spec": {
            # the chart's words too: both may be applied, and must not rewrite each other
            "desc": poddefault_desc(pool, offer),
            # the form sets exactly this label to "true" on the Notebook (JWA form.py
            # set_notebook_configurations); the key is the name, as Run:ai's PodDefaults do
            "selector": {"matchLabels": {name: "true"}},
            "labels": {LABEL_POOL: pool.name, LABEL_GPU: offer.label},
        },
    }


def _is_dra(pool: Pool) -> bool:
    try:
        return bool(getattr(get_backend(pool.backend), "uses_dra", False))
    except ValueError:
        return False


def claim_templates(
    offers: Iterable[tuple[Pool, Slice, PodPlan]], namespace: str | None
) -> list[dict[str, Any]]:
    """The ResourceClaimTemplates the plans of DRA offers name (the hub makes the same ones in
    a server's namespace), labelled as every exported object."""
    out = []
    for _pool, _offer, plan in offers:
        for template in plan.claim_templates:
            obj = copy.deepcopy(dict(template))
            meta = dict(obj["metadata"])
            meta["labels"] = {**dict(meta.get("labels") or {}), **dict(MANAGED_BY)}
            if namespace is not None:
                meta["namespace"] = namespace
            obj["metadata"] = meta
            out.append(obj)
    return out


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


def not_these_namespaces(namespace: str) -> dict[str, Any]:
    """The namespaceSelector term every webhook of ours carries: never kube-system nor
    `namespace`, the webhook's own (NEVER_SELECTED)."""
    names = list(dict.fromkeys([*NEVER_SELECTED, namespace]))
    return {"key": NAME_LABEL, "operator": "NotIn", "values": names}


def webhook_configuration(target: WebhookTarget, claims: bool = False) -> dict[str, Any]:
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
        # the webhook writes its quota reservations (a ConfigMap per namespace), never for a
        # dry run (admission/v1 AdmissionRequest.dryRun)
        "sideEffects": "NoneOnDryRun",
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
        "namespaceSelector": {
            "matchLabels": dict([PROFILE_LABEL]),
            "matchExpressions": [not_these_namespaces(target.namespace)],
        },
    }
    # Notebook pods only are mapped, told apart by the labels their controllers set
    # (kubeflow/recognise.py): a Notebook's pods carry notebook-name, a Workspace's
    # notebooks.kubeflow.org/workspace-name. One objectSelector cannot say "either", so each
    # has its webhook; every other pod of a profile namespace goes to a third, which only
    # counts its GPU against the quota (and refuses GPU visibility through env) and never
    # maps it (one holding GPU gets COUNTED_LABEL, for the guard below, and so does a pod of
    # any of the three that carries no slice but names KAI's or Run:ai's scheduler, even one
    # asking no GPU). --slice-pods-only: notebook pods carrying fracspawner.io/pool, nothing
    # else (none of them is marked).
    only = [{"key": LABEL_POOL, "operator": "Exists"}] if target.slice_pods_only else []
    v1 = {"key": V1_NOTEBOOK_LABEL, "operator": "Exists"}
    v2 = {"key": V2_WORKSPACE_LABEL, "operator": "Exists"}
    webhook["objectSelector"] = {"matchExpressions": [v1, *only]}
    workspaces = {
        **webhook,
        "name": "workspaces." + WEBHOOK_NAME,
        "objectSelector": {
            "matchExpressions": [v2, {"key": V1_NOTEBOOK_LABEL, "operator": "DoesNotExist"}, *only]
        },
    }
    others = {
        **webhook,
        "name": "pods." + WEBHOOK_NAME,
        "objectSelector": {
            "matchExpressions": [
                {**v1, "operator": "DoesNotExist"},
                {**v2, "operator": "DoesNotExist"},
            ]
        },
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
    # the pods that are no notebook whose GPU the third webhook counted (and checked against
    # the namespace's pools) carry COUNTED_LABEL, which it writes, as do the pods without a
    # slice that KAI or Run:ai schedules (counted as 0 if they ask no GPU: those schedulers
    # read the ask from annotations a pending pod's owner could add): the same guard for them.
    # One objectSelector cannot say "either label", hence a webhook of its own. On an UPDATE
    # the API server matches the objectSelector against the old and the new object and calls
    # the webhook if either matches (k8s.io/apiserver pkg/admission/plugin/webhook/predicates/
    # object, matcher.go), so removing the label is sent here too, and refused
    counted_guard = {
        **guard,
        "name": COUNTED_GUARD_NAME,
        "objectSelector": {"matchExpressions": [{"key": COUNTED_LABEL, "operator": "Exists"}]},
    }
    # kubectl debug adds an ephemeral container to a running pod through the subresource
    # pods/ephemeralcontainers (an UPDATE whose object is the whole Pod since Kubernetes 1.22,
    # kubernetes/kubernetes#101034); a rule for "pods" does not match a subresource, so every
    # pod's is sent here, and one whose new container could see GPUs through env is refused
    ephemeral = {
        **{k: v for k, v in webhook.items() if k not in ("objectSelector", "reinvocationPolicy")},
        "name": EPHEMERAL_NAME,
        "reinvocationPolicy": "Never",
        "rules": [
            {
                **webhook["rules"][0],
                "operations": ["UPDATE"],
                "resources": ["pods/ephemeralcontainers"],
            }
        ],
    }
    # DRA: every ResourceClaim CREATE of a profile namespace (a claim's spec is immutable)
    claim_hook = {
        **{k: v for k, v in webhook.items() if k not in ("objectSelector", "reinvocationPolicy")},
        "name": CLAIMS_NAME,
        "reinvocationPolicy": "Never",
        "rules": [
            {
                "operations": ["CREATE"],
                "apiGroups": ["resource.k8s.io"],
                "apiVersions": ["v1"],
                "resources": ["resourceclaims"],
                "scope": "Namespaced",
            }
        ],
    }
    metadata: dict[str, Any] = {"name": WEBHOOK_NAME, "labels": dict(MANAGED_BY)}
    if target.inject_ca_from:
        metadata["annotations"] = {"cert-manager.io/inject-ca-from": target.inject_ca_from}
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": metadata,
        "webhooks": [
            webhook,
            workspaces,
            *([] if target.slice_pods_only else [others]),
            guard,
            *([] if target.slice_pods_only else [counted_guard]),
            ephemeral,
            *([claim_hook] if claims else []),
        ],
    }


# --------------------------------------------------------------------------- Istio
#: the AuthorizationPolicy the GPU culler needs, per profile namespace
CULLER_POLICY_NAME = "fracspawner-culler-status"


def culler_authorization_policy(
    service_account: str, namespace: str | None, trust_domain: str = "cluster.local"
) -> dict[str, Any]:
    """Istio `AuthorizationPolicy` (security.istio.io/v1) letting `fracspawner culler kubeflow`
    (its ServiceAccount "NS/NAME") GET a notebook's `/api/status` and `/api/kernels` in a
    profile namespace.

    A profile namespace's own policy (`ns-owner-access-istio`, kubeflow/dashboard
    components/profile-controller/controllers/profile_controller.go getAuthorizationPolicy)
    admits the owner through the gateway, the namespace itself, and from elsewhere only the
    notebook-controller's principal on `GET */api/kernels`: the culler's requests are denied.
    ALLOW policies add up, so this one admits exactly those from the culler's principal: its
    GET of the server's status and of its kernels (a running kernel is activity; v1
    `/notebook/<ns>/<nb>/api/{status,kernels}`, v2 `/workspace/connect/<ns>/<ws>/api/...`;
    Istio matches paths without the query string)."""
    sa_namespace, _, sa_name = service_account.rpartition("/")
    return {
        "apiVersion": "security.istio.io/v1",
        "kind": "AuthorizationPolicy",
        "metadata": _metadata(CULLER_POLICY_NAME, namespace),
        "spec": {
            "action": "ALLOW",
            "rules": [
                {
                    "from": [
                        {
                            "source": {
                                "principals": [f"{trust_domain}/ns/{sa_namespace}/sa/{sa_name}"]
                            }
                        }
                    ],
                    "to": [
                        {
                            "operation": {
                                "methods": ["GET"],
                                "paths": ["*/api/status", "*/api/kernels"],
                            }
                        }
                    ],
                }
            ],
        },
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


#: the kind's own CPU/memory settings a GPU podConfig keeps (issue 19 item 3)
_KIND_RESOURCES = ("cpu", "memory")


def kind_base_resources(kind: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """CPU and memory requests/limits of the kind's default podConfig (`spawner.default`):
    what a Workspace of this kind gets without fracspawner, and what a profile's ResourceQuota
    on cpu/memory requires a pod to ask for."""
    pod_config = (((kind.get("spec") or {}).get("podTemplate") or {}).get("options") or {}).get(
        "podConfig"
    ) or {}
    default = (pod_config.get("spawner") or {}).get("default")
    for value in pod_config.get("values") or []:
        if value.get("id") == default:
            resources = (value.get("spec") or {}).get("resources") or {}
            return {
                part: {k: v for k, v in (resources.get(part) or {}).items() if k in _KIND_RESOURCES}
                for part in ("requests", "limits")
                if any(k in _KIND_RESOURCES for k in resources.get(part) or {})
            }
    return {}


def _spec_digest(spec: Mapping[str, Any]) -> str:
    text = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def podconfig_value(
    pool: Pool, offer: Slice, plan: PodPlan, base: Mapping[str, Mapping[str, Any]] | None = None
) -> dict[str, Any]:
    """One podConfig value. Its id ends in a digest of its spec: a Workspace kind's validating
    webhook refuses to change the spec of a podConfig a Workspace uses, so a changed slice
    (catalog, or the kind's own CPU/memory) is a new id, and the old value stays."""
    resources: dict[str, Any] = {}
    for part, planned in (("requests", plan.requests), ("limits", plan.limits)):
        merged = {**dict((base or {}).get(part) or {}), **dict(planned)}
        if merged:
            resources[part] = merged
    spec: dict[str, Any] = {}
    if resources:
        spec["resources"] = resources
    if plan.node_selector:
        spec["nodeSelector"] = dict(plan.node_selector)
    if plan.tolerations:
        spec["tolerations"] = [dict(t) for t in plan.tolerations]
    display = f"{pool.display_name} · {offer}"
    return {
        "id": f"{podconfig_id(pool.name, offer)}-{_spec_digest(spec)}",
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


def _labels_of(value: Mapping[str, Any]) -> dict[str, str]:
    return {
        str(item.get("key")): str(item.get("value"))
        for item in (value.get("spawner") or {}).get("labels") or []
    }


def _selects_pool(selector: Any) -> bool:
    """A rule of ours: its podConfig selector names a fracspawner pool."""
    return isinstance(selector, Mapping) and LABEL_POOL in (selector.get("matchLabels") or {})


def _our_activity_rule(rule: Mapping[str, Any]) -> bool:
    match = rule.get("match") or {}
    return _selects_pool((match.get("matchPodConfig") or {}).get("selector"))


def _our_filter_rule(rule: Mapping[str, Any]) -> bool:
    return any(
        _selects_pool((m.get("matchPodConfig") or {}).get("selector"))
        for m in rule.get("match") or []
    )


#: metadata a `kubectl replace` carries back: what the kind had (finalizers: the controller's
#: protection), and resourceVersion so that a kind changed since it was read is refused (409)
_KEPT_METADATA = ("name", "resourceVersion", "labels", "annotations", "finalizers")


def kind_read_from_cluster(kind: Mapping[str, Any]) -> bool:
    """Whether a written kind carries the resourceVersion it was read at: `kubectl replace`
    needs one, as custom resources refuse an update without it ("metadata.resourceVersion:
    Invalid value: 0: must be specified for an update": the CRD registry's strategy has
    AllowUnconditionalUpdate false, apiextensions-apiserver pkg/registry/customresource
    strategy.go). The stock kind has none: it is for `kubectl apply`, whose patch needs none."""
    return bool((kind.get("metadata") or {}).get("resourceVersion"))


def workspacekind_update(
    catalog: Catalog, current: Mapping[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """The whole WorkspaceKind `current` (as `kubectl get workspacekind NAME -o yaml` prints it)
    with this catalog's podConfigs and rules, for `kubectl replace -f`.

    Why a whole object: `activityRules` and `filterRules` are atomic lists in the CRD
    (`x-kubernetes-list-type: atomic`), so a server-side apply of only ours conflicts with the
    kind's owner (or, forced, drops the kind's own rules). Here the kind's own values and rules
    are kept as they are and ours are replaced:
    - podConfig values: ours are new values (ids end in a digest of the spec); an old value of
      ours is kept unchanged (a Workspace may use it: the kind's webhook refuses removing or
      changing it), hidden, and redirected to its successor (same pool and slice) if any;
    - activityRules: ours first (each selects only its pool's podConfigs; first match wins, and
      a catch-all must stay last), the kind's own after;
    - filterRules: the kind's own, then ours."""
    kind = copy.deepcopy(dict(current))
    if kind.get("apiVersion") != "kubeflow.org/v1beta1" or kind.get("kind") != "WorkspaceKind":
        raise ExportError(
            "--workspace-kind-file: not a WorkspaceKind (kubeflow.org/v1beta1); use "
            "`kubectl get workspacekind NAME -o yaml`"
        )
    meta = kind.get("metadata") or {}
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise ExportError("--workspace-kind-file: the WorkspaceKind has no metadata.name")
    spec = kind.setdefault("spec", {})
    template = spec.setdefault("podTemplate", {})
    pod_config = template.setdefault("options", {}).setdefault("podConfig", {})
    existing = list(pod_config.get("values") or [])
    notes: list[str] = []
    base = kind_base_resources(kind)
    if not base.get("requests"):
        notes.append(
            f"WorkspaceKind {name}: its default podConfig requests no CPU or memory, so the GPU "
            "podConfigs request none either (a profile ResourceQuota on cpu/memory refuses such "
            "pods)"
        )

    values: list[dict[str, Any]] = []
    missing: dict[str, list[str]] = {}
    for pool, offer, plan in offers_for(catalog, None):
        values.append(podconfig_value(pool, offer, plan, base))
        for what in _needs_webhook(pool, offer):
            if what not in missing.setdefault(pool.name, []):
                missing[pool.name].append(what)
    new_ids = {v["id"] for v in values}
    successor = {(_labels_of(v)[LABEL_POOL], _labels_of(v)[LABEL_GPU]): v["id"] for v in values}
    taken = {v.get("id") for v in existing if LABEL_POOL not in _labels_of(v)}
    clash = sorted(new_ids & taken)
    if clash:
        raise ExportError(
            f"WorkspaceKind {name}: podConfig id {clash[0]!r} is already one of the kind's own"
        )
    kept: list[dict[str, Any]] = []
    ours_before: list[dict[str, Any]] = []
    for value in existing:
        labels = _labels_of(value)
        if LABEL_POOL not in labels:
            kept.append(value)
        elif value.get("id") not in new_ids:
            old = copy.deepcopy(value)
            old.setdefault("spawner", {})["hidden"] = True
            target = successor.get((labels[LABEL_POOL], labels.get(LABEL_GPU, "")))
            if target:
                old["redirect"] = {
                    "to": target,
                    "message": {
                        "level": "Info",
                        "text": "The GPU settings of this slice changed; restart the "
                        "Workspace to use them.",
                    },
                }
            else:
                old.pop("redirect", None)
            ours_before.append(old)
    pod_config["values"] = kept + values + ours_before

    activity = activity_rules(catalog)
    if activity and not template.get("activityProbe"):
        notes.append(
            f"WorkspaceKind {name} has no podTemplate.activityProbe: its webhook refuses "
            "pauseWorkspace rules without one, so no activityRules were written (the GPU-aware "
            "`fracspawner culler kubeflow` still pauses idle GPU Workspaces)"
        )
        activity = []
    own_activity = [r for r in spec.get("activityRules") or [] if not _our_activity_rule(r)]
    if activity or own_activity:
        spec["activityRules"] = activity + own_activity
    else:
        spec.pop("activityRules", None)
    rules, filter_notes = filter_rules(catalog)
    own_filters = [r for r in spec.get("filterRules") or [] if not _our_filter_rule(r)]
    if rules or own_filters:
        spec["filterRules"] = own_filters + rules
    else:
        spec.pop("filterRules", None)

    kind["metadata"] = {k: meta[k] for k in _KEPT_METADATA if k in meta}
    kind.pop("status", None)
    notes += [
        f"pool {pool} ({catalog.pools[pool].backend}): its pods also need {'; '.join(what)}, "
        "which a podConfig cannot carry. Run the webhook, and give each Workspace of this pool "
        f"the pod labels {LABEL_POOL}={pool} and {LABEL_GPU}=<the offer's label, as in the "
        "podConfig's spawner labels> (spec.podTemplate.podMetadata.labels)"
        for pool, what in missing.items()
        if what
    ]
    if ours_before:
        notes.append(
            f"WorkspaceKind {name}: {len(ours_before)} earlier fracspawner podConfig(s) kept, "
            "hidden (and redirected where the slice still exists): Workspaces using them keep "
            "running; remove them by hand once no Workspace uses them (docs/kubeflow.md)"
        )
    return kind, filter_notes + notes


# --------------------------------------------------------------------------- the whole export
def _claim_template_files(
    catalog: Catalog, namespaces: Sequence[ProfileNamespace], out: Export
) -> None:
    """DRA pools: the ResourceClaimTemplates the webhook names in a notebook's
    spec.resourceClaims (a PodDefault or podConfig cannot set resourceClaims), per profile
    namespace (the offers its rule allows), or one file without a namespace."""
    if not namespaces:
        templates = claim_templates(offers_for(catalog, None), None)
        if templates:
            out.files["resourceclaimtemplates.yaml"] = (
                templates,
                "DRA pools: the ResourceClaimTemplate of each offer, no namespace set: "
                "`kubectl apply -n <profile namespace> -f`; the webhook names them in a "
                "notebook's spec.resourceClaims (a PodDefault cannot)",
            )
        return
    for ns in namespaces:
        rule = namespace_rule(catalog, ns.name, ns.labels, ns.annotations)
        templates = claim_templates(offers_for(catalog, rule), ns.name)
        if templates:
            out.files[f"resourceclaimtemplates/{ns.name}.yaml"] = (
                templates,
                f"DRA pools: the ResourceClaimTemplates of the offers profile namespace "
                f"{ns.name} may use; the webhook names them in its notebooks' "
                "spec.resourceClaims (a PodDefault cannot set resourceClaims)",
            )


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
    workspace_kind: Mapping[str, Any] | None = None,
    culler_service_account: str | None = None,
) -> Export:
    """Everything to apply for Kubeflow Notebooks `notebooks` ("v1" or "v2"); v2 needs the
    current WorkspaceKind (`workspace_kind`, as `kubectl get workspacekind NAME -o yaml`)."""
    if notebooks not in ("v1", "v2"):
        raise ExportError(f"--notebooks: {notebooks!r}; use v1 or v2")
    out = Export()
    _check_unique((p, o) for p, o, _ in offers_for(catalog, None))
    dra = [p.name for p in kubeflow_pools(catalog) if _is_dra(p)]
    out.files["mutatingwebhookconfiguration.yaml"] = (
        [webhook_configuration(webhook, claims=bool(dra))],
        "fracspawner webhook: gives pods labelled with a slice their pod plan, enforces access "
        "and quota per profile namespace",
    )
    if webhook.ca_bundle is None and webhook.inject_ca_from is None:
        out.notes.append(
            "mutatingwebhookconfiguration.yaml has no caBundle: pass --ca-bundle or "
            "--inject-ca-from, or the API server cannot verify the webhook's certificate"
        )
    if culler_service_account is not None:
        targets: list[str | None] = [ns.name for ns in namespaces] or [None]
        out.files["authorizationpolicies.yaml"] = (
            [culler_authorization_policy(culler_service_account, ns) for ns in targets],
            "Istio: lets `fracspawner culler kubeflow` (ServiceAccount "
            f"{culler_service_account}, with an Istio sidecar) GET the notebooks' /api/status "
            "and /api/kernels "
            "in each profile namespace; the profile's own policy admits only Kubeflow's "
            "notebook-controller there",
        )
    _claim_template_files(catalog, namespaces, out)
    if notebooks == "v2":
        if workspace_kind is None:
            raise ExportError(
                "--notebooks v2 needs --workspace-kind-file: the WorkspaceKind as "
                "`kubectl get workspacekind NAME -o yaml` prints it (its own podConfigs, rules "
                "and CPU/memory are kept)"
            )
        kind, notes = workspacekind_update(catalog, workspace_kind)
        name = kind["metadata"]["name"]
        out.files[f"workspacekind-{name}.yaml"] = (
            [kind],
            f"Notebooks 2.0: WorkspaceKind {name} with the catalog's podConfigs and rules, the "
            + (
                "kind's own kept: `kubectl replace -f` (refused if the kind changed since it "
                "was read: read it again and export again)"
                if kind_read_from_cluster(kind)
                else "stock kind's own kept: `kubectl apply -f` (creates the kind, or sets "
                "these fields of it: its podConfig values and rules become the stock kind's "
                "and the catalog's; no resourceVersion, so not `kubectl replace`)"
            ),
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
        allowed = offers_for(catalog, rule)
        objects = [poddefault(p, o, plan, ns.name) for p, o, plan in allowed]
        if not objects:
            out.notes.append(f"namespace {ns.name}: its access rule allows no Kubeflow pool")
        out.files[f"poddefaults/{ns.name}.yaml"] = (
            objects,
            f"PodDefaults for profile namespace {ns.name}: the GPU slices its rule allows "
            f"(pools {', '.join(rule.pools) if rule.pools is not None else 'all'}, "
            f"max_gpu {'unlimited' if rule.max_gpu is None else f'{rule.max_gpu:g}'})",
        )
    return out
