"""The culler's one-query Prometheus read, against Debian's real Prometheus scraping a
dcgm-exporter-format endpoint the test controls (scrape interval 1 s, loopback only)."""

from __future__ import annotations

import asyncio

import pytest
from tornado.httpclient import AsyncHTTPClient

from devcluster.localhub import free_port
from fracspawner.culler.prometheus import (
    DcgmConfig,
    PrometheusError,
    build_query,
    parse_result,
    query,
)
from tests.test_culler_support import DcgmExporter, Prometheus

# labels as they arrive through a ServiceMonitor with honorLabels: false
CFG = DcgmConfig(
    pod_label="exported_pod",
    namespace_label="exported_namespace",
    namespace="jhub",
    scrape_interval=1.0,
    min_coverage=0.5,
)
WINDOWS = [3, 6]


@pytest.fixture(scope="module")
def exporter():
    e = DcgmExporter()
    yield e
    e.stop()


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory, exporter):
    p = Prometheus(tmp_path_factory.mktemp("prometheus"), exporter.port)
    yield p
    p.stop()


async def facts(prometheus):
    client = AsyncHTTPClient(force_instance=True)
    try:
        result = await query(client, prometheus.url, build_query(CFG, WINDOWS))
    finally:
        client.close()
    return {pod: f for (ns, pod), f in parse_result(result, CFG, WINDOWS).items()}


async def test_one_query_for_every_pod(prometheus, exporter):
    exporter.set("jupyter-alice", util=0, memory=10240, namespace="jhub")
    exporter.set("jupyter-bob", util=87, memory=20480, namespace="jhub")
    exporter.set("jupyter-carol--gpu", util=0, memory=0, namespace="jhub")
    exporter.set("jupyter-dave", util=0, memory=512, namespace="other")  # another namespace
    prometheus.wait_scraped(8)
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


def test_gap_in_samples_is_never_idle():
    # the pod was idle whenever sampled, but samples cover too little of the window
    result = [
        {"metric": {"namespace": "j", "pod": "p", "fracspawner_part": part}, "value": [0, v]}
        for part, v in [("mem", "100"), ("seen:0", "50"), ("max:60:0", "0"), ("count:60:0", "1")]
    ]
    cfg = DcgmConfig(scrape_interval=30.0, min_coverage=0.8)
    facts = parse_result(result, cfg, [60])[("j", "p")]
    assert (facts.idle_for, facts.covered_for, facts.busy_seen) == (0, 0, False)
    result[-1]["value"] = [0, "2"]
    facts = parse_result(result, cfg, [60])[("j", "p")]
    assert (facts.idle_for, facts.busy_seen) == (60, False)
