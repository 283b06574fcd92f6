"""Issue 30 item 3: GPU held via claims, through every door of a Kubeflow profile namespace.

A ResourceClaim created directly in a tenant namespace, a pod naming a ResourceClaimTemplate
and a notebook the webhook maps to a DRA pool are all checked: a pool the namespace may not
use is refused, and claims count against the namespace's GPU quota in GPU-equivalents.

What is modelled (cited): the API server sends the webhook an AdmissionReview for a
ResourceClaim CREATE when its MutatingWebhookConfiguration rules name `resourceclaims` of
group resource.k8s.io (k8s.io/api admission/v1 types.go AdmissionRequest: kind {group, version,
kind}); the resourceclaim controller (kubernetes pkg/controller/resourceclaim/controller.go
handleClaim) creates a pod's claim from its template with generateName and an ownerReference
to the pod (controller: true), through the same admission.

The webhook runs as deployed (its own process), registered with the real control plane's
kube-apiserver by the MutatingWebhookConfiguration the export writes, claims included
(kubeflow_support.register), and called by it over TLS: claims, templates and pods are created
through the API, kube-controller-manager makes a notebook's claim from its template, the
webhook's watches see them come and go, and refusals are read as kube-apiserver passes them to
the user. What a claim asks for (claim_ask) and the export are tested as the pure functions
they are.
"""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import yaml

from fracspawner.backends import load_catalog
from fracspawner.kubeflow.claims import ClaimRefused, claim_ask
from tests.kubeflow_support import (
    WebhookProcess,
    create_pod,
    denied,
    make_tls,
    notebook_pod,
    profile_namespace,
    register,
    with_poddefault,
)

CATALOG_DATA: dict[str, Any] = {
    "pools": {
        "h100-dra": {
            "gpu": "H100-80GB",
            "backend": "dra",
            "options": {"sharing": "memory"},
            "offers": ["1/8", "10GiB", "20GiB", "1"],
        },
        "a100-dmig": {
            "gpu": "A100-80GB",
            "backend": "dra",
            "options": {"mig": "dynamic"},
            "offers": ["mig-1g.10gb", "mig-3g.40gb"],
        },
    },
    "access": {
        "default": {"pools": [], "max_gpu": 0},
        "groups": {
            "team": {"pools": ["h100-dra"], "max_gpu": 0.25},
        },
    },
    "kubeflow": {"namespaces": [{"labels": {"team": "a"}, "groups": ["team"]}]},
}
CATALOG = load_catalog(CATALOG_DATA)
TOPOLOGY = {"nodes": [{"name": "cpu-1", "capacity": {"cpu": "8", "memory": "32Gi"}}]}
PROFILE = {"app.kubernetes.io/part-of": "kubeflow-profile"}
#: profile namespaces of team a (h100-dra only, up to 0.25 GPU), one per test that holds
#: quota, and one under access.default (no pools)
TEAM_A = ("team-a", "dra-team", "quota-a", "delete-a", "race-a", "nb-a", "tmpl-a")
H100 = "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100 80GB HBM3'"
A100 = "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA A100-SXM4-80GB'"


def request(cls: str = "gpu.nvidia.com", *cel: str, **exactly: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"deviceClassName": cls, **exactly}
    if cel:
        body["selectors"] = [{"cel": {"expression": e}} for e in cel]
    return {"name": "gpu", "exactly": body}


def claim_spec(*requests: dict[str, Any]) -> dict[str, Any]:
    return {"devices": {"requests": list(requests)}}


def memory(amount: str) -> dict[str, Any]:
    return {"capacity": {"requests": {"memory": amount}}}


def claim(namespace: str, name: str, spec: dict[str, Any], owner: str | None = None):
    meta: dict[str, Any] = {"namespace": namespace, "name": name}
    if owner:
        meta["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Pod", "name": owner, "uid": "u", "controller": True}
        ]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": meta,
            "spec": spec}  # fmt: skip


def claim_review(obj: dict[str, Any], operation: str = "CREATE") -> dict[str, Any]:
    group = {"group": "resource.k8s.io", "version": "v1"}
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {**group, "kind": "ResourceClaim"},
            "resource": {**group, "resource": "resourceclaims"},
            "namespace": obj["metadata"]["namespace"],
            "name": obj["metadata"].get("name", ""),
            "operation": operation,
            "userInfo": {"username": "alice@example.org"},
            "object": obj,
            "dryRun": False,
        },
    }


