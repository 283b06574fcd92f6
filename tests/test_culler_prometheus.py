"""The culler's one-query Prometheus read, against Debian's real Prometheus.

Live: scraping a dcgm-exporter-format endpoint the test controls (1 s scrapes). Backfilled
(promtool): hours of samples at dcgm-exporter's real intervals, 15 s and 60 s, with gaps and
young series, queried at a moment in that past: coverage comes from the samples' own
timestamps, never from an assumed interval.
"""

from __future__ import annotations

import asyncio

import pytest
from tornado.httpclient import AsyncHTTPClient

from devcluster.localhub import free_port
from fracspawner.culler import Culler, combine, decide_server
from fracspawner.culler.decide import ServerFacts
from fracspawner.culler.hubapi import HubServer
from fracspawner.culler.prometheus import (
    DcgmConfig,
    PrometheusError,
    build_query,
    parse_result,
    query,
)
from fracspawner.model.catalog import DEFAULT_IDLE
from tests.test_culler_support import BackfilledPrometheus, prometheus_facts_of

# labels as they arrive through a ServiceMonitor with honorLabels: false
CFG = DcgmConfig(
    pod_label="exported_pod",
    namespace_label="exported_namespace",
    namespace="jhub",
    max_gap=5.0,
    min_step=1.0,
)
WINDOWS = [3, 6]


# `exporter` (a stand-in dcgm-exporter) and `prometheus` are tests/conftest.py's


async def facts(prometheus, cfg=CFG, windows=WINDOWS, at=None):
    client = AsyncHTTPClient(force_instance=True)
    try:
        result = await query(client, prometheus.url, build_query(cfg, windows), at=at)
    finally:
        client.close()
    return {pod: f for (ns, pod), f in parse_result(result, cfg, windows).items()}


async def test_one_query_for_every_pod(prometheus, exporter):
    exporter.set("jupyter-alice", util=0, memory=10240, namespace="jhub")
    exporter.set("jupyter-bob", util=87, memory=20480, namespace="jhub")
    exporter.set("jupyter-carol--gpu", util=0, memory=0, namespace="jhub")
    exporter.set("jupyter-dave", util=0, memory=512, namespace="other")  # another namespace
    prometheus.wait_scraped(9)
    got = await facts(prometheus)
    assert set(got) == {"jupyter-alice", "jupyter-bob", "jupyter-carol--gpu"}
    alice, bob = got["jupyter-alice"], got["jupyter-bob"]
    assert (alice.memory_mib, alice.idle_for) == (10240, 6)  # idle over the longest window
    assert (bob.memory_mib, bob.idle_for, bob.busy_seen) == (20480, 0, True)  # busy
    assert alice.source == "prometheus" and alice.observed_at > 0


async def until(prometheus, check, what: str) -> dict:
    """Facts once `check(facts)` holds; Prometheus scrapes every second."""
    for _ in range(150):
        got = await facts(prometheus)
        if check(got):
            return got
        await asyncio.sleep(0.2)
    raise TimeoutError(what)


async def test_busy_within_window_is_not_idle_over_it(prometheus, exporter):
    exporter.set("jupyter-erin", util=60, memory=4096, namespace="jhub")
    await until(prometheus, lambda f: "jupyter-erin" in f, "erin scraped")
    exporter.set("jupyter-erin", util=0, memory=4096, namespace="jhub")
    # the busy samples leave the 3 s window first: idle over it, not over the 6 s one
    seen = []
    await until(
        prometheus,
        lambda f: seen.append(f["jupyter-erin"].idle_for) or seen[-1] == 6,
        "erin idle over the long window",
    )
    assert 3 in seen and seen[0] == 0
    assert seen == sorted(seen)  # idle time only grows while the GPU stays idle


async def test_pod_without_fresh_samples_has_no_facts(prometheus, exporter):
    exporter.set("jupyter-frank", util=0, memory=1024, namespace="jhub")
    await until(prometheus, lambda f: "jupyter-frank" in f, "frank scraped")
    del exporter.pods[("jhub", "jupyter-frank")]  # the series ends: Prometheus marks it stale
    await until(prometheus, lambda f: "jupyter-frank" not in f, "frank gone")


async def test_prometheus_down_is_an_error():
    client = AsyncHTTPClient(force_instance=True)
    with pytest.raises(PrometheusError, match="unreachable"):
        await query(client, f"http://127.0.0.1:{free_port()}", "up")
    client.close()


async def test_bad_query_is_an_error(prometheus):
    client = AsyncHTTPClient(force_instance=True)
    with pytest.raises(PrometheusError, match="400"):
        await query(client, prometheus.url, "sum by (")
    client.close()


# --- backfilled: real intervals, real timestamps ------------------------------------------
T = 1_700_006_400.0  # the moment the culler asks about (evaluation time)
H = 3600.0


def dcgm(pod: str, every: float, util, *, start: float = 3 * H, holes=(), mig=False, metric=None):
    """One pod's series: a sample every `every` s from T - start to T, none inside `holes`."""
    labels = {"__name__": metric or "DCGM_FI_DEV_GPU_UTIL", "pod": pod, "namespace": "jhub"}
    labels["job"] = "dcgm-exporter"  # as Prometheus labels what it scraped (the default job)
    if mig:
        labels |= {"GPU_I_ID": "3", "GPU_I_PROFILE": "2g.20gb"}
    samples = []
    t = T - start
    while t <= T:
        if not any(a <= T - t <= b for b, a in holes):  # hole: (from s ago, to s ago)
            samples.append((t, util(T - t) if callable(util) else util))
        t += every
    return labels, samples


