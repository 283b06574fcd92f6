"""The culler reads its idle policy from the catalog (`--catalog`), per pool, with overrides."""

from __future__ import annotations

import copy

import pytest
import yaml

from fracspawner.culler import Culler, ServerFacts, decide_server
from fracspawner.culler.policy import gpu_windows, lenient
from fracspawner.model.catalog import CatalogError, IdlePolicy
from tests.conftest import DEMO_CATALOG

H = 3600.0
U = 24 * H  # server_unattended: the default, no catalog here sets it
# kernel_gpu_hibernate: no catalog here sets it, so each pool's backend decides (idle_defaults.py):
# 10 min on the time-sliced t4, off on HAMi (h100), MIG and without a pool
HIB = 600.0
NOW = 1_800_000_000.0


@pytest.fixture
def catalog_file(tmp_path):
    data = yaml.safe_load(DEMO_CATALOG.read_text())
    data["idle"] = {"kernel_gpu_idle": "30m", "server_gpu_idle": "2h", "server_idle": "8h"}
    data["pools"]["h100"]["idle"] = {"kernel_gpu_idle": "2s", "server_gpu_idle": "90s"}
    data["pools"]["t4"]["idle"] = {"server_gpu_idle": "4h", "max_age": "1d"}
    path = tmp_path / "catalog.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def culler(*argv: str) -> Culler:
    c = Culler(api_token="x")
    c.initialize(list(argv))
    return c


def facts(options: dict, idle: float) -> ServerFacts:
    return ServerFacts("ann", user_options=options, started=NOW - idle, last_activity=NOW - idle)


def test_pool_overrides_from_the_catalog(catalog_file):
    c = culler(f"--catalog={catalog_file}")
    base = IdlePolicy(30 * 60, 2 * H, 8 * H, None, U, None)
    # the pool's own keys win, the rest come from the catalog's idle section
    assert c.policy_for(facts({"gpu": "1/4", "pool": "h100"}, 0)).astuple() == (
        "h100",
        IdlePolicy(2, 90, 8 * H, None, U, None),
    )
    assert c.policy_for(facts({"gpu": "1/4", "pool": "t4"}, 0)).policy == IdlePolicy(
        30 * 60, 4 * H, 8 * H, 24 * H, U, HIB
    )
    assert c.policy_for(facts({"gpu": "mig-1g.10gb", "pool": "a100-mig"}, 0)).policy == base
    assert c.policy_for(facts({}, 0)).astuple() == ("", base)  # no GPU, no pool
    # a pool since removed from the catalog: the catalog-wide policy
    assert c.policy_for(facts({"gpu": "1/4", "pool": "gone"}, 0)).astuple() == ("gone", base)


def test_pool_override_decides_the_cull(catalog_file):
    c = culler(f"--catalog={catalog_file}")
    idle_2m = [facts({"gpu": "1/4", "pool": p}, 120) for p in ("h100", "t4")]
    gpu_idle_2m = _gpu(120)
    decisions = [decide_server(f, gpu_idle_2m, c.policy_for(f).policy, NOW).reason for f in idle_2m]
    assert decisions == ["gpu_idle", "gpu_busy"]  # busy 2 min ago is within t4's 4 h


def test_pool_left_out_uses_the_pools_that_serve_the_slice(catalog_file):
    c = culler(f"--catalog={catalog_file}")
    # only h100 serves half a GPU: FracSpawner can only have placed it there
    assert c.policy_for(facts({"gpu": "1/2"}, 0)).astuple() == (
        "h100",
        IdlePolicy(2, 90, 8 * H, None, U, None),
    )
    # a quarter fits all three (a MIG 2g.20gb on the A100): the most lenient of their policies,
    # never sooner than any of them would
    assert c.policy_for(facts({"gpu": "0.25"}, 0)).astuple() == (
        "a100-mig|h100|t4",
        IdlePolicy(30 * 60, 4 * H, 8 * H, None, U, None),
    )
    # nothing serves it (or it does not parse): the catalog-wide policy
    assert c.policy_for(facts({"gpu": "mig-7g.80gb"}, 0)).pool == ""
    assert c.policy_for(facts({"gpu": "lots"}, 0)).pool == ""


def test_lenient_keeps_a_limit_off_when_any_policy_has_it_off():
    assert lenient([IdlePolicy(1, 2, None, 4), IdlePolicy(5, 1, 3, 2)]) == IdlePolicy(5, 2, None, 4)


def test_gpu_windows_are_the_server_limits_that_are_on_once_each_ascending():
    policies = [
        IdlePolicy(1, 7200, None, 9),
        IdlePolicy(5, 90.5, 7200),
        IdlePolicy(None, None, None),
    ]
    # kernel_gpu_idle and max_age need no GPU history; an off limit needs no window
    assert gpu_windows(policies) == [90, 7200]
    assert gpu_windows([]) == []


def test_without_catalog_the_traits_apply():
    c = culler("--Culler.server_gpu_idle=30m", "--Culler.server_unattended=0")
    assert c.policy_for(facts({"gpu": "1/4", "pool": "h100"}, 0)).astuple() == (
        "h100",
        # 0 turns a limit off, as in the catalog; kernels are the servers' own business
        IdlePolicy(None, 30 * 60, 8 * H, None, None),
    )
    # the documented defaults: never "never cull"
    assert culler().policy_for(facts({}, 0)).policy == IdlePolicy(None, H, 8 * H, None, U)


def test_bad_catalog_refused_at_start_naming_the_path(tmp_path, catalog_file):
    data = yaml.safe_load(catalog_file.read_text())
    bad = copy.deepcopy(data)
    bad["pools"]["h100"]["idle"]["server_gpu_idle"] = "soon"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(CatalogError, match=r"pools\.h100\.idle\.server_gpu_idle"):
        culler(f"--catalog={path}")


def _gpu(idle_for: float):
    from fracspawner.culler import GpuFacts

    return GpuFacts("extension", NOW, 4096, idle_for, covered_for=idle_for + 60)


def test_server_url_is_refused_with_the_reason():
    # the culler no longer calls into user servers: an old command line says so, clearly
    with pytest.raises(SystemExit, match="no longer calls into user servers"):
        culler("--server-url=http://proxy-public")