# --------------------------------------------------------------------------- what a claim asks
def test_a_claim_counts_as_the_offer_it_asks_for():
    ask = claim_ask(claim_spec(request("gpu.nvidia.com", H100, **memory("10Gi"))), CATALOG)
    assert (ask.pools, ask.gpu) == (("h100-dra",), 0.125)
    # a size the pool does not offer (issue 34 item 4): refused; counted (a claim made before
    # the webhook) as the next offer up, here the whole GPU
    forty = claim_spec(request("gpu.nvidia.com", H100, **memory("40Gi")))
    with pytest.raises(ClaimRefused, match="does not offer"):
        claim_ask(forty, CATALOG)
    assert claim_ask(forty, CATALOG, strict=False).gpu == 1.0
    # no capacity asked: the whole device (memory mode's default is all of it)
    assert claim_ask(claim_spec(request("gpu.nvidia.com", H100, count=2)), CATALOG).gpu == 2.0
    profile = "device.attributes['gpu.nvidia.com'].profile == '3g.40gb'"
    ask = claim_ask(claim_spec(request("mig.nvidia.com", profile)), CATALOG)
    assert ask.pools == ("a100-dmig",) and ask.gpu == pytest.approx(3 / 7)


def test_a_claim_naming_no_model_may_land_on_any_pool_of_its_class():
    # any CEL the catalog does not write only narrows the devices: the pools stay all
    ask = claim_ask(
        claim_spec(request("gpu.nvidia.com", "device.attributes['gpu.nvidia.com'].x == 1")),
        CATALOG,
    )
    # an A100 node running dynamic MIG publishes its full GPU too (partitions.go)
    assert ask.pools == ("h100-dra", "a100-dmig")
    assert ask.gpu == 1.0
    other = claim_ask(claim_spec(request("gpu.nvidia.com", A100)), CATALOG)
    assert other.pools == ("a100-dmig",)
    nowhere = "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA B200'"
    assert claim_ask(claim_spec(request("gpu.nvidia.com", nowhere)), CATALOG).pools == ()
    nic = claim_ask(claim_spec(request("rdma.example.com")), CATALOG)
    assert nic.pools == ()


def test_a_claim_for_all_devices_cannot_be_counted():
    with pytest.raises(ClaimRefused, match="all devices"):
        claim_ask(claim_spec(request("gpu.nvidia.com", allocationMode="All")), CATALOG)


# --------------------------------------------------------------------------- the webhook
@pytest.fixture(scope="module")
def api(devcluster, tmp_path_factory):
    """kube-apiserver calling the webhook process for the pods and claims of the profile
    namespaces."""
    client = devcluster.client()
    for name in TEAM_A:
        profile_namespace(client, name, {**PROFILE, "team": "a"})
    profile_namespace(client, "other", PROFILE)
    folder = tmp_path_factory.mktemp("dra-kubeflow")
    catalog = folder / "catalog.yaml"
    catalog.write_text(yaml.safe_dump(CATALOG_DATA))
    process = WebhookProcess(catalog, devcluster.kubeconfig, make_tls(folder), folder / "log")
    try:
        names = (*TEAM_A, "other")
        register(client, process, "dra.slices.webhook.fracspawner.io", names, claims=True)
        yield client
    finally:
        process.stop()


def create_claim(api: Any, obj: dict[str, Any], *, dry_run: bool = False) -> str | None:
    """Create a ResourceClaim through kube-apiserver: the webhook's refusal as the user gets
    it, or None where it is stored (or would be: `dry_run`)."""
    namespace = obj["metadata"]["namespace"]
    query = "?dryRun=All" if dry_run else ""
    path = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims{query}"
    status, body = api.request("POST", path, obj)
    refusal = denied(body, "claims.slices.webhook.fracspawner.io")
    assert (status == 201) == (refusal is None), (status, body)
    return refusal


def delete_claim(api: Any, namespace: str, name: str) -> None:
    path = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"
    status, body = api.request("DELETE", path)
    assert status == 200, body


def _wait(predicate, what: str, seconds: float = 30) -> Any:
    deadline = time.monotonic() + seconds
    while not (result := predicate()):
        assert time.monotonic() < deadline, what
        time.sleep(0.2)
    return result


def test_a_claim_for_a_pool_the_namespace_may_not_use_is_refused(api):
    # namespace "other" falls under access.default: no pools
    obj = claim("other", "mine", claim_spec(request("gpu.nvidia.com", H100, **memory("10Gi"))))
    message = create_claim(api, obj, dry_run=True)
    assert message and "pool h100-dra, which namespace other may not use" in message, message
    # a MIG pool team a may not use
    profile = "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"
    obj = claim("team-a", "mig", claim_spec(request("mig.nvidia.com", profile)))
    message = create_claim(api, obj, dry_run=True)
    assert message and "a100-dmig" in message, message
    # a claim for something else than the catalog's GPUs passes
    obj = claim("other", "nic", claim_spec(request("rdma.example.com")))
    assert create_claim(api, obj, dry_run=True) is None


