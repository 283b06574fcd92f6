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

A pod asking NO GPU at CREATE is not counted; but one whose schedulerName is KAI's or Run:ai's
(recognise.FRACTION_SCHEDULERS) is sized by those schedulers from its annotations when it is
scheduled, so a `gpu-fraction` added while it is Pending would get it a GPU the quota never
counted. Such a pod, notebook or not, carrying no slice, is labelled too (counted as 0), without
the webhook calling the API server (a GPU-less pod never waits on it), and the guard keeps it
GPU-less.

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
    workspace_pod,
)

REPO = Path(__file__).resolve().parent.parent
COUNTED = "fracspawner.io/counted"
COUNTED_GUARD = "counted.guard.slices.webhook.fracspawner.io"
NAMESPACE = "counted-steps"
TOPOLOGY = {"nodes": [{"name": "cpu-1", "capacity": {"cpu": "8", "memory": "32Gi"}}]}
#: what a counted pod's guard refuses with (admission._guard_refusal)
REFUSED = "of a GPU pod cannot be changed or removed"
#: the scheduler name runai_catalog's KAI pool gives its pods (pool option scheduler_name)
KAI_RENAMED = "kai-prod"


def runai_catalog() -> dict[str, Any]:
    """Run:ai and KAI pools; every profile namespace may hold 0.5 GPU."""
    data = yaml.safe_load((REPO / "examples" / "catalogs" / "runai.yaml").read_text())
    data["access"] = {"default": {"pools": "all", "max_gpu": 0.5}}
    data["kubeflow"] = {"pools": "all"}
    # a KAI installation named otherwise (KAI's global.schedulerName): the pool's plans name it
    data["pools"]["l40s-kai"]["options"]["scheduler_name"] = KAI_RENAMED
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


# ---------------------------------------------- tolerations added later (Kueue's release)
def tainted_catalog(folder: Path) -> Path:
    """h100 (HAMi, untainted), which every namespace may use, and t4 (time-sliced, tainted
    nvidia.com/gpu), which none may."""
    data = yaml.safe_load((REPO / "examples" / "kubeflow" / "catalog.yaml").read_text())
    data["pools"] = {name: data["pools"][name] for name in ("h100", "t4")}
    data["access"] = {"default": {"pools": ["h100"], "max_gpu": 2}}
    data["kubeflow"] = {"pools": "all"}
    path = folder / "tainted.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def gpu_step() -> dict[str, Any]:
    """A step asking for nvidia.com/gpu with no node selector: it can land on h100's nodes, not
    on t4's, whose taint it does not tolerate."""
    return other_pod(NAMESPACE, "train-x7k2p-5", {"limits": {"nvidia.com/gpu": "1"}})


