"""Backends: the documented Kubernetes keys per sharing technology, and valid pods for all.

Each FACTS row is one documented fact, with its source in a comment. The pods are built with
kubespawner's own make_pod from the plan and validated strictly against the official
Kubernetes OpenAPI schema (kubernetes-validate).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes_asyncio.client import ApiClient
from kubespawner.objects import make_pod

from fracspawner.backends import (
    BUILTIN_BACKENDS,
    RESERVED_ENV,
    PodPlan,
    get_backend,
    is_reserved_env,
    load_catalog,
    plan_slice,
    safe_env,
)
from fracspawner.model.catalog import CatalogError, Image
from fracspawner.model.slices import SliceError, parse_slice

K8S_VERSION = "1.33.0"
IMAGE = Image("pytorch", "PyTorch", "quay.io/jupyter/pytorch-notebook:cuda12-latest", True)
EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "catalogs"
GPU_KEY = re.compile(r"^(nvidia\.com/|volcano\.sh/|gpu-|clearml-injector/)")


def make_pool(backend: str, gpu: Any, offers: list, **extra: Any):
    """One pool, loaded through Catalog.load so every check a real catalog gets applies."""
    raw = {"gpu": gpu, "backend": backend, "offers": offers, **extra}
    catalog = load_catalog({"pools": {"p": raw}, "images": {"i": {"image": "busybox"}}})
    return catalog.pools["p"]


def gpu_keys(plan: PodPlan) -> dict[str, str]:
    return {k: v for k, v in plan.limits.items() if GPU_KEY.match(k)}


# (backend, gpu, pool extras, offer) -> expected plan fields (only those named are compared;
# `limits` is compared exactly on the GPU keys).
FACTS = [
    # NVIDIA/k8s-device-plugin internal/rm/rm.go (mixed strategy): nvidia.com/mig-<profile>
    ("mig-mixed", "A100-80GB", {}, "mig-1g.10gb", {"limits": {"nvidia.com/mig-1g.10gb": "1"}}),
    ("mig-mixed", "A100-40GB", {}, "mig-3g.20gb", {"limits": {"nvidia.com/mig-3g.20gb": "1"}}),
    # same source, tests/expected-output-mig-mixed.txt: '+me' profiles are named '.me'
    (
        "mig-mixed",
        "A100-80GB",
        {},
        "mig-1g.10gb+me",
        {"limits": {"nvidia.com/mig-1g.10gb.me": "1"}},
    ),
    # GFD README (single strategy): nvidia.com/gpu + product label <product>-MIG-<profile>
    (
        "mig-single",
        "A100-40GB",
        {"options": {"product": "A100-SXM4-40GB"}},
        "mig-1g.5gb",
        {
            "limits": {"nvidia.com/gpu": "1"},
            "node_selector": {"nvidia.com/gpu.product": "A100-SXM4-40GB-MIG-1g.5gb"},
        },
    ),
    # k8s-device-plugin README "Shared Access to GPUs": one replica of nvidia.com/gpu ...
    (
        "timeslicing",
        "T4",
        {"replicas": 4},
        "1/4",
        {
            "limits": {"nvidia.com/gpu": "1"},
            "node_selector": {"nvidia.com/gpu.replicas": "4"},
            "enforced": False,
        },
    ),
    # ... or nvidia.com/gpu.shared with renameByDefault: true
    (
        "timeslicing",
        "T4",
        {"replicas": 2, "options": {"rename_by_default": True}},
        "1/2",
        {"limits": {"nvidia.com/gpu.shared": "1"}},
    ),
    # k8s-device-plugin internal/plugin/mps.go: replicas, memory/threads limited to 1/N;
    # GFD label nvidia.com/gpu.sharing-strategy=mps
    (
        "mps",
        "L4",
        {"replicas": 8},
        "1/8",
        {
            "limits": {"nvidia.com/gpu": "1"},
            "node_selector": {
                "nvidia.com/gpu.replicas": "8",
                "nvidia.com/gpu.sharing-strategy": "mps",
            },
            "enforced": True,
        },
    ),
    # HAMi charts/hami/values.yaml + docs: nvidia.com/gpu count, gpumem-percentage for a
    # fraction (computeMemreq in pkg/device/nvidia/fit_checks.go: registered devmem * p / 100,
    # so four quarters fit the 81559 MiB an H100 registers), gpucores percent
    (
        "hami",
        "H100-80GB",
        {},
        "1/4",
        {
            "limits": {
                "nvidia.com/gpu": "1",
                "nvidia.com/gpumem-percentage": "25",
                "nvidia.com/gpucores": "25",
            },
            "enforced": True,
            "memory_mib": 20389,
        },
    ),
    # HAMi takes whole percents: 1/8 is 12% of the registered memory
    (
        "hami",
        "H100-80GB",
        {},
        "1/8",
        {
            "limits": {
                "nvidia.com/gpu": "1",
                "nvidia.com/gpumem-percentage": "12",
                "nvidia.com/gpucores": "12",
            },
            "memory_mib": 81559 * 12 // 100,
        },
    ),
    # memory sizes mean what they say: exact MiB by default, and with memory: percentage the
    # smallest whole percent of the NVML memory holding them (10 GiB of 81559 MiB -> 13%)
    (
        "hami",
        "H100-80GB",
        {"options": {"memory": "percentage", "gpucores": "none"}},
        "10GiB",
        {
            "limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "13"},
            "memory_mib": 81559 * 13 // 100,
        },
    ),
    (
        "hami",
        "H100-80GB",
        {"options": {"gpucores": "none"}},
        "10GiB",
        {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10240"}},
    ),
    # HAMi pkg/device/nvidia/device.go: "Coresreq=100 indicates it want this card exclusively"
    (
        "hami",
        "H100-80GB",
        {},
        "1",
        {
            "limits": {
                "nvidia.com/gpu": "1",
                "nvidia.com/gpumem-percentage": "100",
                "nvidia.com/gpucores": "100",
            }
        },
    ),
    # HAMi: nvidia.com/gpumem-percentage (0-100) instead of MiB
    (
        "hami",
        "A100-40GB",
        {"options": {"memory": "percentage", "gpucores": 30}},
        "1/2",
        {
            "limits": {
                "nvidia.com/gpu": "1",
                "nvidia.com/gpumem-percentage": "50",
                "nvidia.com/gpucores": "30",
            }
        },
    ),
    # HAMi pkg/device/nvidia/device.go: nvidia.com/use-gputype annotation
    (
        "hami",
        "A100-80GB",
        {"options": {"use_gputype": "A100"}},
        "1/2",
        {"annotations": {"nvidia.com/use-gputype": "A100"}},
    ),
    # Run:ai docs "GPU fractions" / run-ai/runai-cli const.go: gpu-fraction annotation,
    # runai/queue label; no nvidia.com/gpu limit for fractions
    (
        "runai",
        "A100-80GB",
        {"options": {"queue": "team-a"}},
        "1/2",
        {
            "limits": {},
            "annotations": {"gpu-fraction": "0.5"},
            "labels": {"runai/queue": "team-a"},
            "scheduler_name": "runai-scheduler",
        },
    ),
    # Run:ai docs: gpu-memory annotation in MiB
    (
        "runai",
        "A100-80GB",
        {},
        "10GiB",
        {"limits": {}, "annotations": {"gpu-memory": "10240"}},
    ),
    # NVIDIA/KAI-Scheduler pkg/common/constants/constants.go: kai.scheduler/queue, kai-scheduler
    (
        "kai",
        "L40S",
        {"options": {"queue": "research"}},
        "1/4",
        {
            "annotations": {"gpu-fraction": "0.25"},
            "labels": {"kai.scheduler/queue": "research"},
            "scheduler_name": "kai-scheduler",
            "enforced": False,
        },
    ),
    # clearml-docs, fractional GPU injector "Usage": exact label strings; agent example also
    # sets nvidia.com/gpu: 1
    (
        "clearml-injector",
        "A100-80GB",
        {},
        "1/4",
        {"labels": {"clearml-injector/fraction": "0.250"}, "limits": {"nvidia.com/gpu": "1"}},
    ),
    (
        "clearml-injector",
        "A100-80GB",
        {"options": {"gpu_limit": "eighths"}},
        "1/2",
        {"labels": {"clearml-injector/fraction": "0.500"}, "limits": {"nvidia.com/gpu": "4"}},
    ),
    ("clearml-injector", "A100-80GB", {}, "1", {"labels": {"clearml-injector/fraction": "1.000"}}),
    # allegroai/clearml-fractional-gpu README: image per size, hostPID: true required
    (
        "clearml-image",
        "L4",
        {},
        "4GiB",
        {
            "image": "clearml/fractional-gpu:u22-cu12.3-4gb",
            "extra_pod_config": {"hostPID": True},
            "limits": {"nvidia.com/gpu": "1"},
            "memory_mib": 4096,
        },
    ),
    # same README: smallest image holding the request; os/cuda variants from the table
    (
        "clearml-image",
        "L4",
        {"options": {"os": "u20", "cuda": "cu11.1"}},
        "3GiB",
        {"image": "clearml/fractional-gpu:u20-cu11.1-4gb", "memory_mib": 4096},
    ),
    # volcano docs how_to_use_volcano_vgpu.md: vgpu-number, vgpu-memory (MiB), scheduler volcano
    (
        "volcano",
        "A100-40GB",
        {"options": {"gpucores": "none"}},
        "10GiB",
        {
            "limits": {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "10240"},
            "scheduler_name": "volcano",
        },
    ),
    # volcano vgpu/utils.go resourcereqs + checkNodeGPUSharingPredicateAndScore: a fraction
    # as vgpu-memory-percentage, a share of the memory the device registered
    (
        "volcano",
        "H100-80GB",
        {},
        "1/4",
        {
            "limits": {
                "volcano.sh/vgpu-number": "1",
                "volcano.sh/vgpu-memory-percentage": "25",
                "volcano.sh/vgpu-cores": "25",
            },
            "scheduler_name": "volcano",
        },
    ),
    # GKE docs "GPU time-sharing": nodeSelector strategy + max-shared-clients, nvidia.com/gpu: 1
    (
        "gke-timesharing",
        "L4",
        {"replicas": 4},
        "1/4",
        {
            "limits": {"nvidia.com/gpu": "1"},
            "node_selector": {
                "cloud.google.com/gke-gpu-sharing-strategy": "time-sharing",
                "cloud.google.com/gke-max-shared-clients-per-gpu": "4",
                "cloud.google.com/gke-accelerator": "nvidia-l4",
            },
            "enforced": False,
        },
    ),
    # GKE docs "NVIDIA MPS": strategy value mps
    (
        "gke-mps",
        "T4",
        {"replicas": 2},
        "1/2",
        {
            "node_selector": {
                "cloud.google.com/gke-gpu-sharing-strategy": "mps",
                "cloud.google.com/gke-max-shared-clients-per-gpu": "2",
            },
            "enforced": True,
        },
    ),
    # GKE docs "Running multi-instance GPUs": partition size selector
    (
        "gke-mig",
        "A100-40GB",
        {},
        "mig-1g.5gb",
        {
            "limits": {"nvidia.com/gpu": "1"},
            "node_selector": {
                "cloud.google.com/gke-gpu-partition-size": "1g.5gb",
                "cloud.google.com/gke-accelerator": "nvidia-tesla-a100",
            },
        },
    ),
    # Kubernetes "Schedule GPUs": whole devices as nvidia.com/gpu: N in limits
    ("whole", "A10", {}, "2", {"limits": {"nvidia.com/gpu": "2"}, "enforced": True}),
]


@pytest.mark.parametrize(
    ("backend", "gpu", "extra", "offer", "expected"),
    FACTS,
    ids=[f"{f[0]}-{f[3]}" for f in FACTS],
)
def test_documented_keys(backend, gpu, extra, offer, expected):
    pool = make_pool(backend, gpu, [offer], **extra)
    plan = plan_slice(parse_slice(offer), pool, IMAGE)
    for field, want in expected.items():
        got = getattr(plan, field)
        if field == "limits":
            assert gpu_keys(plan) == want
        elif isinstance(want, dict):
            assert {k: got.get(k) for k in want} == want, field
        else:
            assert got == want, field


# ---------------------------------------------------------------------------------- pods
def example_catalogs() -> list[Path]:
    return sorted(EXAMPLES.glob("*.yaml"))


def all_offers():
    for path in example_catalogs():
        catalog = load_catalog(path)
        for pool in catalog.pools.values():
            for offer in pool.offers:
                yield pytest.param(catalog, pool, offer, id=f"{path.stem}-{pool.name}-{offer}")


def test_every_backend_has_an_example_catalog():
    backends = {p.backend for path in example_catalogs() for p in load_catalog(path).pools.values()}
    assert backends >= set(BUILTIN_BACKENDS)


async def pod_manifest(plan: PodPlan) -> dict[str, Any]:
    pod = make_pod(
        name="jupyter-alice",
        cmd=["jupyterhub-singleuser"],
        port=8888,
        image=plan.image or "busybox",
        env=dict(plan.env),
        labels=dict(plan.labels),
        annotations=dict(plan.annotations),
        node_selector=dict(plan.node_selector),
        tolerations=[dict(t) for t in plan.tolerations],
        scheduler_name=plan.scheduler_name,
        extra_resource_limits=dict(plan.limits),
        extra_resource_guarantees=dict(plan.requests),
        extra_pod_config=dict(plan.extra_pod_config),
        extra_container_config=dict(plan.extra_container_config),
    )
    async with ApiClient() as api:  # kubespawner's models are kubernetes_asyncio's
        manifest = api.sanitize_for_serialization(pod)
    return {"apiVersion": "v1", "kind": "Pod", **manifest}


@pytest.mark.parametrize(("catalog", "pool", "offer"), all_offers())
async def test_planned_pod_is_a_valid_kubernetes_pod(catalog, pool, offer):
    plan = plan_slice(offer, pool, catalog.default_image(pool))
    manifest = await pod_manifest(plan)
    kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)

    # GPU resources are limits; a request, if any, equals the limit (Kubernetes "Schedule GPUs")
    resources = manifest["spec"]["containers"][0]["resources"]
    for key, value in (resources.get("requests") or {}).items():
        if GPU_KEY.match(key):
            assert resources["limits"][key] == value
    labels = manifest["metadata"]["labels"]
    annotations = manifest["metadata"]["annotations"]
    # design.md CONTRACT: what a GPU pod carries
    assert labels["fracspawner.io/pool"] == pool.name
    assert labels["fracspawner.io/gpu"] == offer.label
    assert float(annotations["fracspawner.io/gpu-equivalent"]) == pytest.approx(
        plan.gpu_equivalent, abs=1e-6
    )
    assert int(annotations["fracspawner.io/gpu-memory-mib"]) == plan.memory_mib > 0
    env = {e["name"]: e.get("value") for e in manifest["spec"]["containers"][0]["env"]}
    assert env["FRACSPAWNER_GPU_MEMORY_MIB"] == str(plan.memory_mib)
    # the pool's node selector is always honoured
    for key, value in pool.node_selector.items():
        assert manifest["spec"]["nodeSelector"][key] == plan.node_selector[key]
        assert key in plan.node_selector and value is not None


def test_soft_caps_only_where_memory_is_not_isolated():
    t4 = make_pool("timeslicing", "T4", ["1/4"], replicas=4)
    plan = plan_slice(parse_slice("1/4"), t4, IMAGE)
    assert plan.enforced is False
    assert plan.env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.25"
    assert plan.env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert plan.env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    # a quarter of the 15360 MiB a T4 reports, so four notebooks' caps fit the card
    assert plan.env["CUPY_GPU_MEMORY_LIMIT"] == str(3840 * 1024 * 1024)
    assert plan.env["FRACSPAWNER_GPU_MEMORY_MIB"] == "3840"

    hami = make_pool("hami", "H100-80GB", ["1/4"])
    plan = plan_slice(parse_slice("1/4"), hami, IMAGE)
    assert plan.enforced is True
    assert dict(plan.env) == {"FRACSPAWNER_GPU_MEMORY_MIB": "20389"}


def test_no_gpu_plan_carries_nothing_gpu():
    plan = plan_slice(parse_slice("none"), None, IMAGE)
    assert plan == PodPlan(image=IMAGE.image)
    assert not plan.limits and not plan.labels and not plan.annotations and not plan.env


def test_mig_pool_resolves_memory_and_fraction_to_the_smallest_offered_profile():
    pool = make_pool("mig-mixed", "A100-80GB", ["mig-1g.10gb", "mig-2g.20gb", "mig-3g.40gb"])
    plan = plan_slice(parse_slice("15GiB"), pool, IMAGE)
    assert gpu_keys(plan) == {"nvidia.com/mig-2g.20gb": "1"}
    assert plan.labels["fracspawner.io/gpu"] == "mig-2g.20gb"
    assert plan.notes == ("15GiB resolved to MIG profile 2g.20gb",)
    # 1/4 of an A100: 20 GiB and 7/4 compute slices -> 2g.20gb (1g.10gb is too small)
    assert gpu_keys(plan_slice(parse_slice("1/4"), pool, IMAGE)) == {"nvidia.com/mig-2g.20gb": "1"}
    # 3/8 needs 30 GiB: 3g.40gb; nothing offered holds 60 GiB
    assert gpu_keys(plan_slice(parse_slice("3/8"), pool, IMAGE)) == {"nvidia.com/mig-3g.40gb": "1"}
    with pytest.raises(SliceError, match="does not offer 60GiB"):
        plan_slice(parse_slice("60GiB"), pool, IMAGE)
    # a profile the GPU has but the pool does not offer is refused, never planned
    with pytest.raises(SliceError, match="does not offer mig-7g.80gb"):
        plan_slice(parse_slice("mig-7g.80gb"), pool, IMAGE)


def test_clearml_image_plan_sets_the_image_over_the_users():
    pool = make_pool("clearml-image", "T4", ["1/4", "8GiB"])
    plan = plan_slice(parse_slice("1/4"), pool, IMAGE)
    assert plan.image == "clearml/fractional-gpu:u22-cu12.3-4gb"
    assert plan.extra_pod_config == {"hostPID": True}


def test_pool_options_set_the_scheduler_and_tolerations_are_kept():
    toleration = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    pool = make_pool(
        "hami",
        "A100-80GB",
        ["1/2"],
        tolerations=[toleration],
        options={"scheduler_name": "hami-scheduler"},
    )
    plan = plan_slice(parse_slice("1/2"), pool, IMAGE)
    assert plan.scheduler_name == "hami-scheduler"
    assert [dict(t) for t in plan.tolerations] == [toleration]


def test_a_plan_is_shared_read_only_and_a_changed_pool_gets_its_own():
    """plan_slice is memoized: equal slice, pool and image give the same plan, which nobody
    can change in place; a pool whose settings differ (a reloaded catalog) gets its own."""
    toleration = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    pool = make_pool("hami", "A100-80GB", ["1/2"], tolerations=[toleration])
    plan = plan_slice(parse_slice("1/2"), pool, IMAGE)
    assert plan_slice(parse_slice("0.5"), pool, IMAGE) is plan
    none = plan_slice(parse_slice("none"), None, IMAGE)
    mappings = [plan.limits, plan.labels, plan.annotations, plan.env, plan.node_selector]
    mappings += [plan.extra_pod_config, *plan.tolerations, none.env, none.labels]
    for mapping in mappings:
        with pytest.raises(TypeError):
            mapping["example.org/x"] = "y"  # type: ignore[index]

    reloaded = make_pool("hami", "A100-80GB", ["1/2"], node_selector={"zone": "b"})
    assert plan_slice(parse_slice("1/2"), reloaded, IMAGE).node_selector["zone"] == "b"
    assert "zone" not in plan.node_selector and plan.tolerations


# ---------------------------------------------------------------------------------- checks
@pytest.mark.parametrize(
    ("backend", "gpu", "extra", "offer", "message"),
    [
        ("mig-mixed", "A100-40GB", {}, "mig-1g.10gb+me", "no MIG profile 1g.10gb\\+me"),
        ("mig-mixed", "L4", {}, "mig-1g.6gb", "has no MIG profile"),
        ("mig-mixed", "A100-80GB", {}, "1/2", "serves only mig slices"),
        (
            "mig-single",
            "A100-80GB",
            {},
            "mig-1g.10gb+me",
            r"media-extension instances: .* labels such a node '1g\.10gb'.*mig-mixed.*"
            r"\(nvidia\.com/mig-1g\.10gb\.me\)",
        ),
        ("timeslicing", "T4", {"replicas": 4}, "1/2", "can only offer 1/4"),
        ("timeslicing", "T4", {}, "1/4", "replicas"),
        ("timeslicing", "T4", {"replicas": 4}, "4GiB", "serves only fraction"),
        ("mps", "T4", {"replicas": 49}, "1/2", "replicas"),
        ("hami", "H100-80GB", {}, "80GiB", "offer whole GPUs"),
        ("hami", "H100-80GB", {}, "mig-1g.10gb", "serves only"),
        ("hami", "H100-80GB", {"options": {"gpucores": 101}}, "1/2", "gpucores"),
        ("hami", "T4", {"options": {"memory": "percentage"}}, "15GiB", "offer whole GPUs"),
        ("clearml-injector", "T4", {"options": {"gpu_limit": "eighths"}}, "1/16", "1/8"),
        ("clearml-image", "A100-80GB", {}, "16GiB", "largest ClearML image"),
        ("clearml-image", "T4", {"options": {"os": "u18"}}, "4GiB", "no image u18"),
        ("gke-mig", "A100-80GB", {}, "mig-1g.20gb", "GKE partitions"),
        ("gke-timesharing", "L4", {"replicas": 64}, "1/8", "replicas"),
        ("whole", "T4", {}, "1/2", "serves only whole"),
        ("nope", "T4", {}, "1", "unknown backend 'nope'"),
    ],
)
def test_offers_a_backend_cannot_serve_are_refused_at_load(backend, gpu, extra, offer, message):
    with pytest.raises(CatalogError, match=message) as info:
        make_pool(backend, gpu, [offer], **extra)
    assert str(info.value).startswith("pools.p")


def test_clearml_injector_labels_only_the_values_its_docs_list():
    # clearml-docs, fractional GPU injector "Usage": these eight strings, and whole GPUs
    listed = {"0.0625", "0.125", "0.250", "0.375", "0.500", "0.625", "0.750", "0.875"}
    seen = set()
    for n in range(1, 16):
        spec = f"{n}/16"
        raw = {"gpu": "T4", "backend": "clearml-injector", "offers": [spec]}
        data = {"fraction_step": 16, "pools": {"p": raw}, "images": {"i": {"image": "busybox"}}}
        try:
            catalog = load_catalog(data)
        except CatalogError as exc:
            # 3/16, 5/16, ...: refused at load, naming what the injector takes
            assert n % 2 == 1 and n > 1, spec
            assert "takes only 1/16, 1/8, 1/4, 3/8, 1/2, 5/8, 3/4, 7/8" in str(exc)
            continue
        label = plan_slice(parse_slice(spec, step=16), catalog.pools["p"], IMAGE).labels
        seen.add(label["clearml-injector/fraction"])
    assert seen == listed


def test_builtin_registry_without_entry_points():
    for name, target in BUILTIN_BACKENDS.items():
        backend = get_backend(name)
        assert backend.name == name
        assert type(backend).__name__ == target.split(":")[1]
        assert backend.modes <= {"fraction", "memory", "mig", "whole"}
    with pytest.raises(ValueError, match="known backends: mig-mixed"):
        get_backend("mig-magic")


# ---------------------------------------------------------------------------------- safety
def _catalog_pools():
    return [p for path in example_catalogs() for p in load_catalog(path).pools.values()]


POOLS = _catalog_pools()
SPECS = st.one_of(
    st.text(max_size=20),
    st.sampled_from(
        ["1/4", "1/8", "0.5", "10GiB", "20GiB", "15GiB", "mig-1g.10gb", "1g.20gb", "2", "1"]
    ),
    st.integers(-5, 20),
    st.floats(allow_nan=True, allow_infinity=True),
    st.fractions(),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=SPECS, index=st.integers(0, len(POOLS) - 1))
def test_arbitrary_gpu_values_never_plan_what_the_pool_does_not_offer(spec, index):
    pool = POOLS[index]
    offered = {tuple(sorted(gpu_keys(plan_slice(o, pool, None)).items())) for o in pool.offers}
    try:
        requested = parse_slice(spec, step=16)
        plan = plan_slice(requested, pool, None)
    except SliceError:
        return
    if requested.kind == "none":
        assert not plan.limits and not plan.labels
        return
    assert tuple(sorted(gpu_keys(plan).items())) in offered
    assert plan.labels["fracspawner.io/gpu"] in {o.label for o in pool.offers}


@pytest.mark.parametrize("pool", POOLS, ids=[p.name for p in POOLS])
def test_user_env_never_overrides_backend_keys_nor_disables_isolation(pool):
    plan = plan_slice(pool.offers[0], pool, IMAGE)
    hostile = {
        "CUDA_DISABLE_CONTROL": "true",  # HAMi-core bypass (HAMi README)
        "CUDA_DEVICE_MEMORY_LIMIT_0": "999999m",
        "CUDA_DEVICE_SM_LIMIT": "100",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=80G",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100",
        "LD_PRELOAD": "",
        "NVIDIA_VISIBLE_DEVICES": "all",
        "FRACSPAWNER_GPU_MEMORY_MIB": "1",
        "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.99",
        "HOME": "/home/jovyan",
    }
    env = safe_env(hostile, plan)
    assert "CUDA_DISABLE_CONTROL" not in env
    assert not any(k.startswith(("CUDA_DEVICE_", "CUDA_MPS_")) for k in env)
    assert "LD_PRELOAD" not in env and "NVIDIA_VISIBLE_DEVICES" not in env
    assert env["HOME"] == "/home/jovyan"
    for key, value in plan.env.items():
        assert env[key] == value  # the backend's values always win
    if "XLA_PYTHON_CLIENT_MEM_FRACTION" not in plan.env:
        assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.99"  # not reserved: a soft cap only
    # the plan never sets a reserved name other than its own figures: the slice's memory, and
    # an over-committed pool's overcommit (the server waits for room: serverext/swap.py)
    own = {"FRACSPAWNER_GPU_MEMORY_MIB", "FRACSPAWNER_GPU_OVERCOMMIT"}
    assert {k for k in plan.env if is_reserved_env(k)} <= own


def test_reserved_env_names_the_known_bypasses():
    for name in ("CUDA_DISABLE_CONTROL", "LD_PRELOAD", "NVIDIA_VISIBLE_DEVICES"):
        assert name in RESERVED_ENV
    for name in (
        "CUDA_DEVICE_MEMORY_LIMIT",
        "CUDA_DEVICE_MEMORY_LIMIT_3",
        "CUDA_MPS_PIPE_DIRECTORY",
    ):
        assert is_reserved_env(name)
    assert not is_reserved_env("CUDA_HOME")
