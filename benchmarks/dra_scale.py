"""The scale benchmark's DRA cluster (issue 30 item 2): `dra.*` in benchmarks/results/scale.json.

1,000 GPU nodes publishing ResourceSlices as NVIDIA's DRA kubelet plugin does (500 H100 80GB
nodes of 8 GPUs each in --consumable-shares=memory mode; 500 A100 80GB nodes of 8 GPUs with
DynamicMIG: a counter set per GPU, the full GPU and every MIG placement as devices consuming
it; kubernetes-sigs/dra-driver-nvidia-gpu cmd/gpu-kubelet-plugin/consumable_shares.go,
partitions.go) and 20,000 allocated ResourceClaims (16,000 memory shares of 10 or 20 GiB,
4,000 MIG devices). The same goals as the device-plugin pools (docs/benchmarks.md):

1. form render while 50 claim events/s arrive (a claim allocated elsewhere, freed, or a status
   change counting does not read), p50/p99, and the Kubernetes API requests per render;
   baseline: plain KubeSpawner rendering the equivalent static profile_list, interleaved;
2. memory held by the capacity watch's DRA records, index and sums against the raw objects a
   kubespawner-style reflector would hold (the same slices and claims as parsed JSON).

Measured in process: FracSpawner's real form render and capacity code, with the watcher's
records fed exactly as its ResourceSlice and ResourceClaim watches feed them (LiveCapacity
put_slice/put_claim), because the devcluster does not serve resource.k8s.io yet. What this
leaves out: the watch connections' own cost (the same code as the node and pod watches).
`python -m benchmarks.bench_scale dra` runs only this and merges `dra` into scale.json.
"""

from __future__ import annotations

import asyncio
import copy
import gc
import json
import random
import statistics
import time
import tracemalloc
from pathlib import Path
from typing import Any

NODES = 1000
GPUS = 8
CLAIMS = 20000
CHURN_PER_S = 50
RENDERS = 300
MIB = 1024 * 1024
H100_MIB = 81559
H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"
#: A100 80GB MIG placements (memory slices start, size) per profile (NVIDIA MIG user guide)
PLACEMENTS = {"1g.10gb": [(i, 1) for i in range(7)], "2g.20gb": [(0, 2), (2, 2), (4, 2)],
              "3g.40gb": [(0, 4), (4, 4)]}  # fmt: skip


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


def _node(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {
            "conditions": [{"type": "Ready", "status": "True"}],
            "allocatable": {"cpu": "128", "memory": "1Ti", "pods": "110"},
        },
    }


def _attrs(product: str, uuid: str, kind: str = "gpu", **more: str) -> dict[str, Any]:
    out = {
        "type": {"string": kind},
        "uuid": {"string": uuid},
        "productName": {"string": product},
        "brand": {"string": "Nvidia"},
        "architecture": {"string": "Hopper" if "H100" in product else "Ampere"},
        "cudaComputeCapability": {"version": "9.0.0" if "H100" in product else "8.0.0"},
        "driverVersion": {"version": "580.65.6"},
        "cudaDriverVersion": {"version": "13.0.0"},
    }
    out.update({k: {"string": v} for k, v in more.items()})
    return out


def memory_slice(node: str) -> dict[str, Any]:
    value = str(H100_MIB * MIB)
    devices = [
        {
            "name": f"gpu-{i}",
            "attributes": _attrs(H100, f"GPU-{node}-{i}"),
            "allowMultipleAllocations": True,
            "capacity": {
                "memory": {
                    "value": value,
                    "requestPolicy": {
                        "default": value,
                        "validRange": {"min": "1Mi", "max": value, "step": "1Mi"},
                    },
                }
            },
        }
        for i in range(GPUS)
    ]
    return _slice(node, devices, [])


def _counters(start: int, size: int) -> dict[str, dict[str, str]]:
    return {f"memory-slice-{i}": {"value": "1"} for i in range(start, start + size)}


def dynamic_mig_slice(node: str) -> dict[str, Any]:
    devices, sets = [], []
    for g in range(GPUS):
        counter_set = f"gpu-{g}-counter-set"
        sets.append({"name": counter_set, "counters": _counters(0, 8)})
        uuid = f"GPU-{node}-{g}"
        devices.append(
            {
                "name": f"gpu-{g}",
                "attributes": _attrs(A100, uuid),
                "capacity": {"memory": {"value": "80Gi"}},
                "consumesCounters": [{"counterSet": counter_set, "counters": _counters(0, 8)}],
            }
        )
        for profile, placements in PLACEMENTS.items():
            for start, size in placements:
                devices.append(
                    {
                        "name": f"gpu-{g}-mig-{profile.replace('.', '')}-{start}",
                        "attributes": _attrs(A100, uuid, "mig", profile=profile, parentUUID=uuid),
                        "capacity": {"memory": {"value": f"{10 * size}Gi"}},
                        "consumesCounters": [
                            {"counterSet": counter_set, "counters": _counters(start, size)}
                        ],
                    }
                )
    return _slice(node, devices, sets)


