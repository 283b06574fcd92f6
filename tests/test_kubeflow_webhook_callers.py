"""Issue 28 item 7: a tenant cannot jam another namespace's quota with forged reviews, nor
read its headroom with dry runs, at the chart's defaults (no client certificate required).

The real `fracspawner webhook` process and the real control plane. What is modelled, and from where:
- a pod's request to the webhook's Service arrives from the pod's IP (kube-proxy rewrites the
  destination of Service traffic, not the source, inside the pod network: kubernetes
  pkg/proxy/iptables/proxier.go masquerades only traffic from outside the cluster CIDR, hairpin
  traffic, or all with --masquerade-all); the node agent gives each running pod an address
  of its own (devcluster/network.py LoopbackPool), and the tests below send the tenant's requests
  from that address (http.client's source_address), as its process would;
- the API server's requests come from no pod address (a hostNetwork static pod, or outside
  the cluster): here from 127.0.0.1, which the node agent never gives a pod;
- AdmissionRequest.dryRun: nothing is persisted (k8s.io/api admission/v1 types.go), so a dry
  run needs no quota; AdmissionResponse.warnings reach the client as Warning headers.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from fracspawner.kubeflow.callers import SourceStandings
from tests.kubeflow_support import (
    WebhookProcess,
    admission_review,
    create_pod,
    denied,
    make_client_tls,
    make_tls,
    notebook_pod,
    profile_namespace,
    register,
    with_poddefault,
)

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "examples" / "catalogs" / "demo.yaml"  # h100, up to 0.25 GPU per namespace
PROFILE = {"app.kubernetes.io/part-of": "kubeflow-profile"}


def notebook(namespace: str, name: str, gpu: str = "0.25") -> dict[str, Any]:
    selector = f"fracspawner-h100-{gpu.replace('.', '-')}"
    return with_poddefault(notebook_pod(namespace, name), "h100", gpu, selector)


@pytest.fixture(scope="module")
def api(devcluster):
    client = devcluster.client()
    for name in ("tenant-a", "tenant-b", "full", "full-verified", "jam"):
        profile_namespace(client, name, PROFILE)
    return client


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    return make_tls(tmp_path_factory.mktemp("tls"))


def _wait(predicate, what: str, seconds: float = 60) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        found = predicate()
        if found:
            return found
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def post_from(webhook: WebhookProcess, source: str, review: dict[str, Any]) -> tuple[int, dict]:
    """POST /mutate from the address `source` (a pod's), over verified HTTPS."""
    conn = http.client.HTTPSConnection(
        "127.0.0.1", webhook.port, context=webhook.context, source_address=(source, 0), timeout=30
    )
    try:
        conn.request("POST", "/mutate", json.dumps(review), {"Content-Type": "application/json"})
        answer = conn.getresponse()
        return answer.status, json.loads(answer.read() or b"{}")
    finally:
        conn.close()


def test_a_tenants_pod_cannot_hold_another_namespaces_quota(api, devcluster, tls, tmp_path):
    base = "/api/v1/namespaces/tenant-a/pods"
    attacker = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "forger", "namespace": "tenant-a"},
        "spec": {
            "containers": [{"name": "main", "image": "python:3.12", "command": ["sleep", "3600"]}]
        },
    }
    status, body = api.request("POST", base, attacker)
    assert status == 201, body
    pod_ip = _wait(
        lambda: (api.request("GET", f"{base}/forger")[1].get("status") or {}).get("podIP"),
        "the tenant's pod never got an address",
    )
    # the chart's defaults: no client certificate, generic refusals
    webhook = WebhookProcess(DEMO, devcluster.kubeconfig, tls, tmp_path / "webhook.log", ())
    try:
        victim = notebook("tenant-b", "ghost")
        # once the webhook's watch has the tenant's pod, its reviews are refused (before: every
        # forged review was answered, and reserved tenant-b's quota)
        _wait(
            lambda: post_from(webhook, pod_ip, admission_review(victim, dry_run=True))[0] == 403,
            "a review from a tenant's pod was answered",
            30,
        )
        status, answer = post_from(webhook, pod_ip, admission_review(victim))
        assert status == 403, answer
        assert "API server only" in answer["error"]
        # tenant-b's real notebook, sent by kube-apiserver (registered by the export's
        # configuration; its calls come from 127.0.0.1, no pod's address), gets its whole quota
        register(api, webhook, "tenant-b.slices.webhook.fracspawner.io", "tenant-b")
        real = notebook("tenant-b", "real")
        real["spec"]["nodeName"] = "not-a-node"  # stays Pending, runs nothing
        status, stored = create_pod(api, real)
        assert status == 201, stored
        assert stored["metadata"]["annotations"]["fracspawner.io/gpu-equivalent"] == "0.25"
        status, metrics = webhook.request("GET", "/metrics")
        assert b"fracspawner_webhook_pod_callers_total 2.0" in metrics
    finally:
        webhook.stop()
        api.request("DELETE", f"{base}/forger?gracePeriodSeconds=0")


