"""Kubeflow end to end on the real control plane's admission path: `fracspawner kubeflow export`
writes the PodDefaults and the MutatingWebhookConfiguration, they are applied to kube-apiserver,
which calls the real `fracspawner webhook` over TLS (the caBundle the export wrote), and pods are
created the way Kubeflow's Notebook controller creates them. A stand-in for Kubeflow's PodDefault
webhook (its label merge, per the reference) runs under its real configuration name, so the
order of the two webhooks is the apiserver's: by configuration name.

The exported configuration names the webhook's Service; here the webhook is a local process and
no network routes a ClusterIP (kube-apiserver resolves a webhook Service to its ClusterIP, or to
an endpoint with --enable-aggregator-routing, and endpoints may not be loopback), so the test
points each webhook's clientConfig at its loopback URL (kubeflow_support.at_url) and leaves the
rest of the exported object as it is."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import ssl
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from tornado import web
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from fracspawner.backends import load_catalog
from fracspawner.kubeflow.cli import main as kubeflow_main
from tests.kubeflow_support import (
    WebhookProcess,
    assert_plan_applied,
    at_url,
    changes,
    make_tls,
    notebook_pod,
    other_pod,
    podconfig_spec,
    workspace_pod,
)
from tests.test_kubeflow_webhook import kubeflow_catalog, plan_pod

pytestmark = pytest.mark.e2e

PROFILE = {"app.kubernetes.io/part-of": "kubeflow-profile"}
TOPOLOGY = {
    "namespaces": [
        {"name": "alice", "labels": PROFILE},
        {"name": "bob", "labels": PROFILE},
        {"name": "lab", "labels": {**PROFILE, "team": "research"}},
        {"name": "kubeflow"},
    ],
    "nodes": [{"name": "cpu-1", "capacity": {"cpu": "8", "memory": "32Gi"}}],
}
MUTATING = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
SERVICE = "fracspawner-webhook.kubeflow.svc"


# --------------------------------------------------------------------------- set-up
@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    return make_tls(tmp_path_factory.mktemp("tls"), ("127.0.0.1", SERVICE))


@pytest.fixture(scope="module")
def catalog(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("catalog") / "catalog.yaml"
    path.write_text(yaml.safe_dump(kubeflow_catalog()))
    return path


def export(client: Any, catalog: Path, tls: dict[str, Path], out: Path, *args: str) -> Path:
    """`fracspawner kubeflow export` for the cluster's profile namespaces, into `out`, with the
    namespaces as `kubectl get namespaces -o yaml` prints them."""
    out.mkdir(parents=True, exist_ok=True)
    namespaces = out.parent / f"{out.name}-namespaces.yaml"
    namespaces.write_text(yaml.safe_dump(client.get("/api/v1/namespaces")))
    code = kubeflow_main(
        ["export", "--catalog", str(catalog), "-o", str(out), "--ca-bundle", str(tls["ca"])]
        + ["--namespaces-file", str(namespaces), *args]
    )
    assert code == 0
    return out


@pytest.fixture(scope="module")
def exported(devcluster, catalog, tls, tmp_path_factory) -> Path:
    return export(devcluster.client(), catalog, tls, tmp_path_factory.mktemp("export"))


class PodDefaultStandIn:
    """Kubeflow's PodDefault webhook, as far as labels go (kubeflow/dashboard
    poddefaults-webhooks main.go: PodDefaults of the pod's namespace whose selector matches
    the pod's labels add their spec.labels), on loopback HTTPS in a thread of its own."""

    def __init__(self, poddefaults: list[dict[str, Any]], cert: dict[str, Path]) -> None:
        self.poddefaults = poddefaults
        self.cert = cert
        self.port = 0
        self.calls = 0
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(10)

    def respond(self, review: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        request = review["request"]
        pod = request["object"]
        labels = dict(pod["metadata"].get("labels") or {})
        for pd in self.poddefaults:
            wanted = pd["spec"]["selector"]["matchLabels"]
            if pd["metadata"].get("namespace") == request["namespace"] and all(
                labels.get(k) == v for k, v in wanted.items()
            ):
                labels.update(pd["spec"].get("labels") or {})
        answer: dict[str, Any] = {"uid": request["uid"], "allowed": True}
        if labels != (pod["metadata"].get("labels") or {}):
            patch = [{"op": "add", "path": "/metadata/labels", "value": labels}]
            answer["patchType"] = "JSONPatch"
            answer["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": answer}

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        stand_in = self

        class Handler(web.RequestHandler):
            def post(self) -> None:
                self.set_header("Content-Type", "application/json")
                self.finish(json.dumps(stand_in.respond(json.loads(self.request.body))))

        async def serve() -> None:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(self.cert["cert"], self.cert["key"])
            server = HTTPServer(web.Application([(r"/.*", Handler)]), ssl_options=context)
            sockets = bind_sockets(0, "127.0.0.1")
            server.add_sockets(sockets)
            self.port = sockets[0].getsockname()[1]
            self._ready.set()
            await asyncio.Event().wait()

        loop.run_until_complete(serve())


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _apply(client: Any, path: str, obj: dict[str, Any]) -> None:
    status, body = client.request("POST", path, obj)
    if status == 409:  # already there: replace it (kubectl apply)
        name = obj["metadata"]["name"]
        current = client.get(f"{path}/{name}")
        obj = {
            **obj,
            "metadata": {
                **obj["metadata"],
                "resourceVersion": current["metadata"]["resourceVersion"],
            },
        }
        status, body = client.request("PUT", f"{path}/{name}", obj)
    assert status in (200, 201), body


def install_webhook_configuration(client: Any, folder: Path, webhook: WebhookProcess) -> None:
    (config,) = _docs(folder / "mutatingwebhookconfiguration.yaml")
    _apply(client, MUTATING, at_url(config, webhook.url))


def profile_accounts(client: Any) -> None:
    """The ServiceAccounts Kubeflow's Profile controller makes in each profile namespace
    (default-editor, which notebook and pipeline pods run as), and a Workspace's own
    (ws-<name>): the ServiceAccount admission plugin refuses a pod whose account is missing."""
    accounts = [(ns, "default-editor") for ns in ("alice", "bob", "lab")] + [("alice", "ws-big")]
    for namespace, name in accounts:
        body = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}}
        _apply(client, f"/api/v1/namespaces/{namespace}/serviceaccounts", body)


