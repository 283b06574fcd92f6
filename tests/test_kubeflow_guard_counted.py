"""A pod that is no notebook (a pipeline step, a Katib trial) whose GPU the webhook counted
against its namespace's quota, or checked against its pools, at CREATE keeps what it was counted
and checked by: the UPDATE guard is sent it too.

Before: the guard webhook's objectSelector was `fracspawner.io/pool Exists`, so only notebook
pods reached it. A counted pipeline pod carries no such label; while it was still Pending its
owner could raise its Run:ai/KAI `gpu-fraction` annotation (annotations are mutable; the
scheduler reads it when it places the pod) or add a toleration (Kubernetes lets a pod's
tolerations grow) reaching another pool's tainted nodes, after the webhook counted and checked
it at its smaller size. Now the webhook labels such a pod `fracspawner.io/counted: "true"` at
CREATE, a second guard webhook selects that label, and guard_update refuses changing the ask
fields, the tolerations and the label itself on it.

Unit level (guard_update), the webhook's review handler run in process (tests/
kubeflow_inprocess.py), the chart and the export, and the real `fracspawner webhook` process
registered with the real kube-apiserver (kubeflow_support.register), whose objectSelector
semantics on UPDATE (old or new object) decide what reaches the guard.
"""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from fracspawner.backends import load_catalog
from fracspawner.kubeflow.admission import Refusal, guard_update, parse_review
from fracspawner.kubeflow.export import WebhookTarget, webhook_configuration
from fracspawner.kubeflow.webhook import Webhook
from tests.chart_support import objects, one, render
from tests.kubeflow_inprocess import FakeCluster, allowed, message
from tests.kubeflow_support import (
    WebhookProcess,
    admission_review,
    create_pod,
    denied,
    make_tls,
    notebook_pod,
    other_pod,
    patched,
    profile_namespace,
    register,
)

REPO = Path(__file__).resolve().parent.parent
COUNTED = "fracspawner.io/counted"
COUNTED_GUARD = "counted.guard.slices.webhook.fracspawner.io"
NAMESPACE = "counted-steps"
TOPOLOGY = {"nodes": [{"name": "cpu-1", "capacity": {"cpu": "8", "memory": "32Gi"}}]}
#: what a counted pod's guard refuses with (admission._guard_refusal)
REFUSED = "of a GPU pod cannot be changed or removed"


def runai_catalog() -> dict[str, Any]:
    """Run:ai and KAI pools; every profile namespace may hold 0.5 GPU."""
    data = yaml.safe_load((REPO / "examples" / "catalogs" / "runai.yaml").read_text())
    data["access"] = {"default": {"pools": "all", "max_gpu": 0.5}}
    data["kubeflow"] = {"pools": "all"}
    return data


@pytest.fixture(scope="module")
def catalog_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("catalog") / "catalog.yaml"
    path.write_text(yaml.safe_dump(runai_catalog()))
    return path


def fraction_step(namespace: str = NAMESPACE, name: str = "train-x7k2p-1") -> dict[str, Any]:
    """A pipeline step asking Run:ai for a quarter GPU by its annotation alone."""
    pod = other_pod(namespace, name, {})
    pod["metadata"]["annotations"]["gpu-fraction"] = "0.25"
    pod["spec"]["schedulerName"] = "runai-scheduler"
    return pod


