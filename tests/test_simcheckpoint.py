"""The demo's simulated checkpoint driver (fracspawner/serverext/simcheckpoint.py) refuses what
the real driver refuses, as measured on driver 580.159.04 (docs/serverext.md, "First run on a
GPU"; the tests' fake driver cites the same): a restore onto a GPU with less free memory than
the process held fails CUDA_ERROR_OUT_OF_MEMORY and loses the process (NVIDIA/cuda-checkpoint#44:
every later restore CUDA_ERROR_OPERATING_SYSTEM, unlock CUDA_ERROR_ILLEGAL_STATE, even with
room), and an exited pid answers CUDA_ERROR_OPERATING_SYSTEM on every call. Before, the demo's
driver restored into any GPU, so the demo could never show a kernel's GPU state lost.

Real processes stand for kernels (the demo's source finds this server's kernels in /proc by the
connection file on their command line, children of this process).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from fracspawner.serverext.checkpoint import CheckpointError
from fracspawner.serverext.hibernate import LOST, Hibernator
from fracspawner.serverext.room import Room, room_for
from fracspawner.serverext.sources import DemoSimulatedSource
from tests.test_hibernation import set_cgroup

KERNEL_MIB = 1536  # what each of the demo's kernels holds (devcluster/kubelet.py)


class Kernels:
    """Kernel stand-ins: children of this process, as a server's kernels are."""

    def __init__(self) -> None:
        self.procs: dict[int, subprocess.Popen] = {}

    def __call__(self) -> int:
        name = f"kernel-{uuid.uuid4()}.json"  # what procmap finds on a kernel's command line
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", name])
        self.procs[proc.pid] = proc
        cmdline = Path(f"/proc/{proc.pid}/cmdline")
        for _ in range(500):  # until its exec is done: a kernel by its command line
            if name.encode() in cmdline.read_bytes():
                return proc.pid
            time.sleep(0.01)
        raise AssertionError(f"{name}: not started")

    def stop(self, pid: int) -> None:
        """Ended and reaped: gone from /proc, as an exited kernel is."""
        self.procs[pid].kill()
        self.procs[pid].wait()


@pytest.fixture
def kernels():
    started = Kernels()
    yield started
    for pid in list(started.procs):
        started.stop(pid)


def demo_gpu(total_mib: float) -> DemoSimulatedSource:
    spec = {"name": "Simulated GPU", "memory_total_mib": total_mib, "kernel_memory_mib": KERNEL_MIB}
    return DemoSimulatedSource(json.dumps(spec), server_pid=os.getpid())


def code_of(call, *args) -> str:
    """The error code the call is refused with."""
    with pytest.raises(CheckpointError) as err:
        call(*args)
    return err.value.code


def used_mib(source: DemoSimulatedSource) -> float:
    return source.sample().devices[0].memory_used_mib


def hibernate(drv, pid: int) -> None:
    drv.lock(pid, 1000)
    drv.checkpoint(pid)


def test_a_restore_without_room_is_refused_and_the_process_is_lost(kernels):
    source = demo_gpu(4096)
    drv = source.checkpoint_driver
    a, _b = kernels(), kernels()
    hibernate(drv, a)
    assert drv.state(a) == "checkpointed" and used_mib(source) == KERNEL_MIB
    c = kernels()  # another kernel takes the freed memory: 1 GiB free, the kernel held 1.5
    assert code_of(drv.restore, a) == "CUDA_ERROR_OUT_OF_MEMORY"
    assert drv.state(a) == "checkpointed" and used_mib(source) == 2 * KERNEL_MIB
    kernels.stop(c)  # room again (2.5 GiB free): lost all the same (#44, measured)
    assert code_of(drv.restore, a) == "CUDA_ERROR_OPERATING_SYSTEM"
    assert code_of(drv.unlock, a) == "CUDA_ERROR_ILLEGAL_STATE"
    assert code_of(drv.lock, a, 1000) == "CUDA_ERROR_ILLEGAL_STATE"
    assert drv.state(a) == "checkpointed" and used_mib(source) == KERNEL_MIB


