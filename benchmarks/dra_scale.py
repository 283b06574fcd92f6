"""The scale benchmark's DRA part on the real control plane (issues 30, 35): `dra.*` in
benchmarks/results/scale.json.

The cluster: the real control plane (devcluster/controlplane: kube-apiserver, etcd,
kube-scheduler and kube-controller-manager v1.36.3, NVIDIA's DeviceClasses installed) and
DRA_NODES GPU nodes of 8 GPUs each registered by the node agent in "no-run" mode (as kwok:
pods are reported Running, nothing runs), which publishes their ResourceSlices as NVIDIA's DRA
kubelet plugin does on 1.35+ (devcluster/nodeagent/slices.py): half H100 80GB nodes in
`--consumable-shares=memory` mode, half A100 80GB nodes with DynamicMIG (a counter set per GPU,
the full GPU and every MIG placement as devices consuming it). Then pods made as FracSpawner
makes them (the product's own plan, backends/dra.py: a ResourceClaimTemplate per offer, named
in the pod's `resourceClaims`): 4 memory shares of 10 or 20 GiB per H100 GPU and one 1g.10gb
MIG device per A100 GPU. kube-controller-manager makes each pod's claim from its template and
kube-scheduler's DynamicResources plugin allocates it and binds the pod; nothing is written
for them. FRACSPAWNER_BENCH_DRA_NODES sets the size (a few minutes at the default).

1. form render while claims change (CHURN_PER_S actions a second from another thread: 1 in 5
   a new pod whose claim kube-scheduler allocates, 1 in 5 a pod deleted, whose claim goes,
   3 in 5 an annotation on a claim, which counting does not read), p50/p99/max, and the
   Kubernetes API requests per render; the claim events the hub's watch received are counted.
   Baseline: plain KubeSpawner rendering the equivalent static profile_list, interleaved.
2. memory held by the capacity watch's DRA records, index and sums against the raw objects a
   kubespawner-style reflector would hold (the cluster's slices and claims as listed, parsed).
3. how long kube-scheduler took to allocate the initial claims (not FracSpawner's figure: the
   cluster's, for the conditions).

`python -m benchmarks.bench_scale dra` runs only this and merges `dra` into scale.json.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import random
import statistics
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

#: GPU nodes (half H100 memory shares, half A100 dynamic MIG); the figures in docs name theirs
NODES = int(os.environ.get("FRACSPAWNER_BENCH_DRA_NODES", "16"))
GPUS = 8
SHARES_PER_H100 = 4
#: churn actions a second (each spawn or stop makes 2-3 claim events, an annotation one)
CHURN_PER_S = 30
RENDERS = 300
NAMESPACE = "default"
CLAIMS = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
#: kubespawner's labels on a single-user pod
SINGLEUSER = {"component": "singleuser-server", "app": "jupyterhub"}


def catalog() -> dict[str, Any]:
    return {
        "pools": {
            "h100-dra": {
                "display_name": "H100 80GB (DRA memory shares)",
                "gpu": "H100-80GB",
                "backend": "dra",
                "options": {"sharing": "memory"},
                "offers": ["1/8", "1/4", "1/2", "10GiB", "20GiB", "40GiB", "1"],
            },
            "a100-dmig": {
                "display_name": "A100 80GB (dynamic MIG)",
                "gpu": "A100-80GB",
                "backend": "dra",
                "options": {"mig": "dynamic"},
                "offers": ["mig-1g.10gb", "mig-2g.20gb", "mig-3g.40gb", "1"],
            },
        },
        "images": {"base": {"image": "quay.io/jupyter/base-notebook", "default": True}},
    }


def topology(nodes: int = NODES) -> dict[str, Any]:
    """The node agent's topology: half H100 memory-share nodes, half A100 dynamic-MIG nodes."""
    half = nodes // 2
    capacity = {"cpu": "128", "memory": "1Ti", "pods": "110"}
    h100 = {"gpus": GPUS, "model": "H100-80GB", "consumableShares": "memory"}
    a100 = {"gpus": GPUS, "model": "A100-80GB", "mig": "dynamic"}
    return {
        "nodes": [
            {"name": f"h100-dra-{i:03d}", "capacity": capacity, "dra": h100} for i in range(half)
        ]
        + [
            {"name": f"a100-dmig-{i:03d}", "capacity": capacity, "dra": a100}
            for i in range(nodes - half)
        ]
    }