def test_a_dry_run_from_an_unverified_caller_tells_nothing_about_the_quota(
    api, devcluster, tls, tmp_path
):
    """Through kube-apiserver, which the webhook cannot tell from a tenant without a client
    certificate: `kubectl create --dry-run=server` is admitted and shows the webhook's warning
    (AdmissionResponse.warnings reach the client as Warning headers); the real create is
    refused."""
    webhook = WebhookProcess(DEMO, devcluster.kubeconfig, tls, tmp_path / "webhook.log", ())
    try:
        register(api, webhook, "full.slices.webhook.fracspawner.io", "full")
        first = notebook("full", "first")
        first["spec"]["nodeName"] = "not-a-node"  # stays Pending, runs nothing
        assert create_pod(api, first)[0] == 201
        # the namespace is full; a dry run does not say so (it persists nothing: the create is
        # what counts) and warns that the quota was not checked
        probe = notebook("full", "probe", "0.125")
        if shutil.which("kubectl"):
            dry = subprocess.run(
                ["kubectl", "create", "--dry-run=server", "-o", "json", "-f", "-"],
                input=json.dumps(probe),
                env={**os.environ, "KUBECONFIG": str(devcluster.kubeconfig)},
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert dry.returncode == 0, dry.stderr
            assert "Warning: fracspawner does not check the namespace's GPU quota on a dry run" in (
                dry.stderr
            )
            # the rest of the answer is the real one
            mapped = json.loads(dry.stdout)
            assert mapped["metadata"]["annotations"]["fracspawner.io/gpu-equivalent"] == "0.125"
        status, body = create_pod(api, probe, dry_run=True)
        assert status == 201, body
        status, body = create_pod(api, probe)
        assert denied(body), (status, body)
    finally:
        webhook.stop()
    # a verified caller is the API server: its dry run is the real answer, with the numbers
    server = make_client_tls(tmp_path / "apiserver", "kube-apiserver")
    webhook = WebhookProcess(
        DEMO,
        devcluster.kubeconfig,
        tls,
        tmp_path / "verified.log",
        ("--client-ca", str(server["ca"])),
        client=server,
    )
    try:
        assert webhook.review(admission_review(notebook("full-verified", "first")))["allowed"]
        dry = webhook.review(
            admission_review(notebook("full-verified", "probe", "0.125"), dry_run=True)
        )
        assert dry["allowed"] is False and "0.25 of its 0.25 GPU quota" in dry["status"]["message"]
    finally:
        webhook.stop()


def _metric(webhook: WebhookProcess, name: str) -> float:
    status, text = webhook.request("GET", "/metrics")
    assert status == 200
    for line in text.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def test_forged_reviews_from_a_node_address_stop_holding_another_namespaces_quota(
    api, devcluster, tls, tmp_path
):
    """What remains without a certificate: a caller on an address that is no pod's (a node
    process, a hostNetwork pod). Its reservations never see their pod; after a few, they are
    counted against it, not against the namespace they name."""
    forger = "127.1.2.3"  # no pod's (devcluster's pods are 127.0.x.y), not the API server's
    flags = ("--reservation-ttl", "2")  # the window, short for the test (default 10 s)
    webhook = WebhookProcess(DEMO, devcluster.kubeconfig, tls, tmp_path / "webhook.log", flags)
    ghost = notebook("jam", "ghost")  # the namespace's whole quota, for a pod never created

    def forge() -> dict[str, Any]:
        status, answer = post_from(webhook, forger, admission_review(ghost))
        assert status == 200, answer
        return answer["response"]

    try:
        assert forge()["allowed"] is True  # the first one holds jam's quota, for a window
        _wait(
            lambda: (
                forge()
                and _metric(webhook, "fracspawner_webhook_unconfirmed_reservations_total") >= 3
            ),
            "the forger's reservations were never judged",
            60,
        )
        # a fresh forged reservation, then tenant jam's real notebook from the API server
        assert forge()["allowed"] is True
        real = webhook.review(admission_review(notebook("jam", "real")))
        assert real["allowed"] is True, real
    finally:
        webhook.stop()


def test_the_api_servers_occasional_refused_pod_does_not_make_it_suspect():
    now = [0.0]
    standings = SourceStandings(memory=600, strikes=3, clock=lambda: now[0])
    for i in range(20):  # 20 pods created, 3 refused by a later webhook
        standings.ended("10.0.0.1", f"ns/p{i}", float(i), confirmed=i not in (3, 9, 15))
        now[0] += 1
    assert not standings.suspect("10.0.0.1")
    for i in range(3):  # a forger: nothing it reserves is ever created
        standings.ended("10.9.9.9", f"ns/ghost{i}", float(i), confirmed=False)
        standings.ended("10.9.9.9", f"ns/ghost{i}", float(i), confirmed=False)  # read twice
    assert standings.suspect("10.9.9.9") and standings.unconfirmed == 6
    now[0] += 601  # its strikes age out
    assert not standings.suspect("10.9.9.9")
