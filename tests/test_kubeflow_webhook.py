"""The real `fracspawner webhook` process, registered with the real control plane's kube-apiserver
by the MutatingWebhookConfiguration the export writes (kubeflow_support.register) and called by
it over TLS, reading namespaces and pods from it: the plan it applies, the access rules and quota
per profile namespace (also under concurrency), what it refuses and how (the refusal as
kube-apiserver passes it to the user). Pods are created through the API (dry runs where nothing
needs to stay) and the tests read what kube-apiserver stored or would store.

What only a caller other than kube-apiserver can send (malformed bodies, a label that is no
string, the patch's encoding) is still posted to the webhook directly: that is its point.
tests/test_kubeflow_e2e.py runs the exported configuration itself, with Kubeflow's PodDefault
webhook stand-in."""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from fracspawner.backends import load_catalog
from fracspawner.cli import main as fracspawner_main
from fracspawner.model.slices import parse_slice
from tests.kubeflow_support import (
    WebhookProcess,
    admission_review,
    as_sent,
    assert_plan_applied,
    changes,
    create_pod,
    denied,
    make_tls,
    notebook_pod,
    other_pod,
    podconfig_spec,
    profile_namespace,
    register,
    with_poddefault,
    without_admission_additions,
    workspace_pod,
)

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "examples" / "catalogs" / "demo.yaml"
EXAMPLES = sorted((REPO / "examples" / "catalogs").glob("*.yaml"))
PROFILE = {"app.kubernetes.io/part-of": "kubeflow-profile"}
TOPOLOGY = {"nodes": [{"name": "cpu-1", "capacity": {"cpu": "8", "memory": "32Gi"}}]}
#: the profile namespaces whose pods go to the module's webhook (and their labels)
NAMESPACES = {
    "alice": {},
    "lab": {"team": "research"},
    "full": {},
    "race": {},
    "dry": {},
    "v2quota": {},
    "pipes": {"team": "research"},  # ml-research: all pools, 2 GPU
    "pipes-small": {},  # the default: 0.25 GPU
    "counted": {},  # test_metrics_count_admissions_by_result's
}