def _slice(node: str, devices: list[dict], sets: list[dict]) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "driver": "gpu.nvidia.com",
        "nodeName": node,
        "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
        "devices": devices,
    }
    if sets:
        spec["sharedCounters"] = sets
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-gpu.nvidia.com-0", "resourceVersion": "1"},
        "spec": spec,
    }


def claim(i: int, node: str, device: str, memory: str | None) -> dict[str, Any]:
    result: dict[str, Any] = {
        "request": "gpu",
        "driver": "gpu.nvidia.com",
        "pool": node,
        "device": device,
    }
    if memory:
        result["consumedCapacity"] = {"memory": memory}
        result["shareID"] = f"{i:08x}-0000-4000-8000-000000000000"
    pod = f"jupyter-user{i}"
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": f"{pod}-gpu-x{i:05d}",
            "namespace": "jhub",
            "labels": {"fracspawner.io/pool": "h100-dra" if memory else "a100-dmig"},
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": f"u{i}", "controller": True}
            ],
            "resourceVersion": str(i),
        },
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "x"}}]}},
        "status": {
            "allocation": {
                "devices": {"results": [result]},
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In",
                                          "values": [node]}]}
                    ]
                },
            },
            "reservedFor": [{"resource": "pods", "name": pod, "uid": f"u{i}"}],
        },
    }  # fmt: skip