def _stats(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)

    def pct(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]

    return {
        "p50": round(statistics.median(ordered) * 1000, 3),
        "p99": round(pct(0.99) * 1000, 3),
        "max": round(ordered[-1] * 1000, 3),
    }


# ----------------------------------------------------------------------------- the cluster
class Offers:
    """Pod manifests as FracSpawner plans them for three offers, and their templates."""

    def __init__(self, data: dict[str, Any]) -> None:
        from fracspawner.backends import load_catalog, plan_slice

        loaded = load_catalog(data)
        self.plans = {}
        for pool_name, label in (("h100-dra", "10GiB"), ("h100-dra", "20GiB"),
                                 ("a100-dmig", "mig-1g.10gb")):  # fmt: skip
            pool = loaded.pools[pool_name]
            offer = next(o for o in pool.offers if str(o) == label)
            self.plans[(pool_name, label)] = plan_slice(offer, pool, loaded.default_image(pool))

    def templates(self) -> list[dict[str, Any]]:
        return [_plain(t) for plan in self.plans.values() for t in plan.claim_templates]

    def pod(self, name: str, key: tuple[str, str]) -> dict[str, Any]:
        plan = self.plans[key]
        container = {
            "name": "notebook",
            "image": plan.image or "quay.io/jupyter/base-notebook",
            "resources": {"claims": [_plain(c) for c in plan.container_claims]},
        }
        spec: dict[str, Any] = _plain(plan.extra_pod_config)
        spec["containers"] = [container]
        if plan.node_selector:
            spec["nodeSelector"] = dict(plan.node_selector)
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "labels": {**SINGLEUSER, **plan.labels},
                "annotations": dict(plan.annotations),
            },
            "spec": spec,
        }