def kubeflow_catalog() -> dict[str, Any]:
    """The demo catalog (default: h100 up to 0.25 GPU; ml-research: all, up to 2) with profile
    namespaces labelled team=research in ml-research."""
    data = yaml.safe_load(DEMO.read_text())
    data["kubeflow"] = {"namespaces": [{"labels": {"team": "research"}, "groups": ["ml-research"]}]}
    return data


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    return make_tls(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def cluster(devcluster):
    client = devcluster.client()
    for name, labels in [*NAMESPACES.items(), ("agree", {})]:
        profile_namespace(client, name, {**PROFILE, **labels})
    return client


@pytest.fixture(scope="module")
def webhook(cluster, devcluster, tls, tmp_path_factory):
    folder = tmp_path_factory.mktemp("webhook")
    catalog = folder / "catalog.yaml"
    catalog.write_text(yaml.safe_dump(kubeflow_catalog()))
    process = WebhookProcess(catalog, devcluster.kubeconfig, tls, folder / "webhook.log")
    try:
        register(cluster, process, "module.slices.webhook.fracspawner.io", tuple(NAMESPACES))
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def api(cluster, webhook):
    """kube-apiserver, calling the module's webhook for the pods of NAMESPACES."""
    return cluster


def admit(api: Any, pod: dict[str, Any], *, dry_run: bool = True) -> tuple[str | None, Any]:
    """The webhook's refusal as kube-apiserver passes it to the user (None where admitted),
    and the pod as kube-apiserver stored it (or would: a dry run by default)."""
    status, body = create_pod(api, pod, dry_run=dry_run)
    refusal = denied(body)
    assert (status == 201) == (refusal is None), (status, body)
    return refusal, body


def _again(pod: dict[str, Any], stored: dict[str, Any]) -> dict[str, Any]:
    """`stored` as a create again: what the webhooks made of `pod`, less what kube-apiserver
    adds to every pod and its identity."""
    out = without_admission_additions(pod, stored)
    meta = out["metadata"]
    out["metadata"] = {k: meta[k] for k in ("name", "namespace", "labels", "annotations")}
    return out


def plan_pod(catalog: Path, gpu: str, pool: str | None, capsys) -> dict[str, Any]:
    """What `fracspawner plan` prints for a slice (the CLI's own code path, in process)."""
    capsys.readouterr()
    args = ["plan", "--catalog", str(catalog), "--gpu", gpu, "-o", "json"]
    assert fracspawner_main(args + (["--pool", pool] if pool else [])) == 0
    return json.loads(capsys.readouterr().out)


def kubeflow_pod(namespace: str, notebook: str, pool: str, gpu: str) -> dict[str, Any]:
    selector = f"fracspawner-{pool}-{gpu.lower().replace('.', '-')}"
    return with_poddefault(notebook_pod(namespace, notebook), pool, gpu, selector)


# --------------------------------------------------------------------------- the plan
def test_a_notebook_pod_gets_exactly_the_plan_and_passes_strict_validation(webhook, api, capsys):
    pod = kubeflow_pod("alice", "analysis", "h100", "0.25")
    message, stored = admit(api, pod)  # validated by kube-apiserver, strict
    assert message is None
    # the GPU fields: what the webhook changed == what a GPU adds to `fracspawner plan`'s pod
    catalog = webhook.catalog
    expected = changes(
        plan_pod(catalog, "none", None, capsys), plan_pod(catalog, "1/4", "h100", capsys)
    )
    assert_plan_applied(pod, stored, "analysis", expected)
    assert expected["box.limits.nvidia.com/gpucores"] == "25"
    assert expected["metadata.annotations.fracspawner.io/gpu-equivalent"] == "0.25"
    # everything Kubeflow put there is still there
    assert stored["spec"]["containers"][0]["image"] == pod["spec"]["containers"][0]["image"]
    assert {"name": "NB_PREFIX", "value": "/notebook/alice/analysis"} in stored["spec"][
        "containers"
    ][0]["env"]
    assert stored["metadata"]["labels"]["fracspawner-h100-0-25"] == "true"


def test_a_second_call_on_the_mutated_pod_changes_nothing(api):
    """What kube-apiserver sends when it calls the webhook again after a later webhook
    changed the pod (reinvocationPolicy IfNeeded): the pod as the webhook left it."""
    pod = kubeflow_pod("lab", "again", "a100-mig", "mig-2g.20gb")
    _, first = admit(api, pod)
    assert first["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/mig-2g.20gb"] == "1"
    mutated = _again(pod, first)
    message, second = admit(api, mutated)
    assert message is None
    assert _again(mutated, second) == mutated


def test_a_pod_without_slice_labels_passes_untouched(api):
    pod = notebook_pod("alice", "cpu-only")
    _, stored = admit(api, pod)
    assert stored["metadata"]["labels"] == pod["metadata"]["labels"]
    assert "annotations" not in stored["metadata"]
    (box,) = stored["spec"]["containers"]
    assert as_sent(box, pod["spec"]["containers"][0]) == pod["spec"]["containers"][0]
    assert "nodeSelector" not in stored["spec"]


def test_reserved_env_and_other_gpus_are_removed_from_every_container(api):
    pod = kubeflow_pod("lab", "sneaky", "h100", "0.125")
    pod["spec"]["containers"][0]["env"] += [
        {"name": "CUDA_DISABLE_CONTROL", "value": "true"},
        {"name": "LD_PRELOAD", "value": "/tmp/x.so"},
        {"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value": "0=80G"},
        {"name": "KEEP_ME", "value": "1"},
    ]
    pod["spec"]["containers"].append(
        {
            "name": "helper",
            "image": "busybox",
            "env": [
                {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
                {"name": "A", "value": "b"},
            ],
        }
    )
    # and GPUs besides the slice: a MIG profile from the form's GPU field, a whole GPU for a
    # sidecar
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/mig-7g.80gb"] = "1"
    pod["spec"]["containers"][1]["resources"] = {"limits": {"nvidia.com/gpu": "1", "cpu": "1"}}
    message, stored = admit(api, pod)
    assert message is None
    main, helper = stored["spec"]["containers"]
    assert "nvidia.com/mig-7g.80gb" not in main["resources"]["limits"]
    assert main["resources"]["limits"]["nvidia.com/gpucores"] == "12"
    # the API server defaults the helper's requests from its limits
    assert helper["resources"] == {"limits": {"cpu": "1"}, "requests": {"cpu": "1"}}
    names = [e["name"] for e in main["env"]]
    assert "KEEP_ME" in names and "FRACSPAWNER_GPU_MEMORY_MIB" in names
    assert not {"CUDA_DISABLE_CONTROL", "LD_PRELOAD", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"} & set(
        names
    )
    assert helper["env"] == [{"name": "A", "value": "b"}]


def test_a_mig_profile_from_the_forms_gpu_field_gets_the_slice(api):
    pod = notebook_pod("lab", "mig-form")
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/mig-1g.10gb"] = "1"
    _, stored = admit(api, pod)
    assert stored["metadata"]["labels"]["fracspawner.io/pool"] == "a100-mig"
    assert stored["metadata"]["labels"]["fracspawner.io/gpu"] == "mig-1g.10gb"
    assert stored["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    # the form offers 1, 2, 4 or 8 of a vendor: more than one MIG slice is refused
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/mig-1g.10gb"] = "2"
    message, _ = admit(api, pod)
    assert message and "one MIG slice per notebook" in message, message
    # and a namespace without the MIG pool may not take it through the form either
    pod = notebook_pod("alice", "mig-form")
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/mig-1g.10gb"] = "1"
    message, _ = admit(api, pod)
    assert message and "you may not use pool 'a100-mig'" in message, message


# --------------------------------------------------------------------------- refusals
def test_a_pool_the_namespace_may_not_use_is_refused_with_a_message(api):
    status, body = create_pod(api, kubeflow_pod("alice", "big", "a100-mig", "mig-3g.40gb"))
    assert status == 403, body
    assert body["message"] == (
        'admission webhook "slices.webhook.fracspawner.io" denied the request: '
        "fracspawner refused the GPU slice mig-3g.40gb on pool a100-mig in namespace alice: "
        "pool: you may not use pool 'a100-mig'. Pools you may use: h100."
    )


def test_a_pod_over_the_namespace_quota_is_refused_with_a_message(api):
    # a notebook already running in the namespace holds the whole 0.25 GPU quota
    running = kubeflow_pod("full", "first", "h100", "0.25")
    running["spec"]["nodeName"] = "not-a-node"  # stays Pending, runs nothing
    assert admit(api, running, dry_run=False)[0] is None
    message, _ = admit(api, kubeflow_pod("full", "second", "h100", "0.125"))
    assert message == (
        "fracspawner refused the GPU slice 0.125 on pool h100 in namespace full: it counts as "
        "0.125 GPU and the namespace's notebooks already hold 0.25 of its 0.25 GPU quota "
        "(0 left). Stop a notebook or choose a smaller slice."
    )
    # the same pod created again (a retry of its own creation) is not counted twice: the
    # webhook admits it, and kube-apiserver answers that it exists
    status, body = create_pod(api, running, dry_run=True)
    assert (status, body["reason"]) == (409, "AlreadyExists"), body


def test_concurrent_creates_in_one_namespace_never_overrun_the_quota(api):
    pods = [kubeflow_pod("race", f"nb{i}", "h100", "0.125") for i in range(8)]
    for pod in pods:
        pod["spec"]["nodeName"] = "not-a-node"  # stays Pending, runs nothing
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda p: create_pod(api, p), pods))
    created = [body for status, body in answers if status == 201]
    assert len(created) == 2, answers  # 2 x 0.125 = the 0.25 quota
    refused = [denied(body) for status, body in answers if status != 201]
    assert all(m and "quota" in m for m in refused), refused
    assert len(api.pods("race")) == 2


def test_a_dry_run_reserves_nothing(api):
    message, dry = admit(api, kubeflow_pod("dry", "a", "h100", "0.25"))
    assert message is None  # the answer is the real one
    assert dry["metadata"]["annotations"]["fracspawner.io/gpu-equivalent"] == "0.25"
    assert admit(api, kubeflow_pod("dry", "b", "h100", "0.25"), dry_run=False)[0] is None


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        ({"fracspawner.io/pool": "h100", "fracspawner.io/gpu": "x" * 5000}, "is not a valid label"),
        ({"fracspawner.io/pool": "h100", "fracspawner.io/gpu": "1e9"}, "is not a GPU slice"),
        ({"fracspawner.io/pool": "h100", "fracspawner.io/gpu": "0.3"}, "not a multiple of 1/8"),
        ({"fracspawner.io/pool": "nope", "fracspawner.io/gpu": "0.25"}, "unknown pool 'nope'"),
        ({"fracspawner.io/pool": "h100"}, "without fracspawner.io/gpu"),
    ],
)
def test_garbage_slice_labels_are_refused(api, labels, message):
    pod = notebook_pod("alice", "garbage")
    pod["metadata"]["labels"].update(labels)
    refusal, _ = admit(api, pod)
    assert refusal and message in refusal, refusal
    assert len(refusal) < 400  # a huge value is not echoed back


