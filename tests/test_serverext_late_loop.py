"""A server's own kernel shut-down never acts on an idle time it has not finished reading
(issue 28, 13a: on a loaded machine a kernel was shut down while its user kept working).

Three ways the monitor could decide on stale facts, each checked with the real GpuMonitor:
- its loop wakes up late (a starved or blocked server): requests that came meanwhile wait in
  the event loop, and jupyter-server records a request's activity only when it finishes
  (`APIHandler.finish` -> `update_api_activity`, jupyter_server/base/handlers.py), several
  loop turns after it arrived;
- shutting one kernel down takes seconds (jupyter_client waits for the kernel to exit), and
  the user may come back meanwhile: the next kernel's deadline must be read again;
- a GPU reading comes back later than it was taken (NVML under load): it says nothing of the
  GPU after it was taken.
The loop may be held while a round runs too (a reading stuck in its thread, a shutdown), and
beside it (a hibernation round; the culler's orders, read from the answers to the reports).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from datetime import timedelta
from typing import Any

from fracspawner.serverext import monitor as monitor_module
from fracspawner.serverext.sources import GpuDevice, GpuProcess, GpuSample
from tests.test_hibernation import GIB
from tests.test_hibernation_driver import (  # noqa: F401 (fixtures)
    add_process,
    fake,
    hibernator,
    sleeper,
)

H100 = {"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81920}


class FakeKernel:
    def __init__(self, last_activity, execution_state="idle"):
        self.last_activity, self.execution_state = last_activity, execution_state


class FakeKernelManager:
    """MappingKernelManager's parts the monitor reads; `on_shutdown` runs while a shutdown
    is in progress (jupyter_client's shutdown waits for the kernel process)."""

    def __init__(self, kernels, on_shutdown=None):
        self.kernels, self.on_shutdown = kernels, on_shutdown
        self.last_kernel_activity = None

    def list_kernel_ids(self):
        return list(self.kernels)

    def get_kernel(self, kernel_id):
        return self.kernels[kernel_id]

    async def shutdown_kernel(self, kernel_id):
        if self.on_shutdown is not None:
            self.on_shutdown(kernel_id)
        del self.kernels[kernel_id]


def policy_env(monkeypatch, kernel_idle: float) -> None:
    monkeypatch.setenv("FRACSPAWNER_GPU_SLICE", "1/4")
    monkeypatch.setenv("FRACSPAWNER_KERNEL_GPU_IDLE_SECONDS", str(kernel_idle))
    for name in ("FRACSPAWNER_SERVER_GPU_IDLE_SECONDS", "FRACSPAWNER_KERNEL_GPU_HIBERNATE_SECONDS"):
        monkeypatch.delenv(name, raising=False)


async def user_request(settings: dict, back: asyncio.Event) -> None:
    """The user's request: several loop turns; its activity counts when it ends."""
    for _ in range(50):
        await asyncio.sleep(0)
    settings["api_last_activity"] = monitor_module.utcnow()
    back.set()


def hold_the_loop(loop: asyncio.AbstractEventLoop, arriving: Coroutine[Any, Any, None]) -> None:
    """`arriving` comes while the server's loop is held for 2.5 s (CPU starvation, a blocking
    call): it is processed only after."""
    loop.create_task(arriving)
    time.sleep(2.5)  # noqa: ASYNC251 -- holds the loop on purpose


def test_a_late_loop_does_not_shut_down_a_kernel_under_a_working_user(monkeypatch, tmp_path):
    """The user works (a request every 0.2 s); the server's loop is then held for 2 s (CPU
    starvation, a blocking call) while the user's next request arrives. The monitor wakes
    late, before that request is processed: it must not take the user for gone."""
    policy_env(monkeypatch, kernel_idle=1)
    gpu = tmp_path / "gpu.json"
    gpu.write_text(json.dumps({"devices": [H100], "kernels": {"k": {"memory_mib": 4096}}}))

    async def scenario() -> tuple[bool, bool]:
        loop = asyncio.get_running_loop()
        now = monitor_module.utcnow()
        settings = {
            "kernel_manager": FakeKernelManager({"k": FakeKernel(now)}),
            "started": now, "api_last_activity": now, "last_activity_times": {},
        }  # fmt: skip
        monitor = monitor_module.GpuMonitor(
            settings=settings, source_spec=f"sim:{gpu}", poll_interval=0.3
        )

        async def request() -> None:
            """An API request: it takes a few loop turns, its activity counts when it ends."""
            await asyncio.sleep(0.1)
            settings["api_last_activity"] = monitor_module.utcnow()

        monitor.start()
        try:
            for _ in range(10):  # 2 s of work: the kernel (1 s limit) stays
                await request()
                await asyncio.sleep(0.1)
            alive_while_working = "k" in settings["kernel_manager"].kernels
            # a request arrives while the loop is held
            arrives = threading.Timer(
                0.2, lambda: loop.call_soon_threadsafe(lambda: loop.create_task(request()))
            )
            arrives.start()
            time.sleep(2.0)  # noqa: ASYNC251 -- holds the loop on purpose: nothing runs
            await asyncio.sleep(0.6)  # two of the monitor's rounds after it
            alive_after = "k" in settings["kernel_manager"].kernels
            # the user leaves: the kernel goes, rounds on time decide again
            deadline = time.monotonic() + 30
            while "k" in settings["kernel_manager"].kernels and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert "k" not in settings["kernel_manager"].kernels, "never shut down"
            return alive_while_working, alive_after
        finally:
            await monitor.stop()

    alive_while_working, alive_after = asyncio.run(scenario())
    assert alive_while_working
    assert alive_after, "shut down under a working user by a late loop"


def test_each_kernel_s_deadline_is_read_again_just_before_it_is_shut_down(monkeypatch):
    """Two kernels idle past the limit. Shutting the first down takes seconds, and the user
    comes back meanwhile (opens a notebook: an API request): the second stays."""
    policy_env(monkeypatch, kernel_idle=1800)
    t0 = monitor_module.utcnow()
    now = t0 + timedelta(hours=1)
    settings = {"started": t0, "api_last_activity": t0, "last_activity_times": {}}

    def user_comes_back(kernel_id: str) -> None:
        settings["api_last_activity"] = now

    kernels = {"a": FakeKernel(t0), "b": FakeKernel(t0)}
    settings["kernel_manager"] = FakeKernelManager(kernels, on_shutdown=user_comes_back)
    monitor = monitor_module.GpuMonitor(settings=settings, source_spec="none")
    monitor.reason, monitor.started = None, t0
    procs = [GpuProcess("0", 4096, 0.0, kernel_id=k) for k in ("a", "b")]
    device = GpuDevice("0", "H100", "GPU-0", 81920, 8192, 0)
    monitor.apply(GpuSample("sim", [device], procs), [(p.kernel_id, p) for p in procs],
                  {"a", "b"}, now)  # fmt: skip
    assert asyncio.run(monitor.cull_idle_kernels(now)) == ["a"]
    assert set(kernels) == {"b"}


def test_a_reading_that_came_back_late_says_nothing_after_it_was_taken(monkeypatch):
    """The reading was taken at 29:58 of a 30 min limit and came back at 30:05: the GPU is
    known idle until 29:58 only, so the kernel is not shut down on it."""
    policy_env(monkeypatch, kernel_idle=1800)
    t0 = monitor_module.utcnow()
    settings = {"started": t0, "api_last_activity": t0, "last_activity_times": {},
                "kernel_manager": FakeKernelManager({"k": FakeKernel(t0)})}  # fmt: skip
    monitor = monitor_module.GpuMonitor(settings=settings, source_spec="none")
    monitor.reason, monitor.started = None, t0
    procs = [GpuProcess("0", 4096, 0.0, kernel_id="k")]
    device = GpuDevice("0", "H100", "GPU-0", 81920, 4096, 0)
    taken, back = t0 + timedelta(seconds=1798), t0 + timedelta(seconds=1805)
    sample = GpuSample("sim", [device], procs)
    monitor.apply(sample, [("k", procs[0])], {"k"}, back, taken=taken)
    assert asyncio.run(monitor.cull_idle_kernels(back)) == []
    # the next reading, taken after the limit: now it is known
    monitor.apply(sample, [("k", procs[0])], {"k"}, back, taken=back)
    assert asyncio.run(monitor.cull_idle_kernels(back)) == ["k"]


def test_a_hibernation_round_decides_no_later_kernel_while_the_loop_is_late(
    monkeypatch,
    tmp_path,
    fake,  # noqa: F811 (the fixtures)
    sleeper,  # noqa: F811
):
    """Two kernels idle past kernel_gpu_hibernate. A hibernation round runs beside the loop
    for minutes (a checkpoint copies 1.4-1.9 GiB/s), and the server is held while the first
    kernel's checkpoint runs (CPU starvation, a blocking call); the user's request arrives
    meanwhile and waits in the event loop. The round went on to the second kernel on the
    user's idle time from before the request, and hibernated it under a working user. Now
    each kernel of the round is decided only while the loop keeps time (`late_tolerance`),
    as the loop's own rounds are: the second stays, its user back."""
    policy_env(monkeypatch, kernel_idle=0)
    monkeypatch.delenv("FRACSPAWNER_KERNEL_GPU_IDLE_SECONDS")
    monkeypatch.setenv("FRACSPAWNER_KERNEL_GPU_HIBERNATE_SECONDS", "60")
    monkeypatch.delenv("FRACSPAWNER_GPU_OVERCOMMIT", raising=False)
    state, cgroup = fake
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    pids = {"a": sleeper.pid, "b": other.pid}
    for pid in pids.values():
        add_process(state, pid, GIB)
    gpu = tmp_path / "gpu.json"
    gpu.write_text(json.dumps({"devices": [H100], "kernels": {
        "a": {"memory_mib": GIB}, "b": {"memory_mib": GIB}}}))  # fmt: skip

    async def scenario():
        loop = asyncio.get_running_loop()
        t0 = monitor_module.utcnow() - timedelta(hours=2)
        kernels = {kid: FakeKernel(t0) for kid in pids}
        for kid, pid in pids.items():
            kernels[kid].pid = pid
        settings = {"kernel_manager": FakeKernelManager(kernels), "started": t0,
                    "api_last_activity": t0, "last_activity_times": {}}  # fmt: skip
        monitor = monitor_module.GpuMonitor(
            settings=settings, source_spec=f"sim:{gpu}", poll_interval=0.3
        )
        monitor.started = t0
        hib = monitor.hibernator = hibernator(cgroup)
        offload, back = hib.offload, asyncio.Event()

        def request() -> Coroutine[Any, Any, None]:
            return user_request(settings, back)

        def held() -> None:
            hold_the_loop(loop, request())  # the copy ends meanwhile

        async def checkpoint_while_held(call, *args):
            if call == hib._suspend and args[0] == pids["a"]:
                copy = asyncio.ensure_future(offload(call, *args))
                loop.call_soon(held)
                return await copy
            return await offload(call, *args)

        hib.offload = checkpoint_while_held
        monitor.start()
        try:
            for _ in range(3000):  # the bound only ends a failing test
                if hib.suspended("a") and back.is_set():
                    break
                await asyncio.sleep(0.01)
            assert hib.suspended("a") and back.is_set()
            # a few of the loop's rounds after the user came back: they decide again
            seen = monitor.sampled_at
            for _ in range(3):
                while monitor.sampled_at == seen:
                    await asyncio.sleep(0.05)
                seen = monitor.sampled_at
            await asyncio.sleep(0.3)
            return [h["kernel_id"] for h in hib.hibernations], hib.kernel_json("b")["state"]
        finally:
            await monitor.stop()
            for kid in pids:
                hib.forget(kid)

    try:
        hibernated, b_state = asyncio.run(scenario())
    finally:
        other.kill()
        other.wait()
    assert hibernated == ["a"], "hibernated under a user whose request waited in the loop"
    assert b_state == "running"


async def _rounds(monitor, count: int) -> None:
    """Wait for `count` more of the loop's readings (the bound only ends a failing test)."""
    seen = monitor.sampled_at
    for _ in range(count):
        for _ in range(600):
            if monitor.sampled_at != seen:
                break
            await asyncio.sleep(0.05)
        assert monitor.sampled_at != seen, "the loop took no reading"
        seen = monitor.sampled_at


def test_a_hibernation_round_sees_the_loop_held_while_a_reading_is_under_way(
    monkeypatch,
    tmp_path,
    fake,  # noqa: F811 (the fixtures)
    sleeper,  # noqa: F811
):
    """As above, two kernels idle past kernel_gpu_hibernate and the server held during the
    first's checkpoint while the user's request arrives, but the loop's round is under way
    meanwhile: its GPU reading is stuck in its thread (NVML may block for long under load).
    The loop had no timer pending then, and `loop_on_time` answered "on time" however long
    the round ran: the second kernel was hibernated under its user, back. Now a round ticks
    while it runs, and the hold is seen: the second stays."""
    policy_env(monkeypatch, kernel_idle=0)
    monkeypatch.delenv("FRACSPAWNER_KERNEL_GPU_IDLE_SECONDS")
    monkeypatch.setenv("FRACSPAWNER_KERNEL_GPU_HIBERNATE_SECONDS", "60")
    monkeypatch.delenv("FRACSPAWNER_GPU_OVERCOMMIT", raising=False)
    state, cgroup = fake
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    pids = {"a": sleeper.pid, "b": other.pid}
    for pid in pids.values():
        add_process(state, pid, GIB)
    gpu = tmp_path / "gpu.json"
    gpu.write_text(json.dumps({"devices": [H100], "kernels": {
        "a": {"memory_mib": GIB}, "b": {"memory_mib": GIB}}}))  # fmt: skip
    stuck, release = threading.Event(), threading.Event()

    async def scenario():
        loop = asyncio.get_running_loop()
        t0 = monitor_module.utcnow() - timedelta(hours=2)
        kernels = {kid: FakeKernel(t0) for kid in pids}
        for kid, pid in pids.items():
            kernels[kid].pid = pid
        settings = {"kernel_manager": FakeKernelManager(kernels), "started": t0,
                    "api_last_activity": t0, "last_activity_times": {}}  # fmt: skip
        monitor = monitor_module.GpuMonitor(
            settings=settings, source_spec=f"sim:{gpu}", poll_interval=0.3
        )
        monitor.started = t0
        read = monitor.source.sample

        def slow_read():
            if stuck.is_set():
                release.wait(30)  # the bound only ends a failing test
            return read()

        monitor.source.sample = slow_read
        hib = monitor.hibernator = hibernator(cgroup)
        offload, back = hib.offload, asyncio.Event()

        def request() -> Coroutine[Any, Any, None]:
            return user_request(settings, back)

        def held() -> None:
            hold_the_loop(loop, request())  # the copy ends meanwhile

        async def checkpoint_while_held(call, *args):
            if call == hib._suspend and args[0] == pids["a"]:
                stuck.set()  # the loop's next reading does not come back
                for _ in range(3000):  # the bound only ends a failing test
                    if monitor.reading_since is not None:
                        break
                    await asyncio.sleep(0.01)
                assert monitor.reading_since is not None, "no reading under way"
                copy = asyncio.ensure_future(offload(call, *args))
                loop.call_soon(held)
                return await copy
            return await offload(call, *args)

        hib.offload = checkpoint_while_held
        monitor.start()
        try:
            for _ in range(3000):  # the bound only ends a failing test
                if hib.suspended("a") and back.is_set():
                    break
                await asyncio.sleep(0.01)
            assert hib.suspended("a") and back.is_set()
            await asyncio.sleep(0.1)  # the hibernation round, if it went on, is under way
            release.set()  # the reading comes back
            await _rounds(monitor, 3)  # rounds on time after the user came back decide again
            await asyncio.sleep(0.3)
            return [h["kernel_id"] for h in hib.hibernations], hib.kernel_json("b")["state"]
        finally:
            release.set()
            await monitor.stop()
            for kid in pids:
                hib.forget(kid)

    try:
        hibernated, b_state = asyncio.run(scenario())
    finally:
        other.kill()
        other.wait()
    assert hibernated == ["a"], "hibernated while the loop was held during a reading"
    assert b_state == "running"


def test_a_shut_down_round_sees_the_loop_held_during_a_kernel_s_shut_down(monkeypatch, tmp_path):
    """Two kernels idle past kernel_gpu_idle, shut down in one of the loop's rounds. The
    server is held while the first one's shutdown is awaited (jupyter_client waits for the
    kernel to exit), and the user's request (opening a notebook) arrives meanwhile. The
    second kernel's deadline, read again after the first's shutdown, still had the user's
    idle time from before the request: it was shut down, its user's state lost. Now no
    further kernel of the round is shut down while the loop is late: the second stays."""
    policy_env(monkeypatch, kernel_idle=60)
    gpu = tmp_path / "gpu.json"
    gpu.write_text(json.dumps({"devices": [H100], "kernels": {
        "a": {"memory_mib": 4096}, "b": {"memory_mib": 4096}}}))  # fmt: skip

    async def scenario() -> set[str]:
        loop = asyncio.get_running_loop()
        t0 = monitor_module.utcnow() - timedelta(hours=2)
        settings = {"started": t0, "api_last_activity": t0, "last_activity_times": {}}
        back = asyncio.Event()

        def request() -> Coroutine[Any, Any, None]:
            return user_request(settings, back)

        def held() -> None:
            hold_the_loop(loop, request())

        class SlowShutdown(FakeKernelManager):
            async def shutdown_kernel(self, kernel_id):
                if kernel_id == "a":
                    loop.call_soon(held)
                await asyncio.sleep(0.05)  # the kernel process exits
                del self.kernels[kernel_id]

        kernels = {"a": FakeKernel(t0), "b": FakeKernel(t0)}
        settings["kernel_manager"] = SlowShutdown(kernels)
        monitor = monitor_module.GpuMonitor(
            settings=settings, source_spec=f"sim:{gpu}", poll_interval=0.3
        )
        monitor.started = t0
        monitor.start()
        try:
            for _ in range(3000):  # the bound only ends a failing test
                if "a" not in kernels and back.is_set():
                    break
                await asyncio.sleep(0.01)
            assert "a" not in kernels and back.is_set()
            await _rounds(monitor, 3)  # rounds on time after the user came back decide again
            return set(kernels)
        finally:
            await monitor.stop()

    assert asyncio.run(scenario()) == {"b"}, "shut down while the loop was held"


def swap_agent_on_one_kernel(monkeypatch, tmp_path, driver, process) -> Callable[[], tuple]:
    """A server whose one kernel "k" (`process`, 1 GiB on the fake driver `driver`) is idle
    for the policy, with the swap agent that reads the culler's answers: a function that makes
    (kernels, monitor, hibernator, agent) inside the test's event loop."""
    from fracspawner.serverext.swap import SwapAgent

    policy_env(monkeypatch, kernel_idle=3600)
    monkeypatch.delenv("FRACSPAWNER_GPU_OVERCOMMIT", raising=False)
    state, cgroup = driver
    add_process(state, process.pid, GIB)
    gpu = tmp_path / "gpu.json"
    gpu.write_text(json.dumps({"devices": [H100], "kernels": {"k": {"memory_mib": GIB}}}))

    def make() -> tuple:
        now = monitor_module.utcnow()
        kernel = FakeKernel(now)
        kernel.pid = process.pid
        kernels = {"k": kernel}
        settings = {"kernel_manager": FakeKernelManager(kernels), "started": now,
                    "api_last_activity": now, "last_activity_times": {}}  # fmt: skip
        monitor = monitor_module.GpuMonitor(
            settings=settings, source_spec=f"sim:{gpu}", poll_interval=0.3
        )
        hib = monitor.hibernator = hibernator(cgroup)
        return kernels, monitor, hib, SwapAgent(monitor, lambda seconds: None)

    return make


def test_the_culler_s_swap_order_is_not_taken_while_the_loop_is_late(
    monkeypatch,
    tmp_path,
    fake,  # noqa: F811 (the fixtures)
    sleeper,  # noqa: F811
):
    """The culler's answer orders an idle kernel swapped out under GPU pressure
    (`hibernate_now`: idle right now, whatever its idle time). The answer is read while the
    server was held, and the user's cell, sent meanwhile, has not reached the kernel yet: its
    execution state still reads idle. The kernel was hibernated, and the cell then waited
    for the checkpoint and a restore on a GPU under pressure. Now the order is refused while
    the loop is late, as for a busy kernel (the culler asks again, or another kernel)."""
    one_kernel = swap_agent_on_one_kernel(monkeypatch, tmp_path, fake, sleeper)

    async def scenario():
        loop = asyncio.get_running_loop()
        kernels, monitor, hib, agent = one_kernel()
        kernel = kernels["k"]
        ran = asyncio.Event()

        async def cell() -> None:
            """The user's cell: several loop turns before the kernel has it (busy)."""
            for _ in range(50):
                await asyncio.sleep(0)
            kernel.execution_state = "busy"
            ran.set()

        def held() -> None:
            loop.create_task(cell())  # sent while the loop is held
            order = {"kernel_id": "k", "reason": "GPU pressure"}
            agent.on_answer({"swap": {"hibernate": [order]}})  # read meanwhile
            time.sleep(2.5)  # noqa: ASYNC251 -- holds the loop on purpose

        monitor.start()
        try:
            await _rounds(monitor, 1)
            loop.call_soon(held)
            for _ in range(3000):  # the bound only ends a failing test
                if ran.is_set() and not agent._tasks:
                    break
                await asyncio.sleep(0.01)
            assert ran.is_set() and not agent._tasks
            return [h["kernel_id"] for h in hib.hibernations], hib.kernel_json("k")["state"]
        finally:
            await monitor.stop()
            hib.forget("k")

    hibernated, k_state = asyncio.run(scenario())
    assert hibernated == [], "swapped out while the user's cell waited in the held loop"
    assert k_state == "running"


def test_the_culler_s_shut_down_order_is_not_taken_while_the_loop_is_late(
    monkeypatch,
    tmp_path,
    fake,  # noqa: F811 (the fixtures)
    sleeper,  # noqa: F811
):
    """The culler's host-budget answer orders a hibernated kernel shut down (its user away by
    a report sent before). The answer is read while the server was held, and the user's cell,
    sent meanwhile, has not reached resume.py yet: no resume under way, so the order was
    taken and the user's kernel lost. Now it is not taken while the loop is late (the culler
    tells it again later), and the cell brings the kernel back."""
    one_kernel = swap_agent_on_one_kernel(monkeypatch, tmp_path, fake, sleeper)

    async def scenario():
        loop = asyncio.get_running_loop()
        kernels, monitor, hib, agent = one_kernel()
        resumed: list[asyncio.Task | None] = []

        async def cell() -> None:
            """The user's cell: several loop turns before resume.py holds it."""
            for _ in range(50):
                await asyncio.sleep(0)
            if "k" in kernels:
                resumed.append(hib.resume("k", "a message to the kernel"))

        def held() -> None:
            loop.create_task(cell())  # sent while the loop is held
            agent.on_answer({"swap": {"shutdown": [{"kernel_id": "k"}]}})  # read meanwhile
            time.sleep(2.5)  # noqa: ASYNC251 -- holds the loop on purpose

        monitor.start()
        try:
            await _rounds(monitor, 1)
            assert await monitor.hibernate_now("k", "GPU pressure") == "hibernated"
            await _rounds(monitor, 1)
            loop.call_soon(held)
            for _ in range(3000):  # the bound only ends a failing test
                if (resumed or "k" not in kernels) and not agent._tasks:
                    break
                await asyncio.sleep(0.01)
            assert "k" in kernels, "shut down while the user's cell waited in the held loop"
            (task,) = resumed
            assert task is not None
            return await asyncio.wait_for(task, 20)
        finally:
            await monitor.stop()
            hib.forget("k")

    assert asyncio.run(scenario()) is True  # the cell runs