def _plain(value: Any) -> Any:
    """A plan's read-only mappings and tuples as plain JSON data."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _start_cluster(state_dir: Path, say: Callable[[str], None]) -> tuple[Any, Any, Any]:
    """(control plane, node agent, admin Api) with the DRA nodes Ready and untainted."""
    from devcluster.controlplane import ControlPlane
    from devcluster.nodeagent import NodeAgent
    from devcluster.topology import load_topology

    from .real_cluster import Api

    cp = ControlPlane.start(state_dir / "controlplane", timeout=600, progress=say)
    agent = None
    try:
        api = Api(cp.server, str(cp.pki.ca.cert), str(cp.pki.admin.cert), str(cp.pki.admin.key))
        agent = NodeAgent.start(
            load_topology(topology()), cp.server, cp.pki.ca, state_dir / "agent",
            mode="no-run", kubelet_api=False,
        )  # fmt: skip
        _wait(lambda: _untainted(api) >= NODES, 300, "DRA nodes still tainted")
        sa = f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default"
        _wait(lambda: api.request("GET", sa)[0] == 200, 120, "no default ServiceAccount")
        say(f"{NODES} DRA nodes ready and untainted")
    except BaseException:
        if agent is not None:
            agent.stop()
        cp.stop()
        raise
    return cp, agent, api


def _untainted(api: Any) -> int:
    nodes = api.ok("GET", "/api/v1/nodes")["items"]
    return sum(1 for n in nodes if not (n.get("spec") or {}).get("taints"))


def _wait(done: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} after {timeout:.0f} s")
        time.sleep(1)


def _allocated(api: Any) -> int:
    claims = api.ok("GET", CLAIMS)["items"]
    return sum(1 for c in claims if (c.get("status") or {}).get("allocation"))


def _populate(api: Any, offers: Offers, say: Callable[[str], None]) -> dict[str, Any]:
    """The initial pods; waits until kube-scheduler has allocated every claim."""
    from concurrent.futures import ThreadPoolExecutor

    for template in offers.templates():
        api.ok("POST", f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaimtemplates",
               template)  # fmt: skip
    rng = random.Random(30)
    half = NODES // 2
    wanted = [("h100-dra", rng.choice(["10GiB", "20GiB"]))
              for _ in range(half * GPUS * SHARES_PER_H100)]  # fmt: skip
    wanted += [("a100-dmig", "mig-1g.10gb")] * ((NODES - half) * GPUS)
    started = time.monotonic()

    def create(item: tuple[int, tuple[str, str]]) -> None:
        i, key = item
        api.ok("POST", PODS, offers.pod(f"jupyter-dra{i:05d}", key))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(create, enumerate(wanted)))
    created = time.monotonic() - started
    _wait(lambda: _allocated(api) >= len(wanted), 900, "claims not all allocated")
    seconds = time.monotonic() - started
    say(f"{len(wanted)} claims allocated by kube-scheduler in {seconds:.1f} s")
    return {
        "pods": len(wanted),
        "pods_created_s": round(created, 1),
        "all_claims_allocated_s": round(seconds, 1),
        "claims_allocated_per_s": round(len(wanted) / seconds, 1),
    }


# ----------------------------------------------------------------------------- 1. churn
class _Churn:
    """The churn's state, shared by its workers: the pods alive and the claims last listed."""

    def __init__(self, api: Any, offers: Offers) -> None:
        self.api, self.offers = api, offers
        self.lock = threading.Lock()
        self.alive = [p["metadata"]["name"] for p in api.ok("GET", PODS)["items"]]
        self.claims = self.claim_names()
        self.sent = dict.fromkeys(
            ("spawns", "stops", "annotations", "annotations_of_gone_claims", "errors"), 0
        )

    def claim_names(self) -> list[str]:
        return [c["metadata"]["name"] for c in self.api.ok("GET", CLAIMS)["items"]]

    def act(self, n: int, kind: float, pick: float) -> None:
        """Action n: kind < 0.2 spawns, < 0.4 stops a pod, else annotates a claim."""
        try:
            if kind < 0.2:
                keys = list(self.offers.plans)
                name = f"jupyter-churn{n:05d}"
                self.api.ok("POST", PODS, self.offers.pod(name, keys[int(pick * len(keys))]))
                with self.lock:
                    self.alive.append(name)
                self._count("spawns")
            elif kind < 0.4:
                with self.lock:
                    name = self.alive.pop(int(pick * len(self.alive))) if self.alive else ""
                if name:
                    path = f"{PODS}/{name}?gracePeriodSeconds=0"
                    self.api.ok("DELETE", path, allow=(404,))
                    self._count("stops")
            else:  # listed each second (one whose pod was stopped since is gone: 404)
                if n % CHURN_PER_S == 0:
                    self.claims = self.claim_names() or self.claims
                claims = self.claims
                body = {"metadata": {"annotations": {"example.org/heartbeat": str(n)}}}
                path = f"{CLAIMS}/{claims[int(pick * len(claims))]}"
                code, _ = self.api.request("PATCH", path, body, "application/merge-patch+json")
                self._count("annotations" if code < 300 else "annotations_of_gone_claims")
        except Exception:  # a missed action only lowers the rate; counted
            self._count("errors")

    def _count(self, what: str) -> None:
        with self.lock:
            self.sent[what] += 1


def _churn(api: Any, offers: Offers, seconds: float, stop: threading.Event) -> dict[str, int]:
    """CHURN_PER_S actions a second, by 4 workers (one request each at a time: a loaded
    apiserver answers one in 100-300 ms): 1 in 5 spawn, 1 in 5 stop, 3 in 5 annotate; an
    action due while 8 are queued is skipped (counted: the rate the machine allowed)."""
    from concurrent.futures import ThreadPoolExecutor

    rng = random.Random(1)
    churn = _Churn(api, offers)
    started = time.monotonic()
    n = 0
    room = threading.BoundedSemaphore(8)  # at most 8 queued or running: no backlog at the end

    def act(n: int, kind: float, pick: float) -> None:
        try:
            churn.act(n, kind, pick)
        finally:
            room.release()

    with ThreadPoolExecutor(4) as pool:
        while not stop.is_set() and time.monotonic() - started < seconds:
            kind, pick = rng.random(), rng.random()
            if room.acquire(blocking=False):
                pool.submit(act, n, kind, pick)
            else:
                churn.sent["skipped_behind"] = churn.sent.get("skipped_behind", 0) + 1
            n += 1
            time.sleep(max(0.0, started + n / CHURN_PER_S - time.monotonic()))
    return churn.sent


