"""Keep rather than kill where memory can be moved (issue 36, item 2).

A hibernated kernel holds no GPU memory: its state is in host memory and comes back on its next
message. On the pools where hibernation is on by default (time-slicing, MPS, over-committed: the
memory it frees is usable by others) kernel_gpu_idle used to shut it down 30 min after it went
idle anyway, and a kernel whose resume had waited for room for 31 min was shut down by its own
server. Now a hibernated kernel stays hibernated (host memory is bounded per node by the culler);
a kernel still on the GPU is shut down by kernel_gpu_idle as before.

The virtual clock and the server model are tests/test_presence.py's.
"""

from __future__ import annotations

import asyncio

import pytest

from fracspawner.culler.reports import parse_report
from fracspawner.serverext.hibernate import KernelSleep
from fracspawner.serverext.sources import GpuDevice, GpuSample
from tests.test_presence import KERNEL_GPU_IDLE, Server, t

HIBERNATE = 600  # the pool's kernel_gpu_hibernate: 10 min


def reading(server: Server) -> list[str]:
    """A GPU reading in which the kernel holds nothing (its state is in host memory), then the
    kernel rule; the kernels shut down."""
    device = GpuDevice("0", "NVIDIA H100 80GB HBM3", "GPU-0", 81559, 0, 0)
    server.monitor.apply(GpuSample("sim", [device], []), [], set(server.km.kernels), server.now)
    return asyncio.run(server.monitor.cull_idle_kernels(server.now))


@pytest.mark.parametrize("waiting", [False, True], ids=["hibernated", "resume-waiting"])
def test_a_hibernated_kernel_is_kept_not_shut_down(monkeypatch, waiting):
    server = Server(monkeypatch, env={"FRACSPAWNER_KERNEL_GPU_HIBERNATE_SECONDS": str(HIBERNATE)})
    sleep = KernelSleep("k", state="hibernated", memory_mib=8192.0, since=t(HIBERNATE))
    if waiting:  # its cell was run at minute 20: the resume waits for room on the GPU since
        sleep.gpu_full, sleep.waiting_since = True, t(20 * 60)
        server.km.kernels["k"].last_activity = t(20 * 60)
    server.monitor.hibernator.kernels["k"] = sleep
    for minute in range(HIBERNATE // 60, 4 * 60):
        server.now = t(minute * 60)
        culled = reading(server)
        assert culled == [], f"shut down at minute {minute}"
    assert "k" in server.km.kernels
    (kernel,) = server.report()["kernels"]
    assert kernel["cull_at"] is None and kernel["hibernation"]["state"] == "hibernated"
    assert server.report()["warnings"] == []
    # what the culler reads of it for the host-memory budget (culler/hostbudget.py)
    (held,) = parse_report(server.report(), received_at=server.now.timestamp()).hibernated_kernels
    assert (held.kernel_id, held.mib, held.waiting) == ("k", 8192.0, waiting)
    assert held.since == t(HIBERNATE).timestamp()


def test_a_kernel_on_the_gpu_is_still_shut_down(monkeypatch):
    """Not hibernated (refused, or hibernation off): kernel_gpu_idle as before."""
    server = Server(monkeypatch)
    minute = 0
    while not server.reading():
        minute += 1
        server.now = t(minute * 60)
    assert minute == KERNEL_GPU_IDLE / 60