@pytest.fixture(scope="module")
def cluster(devcluster, exported, catalog, tls, tmp_path_factory):
    """The devcluster with the webhook behind its Service, the exported configuration, the
    PodDefaults and the PodDefault webhook stand-in: what a platform team applies."""
    client = devcluster.client()
    profile_accounts(client)
    webhook = WebhookProcess(
        catalog, devcluster.kubeconfig, tls, tmp_path_factory.mktemp("wh") / "log"
    )
    install_webhook_configuration(client, exported, webhook)
    poddefaults = [pd for f in sorted((exported / "poddefaults").glob("*.yaml")) for pd in _docs(f)]
    stand_in = PodDefaultStandIn(poddefaults, tls)
    ca_bundle = base64.b64encode(tls["ca"].read_bytes()).decode()
    _apply(
        client,
        MUTATING,
        {
            # Kubeflow's own name and rules (kubeflow/dashboard manifests/kustomize/base)
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "poddefaults-webhook-mutating-webhook-configuration"},
            "webhooks": [
                {
                    "name": "poddefaults-webhook-deployment.kubeflow.org",
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                    "failurePolicy": "Fail",
                    "clientConfig": {
                        "url": f"https://127.0.0.1:{stand_in.port}/apply-poddefault",
                        "caBundle": ca_bundle,
                    },
                    "rules": [
                        {
                            "operations": ["CREATE"],
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "resources": ["pods"],
                        }
                    ],
                    "namespaceSelector": {"matchLabels": PROFILE},
                }
            ],
        },
    )
    yield {"client": client, "webhook": webhook, "stand_in": stand_in, "poddefaults": poddefaults}
    webhook.stop()


def controller_pod(namespace: str, notebook: str, poddefault: str | None) -> dict[str, Any]:
    """The pod as the Notebook controller creates it: the Notebook's labels copied, with the
    label the form set for a ticked PodDefault. It names a scheduler nobody serves, so it stays
    Pending and nothing runs: admission is what is under test."""
    labels = {poddefault: "true"} if poddefault else {}
    pod = notebook_pod(namespace, notebook, labels)
    pod["spec"]["schedulerName"] = "not-served"
    return pod