def test_a_label_that_is_no_string_is_refused(webhook):
    """kube-apiserver never sends one (it refuses to decode such a pod); a caller that is not
    kube-apiserver may."""
    pod = notebook_pod("alice", "garbage")
    pod["metadata"]["labels"].update({"fracspawner.io/pool": "h100", "fracspawner.io/gpu": 0.25})
    answer = webhook.review(admission_review(pod))
    assert answer["allowed"] is False
    assert "is not a valid label" in answer["status"]["message"]


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        b'{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {}}',
        b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}',
        json.dumps(
            {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "request": {
                    "uid": "1",
                    "operation": "CREATE",
                    "namespace": "alice",
                    "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "object": {"metadata": {}, "spec": {"containers": "x"}},
                },
            }
        ).encode(),
        b"\xff\xfe" * 100,
    ],
)
def test_a_malformed_review_is_a_400_and_the_webhook_lives_on(webhook, body):
    status, answer = webhook.request("POST", "/mutate", body)
    assert status == 400
    assert "not an AdmissionReview v1 for a pod" in json.loads(answer)["error"]
    assert webhook.request("GET", "/healthz") == (200, b"ok\n")


def test_the_slice_labels_and_quota_annotations_cannot_be_changed_later(api):
    pod = kubeflow_pod("lab", "keep", "h100", "0.5")
    pod["spec"]["nodeName"] = "not-a-node"  # stays Pending, runs nothing
    assert admit(api, pod, dry_run=False)[0] is None
    path = "/api/v1/namespaces/lab/pods/keep-0"
    cheaper = {"metadata": {"annotations": {"fracspawner.io/gpu-equivalent": "0"}}}
    status, body = api.request("PATCH", path, cheaper, "application/merge-patch+json")
    message = denied(body, "guard.slices.webhook.fracspawner.io")
    assert status == 403 and message and "cannot be changed or removed" in message, body
    relabelled = {"metadata": {"labels": {"owner": "me"}}}  # other changes are fine
    status, body = api.request("PATCH", path, relabelled, "application/merge-patch+json")
    assert status == 200, body
    assert api.get(path)["metadata"]["annotations"]["fracspawner.io/gpu-equivalent"] == "0.5"