def memory(pod: str, every: float, mib: float, mig=False):
    labels, samples = dcgm(pod, every, mib, mig=mig, metric="DCGM_FI_DEV_FB_USED")
    return labels, samples


@pytest.fixture(scope="module")
def past(tmp_path_factory):
    series = [
        dcgm("p15-idle", 15, 0),
        dcgm("p60-idle", 60, 0),
        dcgm("p30-idle", 30, 0),
        dcgm("p15-gap", 15, 0, holes=[(50 * 60, 30 * 60)]),  # no sample 50 to 30 min ago
        dcgm("p60-gap", 60, 0, holes=[(40 * 60, 36 * 60)]),  # 4 min without: 3 scrapes lost
        dcgm("p60-one-lost", 60, 0, holes=[(20 * 60 + 10, 20 * 60 - 10)]),  # one scrape lost
        dcgm("p15-busy", 15, lambda ago: 80 if 28 * 60 <= ago <= 32 * 60 else 0),
        dcgm("p15-young", 15, 0, start=20 * 60),  # the exporter came up 20 min ago
        # MIG: DCGM_FI_DEV_GPU_UTIL is 0 there whatever runs (NVIDIA/dcgm-exporter#216)
        dcgm("mig-busy", 30, 0, mig=True),
        dcgm("mig-busy", 30, 0.9, mig=True, metric="DCGM_FI_PROF_GR_ENGINE_ACTIVE"),
        dcgm("mig-no-prof", 30, 0, mig=True),
        memory("mig-no-prof", 30, 9000, mig=True),
    ]
    p = BackfilledPrometheus(tmp_path_factory.mktemp("backfill"), series)
    yield p
    p.stop()


async def test_coverage_comes_from_real_sample_times_at_15_30_and_60_s(past):
    got = await facts(past, DcgmConfig(), [int(H)], at=T)
    for pod in ("p15-idle", "p30-idle", "p60-idle", "p60-one-lost"):
        assert (got[pod].idle_for, got[pod].known) == (H, True), pod
    # a 20-minute hole in 15 s samples, 4 minutes of 60 s ones: never idle over the hour
    for pod in ("p15-gap", "p60-gap"):
        assert got[pod].idle_for == 0 and not got[pod].busy_seen, pod
    young = got["p15-young"]
    assert young.idle_for == 0 and not young.busy_seen
    # busy half an hour ago: seen, not idle over the hour
    assert got["p15-busy"].idle_for == 0 and got["p15-busy"].busy_seen
    # the same hour asked at 45 minutes: the busy samples are out of it
    quarter = await facts(past, DcgmConfig(), [int(0.25 * H)], at=T)
    assert quarter["p15-busy"].idle_for == 0.25 * H


async def test_mig_reads_engine_activity_never_a_zero_gpu_util(past):
    got = await facts(past, DcgmConfig(), [int(H)], at=T)
    assert got["mig-busy"].busy_seen and got["mig-busy"].idle_for == 0
    # a MIG pod with only GPU_UTIL (always 0 there) and memory: unknown, not idle
    assert not got["mig-no-prof"].known and got["mig-no-prof"].memory_mib == 9000


async def test_a_gpu_pod_missing_from_the_answer_is_a_failed_source(past):
    c = Culler(api_token="x", prometheus_url=past.url)
    c.initialize([])
    servers = [
        HubServer(ServerFacts("p15-idle", user_options={"gpu": "1/4"}), "/user/p15-idle/"),
        HubServer(ServerFacts("absent", user_options={"gpu": "1/4"}), "/user/absent/"),
        HubServer(ServerFacts("cpu-only"), "/user/cpu-only/"),
    ]
    c.pod_name_template = "{username}"

    prom = await prometheus_facts_of(c, servers, at=T)
    assert "p15-idle" in prom and "absent" not in prom
    gathered = {s.facts.user: c.gather(s, prom, T)[1] for s in servers}
    assert gathered["absent"] == {"prometheus": None}  # failed for that pod
    assert gathered["cpu-only"] == {}  # no GPU, no opinion needed
    idle_server = ServerFacts("x", user_options={"gpu": "1/4"}, started=T - 5 * H)
    d = decide_server(idle_server, combine(gathered["absent"], T), DEFAULT_IDLE, T)
    assert d.action == "keep" and d.gpu_failsafe and "prometheus has no data" in d.message
    d = decide_server(idle_server, combine(gathered["p15-idle"], T), DEFAULT_IDLE, T)
    assert d.reason == "gpu_idle"


def test_gap_in_samples_is_never_idle():
    # the pod was idle whenever sampled, but a step found no sample within the window
    def result(parts):
        return [
            {"metric": {"namespace": "j", "pod": "p", "fracspawner_part": p}, "value": [0, v]}
            for p, v in parts
        ]

    cfg = DcgmConfig(max_gap=150, min_step=15)
    parts = [("mem", "100"), ("seen:0", "50"), ("max:3600:0", "0"), ("gap:3600:0", "30")]
    gappy = parse_result(result([*parts, ("steps:3600:0", "200")]), cfg, [3600])[("j", "p")]
    assert (gappy.idle_for, gappy.covered_for, gappy.busy_seen) == (0, 0, False)
    full = parse_result(result([*parts, ("steps:3600:0", "241")]), cfg, [3600])[("j", "p")]
    assert (full.idle_for, full.busy_seen) == (3600, False)
    late = [*parts[:3], ("gap:3600:0", "200"), ("steps:3600:0", "241")]  # samples 200 s apart
    assert parse_result(result(late), cfg, [3600])[("j", "p")].idle_for == 0
