"""devcluster benchmarks: listing 20,000 pods and watch latency.

The devcluster runs in its own process (like `fracspawner devcluster`) on the large topology
(`generate_large(nodes=1000, pods=20000)`); the clients run here:
- plain HTTP (http.client): GET /api/v1/pods, the body read, then parsed with json.loads;
- kubernetes_asyncio with `_preload_content=False` + json.loads: what kubespawner's reflectors do;
- kubernetes_asyncio's typed path (V1PodList models), what most client code does by default;
- a label-selected list (server-side filtering of 20,000 pods);
- time to first event of a fresh watch over all pods (no resourceVersion: synthetic ADDED
  events for what exists), and time from a PATCH to its MODIFIED event on an open watch;
- strict validation of one notebook pod: kubernetes-validate's own `validate()` (schemas read
  and validator built per call) against the devcluster's validator cached per kind.
Medians of several runs; the spread (min/max) is reported too.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import multiprocessing
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

NODES = 1000
PODS = 20000
REPEATS = 7
TYPED_REPEATS = 3  # building 20,000 V1Pod models takes seconds each


def _serve(conn: Any, nodes: int, pods: int, state_dir: str) -> None:
    """Child process: the devcluster on the large topology until the parent says stop."""
    from devcluster import DevCluster
    from devcluster.topology import generate_large

    async def main() -> None:
        started = time.perf_counter()
        async with DevCluster(generate_large(nodes=nodes, pods=pods), state_dir=state_dir) as c:
            conn.send((c.url, time.perf_counter() - started))
            await asyncio.get_running_loop().run_in_executor(None, conn.recv)

    asyncio.run(main())


def _stats(samples: list[float]) -> dict[str, float]:
    return {
        "median_ms": round(statistics.median(samples) * 1000, 1),
        "min_ms": round(min(samples) * 1000, 1),
        "max_ms": round(max(samples) * 1000, 1),
        "runs": len(samples),
    }


def _http_get(url: str, path: str) -> tuple[bytes, float, float]:
    """(body, seconds until the whole body was read, seconds to parse it)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
    started = time.perf_counter()
    conn.request("GET", path)
    body = conn.getresponse().read()
    read = time.perf_counter() - started
    started = time.perf_counter()
    json.loads(body)
    parse = time.perf_counter() - started
    conn.close()
    return body, read, parse


async def _timed(fn: Callable[[], Awaitable[Any]], repeats: int) -> tuple[list[float], Any]:
    samples, result = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        result = await fn()
        samples.append(time.perf_counter() - started)
    return samples, result


async def _client_figures(url: str) -> dict[str, Any]:
    from kubernetes_asyncio import client

    config = client.Configuration(host=url)
    async with client.ApiClient(config) as api_client:
        api = client.CoreV1Api(api_client)

        async def raw_list(**kwargs: Any) -> list[dict]:
            resp = await api.list_pod_for_all_namespaces(_preload_content=False, **kwargs)
            return json.loads(await resp.read())["items"]

        async def typed_list() -> Any:
            return (await api.list_pod_for_all_namespaces()).items

        raw, items = await _timed(raw_list, REPEATS)
        assert len(items) == PODS, len(items)
        typed, models = await _timed(typed_list, TYPED_REPEATS)
        assert len(models) == PODS, len(models)
        selected, subset = await _timed(
            lambda: raw_list(label_selector="fracspawner.io/pool=h100"), REPEATS
        )
        first_event, all_added, change = await _watch_latency(url, api)
    return {
        "list_kubernetes_asyncio_preload_false": _stats(raw),
        "list_kubernetes_asyncio_typed": _stats(typed),
        "list_label_selected": {**_stats(selected), "items": len(subset)},
        "watch_first_event": _stats(first_event),
        "watch_all_20000_added": _stats(all_added),
        "watch_patch_to_event": _stats(change),
    }