def test_claims_count_against_the_namespace_quota(api):
    spec = claim_spec(request("gpu.nvidia.com", H100, **memory("10Gi")))
    assert create_claim(api, claim("quota-a", "c1", spec)) is None
    assert create_claim(api, claim("quota-a", "c2", spec)) is None
    message = create_claim(api, claim("quota-a", "c3", spec))
    assert message and "holds 0.25 of its 0.25 GPU quota" in message, message
    # a whole GPU asked without a memory request is over any fractional quota
    delete_claim(api, "quota-a", "c1")
    delete_claim(api, "quota-a", "c2")
    whole = claim("quota-a", "w", claim_spec(request("gpu.nvidia.com", H100)))
    assert create_claim(api, whole, dry_run=True)


def test_a_deleted_claim_frees_the_quota_at_once(api):
    """Its reservation must not count again once the watch saw it come and go (found by the
    Kubeflow e2e test: the deleted claim's reservation came back for its whole window, 300 s
    here)."""
    spec = claim_spec(request("gpu.nvidia.com", H100, **memory("20Gi")))  # 0.25: the quota
    assert create_claim(api, claim("delete-a", "quarter", spec)) is None
    again = claim("delete-a", "again", spec)
    assert create_claim(api, again, dry_run=True)
    delete_claim(api, "delete-a", "quarter")  # kubectl delete: the watch sees it go
    _wait(
        lambda: create_claim(api, again, dry_run=True) is None,
        "the deleted claim still counts",
    )


def test_two_claims_at_once_cannot_both_pass_a_limit_meant_for_one(api):
    spec = claim_spec(request("gpu.nvidia.com", H100, **memory("20Gi")))  # 0.25 each
    path = "/apis/resource.k8s.io/v1/namespaces/race-a/resourceclaims"
    with ThreadPoolExecutor(2) as pool:
        answers = list(
            pool.map(lambda i: api.request("POST", path, claim("race-a", f"c{i}", spec)), range(2))
        )
    assert sorted(status for status, _ in answers) == [201, 403], answers


