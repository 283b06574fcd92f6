"""Issue 30 item 3: GPU held via claims, through every door of a Kubeflow profile namespace.

A ResourceClaim created directly in a tenant namespace, a pod naming a ResourceClaimTemplate
and a notebook the webhook maps to a DRA pool are all checked: a pool the namespace may not
use is refused, and claims count against the namespace's GPU quota in GPU-equivalents.

What is modelled (cited): the API server sends the webhook an AdmissionReview for a
ResourceClaim CREATE when its MutatingWebhookConfiguration rules name `resourceclaims` of
group resource.k8s.io (k8s.io/api admission/v1 types.go AdmissionRequest: kind {group, version,
kind}); the resourceclaim controller (kubernetes pkg/controller/resourceclaim/controller.go
handleClaim) creates a pod's claim from its template with generateName and an ownerReference
to the pod (controller: true), through the same admission. The webhook runs in process here
with its cluster reads replaced (namespace labels, the template); the claim and pod watches'
indexes are fed directly, as the watches would; the last test runs the webhook process against
the real control plane's kube-apiserver.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from fracspawner.backends import load_catalog
from fracspawner.kubeflow import claims as claims_module
from fracspawner.kubeflow.claims import ClaimRefused, claim_ask
from fracspawner.kubeflow.webhook import Webhook
from tests.kubeflow_support import admission_review, notebook_pod, patched, with_poddefault

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
CONTROL_PLANE = "real"
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
class FakeWatch:
    def __init__(self, index: Any) -> None:
        self.index = index

    def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def wait_synced(self, timeout: float) -> None:
        assert self.index.synced


class FakeCluster:
    """The webhook's reads: namespace labels (team a, or none) and a watch that is fed by
    hand. `_api_client` is never used: nothing is started."""

    timeout = 5.0
    _api_client = None

    def __init__(self, namespaces: dict[str, dict[str, str]]) -> None:
        self.namespaces = namespaces

    async def namespace(self, name: str):
        return self.namespaces.get(name, {}), {}

    def pod_watch(self, index: Any) -> FakeWatch:
        return FakeWatch(index)


@pytest.fixture
def templates(monkeypatch) -> dict:
    """The claim templates the webhook makes, through an API double with the apiserver's
    answers (tests/test_dra_plan.py FakeResourceApi)."""
    import kubernetes_asyncio.client as k8s

    from tests.test_dra_plan import FakeResourceApi

    store: dict = {}
    monkeypatch.setattr(k8s, "ResourceV1Api", lambda client: FakeResourceApi(store))
    return store


@pytest.fixture
def webhook(templates) -> Webhook:
    hook = Webhook(CATALOG, FakeCluster({"team-a": {"team": "a"}, "other": {}}))
    hook.pods.load([])
    assert hook.dra is not None
    hook.dra.watch = FakeWatch(hook.dra.claims)
    hook.dra.claims.load([])
    return hook


def allowed(answer: dict[str, Any]) -> bool:
    return answer["response"]["allowed"]


def message(answer: dict[str, Any]) -> str:
    return answer["response"]["status"]["message"]


async def test_a_claim_for_a_pool_the_namespace_may_not_use_is_refused(webhook):
    # namespace "other" falls under access.default: no pools
    obj = claim("other", "mine", claim_spec(request("gpu.nvidia.com", H100, **memory("10Gi"))))
    answer = await webhook.dra.review_claim(claim_review(obj))
    assert not allowed(answer)
    assert "pool h100-dra, which namespace other may not use" in message(answer)
    # a MIG pool team a may not use
    profile = "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"
    obj = claim("team-a", "mig", claim_spec(request("mig.nvidia.com", profile)))
    answer = await webhook.dra.review_claim(claim_review(obj))
    assert not allowed(answer) and "a100-dmig" in message(answer)
    # a claim for something else than the catalog's GPUs passes
    obj = claim("other", "nic", claim_spec(request("rdma.example.com")))
    assert allowed(await webhook.dra.review_claim(claim_review(obj)))


async def test_claims_count_against_the_namespace_quota(webhook):
    spec = claim_spec(request("gpu.nvidia.com", H100, **memory("10Gi")))
    first = claim("team-a", "c1", spec)
    assert allowed(await webhook.dra.review_claim(claim_review(first)))
    webhook.dra.claims.put(first)  # the claim watch sees it
    second = claim("team-a", "c2", spec)
    assert allowed(await webhook.dra.review_claim(claim_review(second)))
    webhook.dra.claims.put(second)
    third = claim("team-a", "c3", spec)
    answer = await webhook.dra.review_claim(claim_review(third))
    assert not allowed(answer)
    assert "holds 0.25 of its 0.25 GPU quota" in message(answer)
    # a whole GPU asked without a memory request is over any fractional quota
    webhook.dra.claims.drop(first)
    webhook.dra.claims.drop(second)
    whole = claim("team-a", "w", claim_spec(request("gpu.nvidia.com", H100)))
    assert not allowed(await webhook.dra.review_claim(claim_review(whole)))


async def test_a_deleted_claim_frees_the_quota_at_once(webhook):
    """Its reservation must not count again once the watch saw it come and go (found by the
    Kubeflow e2e test: the deleted claim's reservation came back for its whole window)."""
    spec = claim_spec(request("gpu.nvidia.com", H100, **memory("20Gi")))  # 0.25: the quota
    quarter = claim("team-a", "quarter", spec)
    assert allowed(await webhook.dra.review_claim(claim_review(quarter)))
    webhook.dra.claims.put(quarter)
    again = claim("team-a", "again", spec)
    assert not allowed(await webhook.dra.review_claim(claim_review(again)))
    webhook.dra.claims.drop(quarter)  # kubectl delete: the watch sees it go
    assert allowed(await webhook.dra.review_claim(claim_review(again)))


async def test_two_claims_at_once_cannot_both_pass_a_limit_meant_for_one(webhook):
    spec = claim_spec(request("gpu.nvidia.com", H100, **memory("20Gi")))  # 0.25 each
    answers = await asyncio.gather(
        *(webhook.dra.review_claim(claim_review(claim("team-a", f"c{i}", spec))) for i in range(2))
    )
    assert sorted(allowed(a) for a in answers) == [False, True]


async def test_a_pod_naming_a_template_for_a_forbidden_pool_is_refused_in_words(
    webhook, monkeypatch
):
    templates = {
        "mig-small": {
            "spec": {
                "spec": claim_spec(
                    request("mig.nvidia.com", "device.attributes['gpu.nvidia.com'].profile == "
                            "'1g.10gb'")
                )
            }
        }
    }  # fmt: skip

    async def read_template(api_client, namespace, name, timeout):
        return templates.get(name, {})

    monkeypatch.setattr(claims_module, "read_template", read_template)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "trainer", "namespace": "team-a"},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "mig-small"}],
            "containers": [{"name": "c", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }
    answer = await webhook.review(_review(pod))
    assert not allowed(answer)
    assert "ResourceClaimTemplate mig-small can take GPUs of pool a100-dmig" in message(answer)


def _review(pod: dict[str, Any]):
    import json

    from fracspawner.kubeflow.admission import parse_review

    return parse_review(json.dumps(admission_review(pod)).encode())


async def test_a_notebook_on_a_dra_pool_gets_its_claim_and_is_counted_once(webhook):
    """The PodDefault cannot set resourceClaims (Kubeflow's PodDefault spec has no such
    field): the webhook maps the notebook's slice labels to the pool's plan, which names the
    exported template. Its reservation holds until the claim the controller makes from the
    template is in the watch; that claim then replaces it, so it counts once."""
    pod = with_poddefault(notebook_pod("team-a", "nb"), "h100-dra", "10Gi", "fracspawner-h100")
    answer = await webhook.review(_review(pod))
    assert allowed(answer), answer
    mapped = patched(pod, answer["response"])
    assert mapped["spec"]["resourceClaims"] == [
        {"name": "gpu", "resourceClaimTemplateName": "fracspawner-h100-dra-10gi"}
    ]
    assert mapped["spec"]["containers"][0]["resources"]["claims"] == [{"name": "gpu"}]
    assert not [k for k in mapped["spec"]["containers"][0]["resources"]["limits"] if "/" in k]
    # the pod appears in the watch: it holds nothing a watch sees, its reservation stays
    webhook.pods.put({**mapped, "status": {"phase": "Pending"}})
    made = claim(
        "team-a", "", claim_spec(request("gpu.nvidia.com", H100, **memory("10Gi"))), "nb-0"
    )
    made["metadata"]["generateName"] = "nb-0-gpu-"
    # the controller's claim for it is admitted on the pod's reservation (not counted twice):
    # 0.125 + 0.125 of 0.25 fits
    assert allowed(await webhook.dra.review_claim(claim_review(made)))
    made["metadata"]["name"] = "nb-0-gpu-x7k2p"
    webhook.dra.claims.put(made)
    assert webhook.pods.held("team-a") == pytest.approx(0.125)
    # another notebook of 20Gi (0.25) no longer fits the 0.25 quota
    other = with_poddefault(notebook_pod("team-a", "nb2"), "h100-dra", "20Gi", "fracspawner-x")
    answer = await webhook.review(_review(other))
    assert not allowed(answer)


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
    assert allowed(await review_claim(None, claim_review(obj)))


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


async def test_the_webhook_makes_the_notebooks_claim_template_in_its_namespace(webhook, templates):
    """A namespace needs no export applied first: the template the mapped notebook names is
    made there (not on a dry run: nothing may change)."""
    pod = with_poddefault(notebook_pod("team-a", "dry"), "h100-dra", "10Gi", "fracspawner-h100")
    dry = admission_review(pod, dry_run=True)
    import json

    from fracspawner.kubeflow.admission import parse_review

    assert allowed(await webhook.review(parse_review(json.dumps(dry).encode())))
    assert templates == {}
    assert allowed(await webhook.review(_review(pod)))
    made = templates[("team-a", "fracspawner-h100-dra-10gi")]
    request = made["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert request["capacity"] == {"requests": {"memory": "10Gi"}}


# --------------------------------------------------------------------------- the real process
def test_the_webhook_process_refuses_a_tenants_claim_for_a_pool_it_may_not_use(
    devcluster, tmp_path
):
    """`fracspawner webhook` as deployed (its own process, reading the namespace from the
    control plane's API): a tenant's ResourceClaim for a MIG pool its profile may not use is
    refused with the pool named; one for the pool it may use passes the access check."""
    import yaml

    from tests.kubeflow_support import WebhookProcess, make_tls

    client = devcluster.client()
    labels = {"app.kubernetes.io/part-of": "kubeflow-profile", "team": "a"}
    status, body = client.request(
        "POST", "/api/v1/namespaces", {"metadata": {"name": "dra-team", "labels": labels}}
    )
    assert status == 201, body
    catalog = tmp_path / "catalog.yaml"
    data = {**CATALOG_DATA, "kubeflow": {"namespaces": [{"name": "dra-team", "groups": ["team"]}]}}
    catalog.write_text(yaml.safe_dump(data))
    process = WebhookProcess(catalog, devcluster.kubeconfig, make_tls(tmp_path), tmp_path / "log")
    try:
        profile = "device.attributes['gpu.nvidia.com'].profile == '3g.40gb'"
        mig = claim("dra-team", "big", claim_spec(request("mig.nvidia.com", profile)))
        answer = process.review(claim_review(mig))
        assert not answer["allowed"]
        assert answer["status"]["message"] == (
            "this ResourceClaim can take GPUs of pool a100-dmig, which namespace dra-team may "
            "not use (it may use: h100-dra)"
        )
        # a claim of another class (not the catalog's GPUs) is none of the webhook's business
        nic = claim("dra-team", "nic", claim_spec(request("rdma.example.com")))
        assert process.review(claim_review(nic))["allowed"]
    finally:
        process.stop()
