"""Hibernation defaults per backend (issue 26, item 2): on only where the GPU memory a hibernated
kernel frees is usable by others (time-slicing, MPS, over-committed pools), off on MIG, whole
GPUs and reserving backends (HAMi, ...) unless the pool over-commits; the catalog may still say
otherwise, and `fracspawner check` warns where it cannot help."""

from __future__ import annotations

import yaml

from fracspawner.backends import load_catalog
from fracspawner.choice.notebook_env import notebook_env
from fracspawner.choice.options import resolve_choice
from fracspawner.model.catalog import AccessRule
from tests.cli_helpers import check_catalog
from tests.conftest import DEMO_CATALOG

MPS = {"gpu": "L40S", "backend": "mps", "replicas": 8, "offers": ["1/8"]}
WHOLE = {"gpu": "A10", "backend": "whole", "offers": ["1"]}
GKE_TS = {"gpu": "L4", "backend": "gke-timesharing", "replicas": 4, "offers": ["1/4"]}


def demo(idle: dict | None = None, **pools) -> dict:
    data = yaml.safe_load(DEMO_CATALOG.read_text())
    data["idle"] = {k: v for k, v in data["idle"].items() if k != "kernel_gpu_hibernate"}
    data["idle"].update(idle or {})
    for name, value in pools.items():
        data["pools"][name] = value
    return data


def hibernate_after(catalog, pool: str) -> float | None:
    return catalog.idle_for(pool).kernel_gpu_hibernate


def test_on_only_where_the_freed_memory_is_usable_by_others():
    data = demo(mps=MPS, whole=WHOLE, gke=GKE_TS)
    hami2 = dict(data["pools"]["h100"], overcommit=2)  # HAMi over-committed: swap needs it
    data["pools"]["h100x2"] = hami2
    cat = load_catalog(data)
    assert hibernate_after(cat, "t4") == 600  # time-slicing: memory shared
    assert hibernate_after(cat, "mps") == 600
    assert hibernate_after(cat, "gke") == 600
    assert hibernate_after(cat, "h100x2") == 600
    assert hibernate_after(cat, "h100") is None  # HAMi reserves the slice for its pod
    assert hibernate_after(cat, "a100-mig") is None  # MIG: a partition (and #42)
    assert hibernate_after(cat, "whole") is None
    assert cat.idle.kernel_gpu_hibernate is None  # no pool: nothing to free
    # what the notebook is told (and so what its server does)
    choice = resolve_choice(cat, {"gpu": "1/4", "pool": "h100"}, rule=AccessRule())
    assert notebook_env(choice, cat)["FRACSPAWNER_KERNEL_GPU_HIBERNATE_SECONDS"] == "0"
    choice = resolve_choice(cat, {"gpu": "1/4", "pool": "t4"}, rule=AccessRule())
    assert notebook_env(choice, cat)["FRACSPAWNER_KERNEL_GPU_HIBERNATE_SECONDS"] == "600"


def test_the_catalog_can_still_say_otherwise():
    cat = load_catalog(demo({"kernel_gpu_hibernate": "5m"}))  # catalog-wide: every pool
    assert hibernate_after(cat, "h100") == hibernate_after(cat, "t4") == 300
    data = demo()
    data["pools"]["h100"]["idle"] = {"kernel_gpu_hibernate": "15m"}
    data["pools"]["t4"]["idle"] = {"kernel_gpu_hibernate": "off", "kernel_gpu_idle": "20m"}
    cat = load_catalog(data)
    assert hibernate_after(cat, "h100") == 900
    assert hibernate_after(cat, "t4") is None
    assert cat.idle_for("t4").kernel_gpu_idle == 1200
    data = demo()
    data["pools"]["h100"]["idle"] = {"kernel_gpu_idle": "20m"}  # other keys: default stays
    cat = load_catalog(data)
    assert hibernate_after(cat, "h100") is None and cat.idle_for("h100").kernel_gpu_idle == 1200


def test_check_warns_where_hibernation_cannot_help(tmp_path):
    result = check_catalog(tmp_path, demo({"kernel_gpu_hibernate": "10m"}))
    assert result.returncode == 0, result  # a warning, not a mistake
    out = result.stdout
    assert "the catalog is fine, with 2 warnings:" in out
    assert (
        "  warning: idle.kernel_gpu_hibernate: hibernation cannot help on pool 'h100' (hami): "
        "the hami backend reserves a slice's GPU memory for its pod" in out
    )
    assert "pool 'a100-mig' (mig-mixed): a MIG instance is a hardware partition" in out
    assert "'t4'" not in out  # time-sliced: it helps there
    # per pool, and an over-committed HAMi pool is fine
    data = demo()
    data["pools"]["h100"]["idle"] = {"kernel_gpu_hibernate": "10m"}
    out = check_catalog(tmp_path, data).stdout
    assert "warning: pools.h100.idle.kernel_gpu_hibernate: hibernation cannot help" in out
    data["pools"]["h100"]["overcommit"] = 2
    out = check_catalog(tmp_path, data).stdout
    assert "hibernation cannot help" not in out, out  # (its eighths: test_check.py's warning)


def test_check_warns_where_hami_s_task_slots_cap_the_slices_per_gpu(tmp_path):
    # HAMi schedules at most deviceSplitCount pods on a GPU (10 by default, its chart's
    # values.yaml): the demo's eighths fit 8 on a GPU, 16 once over-committed twice
    data = demo()
    assert "1/8" in [str(o) for o in data["pools"]["h100"]["offers"]]
    out = check_catalog(tmp_path, data).stdout
    assert "deviceSplitCount" not in out and out.strip().endswith("the catalog is fine."), out
    data["pools"]["h100"]["overcommit"] = 2
    result = check_catalog(tmp_path, data)
    assert result.returncode == 0, result  # a warning, not a mistake
    assert (
        "warning: pools.h100: 16 slices of 1/8 over-committed 2 times fit on one GPU, but HAMi "
        "schedules at most deviceSplitCount pods on a GPU (10 by default): set "
        "devicePlugin.deviceSplitCount to at least 16 in HAMi's chart for these nodes, or the "
        "last 6 slices of each GPU never start" in result.stdout
    ), result.stdout
    # time-slicing's replicas are its own count: no such cap
    data["pools"]["t4"]["overcommit"] = 2
    assert "pools.t4: " not in check_catalog(tmp_path, data).stdout
