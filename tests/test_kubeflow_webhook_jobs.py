"""Issue 28 item 8: pods created by generateName (a Job's, a ReplicaSet's, a Katib trial's) fit
their namespace's quota as soon as the webhook's watch has them.

The real `fracspawner webhook` process against the real control plane (kube-apiserver names the
pods; its garbage collector keeps them only while their Job exists). What the API server does:
a pod created by generateName has no name and no uid when the mutating webhooks are called:
k8s.io/apiserver pkg/endpoints/handlers/create.go calls mutating admission before the store's
create, and pkg/registry/generic/registry/store.go `create` only then fills metadata.uid
(rest.FillObjectMetaSystemFields) and the name from generateName; the AdmissionRequest's `uid`
identifies the webhook call, not the object (k8s.io/api admission/v1 types.go: "The UID is meant
to track the round trip (request/response) between the KAS and the WebHook, not the user
request"), and a reinvocation (reinvocationPolicy IfNeeded) is a new call with a new uid. So the
pods below are posted with `generateName` and no name, and get their names from the API
server's store.

The webhook is registered with kube-apiserver by the export's MutatingWebhookConfiguration
(kubeflow_support.register) and called by it over TLS; a stand-in sidecar injector registered
after it (its configuration's name sorts later: k8s.io/apiserver mutating_webhook_manager.go
orders by name) changes every Job pod, so kube-apiserver calls the webhook again
(reinvocationPolicy IfNeeded), as it would beside Istio's injector.
"""

from __future__ import annotations

import base64
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from fracspawner.backends import load_catalog, plan_slice
from fracspawner.kubeflow.recognise import gpu_equivalent_of_pod
from fracspawner.model.slices import parse_slice
from tests.kubeflow_support import (
    MUTATING,
    WebhookProcess,
    apply_object,
    create_pod,
    denied,
    make_tls,
    other_pod,
    profile_namespace,
    register,
)
from tests.test_kubeflow_e2e import PodDefaultStandIn

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "examples" / "catalogs" / "demo.yaml"
NAMESPACE = "jobs"
RESERVATION = "fracspawner.io/reservation"
TOPOLOGY = {"nodes": [{"name": "cpu-1", "capacity": {"cpu": "8", "memory": "32Gi"}}]}
INJECTED = "sidecar.example.com/injected"


@pytest.fixture(scope="module")
def setup(devcluster, tmp_path_factory):
    """A profile namespace with a 1-GPU quota, and the webhook (reservations live 300 s)."""
    folder = tmp_path_factory.mktemp("jobs")
    data = yaml.safe_load(DEMO.read_text())
    data["access"]["groups"]["one-gpu"] = {"pools": "all", "max_gpu": 1}
    data["kubeflow"] = {"namespaces": [{"labels": {"quota": "one"}, "groups": ["one-gpu"]}]}
    catalog = folder / "catalog.yaml"
    catalog.write_text(yaml.safe_dump(data))
    api = devcluster.client()
    labels = {"app.kubernetes.io/part-of": "kubeflow-profile", "quota": "one"}
    profile_namespace(api, NAMESPACE, labels)
    tls = make_tls(folder / "tls")
    webhook = WebhookProcess(catalog, devcluster.kubeconfig, tls, folder / "webhook.log")
    try:
        register(api, webhook, "jobs.slices.webhook.fracspawner.io", NAMESPACE)
        injector = sidecar_injector(api, tls)
        yield api, injector, load_catalog(str(catalog))
    finally:
        webhook.stop()


def sidecar_injector(api: Any, tls: dict[str, Path]) -> PodDefaultStandIn:
    """A mutating webhook after fracspawner's that labels every Job pod of NAMESPACE (a
    PodDefault-like label merge: tests/test_kubeflow_e2e.py), registered with kube-apiserver."""
    rule = {"selector": {"matchLabels": {"batch.kubernetes.io/job-name": "train"}}}
    poddefault = {
        "metadata": {"namespace": NAMESPACE},
        "spec": {**rule, "labels": {INJECTED: "true"}},
    }
    injector = PodDefaultStandIn([poddefault], tls)
    hook = {
        "name": "injector.sidecar.example.com",
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": "Fail",
        "clientConfig": {
            "url": f"https://127.0.0.1:{injector.port}/inject",
            "caBundle": base64.b64encode(tls["ca"].read_bytes()).decode(),
        },
        "rules": [
            {
                "operations": ["CREATE"],
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "resources": ["pods"],
            }
        ],
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}},
    }
    config = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "zz-sidecar-injector.example.com"},  # sorts after fracspawner's
        "webhooks": [hook],
    }
    apply_object(api, MUTATING, config)
    return injector


