"""kernel_gpu_idle defaults per backend (issue 26, items 2 and 5), by the same rule as
kernel_gpu_hibernate's (test_hibernation_defaults.py): an idle kernel is shut down after 30 min
only where the GPU memory it frees is usable by others (time-slicing, MPS, over-committed
pools); on reserving backends (HAMi, ...), MIG and whole GPUs its slice stays its pod's, so a
shut-down disrupts its user for no co-tenant's gain and is off unless the catalog says so.
`fracspawner check` warns where the catalog does."""

from __future__ import annotations

import yaml

from fracspawner.backends import load_catalog
from fracspawner.choice.notebook_env import notebook_env
from fracspawner.choice.options import resolve_choice
from fracspawner.culler import Culler, ServerFacts
from fracspawner.model.catalog import AccessRule
from tests.cli_helpers import check_catalog
from tests.conftest import DEMO_CATALOG

M = 60.0
MPS = {"gpu": "L40S", "backend": "mps", "replicas": 8, "offers": ["1/8"]}
WHOLE = {"gpu": "A10", "backend": "whole", "offers": ["1"]}
GKE_TS = {"gpu": "L4", "backend": "gke-timesharing", "replicas": 4, "offers": ["1/4"]}


def demo(idle: dict | None = None, **pools) -> dict:
    """The demo catalog without the per-backend keys in its idle section, plus `idle` and
    `pools`."""
    data = yaml.safe_load(DEMO_CATALOG.read_text())
    keep = ("kernel_gpu_idle", "kernel_gpu_hibernate")
    data["idle"] = {k: v for k, v in data["idle"].items() if k not in keep}
    data["idle"].update(idle or {})
    data["pools"].update(pools)
    return data


def kernel_idle(catalog, pool: str) -> float | None:
    return catalog.idle_for(pool).kernel_gpu_idle


def told(catalog, pool: str, offer: str = "1/4") -> str:
    """What a notebook on this pool is told (and so what its server does)."""
    choice = resolve_choice(catalog, {"gpu": offer, "pool": pool}, rule=AccessRule())
    return notebook_env(choice, catalog)["FRACSPAWNER_KERNEL_GPU_IDLE_SECONDS"]


def test_kernels_are_shut_down_only_where_the_freed_memory_is_usable_by_others(tmp_path):
    data = demo(mps=MPS, whole=WHOLE, gke=GKE_TS)
    data["pools"]["h100x2"] = dict(data["pools"]["h100"], overcommit=2)  # HAMi, over-committed
    cat = load_catalog(data)
    assert kernel_idle(cat, "t4") == 30 * M  # time-slicing: memory shared
    assert kernel_idle(cat, "mps") == kernel_idle(cat, "gke") == 30 * M
    assert kernel_idle(cat, "h100x2") == 30 * M  # over-committed: others use what it frees
    assert kernel_idle(cat, "h100") is None  # HAMi keeps the slice for its pod
    assert kernel_idle(cat, "a100-mig") is None  # a hardware partition
    assert kernel_idle(cat, "whole") is None
    assert told(cat, "h100") == "0" and told(cat, "t4") == "1800"
    assert told(cat, "h100x2") == "1800" and told(cat, "a100-mig", "mig-1g.10gb") == "0"
    # the culler reads the same policy for the kernels servers report they shut down
    path = tmp_path / "catalog.yaml"
    path.write_text(yaml.safe_dump(data))
    culler = Culler(api_token="x")
    culler.initialize([f"--catalog={path}"])

    def culler_limit(options: dict) -> float | None:
        facts = ServerFacts("ann", user_options=options, started=0.0, last_activity=0.0)
        return culler.policy_for(facts).policy.kernel_gpu_idle

    assert culler_limit({"gpu": "1/4", "pool": "h100"}) is None
    assert culler_limit({"gpu": "1/4", "pool": "t4"}) == 30 * M
    # a server whose model names no pool may be on either: the lenient (off) one applies
    assert culler_limit({"gpu": "1/4"}) is None


