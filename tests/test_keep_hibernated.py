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


FULL = "not hibernated: the host memory budget of node n1 (65536 MiB) has 1200 MiB left"


def _waiting_for_host_room(monkeypatch) -> tuple[Server, object]:
    """A server on an over-committed pool reporting to a culler, whose one kernel is due to
    hibernate and waits for the culler's room in its node's host budget (swap.py host_gate:
    the node's budget is full)."""
    from fracspawner.serverext.swap import SwapAgent

    monkeypatch.setenv("FRACSPAWNER_GPU_OVERCOMMIT", "2")
    server = Server(monkeypatch, env={"FRACSPAWNER_KERNEL_GPU_HIBERNATE_SECONDS": str(HIBERNATE)})
    agent = SwapAgent(server.monitor, lambda seconds: None)
    agent.ask_host_room = True
    server.monitor.hibernator.now = lambda: server.now
    return server, agent


def _shut_down_at(server: Server, each_minute) -> int:
    """The minute the kernel is shut down, `each_minute(minute)` run before each reading (what
    the server asks the culler and what the culler answers); within 4 hours."""
    for minute in range(4 * 60):
        server.now = t(minute * 60)
        each_minute(minute)
        if server.reading():
            return minute
    raise AssertionError("never shut down")


def test_a_kernel_waiting_for_host_room_stays_on_an_uncontended_gpu(monkeypatch):
    """On an over-committed pool the culler frees GPU memory when someone needs it (a swap
    order, which may shut down the oldest hibernated kernels of people away for host room).
    A kernel that waits for host room to hibernate is not shut down for idleness alone while
    nobody needs its GPU memory: that would lose the most recently idle kernel for no one's
    gain. (The breaks replay on half the GPUs shut kernels down 30 min after their person left,
    on a node whose budget was full; most sat on a contended GPU and still go: next test.)"""
    server, agent = _waiting_for_host_room(monkeypatch)
    for minute in range(0, 3 * 60):
        server.now = t(minute * 60)
        if minute * 60 >= HIBERNATE:  # due to hibernate: asks the culler, which has no room
            assert agent.host_gate("k", 8192.0) is not None
            agent.on_answer({"swap": {"host_wait": [{"kernel_id": "k", "reason": FULL}]}})
        assert server.reading() == [], f"shut down at minute {minute}"
    (kernel,) = server.report()["kernels"]
    assert kernel["cull_at"] is None


def test_a_kernel_waiting_for_a_culler_that_does_not_answer_is_shut_down_as_before(monkeypatch):
    """No answer from the culler (down, unreachable): nothing manages the GPU's memory, and
    kernel_gpu_idle is the server's own safety, as before."""
    server, agent = _waiting_for_host_room(monkeypatch)

    def ask(minute: int) -> None:
        if minute * 60 >= HIBERNATE:
            assert agent.host_gate("k", 8192.0) is not None  # asked; nobody answers

    assert _shut_down_at(server, ask) == KERNEL_GPU_IDLE / 60


def test_a_kernel_waiting_for_host_room_on_a_contended_gpu_is_shut_down_as_before(monkeypatch):
    """Where the culler's answers say the GPU is contended (under pressure, a resume waiting),
    kernel_gpu_idle frees its memory as before: a swap order may find no host room either."""
    server, agent = _waiting_for_host_room(monkeypatch)

    def ask_and_answer(minute: int) -> None:
        if minute * 60 >= HIBERNATE:
            agent.host_gate("k", 8192.0)
            agent.on_answer({"swap": {"host_wait": [{"kernel_id": "k", "reason": FULL}]}})
        agent.on_answer({"swap": {"report_in": 30}})  # the GPU is under pressure

    assert _shut_down_at(server, ask_and_answer) == KERNEL_GPU_IDLE / 60


def test_a_kernel_just_restored_is_not_shut_down_for_the_idle_time_before_it(monkeypatch):
    """A restore serves a message that waited for room: the kernel comes back because someone
    asked for it. Its idle clock starts again there, not at the message's arrival: a resume
    that waited 38 minutes for room was restored and shut down by kernel_gpu_idle within the
    same minute (capacity replay, research, time-sliced, half the GPUs: res-05's second
    notebook, its person back 25 minutes later to a kernel gone)."""
    server = Server(monkeypatch, env={"FRACSPAWNER_KERNEL_GPU_HIBERNATE_SECONDS": str(HIBERNATE)})
    server.km.kernels["k"].last_activity = t(0)  # the message, 38 min before its restore
    restored = t(38 * 60)
    sleep = KernelSleep("k", state="running", since=restored, last_resumed_at=restored)
    server.monitor.hibernator.kernels["k"] = sleep
    server.now = restored
    assert server.reading() == [], "shut down as it came back"
    server.now = t(38 * 60 + KERNEL_GPU_IDLE - 60)
    assert server.reading() == []
    server.now = t(38 * 60 + KERNEL_GPU_IDLE)
    assert server.reading() == ["k"]  # idle for kernel_gpu_idle since its restore: as before
