"""Catalog `overcommit` (issue 26 item 3): what a pool that commits more GPU memory than its GPUs
have puts on its pods, how its capacity is counted, and where it is refused.

A time-sliced pool with `replicas: 4, overcommit: 2` still offers "1/4" (a quarter of the GPU's
memory, its quota and soft caps a quarter), but the device plugin advertises each GPU 8 times:
the pod selects nodes labelled `nvidia.com/gpu.replicas=8` and the capacity count sees 8 per GPU,
so the picker and the scheduler agree. HAMi over-commits with its device plugin's
deviceMemoryScaling (a GPU of M MiB registers S x M): a "1/4" then asks 12 % of the registered
memory, a quarter of the physical GPU, and eight fit per GPU by HAMi's own bookkeeping.
"""

from __future__ import annotations

import copy
import json

import pytest

from fracspawner.backends import backend_names, check_pool, load_catalog, plan_slice
from fracspawner.capacity import compute_capacity
from fracspawner.model.check import catalog_problems
from fracspawner.model.errors import CatalogError
from fracspawner.model.slices import parse_slice
from tests.test_capacity import counts, node, pod

BASE = {
    "pools": {
        "t4": {
            "gpu": "T4",
            "backend": "timeslicing",
            "replicas": 4,
            "overcommit": 2,
            "node_selector": {"nvidia.com/gpu.product": "Tesla-T4-SHARED"},
            "offers": ["1/4"],
        },
        "h100": {
            "gpu": "H100-80GB",
            "backend": "hami",
            "overcommit": 2,
            "node_selector": {"gpu": "on"},
            "offers": ["1/4", "1/8", "10GiB"],
        },
    }
}
T4_MIB = 15360  # NVML's total for a T4 (fracspawner.model.gpumodels)
H100_MIB = 81559  # NVML's total for an H100 80GB HBM3


def register(devmem: int, gpus: int = 1) -> str:
    """HAMi's node registration (hami.io/node-nvidia-register) of `gpus` H100s, each
    registering `devmem` MiB: NVML's total x deviceMemoryScaling (register.go)."""
    return json.dumps(
        [
            {"id": f"GPU-{i}", "index": i, "count": 10, "devmem": devmem, "devcore": 100,
             "type": "NVIDIA-NVIDIA H100 80GB HBM3", "health": True, "mode": "hami-core"}
            for i in range(gpus)
        ]
    )  # fmt: skip


@pytest.fixture(scope="module")
def catalog():
    return load_catalog(BASE)


