"""The culler's decision functions, on their own: sources -> reading, facts + policy -> Decision."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fracspawner.culler.decide import (
    GpuFacts,
    Rules,
    ServerFacts,
    combine,
    decide_server,
)
from fracspawner.model.catalog import DEFAULT_IDLE, IdlePolicy, load_yaml

NOW = 1_000_000.0
M, H = 60.0, 3600.0
POLICY = IdlePolicy(
    kernel_gpu_idle=30 * M,
    server_gpu_idle=2 * H,
    server_idle=8 * H,
    max_age=None,
    server_unattended=24 * H,
)


def server(
    idle: float, *, gpu: str | None = "1/4", started_ago: float = 24 * H, **kw
) -> ServerFacts:
    opts = {"gpu": gpu, "pool": "h100"} if gpu else {}
    return ServerFacts(
        user=kw.pop("user", "alice"),
        user_options=opts,
        started=NOW - started_ago,
        last_activity=NOW - idle,
        **kw,
    )


def gpu_facts(idle_for: float, *, age: float = 10.0, memory: float = 4096.0, **kw) -> GpuFacts:
    return GpuFacts("prometheus", NOW - age, memory, idle_for, **kw)


@pytest.mark.parametrize(
    ("idle", "gpu_idle_for", "action", "reason"),
    [
        (3 * H, 3 * H, "stop", "gpu_idle"),  # both idle past server_gpu_idle
        (3 * H, 10.0, "keep", "gpu_busy"),  # silent training loop: messages idle, GPU busy
        (30 * M, 3 * H, "keep", "active"),  # GPU idle but the user is around
        (9 * H, 0.0, "keep", "gpu_busy"),  # busy GPU outlasts even server_idle
        (2 * H, 2 * H, "stop", "gpu_idle"),  # exactly at the limit
    ],
)
def test_gpu_server(idle, gpu_idle_for, action, reason):
    d = decide_server(server(idle), gpu_facts(gpu_idle_for), POLICY, NOW)
    assert (d.action, d.reason) == (action, reason), d.message


@pytest.mark.parametrize("gpu", [None, gpu_facts(0.0, age=10 * H)], ids=["missing", "stale"])
def test_failsafe_without_gpu_data_only_plain_timeout(gpu):
    # idle past server_gpu_idle but not server_idle: no GPU data, so not culled
    d = decide_server(server(3 * H), gpu, POLICY, NOW)
    assert (d.action, d.reason, d.gpu_failsafe) == ("keep", "active", True)
    assert "not culled on GPU grounds" in d.message
    # past server_idle the plain timeout still applies
    d = decide_server(server(9 * H), gpu, POLICY, NOW)
    assert (d.action, d.reason, d.gpu_failsafe) == ("stop", "idle", True)


def test_too_short_gpu_history_is_missing_data_not_busy():
    # no busy sample, but the series covers 10 minutes of a 2 h window (a gap, a new exporter)
    short = gpu_facts(10 * M, covered_for=10 * M)
    d = decide_server(server(3 * H), short, POLICY, NOW)
    assert (d.action, d.reason, d.gpu_failsafe) == ("keep", "active", True)
    d = decide_server(server(9 * H), short, POLICY, NOW)
    assert (d.action, d.reason, d.gpu_failsafe) == ("stop", "idle", True)
    # a busy sample seen 10 minutes ago within 3 h of history: busy
    assert (
        decide_server(server(9 * H), gpu_facts(10 * M, covered_for=3 * H), POLICY, NOW).reason
        == "gpu_busy"
    )


def test_cpu_server_plain_timeout():
    assert decide_server(server(7 * H, gpu=None), None, POLICY, NOW).action == "keep"
    d = decide_server(server(8 * H, gpu=None), None, POLICY, NOW)
    assert (d.action, d.reason, d.gpu_failsafe) == ("stop", "idle", False)


def test_gpu_memory_without_slice_counts_as_holding_gpu():
    d = decide_server(server(3 * H, gpu=None), gpu_facts(3 * H, memory=512), POLICY, NOW)
    assert d.reason == "gpu_idle"
    d = decide_server(server(3 * H, gpu=None), gpu_facts(3 * H, memory=0), POLICY, NOW)
    assert (d.action, d.reason) == ("keep", "active")


def test_own_activity_counts_with_the_hubs():
    # the server's own last activity (from its report) is newer than the hub's: not idle
    facts = server(3 * H, own_last_activity=NOW - 5.0)
    assert decide_server(facts, gpu_facts(3 * H), POLICY, NOW).reason == "active"
    assert decide_server(server(3 * H), gpu_facts(3 * H), POLICY, NOW).reason == "gpu_idle"


def test_max_age_even_when_busy():
    policy = IdlePolicy(30 * M, 2 * H, 8 * H, max_age=12 * H)
    d = decide_server(server(0.0, started_ago=13 * H), gpu_facts(0.0), policy, NOW)
    assert (d.action, d.reason) == ("stop", "max_age")


def test_disabled_rules():
    policy = IdlePolicy(None, None, None, None)
    assert decide_server(server(100 * H), gpu_facts(100 * H), policy, NOW).action == "keep"
    # server_gpu_idle off: a GPU server falls back to server_idle, still GPU-protected
    policy = IdlePolicy(None, None, 8 * H, None)
    assert decide_server(server(9 * H), gpu_facts(9 * H), policy, NOW).reason == "idle"
    assert decide_server(server(9 * H), gpu_facts(1 * H), policy, NOW).reason == "gpu_busy"


@pytest.mark.parametrize(
    ("facts", "rules", "reason"),
    [
        (server(9 * H, user="root"), Rules(exempt_users=frozenset({"root"})), "exempt"),
        (server(9 * H, groups=("staff",)), Rules(exempt_groups=frozenset({"staff"})), "exempt"),
        (server(9 * H, name="gpu"), Rules(cull_named_servers=False), "excluded"),
        (server(9 * H), Rules(cull_default_servers=False), "excluded"),
        (server(9 * H, pending="spawn"), Rules(), "not_ready"),
        (server(9 * H, ready=False), Rules(), "not_ready"),
    ],
)
def test_kept_regardless(facts, rules, reason):
    d = decide_server(facts, gpu_facts(9 * H), POLICY, NOW, rules)
    assert (d.action, d.reason) == ("keep", reason)


def test_named_server_culled_when_allowed():
    assert decide_server(server(9 * H, name="gpu"), None, POLICY, NOW).action == "stop"


# --- several sources: unknown is never idle ------------------------------------------------
def unknown(source: str = "extension") -> GpuFacts:
    return GpuFacts(source, NOW - 10, 4096.0, None, None, "GPU utilisation cannot be read (MIG)")


def test_unknown_activity_is_never_idle():
    # MIG through NVML, a process the extension cannot match: only the plain timeout applies
    reading = combine({"extension": unknown()}, NOW)
    assert reading.gpu is not None and not reading.gpu.known
    d = decide_server(server(3 * H), reading, POLICY, NOW)
    assert (d.action, d.gpu_failsafe) == ("keep", True)
    assert "GPU activity unknown (extension: GPU utilisation cannot be read (MIG))" in d.message
    d = decide_server(server(9 * H), reading, POLICY, NOW)
    assert (d.action, d.reason, d.gpu_failsafe) == ("stop", "idle", True)


def test_a_source_that_knows_decides_where_another_cannot_tell():
    # on MIG, dcgm-exporter's PROF_GR_ENGINE_ACTIVE knows what NVML in the pod cannot
    idle = combine({"prometheus": gpu_facts(3 * H), "extension": unknown()}, NOW)
    assert decide_server(server(3 * H), idle, POLICY, NOW).reason == "gpu_idle"
    busy = combine({"prometheus": gpu_facts(60.0), "extension": unknown()}, NOW)
    assert decide_server(server(3 * H), busy, POLICY, NOW).reason == "gpu_busy"


def test_busy_from_either_source_wins():
    ext_busy = GpuFacts("extension", NOW - 5, 4096.0, 30.0, covered_for=5 * H)
    reading = combine({"prometheus": gpu_facts(3 * H), "extension": ext_busy}, NOW)
    assert reading.gpu.idle_for == 30.0 and reading.gpu.source == "prometheus+extension"
    assert decide_server(server(3 * H), reading, POLICY, NOW).reason == "gpu_busy"


@pytest.mark.parametrize(
    "sources",
    [
        {"prometheus": None, "extension": GpuFacts("extension", NOW - 5, 0.0, 3 * H, 5 * H)},
        {"prometheus": gpu_facts(3 * H), "extension": None},
        {"prometheus": gpu_facts(3 * H, age=10 * M)},  # older than max_staleness
        {},
    ],
    ids=["pod-missing-from-prometheus", "no-report", "stale", "no-source"],
)
def test_a_failed_source_is_missing_data_not_an_absent_opinion(sources):
    reading = combine(sources, NOW)
    assert reading.gpu is None and reading.missing
    d = decide_server(server(3 * H), reading, POLICY, NOW)
    assert (d.action, d.gpu_failsafe) == ("keep", True)
    assert "not culled on GPU grounds" in d.message


# --- GPU busy cannot keep a server for ever -----------------------------------------------
def test_busy_gpu_without_its_user_is_capped_by_server_unattended():
    # a neighbour's work on a time-sliced GPU, or a forgotten job: the GPU is busy, the
    # server's activity is fresh (GPU work counts), but nobody has touched it for a day
    facts = server(5.0, own_last_activity=NOW - 5.0, user_last_activity=NOW - 25 * H)
    d = decide_server(facts, gpu_facts(0.0), POLICY, NOW)
    assert (d.action, d.reason) == ("stop", "unattended"), d.message
    # its user was there 23 hours ago: still kept
    facts = server(5.0, own_last_activity=NOW - 5.0, user_last_activity=NOW - 23 * H)
    assert decide_server(facts, gpu_facts(0.0), POLICY, NOW).reason == "gpu_busy"
    # without a report, the hub's last activity stands for the user's
    assert decide_server(server(25 * H), gpu_facts(0.0), POLICY, NOW).reason == "unattended"
    off = IdlePolicy(30 * M, 2 * H, 8 * H, None, None)
    assert decide_server(server(25 * H), gpu_facts(0.0), off, NOW).reason == "gpu_busy"


def test_a_catalog_without_idle_gets_safe_defaults(tmp_path):
    from fracspawner.backends import load_catalog
    from tests.conftest import DEMO_CATALOG

    data = load_yaml(DEMO_CATALOG)
    del data["idle"]
    catalog = load_catalog(data)
    assert catalog.idle == DEFAULT_IDLE
    assert (catalog.idle.server_gpu_idle, catalog.idle.kernel_gpu_idle) == (H, 30 * M)
    assert (catalog.idle.server_idle, catalog.idle.server_unattended) == (8 * H, 24 * H)
    # an idle GPU server is stopped after an hour, as z2jh's culler would
    d = decide_server(server(H), gpu_facts(H, covered_for=5 * H), catalog.idle, NOW)
    assert (d.action, d.reason) == ("stop", "gpu_idle")


durations = st.floats(min_value=0, max_value=48 * H)
optional = st.one_of(st.none(), st.floats(min_value=1, max_value=24 * H))


@given(
    idle=durations,
    gpu_idle=durations,
    age=durations,
    stale=st.booleans(),
    policy=st.builds(IdlePolicy, optional, optional, optional, st.none(), st.none()),
)
def test_never_culled_while_gpu_busy_within_its_window(idle, gpu_idle, age, stale, policy):
    facts = None if stale else gpu_facts(gpu_idle, age=age % 300)
    d = decide_server(server(idle), facts, policy, NOW)
    if d.cull and facts is not None:
        window = (
            policy.server_gpu_idle if policy.server_gpu_idle is not None else policy.server_idle
        )
        assert gpu_idle >= window
    if d.cull and facts is None:  # without GPU data only the plain timeout can cull
        assert d.reason == "idle" and idle >= policy.server_idle