def marked(pod: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(pod)
    out["metadata"]["labels"][COUNTED] = "true"
    return out


# --------------------------------------------------------------------------- guard_update
def raise_fraction(pod: dict[str, Any]) -> None:
    pod["metadata"]["annotations"]["gpu-fraction"] = "1"


def drop_fraction_for_memory(pod: dict[str, Any]) -> None:
    del pod["metadata"]["annotations"]["gpu-fraction"]
    pod["metadata"]["annotations"]["gpu-memory"] = "80Gi"


def more_devices(pod: dict[str, Any]) -> None:
    pod["metadata"]["annotations"]["gpu-fraction-num-devices"] = "8"


def clearml_fraction(pod: dict[str, Any]) -> None:
    pod["metadata"]["labels"]["clearml-injector/fraction"] = "1.0"


def tolerate_everything(pod: dict[str, Any]) -> None:
    pod["spec"].setdefault("tolerations", []).append({"operator": "Exists"})


def unmark(pod: dict[str, Any]) -> None:
    del pod["metadata"]["labels"][COUNTED]


def remark(pod: dict[str, Any]) -> None:
    pod["metadata"]["labels"][COUNTED] = "false"


CHANGES = [
    (raise_fraction, "annotation gpu-fraction"),
    (drop_fraction_for_memory, "annotation gpu-fraction"),
    (more_devices, "annotation gpu-fraction-num-devices"),
    (clearml_fraction, "label clearml-injector/fraction"),
    (tolerate_everything, "tolerations"),
    (unmark, f"label {COUNTED}"),
    (remark, f"label {COUNTED}"),
]


@pytest.mark.parametrize(("change", "what"), CHANGES, ids=[c.__name__ for c, _ in CHANGES])
def test_a_counted_pods_ask_tolerations_and_mark_cannot_change(change, what):
    old = marked(fraction_step())
    new = copy.deepcopy(old)
    change(new)
    with pytest.raises(Refusal) as refused:
        guard_update(old, new, load_catalog(str(REPO / "examples" / "catalogs" / "runai.yaml")))
    assert refused.value.reason == "guard"
    assert refused.value.message.startswith(f"the {what} {REFUSED}"), refused.value.message


def test_other_updates_of_a_counted_pod_pass():
    """What Argo's controller and a pod's owner change on a step (labels, annotations of their
    own); and a pod never marked is none of the counted guard's business (it is not sent)."""
    old = marked(fraction_step())
    new = copy.deepcopy(old)
    new["metadata"]["labels"]["workflows.argoproj.io/completed"] = "true"
    new["metadata"]["annotations"]["workflows.argoproj.io/outputs"] = "{}"
    guard_update(old, new)
    plain = fraction_step()
    raised = copy.deepcopy(plain)
    raise_fraction(raised)
    guard_update(plain, raised)


# --------------------------------------------------------------------------- the review handler
def webhook(catalog_file: Path, **options: Any) -> Webhook:
    hook = Webhook(load_catalog(str(catalog_file)), FakeCluster({NAMESPACE: {}}), **options)
    hook.pods.load([])
    return hook


def answer(hook: Webhook, body: dict[str, Any]) -> dict[str, Any]:
    review = parse_review(json.dumps(body).encode())
    return asyncio.run(hook.review(review, ""))


def test_the_webhook_marks_the_pods_it_counts_and_only_those(catalog_file):
    hook = webhook(catalog_file)
    step = fraction_step()
    got = answer(hook, admission_review(step))
    assert allowed(got)
    created = patched(step, got["response"])
    assert created["metadata"]["labels"] == {**step["metadata"]["labels"], COUNTED: "true"}
    # nothing else of the step changes
    assert created["metadata"]["annotations"] == step["metadata"]["annotations"]
    assert created["spec"] == step["spec"]
    # a step holding no GPU, and a notebook, are not marked
    for pod in (other_pod(NAMESPACE, "cpu-x7k2p-2", {}), notebook_pod(NAMESPACE, "nb")):
        got = answer(hook, admission_review(pod))
        assert allowed(got)
        assert COUNTED not in patched(pod, got["response"])["metadata"]["labels"]
    # a tenant's own mark on a GPU step is the webhook's value
    forged = fraction_step(name="train-x7k2p-3")
    forged["metadata"]["labels"][COUNTED] = "no"
    got = answer(hook, admission_review(forged))
    assert patched(forged, got["response"])["metadata"]["labels"][COUNTED] == "true"


def test_the_webhook_refuses_raising_a_counted_steps_fraction(catalog_file):
    hook = webhook(catalog_file)
    step = fraction_step()
    created = patched(step, answer(hook, admission_review(step))["response"])
    raised = copy.deepcopy(created)
    raise_fraction(raised)
    got = answer(hook, admission_review(raised, operation="UPDATE", old=created))
    assert not allowed(got)
    assert message(got).startswith(f"the annotation gpu-fraction {REFUSED}"), message(got)


# --------------------------------------------------------------------------- configuration
def counted_guard(hooks: list[dict[str, Any]]) -> dict[str, Any] | None:
    found = [h for h in hooks if h["name"] == COUNTED_GUARD]
    return found[0] if found else None


def test_the_export_sends_counted_pods_updates_to_the_guard():
    config = webhook_configuration(WebhookTarget())
    hooks = {h["name"]: h for h in config["webhooks"]}
    counted = counted_guard(config["webhooks"])
    assert counted is not None, list(hooks)
    guard = hooks["guard.slices.webhook.fracspawner.io"]
    assert counted["objectSelector"] == {
        "matchExpressions": [{"key": COUNTED, "operator": "Exists"}]
    }
    # otherwise the guard itself: UPDATE of pods, never reinvoked, failing closed
    assert {k: v for k, v in counted.items() if k not in ("name", "objectSelector")} == {
        k: v for k, v in guard.items() if k not in ("name", "objectSelector")
    }
    # --slice-pods-only counts no other pod, so marks none
    narrowed = webhook_configuration(WebhookTarget(slice_pods_only=True))
    assert counted_guard(narrowed["webhooks"]) is None


def test_the_chart_sends_counted_pods_updates_to_the_guard():
    objs = objects(render({"webhook": {"enabled": True}}))
    hooks = one(objs, "MutatingWebhookConfiguration", "webhook")["webhooks"]
    counted = counted_guard(hooks)
    assert counted is not None, [h["name"] for h in hooks]
    assert counted["rules"][0]["operations"] == ["UPDATE"]
    assert counted["objectSelector"] == {
        "matchExpressions": [{"key": COUNTED, "operator": "Exists"}]
    }
    assert counted["failurePolicy"] == "Fail"
    narrowed = objects(
        render(
            {
                "webhook": {
                    "enabled": True,
                    "objectSelector": {
                        "matchExpressions": [{"key": "fracspawner.io/pool", "operator": "Exists"}]
                    },
                }
            }
        )
    )
    narrowed_hooks = one(narrowed, "MutatingWebhookConfiguration", "webhook")["webhooks"]
    assert counted_guard(narrowed_hooks) is None


# --------------------------------------------------------------------------- kube-apiserver
@pytest.fixture(scope="module")
def api(devcluster, catalog_file, tmp_path_factory):
    """A profile namespace (0.5 GPU) whose pods go to the webhook, registered as the export
    writes its configuration."""
    folder = tmp_path_factory.mktemp("counted")
    client = devcluster.client()
    profile_namespace(client, NAMESPACE, {"app.kubernetes.io/part-of": "kubeflow-profile"})
    tls = make_tls(folder / "tls")
    process = WebhookProcess(catalog_file, devcluster.kubeconfig, tls, folder / "webhook.log")
    try:
        register(client, process, "counted.slices.webhook.fracspawner.io", NAMESPACE)
        yield client
    finally:
        process.stop()


def test_a_pending_steps_fraction_cannot_be_raised_past_the_quota(api):
    """The step is counted at 0.25 of the namespace's 0.5 GPU; raising its annotation to a
    whole GPU while it waits to be scheduled is refused with the guard's words, as adding a
    toleration and removing the mark are; its own labels still change."""
    step = fraction_step()
    step["spec"]["schedulerName"] = "not-served"  # stays Pending: admission is under test
    status, created = create_pod(api, step)
    assert status == 201, created
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/{step['metadata']['name']}"
    merge = "application/merge-patch+json"
    # kube-apiserver's DefaultTolerationSeconds gave it tolerations; one more is an update
    # Kubernetes allows (pod validation: tolerations may only be added)
    everything = {"operator": "Exists"}
    tolerations = [*(created["spec"].get("tolerations") or []), everything]
    try:
        for change in (
            {"metadata": {"annotations": {"gpu-fraction": "1"}}},
            {"spec": {"tolerations": tolerations}},
            {"metadata": {"labels": {COUNTED: None}}},
        ):
            status, body = api.request("PATCH", path, change, merge)
            words = denied(body, COUNTED_GUARD)
            assert status == 403 and words and REFUSED in words, (change, status, body)
        status, body = api.request("PATCH", path, {"metadata": {"labels": {"mine": "x"}}}, merge)
        assert status == 200, body
        assert created["metadata"]["labels"][COUNTED] == "true", created["metadata"]
        stored = api.get(path)
        assert stored["metadata"]["annotations"]["gpu-fraction"] == "0.25"
        assert stored["metadata"]["labels"][COUNTED] == "true"
        assert everything not in (stored["spec"].get("tolerations") or [])
    finally:
        api.request("DELETE", path)