def test_time_sliced_quarter_over_committed_twice_selects_nodes_with_eight_replicas(catalog):
    pool = catalog.pools["t4"]
    assert pool.overcommit == 2
    plan = plan_slice(parse_slice("1/4"), pool, None)
    assert plan.limits == {"nvidia.com/gpu": "1"}
    # GFD labels a node with the device plugin's replicas: 4 x 2
    assert plan.node_selector["nvidia.com/gpu.replicas"] == "8"
    # what the slice entitles to is still a quarter: quota, memory and the soft caps
    assert plan.gpu_equivalent == 0.25
    assert plan.annotations["fracspawner.io/gpu-memory-mib"] == str(T4_MIB // 4)
    assert plan.env["FRACSPAWNER_GPU_MEMORY_MIB"] == str(T4_MIB // 4)
    assert plan.env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.25"
    # the server is told: a resume refused for want of room waits for a swap (serverext/swap.py)
    assert plan.env["FRACSPAWNER_GPU_OVERCOMMIT"] == "2.0"


def test_eight_quarters_fit_on_one_over_committed_gpu_and_the_count_says_so(catalog):
    plan = plan_slice(parse_slice("1/4"), catalog.pools["t4"], None)
    labels = {**catalog.pools["t4"].node_selector, **plan.node_selector}
    t4 = node({**labels, "nvidia.com/gpu.count": "1"}, {"nvidia.com/gpu": "8"})
    pods = [pod(t4, {"nvidia.com/gpu": "1"}) for _ in range(5)]
    assert counts(compute_capacity(catalog, [t4], pods), "t4") == {"1/4": (3, 8)}
    # a node the device plugin slices 4 ways is not what the pool's pods ask for
    plain = node({**labels, "nvidia.com/gpu.replicas": "4"}, {"nvidia.com/gpu": "4"})
    assert counts(compute_capacity(catalog, [plain], []), "t4") == {"1/4": (0, 0)}


def test_hami_over_committed_asks_its_share_of_the_scaled_memory(catalog):
    pool = catalog.pools["h100"]
    quarter = plan_slice(parse_slice("1/4"), pool, None)
    # 25 % of the physical GPU is 12 % of the twice-as-large registered memory, whole percents
    assert quarter.limits["nvidia.com/gpumem-percentage"] == "12"
    assert quarter.limits["nvidia.com/gpucores"] == "12"
    assert quarter.annotations["fracspawner.io/gpu-memory-mib"] == str(2 * H100_MIB * 12 // 100)
    assert "12% of 2 x the GPU's memory" in quarter.notes[0]
    assert plan_slice(parse_slice("1/8"), pool, None).limits["nvidia.com/gpumem-percentage"] == "6"
    # a memory size is a size: 10 GiB whatever the scaling
    assert plan_slice(parse_slice("10GiB"), pool, None).limits["nvidia.com/gpumem"] == "10240"


def test_hami_counts_eight_quarters_per_gpu_registered_with_memory_scaling_two(catalog):
    labels = dict(catalog.pools["h100"].node_selector)
    scaled = node(
        labels,
        {"nvidia.com/gpu": "20"},
        annotations={"hami.io/node-nvidia-register": register(2 * H100_MIB, gpus=2)},
    )
    got = counts(compute_capacity(catalog, [scaled], []), "h100")
    assert got["1/4"] == (16, 16)


@pytest.mark.parametrize(
    "pool, message",
    [
        (
            {"gpu": "A100-80GB", "backend": "mig-mixed", "offers": ["mig-1g.10gb"]},
            "the mig-mixed backend cannot over-commit GPU memory: MIG instances are fixed in "
            "hardware",
        ),
        (
            {"gpu": "A100-80GB", "backend": "whole", "offers": ["1"]},
            "the whole backend cannot over-commit GPU memory: a whole GPU is one server's",
        ),
        (
            {"gpu": "A100-80GB", "backend": "mps", "replicas": 4, "offers": ["1/4"]},
            "the mps backend cannot over-commit GPU memory: MPS limits each client to the GPU's "
            "memory / the device plugin's replicas",
        ),
        (
            {"gpu": "A100-80GB", "backend": "runai", "offers": ["1/4"]},
            "the runai backend cannot over-commit GPU memory: Run:ai over-commits with its own "
            "GPU memory swap",
        ),
        (
            {
                "gpu": "T4",
                "backend": "timeslicing",
                "replicas": 2,
                "overcommit": 1.25,
                "offers": ["1/2"],
            },
            "replicas x overcommit (2 x 1.25) must be a whole number",
        ),
        (
            {
                "gpu": "L4",
                "backend": "gke-timesharing",
                "replicas": 8,
                "overcommit": 8,
                "offers": ["1/8"],
            },
            "replicas x overcommit is 64, above the 48 clients per GPU gke-timesharing allows",
        ),
    ],
    ids=["mig", "whole", "mps", "runai", "fractional-replicas", "gke-max-clients"],
)
def test_overcommit_is_refused_where_it_cannot_work_with_the_path_and_why(pool, message):
    data = {"pools": {"p": {"overcommit": 2, **pool}}}
    plain = {k: v for k, v in pool.items() if k != "overcommit"}
    with pytest.raises(CatalogError) as caught:  # the hub's start-up
        load_catalog(data)
    assert str(caught.value).startswith("pools.p.overcommit: ")
    assert message in str(caught.value)
    # `fracspawner check`: the same words, with the path
    (problem,) = catalog_problems(data, check_pool, backend_names())
    assert problem.startswith("pools.p.overcommit: ") and message in problem
    # without overcommit the same pool is fine
    assert catalog_problems({"pools": {"p": plain}}, check_pool, backend_names()) == []


@pytest.mark.parametrize("value", [0.5, 0, 9, "2", True])
def test_overcommit_outside_one_to_eight_is_a_schema_error(value):
    data = copy.deepcopy(BASE)
    data["pools"]["t4"]["overcommit"] = value
    problems = catalog_problems(data, check_pool, backend_names())
    assert problems and problems[0].startswith("pools.t4.overcommit: "), problems


def test_no_overcommit_is_one_and_changes_nothing():
    data = copy.deepcopy(BASE)
    del data["pools"]["t4"]["overcommit"]
    pool = load_catalog(data).pools["t4"]
    assert pool.overcommit == 1
    plan = plan_slice(parse_slice("1/4"), pool, None)
    assert plan.node_selector["nvidia.com/gpu.replicas"] == "4"
    assert "FRACSPAWNER_GPU_OVERCOMMIT" not in plan.env