def test_a_restore_with_just_the_room_it_held_goes_through(kernels):
    source = demo_gpu(2 * KERNEL_MIB)
    drv = source.checkpoint_driver
    a, b = kernels(), kernels()
    hibernate(drv, a)
    hibernate(drv, b)
    c = kernels()  # free: exactly what `a` held
    drv.restore(a)
    drv.unlock(a)
    assert drv.state(a) == "running" and used_mib(source) == 2 * KERNEL_MIB
    kernels.stop(c)
    drv.restore(b)  # not lost: nothing refused it
    drv.unlock(b)
    assert drv.state(b) == "running" and used_mib(source) == 2 * KERNEL_MIB


def test_an_exited_pid_answers_operating_system_on_every_call(kernels):
    drv = demo_gpu(81920).checkpoint_driver
    running, parked = kernels(), kernels()
    hibernate(drv, parked)
    for pid in (running, parked):
        kernels.stop(pid)
        calls = [(drv.state,), (drv.lock, 1000), (drv.checkpoint,), (drv.restore,), (drv.unlock,)]
        for call, *args in calls:
            assert code_of(call, pid, *args) == "CUDA_ERROR_OPERATING_SYSTEM", call
    assert drv.checkpointed() == set()


def demo_hibernator(tmp_path, source: DemoSimulatedSource) -> Hibernator:
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    set_cgroup(cgroup, 64, 1)  # room in host memory for the parked memory
    return Hibernator(
        driver=source.checkpoint_driver, cgroup_root=str(cgroup), retry_first=0.05,
        retry_refused_after=0, cpu_probe_seconds=0, in_container=False, room_poll=0.05,
    )  # fmt: skip


async def test_the_demo_shows_a_kernel_lost_if_a_restore_went_without_room(tmp_path, kernels):
    """Were the room reading overtaken (here: it always says yes), the demo shows what a GPU
    would: the restore refused, the kernel at risk, then lost (#44), and the user told."""
    source = demo_gpu(2 * KERNEL_MIB)
    hib = demo_hibernator(tmp_path, source)
    hib.room = lambda s: Room(True, "a reading overtaken")
    told: list[str] = []
    hib.on_restore_failed.append(lambda kid, text: told.append(text))
    a, _b = kernels(), kernels()
    assert await hib.hibernate("k", [a], KERNEL_MIB, kernel_pid=a) == "hibernated"
    kernels()  # the GPU is full again
    assert await asyncio.wait_for(hib.resume("k", "a cell"), 20) is False
    h = hib.kernel_json("k")
    assert h["state"] == "failed" and h["restore_error"].startswith(LOST), h
    assert "CUDA_ERROR_OPERATING_SYSTEM" in h["restore_error"] and any(LOST in t for t in told)


async def test_the_demos_room_reading_keeps_the_restore_from_being_refused(tmp_path, kernels):
    """In normal demo operation nothing changes: the room reading (room.py, with the default
    512 MiB margin) holds the restore back while the simulated GPU is full, and it goes through
    once there is room."""
    source = demo_gpu(2 * KERNEL_MIB + 512)
    hib = demo_hibernator(tmp_path, source)

    def room(s) -> Room:
        dev = source.sample().devices[0]
        devices = [(dev.memory_total_mib, dev.memory_used_mib)]
        return room_for(s.memory_mib, granted_mib=None, devices=devices, grant_only=None,
                        margin_mib=512)  # fmt: skip

    hib.room = room
    a, _b = kernels(), kernels()
    assert await hib.hibernate("k", [a], KERNEL_MIB, kernel_pid=a) == "hibernated"
    c = kernels()
    task = hib.resume("k", "a cell")
    for _ in range(100):
        if hib.kernel_json("k")["waiting_for_gpu"]:
            break
        await asyncio.sleep(0.02)
    assert hib.kernel_json("k")["waiting_for_gpu"] and not task.done()
    kernels.stop(c)
    assert await asyncio.wait_for(task, 20) is True
    assert source.checkpoint_driver.state(a) == "running"
    assert hib.kernel_json("k")["restore_error"] is None


