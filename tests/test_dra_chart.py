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


def test_the_culler_watches_claims_and_slices_only_with_dra():
    """Issue 36 item 4: with dra.enabled the culler binds a DRA server to the GPUs its claims
    were allocated (Culler.watch_dra_claims): its Role adds ResourceClaims (list, watch, in the
    hub's namespace) and a ClusterRole of its own the cluster-scoped ResourceSlices; without
    DRA neither, nor the option."""
    objs = objects(render({"dra": {"enabled": True}}))
    role = one(objs, "Role", "culler")
    assert sorted(rules_of(role)) == [
        ("", "pods", "list"), ("", "pods", "watch"),
        ("resource.k8s.io", "resourceclaims", "list"),
        ("resource.k8s.io", "resourceclaims", "watch"),
    ]  # fmt: skip
    cluster = one(objs, "ClusterRole", "culler")
    assert sorted(rules_of(cluster)) == [
        ("", "nodes", "list"), ("", "nodes", "watch"),  # each node's host memory budget
        ("resource.k8s.io", "resourceslices", "list"),
        ("resource.k8s.io", "resourceslices", "watch"),
    ]  # fmt: skip
    binding = one(objs, "ClusterRoleBinding", "culler")
    assert binding["roleRef"]["name"] == cluster["metadata"]["name"]
    assert [(s["name"], s["namespace"]) for s in binding["subjects"]] == [
        (role["metadata"]["name"], NAMESPACE)
    ]
    command = one(objs, "Deployment", "culler")["spec"]["template"]["spec"]["containers"][0][
        "command"
    ]
    assert "--Culler.watch_dra_claims=True" in command
    plain = objects(render({}))
    # without DRA the culler's ClusterRole has the Nodes alone (its host memory budget per node)
    assert sorted(rules_of(one(plain, "ClusterRole", "culler"))) == [
        ("", "nodes", "list"), ("", "nodes", "watch"),
    ]  # fmt: skip
    command = one(plain, "Deployment", "culler")["spec"]["template"]["spec"]["containers"][0][
        "command"
    ]
    assert "--Culler.watch_dra_claims=True" not in command
