"""Review 56: attacks on the Kubeflow webhook's admission of pods, through its review handler
(`Webhook.review`, run in process: tests/kubeflow_inprocess.py) with AdmissionReview bodies as
kube-apiserver sends them (tests/kubeflow_support.admission_review).

What is modelled (cited):
- HAMi-core reads its limits and its off switch from the container's environment
  (`CUDA_DEVICE_MEMORY_LIMIT[_i]`, `CUDA_DEVICE_SM_LIMIT`, `CUDA_DISABLE_CONTROL=true`: HAMi
  docs/config.md "Container configs"), and the kubelet appends the pod's env after the device
  plugin's Allocate envs (kubernetes pkg/kubelet/kubelet_pods.go GenerateRunContainerOptions),
  so a pod's own value of such a name wins over the one HAMi's device plugin set;
- the rest of fracspawner.backends.RESERVED_ENV (MPS limits, LD_PRELOAD interposers, ClearML's
  GPU_MEM_LIMIT_GB) likewise loosens a backend's isolation when a pod sets it.
"""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import pytest

from fracspawner.backends import LABEL_GPU, load_catalog, plan_slice
from fracspawner.kubeflow.admission import parse_review
from fracspawner.kubeflow.webhook import Webhook
from tests.kubeflow_inprocess import FakeCluster, allowed, message
from tests.kubeflow_support import (
    admission_review,
    notebook_pod,
    other_pod,
    patched,
    with_poddefault,
)

REPO = Path(__file__).resolve().parent.parent
CATALOG = load_catalog(str(REPO / "examples" / "kubeflow" / "catalog.yaml"))
#: the catalog's default rule: pool h100 (HAMi), 0.25 GPU
NAMESPACE = "alice"
#: the h100 pool's 1/8 plan exactly, on its nodes: counted as 0.125
HAMI_EIGHTH = {
    "nvidia.com/gpu": "1",
    "nvidia.com/gpumem-percentage": "12",
    "nvidia.com/gpucores": "12",
}


def webhook(**options: Any) -> Webhook:
    hook = Webhook(CATALOG, FakeCluster({NAMESPACE: {}}), **options)
    hook.pods.load([])
    return hook


def answer(hook: Webhook, body: dict[str, Any]) -> dict[str, Any]:
    review = parse_review(json.dumps(body).encode())
    return asyncio.run(hook.review(review, ""))


def step(env: list[dict[str, Any]], init: bool = False) -> dict[str, Any]:
    """A pipeline step (no notebook) holding the h100 pool's 1/8 plan, with `env` on its GPU
    container (an init container with `init`)."""
    pod = other_pod(NAMESPACE, "train-x7k2p-1", {"limits": dict(HAMI_EIGHTH)})
    pod["spec"]["nodeSelector"] = {"gpu": "on"}
    box = pod["spec"]["containers"][0]
    if init:
        pod["spec"]["initContainers"] = [{**box, "name": "prepare", "env": env}]
        box["resources"] = {}
    else:
        box["env"] = env
    return pod