def cluster() -> tuple[list[dict], list[dict], list[dict]]:
    """(nodes, slices, claims): half H100 memory-share nodes, half A100 dynamic-MIG nodes."""
    rng = random.Random(30)
    half = NODES // 2
    h100 = [f"h100-dra-{i:04d}" for i in range(half)]
    a100 = [f"a100-dmig-{i:04d}" for i in range(NODES - half)]
    nodes = [_node(n) for n in h100 + a100]
    slices = [memory_slice(n) for n in h100] + [dynamic_mig_slice(n) for n in a100]
    claims = []
    mig_claims = CLAIMS // 5
    for i in range(CLAIMS - mig_claims):  # 4 shares per H100 GPU on average: 10 or 20 GiB
        node = h100[(i // 4) % half]
        gpu = (i // (4 * half)) % GPUS if half else 0
        claims.append(claim(i, node, f"gpu-{gpu}", rng.choice(["10Gi", "20Gi"])))
    for j in range(mig_claims):  # one 1g.10gb per A100 GPU at placement 0
        node, gpu = a100[j // GPUS % len(a100)], j % GPUS
        claims.append(claim(CLAIMS + j, node, f"gpu-{gpu}-mig-1g10gb-0", None))
    return nodes, slices, claims


def _stats(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)

    def pct(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]

    return {
        "p50": round(statistics.median(ordered) * 1000, 3),
        "p99": round(pct(0.99) * 1000, 3),
        "max": round(ordered[-1] * 1000, 3),
    }


class _Fed:
    """Stands for a watch that has listed: synced, its first load done."""

    kind = "fed"
    synced = True
    lost_at = 0.0

    def __init__(self) -> None:
        self.first_load_future = asyncio.get_running_loop().create_future()
        self.first_load_future.set_result(None)

    async def stop(self) -> None:
        return None


def _churn_event(rng: random.Random, claims: list[dict], i: int) -> dict[str, Any]:
    """2 in 5 move a memory share to another GPU of its node (what counting reads), 1 in 5
    free or re-take a MIG placement, 2 in 5 change only reservedFor (counting reads nothing)."""
    obj = copy.deepcopy(rng.choice(claims))
    result = obj["status"]["allocation"]["devices"]["results"][0]
    kind = rng.random()
    if kind < 0.4 and "consumedCapacity" in result:
        result["device"] = f"gpu-{rng.randrange(GPUS)}"
    elif kind < 0.6:
        result["device"] = result["device"].rsplit("-", 1)[0] + f"-{rng.randrange(7)}"
    else:
        obj["status"]["reservedFor"][0]["uid"] = f"v{i}"
    obj["metadata"]["resourceVersion"] = str(10**6 + i)
    return obj


async def churn_render() -> dict[str, Any]:
    import tempfile

    from kubespawner import KubeSpawner
    from traitlets.config import Config

    from fracspawner.capacity.watch import CapacityWatcher
    from fracspawner.cli.plan import _PLACEHOLDER_KUBECONFIG, use_kubeconfig
    from fracspawner.hub.spawner import FracSpawner

    from .bench_scale import equivalent_profiles
    from .spawner_support import HubUser, count_requests

    data = catalog()
    nodes, slices, claims = cluster()
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = Path(tmp) / "kubeconfig"
        kubeconfig.write_text(_PLACEHOLDER_KUBECONFIG)
        cfg = Config()
        cfg.FracSpawner.catalog = data
        with use_kubeconfig(kubeconfig):
            frac = FracSpawner(_mock=True, config=cfg, user=HubUser("alice"))
            plain = KubeSpawner(_mock=True, user=HubUser("alice"))
    watcher = CapacityWatcher.shared(frac.fracspawner_catalog)
    watcher._reflectors = [_Fed()]  # fed below as the four watches feed it
    live = watcher.live
    started = time.perf_counter()
    live.replace_nodes(nodes)
    live.replace_pods([])
    live.replace_slices(slices)
    live.replace_claims(claims)
    load_s = time.perf_counter() - started
    profiles = equivalent_profiles(data)
    plain.profile_list = profiles
    counter = count_requests()
    html = await frac._render_options_form_async(frac)
    assert "fracspawner-picker" in html
    first = watcher.snapshot()
    rng = random.Random(1)
    frac_times, plain_times, calls, events = [], [], 0, 0
    changes_before, recounted_before = live.changes, live.recounted
    interval = 0.05
    per_gap = max(1, round(CHURN_PER_S * interval))
    for _render in range(RENDERS):
        for _ in range(per_gap):  # the events a watch delivers between two renders
            obj = _churn_event(rng, claims, events)
            live.put_claim(obj)
            events += 1
        before = counter["n"]
        t0 = time.perf_counter()
        html = await frac._render_options_form_async(frac)
        frac_times.append(time.perf_counter() - t0)
        calls += counter["n"] - before
        t0 = time.perf_counter()
        assert plain._render_options_form(profiles)
        plain_times.append(time.perf_counter() - t0)
        await asyncio.sleep(interval)
    h100 = first.pools["h100-dra"]["10GiB"]
    mig = first.pools["a100-dmig"]["mig-1g.10gb"]
    await watcher.stop()
    return {
        "fracspawner_render_ms": _stats(frac_times),
        "kubespawner_render_ms": _stats(plain_times),
        "k8s_api_requests_per_render": calls / RENDERS,
        "claim_events": events,
        "events_that_changed_counting": live.changes - changes_before,
        "nodes_recounted_by_reads": live.recounted - recounted_before,
        "initial_load_s": round(load_s, 2),
        "counts_at_start": {
            "h100-dra 10GiB": [h100.free, h100.total],
            "a100-dmig mig-1g.10gb": [mig.free, mig.total],
        },
    }


def watch_memory() -> dict[str, Any]:
    """What the DRA records, index and sums hold against the raw objects (parsed JSON, as a
    reflector keeps them), each measured from empty with tracemalloc."""
    from fracspawner.backends import load_catalog
    from fracspawner.capacity.live import LiveCapacity

    nodes, slices, claims = cluster()
    text = [json.dumps(o) for o in slices + claims]
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
    n = len([o for o in raw if o["kind"] == "ResourceSlice"])
    live.replace_slices(raw[:n])
    live.replace_claims(raw[n:])
    live.snapshot()
    del raw
    gc.collect()
    kept = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return {
        "fracspawner_bytes": kept,
        "raw_objects_bytes": raw_bytes,
        "ratio": round(kept / raw_bytes, 3),
        "slices": NODES,
        "claims": CLAIMS,
    }


def run() -> tuple[dict[str, Any], dict[str, Any]]:
    """(headline `dra` keys for scale.json, details for scale_details.json)."""
    render = asyncio.run(churn_render())
    memory = watch_memory()
    headline = {
        "churn_render_p50_ms": render["fracspawner_render_ms"]["p50"],
        "churn_render_p99_ms": render["fracspawner_render_ms"]["p99"],
        "kubespawner_render_median_ms": render["kubespawner_render_ms"]["p50"],
        "k8s_api_requests_per_render": render["k8s_api_requests_per_render"],
        "watch_memory_ratio": memory["ratio"],
    }
    details = {
        "topology": {
            "nodes": NODES,
            "gpus_per_node": GPUS,
            "claims": CLAIMS,
            "claim_events_per_s": CHURN_PER_S,
            "fed": "in process, as the ResourceSlice/ResourceClaim watches feed LiveCapacity",
        },
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
