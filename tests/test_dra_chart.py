"""Issue 30 item 5: the chart installs what DRA pools need (`dra.enabled`): the roles (capacity
watches on ResourceSlices and ResourceClaims; the hub's ResourceClaimTemplates in its namespace;
the webhook's claim watch and template reads) and the webhook rule for ResourceClaims, exactly
as `fracspawner kubeflow export` writes it for a catalog with a DRA pool. Rendered by Helm's own
Go code (helm-python-sdk, tests/chart_support.py)."""

from __future__ import annotations

from tests.chart_support import NAMESPACE, by_kind, objects, one, render


def rules_of(role: dict) -> list[tuple[str, str, str]]:
    return [
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    ]


def test_without_dra_nothing_of_it_is_granted():
    objs = objects(render({"webhook": {"enabled": True}}))
    for role in by_kind(objs, "ClusterRole") + by_kind(objs, "Role"):
        assert not [r for r in rules_of(role) if r[0] == "resource.k8s.io"], role["metadata"]
    mwc = one(objs, "MutatingWebhookConfiguration", "webhook")
    assert not [w for w in mwc["webhooks"] if w["name"].startswith("claims.")]


def test_dra_enabled_grants_the_roles_dra_pools_need():
    objs = objects(render({"webhook": {"enabled": True}, "dra": {"enabled": True}}))
    capacity = rules_of(one(objs, "ClusterRole", "capacity"))
    for resource in ("resourceslices", "resourceclaims"):
        for verb in ("list", "watch"):
            assert ("resource.k8s.io", resource, verb) in capacity
    templates = one(objs, "Role", "claim-templates")
    assert templates["metadata"]["namespace"] == NAMESPACE
    assert sorted(rules_of(templates)) == [
        ("resource.k8s.io", "resourceclaimtemplates", v) for v in ("create", "get", "update")
    ]
    binding = one(objs, "RoleBinding", "claim-templates")
    assert binding["subjects"][0]["name"] == "hub"
    webhook = rules_of(one(objs, "ClusterRole", "webhook"))
    assert ("resource.k8s.io", "resourceclaims", "watch") in webhook
    for verb in ("get", "create", "update"):
        assert ("resource.k8s.io", "resourceclaimtemplates", verb) in webhook


def test_the_claims_webhook_is_the_exports():
    from fracspawner.kubeflow.export import WebhookTarget, webhook_configuration

    objs = objects(render({"webhook": {"enabled": True}, "dra": {"enabled": True}}))
    mwc = one(objs, "MutatingWebhookConfiguration", "webhook")
    exported = webhook_configuration(
        WebhookTarget(
            service=one(objs, "Service", "webhook")["metadata"]["name"],
            namespace=NAMESPACE,
            port=443,
            ca_bundle=one(objs, "Secret", "webhook")["data"]["ca.crt"],
        ),
        claims=True,
    )
    assert mwc["webhooks"] == exported["webhooks"]