def _count_claim_events(watcher: Any) -> dict[str, int]:
    """Count what the hub's ResourceClaim watch delivers (wraps that reflector's handlers)."""
    from fracspawner.capacity.watch import ResourceClaimReflector

    seen = {"n": 0}
    for reflector in watcher._reflectors:
        if isinstance(reflector, ResourceClaimReflector):
            for method in ("_put", "_drop"):
                original = getattr(reflector, method)

                def counting(obj: Any, _original: Any = original) -> Any:
                    seen["n"] += 1
                    return _original(obj)

                setattr(reflector, method, counting)
    return seen


async def churn_render(cluster: Any, offers: Offers) -> dict[str, Any]:
    from kubespawner import KubeSpawner
    from kubespawner.clients import load_config
    from traitlets.config import Config

    from fracspawner.cli.plan import use_kubeconfig
    from fracspawner.hub.spawner import FracSpawner

    from .bench_scale import equivalent_profiles
    from .spawner_support import HubUser, count_requests

    data = catalog()
    cfg = Config()
    cfg.FracSpawner.catalog = data
    # kubespawner loads the client configuration once per process (an lru_cache): after the
    # scale run's own cluster it still named that cluster's deleted CA (FileNotFoundError)
    load_config.cache_clear()
    with use_kubeconfig(cluster.kubeconfig):
        frac = FracSpawner(_mock=True, config=cfg, user=HubUser("alice"))
        plain = KubeSpawner(_mock=True, user=HubUser("alice"))
    profiles = equivalent_profiles(data)
    plain.profile_list = profiles
    counter = count_requests()
    started = time.perf_counter()
    html = await frac._render_options_form_async(frac)  # the first render starts the watches
    first_render = time.perf_counter() - started
    assert "fracspawner-picker" in html
    watcher = frac._capacity_watcher()
    await asyncio.sleep(2)  # let the initial lists settle
    first = watcher.snapshot()
    events = _count_claim_events(watcher)
    live = watcher.live
    changes_before, recounted_before = live.changes, live.recounted
    stop = threading.Event()
    sent: dict[str, Any] = {}
    seconds = RENDERS * 0.06 + 5
    thread = threading.Thread(
        target=lambda: sent.update(_churn(cluster.api, offers, seconds, stop)), daemon=True
    )
    thread.start()
    await asyncio.sleep(1)
    frac_times, plain_times, calls = [], [], 0
    churn_started = time.monotonic()
    for _ in range(RENDERS):
        before = counter["n"]
        t0 = time.perf_counter()
        html = await frac._render_options_form_async(frac)
        frac_times.append(time.perf_counter() - t0)
        calls += counter["n"] - before
        assert "fracspawner-picker" in html
        t0 = time.perf_counter()
        assert plain._render_options_form(profiles)
        plain_times.append(time.perf_counter() - t0)
        await asyncio.sleep(0.05)  # watch events arrive in between, as between real renders
    elapsed = time.monotonic() - churn_started
    stop.set()
    await asyncio.to_thread(thread.join, 30)
    h100 = first.pools["h100-dra"]["10GiB"]
    mig = first.pools["a100-dmig"]["mig-1g.10gb"]
    await watcher.stop()
    return {
        "fracspawner_render_ms": _stats(frac_times),
        "kubespawner_render_ms": _stats(plain_times),
        "k8s_api_requests_per_render": calls / RENDERS,
        "first_render_s": round(first_render, 3),
        "churn_seconds": round(elapsed, 1),
        "churn_actions": sent,
        "claim_events_received": events["n"],
        "claim_events_per_s": round(events["n"] / elapsed, 1),
        "events_that_changed_counting": live.changes - changes_before,
        "nodes_recounted_by_reads": live.recounted - recounted_before,
        "counts_at_start": {
            "h100-dra 10GiB": [h100.free, h100.total],
            "a100-dmig mig-1g.10gb": [mig.free, mig.total],
        },
    }