@pytest.mark.parametrize("mode", ["notebooks", "all-pods"])
def test_a_counted_steps_new_tolerations_are_checked_as_its_first_were(tmp_path, mode):
    """Kueue admits a gated pod by adding its ResourceFlavor's tolerations (an UPDATE): refused
    outright, a Kueue-managed GPU step stayed gated for ever. Under --enforce-pool-access
    all-pods the new tolerations may not reach a pool the namespace may not use (as at CREATE);
    under notebooks its pools are not checked at all, so neither are they now."""
    hook = webhook(tainted_catalog(tmp_path), enforce_pool_access=mode)
    step = gpu_step()
    got = answer(hook, admission_review(step))
    assert allowed(got), got
    created = patched(step, got["response"])
    assert created["metadata"]["labels"][COUNTED] == "true"
    flavor = copy.deepcopy(created)
    flavor["spec"]["tolerations"] = [
        {"key": "kueue.x-k8s.io/flavor", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert allowed(answer(hook, admission_review(flavor, operation="UPDATE", old=created)))
    t4 = copy.deepcopy(created)
    t4["spec"]["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    got = answer(hook, admission_review(t4, operation="UPDATE", old=created))
    if mode == "notebooks":
        assert allowed(got)
    else:
        assert not allowed(got)
        assert "t4" in message(got), message(got)


# ------------------------------------------------- pods asking no GPU, for KAI or Run:ai
class UnreachableCluster(FakeCluster):
    """A cluster the webhook must not read: every call is recorded and fails (a pod asking
    for no GPU is answered before any API call, webhook.Webhook._create)."""

    def __init__(self) -> None:
        super().__init__({NAMESPACE: {}})
        self.calls: list[str] = []

    async def namespace(self, name: str):
        self.calls.append(f"namespace {name}")
        raise AssertionError(f"the webhook read namespace {name} for a pod asking no GPU")

    async def pods_labelled(self, namespace: str, key: str, value: str):
        self.calls.append(f"pods of {namespace}")
        raise AssertionError("the webhook listed pods for a pod asking no GPU")


def unreachable(catalog_file: Path) -> tuple[Webhook, UnreachableCluster]:
    cluster = UnreachableCluster()
    # the pod watch is never loaded: waiting on it would fail too (FakeWatch.wait_synced)
    return Webhook(load_catalog(str(catalog_file)), cluster), cluster


def skipped(hook: Webhook) -> float:
    value = hook.metrics.registry.get_sample_value(
        "fracspawner_webhook_admissions_total", {"operation": "CREATE", "result": "skipped"}
    )
    return value or 0.0


def marked_and_held(
    hook: Webhook, pod: dict[str, Any], got: dict[str, Any], raise_ask: Any = None
) -> dict[str, Any]:
    """The pod as created from the webhook's answer `got`: labelled counted and nothing else
    of its labels changed; raising its `gpu-fraction` afterwards is refused by the guard."""
    assert allowed(got), got
    created = patched(pod, got["response"])
    assert created["metadata"]["labels"] == {**pod["metadata"]["labels"], COUNTED: "true"}
    raised = copy.deepcopy(created)
    (raise_ask or raise_fraction)(raised)
    refused = answer(hook, admission_review(raised, operation="UPDATE", old=created))
    assert not allowed(refused)
    assert message(refused).startswith(f"the annotation gpu-fraction {REFUSED}"), message(refused)
    return created


def for_kai(pod: dict[str, Any], scheduler: str = "kai-scheduler") -> dict[str, Any]:
    pod["spec"]["schedulerName"] = scheduler
    return pod


@pytest.mark.parametrize("scheduler", ["kai-scheduler", "runai-scheduler"])
def test_a_gpu_less_step_for_a_fraction_scheduler_is_marked_without_the_api_server(
    catalog_file, scheduler
):
    """KAI/Run:ai read `gpu-fraction` when they schedule the pod: one created without it is
    counted as 0 and marked, so adding it while the pod is Pending reaches the guard. Nothing
    is read from the API server for it; it still counts as skipped (no GPU asked)."""
    hook, cluster = unreachable(catalog_file)
    step = for_kai(other_pod(NAMESPACE, "train-x7k2p-4", {}), scheduler)
    # the guard keeps it GPU-less: no ask can be added. A toleration can (Kueue adds its
    # flavor's): under the default --enforce-pool-access notebooks its pools are not checked
    created = marked_and_held(hook, step, answer(hook, admission_review(step)))
    assert created["metadata"]["annotations"] == step["metadata"]["annotations"]
    assert created["spec"] == step["spec"]
    assert skipped(hook) == 1
    tolerant = copy.deepcopy(created)
    tolerate_everything(tolerant)
    assert allowed(answer(hook, admission_review(tolerant, operation="UPDATE", old=created)))
    assert cluster.calls == []


def test_a_gpu_less_step_for_the_catalogs_own_kai_scheduler_name_is_marked(catalog_file):
    """A KAI or Run:ai pool of the catalog may name its scheduler otherwise (pool option
    scheduler_name: KAI's global.schedulerName is configurable): a pod naming that scheduler is
    sized from its annotations when it is placed, as one naming kai-scheduler is, so one
    created asking no GPU is marked, and a gpu-fraction added later is refused."""
    hook, cluster = unreachable(catalog_file)
    assert hook.catalog.pools["l40s-kai"].options["scheduler_name"] == KAI_RENAMED
    step = for_kai(other_pod(NAMESPACE, "train-x7k2p-9", {}), KAI_RENAMED)
    marked_and_held(hook, step, answer(hook, admission_review(step)))
    assert cluster.calls == []


def test_a_fraction_container_of_the_catalogs_own_kai_scheduler_keeps_its_devices(catalog_file):
    """KAI's binder hands the fraction container its GPU through NVIDIA_VISIBLE_DEVICES from a
    ConfigMap; the webhook let that through only for the scheduler names kai-scheduler and
    runai-scheduler, and refused every fraction pod of a KAI installed under another name (the
    catalog's scheduler_name) as a container choosing GPUs through its env. Its other
    containers are still held to the rule."""
    from tests.test_kubeflow_webhook_visibility import kai_fraction_step

    hook = webhook(catalog_file)
    step = kai_fraction_step(namespace=NAMESPACE, schedulerName=KAI_RENAMED)
    got = answer(hook, admission_review(step))
    assert allowed(got), message(got)
    sidecar = kai_fraction_step(namespace=NAMESPACE, schedulerName=KAI_RENAMED)
    sidecar["spec"]["containers"].append(
        {"name": "peek", "image": "busybox", "env": sidecar["spec"]["containers"][0]["env"]}
    )
    got = answer(hook, admission_review(sidecar))
    assert not allowed(got) and "container peek" in message(got), got
    # a scheduler no catalog pool names: nobody writes that ConfigMap
    stray = kai_fraction_step(namespace=NAMESPACE, schedulerName="someone-elses")
    assert not allowed(answer(hook, admission_review(stray)))


def test_a_gpu_less_step_for_the_default_scheduler_is_left_as_it_was(catalog_file):
    """The default scheduler never reads `gpu-fraction`, and a pod's schedulerName cannot
    change: nothing to mark, no patch at all."""
    hook, cluster = unreachable(catalog_file)
    for scheduler in (None, "default-scheduler", "not-served"):
        step = other_pod(NAMESPACE, "cpu-x7k2p-5", {})
        if scheduler:
            step["spec"]["schedulerName"] = scheduler
        got = answer(hook, admission_review(step))
        assert allowed(got), got
        assert "patch" not in got["response"], (scheduler, got["response"])
    assert cluster.calls == []
    assert skipped(hook) == 3


def test_a_notebook_without_a_slice_for_a_fraction_scheduler_is_marked(catalog_file):
    """A Notebook's or a Workspace's pod asking no slice goes to the notebook webhooks: one
    naming KAI's scheduler is marked there, without the API server; a slice pod is guarded by
    fracspawner.io/pool instead and is not marked."""
    hook, cluster = unreachable(catalog_file)
    for pod in (
        for_kai(notebook_pod(NAMESPACE, "nb")),
        for_kai(workspace_pod(NAMESPACE, "ws", {})),
    ):
        marked_and_held(hook, pod, answer(hook, admission_review(pod)), raise_fraction_anywhere)
    assert cluster.calls == []
    # a notebook naming no fraction scheduler: nothing
    plain = notebook_pod(NAMESPACE, "plain")
    got = answer(hook, admission_review(plain))
    assert COUNTED not in patched(plain, got["response"])["metadata"]["labels"]
    # a slice pod (the PodDefault's fracspawner.io/pool) is the pool guard's
    pool = next(iter(load_catalog(str(catalog_file)).pools))
    labelled = for_kai(other_pod(NAMESPACE, "train-x7k2p-6", {}))
    labelled["metadata"]["labels"]["fracspawner.io/pool"] = pool
    got = answer(hook, admission_review(labelled))
    assert allowed(got), got
    assert COUNTED not in patched(labelled, got["response"])["metadata"]["labels"]


def raise_fraction_anywhere(pod: dict[str, Any]) -> None:
    pod["metadata"].setdefault("annotations", {})["gpu-fraction"] = "1"


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
    removing the mark is; its own labels and, under the webhook's default --enforce-pool-access
    notebooks (its pools unchecked), its tolerations still change (Kueue adds its flavor's)."""
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
            {"metadata": {"labels": {COUNTED: None}}},
        ):
            status, body = api.request("PATCH", path, change, merge)
            words = denied(body, COUNTED_GUARD)
            assert status == 403 and words and REFUSED in words, (change, status, body)
        for change in (
            {"metadata": {"labels": {"mine": "x"}}},
            {"spec": {"tolerations": tolerations}},
        ):
            status, body = api.request("PATCH", path, change, merge)
            assert status == 200, (change, body)
        assert created["metadata"]["labels"][COUNTED] == "true", created["metadata"]
        stored = api.get(path)
        assert stored["metadata"]["annotations"]["gpu-fraction"] == "0.25"
        assert stored["metadata"]["labels"][COUNTED] == "true"
        assert everything in (stored["spec"].get("tolerations") or [])
    finally:
        api.request("DELETE", path)


def test_a_pending_gpu_less_kai_pod_cannot_be_given_a_fraction(api):
    """Created asking no GPU, for KAI's scheduler (none serves it: it stays Pending), in a
    namespace holding 0.5 GPU: marked at CREATE, so a `gpu-fraction: "1"` added while it
    waits is refused with the guard's words; a notebook pod without a slice likewise (it goes
    through the notebook webhook)."""
    step = for_kai(other_pod(NAMESPACE, "train-x7k2p-8", {}))
    notebook = for_kai(notebook_pod(NAMESPACE, "kai-nb"))
    # the catalog's KAI pool names its scheduler kai-prod: a pod naming it likewise
    renamed = for_kai(other_pod(NAMESPACE, "train-x7k2p-10", {}), KAI_RENAMED)
    merge = "application/merge-patch+json"
    paths = []
    try:
        for pod in (step, notebook, renamed):
            status, created = create_pod(api, pod)
            assert status == 201, created
            path = f"/api/v1/namespaces/{NAMESPACE}/pods/{pod['metadata']['name']}"
            paths.append(path)
            raise_it = {"metadata": {"annotations": {"gpu-fraction": "1"}}}
            status, body = api.request("PATCH", path, raise_it, merge)
            words = denied(body, COUNTED_GUARD)
            assert status == 403 and words and REFUSED in words, (status, body)
            assert created["metadata"]["labels"].get(COUNTED) == "true", created["metadata"]
            status, body = api.request(
                "PATCH", path, {"metadata": {"labels": {"mine": "x"}}}, merge
            )
            assert status == 200, body
            stored = api.get(path)
            assert "gpu-fraction" not in (stored["metadata"].get("annotations") or {})
    finally:
        for path in paths:
            api.request("DELETE", path)
