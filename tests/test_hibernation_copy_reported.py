"""A checkpoint under way is in the server's report, as host memory it fills and as GPU memory it
still holds.

A checkpoint copies the kernel's GPU memory to host memory at 1.4-1.9 GiB/s (measured on an
H200, docs/serverext.md "First run on a GPU"): a minute for 80 GiB. The report said
`hibernated_gpu_memory_mib` 0 for that kernel until the copy was done, so a culler that restarted
(or first heard of this server) during the copy counted none of that host memory in its node's
budget (culler/hostbudget.py): it gave another kernel the same room, and the node's host memory
went over its budget while both copies were there. Now the report's kernel entry says what its
copy moves from the moment it starts, while its GPU memory still counts as on the GPU
(culler/pressure.py: the state "hibernating" is not off the GPU).

Through the real report builder (GpuMonitor.report) with the Hibernator on the fake checkpoint
driver (tests/fake_nvml/cuda/bindings/driver.py), read by a freshly started culler.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from datetime import timedelta

from fracspawner.culler.identity import Identity
from fracspawner.culler.pressure import swap_facts
from fracspawner.culler.reports import parse_report
from fracspawner.serverext import monitor as monitor_module
from fracspawner.serverext.reporter import _iso
from fracspawner.serverext.sources import GpuDevice, GpuProcess, GpuSample
from tests.test_hibernation import GIB
from tests.test_hibernation_driver import (  # noqa: F401 (fixtures)
    add_process,
    fake,
    hibernator,
    sleeper,
)
from tests.test_host_room import _h100_culler, _says
from tests.test_serverext_late_loop import FakeKernel, FakeKernelManager

COPY = 4 * GIB  # what bob's kernel holds on the GPU, and its checkpoint copies


def bob_s_server(state, cgroup, pid: int):
    """bob's server: one idle kernel holding COPY on the GPU, its monitor's reading taken."""
    t0 = monitor_module.utcnow() - timedelta(hours=1)
    kernel = FakeKernel(t0)
    kernel.pid = pid
    settings = {"started": t0, "api_last_activity": t0, "last_activity_times": {},
                "kernel_manager": FakeKernelManager({"k": kernel})}  # fmt: skip
    monitor = monitor_module.GpuMonitor(settings=settings, source_spec="none")
    monitor.reason, monitor.started = None, t0
    monitor.hibernator = hibernator(cgroup)
    add_process(state, pid, COPY)
    proc = GpuProcess("0", COPY, 0.0, pid=pid, kernel_id="k")
    device = GpuDevice("0", "NVIDIA H100 80GB HBM3", "GPU-h100-0", 81559, COPY, 0)
    monitor.apply(GpuSample("nvml", [device], [proc]), [("k", proc)], {"k"},
                  monitor_module.utcnow())  # fmt: skip
    return monitor


def as_sent(monitor) -> dict:
    """The report as the reporter posts it (reporter.py)."""
    return json.loads(json.dumps({**monitor.report(), "server_name": ""}, default=_iso))


async def test_a_checkpoint_under_way_is_reported_as_host_memory_and_gpu_memory(fake, sleeper):  # noqa: F811 (the fixtures)
    state, cgroup = fake
    monitor = bob_s_server(state, cgroup, sleeper.pid)
    hib = monitor.hibernator
    # the driver's checkpoint copies until the test says it is done
    copied = threading.Event()
    checkpoint = hib.driver.checkpoint

    def slow_checkpoint(pid: int) -> None:
        copied.wait(30)
        checkpoint(pid)

    hib.driver.checkpoint = slow_checkpoint
    task = asyncio.create_task(monitor.hibernate_now("k", "idle"))
    try:
        for _ in range(1000):  # the bound only ends a failing test
            if hib.kernels.get("k") and hib.kernels["k"].state == "hibernating":
                break
            await asyncio.sleep(0.02)
        assert hib.kernels["k"].state == "hibernating"

        sent = as_sent(monitor)
        (entry,) = sent["kernels"]
        assert entry["hibernation"]["state"] == "hibernating"
        # what its copy fills host memory with, from its start ...
        assert entry["hibernation"]["hibernated_gpu_memory_mib"] == COPY
        # ... while the GPU memory is still held (NVML lists it until the checkpoint is done)
        assert entry["gpu_memory_mib"] == COPY
        # the server's total counts it as its entry does (it left the copy out, while the
        # host budget counted it): host memory is taken from the copy's start
        assert sent["hibernated_gpu_memory_mib"] == COPY
        assert sent["hibernation"]["hibernated_gpu_memory_mib"] == COPY

        # a culler that has just started hears of bob's server mid-copy
        now = time.time()
        culler = _h100_culler(budget_mib=COPY * 1.5)
        culler.reports.put("bob", "", parse_report(sent, received_at=now))
        culler.answer_report(Identity("bob", ""), now)
        culler.update_hibernated()  # fracspawner_hibernated_bytes, from the server's total
        metric = culler.metrics.registry.get_sample_value(
            "fracspawner_hibernated_bytes", {"pool": "h100"}
        )
        assert metric == COPY * 2**20
        # the host budget counts bob's copy: cat's kernel is not given the same room
        swap = _says(culler, "cat", now + 1, wants=[("c1", COPY)])
        assert "host_room" not in swap, "room given into host memory bob's copy is filling"
        assert swap["host_wait"][0]["kernel_id"] == "c1"
        # the GPU side counts it where it is: still on the GPU, leaving, nothing to bring back
        (gpu,) = swap_facts(sent, now).gpus
        assert gpu.resident_mib == COPY
        assert [k.kernel_id for k in gpu.back()] == ["k"] and gpu.asleep() == []
    finally:
        copied.set()
        assert await asyncio.wait_for(task, 30) == "hibernated"

    sent = as_sent(monitor)
    assert sent["kernels"][0]["hibernation"]["hibernated_gpu_memory_mib"] == COPY
    assert sent["hibernated_gpu_memory_mib"] == COPY


async def test_a_refused_checkpoint_reports_nothing_in_host_memory(fake, sleeper):  # noqa: F811 (the fixtures)
    """The other side: a checkpoint the driver refuses (UVM or IPC memory) leaves the kernel on
    the GPU, and the report says nothing of it in host memory."""
    state, cgroup = fake
    monitor = bob_s_server(state, cgroup, sleeper.pid)
    with open(state) as f:
        data = json.load(f)
    data["gpus"][0]["processes"][0]["refuse"] = True
    state.write_text(json.dumps(data))
    assert await monitor.hibernate_now("k", "idle") == "running"
    (entry,) = as_sent(monitor)["kernels"]
    assert entry["hibernation"]["state"] == "cannot_hibernate"
    assert entry["hibernation"]["hibernated_gpu_memory_mib"] == 0
    assert monitor.hibernator.kernels["k"].memory_mib == 0