def create(client: Any, pod: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    return client.request("POST", f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods", pod)


# --------------------------------------------------------------------------- tests
def test_a_notebook_with_a_ticked_poddefault_gets_exactly_the_plan(cluster, catalog, capsys):
    client = cluster["client"]
    pod = controller_pod("alice", "analysis", "fracspawner-h100-0-25")
    status, created = create(client, pod)
    assert status == 201, created
    # the PodDefault webhook added the slice labels, then ours the plan
    assert created["metadata"]["labels"]["fracspawner.io/pool"] == "h100"
    expected = changes(
        plan_pod(catalog, "none", None, capsys), plan_pod(catalog, "1/4", "h100", capsys)
    )
    assert_plan_applied(pod, created, "analysis", expected)
    # kube-apiserver validated the mutated pod before storing it: it is there as answered
    stored = client.get("/api/v1/namespaces/alice/pods/analysis-0")
    assert stored["metadata"]["labels"] == created["metadata"]["labels"]
    assert stored["spec"]["containers"] == created["spec"]["containers"]


def test_a_pod_over_the_namespace_quota_is_refused_with_the_message(cluster):
    client = cluster["client"]
    status, _ = create(client, controller_pod("bob", "first", "fracspawner-h100-0-25"))
    assert status == 201
    # bob's namespace now holds its whole 0.25 GPU quota: the next notebook is refused, and
    # the message is what the StatefulSet's FailedCreate event shows its owner
    status, body = create(client, controller_pod("bob", "second", "fracspawner-h100-0-125"))
    assert status == 403, body
    assert body["message"] == (
        'admission webhook "slices.webhook.fracspawner.io" denied the request: '
        "fracspawner refused the GPU slice 0.125 on pool h100 in namespace bob: it counts as "
        "0.125 GPU and the namespace's notebooks already hold 0.25 of its 0.25 GPU quota "
        "(0 left). Stop a notebook or choose a smaller slice."
    )


def test_a_pool_the_namespace_may_not_use_is_refused(cluster):
    pod = controller_pod("alice", "mig", None)
    pod["metadata"]["labels"].update(
        {"fracspawner.io/pool": "a100-mig", "fracspawner.io/gpu": "mig-1g.10gb"}
    )
    status, body = create(cluster["client"], pod)
    assert status == 403
    assert "you may not use pool 'a100-mig'. Pools you may use: h100." in body["message"]


def test_a_pod_without_slice_labels_is_untouched(cluster):
    pod = controller_pod("lab", "cpu", None)
    status, created = create(cluster["client"], pod)
    assert status == 201
    assert created["metadata"]["labels"] == pod["metadata"]["labels"]
    assert (
        created["spec"]["containers"][0]["resources"] == pod["spec"]["containers"][0]["resources"]
    )
    assert created["spec"]["containers"][0]["env"] == pod["spec"]["containers"][0]["env"]
    assert "nodeSelector" not in created["spec"]


def test_the_slice_of_a_running_pod_cannot_be_changed(cluster):
    client = cluster["client"]
    status, created = create(client, controller_pod("lab", "guarded", "fracspawner-t4-0-25"))
    assert status == 201, created
    path = "/api/v1/namespaces/lab/pods/guarded-0"
    for patch in (
        {"metadata": {"annotations": {"fracspawner.io/gpu-equivalent": "0"}}},
        {"metadata": {"labels": {"fracspawner.io/pool": None}}},
    ):
        status, body = client.request("PATCH", path, patch, "application/merge-patch+json")
        assert status == 403, body
        assert 'admission webhook "guard.slices.webhook.fracspawner.io" denied' in body["message"]
    status, body = client.request(
        "PATCH", path, {"metadata": {"labels": {"owner": "me"}}}, "application/merge-patch+json"
    )
    assert status == 200, body
    assert client.get(path)["metadata"]["annotations"]["fracspawner.io/gpu-equivalent"] == "0.25"


def test_each_pod_goes_to_its_webhook_through_the_exported_object_selectors(cluster, catalog):
    """Issue 19 items 1, 2, 11 through the devcluster's admission path with the exported
    configuration: a Workspace's pod (workspace_pod: labels as workspace_controller.go sets
    them) goes to workspaces.slices..., a pipeline step to pods.slices..., which counts its
    GPU, labels it fracspawner.io/counted for the guard and otherwise leaves it exactly as it
    was sent."""
    client = cluster["client"]
    pool = load_catalog(catalog)
    big = workspace_pod("alice", "big", podconfig_spec(pool, "h100", "1"))
    big["spec"]["schedulerName"] = "not-served"
    status, body = create(client, big)
    assert status == 403, body
    assert body["message"].startswith(
        'admission webhook "workspaces.slices.webhook.fracspawner.io" denied the request: '
        "fracspawner refused the GPU slice 1 on pool h100 in namespace alice: it counts as 1 GPU"
    )
    step = other_pod("lab", "train-x7k2p-1", {"limits": {"nvidia.com/mig-1g.10gb": "2"}})
    step["spec"]["schedulerName"] = "not-served"
    status, created = create(client, step)
    assert status == 201, created
    # counted: marked for the guard (tests/test_kubeflow_guard_counted.py), nothing else
    counted = {**step["metadata"]["labels"], "fracspawner.io/counted": "true"}
    assert created["metadata"]["labels"] == counted
    assert created["metadata"]["annotations"] == step["metadata"]["annotations"]
    (main,) = created["spec"]["containers"]
    sent = step["spec"]["containers"][0]["resources"]["limits"]
    # the limits as sent; the requests kube-apiserver defaults from them (SetDefaults_Pod)
    assert main["resources"] == {"limits": sent, "requests": sent}
    assert "env" not in main and "nodeSelector" not in created["spec"]
    whole = other_pod("bob", "train-x7k2p-2", {"limits": {"nvidia.com/gpu": "1"}})
    status, body = create(client, whole)
    assert status == 403, body
    assert body["message"].startswith(
        'admission webhook "pods.slices.webhook.fracspawner.io" denied the request: '
        "fracspawner refused this pod's GPU in namespace bob"
    )


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs kubectl (make system-deps)")
def test_kubectl_debug_goes_through_the_ephemeral_containers_webhook(cluster, devcluster):
    """Issue 35 item 3: Debian's kubectl debug adds an ephemeral container through
    pods/ephemeralcontainers; kube-apiserver sends that UPDATE to the exported
    ephemeral.slices... webhook, which refuses a debugger that would see the node's GPUs
    through its env and lets a plain one in."""
    client = cluster["client"]
    status, created = create(client, controller_pod("lab", "debugged", None))
    assert status == 201, created

    def debug(name: str, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["kubectl", "debug", "-n", "lab", "debugged-0", f"--container={name}"]
            + ["--image=nvidia/cuda:12.4.1-base-ubuntu22.04", *args, "--", "true"],
            env={**os.environ, "KUBECONFIG": str(devcluster.kubeconfig)},
            capture_output=True,
            text=True,
            timeout=120,
        )

    refused = debug("peek", "--env=NVIDIA_VISIBLE_DEVICES=all")
    assert refused.returncode != 0
    assert (
        'admission webhook "ephemeral.slices.webhook.fracspawner.io" denied the request'
        in refused.stderr
    ), refused.stderr
    assert "NVIDIA_VISIBLE_DEVICES" in refused.stderr, refused.stderr
    done = debug("debugger")
    assert done.returncode == 0, done.stderr
    pod = client.get("/api/v1/namespaces/lab/pods/debugged-0")
    assert [c["name"] for c in pod["spec"]["ephemeralContainers"]] == ["debugger"]


def test_with_the_webhook_down_slice_pods_are_refused_and_others_only_if_so_configured(
    cluster, catalog, tls, tmp_path
):
    client, webhook = cluster["client"], cluster["webhook"]
    webhook.stop()
    # failurePolicy Fail, every pod of a profile namespace sent (the default export)
    status, body = create(client, controller_pod("lab", "down1", "fracspawner-t4-0-25"))
    assert (
        status == 500
        and 'failed calling webhook "slices.webhook.fracspawner.io"' in body["message"]
    )
    status, body = create(client, controller_pod("lab", "plain1", None))
    assert status == 500
    # exported with --slice-pods-only: only pods carrying fracspawner.io/pool go to the webhook
    only = export(client, catalog, tls, tmp_path / "only", "--slice-pods-only")
    install_webhook_configuration(client, only, webhook)
    status, body = create(client, controller_pod("lab", "plain2", None))
    assert status == 201, body
    # a PodDefault's labels come first (its configuration sorts before ours), so the slice pod
    # is still sent to the webhook, and refused while it is down
    calls = cluster["stand_in"].calls
    status, body = create(client, controller_pod("lab", "down2", "fracspawner-t4-0-25"))
    assert status == 500 and "slices.webhook.fracspawner.io" in body["message"]
    assert cluster["stand_in"].calls == calls + 1
