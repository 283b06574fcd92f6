"""Issue 19 items 1, 2, 9, 11 in process: what the webhook recognises on a pod shaped exactly as
Kubeflow's controllers make it (tests/kubeflow_support.py: notebook_pod models
kubeflow/notebooks notebook_controller.go, workspace_pod models workspace_controller.go
generateStatefulSet, which copies a podConfig's resources, nodeSelector, tolerations and
affinity, never its labels), what it maps, what it counts and what it refuses.
tests/test_kubeflow_webhook.py asks the real webhook process the same on a devcluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from fracspawner.backends import load_catalog
from fracspawner.kubeflow.admission import (
    Refusal,
    admit,
    other_pod_gpu,
    refuse_visible_gpus,
    slice_ask,
)
from fracspawner.kubeflow.recognise import (
    gpu_equivalent_of_pod,
    notebook_kind,
    pod_gpu_held,
    visibility_env,
)
from fracspawner.model.catalog import AccessRule
from tests.kubeflow_support import (
    notebook_pod,
    other_pod,
    podconfig_spec,
    with_poddefault,
    workspace_pod,
)

REPO = Path(__file__).resolve().parent.parent
DEMO = load_catalog(REPO / "examples" / "catalogs" / "demo.yaml")
RUNAI = load_catalog(REPO / "examples" / "catalogs" / "runai.yaml")
#: the namespace of the issue: h100 only, at its 0.25 GPU quota
AT_QUOTA = {"rule": AccessRule(pools=("h100",), max_gpu=0.25), "used_gpu": 0.25}


def admitted(pod: dict[str, Any], catalog: Any = DEMO, **kwargs: Any) -> dict[str, Any]:
    args = {"rule": AccessRule(), "used_gpu": 0.0, **kwargs}
    result = admit(pod, catalog=catalog, namespace="alice", **args)
    assert result is not None
    return result.pod


# --------------------------------------------------------------------------- item 1
@pytest.mark.parametrize(
    ("pool", "offer", "counts"),
    [("h100", "1/4", "0.25"), ("h100", "10GiB", "0.125"), ("h100", "1", "1")],
)
def test_a_workspace_from_a_gpu_podconfig_is_refused_at_the_quota(pool, offer, counts):
    """The v2 pod carries only the podConfig's resources and nodeSelector (no slice labels):
    before, the webhook saw no slice and a tenant at their quota started it freely."""
    pod = workspace_pod("alice", "big", podconfig_spec(DEMO, pool, offer))
    assert "fracspawner.io/pool" not in pod["metadata"]["labels"]
    with pytest.raises(Refusal) as refused:
        admit(pod, catalog=DEMO, namespace="alice", **AT_QUOTA)
    assert refused.value.reason == "quota"
    assert f"it counts as {counts} GPU" in refused.value.message


def test_a_workspace_on_a_pool_the_namespace_may_not_use_is_refused():
    pod = workspace_pod("alice", "t4ws", podconfig_spec(DEMO, "t4", "1/4"))
    with pytest.raises(Refusal) as refused:
        admit(pod, catalog=DEMO, namespace="alice", rule=AccessRule(pools=("h100",)), used_gpu=0)
    assert refused.value.reason == "access"
    assert "you may not use pool 't4'" in refused.value.message


def test_a_workspace_gets_what_its_podconfig_cannot_carry():
    """HAMi's GPU type annotation, the CONTRACT labels and annotations: the podConfig has only
    resources, so the webhook adds the rest of the plan to the v2 pod."""
    hami = load_catalog(REPO / "examples" / "catalogs" / "hami.yaml")
    pod = workspace_pod("alice", "ws", podconfig_spec(hami, "h100", "1/4"))
    out = admitted(pod, hami)
    assert out["metadata"]["labels"]["fracspawner.io/pool"] == "h100"
    assert out["metadata"]["labels"]["fracspawner.io/gpu"] == "0.25"
    assert out["metadata"]["annotations"]["nvidia.com/use-gputype"] == "H100"
    assert out["metadata"]["annotations"]["fracspawner.io/gpu-equivalent"] == "0.25"
    (main,) = out["spec"]["containers"]
    assert main["name"] == "main" and main["resources"]["limits"]["nvidia.com/gpucores"] == "25"


def test_a_time_slicing_podconfig_is_the_pools_replica_not_a_whole_gpu():
    """`nvidia.com/gpu: 1` pinned to the T4 pool's nodes is its 1/4 replica there."""
    pod = workspace_pod("alice", "t4", podconfig_spec(DEMO, "t4", "1/4"))
    ask = slice_ask(pod, DEMO, AccessRule())
    assert ask is not None and dict(ask.options) == {"gpu": "1/4", "pool": "t4"}
    assert gpu_equivalent_of_pod(pod, DEMO) == 0.25


