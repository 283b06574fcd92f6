"""N x 1/N of a GPU fits the memory the device really registers (issue 14, item 7).

The pods are what `fracspawner plan` would send for the demo catalog's HAMi pool; the node is
the demo topology's H100 node, registering what NVML reports (81559 MiB, not 81920); the
devcluster's scheduler fits HAMi's resources per device as HAMi's extender does
(devcluster/hami.py).
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
from pathlib import Path

import pytest
import yaml

from devcluster import DevCluster
from fracspawner.cli.plan import build_bare_manifest
from fracspawner.model.gpumodels import GPU_MODELS
from tests.conftest import DEMO_CATALOG, DEMO_TOPOLOGY

pytestmark = pytest.mark.e2e

H100_NVML_MIB = GPU_MODELS["H100-80GB"].nvml_memory_mib


def one_gpu_h100() -> dict:
    """The demo topology's HAMi H100 node, cut down to its first GPU."""
    demo = yaml.safe_load(DEMO_TOPOLOGY.read_text())
    node = copy.deepcopy(next(n for n in demo["nodes"] if n["name"] == "gpu-h100-1"))
    register = "hami.io/node-nvidia-register"
    devices = json.loads(node["annotations"][register])
    node["annotations"][register] = json.dumps(devices[:1])
    node["labels"]["nvidia.com/gpu.count"] = "1"
    node["capacity"]["nvidia.com/gpu"] = str(devices[0]["count"])
    return {"nodes": [node]}


def test_the_demo_topology_registers_what_nvml_reports():
    demo = yaml.safe_load(DEMO_TOPOLOGY.read_text())
    node = next(n for n in demo["nodes"] if n["name"] == "gpu-h100-1")
    devices = json.loads(node["annotations"]["hami.io/node-nvidia-register"])
    assert {d["devmem"] for d in devices} == {H100_NVML_MIB} == {81559}
    assert node["labels"]["nvidia.com/gpu.memory"] == "81559"


def slice_pod(spec: str, name: str) -> dict:
    """The pod a spawn of `spec` on the demo's h100 pool creates (GPU fields exact), with a
    command that just waits."""
    pod = build_bare_manifest(str(DEMO_CATALOG), {"gpu": spec, "pool": "h100"}, admin=True)
    pod["metadata"]["name"] = name
    container = pod["spec"]["containers"][0]
    container["command"] = ["sleep", "600"]
    container.pop("ports", None)
    return pod


async def settle(cluster: DevCluster, names: list[str]) -> dict[str, dict]:
    """The pods once each is bound or reported unschedulable."""
    deadline = time.monotonic() + 20
    while True:
        pods = {n: cluster.get("pods", "default", n) for n in names}
        if all(p["spec"].get("nodeName") or _unschedulable(p) for p in pods.values()):
            return pods
        if time.monotonic() > deadline:
            raise AssertionError(f"pods did not settle: {pods}")
        await asyncio.sleep(0.05)


def _unschedulable(pod: dict) -> bool:
    return any(
        c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
        for c in pod["status"].get("conditions") or []
    )


async def place(tmp_path: Path, pods: list[dict]) -> dict[str, dict]:
    async with DevCluster(one_gpu_h100(), state_dir=tmp_path / "state") as cluster:
        for pod in pods:
            cluster.create("pods", "default", pod)
        return await settle(cluster, [p["metadata"]["name"] for p in pods])


@pytest.mark.parametrize(("spec", "n"), [("1/4", 4), ("1/8", 8), ("1/2", 2)])
async def test_n_slices_of_one_nth_fill_a_gpu_and_no_more(tmp_path, spec, n):
    pods = [slice_pod(spec, f"s{i}") for i in range(n + 1)]
    placed = await place(tmp_path, pods)
    bound = [name for name, p in placed.items() if p["spec"].get("nodeName")]
    # all N fit on the one GPU; the (N+1)th waits, as on a real HAMi node
    assert bound == [f"s{i}" for i in range(n)], placed[f"s{n}"]["status"]
    assert _unschedulable(placed[f"s{n}"])
    held = 0
    for name in bound:
        allocated = placed[name]["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"]
        held += int(allocated.split(",")[2])
    assert held <= H100_NVML_MIB


async def test_mixed_fractions_that_add_up_to_one_gpu_fit(tmp_path):
    specs = ["1/2", "1/4", "1/8", "1/8"]
    placed = await place(tmp_path, [slice_pod(s, f"m{i}") for i, s in enumerate(specs)])
    assert all(p["spec"].get("nodeName") == "gpu-h100-1" for p in placed.values())


async def test_nominal_mib_leaves_the_last_quarter_unschedulable(tmp_path):
    # what fracspawner asked before: 20480 MiB for 1/4 of an "80 GB" card. Four of those need
    # 81920 MiB; the device has 81559, so the fourth never schedules (the bug this fixes)
    pods = []
    for i in range(4):
        pod = slice_pod("1/4", f"n{i}")
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        del limits["nvidia.com/gpumem-percentage"]
        limits["nvidia.com/gpumem"] = "20480"
        pods.append(pod)
    placed = await place(tmp_path, pods)
    assert [n for n, p in placed.items() if p["spec"].get("nodeName")] == ["n0", "n1", "n2"]
    assert _unschedulable(placed["n3"])
