"""Spawn-form render time on a large cluster: FracSpawner vs plain KubeSpawner, same run.

The real control plane (benchmarks/real_cluster.py, as the scale benchmark: kube-apiserver,
etcd, kube-scheduler and kube-controller-manager v1.36.3) holds 1,000 GPU nodes and 20,000
bound, Running pods written through the API (FRACSPAWNER_BENCH_NODES / _PODS shrink it for a
trial; the figures in docs are at full size). FracSpawner renders its
form from the node/pod watch caches (live free/total per pool and offer, quota, reasons);
plain KubeSpawner renders an equivalent static `profile_list` (one profile per pool and offer,
no counts). We report the median server-side render time of each, the ratio, and the number of
Kubernetes API requests made per render (counted at the HTTP client; must be 0).
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from .spawner_support import HubUser, count_requests

RENDERS = 30


async def _median_render(render, n: int) -> float:
    times = []
    for _ in range(n):
        started = time.perf_counter()
        html = render()
        if asyncio.iscoroutine(html):
            html = await html
        times.append(time.perf_counter() - started)
        assert html
    return statistics.median(times)


async def _bench(cluster: Any, catalog: dict[str, Any]) -> dict[str, Any]:
    from kubespawner import KubeSpawner
    from traitlets.config import Config

    from fracspawner.cli.plan import use_kubeconfig
    from fracspawner.hub.spawner import FracSpawner

    cfg = Config()
    cfg.FracSpawner.catalog = catalog
    kubeconfig = Path(cluster.kubeconfig)
    with use_kubeconfig(kubeconfig):
        frac = FracSpawner(_mock=True, config=cfg, user=HubUser("alice"))
    counter = count_requests()
    started = time.perf_counter()
    await frac._render_options_form_async(frac)  # first render: starts the node + pod watches
    warmup = time.perf_counter() - started
    watcher = frac._capacity_watcher()
    pods_seen = sum(1 for _ in watcher.pods())
    await asyncio.sleep(1)
    before = counter["n"]
    frac_median = await _median_render(lambda: frac._render_options_form_async(frac), RENDERS)
    frac_calls = (counter["n"] - before) / RENDERS

    # a render right after a watch event changed what counting reads (the node it touched is
    # recounted; benchmarks/bench_scale.py measures this under a steady churn)
    after_change = []
    gpu_pod = next(r for r in watcher.pods() if r.requests)
    for i in range(5):
        changes = watcher.live.changes
        await asyncio.to_thread(_annotate_pod, cluster, gpu_pod.namespace, gpu_pod.name, i)
        while watcher.live.changes == changes:
            await asyncio.sleep(0.01)
        before = counter["n"]
        after_change.append(await _median_render(lambda: frac._render_options_form_async(frac), 1))
        assert counter["n"] == before

    profiles = [
        {
            "display_name": f"{pool['display_name']}: {offer}",
            "slug": f"{name}-{i}",
            "kubespawner_override": {"extra_resource_limits": {"nvidia.com/gpu": "1"}},
        }
        for name, pool in catalog["pools"].items()
        for i, offer in enumerate(pool["offers"])
    ]
    with use_kubeconfig(kubeconfig):
        plain = KubeSpawner(_mock=True, user=HubUser("alice"))
    plain.profile_list = profiles
    before = counter["n"]
    plain_median = await _median_render(lambda: plain._render_options_form(profiles), RENDERS)
    plain_calls = (counter["n"] - before) / RENDERS
    await watcher.stop()
    return {
        "renders": RENDERS,
        "pods_in_cache": pods_seen,
        "fracspawner_first_render_s": round(warmup, 4),
        "fracspawner_median_render_ms": round(frac_median * 1000, 3),
        "fracspawner_median_render_after_a_change_ms": round(
            statistics.median(after_change) * 1000, 3
        ),
        "kubespawner_profile_list_median_render_ms": round(plain_median * 1000, 3),
        "ratio_fracspawner_to_kubespawner": round(frac_median / plain_median, 2),
        "k8s_api_requests_per_render_fracspawner": frac_calls,
        "k8s_api_requests_per_render_kubespawner": plain_calls,
    }


def _annotate_pod(cluster: Any, namespace: str, name: str, i: int) -> None:
    """Someone else's change to a GPU pod (through the API, not the spawner)."""
    body = {"metadata": {"annotations": {"fracspawner.io/gpu-equivalent": f"0.{i + 1}"}}}
    cluster.api.merge_patch(f"/api/v1/namespaces/{namespace}/pods/{name}", body)


def run(results_dir: Path) -> dict[str, Any]:
    from .bench_scale import NODES, PODS, large_topology
    from .large_catalog import catalog_for_large_topology
    from .real_cluster import ScaleCluster

    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
        cluster = ScaleCluster.start(Path(tmp), large_topology(), storm_nodes=False)
        try:
            version = cluster.api.ok("GET", "/version")["gitVersion"]
            result = asyncio.run(_bench(cluster, catalog_for_large_topology()))
        finally:
            cluster.stop()
    result["topology"] = {"nodes": NODES, "pods": PODS}
    result["cluster"] = f"kube-apiserver {version} (real control plane), benchmarks/real_cluster.py"
    return result
