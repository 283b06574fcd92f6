"""Review of 10ac73c..cd96d17: what the day's changes broke (each test failed at cd96d17)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from fracspawner.backends import load_catalog
from fracspawner.kubeflow.admission import parse_review
from fracspawner.kubeflow.webhook import Webhook
from tests.kubeflow_inprocess import FakeCluster, allowed, message
from tests.kubeflow_support import admission_review, other_pod

REPO = Path(__file__).resolve().parent.parent
NAMESPACE = "alice"


def _webhook(catalog_file: str) -> Webhook:
    hook = Webhook(load_catalog(str(REPO / catalog_file)), FakeCluster({NAMESPACE: {}}))
    hook.pods.load([])
    return hook


def _answer(hook: Webhook, pod: dict[str, Any]) -> dict[str, Any]:
    review = parse_review(json.dumps(admission_review(pod)).encode())
    return asyncio.run(hook.review(review, ""))


# ------------------------------------------------------------------ refuse_isolation_env (2b3babf)
def _step(resources: dict[str, str], env: list[dict[str, str]]) -> dict[str, Any]:
    pod = other_pod(NAMESPACE, "train-x7k2p-1", {"limits": dict(resources)})
    pod["spec"]["containers"][0]["env"] = env
    return pod


JEMALLOC = {"name": "LD_PRELOAD", "value": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"}


@pytest.mark.parametrize(
    "catalog_file, resources, entry",
    [
        # a MIG instance: isolated in hardware; a training step's allocator preload is no knob
        ("examples/kubeflow/catalog.yaml", {"nvidia.com/mig-1g.10gb": "1"}, JEMALLOC),
        # an MPS client may only LOWER the control daemon's limits (NVIDIA MPS docs,
        # shared/reference/gpu-backends.md): a step asking for less compute is no loosening
        (
            "examples/catalogs/mps.yaml",
            {"nvidia.com/gpu": "1"},
            {"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "5"},
        ),
        ("examples/catalogs/mps.yaml", {"nvidia.com/gpu": "1"}, JEMALLOC),
    ],
    ids=["mig-ld-preload", "mps-lower-thread-percentage", "mps-ld-preload"],
)
def test_a_step_whose_gpu_no_env_can_loosen_keeps_its_env(catalog_file, resources, entry):
    """At cd96d17 every GPU step setting LD_PRELOAD or any CUDA_MPS_* was refused as
    "switching off the GPU's isolation", whatever pool its GPU comes from: a pipeline step on
    a MIG instance preloading jemalloc (as many training images do), an MPS client tightening
    its own limit. Where every pool the step can land on isolates the GPU by hardware or by a
    daemon (or not at all), no container env loosens anything: admitted as before."""
    got = _answer(_webhook(catalog_file), _step(resources, [entry]))
    assert allowed(got), message(got)


def test_a_step_on_a_hami_pool_still_may_not_switch_its_isolation_off():
    """The refusal stays where the env is the isolation (HAMi-core reads it)."""
    hami = {
        "nvidia.com/gpu": "1",
        "nvidia.com/gpumem-percentage": "12",
        "nvidia.com/gpucores": "12",
    }
    pod = _step(hami, [JEMALLOC])
    pod["spec"]["nodeSelector"] = {"gpu": "on"}
    got = _answer(_webhook("examples/kubeflow/catalog.yaml"), pod)
    assert not allowed(got)
    assert "LD_PRELOAD" in message(got)
