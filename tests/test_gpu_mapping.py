"""Mapping a slice onto a GPU model (issue 14, item 8): a MIG profile counts out of the
model's own compute slices (4 on an A30), the form's SM figure is the profile's own, and a
Volcano pool counts fractions stated as percentages."""

from __future__ import annotations

import pytest

from fracspawner.backends import load_catalog
from fracspawner.choice.offers import build_offer_model
from fracspawner.choice.options import OptionsError, resolve_choice
from fracspawner.model.catalog import AccessRule
from fracspawner.model.errors import CatalogError

IMAGES = {"base": {"image": "busybox"}}
CATALOG = load_catalog(
    {
        "pools": {
            "a30": {
                "gpu": "A30-24GB",
                "backend": "mig-mixed",
                "offers": ["mig-1g.6gb", "mig-2g.12gb", "mig-4g.24gb"],
            },
            "h100-mig": {"gpu": "H100-80GB", "backend": "mig-mixed", "offers": ["mig-1g.10gb"]},
        },
        "images": IMAGES,
    }
)
HALF_A_GPU = AccessRule(pools=None, max_gpu=0.5)


def offers_of(pool: str) -> dict[str, dict]:
    model = build_offer_model(CATALOG, rule=AccessRule(), used_gpu=0)
    (entry,) = [p for p in model["pools"] if p["name"] == pool]
    return {o["spec"]: o for o in entry["offers"]}


def compute(offer: dict) -> str:
    """The offer's SM line, shown under Details (the summary has none)."""
    (line,) = [d for d in offer["details"] if d.startswith("Compute:")]
    return line


def test_a30_profiles_are_quarters_halves_and_a_whole_gpu():
    offers = offers_of("a30")
    assert {s: o["gpu_equivalent"] for s, o in offers.items()} == {
        "mig-1g.6gb": 0.25,
        "mig-2g.12gb": 0.5,
        "mig-4g.24gb": 1.0,
    }
    # 14 SMs per A30 compute slice (NVIDIA MIG user guide), not 56 x 1/7
    assert compute(offers["mig-1g.6gb"]).startswith("Compute: 14 of 56 SMs (")
    assert compute(offers["mig-4g.24gb"]).startswith("Compute: 56 of 56 SMs (")


def test_a_profiles_sm_count_is_its_own():
    # nvidia-smi mig -lgip on an H100: 16 SMs in a 1g.10gb, where 132 / 7 would say 19
    offer = offers_of("h100-mig")["mig-1g.10gb"]
    assert compute(offer).startswith("Compute: 16 of 132 SMs (")
    assert "SMs" not in offer["summary"]  # plain words first, SMs on demand (issue 13 #8)


def test_a30_quota_counts_its_own_compute_slices():
    choice = resolve_choice(CATALOG, {"gpu": "mig-2g.12gb"}, rule=HALF_A_GPU)
    assert choice.plan.gpu_equivalent == 0.5
    assert choice.plan.annotations["fracspawner.io/gpu-equivalent"] == "0.5"
    with pytest.raises(OptionsError) as info:
        resolve_choice(CATALOG, {"gpu": "mig-4g.24gb"}, rule=HALF_A_GPU)
    assert "4g.24gb (1 GPU)" in str(info.value)  # all of an A30, not 4/7 of it


def custom(**gpu) -> dict:
    model = {"name": "Custom-24GB", "memory_mib": 24576, **gpu}
    pool = {"gpu": model, "backend": "mig-mixed", "offers": ["mig-1g.6gb"]}
    return {"pools": {"c": pool}, "images": IMAGES}


def test_a_described_gpu_says_how_many_compute_slices_it_has():
    profiles = {"1g.6gb": {"memory_mib": 6144}, "4g.24gb": {"memory_mib": 24576}}
    catalog = load_catalog(custom(mig_compute_slices=4, mig_profiles=profiles))
    pool = catalog.pools["c"]
    assert pool.gpu.mig_profiles["1g.6gb"].max_instances == 4
    plan = resolve_choice(catalog, {"gpu": "mig-1g.6gb"}, rule=AccessRule()).plan
    assert plan.gpu_equivalent == 0.25
    with pytest.raises(CatalogError, match=r"7g.24gb: 7 compute slices, but the GPU has 4"):
        load_catalog(custom(mig_compute_slices=4, mig_profiles={"7g.24gb": {"memory_mib": 1}}))


def test_a_described_gpus_nvml_memory_is_what_fractions_share():
    data = {
        "pools": {
            "v": {
                "gpu": {"name": "X-80GB", "memory_mib": 81920, "nvml_memory_mib": 80000},
                "backend": "hami",
                "offers": ["1/4", "10GiB"],
            }
        },
        "images": IMAGES,
    }
    catalog = load_catalog(data)
    quarter = resolve_choice(catalog, {"gpu": "1/4"}, rule=AccessRule()).plan
    assert quarter.limits["nvidia.com/gpumem-percentage"] == "25"
    assert quarter.memory_mib == 20000
    ten = resolve_choice(catalog, {"gpu": "10GiB"}, rule=AccessRule()).plan
    assert ten.limits["nvidia.com/gpumem"] == "10240" and ten.gpu_equivalent == 0.125


def test_volcano_counts_fractions_stated_as_percentages():
    from fracspawner.capacity import compute_capacity

    catalog = load_catalog(
        {
            "pools": {
                "v": {
                    "gpu": "H100-80GB",
                    "backend": "volcano",
                    "node_selector": {"pool": "v"},
                    "offers": ["1/8", "1/4", "10GiB", "1"],
                }
            },
            "images": IMAGES,
        }
    )
    # two H100s, 10 vGPUs each; the plugin publishes vgpu-number and vgpu-memory only
    gpus = {
        "metadata": {
            "name": "volcano-1",
            "labels": {
                "pool": "v",
                "nvidia.com/gpu.count": "2",
                "nvidia.com/gpu.memory": "81559",
            },
        },
        "spec": {},
        "status": {
            "allocatable": {"volcano.sh/vgpu-number": "20", "volcano.sh/vgpu-memory": "163118"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }

    def pod(name: str, limits: dict) -> dict:
        return {
            "metadata": {"name": name, "namespace": "jhub", "uid": name},
            "spec": {"nodeName": "volcano-1", "containers": [{"resources": {"limits": limits}}]},
            "status": {"phase": "Running"},
        }

    def counts(pods: list) -> dict:
        capacity = compute_capacity(catalog, [gpus], pods)
        return {spec: (c.free, c.total) for spec, c in capacity.pools["v"].items()}

    # empty: eight quarters (25% each), sixteen eighths (12%), two whole GPUs; 10 GiB is
    # 12.6% of 81559 MiB, so fifteen of those
    assert counts([]) == {"1/8": (16, 16), "1/4": (8, 8), "10GiB": (15, 15), "1": (2, 2)}
    half = {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory-percentage": "50"}
    ten = {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "10240"}
    got = counts([pod("a", half), pod("b", ten)])
    # 200% - 50% - 12.6% leaves 137.4%: five quarters, one whole GPU by node totals
    assert got["1/4"] == (5, 8) and got["1"] == (1, 2)
