"""Never restore into a full GPU, and never lose a kernel to a failed restore without saying so
(issue 36, item 1). The fake driver follows NVIDIA/cuda-checkpoint#44 (driver 580.95.05, CUDA
13.0): after a restore refused with CUDA_ERROR_OUT_OF_MEMORY every later restore fails with
CUDA_ERROR_OPERATING_SYSTEM (304), unlock with ILLEGAL_STATE, and only killing the process helps.

In process, as the server wires them (serverext/__init__.py): the Hibernator with the fake
driver, the SwapAgent giving it the room on the GPU (room.py), and a monitor whose reading of
the device is the fake GPU's (what NVML shows: its size and what its processes hold).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

from fracspawner.serverext.checkpoint import CheckpointError
from fracspawner.serverext.hibernate import GPU_FULL, LOST, Hibernator, KernelSleep
from fracspawner.serverext.monitor import GpuMonitor
from fracspawner.serverext.podinfo import utcnow
from fracspawner.serverext.room import Room, room_for, virtualised_nvml
from fracspawner.serverext.sources import GpuDevice, GpuSample
from fracspawner.serverext.swap import SwapAgent
from tests.test_hibernation import GIB, cuda_state, state_of
from tests.test_hibernation_driver import (  # noqa: F401 (fixtures)
    add_process,
    fake,
    hibernator,
    set_process,
    sleeper,
    suspend,
)


class LiveMonitor:
    """The parts of GpuMonitor the agent uses; its reading is the fake GPU's, as NVML shows it
    (or, under HAMi-core, as the pod's virtualised NVML would: `reading` overrides it)."""

    def __init__(self, hib, state: Path, kernels: set[str]) -> None:
        self.hibernator, self.state, self.kernels = hib, state, kernels
        self.reading: tuple[float, float] | None = None

    @property
    def sample(self):
        gpu = json.loads(self.state.read_text())["gpus"][0]
        total = float(gpu["memory_total_mib"])
        used = sum(float(p.get("memory_mib", 0)) for p in gpu["processes"])
        total, used = self.reading or (total, used)
        device = SimpleNamespace(uuid="GPU-1", memory_total_mib=total, memory_used_mib=used)
        return SimpleNamespace(devices=[device])

    def current_sample(self):
        return self.sample

    def _kernel_ids(self) -> set[str]:
        return set(self.kernels)

    async def hibernate_now(self, kernel_id: str, reason: str) -> str:
        return "running"


def restore_calls(state: Path, pid: int) -> int:
    gpu = json.loads(state.read_text())["gpus"][0]
    return next(int(p.get("restore_calls", 0)) for p in gpu["processes"] if p["pid"] == pid)


async def until(check, what: str, timeout: float = 20.0) -> None:
    """Wait for a condition; the bound only ends a failing test."""
    for _ in range(int(timeout / 0.02)):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def plain(monkeypatch):
    """A pool that does not over-commit, NVML not virtualised."""
    monkeypatch.delenv("FRACSPAWNER_GPU_OVERCOMMIT", raising=False)
    for key in [k for k in os.environ if k.startswith("CUDA_DEVICE_MEMORY_LIMIT")]:
        monkeypatch.delenv(key)
    monkeypatch.delenv("LD_PRELOAD", raising=False)


def wired(state: Path, cgroup: Path, **traits):
    hib = hibernator(cgroup, room_poll=0.05, wait_bound=3600, **traits)
    monitor = LiveMonitor(hib, state, {"k"})
    soon: list[float] = []
    agent = SwapAgent(monitor, soon.append, room_check=0.05, restore_margin_mib=512)
    told: list[str] = []
    hib.on_restore_failed.append(lambda kid, text: told.append(text))
    return hib, monitor, agent, soon, told


async def test_44_no_restore_is_tried_into_a_full_gpu_and_the_kernel_survives(fake, sleeper, plain):  # noqa: F811 (the fixtures)
    """Today the restore is tried at once, refused for want of room, and every later one answers
    304 (#44): the kernel is lost while the cell says nothing is lost. Now it waits for room by
    NVML of the device (not virtualised here), and is restored once, when there is room."""
    state, cgroup = fake
    pid = sleeper.pid
    hib, _monitor, agent, soon, told = wired(state, cgroup)
    add_process(state, pid, 4 * GIB)
    assert await suspend(hib, "k", pid, 4 * GIB) == "hibernated"
    add_process(state, os.getpid(), 8 * GIB)  # a co-tenant takes the freed memory: 2 GiB free
    task = hib.resume("k", "a message to the kernel")
    await until(lambda: hib.kernel_json("k")["waiting_for_gpu"], "the resume waiting")
    await asyncio.sleep(0.3)
    assert restore_calls(state, pid) == 0, "a restore was tried into a full GPU (#44: lost)"
    assert cuda_state(state, pid) == "checkpointed"
    # the user is told it waits and why; the culler hears of the demand at once
    assert told and "no room on the GPU" in told[0] and "Nothing is lost" not in told[0]
    assert 0.0 in soon and agent.extend({})["swap"]["waiting"][0]["kernel_id"] == "k"
    h = hib.kernel_json("k")
    assert h["state"] == "hibernated" and "2 GiB of the GPU's 10 GiB is free" in h["waiting_why"]
    set_process(state, os.getpid(), memory_mib=2 * GIB)  # the co-tenant shrinks: room
    assert await asyncio.wait_for(task, 20) is True
    assert cuda_state(state, pid) == "running" and restore_calls(state, pid) == 1
    assert agent.extend({})["swap"]["waiting"] == []
    assert not hib.kernel_json("k")["waiting_for_gpu"]


async def test_44_a_refusal_anyway_is_told_at_once_and_its_304_is_final(fake, sleeper, plain):  # noqa: F811 (the fixtures)
    """NVML showed room but the driver refused (a reading overtaken): the user is told at once,
    never "Nothing is lost"; the one more try answers 304 (#44) and the kernel is marked lost:
    told, nothing retries it."""
    state, cgroup = fake
    pid = sleeper.pid
    hib, _monitor, agent, _soon, told = wired(state, cgroup)
    add_process(state, pid, 2 * GIB)
    assert await suspend(hib, "k", pid, 2 * GIB) == "hibernated"
    set_process(state, pid, restore_failures=1)
    task = hib.resume("k", "a message to the kernel")
    assert await asyncio.wait_for(task, 20) is False
    assert all("Nothing is lost" not in t for t in told), told
    assert "CUDA_ERROR_OUT_OF_MEMORY" in told[0] and "NVIDIA/cuda-checkpoint#44" in told[0]
    assert f"{LOST}" in told[-1] and "CUDA_ERROR_OPERATING_SYSTEM" in told[-1]
    h = hib.kernel_json("k")
    assert h["state"] == "failed" and h["reason"].startswith(LOST) and h["next_retry"] is None
    assert restore_calls(state, pid) == 2
    # marked: nothing retries it, it is no demand, and it is never hibernated again
    assert hib.resume("k", "again") is None
    assert agent.extend({})["swap"]["waiting"] == []
    await asyncio.sleep(0.3)
    assert restore_calls(state, pid) == 2
    assert await suspend(hib, "k", pid, 2 * GIB) == "failed"


async def test_hami_only_the_cullers_grant_counts(fake, sleeper, plain, monkeypatch):  # noqa: F811 (the fixtures)
    """Under HAMi-core the pod's NVML is its own limit and usage: it shows room while the GPU
    is full. Only the culler's grant lets the restore go."""
    state, cgroup = fake
    monkeypatch.setenv("CUDA_DEVICE_MEMORY_LIMIT_0", "4096m")
    pid = sleeper.pid
    hib, monitor, agent, soon, told = wired(state, cgroup)
    assert agent.grant_only and "HAMi-core" in agent.grant_only
    add_process(state, pid, 2 * GIB)
    assert await suspend(hib, "k", pid, 2 * GIB) == "hibernated"
    add_process(state, os.getpid(), 9 * GIB)  # the physical GPU is full
    monitor.reading = (4096.0, 0.0)  # the pod's virtualised view: all its 4 GiB free
    task = hib.resume("k", "a message to the kernel")
    await until(lambda: hib.kernel_json("k")["waiting_for_gpu"], "the resume waiting")
    await asyncio.sleep(0.3)
    assert restore_calls(state, pid) == 0 and 0.0 in soon
    assert "waits for the culler" in hib.kernel_json("k")["waiting_why"]
    # the culler says it waits (the GPU is full): the cell is told once
    agent.on_answer({"swap": {"wait": [{"kernel_id": "k"}], "report_in": 5}})
    agent.on_answer({"swap": {"wait": [{"kernel_id": "k"}], "report_in": 5}})
    assert told.count(GPU_FULL) <= 1 and len(told) == 1
    # it made room and grants it: restored at once
    set_process(state, os.getpid(), memory_mib=2 * GIB)
    agent.on_answer({"swap": {"resume": [{"kernel_id": "k", "gpu_memory_mib": 2 * GIB}]}})
    assert await asyncio.wait_for(task, 20) is True
    assert cuda_state(state, pid) == "running" and restore_calls(state, pid) == 1


async def test_a_long_wait_tells_the_user_how_long_why_and_what_they_can_do(fake, sleeper, plain):  # noqa: F811 (the fixtures)
    state, cgroup = fake
    pid = sleeper.pid
    hib, _monitor, _agent, _soon, told = wired(state, cgroup)
    hib.wait_bound = 0.3
    add_process(state, pid, 4 * GIB)
    assert await suspend(hib, "k", pid, 4 * GIB) == "hibernated"
    add_process(state, os.getpid(), 8 * GIB)
    task = hib.resume("k", "a message to the kernel")
    await until(lambda: len(told) >= 2, "the escalation")
    assert "has waited 0 s for room on the GPU" in told[1] or "1 s for room" in told[1], told
    assert "nothing moves theirs here" in told[1]  # not over-committed: no swap promised
    assert "2 GiB of the GPU's 10 GiB is free" in told[1]
    assert "shut down another of your own kernels" in told[1]
    assert restore_calls(state, pid) == 0
    hib.forget("k")
    with pytest.raises(asyncio.CancelledError):
        await task


def test_room_rules():
    grant = {"granted_mib": None, "devices": [(10240.0, 4096.0)], "grant_only": None}
    assert room_for(4096, margin_mib=512, **grant).ok
    assert not room_for(6000, margin_mib=512, **grant).ok  # 6144 free, not with the margin
    assert not room_for(1, margin_mib=0, **{**grant, "devices": None}).ok
    two = [(10240.0, 0.0), (10240.0, 0.0)]
    assert not room_for(1, margin_mib=0, **{**grant, "devices": two}).ok
    assert not room_for(1, margin_mib=0, **{**grant, "grant_only": "over-committed"}).ok
    assert room_for(4096, margin_mib=0, **{**grant, "grant_only": "x", "granted_mib": 4096}).ok
    assert virtualised_nvml({"CUDA_DEVICE_MEMORY_LIMIT_0": "4096m"}, "/nonexistent")
    assert virtualised_nvml({"LD_PRELOAD": "/usr/local/vgpu/libvgpu.so"}, "/nonexistent")
    assert virtualised_nvml({}, "/nonexistent") is None


@pytest.mark.parametrize(
    "size",
    [2 * GIB + 0.32, 2 * GIB * 1.2 + 1e-12],
    ids=["bytes-over-2**20", "float-noise-of-a-grown-kernel"],
)
async def test_a_grant_of_what_was_asked_restores_a_kernel_of_a_fractional_size(
    fake,  # noqa: F811 (the fixtures)
    sleeper,  # noqa: F811
    plain,
    monkeypatch,
    size,
):
    """NVML counts bytes, so a kernel's memory is rarely a whole tenth of a MiB. The culler
    grants what the server's report asked (`swap.waiting`); that grant must cover the kernel.
    Before: the report rounded 40,632.32 MiB to 40,632.3, the grant said 40,632.3, and the
    restore waited for a grant 0.02 MiB larger, for ever (breaks replay on the full cluster,
    reserving, over-committed: brk-04's kernel was granted 487 times in 258 minutes);
    and a size a hair above a tenth (39,321.600000000006 MiB: a kernel grown by 1 % steps)
    was asked as 39,321.6 and waited 16 hours with a grant every report."""
    state, cgroup = fake
    monkeypatch.setenv("CUDA_DEVICE_MEMORY_LIMIT_0", "4096m")
    pid = sleeper.pid
    hib, monitor, agent, soon, told = wired(state, cgroup)
    add_process(state, pid, size)
    assert await suspend(hib, "k", pid, size) == "hibernated"
    monitor.reading = (4096.0, 0.0)  # the pod's virtualised view
    task = hib.resume("k", "a message to the kernel")
    await until(lambda: agent.waiting(), "the resume reported waiting")
    asked = agent.waiting()[0]["gpu_memory_mib"]
    assert size - 1e-6 <= asked < size + 0.1, f"the report asks {asked} MiB for {size}"
    # the culler grants what was asked (swapdesk.py: the waiter's reported MiB)
    agent.on_answer({"swap": {"resume": [{"kernel_id": "k", "gpu_memory_mib": asked}]}})
    assert await asyncio.wait_for(task, 20) is True
    assert cuda_state(state, pid) == "running" and restore_calls(state, pid) == 1


class FlakyStateDriver:
    """GetState fails `failures` times (a documented return, e.g. CUDA_ERROR_NOT_INITIALIZED),
    then the process reads CHECKPOINTED again; each restore is counted."""

    def __init__(self, failures: int = 1) -> None:
        self.failures, self.restores = failures, 0

    def check(self) -> None:
        return None

    def state(self, pid: int) -> str:
        if self.failures > 0:
            self.failures -= 1
            raise CheckpointError("cuCheckpointProcessGetState", "CUDA_ERROR_NOT_INITIALIZED")
        return "locked" if self.restores else "checkpointed"

    def restore(self, pid: int) -> None:
        self.restores += 1

    def unlock(self, pid: int) -> None:
        pass


async def test_an_unreadable_cuda_state_is_not_room_to_restore():
    """Never restore without room confirmed by a reading that is not the pod's own view; a
    restore refused for want of room loses the kernel's GPU state on current drivers
    (NVIDIA/cuda-checkpoint#44). Before, the room gate read a GetState that failed once as
    "no memory to bring back" and let the restore go; the restore read CHECKPOINTED and restored
    4 GiB into a GPU with 2 GiB free, on a transient driver error (review s53 finding 2). Now
    the kernel waits, as for want of room, until its state reads again and the room is there."""
    drv = FlakyStateDriver()
    hib = Hibernator(driver=drv, retry_first=0.05, room_poll=0.05, wait_bound=3600)
    full = Room(False, "2 GiB of the GPU's 10 GiB is free and it needs 4 GiB")
    hib.room = lambda s: full
    hib.kernels["k"] = KernelSleep("k", state="hibernated", pid=os.getpid(), memory_mib=4 * GIB)
    task = hib.resume("k", "a message to the kernel")
    s = hib.kernels["k"]
    await until(lambda: drv.restores or (not drv.failures and s.wait_why == full.why), "a look")
    assert drv.restores == 0, "restored with no room, on an unreadable GetState"
    assert hib.kernel_json("k")["waiting_for_gpu"] and not task.done()
    hib.room = lambda s: Room(True, "room")  # the room is there now: restored, once
    hib.retry_now("k")
    assert await asyncio.wait_for(task, 20) is True and drv.restores == 1


async def test_an_unreadable_cuda_state_of_a_process_gone_is_a_restarted_kernel():
    """The other side of the rule above: a kernel restarted (or dead) while hibernated has no
    process for GetState to read. Its resume must not wait for room it will never need: it
    takes the restart path at once (its messages go to the kernel there is now)."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    drv = FlakyStateDriver(failures=10**6)  # a pid the driver does not know: never readable
    hib = Hibernator(driver=drv, retry_first=0.05, room_poll=0.05, wait_bound=3600)
    hib.room = lambda s: Room(False, "no room")
    hib.kernels["k"] = KernelSleep("k", state="hibernated", pid=gone.pid, memory_mib=4 * GIB)
    assert await asyncio.wait_for(hib.resume("k", "a message to the kernel"), 20) is True
    assert hib.kernels["k"].state == "running" and drv.restores == 0


async def test_a_checkpointed_kernel_whose_pid_this_server_cannot_see_still_waits_for_room():
    """A process the driver reads CHECKPOINTED is never taken for gone, whatever /proc shows
    (a kernel in another PID namespace than the extension, a replay's pid): its restore still
    waits for room (NVIDIA/cuda-checkpoint#44)."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    drv = FlakyStateDriver(failures=0)  # reads CHECKPOINTED
    hib = Hibernator(driver=drv, retry_first=0.05, room_poll=0.05, wait_bound=3600)
    full = Room(False, "2 GiB of the GPU's 10 GiB is free and it needs 4 GiB")
    hib.room = lambda s: full
    hib.kernels["k"] = KernelSleep("k", state="hibernated", pid=gone.pid, memory_mib=4 * GIB)
    task = hib.resume("k", "a message to the kernel")
    s = hib.kernels["k"]
    await until(lambda: drv.restores or s.wait_why == full.why, "a look at the room")
    assert drv.restores == 0 and not task.done()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_room_is_not_confirmed_by_a_reading_from_before_the_gpu_became_unreadable(
    tmp_path,
    plain,  # noqa: F811 (the fixture)
    monkeypatch,
):
    """Never restore without room confirmed by a reading that still stands; a restore refused
    for want of room loses the kernel's GPU state on current drivers
    (NVIDIA/cuda-checkpoint#44). NVML answered once (10 GiB free), then failed (an NVML error,
    the driver resetting): the monitor kept its last sample, and the room check still said
    "10 GiB of 10 GiB is free" however old it was, while a co-tenant may have filled the GPU
    (review s53 finding 3). Now a failed reading, of either kind, is no reading: the kernel
    waits until the GPU answers again."""
    for key in ("FRACSPAWNER_GPU_MEMORY_MIB", "FRACSPAWNER_GPU_SLICE"):
        monkeypatch.delenv(key, raising=False)
    gpu = tmp_path / "gpu.json"
    readable = json.dumps({"devices": [{"memory_total_mib": 10 * GIB}]})
    gpu.write_text(readable)
    monitor = GpuMonitor(settings={}, source_spec=f"sim:{gpu}")
    agent = SwapAgent(monitor, lambda s: None, restore_margin_mib=512)
    s = KernelSleep("k", state="hibernated", pid=1, memory_mib=4 * GIB, gpu_full=True)
    monitor.hibernator.kernels["k"] = s
    await monitor.poll_once()
    assert agent.room(s).ok and agent._free_mib() == 10 * GIB  # the GPU answers: room
    gpu.write_text(json.dumps({"unavailable": "NVML: Unknown Error"}))
    await monitor.poll_once()
    assert monitor.reason is not None and monitor.sample is not None  # the old sample is kept
    room = agent.room(s)
    assert not room.ok, f"room confirmed by a stale reading: {room.why}"
    assert agent._free_mib() is None  # nor woken early by it
    gpu.write_text(readable)
    await monitor.poll_once()
    assert agent.room(s).ok  # it answers again
    # any other error reading it (_run only logs it): the same
    source_sample = monitor.source.sample
    monkeypatch.setattr(monitor.source, "sample", lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        await monitor.poll_once()
    assert monitor.reason is None and not agent.room(s).ok
    # a reading that has not come back for two poll intervals (NVML blocked): the same
    monkeypatch.setattr(monitor.source, "sample", source_sample)
    await monitor.poll_once()
    assert agent.room(s).ok
    monitor.reading_since = utcnow() - timedelta(seconds=3 * monitor.poll_interval)
    assert not agent.room(s).ok


async def test_a_restore_under_way_holds_its_room_from_the_servers_next_restore(
    fake,  # noqa: F811 (the fixtures)
    sleeper,  # noqa: F811
    plain,  # noqa: F811
):
    """Two hibernated kernels of one server come back at once (its person runs a cell in each)
    on a GPU that has room for one of them. A restore fills the GPU at 3.4-5.5 GiB/s, measured
    on an H200 (docs/serverext.md): 40 GiB take 7-12 s, and NVML shows it only as far as it has
    come. The second kernel's room check read the free memory while the first was being
    restored, found its own room there, and its restore met CUDA out of memory: on current
    drivers its GPU state is lost for good (NVIDIA/cuda-checkpoint#44). A restore under way
    now holds its room: the second waits, and comes back once there is room for it."""
    state, cgroup = fake
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    hib, monitor, _agent, _soon, told = wired(state, cgroup)
    monitor.kernels = {"a", "b"}
    try:
        add_process(state, sleeper.pid, 4 * GIB)
        add_process(state, other.pid, 4 * GIB)
        assert await suspend(hib, "a", sleeper.pid, 4 * GIB) == "hibernated"
        assert await suspend(hib, "b", other.pid, 4 * GIB) == "hibernated"
        with state_of(state) as data:
            data["bandwidth_gib_s"] = 2  # the fake driver restores 4 GiB in 2 s
        add_process(state, os.getpid(), 3 * GIB)  # a co-tenant: 7 GiB free, room for one
        tasks = {"a": hib.resume("a", "a cell"), "b": hib.resume("b", "a cell")}
        pids = {"a": sleeper.pid, "b": other.pid}
        await until(
            lambda: (
                any(t.done() for t in tasks.values())
                or any(hib.kernel_json(k)["gpu_state_at_risk"] for k in tasks)
            ),
            "one restored",
        )
        # whichever came first is back; the other was never tried into the room it took
        ((back, done),) = [(k, t) for k, t in tasks.items() if t.done()] or [("none", None)]
        assert done is not None and done.result() is True, "neither came back"
        (later,) = {"a", "b"} - {back}
        await until(lambda: hib.kernel_json(later)["waiting_for_gpu"], "the other waiting")
        assert restore_calls(state, pids[later]) == 0, "restored into room a restore was taking"
        assert not hib.kernel_json(later)["gpu_state_at_risk"]
        assert cuda_state(state, pids[later]) == "checkpointed"
        assert not any("refused" in t for t in told), told
        set_process(state, os.getpid(), memory_mib=0)  # the co-tenant leaves: room for it
        assert await asyncio.wait_for(tasks[later], 20) is True
        assert cuda_state(state, pids[later]) == "running"
        assert restore_calls(state, pids[later]) == 1
    finally:
        hib.forget("a")
        hib.forget("b")
        other.kill()
        other.wait()


def read_the_gpu(monitor: GpuMonitor, state: Path) -> None:
    """One reading of the fake GPU, as the monitor's loop takes it (what NVML shows now)."""
    gpu = json.loads(state.read_text())["gpus"][0]
    used = sum(float(p.get("memory_mib", 0)) for p in gpu["processes"])
    device = GpuDevice("0", gpu["name"], "GPU-1", float(gpu["memory_total_mib"]), used, 0)
    taken = utcnow()
    monitor.apply(GpuSample("nvml", [device], []), [], {"a", "b"}, utcnow(), taken=taken)


async def test_a_restore_done_since_the_reading_holds_its_room_from_the_next_restore(
    fake,  # noqa: F811 (the fixtures)
    sleeper,  # noqa: F811
    plain,  # noqa: F811
    monkeypatch,
):
    """Two hibernated kernels of one server; the GPU has room for one. The first comes back
    (its person runs a cell) between two of the monitor's readings: the latest reading, taken
    before its restore, still shows its memory free. The second kernel's room check, on that
    reading, let its restore go into memory that was no longer free: CUDA out of memory, its
    GPU state lost for good on current drivers (NVIDIA/cuda-checkpoint#44). Now what came
    back since the reading was taken is held from it: the second waits, and comes back once a
    reading shows room for it."""
    for key in ("FRACSPAWNER_GPU_MEMORY_MIB", "FRACSPAWNER_GPU_SLICE"):
        monkeypatch.delenv(key, raising=False)
    state, cgroup = fake
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    monitor = GpuMonitor(settings={}, source_spec="none")
    monitor.reason = None
    hib = monitor.hibernator = hibernator(cgroup, room_poll=0.05, wait_bound=3600)
    agent = SwapAgent(monitor, lambda s: None, room_check=0.05, restore_margin_mib=512)
    assert hib.room == agent.room  # as the server wires them
    told: list[str] = []
    hib.on_restore_failed.append(lambda kid, text: told.append(text))
    try:
        add_process(state, sleeper.pid, 4 * GIB)
        add_process(state, other.pid, 4 * GIB)
        assert await suspend(hib, "a", sleeper.pid, 4 * GIB) == "hibernated"
        assert await suspend(hib, "b", other.pid, 4 * GIB) == "hibernated"
        add_process(state, os.getpid(), 3 * GIB)  # a co-tenant: 7 GiB free, room for one
        read_the_gpu(monitor, state)
        assert await asyncio.wait_for(hib.resume("a", "a cell"), 20) is True
        # no reading since: it still shows 7 GiB free, of which 4 are a's again
        task = hib.resume("b", "a cell")
        await until(
            lambda: hib.kernel_json("b")["waiting_for_gpu"] or task.done(), "b's room check"
        )
        assert restore_calls(state, other.pid) == 0, "restored into the memory a took back"
        assert not hib.kernel_json("b")["gpu_state_at_risk"] and not task.done()
        assert cuda_state(state, other.pid) == "checkpointed"
        assert "brought back since the GPU was read" in hib.kernel_json("b")["waiting_why"]
        assert not any("refused" in t for t in told), told
        read_the_gpu(monitor, state)  # the next reading shows a's memory: still no room
        await asyncio.sleep(0.2)
        assert restore_calls(state, other.pid) == 0 and not task.done()
        set_process(state, os.getpid(), memory_mib=0)  # the co-tenant leaves
        read_the_gpu(monitor, state)
        assert await asyncio.wait_for(task, 20) is True
        assert cuda_state(state, other.pid) == "running"
        assert restore_calls(state, other.pid) == 1
    finally:
        hib.forget("a")
        hib.forget("b")
        other.kill()
        other.wait()