async def _watch_latency(url: str, api: Any) -> tuple[list[float], list[float], list[float]]:
    """Fresh watch over all pods: time to its first event and to all 20,000 synthetic ADDED
    events. Open watch: PATCH -> MODIFIED."""
    import aiohttp

    first: list[float] = []
    everything: list[float] = []
    change: list[float] = []
    async with aiohttp.ClientSession() as session:
        for _ in range(REPEATS):
            started = time.perf_counter()
            async with session.get(f"{url}/api/v1/pods", params={"watch": "1"}) as resp:
                await resp.content.readline()
                first.append(time.perf_counter() - started)
                for _ in range(PODS - 1):
                    await resp.content.readline()
                everything.append(time.perf_counter() - started)
        name = "jupyter-user0-bench"
        body = {"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
        # a pod nobody schedules (unknown scheduler): no process, no scheduler events
        body["spec"]["schedulerName"] = "bench-unserved"
        await api.create_namespaced_pod("default", body)
        listed = await api.list_namespaced_pod(
            "default", field_selector=f"metadata.name={name}", _preload_content=False
        )
        rv = json.loads(await listed.read())["metadata"]["resourceVersion"]
        params = {"watch": "1", "fieldSelector": f"metadata.name={name}", "resourceVersion": rv}
        async with session.get(f"{url}/api/v1/namespaces/default/pods", params=params) as resp:
            for i in range(REPEATS):
                started = time.perf_counter()
                await api.patch_namespaced_pod(
                    name, "default", {"metadata": {"labels": {"n": str(i)}}}
                )
                line = await resp.content.readline()
                change.append(time.perf_counter() - started)
                assert json.loads(line)["type"] == "MODIFIED"
        await api.delete_namespaced_pod(name, "default", grace_period_seconds=0)
    return first, everything, change


NOTEBOOK_POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": "jupyter-alice",
        "labels": {"component": "singleuser-server", "fracspawner.io/pool": "h100"},
        "annotations": {"fracspawner.io/gpu-equivalent": "0.25"},
    },
    "spec": {
        "containers": [
            {
                "name": "notebook",
                "image": "quay.io/jupyter/pytorch-notebook:cuda12-latest",
                "args": ["jupyterhub-singleuser", "--ip=0.0.0.0", "--port=8888"],
                "env": [{"name": "JUPYTERHUB_API_TOKEN", "value": "x"}] * 20,
                "ports": [{"containerPort": 8888, "name": "notebook-port"}],
                "resources": {
                    "limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20480"},
                    "requests": {"cpu": "500m", "memory": "1Gi"},
                },
            }
        ],
        "restartPolicy": "OnFailure",
        "schedulerName": "hami-scheduler",
    },
}


def _validation_figures() -> dict[str, Any]:
    import kubernetes_validate

    from devcluster.validation import K8S_VERSION, validate

    def timed(fn: Callable[[], Any], repeats: int) -> list[float]:
        samples = []
        for _ in range(repeats):
            started = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - started)
        return samples

    uncached = timed(lambda: kubernetes_validate.validate(NOTEBOOK_POD, K8S_VERSION, True), 30)
    validate(NOTEBOOK_POD)  # build and cache the Pod validator
    cached = timed(lambda: validate(NOTEBOOK_POD), 200)
    return {
        "validate_pod_kubernetes_validate": _stats(uncached),
        "validate_pod_cached_validator": _stats(cached),
    }


def run(results_dir: Path) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    with tempfile.TemporaryDirectory(prefix="bench-devcluster-") as state_dir:
        server = ctx.Process(target=_serve, args=(child, NODES, PODS, state_dir), daemon=True)
        server.start()
        try:
            if not parent.poll(120):
                raise RuntimeError("devcluster did not start")
            url, load_seconds = parent.recv()
            reads, parses, size = [], [], 0
            for _ in range(REPEATS):
                body, read, parse = _http_get(url, "/api/v1/pods")
                reads.append(read)
                parses.append(parse)
                size = len(body)
            assert len(json.loads(body)["items"]) == PODS
            figures = asyncio.run(_client_figures(url))
        finally:
            parent.send("stop")
            server.join(30)
            if server.is_alive():
                server.kill()
                server.join()
    return {
        "topology": {"nodes": NODES, "pods": PODS},
        "startup_load_seconds": round(load_seconds, 2),
        "list_body_mib": round(size / 2**20, 1),
        "list_plain_http_read": _stats(reads),
        "list_plain_http_json_loads": _stats(parses),
        **figures,
        **_validation_figures(),
    }


if __name__ == "__main__":
    print(json.dumps(run(Path("benchmarks/results")), indent=2))