def test_the_notebook_forms_nvidia_gpu_is_a_whole_gpu_under_the_quota():
    """The JWA GPU field writes `limits[nvidia.com/gpu] = num` (kubeflow/notebooks notebooks-v1
    components/crud-web-apps/jupyter/backend/apps/common/form.py set_notebook_gpus L226-250):
    a whole GPU, mapped onto a pool the namespace may use and counted."""
    pod = notebook_pod("alice", "form")
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "1"
    with pytest.raises(Refusal) as refused:
        admit(pod, catalog=DEMO, namespace="alice", **AT_QUOTA)
    assert refused.value.reason == "quota" and "it counts as 1 GPU" in refused.value.message
    out = admitted(pod, rule=AccessRule(pools=("h100",)))
    assert out["metadata"]["labels"]["fracspawner.io/pool"] == "h100"
    assert out["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpucores"] == "100"


def test_runai_fraction_annotations_on_a_workspace_are_recognised():
    """Run:ai asks through pod annotations (gpu-fraction): on a Workspace they come from its
    podMetadata, which the controller copies (workspace_controller.go generateStatefulSet)."""
    pod = workspace_pod(
        "alice", "frac", {}, workspace_metadata={"annotations": {"gpu-fraction": "0.5"}}
    )
    ask = slice_ask(pod, RUNAI, AccessRule())
    assert ask is not None and dict(ask.options) == {"gpu": "1/2", "pool": "a100-runai"}
    with pytest.raises(Refusal) as refused:
        admit(pod, catalog=RUNAI, namespace="alice", rule=AccessRule(max_gpu=0.25), used_gpu=0)
    assert refused.value.reason == "quota"


def test_gpu_that_is_no_catalog_slice_is_refused_on_a_notebook():
    pod = workspace_pod(
        "alice",
        "odd",
        {"resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "81559"}}},
    )
    with pytest.raises(Refusal) as refused:
        slice_ask(pod, DEMO, AccessRule())
    assert refused.value.reason == "invalid"
    assert "nvidia.com/gpumem=81559" in refused.value.message


# --------------------------------------------------------------------------- item 2
def test_notebook_pods_are_told_from_other_pods_by_their_controllers_labels():
    assert notebook_kind(notebook_pod("alice", "nb")) == "v1"
    assert notebook_kind(workspace_pod("alice", "ws", {})) == "v2"
    step = other_pod("alice", "train-x7k2p-123", {"limits": {"nvidia.com/mig-1g.10gb": "2"}})
    assert notebook_kind(step) is None
    # counted as what it is, two MIG slices, never refused as "one MIG slice per notebook"
    rule = AccessRule(max_gpu=1.0)
    held = other_pod_gpu(step, catalog=DEMO, rule=rule, namespace="alice", used_gpu=0)
    assert held == pytest.approx(2 / 7)


# --------------------------------------------------------------------------- item 9
def test_hami_settings_the_plan_does_not_set_are_stripped():
    """A pool offering only fractions: the tenant ticks the 0.25 slice and adds
    nvidia.com/gpumem (HAMi takes MiB before the percentage) and more cores."""
    data = yaml.safe_load((REPO / "examples" / "catalogs" / "hami.yaml").read_text())
    data["pools"]["h100"]["offers"] = ["1/4", "1/2"]
    data["pools"]["h100"]["options"]["gpucores"] = "none"
    del data["pools"]["a100-percent"]
    catalog = load_catalog(data)
    pod = with_poddefault(notebook_pod("alice", "greedy"), "h100", "0.25", "fracspawner-h100-0-25")
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    limits.update(
        {"nvidia.com/gpumem": "81559", "nvidia.com/gpucores": "100", "volcano.sh/vgpu-memory": "1"}
    )
    pod["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpumem"] = "81559"
    out = admitted(pod, catalog)["spec"]["containers"][0]["resources"]
    assert out["limits"]["nvidia.com/gpumem-percentage"] == "25"
    assert not {"nvidia.com/gpumem", "nvidia.com/gpucores", "volcano.sh/vgpu-memory"} & (
        set(out["limits"]) | set(out["requests"])
    )


# --------------------------------------------------------------------------- item 11
def test_gpu_visibility_env_on_a_container_without_gpu_is_found():
    step = other_pod(
        "alice", "peek-x7k2p-1", {}, env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    )
    assert visibility_env(step) == ["container main: NVIDIA_VISIBLE_DEVICES=all"]
    with pytest.raises(Refusal) as refused:
        refuse_visible_gpus(step, "alice")
    assert "NVIDIA_VISIBLE_DEVICES=all" in refused.value.message
    harmless = [
        [{"name": "CUDA_VISIBLE_DEVICES", "value": "0"}],  # filters devices it already has
        [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}],
        [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}],
        [{"name": "CUDA_VERSION", "value": "12.4"}, {"name": "NVIDIA_REQUIRE_CUDA", "value": "x"}],
    ]
    for env in harmless:
        assert visibility_env(other_pod("alice", "ok-x-1", {}, env=env)) == [], env
    risky = [
        [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "GPU-0,GPU-1"}],
        [
            {
                "name": "NVIDIA_VISIBLE_DEVICES",
                "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}},
            }
        ],
        [{"name": "NVIDIA_IMEX_CHANNELS", "value": "0"}],
        [{"name": "CUDA_VERSION", "value": "12.4"}],  # a legacy image: every GPU by default
    ]
    for env in risky:
        assert visibility_env(other_pod("alice", "no-x-1", {}, env=env)), env
    # a container holding a GPU gets its devices from the device plugin, over its env
    gpu = other_pod(
        "alice",
        "gpu-x-1",
        {"limits": {"nvidia.com/gpu": "1"}},
        env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
    )
    assert visibility_env(gpu) == []