def demo_mig_gpu() -> DemoSimulatedSource:
    """The demo's MIG slice as the devcluster's kubelet describes it (devcluster/kubelet.py)."""
    from tests.test_lab_meter import demo_gpu_env

    pod = {"spec": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}}}
    container = {"resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}
    env = demo_gpu_env(pod, container)
    return DemoSimulatedSource(env["FRACSPAWNER_SIMULATED_GPU"], server_pid=os.getpid())


def test_a_checkpoint_on_a_mig_slice_is_refused_as_the_driver_refuses_it(kernels):
    """NVIDIA/cuda-checkpoint#42 ("Fails with 'out of memory' on MIG-enabled GPUs"; the
    maintainer: "MIG isn't supported right now"): on a MIG instance the lock goes through and
    the checkpoint answers out of memory. The demo's driver checkpointed a MIG slice's kernel as
    any other; it refuses as the tests' fake does (CUDA_ERROR_OUT_OF_MEMORY, left LOCKED), and
    the unlock puts the process back, its memory still on the GPU."""
    source = demo_mig_gpu()
    drv = source.checkpoint_driver
    a = kernels()
    drv.lock(a, 1000)
    assert code_of(drv.checkpoint, a) == "CUDA_ERROR_OUT_OF_MEMORY"
    assert drv.state(a) == "locked" and drv.checkpointed() == set()
    drv.unlock(a)
    assert drv.state(a) == "running" and used_mib(source) == KERNEL_MIB
    # a whole GPU's kernel still checkpoints
    whole = demo_gpu(81920).checkpoint_driver
    hibernate(whole, a)
    assert whole.state(a) == "checkpointed"


async def test_the_demo_does_not_hibernate_a_kernel_on_a_mig_slice_and_says_why(tmp_path, kernels):
    """The product's path in the demo: the hibernator knows a MIG instance from the reading
    (named "<gpu>:<instance>" as NVML's are) and tries nothing, saying why; and where no
    reading named it, the driver's refusal leaves the kernel running, not hibernated, and the
    reason names #42 rather than a bare "out of memory"."""
    source = demo_mig_gpu()
    a, b = kernels(), kernels()
    (tmp_path / "seen").mkdir()
    (tmp_path / "unseen").mkdir()
    # as the monitor does with each reading
    seen = demo_hibernator(tmp_path / "seen", source)
    seen.device_indices = [d.index for d in source.sample().devices]
    assert seen.kernel_json("a")["state"] == "cannot_hibernate"  # before anything was tried
    assert await seen.hibernate("a", [a], KERNEL_MIB, kernel_pid=a) == "running"
    h = seen.kernel_json("a")
    assert h["state"] == "cannot_hibernate", h
    assert h["reason"] == (
        "cannot hibernate: the GPU is a MIG instance, which the CUDA checkpoint API does not "
        "support (NVIDIA/cuda-checkpoint #42)"
    ), h
    assert source.checkpoint_driver.state(a) == "running"
    # no reading said it: the driver refuses, the process is put back
    unseen = demo_hibernator(tmp_path / "unseen", source)
    assert await unseen.hibernate("b", [b], KERNEL_MIB, kernel_pid=b) == "running"
    h = unseen.kernel_json("b")
    assert h["state"] == "cannot_hibernate" and h["hibernated_gpu_memory_mib"] == 0, h
    assert h["reason"].startswith(
        "cannot hibernate: the driver refused (CUDA_ERROR_OUT_OF_MEMORY; the driver answers so "
        "on a MIG instance"
    ), h
    assert "NVIDIA/cuda-checkpoint #42" in h["reason"], h
    assert source.checkpoint_driver.state(b) == "running"
    assert used_mib(source) == 2 * KERNEL_MIB and unseen.hibernations == []