def test_a_pod_naming_a_template_for_a_forbidden_pool_is_refused_in_words(api):
    profile = "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "mig-small"},
        "spec": {"spec": claim_spec(request("mig.nvidia.com", profile))},
    }
    path = "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaimtemplates"
    status, body = api.request("POST", path, template)
    assert status == 201, body
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "trainer", "namespace": "team-a"},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "mig-small"}],
            "containers": [{"name": "c", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }
    status, body = create_pod(api, pod, dry_run=True)
    message = denied(body)
    assert message, (status, body)
    assert "ResourceClaimTemplate mig-small can take GPUs of pool a100-dmig" in message


def test_a_notebook_on_a_dra_pool_gets_its_claim_and_is_counted_once(api):
    """The PodDefault cannot set resourceClaims (Kubeflow's PodDefault spec has no such
    field): the webhook maps the notebook's slice labels to the pool's plan, which names the
    exported template. Its reservation holds until the claim kube-controller-manager makes
    from the template is in the watch; that claim then replaces it, so it counts once."""
    pod = with_poddefault(notebook_pod("nb-a", "nb"), "h100-dra", "10Gi", "fracspawner-h100")
    pod["spec"]["schedulerName"] = "not-served"  # stays Pending: admission is under test
    status, mapped = create_pod(api, pod)
    assert status == 201, mapped
    assert mapped["spec"]["resourceClaims"] == [
        {"name": "gpu", "resourceClaimTemplateName": "fracspawner-h100-dra-10gi"}
    ]
    assert mapped["spec"]["containers"][0]["resources"]["claims"] == [{"name": "gpu"}]
    assert not [k for k in mapped["spec"]["containers"][0]["resources"]["limits"] if "/" in k]
    # the resourceclaim controller makes the pod's claim from the template, through the
    # webhook: admitted on the pod's reservation (0.125 + 0.125 of 0.25 would fit anyway)
    made = _wait(
        lambda: api.get("/apis/resource.k8s.io/v1/namespaces/nb-a/resourceclaims")["items"],
        "kube-controller-manager made no claim for the notebook",
    )
    assert [c["metadata"]["name"].startswith("nb-0-gpu-") for c in made] == [True]
    assert made[0]["metadata"]["ownerReferences"][0]["name"] == "nb-0"
    # counted once: a 10Gi notebook (0.125) still fits, a 20Gi one (0.25) no longer does
    fits = with_poddefault(notebook_pod("nb-a", "nb2"), "h100-dra", "10Gi", "fracspawner-x")
    assert create_pod(api, fits, dry_run=True)[0] == 201
    other = with_poddefault(notebook_pod("nb-a", "nb3"), "h100-dra", "20Gi", "fracspawner-x")
    status, body = create_pod(api, other, dry_run=True)
    assert denied(body), (status, body)


def test_the_webhook_makes_the_notebooks_claim_template_in_its_namespace(api):
    """A namespace needs no export applied first: the template the mapped notebook names is
    made there (not on a dry run: nothing may change)."""
    pod = with_poddefault(notebook_pod("tmpl-a", "dry"), "h100-dra", "10Gi", "fracspawner-h100")
    pod["spec"]["schedulerName"] = "not-served"
    templates = "/apis/resource.k8s.io/v1/namespaces/tmpl-a/resourceclaimtemplates"
    assert create_pod(api, pod, dry_run=True)[0] == 201
    assert api.get(templates)["items"] == []
    assert create_pod(api, pod)[0] == 201
    made = api.get(f"{templates}/fracspawner-h100-dra-10gi")
    request = made["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert request["capacity"] == {"requests": {"memory": "10Gi"}}


# --------------------------------------------------------------------------- export
def test_export_writes_each_namespaces_claim_templates_and_sends_claims_to_the_webhook(tmp_path):
    from fracspawner.kubeflow.export import CLAIMS_NAME, ProfileNamespace, export

    out = export(
        CATALOG,
        namespaces=[ProfileNamespace("team-a", {"team": "a"}), ProfileNamespace("other")],
    )
    (templates, _) = out.files["resourceclaimtemplates/team-a.yaml"]
    # team a may use h100-dra only: its four offers' templates, in its namespace
    assert [t["metadata"]["name"] for t in templates] == [
        "fracspawner-h100-dra-0.125",
        "fracspawner-h100-dra-10gi",
        "fracspawner-h100-dra-20gi",
        "fracspawner-h100-dra-1",
    ]
    assert {t["metadata"]["namespace"] for t in templates} == {"team-a"}
    assert "resourceclaimtemplates/other.yaml" not in out.files  # it may use no pool
    (mwc,), _ = out.files["mutatingwebhookconfiguration.yaml"]
    (claims,) = [w for w in mwc["webhooks"] if w["name"] == CLAIMS_NAME]
    assert claims["rules"] == [
        {
            "operations": ["CREATE"],
            "apiGroups": ["resource.k8s.io"],
            "apiVersions": ["v1"],
            "resources": ["resourceclaims"],
            "scope": "Namespaced",
        }
    ]
    assert claims["namespaceSelector"] == mwc["webhooks"][0]["namespaceSelector"]


async def test_a_claim_review_is_allowed_where_the_catalog_has_no_dra_pool():
    from fracspawner.kubeflow.claims import review_claim

    obj = claim("team-a", "x", claim_spec(request("gpu.nvidia.com")))
    assert (await review_claim(None, claim_review(obj)))["response"]["allowed"]


def test_notebooks_v2_export_writes_the_claim_templates_too():
    from pathlib import Path

    import yaml

    from fracspawner.kubeflow.export import ProfileNamespace, export

    stock = (
        Path(__file__).parent.parent / "fracspawner/kubeflow/stock/workspacekind-jupyterlab.yaml"
    )
    out = export(
        CATALOG,
        namespaces=[ProfileNamespace("team-a", {"team": "a"})],
        notebooks="v2",
        workspace_kind=yaml.safe_load(stock.read_text()),
    )
    templates, _ = out.files["resourceclaimtemplates/team-a.yaml"]
    assert "fracspawner-h100-dra-10gi" in [t["metadata"]["name"] for t in templates]
    # the podConfig cannot carry resourceClaims: the notes say the webhook adds them
    assert any("resourceClaims" in note for note in out.notes)


def test_the_webhook_process_refuses_a_tenants_claim_for_a_pool_it_may_not_use(api):
    """A tenant's ResourceClaim for a MIG pool its profile may not use is refused with the pool
    named, in the words kube-apiserver passes on; one of another class (not the catalog's GPUs)
    is none of the webhook's business."""
    profile = "device.attributes['gpu.nvidia.com'].profile == '3g.40gb'"
    mig = claim("dra-team", "big", claim_spec(request("mig.nvidia.com", profile)))
    assert create_claim(api, mig, dry_run=True) == (
        "this ResourceClaim can take GPUs of pool a100-dmig, which namespace dra-team may "
        "not use (it may use: h100-dra)"
    )
    nic = claim("dra-team", "nic", claim_spec(request("rdma.example.com")))
    assert create_claim(api, nic, dry_run=True) is None