@pytest.mark.parametrize(
    ("resources", "annotations", "held"),
    [
        ({"limits": {"nvidia.com/gpu": "2"}}, {}, 2.0),  # a whole GPU each, wherever it lands
        ({"limits": {"nvidia.com/gpumem": "81559"}}, {}, 1.0),  # HAMi: implies gpu 1
        ({"limits": {"nvidia.com/mig-3g.40gb": "1"}}, {}, 3 / 7),  # as the catalog counts it
        ({"limits": {"nvidia.com/mig-2g.24gb": "1"}}, {}, 0.5),  # unknown profile: of 4 slices
        ({"limits": {"volcano.sh/vgpu-memory": "1024"}}, {}, 1.0),
        ({}, {"gpu-fraction": "0.5"}, 0.5),
        ({}, {"gpu-memory": "2048"}, 1.0),
        ({}, {"fracspawner.io/gpu-equivalent": "0"}, 0.0),
        ({"limits": {"cpu": "1"}}, {}, 0.0),
    ],
)
def test_every_pods_gpu_counts_whoever_made_it(resources, annotations, held):
    step = other_pod("alice", "train-x7k2p-9", resources)
    step["metadata"]["annotations"].update(annotations)
    assert gpu_equivalent_of_pod(step, DEMO) == pytest.approx(held)
    assert pod_gpu_held(step, DEMO) == pytest.approx(held)


def test_a_forged_annotation_never_lowers_what_a_pod_counts():
    step = other_pod("alice", "train-x7k2p-9", {"limits": {"nvidia.com/gpu": "8"}})
    step["metadata"]["annotations"]["fracspawner.io/gpu-equivalent"] = "0.125"
    assert pod_gpu_held(step, DEMO) == 8.0
    with pytest.raises(Refusal) as refused:
        other_pod_gpu(step, catalog=DEMO, rule=AccessRule(max_gpu=2), namespace="alice", used_gpu=0)
    assert refused.value.reason == "quota" and "count as 8 GPU" in refused.value.message


def test_an_admitted_notebook_counts_what_it_was_admitted_as():
    for pool, offer in (
        ("h100", "1/4"),
        ("h100", "10GiB"),
        ("t4", "1/4"),
        ("a100-mig", "mig-2g.20gb"),
    ):
        pod = admitted(workspace_pod("alice", "ws", podconfig_spec(DEMO, pool, offer)))
        noted = float(pod["metadata"]["annotations"]["fracspawner.io/gpu-equivalent"])
        assert gpu_equivalent_of_pod(pod, DEMO) == pytest.approx(noted, abs=1e-6), (pool, offer)