def test_hibernation_and_kernel_shutdown_follow_one_rule():
    data = demo(mps=MPS, whole=WHOLE, gke=GKE_TS)
    data["pools"]["h100x2"] = dict(data["pools"]["h100"], overcommit=2)
    cat = load_catalog(data)
    for name in cat.pools:
        policy = cat.idle_for(name)
        assert (policy.kernel_gpu_idle is None) == (policy.kernel_gpu_hibernate is None), name


def test_an_explicit_setting_still_wins():
    # catalog-wide: every pool, reserving ones included
    cat = load_catalog(demo({"kernel_gpu_idle": "20m"}))
    assert [kernel_idle(cat, p) for p in ("h100", "t4", "a100-mig")] == [1200, 1200, 1200]
    assert told(cat, "h100") == "1200"
    # per pool: that pool; the others keep their backend's default
    data = demo()
    data["pools"]["h100"]["idle"] = {"kernel_gpu_idle": "15m"}
    data["pools"]["t4"]["idle"] = {"kernel_gpu_idle": "off"}
    cat = load_catalog(data)
    assert kernel_idle(cat, "h100") == 900 and told(cat, "h100") == "900"
    assert kernel_idle(cat, "t4") is None and told(cat, "t4") == "0"
    assert kernel_idle(cat, "a100-mig") is None
    # setting one per-backend key leaves the other to the backend
    data = demo({"kernel_gpu_hibernate": "5m"})
    data["pools"]["t4"]["idle"] = {"server_gpu_idle": "2h"}
    cat = load_catalog(data)
    assert cat.idle_for("h100").kernel_gpu_hibernate == 300 and kernel_idle(cat, "h100") is None
    assert kernel_idle(cat, "t4") == 30 * M and cat.idle_for("t4").server_gpu_idle == 7200
    data = demo()
    data["pools"]["h100"]["idle"] = {"kernel_gpu_hibernate": "5m"}
    assert kernel_idle(load_catalog(data), "h100") is None


def test_check_warns_where_a_kernel_shutdown_cannot_help(tmp_path):
    result = check_catalog(tmp_path, demo({"kernel_gpu_idle": "30m"}))
    assert result.returncode == 0, result  # a warning, not a mistake
    out = result.stdout
    assert "the catalog is fine, with 2 warnings:" in out, out
    assert (
        "  warning: idle.kernel_gpu_idle: shutting idle kernels down cannot help on pool 'h100' "
        "(hami): the hami backend reserves a slice's GPU memory for its pod" in out
    )
    assert "it disrupts the user (their kernel and its state are lost) for no co-tenant gain" in out
    assert "Turn it off there (pools.h100.idle.kernel_gpu_idle: off)" in out
    assert "pool 'a100-mig' (mig-mixed): a MIG instance is a hardware partition" in out
    assert "'t4'" not in out  # time-sliced: it helps there
    # per pool; the catalog's pool without it is quiet; an over-committed pool is fine
    data = demo()
    data["pools"]["h100"]["idle"] = {"kernel_gpu_idle": "30m"}
    out = check_catalog(tmp_path, data).stdout
    assert "the catalog is fine, with 1 warning:" in out, out
    assert "warning: pools.h100.idle.kernel_gpu_idle: shutting idle kernels down cannot" in out
    data["pools"]["h100"]["overcommit"] = 2
    out = check_catalog(tmp_path, data).stdout
    # (its eighths then fit 16 on a GPU, past HAMi's task slots: that warning alone)
    assert "cannot help" not in out and "the catalog is fine, with 1 warning:" in out, out
    assert "warning: pools.h100: 16 slices of 1/8" in out, out
    # the example catalog leaves both to the backends: nothing to warn of
    out = check_catalog(tmp_path, yaml.safe_load(DEMO_CATALOG.read_text())).stdout
    assert out.strip().endswith("the catalog is fine."), out