# --------------------------------------------------------------------------- finding 1
LOOSENING = [
    {"name": "CUDA_DISABLE_CONTROL", "value": "true"},
    {"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "80g"},
    {"name": "CUDA_DEVICE_SM_LIMIT", "value": "100"},
    {"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "100"},
    {"name": "LD_PRELOAD", "value": "/tmp/not-hami.so"},
    {"name": "GPU_MEM_LIMIT_GB", "value": "80"},
    {
        "name": "CUDA_DISABLE_CONTROL",
        "valueFrom": {"configMapKeyRef": {"name": "knobs", "key": "off"}},
    },
]

LOOSENING_IDS = [e["name"] + ("-valueFrom" if "valueFrom" in e else "") for e in LOOSENING]


@pytest.mark.parametrize("mode", ["notebooks", "all-pods"])
@pytest.mark.parametrize("init", [False, True], ids=["app", "init"])
@pytest.mark.parametrize("entry", LOOSENING, ids=LOOSENING_IDS)
def test_a_step_holding_a_gpu_may_not_switch_its_isolation_off(entry, init, mode):
    """Before: a pipeline step counted as the 1/8 plan with CUDA_DISABLE_CONTROL=true (or its
    own CUDA_DEVICE_MEMORY_LIMIT_0) was admitted as sent: HAMi's limits off, the whole GPU's
    memory for the 0.125 the quota counted. Notebooks lose these variables (reserved env);
    a pod the webhook never changes is refused, naming the container and the variable."""
    hook = webhook(enforce_pool_access=mode)
    got = answer(hook, admission_review(step([entry], init=init)))
    assert not allowed(got)
    words = message(got)
    assert entry["name"] in words
    assert ("prepare" if init else "main") in words


@pytest.mark.parametrize(
    "entry",
    [
        {"name": "CUDA_VISIBLE_DEVICES", "value": "0"},  # filters within its own devices
        {"name": "FRACSPAWNER_GPU_POOL", "value": "h100"},  # what fracspawner tells, not a knob
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ],
    ids=lambda e: e["name"],
)
def test_a_step_keeps_harmless_env(entry):
    """Variables that loosen no isolation still pass, and the step is counted."""
    hook = webhook()
    assert allowed(answer(hook, admission_review(step([entry]))))


def test_a_container_holding_no_gpu_may_set_ld_preload():
    """A sidecar or a CPU step with its own LD_PRELOAD (a tcmalloc) has no GPU to loosen."""
    pod = step([])
    pod["spec"]["containers"].append(
        {"name": "sidecar", "image": "x", "env": [{"name": "LD_PRELOAD", "value": "/l.so"}]}
    )
    assert allowed(answer(webhook(), admission_review(pod)))


# --------------------------------------------------------------------------- finding 2
def admitted_notebook(catalog_file: str, pool: str) -> tuple[Webhook, dict[str, Any]]:
    """A notebook given `pool`'s first offer by its PodDefault labels, as the webhook stored
    it, and the webhook (namespace alice may use every pool of these catalogs)."""
    catalog = load_catalog(str(REPO / "examples" / "catalogs" / catalog_file))
    hook = Webhook(catalog, FakeCluster({NAMESPACE: {}}))
    hook.pods.load([])
    offer = catalog.pools[pool].offers[0]
    label = plan_slice(offer, catalog.pools[pool], None).labels[LABEL_GPU]
    pod = with_poddefault(notebook_pod(NAMESPACE, "nb"), pool, label, "fracspawner-slice")
    got = answer(hook, admission_review(pod))
    assert allowed(got)
    return hook, patched(pod, got["response"])


def update(hook: Webhook, old: dict[str, Any], change: Any) -> dict[str, Any]:
    new = copy.deepcopy(old)
    change(new)
    return answer(hook, admission_review(new, operation="UPDATE", old=old))


def swap_image(pod: dict[str, Any]) -> None:
    pod["spec"]["containers"][0]["image"] = "nvcr.io/nvidia/pytorch:24.01-py3"


def whole_fraction(pod: dict[str, Any]) -> None:
    pod["metadata"]["annotations"]["gpu-fraction"] = "1"


def tolerate_everything(pod: dict[str, Any]) -> None:
    pod["spec"].setdefault("tolerations", []).append({"operator": "Exists"})


@pytest.mark.parametrize(
    "catalog_file, pool, change",
    [
        ("clearml.yaml", "l4-clearml", swap_image),
        ("runai.yaml", "a100-runai", whole_fraction),
        ("runai.yaml", "l40s-kai", whole_fraction),
        ("hami.yaml", None, tolerate_everything),
    ],
    ids=["clearml-image-swapped", "runai-fraction-raised", "kai-fraction-raised", "tolerations"],
)
def test_an_admitted_slice_pod_keeps_what_its_slice_was_counted_by(catalog_file, pool, change):
    """Before: the guard (UPDATE of a pod carrying fracspawner.io/pool) refused changes to the
    slice labels and quota annotations only. A profile member could then replace a
    clearml-image notebook's image (the image IS the memory limit: the whole L4 for 2 GiB's
    count), raise a pending Run:ai/KAI notebook's gpu-fraction annotation to 1 (the scheduler
    reads it when it places the pod: a whole GPU for 0.25 of the quota), or add a toleration
    reaching a tainted pool's nodes the namespace may not use. Each is refused now."""
    if pool is None:
        pool = next(iter(load_catalog(str(REPO / "examples" / "catalogs" / catalog_file)).pools))
    hook, pod = admitted_notebook(catalog_file, pool)
    got = update(hook, pod, change)
    assert not allowed(got)
    assert "cannot be changed" in message(got)


def test_other_updates_of_a_slice_pod_pass():
    """Labels of its own, and the image of a pool whose plan does not set one."""
    hook, pod = admitted_notebook("hami.yaml", next(iter(load_catalog(
        str(REPO / "examples" / "catalogs" / "hami.yaml")).pools)))  # fmt: skip

    def label(new: dict[str, Any]) -> None:
        new["metadata"]["labels"]["mine"] = "yes"

    assert allowed(update(hook, pod, label))
    assert allowed(update(hook, pod, swap_image))
