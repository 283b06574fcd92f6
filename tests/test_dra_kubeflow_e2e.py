"""Issue 30 acceptance, Kubeflow: a tenant who creates a ResourceClaim in its profile namespace
for a pool it may not use, or over its quota, is refused, by the API server calling
`fracspawner webhook` through the configuration `fracspawner kubeflow export` writes.

On the real control plane (issue 35 item 3): kube-apiserver calls the webhook over TLS (the
caBundle of the test CA) for resource.k8s.io/v1 resourceclaims and refuses the create with the
webhook's words; the node agent publishes the nodes' ResourceSlices as NVIDIA's DRA kubelet
plugin does. The webhook runs as deployed, in its own process; the exported configuration's
Service reference is replaced by the webhook's loopback URL (kubeflow_support.at_url: the
apiserver reaches a Service only through its ClusterIP, which nothing routes here).
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
import yaml

from fracspawner.backends import load_catalog
from fracspawner.kubeflow.export import WebhookTarget, export
from tests.kubeflow_support import WebhookProcess, at_url, make_tls
from tests.test_dra_kubeflow import CATALOG_DATA, claim, claim_spec, memory, request

pytestmark = pytest.mark.e2e

PROFILE = {"app.kubernetes.io/part-of": "kubeflow-profile"}
H100 = "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100 80GB HBM3'"
TOPOLOGY = {
    "nodes": [
        {
            "name": "gpu-h100-dra-1",
            "capacity": {"cpu": "64", "memory": "512Gi"},
            "dra": {"gpus": 1, "model": "H100-80GB", "consumableShares": "memory"},
        },
        {
            "name": "gpu-a100-dmig-1",
            "capacity": {"cpu": "64", "memory": "512Gi"},
            "dra": {"gpus": 1, "model": "A100-80GB", "mig": "dynamic"},
        },
    ]
}
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims"


@pytest.fixture(scope="module")
def cluster(devcluster, tmp_path_factory) -> Any:
    """What a platform team applies: the webhook and the exported configuration; a profile
    namespace of team a (h100-dra only, at most 0.25 GPU)."""
    folder = tmp_path_factory.mktemp("dra-kubeflow")
    tls = make_tls(folder, ("127.0.0.1", "localhost", "fracspawner-webhook.kubeflow.svc"))
    catalog_file = folder / "catalog.yaml"
    catalog_file.write_text(yaml.safe_dump(CATALOG_DATA))
    client = devcluster.client()
    for name, labels in (("kubeflow", {}), ("team-a", {**PROFILE, "team": "a"})):
        status, body = client.request(
            "POST", "/api/v1/namespaces", {"metadata": {"name": name, "labels": labels}}
        )
        assert status == 201, body
    webhook = WebhookProcess(catalog_file, devcluster.kubeconfig, tls, folder / "webhook.log")
    exported = export(
        load_catalog(catalog_file),
        webhook=WebhookTarget(ca_bundle=base64.b64encode(Path(tls["ca"]).read_bytes()).decode()),
    )
    (configuration,), _ = exported.files["mutatingwebhookconfiguration.yaml"]
    assert "resourceclaims" in str(configuration["webhooks"])
    status, body = client.request(
        "POST", "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
        at_url(configuration, webhook.url),
    )  # fmt: skip
    assert status == 201, body
    yield client
    webhook.stop()


def test_a_tenants_claim_for_a_pool_it_may_not_use_is_refused(cluster):
    profile = "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"
    mig = claim("team-a", "small-mig", claim_spec(request("mig.nvidia.com", profile)))
    status, body = cluster.request("POST", CLAIMS, mig)
    assert status == 403, body.get("message")
    assert "pool a100-dmig, which namespace team-a may not use" in body["message"], body
    status, _ = cluster.request("GET", f"{CLAIMS}/small-mig")
    assert status == 404  # nothing was made


def test_a_tenants_claims_over_its_quota_are_refused(cluster):
    quarter = claim(
        "team-a", "quarter", claim_spec(request("gpu.nvidia.com", H100, **memory("20Gi")))
    )
    status, body = cluster.request("POST", CLAIMS, quarter)
    assert status == 201, body
    more = claim("team-a", "more", claim_spec(request("gpu.nvidia.com", H100, **memory("10Gi"))))
    status, body = cluster.request("POST", CLAIMS, more)
    assert status == 403, body
    assert "namespace team-a holds 0.25 of its 0.25 GPU quota" in body["message"], body
    # the quota frees with the claim
    status, _ = cluster.request("DELETE", f"{CLAIMS}/quarter")
    assert status == 200
    from tests.e2e_helpers import wait_until

    def admitted() -> bool:
        status, _ = cluster.request("POST", CLAIMS, more)
        return status == 201

    wait_until(admitted, 60, "the claim admitted once the quarter is deleted")
    status, _ = cluster.request("DELETE", f"{CLAIMS}/more")  # the quota free for the next test
    assert status == 200


def _template_pod(name: str, template: str) -> dict[str, Any]:
    """A pipeline step naming a ResourceClaimTemplate: kube-controller-manager's resourceclaim
    controller makes its claim (through admission), kube-scheduler allocates it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "team-a"},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "python:3.11",
                    "command": ["sleep", "3600"],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
            "restartPolicy": "Never",
        },
    }


def test_a_claim_made_from_a_template_is_allocated_and_counts_against_the_quota(cluster):
    """Issue 35 item 3: the claim kube-controller-manager makes from a pod's template passes the
    webhook and kube-scheduler allocates it on the node agent's H100 share; a second pod's
    template over the quota is refused by the webhook, with its words."""
    from tests.e2e_helpers import wait_until

    base = "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaimtemplates"
    for name, amount in (("quarter-tpl", "20Gi"), ("more-tpl", "10Gi")):
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": "team-a"},
            "spec": {"spec": claim_spec(request("gpu.nvidia.com", H100, **memory(amount)))},
        }
        status, answer = cluster.request("POST", base, body)
        assert status == 201, answer
    pods = "/api/v1/namespaces/team-a/pods"
    # admitted once the webhook's claim watch has seen the claims of earlier tests go
    wait_until(
        lambda: cluster.request("POST", pods, _template_pod("step-1", "quarter-tpl"))[0] == 201,
        60,
        "step-1 admitted with the namespace's quota free",
    )

    def allocated() -> dict[str, Any] | None:
        claims = cluster.request("GET", CLAIMS)[1]["items"]
        mine = [c for c in claims if c["metadata"]["name"].startswith("step-1-gpu-")]
        return mine[0] if mine and (mine[0].get("status") or {}).get("allocation") else None

    wait_until(allocated, 120, "the template's claim made and allocated")
    made = allocated()
    assert made is not None
    assert made["metadata"]["ownerReferences"][0]["name"] == "step-1"
    (result,) = made["status"]["allocation"]["devices"]["results"]
    assert result["pool"] == "gpu-h100-dra-1", result
    wait_until(
        lambda: cluster.request("GET", f"{pods}/step-1")[1]["spec"].get("nodeName"),
        120,
        "step-1 scheduled",
    )
    status, answer = cluster.request("POST", pods, _template_pod("step-2", "more-tpl"))
    assert status == 403, answer
    assert "0.25 of its 0.25 GPU quota" in answer["message"], answer