def _samples(webhook: WebhookProcess) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The webhook's /metrics now: (sample name, its labels) -> value."""
    status, text = webhook.request("GET", "/metrics")
    assert status == 200, text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
    }


def test_metrics_count_admissions_by_result(webhook, api):
    """Each counter moves by what this test sends (its own namespace: alone or in any order)."""
    before = _samples(webhook)
    holder = kubeflow_pod("counted", "holder", "h100", "0.25")  # the namespace's whole quota
    holder["spec"]["nodeName"] = "not-a-node"  # stays Pending, runs nothing
    assert admit(api, holder, dry_run=False)[0] is None  # mutated
    assert admit(api, notebook_pod("counted", "plain"))[0] is None  # skipped: no slice
    refusal, _ = admit(api, kubeflow_pod("counted", "over", "h100", "0.125"))
    assert refusal and "quota" in refusal, refusal  # refused, for the quota
    assert webhook.request("POST", "/mutate", b"not json")[0] == 400  # a bad request
    after = _samples(webhook)

    def moved(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    admissions = "fracspawner_webhook_admissions_total"
    assert moved(admissions, operation="CREATE", result="mutated") == 1
    assert moved(admissions, operation="CREATE", result="skipped") == 1
    assert moved(admissions, operation="CREATE", result="refused") == 1
    assert moved("fracspawner_webhook_refusals_total", reason="quota") == 1
    assert moved("fracspawner_webhook_bad_requests_total") == 1
    # every review answered is timed; the bad request is not a review
    assert moved("fracspawner_webhook_admission_duration_seconds_count") == 3


# --------------------------------------------------------------------------- failure modes
def test_without_the_api_server_slice_pods_are_refused_and_others_pass(tls, tmp_path):
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(yaml.safe_dump(kubeflow_catalog()))
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "x", "cluster": {"server": "http://127.0.0.1:9"}}],
                "users": [{"name": "x", "user": {}}],
                "contexts": [{"name": "x", "context": {"cluster": "x", "user": "x"}}],
                "current-context": "x",
            }
        )
    )
    process = WebhookProcess(catalog, kubeconfig, tls, tmp_path / "webhook.log")
    try:
        answer = process.review(admission_review(kubeflow_pod("alice", "nb", "h100", "0.25")))
        assert answer["allowed"] is False
        assert (
            "fracspawner cannot check GPU access and quota right now" in answer["status"]["message"]
        )
        assert process.review(admission_review(notebook_pod("alice", "plain")))["allowed"]
    finally:
        process.stop()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("catalog", "kubeflow.namespaces[0].groups[0]: unknown group 'nobody'"),
        ("cert", "--tls-cert"),
    ],
)
def test_bad_start_up_input_exits_2_with_one_line(tls, tmp_path, change, message):
    data = kubeflow_catalog()
    if change == "catalog":
        data["kubeflow"]["namespaces"][0]["groups"] = ["nobody"]
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(yaml.safe_dump(data))
    cert = tmp_path / "missing.crt" if change == "cert" else tls["cert"]
    result = subprocess.run(
        [sys.executable, "-m", "fracspawner", "webhook", "--catalog", str(catalog)]
        + ["--port", "0", "--tls-cert", str(cert), "--tls-key", str(tls["key"])],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


# --------------------------------------------------------------------------- plan == webhook
def merged_examples() -> dict[str, Any]:
    """Every example catalog in one (pools and images prefixed with the file's name, no access
    rules: everyone may take everything, as `fracspawner plan` plans by default)."""
    merged: dict[str, Any] = {"fraction_step": 16, "pools": {}, "images": {}}
    for example in EXAMPLES:
        data = yaml.safe_load(example.read_text())
        for name, image in data["images"].items():
            if merged["images"]:
                image.pop("default", None)
            merged["images"][f"{example.stem}-{name}"] = image
        for name, pool in data["pools"].items():
            if "default_image" in pool:
                pool["default_image"] = f"{example.stem}-{pool['default_image']}"
            merged["pools"][f"{example.stem}-{name}"] = pool
    return merged


def test_plan_and_webhook_agree_for_every_offer_of_every_example_catalog(
    cluster, devcluster, tls, tmp_path, capsys
):
    """What kube-apiserver would store (a dry run: validated by it) for every offer."""
    data = merged_examples()
    catalog = tmp_path / "examples.yaml"
    catalog.write_text(yaml.safe_dump(data))
    process = WebhookProcess(catalog, devcluster.kubeconfig, tls, tmp_path / "webhook.log")
    try:
        register(cluster, process, "agree.slices.webhook.fracspawner.io", "agree")
        bare = plan_pod(catalog, "none", None, capsys)
        checked = 0
        for pool, raw in data["pools"].items():
            for offer in raw["offers"]:
                label = parse_slice(offer, step=16).label
                pod = kubeflow_pod("agree", f"nb{checked}", pool, label)
                message, stored = admit(cluster, pod)
                assert message is None, (pool, offer, message)
                expected = changes(bare, plan_pod(catalog, str(offer), pool, capsys))
                assert_plan_applied(pod, stored, f"nb{checked}", expected)
                checked += 1
    finally:
        process.stop()
    assert checked == sum(len(p["offers"]) for p in data["pools"].values()) >= 40


def test_the_patch_is_base64_json_patch(webhook):
    answer = webhook.review(admission_review(kubeflow_pod("lab", "b64", "t4", "0.25")))
    operations = json.loads(base64.b64decode(answer["patch"]))
    assert {op["op"] for op in operations} <= {"add", "replace", "remove"}
    assert all(op["path"].startswith(("/metadata/", "/spec/")) for op in operations)


def _handshake(server_context: ssl.SSLContext, ca: Path) -> str:
    """The common name of the certificate a TLS server with `server_context` presents."""
    client_context = ssl.create_default_context(cafile=str(ca))
    client_context.check_hostname = False
    a, b = socket.socketpair()
    with ThreadPoolExecutor(1) as pool:
        served = pool.submit(lambda: server_context.wrap_socket(a, server_side=True))
        client = client_context.wrap_socket(b)
        served.result(10).close()
    subject = dict(x[0] for x in client.getpeercert()["subject"])
    client.close()
    return subject["commonName"]


def test_a_renewed_certificate_is_served_without_a_restart(tmp_path):
    from fracspawner.kubeflow.webhook import CertificateReloader, tls_context

    old = make_tls(tmp_path / "old", ("old.example",))
    new = make_tls(tmp_path / "new", ("new.example",))
    live = {"cert": tmp_path / "tls.crt", "key": tmp_path / "tls.key"}
    shutil.copy(old["cert"], live["cert"])
    shutil.copy(old["key"], live["key"])
    context = tls_context(str(live["cert"]), str(live["key"]))
    reloader = CertificateReloader(context, str(live["cert"]), str(live["key"]))
    assert _handshake(context, old["ca"]) == "old.example"
    # cert-manager writes the renewed pair (a new mtime)
    shutil.copy(new["cert"], live["cert"])
    shutil.copy(new["key"], live["key"])
    os.utime(live["cert"], (1e9, 1e9))
    reloader.check()
    assert _handshake(context, new["ca"]) == "new.example"


# --------------------------------------------------------------------------- issue 19 a
def test_a_workspace_pod_is_recognised_by_its_podconfig_and_refused_at_the_quota(api):
    """Issue 19 item 1: the v2 controller copies a podConfig's resources and nodeSelector,
    never its labels (workspace_pod): the webhook knows the slice from them."""
    for name in ("big", "small"):  # the ServiceAccount the Workspace controller makes for each
        account = {"metadata": {"name": f"ws-{name}"}}
        status, body = api.request("POST", "/api/v1/namespaces/v2quota/serviceaccounts", account)
        assert status == 201, body
    catalog = load_catalog(DEMO)
    pod = workspace_pod("v2quota", "big", podconfig_spec(catalog, "h100", "1"))
    status, body = create_pod(api, pod, dry_run=True)
    assert status == 403, body
    assert body["message"].startswith(
        'admission webhook "workspaces.slices.webhook.fracspawner.io" denied the request: '
        "fracspawner refused the GPU slice 1 on pool h100 in namespace v2quota: it counts as "
        "1 GPU and the namespace's notebooks already hold 0 of its 0.25 GPU quota"
    )
    small = workspace_pod("v2quota", "small", podconfig_spec(catalog, "h100", "1/4"))
    _, stored = admit(api, small)
    assert stored["metadata"]["labels"]["fracspawner.io/gpu"] == "0.25"
    assert stored["metadata"]["annotations"]["fracspawner.io/gpu-equivalent"] == "0.25"


def test_pods_that_are_no_notebook_are_counted_never_changed(api):
    """Issue 19 items 2 and 11: a pipeline step with two MIG slices passes as it was sent (no
    change but the guard's label fracspawner.io/counted, no "one MIG slice per notebook");
    one whose GPU is over the namespace's quota, or whose container without GPU sets
    NVIDIA_VISIBLE_DEVICES, is refused."""
    step = other_pod("pipes", "train-x7k2p-1", {"limits": {"nvidia.com/mig-1g.10gb": "2"}})
    message, stored = admit(api, step)
    assert message is None
    # counted: marked for the guard (tests/test_kubeflow_guard_counted.py), nothing else
    counted = {**step["metadata"]["labels"], "fracspawner.io/counted": "true"}
    assert stored["metadata"]["labels"] == counted
    assert stored["metadata"]["annotations"] == step["metadata"]["annotations"]
    sent = step["spec"]["containers"][0]
    assert as_sent(stored["spec"]["containers"][0], sent) == sent
    whole = other_pod("pipes-small", "train-x7k2p-2", {"limits": {"nvidia.com/gpu": "1"}})
    message, _ = admit(api, whole)
    assert message and message.startswith(
        "fracspawner refused this pod's GPU in namespace pipes-small: its GPU resources count "
        "as 1 GPU"
    ), message
    # a step already running counts against the quota of the namespace's notebooks too
    running = other_pod("pipes-small", "train-x7k2p-5", {"limits": {"nvidia.com/mig-1g.10gb": "1"}})
    running["spec"]["nodeName"] = "not-a-node"  # stays Pending, runs nothing
    assert admit(api, running, dry_run=False)[0] is None
    notebook = kubeflow_pod("pipes-small", "late", "h100", "0.125")
    deadline = time.monotonic() + 30
    while (message := admit(api, notebook)[0]) is None:
        assert time.monotonic() < deadline, "the pod watch never counted the step"
        time.sleep(0.2)  # the watch has not seen the step yet
    assert "already hold 0.142857 of its 0.25 GPU quota" in message, message
    peek = other_pod(
        "pipes", "peek-x7k2p-3", {}, env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    )
    message, _ = admit(api, peek)
    assert message and "container main: NVIDIA_VISIBLE_DEVICES=all" in message, message
    # a CPU-only notebook may not either; CUDA_VISIBLE_DEVICES only filters, it passes
    notebook = notebook_pod("pipes", "cpu-peek")
    notebook["spec"]["containers"][0]["env"].append(
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}
    )
    assert admit(api, notebook)[0]
    fine = other_pod(
        "pipes", "ok-x7k2p-4", {}, env=[{"name": "CUDA_VISIBLE_DEVICES", "value": "0"}]
    )
    message, stored = admit(api, fine)
    assert message is None
    sent = fine["spec"]["containers"][0]
    assert as_sent(stored["spec"]["containers"][0], sent) == sent
