"""compute_capacity for every backend family, from raw node and pod dicts like the API's."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fracspawner.backends import load_catalog, plan_slice
from fracspawner.capacity import Capacity, OfferCapacity, compute_capacity

CATALOG = {
    "pools": {
        "a100-mig": {
            "gpu": "A100-80GB",
            "backend": "mig-mixed",
            "node_selector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
            "offers": ["mig-1g.10gb", "mig-3g.40gb"],
        },
        "t4": {
            "gpu": "T4",
            "backend": "timeslicing",
            "replicas": 4,
            "node_selector": {"nvidia.com/gpu.product": "Tesla-T4-SHARED"},
            "offers": ["1/4"],
        },
        "h100": {
            "gpu": "H100-80GB",
            "backend": "hami",
            "node_selector": {"gpu": "on"},
            "offers": ["1/4", "1"],
        },
        "runai": {
            "gpu": "A100-80GB",
            "backend": "runai",
            "node_selector": {"example.org/pool": "runai"},
            "offers": ["1/4", "1/2", "1"],
        },
        "clearml": {
            "gpu": "A100-80GB",
            "backend": "clearml-injector",
            "node_selector": {"example.org/pool": "clearml"},
            "offers": ["1/8", "1/2"],
        },
        "whole": {
            "gpu": "A100-80GB",
            "backend": "whole",
            "node_selector": {"example.org/pool": "whole"},
            "offers": ["1", "2"],
        },
    },
    "images": {"base": {"image": "quay.io/jupyter/base-notebook:latest", "default": True}},
}
# devmem: what NVML reports for an H100 80GB HBM3 and HAMi registers (was a nominal 81920)
H100_REGISTER = (
    '[{"id":"GPU-0","index":0,"count":10,"devmem":81559,"devcore":100,'
    '"type":"NVIDIA-NVIDIA H100 80GB HBM3","health":true,"mode":"hami-core"},'
    '{"id":"GPU-1","index":1,"count":10,"devmem":81559,"devcore":100,'
    '"type":"NVIDIA-NVIDIA H100 80GB HBM3","health":true,"mode":"hami-core"}]'
)
_names = itertools.count()


@pytest.fixture(scope="module")
def catalog():
    return load_catalog(CATALOG)


def serving_labels(catalog, pool_name: str) -> dict[str, str]:
    """Labels that satisfy the pool's and every offer plan's node selector."""
    pool = catalog.pools[pool_name]
    out = dict(pool.node_selector)
    for offer in pool.offers:
        out.update(plan_slice(offer, pool, None).node_selector)
    return out


def plan_resource(catalog, pool_name: str, spec: str) -> str:
    """The extended resource the backend's plan asks for (e.g. nvidia.com/gpu.shared)."""
    pool = catalog.pools[pool_name]
    offer = next(o for o in pool.offers if str(o) == spec)
    (name,) = [k for k in plan_slice(offer, pool, None).limits if k.startswith("nvidia.com/")]
    return name