def owner_job(api: Any, job: str) -> str:
    """A Job for the pods to belong to, so the garbage collector keeps them (kube-controller-
    manager deletes a pod whose owner does not exist), that the Job controller leaves alone
    (`spec.managedBy` another controller: JobManagedBy, kubernetes pkg/controller/job), as the
    test makes its pods itself; its uid."""
    body = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": job},
        "spec": {
            "managedBy": "example.com/test-makes-the-pods",
            "template": {
                "spec": {
                    "containers": [{"name": "main", "image": "python:3.11"}],
                    "restartPolicy": "Never",
                }
            },
        },
    }
    status, created = api.request("POST", f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs", body)
    assert status == 201, created
    return created["metadata"]["uid"]


def job_pod(catalog: Any, job: str, job_uid: str | None = None) -> dict[str, Any]:
    """A pod of a Job whose template asks for half an H100 (the catalog's HAMi plan for 1/2),
    as the Job controller posts it: generateName `<job>-`, no name (kubernetes
    pkg/controller/job; the pod template's labels plus batch.kubernetes.io/job-name and the
    controller's ownerReference)."""
    plan = plan_slice(parse_slice("1/2"), catalog.pools["h100"], None)
    resources = {"limits": dict(plan.limits), "requests": dict(plan.requests)}
    pod = other_pod(NAMESPACE, "x", resources, command=["sleep", "3600"])
    meta = pod["metadata"]
    del meta["name"]
    meta["generateName"] = f"{job}-"
    meta["labels"] = {"batch.kubernetes.io/job-name": job, "job-name": job}
    job_uid = job_uid or str(uuid.uuid5(uuid.NAMESPACE_URL, job))
    meta["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": job_uid, "controller": True}
    ]
    pod["spec"]["nodeSelector"] = dict(plan.node_selector)
    pod["spec"]["tolerations"] = [dict(t) for t in plan.tolerations]
    assert gpu_equivalent_of_pod(pod, catalog) == pytest.approx(0.5)
    return pod


def _wait(predicate, what: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_a_job_of_two_half_gpu_pods_fits_a_one_gpu_quota(setup):
    api, injector, catalog = setup
    base = f"/api/v1/namespaces/{NAMESPACE}/pods"
    created: list[str] = []
    uid = owner_job(api, "train")
    try:
        # the injector's configuration takes a moment to reach kube-apiserver's watch
        _wait(
            lambda: (
                INJECTED
                in create_pod(api, job_pod(catalog, "train", uid), dry_run=True)[1]["metadata"][
                    "labels"
                ]
            ),
            "kube-apiserver does not call the sidecar injector",
        )
        calls = injector.calls
        status, stored = create_pod(api, job_pod(catalog, "train", uid))
        assert status == 201, stored
        created.append(stored["metadata"]["name"])
        assert stored["metadata"]["name"].startswith("train-")
        # the injector changed the pod after fracspawner's webhook: kube-apiserver called it
        # again (a new call, a new uid), which kept the first call's reservation
        assert injector.calls == calls + 1 and stored["metadata"]["labels"][INJECTED] == "true"
        assert stored["metadata"]["annotations"][RESERVATION]
        # once the webhook's watch has the first pod, its reservation is the pod: the second
        # half fits (before: the reservation counted beside the pod for the whole window, and
        # a reinvocation's second reservation besides)
        _wait(
            lambda: create_pod(api, job_pod(catalog, "train", uid), dry_run=True)[0] == 201,
            "the second pod of the Job stayed refused: its sibling counted twice",
            30,
        )
        status, stored = create_pod(api, job_pod(catalog, "train", uid))
        assert status == 201, stored
        created.append(stored["metadata"]["name"])
        # the quota is full now: a third is refused, with the namespace's real numbers, in the
        # words kube-apiserver passes on to the Job controller (its FailedCreate event)
        status, body = create_pod(api, job_pod(catalog, "train", uid), dry_run=True)
        message = denied(body, "pods.slices.webhook.fracspawner.io")
        assert message and "already hold 1 of its 1 GPU quota" in message, body
    finally:
        for name in created:
            api.request("DELETE", f"{base}/{name}?gracePeriodSeconds=0")