# ----------------------------------------------------------------------------- 2. memory
def watch_memory(api: Any) -> dict[str, Any]:
    """What the DRA records, index and sums hold against the raw objects (as listed from the
    apiserver and parsed, as a reflector keeps them), each measured from empty with
    tracemalloc."""
    from fracspawner.backends import load_catalog
    from fracspawner.capacity.live import LiveCapacity

    nodes = api.ok("GET", "/api/v1/nodes")["items"]
    slices = api.ok("GET", "/apis/resource.k8s.io/v1/resourceslices")["items"]
    claims = api.ok("GET", "/apis/resource.k8s.io/v1/resourceclaims")["items"]
    text = [json.dumps(o) for o in slices + claims]
    counts = {"slices": len(slices), "claims": len(claims)}
    del slices, claims
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    raw = [json.loads(t) for t in text]
    raw_bytes = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    cat = load_catalog(catalog())
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    live = LiveCapacity(cat)
    live.replace_nodes(nodes)
    live.replace_slices(raw[: counts["slices"]])
    live.replace_claims(raw[counts["slices"] :])
    live.snapshot()
    del raw
    gc.collect()
    kept = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return {
        "fracspawner_bytes": kept,
        "raw_objects_bytes": raw_bytes,
        "ratio": round(kept / raw_bytes, 3),
        **counts,
    }


# ----------------------------------------------------------------------------- run
class _Cluster:
    def __init__(self, cp: Any, api: Any) -> None:
        self.kubeconfig = cp.kubeconfig
        self.api = api


def run(say: Callable[[str], None] = print) -> tuple[dict[str, Any], dict[str, Any]]:
    """(headline `dra` keys for scale.json, details for scale_details.json). Must run on a
    thread that outlives the cluster (its components die with the thread that started them)."""
    offers = Offers(catalog())
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
        cp, agent, api = _start_cluster(Path(tmp), say)
        try:
            version = api.ok("GET", "/version")["gitVersion"]
            allocation = _populate(api, offers, say)
            render = asyncio.run(churn_render(_Cluster(cp, api), offers))
            memory = watch_memory(api)
        finally:
            agent.stop()
            cp.stop()
    headline = {
        "churn_render_p50_ms": render["fracspawner_render_ms"]["p50"],
        "churn_render_p99_ms": render["fracspawner_render_ms"]["p99"],
        "kubespawner_render_median_ms": render["kubespawner_render_ms"]["p50"],
        "k8s_api_requests_per_render": render["k8s_api_requests_per_render"],
        "watch_memory_ratio": memory["ratio"],
    }
    details = {
        "cluster": f"kube-apiserver {version} (real control plane); claims made from templates "
        "by kube-controller-manager and allocated by kube-scheduler; slices published by the "
        "node agent (no-run mode) as NVIDIA's DRA kubelet plugin does",
        "topology": {
            "nodes": NODES,
            "gpus_per_node": GPUS,
            "h100_memory_share_nodes": NODES // 2,
            "a100_dynamic_mig_nodes": NODES - NODES // 2,
            "churn_actions_per_s": CHURN_PER_S,
        },
        "allocation": allocation,
        "churn_render": render,
        "watch_memory": memory,
    }
    return headline, details


def merge_into(results_dir: Path) -> dict[str, Any]:
    """Run it and put `dra` into scale.json and scale_details.json, the other keys kept."""
    headline, details = run()
    for name, value in (("scale.json", headline), ("scale_details.json", details)):
        path = results_dir / name
        current = json.loads(path.read_text()) if path.exists() else {}
        current["dra"] = value
        path.write_text(json.dumps(current, indent=2) + "\n")
    return headline


if __name__ == "__main__":  # a trial: prints the figures, writes no file
    print(json.dumps(dict(zip(("dra", "details"), run(), strict=True)), indent=2))