def node(
    labels,
    allocatable=None,
    *,
    annotations=None,
    taints=None,
    unschedulable=False,
    ready=True,
    name=None,
):
    return {
        "metadata": {
            "name": name or f"node-{next(_names)}",
            "labels": dict(labels),
            "annotations": dict(annotations or {}),
        },
        "spec": {"taints": list(taints or []), "unschedulable": unschedulable},
        "status": {
            "allocatable": {"cpu": "64", "memory": "512Gi", **(allocatable or {})},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def pod(on, limits=None, *, phase="Running", labels=None, annotations=None, ns="jhub"):
    return {
        "metadata": {
            "name": f"pod-{next(_names)}",
            "namespace": ns,
            "uid": f"uid-{next(_names)}",
            "labels": dict(labels or {}),
            "annotations": dict(annotations or {}),
        },
        "spec": {
            "nodeName": on["metadata"]["name"] if on else None,
            "containers": [{"name": "notebook", "resources": {"limits": dict(limits or {})}}],
        },
        "status": {"phase": phase},
    }


def counts(capacity: Capacity, pool: str) -> dict[str, tuple[int | None, int | None]]:
    return {spec: (c.free, c.total) for spec, c in capacity.pools[pool].items()}


# ----------------------------------------------------------------------------- per backend
def test_mig_mixed_counts_each_profile_resource(catalog):
    labels = serving_labels(catalog, "a100-mig")
    gpu = {"nvidia.com/mig-1g.10gb": "4", "nvidia.com/mig-3g.40gb": "1"}
    a = node(labels, gpu)
    b = node(labels, gpu)
    pods = [pod(a, {"nvidia.com/mig-1g.10gb": "1"}), pod(b, {"nvidia.com/mig-3g.40gb": "1"})]
    capacity = compute_capacity(catalog, [a, b], pods)
    assert counts(capacity, "a100-mig") == {"mig-1g.10gb": (7, 8), "mig-3g.40gb": (1, 2)}


def test_timeslicing_counts_replicas(catalog):
    resource = plan_resource(catalog, "t4", "1/4")
    t4 = node(serving_labels(catalog, "t4"), {resource: "8"})  # 2 T4s x 4 replicas
    pods = [pod(t4, {resource: "1"}), pod(t4, {resource: "1"})]
    assert counts(compute_capacity(catalog, [t4], pods), "t4") == {"1/4": (6, 8)}


def test_hami_fits_per_device_from_its_annotations(catalog):
    h100 = node(
        serving_labels(catalog, "h100"),
        {"nvidia.com/gpu": "20"},
        annotations={"hami.io/node-nvidia-register": H100_REGISTER},
    )
    # a pod HAMi placed on GPU-0 with half its memory (50% of 81559) and half the cores
    holder = pod(
        h100,
        {
            "nvidia.com/gpu": "1",
            "nvidia.com/gpumem-percentage": "50",
            "nvidia.com/gpucores": "50",
        },
        annotations={"hami.io/vgpu-devices-allocated": "GPU-0,NVIDIA,40779,50:;"},
    )
    capacity = compute_capacity(catalog, [h100], [holder])
    # 1/4 = 25%: two more on GPU-0, four on GPU-1; a whole GPU only on the untouched GPU-1
    assert counts(capacity, "h100") == {"1/4": (6, 8), "1": (1, 2)}
    assert "HAMi per-device fit" in capacity.get("h100", "1/4").note


def test_hami_node_without_registration_is_unknown(catalog):
    h100 = node(serving_labels(catalog, "h100"), {"nvidia.com/gpu": "20"})
    got = compute_capacity(catalog, [h100], []).get("h100", "1/4")
    assert (got.free, got.total) == (None, None)
    assert "hami.io/node-nvidia-register" in got.note


def test_runai_fractions_fill_gpu_sharing_groups(catalog):
    gpus = node(
        {**serving_labels(catalog, "runai"), "nvidia.com/gpu.count": "2"},
        {"nvidia.com/gpu": "2"},
    )
    group = {"runai-gpu-group": "g-1"}
    pods = [
        # Run:ai's reservation pod holds the shared GPU; the fractional pod joins its group
        pod(gpus, {"nvidia.com/gpu": "1"}, labels=group, ns="runai-reservation"),
        pod(gpus, labels=group, annotations={"gpu-fraction": "0.5"}),
    ]
    capacity = compute_capacity(catalog, [gpus], pods)
    assert counts(capacity, "runai") == {"1/4": (6, 8), "1/2": (3, 4), "1": (1, 2)}


def test_clearml_injector_labels_against_node_gpu_count(catalog):
    labels = {**serving_labels(catalog, "clearml"), "nvidia.com/gpu.count": "1"}
    gpu = node({**labels, "nvidia.com/gpu.replicas": "8"}, {"nvidia.com/gpu": "8"})
    pods = [pod(gpu, {"nvidia.com/gpu": "2"}, labels={"clearml-injector/fraction": "0.250"})]
    assert counts(compute_capacity(catalog, [gpu], pods), "clearml") == {
        "1/8": (6, 8),
        "1/2": (1, 2),
    }


def test_whole_gpus_and_succeeded_pods_free_capacity(catalog):
    gpus = node(serving_labels(catalog, "whole"), {"nvidia.com/gpu": "4"})
    running = pod(gpus, {"nvidia.com/gpu": "1"})
    finished = pod(gpus, {"nvidia.com/gpu": "2"}, phase="Succeeded")
    failed = pod(gpus, {"nvidia.com/gpu": "1"}, phase="Failed")
    pending = pod(None, {"nvidia.com/gpu": "4"}, phase="Pending")  # not bound: holds nothing
    capacity = compute_capacity(catalog, [gpus], [running, finished, failed, pending])
    assert counts(capacity, "whole") == {"1": (3, 4), "2": (1, 2)}
    deleting = pod(gpus, {"nvidia.com/gpu": "2"})
    deleting["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    assert counts(compute_capacity(catalog, [gpus], [running, deleting]), "whole") == {
        "1": (1, 4),
        "2": (0, 2),
    }


# ----------------------------------------------------------------------------- which nodes
@pytest.mark.parametrize(
    "change",
    [
        {"taints": [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]},
        {"taints": [{"key": "dedicated", "value": "ml", "effect": "NoExecute"}]},
        {"unschedulable": True},
        {"ready": False},
    ],
)
def test_nodes_that_cannot_take_the_pod_do_not_count(catalog, change):
    labels = serving_labels(catalog, "whole")
    good = node(labels, {"nvidia.com/gpu": "4"})
    bad = node(labels, {"nvidia.com/gpu": "4"}, **change)
    assert counts(compute_capacity(catalog, [good, bad], []), "whole")["1"] == (4, 4)


def test_a_tolerated_taint_and_a_soft_taint_keep_the_node():
    raw = {**CATALOG, "pools": {"whole": dict(CATALOG["pools"]["whole"])}}
    raw["pools"]["whole"]["tolerations"] = [
        {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
    ]
    catalog = load_catalog(raw)
    labels = serving_labels(catalog, "whole")
    tainted = node(
        labels,
        {"nvidia.com/gpu": "4"},
        taints=[{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}],
    )
    soft = node(
        labels, {"nvidia.com/gpu": "2"}, taints=[{"key": "x", "effect": "PreferNoSchedule"}]
    )
    assert counts(compute_capacity(catalog, [tainted, soft], []), "whole")["1"] == (6, 6)


def test_nodes_with_other_labels_do_not_serve_the_pool(catalog):
    other = node({"example.org/pool": "elsewhere"}, {"nvidia.com/gpu": "4"})
    got = compute_capacity(catalog, [other], []).get("whole", "1")
    assert (got.free, got.total) == (0, 0)


def test_node_publishing_nothing_usable_is_unknown(catalog):
    bare = node(serving_labels(catalog, "a100-mig"))  # GFD labels, but no MIG resources yet
    got = compute_capacity(catalog, [bare], []).get("a100-mig", "mig-1g.10gb")
    assert (got.free, got.total) == (None, None)
    assert "nvidia.com/mig-1g.10gb" in got.note


def test_no_nodes_and_unknown_names_are_unknown(catalog):
    capacity = compute_capacity(catalog, [], [])
    assert capacity.nodes_seen == 0
    assert capacity.get("whole", "1") == OfferCapacity(None, None, "no nodes visible")
    assert capacity.get("nope", "1") == OfferCapacity(None, None)
    assert capacity.get("whole", "7/8") == OfferCapacity(None, None)


# ----------------------------------------------------------------------------- invariants
_pool_names = ["a100-mig", "t4", "h100", "runai", "clearml", "whole"]
_resources = ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb"]


@st.composite
def clusters(draw):
    nodes = []
    for _ in range(draw(st.integers(1, 4))):
        pool = draw(st.sampled_from(_pool_names))
        alloc = {
            r: str(draw(st.integers(0, 8))) for r in draw(st.sets(st.sampled_from(_resources)))
        }
        nodes.append((pool, alloc, draw(st.booleans())))
    pods = []
    for _ in range(draw(st.integers(0, 12))):
        pods.append(
            (
                draw(st.integers(0, len(nodes) - 1)),
                {
                    r: str(draw(st.integers(0, 9)))
                    for r in draw(st.sets(st.sampled_from(_resources)))
                },
                draw(st.sampled_from(["Running", "Pending", "Succeeded", "Failed"])),
                draw(st.sampled_from([{}, {"gpu-fraction": "0.75"}, {"gpu-fraction": "bad"}])),
                draw(
                    st.sampled_from(
                        [{}, {"runai-gpu-group": "g"}, {"clearml-injector/fraction": "0.5"}]
                    )
                ),
                draw(
                    st.sampled_from(
                        [
                            None,
                            "GPU-0,NVIDIA,81559,100:",
                            "GPU-1,NVIDIA,70000,10:GPU-0,NVIDIA,1,1:",
                            "junk",
                        ]
                    )
                ),
            )
        )
    return nodes, pods


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(clusters())
def test_free_is_never_negative_nor_above_total(catalog, cluster):
    raw_nodes, raw_pods = cluster
    nodes = [
        node(
            {**serving_labels(catalog, pool), "nvidia.com/gpu.count": "2"},
            alloc,
            annotations={"hami.io/node-nvidia-register": H100_REGISTER} if hami_ok else {},
        )
        for pool, alloc, hami_ok in raw_nodes
    ]
    pods = [
        pod(
            nodes[i],
            limits,
            phase=phase,
            labels=labels,
            annotations={**annos, **({"hami.io/vgpu-devices-allocated": alloc} if alloc else {})},
        )
        for i, limits, phase, annos, labels, alloc in raw_pods
    ]
    capacity = compute_capacity(catalog, nodes, pods)
    for pool in capacity.pools.values():
        for c in pool.values():
            assert (c.free is None) == (c.total is None)
            if c.free is not None:
                assert 0 <= c.free <= c.total
