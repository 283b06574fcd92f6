"""A server the hub has not listed yet holds GPU memory too (issue 36 item 1).

The culler learns pools and slices from the hub's listing, once a cycle; a server started since
holds memory on its GPU before the culler's next listing. The capacity benchmark lost a kernel
on the research trace (HAMi, half the GPUs): a server seated at 14:50 ran its first cell, and
the culler, counting only the servers it had listed, granted a waiting resume room that was
no longer there; the restore met CUDA out of memory and, on current drivers, lost the kernel's
GPU state (NVIDIA/cuda-checkpoint#44). The pod watch knows the new pod and its GPU: the grant
counts it (its report where it has one, its whole slice where not).

Driven through the real `Culler.answer_report`, the servers' real SwapAgent and Hibernator, on
the benchmark's model of a HAMi GPU (benchmarks/bench_culler.py: virtualised NVML, the #44
driver).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from benchmarks.bench_culler import (
    OVERCOMMIT,
    OVERCOMMIT_KIND,
    Sim,
    _dt,
    bench_catalog,
    pod_host,
    v,
)
from benchmarks.culler_trace import Cluster
from tests.test_bench_culler import _culler, _hibernate, _lab

SLICE = 20390.0  # 1/4 of an H100 as the catalog sizes it


def _gpu_with_room_for_one_resume(tmp_path: Path) -> tuple[Sim, list]:
    """One HAMi H100, over-committed twice: ann's hibernated kernel (17,531 MiB) waits to
    resume; bob, cat and dan hold 51,020 MiB, so 30,539 MiB are free: room for ann."""
    users = _lab(5, 20000)
    sim = Sim(users, OVERCOMMIT_KIND, Cluster(1), "reserving", bench_catalog(None, OVERCOMMIT),
              OVERCOMMIT)  # fmt: skip
    sim.host = pod_host(tmp_path)
    now = _dt(v(0))
    servers = [sim.demand(u, 0) for u in users[:4]]
    ann, *others = servers
    ann.kernel_mib = 17531.0
    _hibernate(ann, now)
    for s, mib in zip(others, (SLICE, SLICE, 10240.0), strict=True):
        s.ensure_kernel(now)
        s.holds_memory, s.busy, s.kernel_mib = True, True, mib
    return sim, servers


def _resume_after(sim: Sim, culler, eve_first: bool) -> None:
    ann = sim.servers["lab-00"]

    async def minute() -> None:
        sim.minute, sim.now_t = 1, v(1)
        if eve_first:  # eve's report reaches the culler before ann's
            eve = sim.servers.pop("lab-04")
            sim.servers = {"lab-04": eve, **sim.servers}
        ann.monitor.hibernator.resume(ann.kernel_id, "a cell")
        for s in sim.servers.values():
            sim.read(s, _dt(v(1)))
        await sim.exchange(culler, 1)

    asyncio.run(minute())


def _eve_starts(sim: Sim) -> None:
    """eve's server starts after the culler's last listing; her first cell takes 16,384 MiB."""
    eve = sim.demand(sim.users[4], 1)
    assert eve is not None and eve.gpu == 0
    eve.ensure_kernel(_dt(v(1)))
    eve.holds_memory, eve.busy, eve.kernel_mib = True, True, 16384.0


def test_an_unlisted_server_without_a_report_counts_its_slice(tmp_path: Path):
    sim, _ = _gpu_with_room_for_one_resume(tmp_path)
    culler = _culler(sim)  # lists ann, bob, cat, dan: the hub's record at its last cycle
    _eve_starts(sim)
    _resume_after(sim, culler, eve_first=False)
    ann = sim.servers["lab-00"]
    assert sim.summary()["gpu_state_lost"] == 0, (
        f"granted room that eve's new server holds: {sim.grants} grant(s), ann's kernel lost"
    )
    assert ann.hibernated() and ann.monitor.hibernator.kernels[ann.kernel_id].waiting()


def test_an_unlisted_server_s_report_counts(tmp_path: Path):
    sim, _ = _gpu_with_room_for_one_resume(tmp_path)
    culler = _culler(sim)
    _eve_starts(sim)
    _resume_after(sim, culler, eve_first=True)
    assert sim.summary()["gpu_state_lost"] == 0, (
        f"granted room that eve's new server holds: {sim.grants} grant(s), ann's kernel lost"
    )


def test_a_listed_gpu_with_room_still_grants(tmp_path: Path):
    # without eve the room is there: the grant comes and the kernel is back
    sim, _ = _gpu_with_room_for_one_resume(tmp_path)
    culler = _culler(sim)
    _resume_after(sim, culler, eve_first=False)
    ann = sim.servers["lab-00"]
    assert sim.grants == 1 and not ann.hibernated()
    assert sim.summary()["gpu_state_lost"] == 0


def test_the_pod_watch_names_every_server_pod_with_its_pool_and_slice():
    from fracspawner.culler.serverpods import ServerPods

    pod = {
        "metadata": {
            "namespace": "jhub", "name": "jupyter-eve",
            "labels": {"fracspawner.io/pool": "h100"},
            "annotations": {"fracspawner.io/gpu-memory-mib": "20389",
                            "hub.jupyter.org/username": "eve@lab", "hub.jupyter.org/servername": "",
                            "hami.io/vgpu-devices-allocated": "GPU-a,NVIDIA,20389,0:;"},
        },
        "spec": {"nodeName": "node-0", "containers": [{"resources": {"limits": {}}}]},
    }  # fmt: skip
    watch = ServerPods("jhub")
    watch.put(pod)
    watch.put({"metadata": {"namespace": "other", "name": "jupyter-x"}, "spec": {}})
    ((name, where),) = watch.placements()
    assert name == "jupyter-eve" and where.node == "node-0"
    assert where.pool == "h100" and where.memory_mib == 20389.0
    assert where.uuids == frozenset({"GPU-a"}) and where.owner == ("eve@lab", "")
