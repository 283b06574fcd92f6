"""Hibernation against a driver that behaves as NVIDIA documents (issue 26, item 1): the fake
checkpoint driver (tests/fake_nvml/cuda/bindings/driver.py, each behaviour cited there) returns
CUDA_ERROR_NOT_READY for a lock that does not get through, fails GetState for an exited pid,
keeps FAILED terminal, blocks a locked process's own CUDA calls and refuses a restore where the
GPU has no room. One test per defect the issue lists (1-7), each failing on the code before it.

In process (the Hibernator with the fake driver) where the driver's answers are the point; a
real jupyter server with real ipykernel kernels where processes, children and clients are.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import mmap
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fracspawner.serverext.checkpoint import CheckpointDriver, CheckpointError
from fracspawner.serverext.hibernate import Hibernator
from fracspawner.serverext.room import Room, room_for
from tests.test_culler_support import JupyterServer, execute, wait_for
from tests.test_hibernation import (
    FAKE,
    GIB,
    HIBERNATE_AFTER,
    MY_STATE,
    cuda_state,
    fake_driver_module,
    gpu_kernel,
    hibernation,
    set_cgroup,
    state_of,
)

REPO = Path(__file__).resolve().parent.parent
# a cell's CUDA call: blocks while the kernel's process is locked or checkpointed (the fake's
# stand-in for any CUDA call; it gives up after 30 s so a broken build fails instead of hanging)
CUDA_CALL = "from cuda.bindings.driver import fake_cuda_call\nfake_cuda_call(timeout_s=30)\n"


# --- in process -------------------------------------------------------------------------------
@pytest.fixture
def fake(tmp_path, monkeypatch, fake_nvml_imports):
    """A fake driver state with one 10 GiB GPU (the fake pynvml answers the driver version),
    and a cgroup with room for the copies."""
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"driver": "575.57.08", "cuda_driver_version": 12080, "gpus": [
        {"name": "NVIDIA L4", "memory_total_mib": 10 * GIB, "processes": []}]}))  # fmt: skip
    monkeypatch.setenv("FAKE_NVML_STATE", str(state))
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    set_cgroup(cgroup, 64, 1)
    return state, cgroup


def hibernator(cgroup: Path, **traits) -> Hibernator:
    settings = {"cgroup_root": str(cgroup), "retry_first": 0.05, "retry_refused_after": 0,
                "cpu_probe_seconds": 0, "in_container": False, "room_poll": 0.05,
                **traits}  # fmt: skip
    hib = Hibernator(driver=CheckpointDriver(fake_driver_module()), **settings)
    hib.room = nvml_room  # as the server's SwapAgent gives it where NVML is not virtualised
    return hib


def nvml_room(s) -> Room:
    """The room on the fake GPU as its NVML shows it (its size less what its processes hold)."""
    gpu = json.loads(Path(os.environ["FAKE_NVML_STATE"]).read_text())["gpus"][0]
    used = sum(float(p.get("memory_mib", 0)) for p in gpu["processes"])
    devices = [(float(gpu["memory_total_mib"]), used)]
    return room_for(s.memory_mib, granted_mib=None, devices=devices, grant_only=None, margin_mib=0)


def add_process(state: Path, pid: int, memory_mib: float, **extra) -> None:
    with state_of(state) as data:
        process = {"pid": pid, "memory_mib": memory_mib, "sm": 0, **extra}
        data["gpus"][0]["processes"].append(process)


def set_process(state: Path, pid: int, **values) -> None:
    with state_of(state) as data:
        for p in data["gpus"][0]["processes"]:
            if p["pid"] == pid:
                p.update(values)


async def suspend(hib: Hibernator, kid: str, pid: int, memory_mib: float) -> str:
    """Ask for a hibernation as the monitor does; whatever it raises, its state afterwards (the
    code before issue 26 had no kernel_pid and let driver errors escape)."""
    with contextlib.suppress(Exception):
        try:
            return await hib.hibernate(kid, [pid], memory_mib, kernel_pid=pid)
        except TypeError:
            return await hib.hibernate(kid, [pid], memory_mib)
    return hib.kernels[kid].state


@pytest.fixture
def sleeper():
    """A live process standing in for a kernel (the fake driver acts on real pids)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield proc
    proc.kill()
    proc.wait()


async def test_defect1_getstate_failing_before_the_lock_never_leaves_it_hibernating(fake):
    """cuCheckpointProcessGetState may fail before anything is locked (documented returns:
    INVALID_VALUE, NOT_SUPPORTED): the kernel must not stay "hibernating", read as idle for
    ever; a pid the driver does not know now is tried again later."""
    state, cgroup = fake
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # exited: GetState answers CUDA_ERROR_OPERATING_SYSTEM (measured, tests/gpu)
    add_process(state, gone.pid, GIB)
    hib = hibernator(cgroup)
    assert await suspend(hib, "k1", gone.pid, GIB) == "running"
    assert not hib.suspended("k1")
    assert hib.kernel_json("k1")["reason"].startswith(
        "not hibernated: the driver does not know its process now"
    )
    # an unsupported process: stated, left running, never "hibernating"
    me = os.getpid()
    add_process(state, me, GIB, getstate_error="CUDA_ERROR_NOT_SUPPORTED")
    assert await suspend(hib, "k2", me, GIB) == "running"
    assert not hib.suspended("k2")
    assert hib.kernel_json("k2")["state"] == "cannot_hibernate"
    assert "CUDA_ERROR_NOT_SUPPORTED" in hib.kernel_json("k2")["reason"]


async def test_defect1_unlock_failing_after_a_refused_checkpoint_is_retried(fake, sleeper):
    """A refused checkpoint leaves the process LOCKED (README: no attempt to keep it in a good
    state); if the unlock then fails its CUDA calls block: the kernel is shown as such and the
    unlock retried until it is running again, never left "hibernating"."""
    state, cgroup = fake
    pid = sleeper.pid
    add_process(state, pid, GIB, refuse="uvm", unlock_failures=2)
    hib = hibernator(cgroup)
    first = await suspend(hib, "k", pid, GIB)
    assert first != "hibernating" and hib.kernels["k"].state != "hibernating"
    await asyncio.to_thread(
        wait_for, lambda: cuda_state(state, pid) == "running", 10, "unlocked again"
    )
    await asyncio.to_thread(
        wait_for, lambda: hib.kernel_json("k")["state"] == "cannot_hibernate", 10, "settled"
    )
    assert hib.kernel_json("k")["reason"] == (
        "cannot hibernate: the driver refused (CUDA_ERROR_NOT_SUPPORTED)"
    )


class CheckpointRaisesButGoesThrough:
    """Lock succeeds; Checkpoint answers an error yet the process reads CHECKPOINTED after it
    (hibernate._after_refusal: "the checkpoint went through after all")."""

    def __init__(self) -> None:
        self.st, self.restores = "running", 0

    def check(self) -> None:
        return None

    def state(self, pid: int) -> str:
        return self.st

    def lock(self, pid: int, timeout_ms: int) -> None:
        self.st = "locked"

    def checkpoint(self, pid: int) -> None:
        self.st = "checkpointed"
        raise CheckpointError("cuCheckpointProcessCheckpoint", "CUDA_ERROR_UNKNOWN")

    def restore(self, pid: int) -> None:
        self.restores += 1
        self.st = "locked"

    def unlock(self, pid: int) -> None:
        self.st = "running"


async def test_a_checkpoint_that_went_through_after_a_refusal_keeps_what_it_holds(
    tmp_path, monkeypatch
):
    """Never restore without room confirmed; a restore refused for want of room loses the
    kernel's GPU state on current drivers (NVIDIA/cuda-checkpoint#44). The driver answered the
    checkpoint with an error, yet the process reads CHECKPOINTED: it is hibernated. Before, it
    was kept as holding 0 MiB (review s53 finding 4): the report told the culler it held
    nothing in host memory, its resume asked the room for 0 MiB and restored 4 GiB into a GPU
    with 1 GiB free, a client on its connection file could not resume it (no iopub watch), and
    no hibernation was recorded. Now it is hibernated as any other: what it holds, why, the
    watch and the record."""
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    set_cgroup(cgroup, 64, 1)
    drv = CheckpointRaisesButGoesThrough()
    settings = {"cgroup_root": str(cgroup), "cpu_probe_seconds": 0, "in_container": False,
                "retry_first": 0.05, "room_poll": 0.05, "wait_bound": 3600}  # fmt: skip
    hib = Hibernator(driver=drv, **settings)
    monkeypatch.setattr("fracspawner.serverext.hibernate.driver_problem", lambda *a: None)
    watched: list[str] = []
    hib.watch = lambda kid: watched.append(kid) or (lambda: None)
    # NVML of the device: 10 GiB, 9 GiB used (1 GiB free)
    hib.room = lambda s: room_for(s.memory_mib, granted_mib=None, devices=[(10 * GIB, 9 * GIB)],
                                  grant_only=None, margin_mib=512)  # fmt: skip
    pid = os.getpid()
    assert await hib.hibernate("k", [pid], 4 * GIB, kernel_pid=pid, why="idle") == "hibernated"
    assert hib.memory_of("k") == 4 * GIB, "reported as holding 0 MiB in host memory"
    assert hib.kernel_json("k")["hibernated_why"] == "idle" and watched == ["k"]
    assert [h["gpu_memory_mib"] for h in hib.hibernations] == [4 * GIB]
    task = hib.resume("k", "a message to the kernel")
    await asyncio.sleep(0.3)
    assert drv.restores == 0, "restored 4 GiB into 1 GiB free"
    assert hib.kernel_json("k")["waiting_for_gpu"] and not task.done()
    hib.forget("k")


async def test_defect2_lock_not_ready_is_busy_and_tried_again(fake, sleeper):
    """CUDA_ERROR_NOT_READY is cuCheckpointProcessLock's documented "not yet" (process left
    RUNNING): not hibernated this time, tried again, never recorded as "cannot"."""
    state, cgroup = fake
    pid = sleeper.pid
    add_process(state, pid, GIB, lock_busy=1)
    hib = hibernator(cgroup, lock_timeout_ms=50)
    assert await suspend(hib, "k", pid, GIB) == "running"
    assert hib.kernel_json("k")["state"] == "running"
    assert "did not pause" in hib.kernel_json("k")["reason"]
    assert cuda_state(state, pid) == "running"
    assert await suspend(hib, "k", pid, GIB) == "hibernated"
    assert cuda_state(state, pid) == "checkpointed"


async def test_defect5_failed_is_terminal_and_the_user_is_told_data_may_be_lost(fake, sleeper):
    state, cgroup = fake
    pid = sleeper.pid
    add_process(state, pid, 2 * GIB)
    hib = hibernator(cgroup)
    told: list[str] = []
    hib.on_restore_failed.append(lambda kid, text: told.append(text))
    assert await suspend(hib, "k", pid, 2 * GIB) == "hibernated"
    set_process(state, pid, restore_leaves="failed")
    task = hib.resume("k", "test")
    assert task is not None
    # terminal: the resume ends (the code before retried for ever)
    assert await asyncio.wait_for(task, 20) is False
    h = hib.kernel_json("k")
    assert h["state"] == "failed" and h["next_retry"] is None
    assert "may be lost" in h["reason"] and "Restart the kernel" in h["reason"]
    assert told and "may be lost" in told[-1] and "Nothing is lost" not in told[-1]
    assert cuda_state(state, pid) == "failed"
    assert not hib.suspended("k")  # its messages go on to the kernel, which can be restarted
    assert hib.resume("k", "again") is None
    assert await suspend(hib, "k", pid, 2 * GIB) == "failed"  # never tried again


async def test_fake_restore_waits_for_room_on_the_gpu(fake, sleeper):
    """The GPU to restore onto needs enough memory (CUDA Driver API, cuCheckpointProcessRestore):
    with a co-tenant filling it the restore is not tried (on current drivers a refused one loses
    the state: NVIDIA/cuda-checkpoint#44), and goes through once there is room; the kernel's
    state is kept meanwhile."""
    state, cgroup = fake
    pid = sleeper.pid
    add_process(state, pid, 4 * GIB)
    hib = hibernator(cgroup)
    assert await suspend(hib, "k", pid, 4 * GIB) == "hibernated"
    add_process(state, os.getpid(), 8 * GIB)  # a co-tenant takes the freed memory
    task = hib.resume("k", "test")
    await asyncio.to_thread(
        wait_for, lambda: hib.kernel_json("k")["waiting_for_gpu"], 10, "no room"
    )
    assert hib.kernel_json("k")["restore_error"] is None
    assert cuda_state(state, pid) == "checkpointed"
    set_process(state, os.getpid(), memory_mib=2 * GIB)  # the co-tenant shrinks
    assert await asyncio.wait_for(task, 20) is True
    assert cuda_state(state, pid) == "running"


def test_defect6_drivers_and_containers_that_cannot_work_are_stated(fake):
    state, cgroup = fake
    data = json.loads(state.read_text())
    data["driver"] = "570.86.10"  # r570: partial GPU passthrough fails (#12, #24)
    state.write_text(json.dumps(data))
    old = hibernator(cgroup, in_container=True)
    reason = old.available()
    assert reason is not None and "570.86.10" in reason and "#12, #24" in reason
    assert hibernator(cgroup, in_container=True, all_gpus_visible=True).available() is None
    assert hibernator(cgroup, in_container=False).available() is None
    data["driver"] = "575.57.08"  # fixed there
    state.write_text(json.dumps(data))
    fixed = hibernator(cgroup, in_container=True)
    assert fixed.available() is None
    fixed.device_indices = ["0:1"]  # a MIG instance (#42)
    assert "MIG" in fixed.available() and "#42" in fixed.available()


async def test_defect6_nccl_ranks_are_not_suspended(fake, tmp_path):
    """Locking one NCCL rank hangs the checkpoint calls of its peers (#30): a process mapping
    NCCL's shared memory (/dev/shm/nccl-XXXXXX) is not suspended, and told why."""
    state, cgroup = fake
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else tmp_path
    path = shm / f"nccl-{os.getpid()}test"
    code = (
        "import mmap, sys, time\n"
        f"f = open({str(path)!r}, 'w+b'); f.truncate(4096)\n"
        "m = mmap.mmap(f.fileno(), 4096); print('ready', flush=True); time.sleep(600)\n"
    )
    rank = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert rank.stdout.readline().strip() == "ready"
        add_process(state, rank.pid, GIB)
        hib = hibernator(cgroup)
        assert await suspend(hib, "k", rank.pid, GIB) == "running"
        assert "NCCL" in hib.kernel_json("k")["reason"] and "#30" in hib.kernel_json("k")["reason"]
        assert cuda_state(state, rank.pid) == "running"
    finally:
        rank.kill()
        rank.wait()
        path.unlink(missing_ok=True)
    assert mmap  # the child maps it, not this process


def test_defect6_cuda_python_13_on_a_12_driver_is_stated(fake):
    """cuda-python 13.x targets CUDA 13 drivers (r580+): on a CUDA 12.8 driver the hibernator
    says which to install instead of failing later."""
    state, cgroup = fake
    hib = hibernator(cgroup)
    hib.driver = CheckpointDriver(fake_driver_module(), bindings_version="13.0.1")
    assert hib.available() == (
        "cuda-python 13.0.1 needs a CUDA 13 driver and this one is CUDA 12.8: install "
        "cuda-python<13 (fracspawner[hibernate] pins the 12.x line)"
    )
    ok = CheckpointDriver(fake_driver_module(), bindings_version="12.9.0")
    ok.check()


def test_defect6_hibernate_extra_pins_cuda_python_to_the_12_line():
    """cuda-python 13.x targets CUDA 13 (driver r580+); the checkpoint API needs 12.8+: the
    [hibernate] extra takes the 12.x line that r570/r575 drivers run."""
    text = (REPO / "pyproject.toml").read_text()  # tomllib is 3.11+; the project runs on 3.10
    section = text[text.index("\nhibernate = [") : text.index("]", text.index("\nhibernate = ["))]
    specs = re.findall(r'^\s*"([^"]+)"', section, re.MULTILINE)
    assert specs == ["cuda-python>=12.8,<13"]


# --- a real jupyter server --------------------------------------------------------------------
@pytest.fixture(scope="module")
def server_env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hibernate-driver")
    state = tmp / "state.json"
    state.write_text(json.dumps({"driver": "575.57.08", "cuda_driver_version": 12080, "gpus": [
        {"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "utilization": 0,
         "processes": []}]}))  # fmt: skip
    cgroup = tmp / "cgroup"
    cgroup.mkdir()
    set_cgroup(cgroup, 64, 1)
    server = JupyterServer(
        tmp,
        tmp / "unused.json",
        source="nvml",
        env={
            "PYTHONPATH": os.pathsep.join([str(FAKE), os.environ.get("PYTHONPATH", "")]),
            "FAKE_NVML_STATE": str(state),
            "FRACSPAWNER_GPU_SLICE": "1/4",
            "FRACSPAWNER_KERNEL_GPU_HIBERNATE_SECONDS": str(HIBERNATE_AFTER),
            "FRACSPAWNER_KERNEL_GPU_IDLE_SECONDS": "3600",
        },
        monitor={"own_pid_namespace": True},
        config={
            "Hibernator": {
                "cgroup_root": str(cgroup),
                "retry_first": 1.0,
                "retry_refused_after": 1.0,
                "cpu_probe_seconds": 0.5,
                # a working thread shows even on a loaded machine; an idle kernel stays under 1 %
                "cpu_busy_percent": 3.0,
            }
        },
    )
    try:
        yield server, state
    finally:
        server.stop()


async def start_child(server, kid: str, code: str) -> int:
    out = await execute(
        server.url,
        server.token,
        kid,
        "import subprocess, sys\n"
        f"child = subprocess.Popen([sys.executable, '-c', {code!r}])\n"
        "print(child.pid)",
    )
    return int(out)


async def test_defect3_a_child_holding_the_gpu_is_never_suspended_alone(server_env):
    """A kernel that started `python train.py` (the child holds the GPU, idle in a CPU phase;
    the kernel is idle): the child must not be checkpointed alone, since nothing would resume it
    and the run would stall until the user comes back."""
    server, state = server_env
    status, body = server.api("POST", "/api/kernels", {"name": "python3"})
    assert status == 201, body
    kid = body["id"]
    # the child calls CUDA every 50 ms: a suspended child would stall
    child = await start_child(
        server,
        kid,
        "import time\n"
        "from cuda.bindings.driver import fake_cuda_call\n"
        "while True:\n    fake_cuda_call(timeout_s=600); time.sleep(0.05)\n",
    )
    try:
        add_process(state, child, 6 * GIB)
        wait_for(
            lambda: "other process" in str(hibernation(server, kid).get("reason")), 30, "reason"
        )
        assert hibernation(server, kid)["state"] == "running"
        assert f"pid {child}" in hibernation(server, kid)["reason"]
        assert cuda_state(state, child) == "running"
    finally:
        os.kill(child, signal.SIGKILL)
        server.api("DELETE", f"/api/kernels/{kid}")


async def test_defect4_a_worker_holding_gpu_memory_only_defers_hibernation(server_env):
    """A DataLoader worker holding GPU memory at one idle moment is a refusal that passes: once
    it has ended, the kernel hibernates (the code before recorded "several processes" for the
    kernel's life)."""
    server, state = server_env
    kid, pid = await gpu_kernel(server, state, 2 * GIB)
    worker = await start_child(server, kid, "import time; time.sleep(600)")
    add_process(state, worker, GIB)
    try:
        wait_for(
            lambda: "other process" in str(hibernation(server, kid).get("reason")), 30, "deferred"
        )
        assert hibernation(server, kid)["state"] == "running"
        assert cuda_state(state, pid) == cuda_state(state, worker) == "running"
    finally:
        os.kill(worker, signal.SIGKILL)
    with state_of(state) as data:  # the worker is gone: NVML no longer lists it
        data["gpus"][0]["processes"] = [
            p for p in data["gpus"][0]["processes"] if p["pid"] != worker
        ]
    wait_for(lambda: hibernation(server, kid).get("state") == "hibernated", 30, "hibernation")
    assert cuda_state(state, pid) == "checkpointed"
    assert (await execute(server.url, server.token, kid, "print(x * 2)")).strip() == "42"
    server.api("DELETE", f"/api/kernels/{kid}")


async def test_defect7_a_client_on_the_connection_file_resumes_the_kernel(server_env):
    """`jupyter console --existing` talks to the kernel's ZMQ ports, not the server's websocket:
    its cell's CUDA call must not block for ever in the hibernated kernel."""
    from jupyter_client import BlockingKernelClient

    server, state = server_env
    kid, pid = await gpu_kernel(server, state, 2 * GIB)
    wait_for(lambda: hibernation(server, kid).get("state") == "hibernated", 30, "hibernation")
    connection_file = server.tmp / "runtime" / f"kernel-{kid}.json"
    client = BlockingKernelClient(connection_file=str(connection_file))
    client.load_connection_file()
    client.start_channels()
    out: list[str] = []
    try:
        reply = await asyncio.to_thread(
            client.execute_interactive,
            MY_STATE + CUDA_CALL + "print(x * 2, my_state())",
            timeout=60,
            output_hook=lambda m: out.append(m["content"].get("text", "")),
        )
    finally:
        client.stop_channels()
    assert reply["content"]["status"] == "ok", reply["content"]
    assert "".join(out).strip() == "42 running"  # resumed before its CUDA call went on
    resumes = server.gpu()["hibernation"]["resumes"]
    assert {"kernel_id": kid, "why": "a client outside this server's websocket"}.items() <= (
        resumes[-1].items()
    )
    server.api("DELETE", f"/api/kernels/{kid}")


async def test_defect7_a_kernel_working_in_a_thread_is_not_suspended(server_env):
    """Code working in a thread of the kernel (no cell running, its GPU idle between steps)
    would block at its next CUDA call with nobody to resume it: a kernel whose process uses the
    CPU while no cell runs is not suspended."""
    server, state = server_env
    kid, pid = await gpu_kernel(server, state, GIB)
    await execute(
        server.url,
        server.token,
        kid,
        "import threading, time\n"
        "def work():\n"
        "    while True:\n"
        "        sum(i * i for i in range(20000))\n"
        "threading.Thread(target=work, daemon=True).start()\n",
    )
    wait_for(lambda: "CPU" in str(hibernation(server, kid).get("reason")), 30, "reason")
    assert hibernation(server, kid)["state"] == "running"
    assert cuda_state(state, pid) == "running"
    server.api("DELETE", f"/api/kernels/{kid}")


async def test_hibernate_now_on_request_suspends_only_an_idle_kernel(fake, sleeper, monkeypatch):
    """GpuMonitor.hibernate_now(kernel_id, reason): the culler's request under GPU pressure
    (answered through this server's report) suspends a kernel idle right now, whatever its idle
    time, with every safeguard; a kernel executing a cell is left alone."""
    from types import SimpleNamespace

    from fracspawner.serverext import monitor as monitor_module
    from fracspawner.serverext.sources import GpuDevice, GpuProcess, GpuSample

    state, cgroup = fake
    busy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        add_process(state, sleeper.pid, 2 * GIB)
        add_process(state, busy.pid, GIB)
        now = monitor_module.utcnow()

        def kernel(pid: int, execution_state: str) -> SimpleNamespace:
            return SimpleNamespace(
                last_activity=now,
                execution_state=execution_state,
                provisioner=SimpleNamespace(pid=pid),
            )

        kernels = {"idle": kernel(sleeper.pid, "idle"), "busy": kernel(busy.pid, "busy")}
        km = SimpleNamespace(list_kernel_ids=lambda: list(kernels), get_kernel=kernels.__getitem__)
        monitor = monitor_module.GpuMonitor(settings={"kernel_manager": km}, source_spec="none")
        monitor.reason = None
        monitor.hibernator = hibernator(cgroup)
        processes = [
            GpuProcess("0", 2 * GIB, 0.0, pid=sleeper.pid),
            GpuProcess("0", GIB, 0.0, pid=busy.pid),
        ]
        owned = [("idle", processes[0]), ("busy", processes[1])]
        device = GpuDevice("0", "L4", "GPU-0", 10 * GIB, 3 * GIB, 0)
        monitor.apply(GpuSample("nvml", [device], processes), owned, set(kernels), now)
        assert await monitor.hibernate_now("busy", "GPU pressure") == "running"
        assert cuda_state(state, busy.pid) == "running"
        assert await monitor.hibernate_now("idle", "GPU pressure") == "hibernated"
        assert cuda_state(state, sleeper.pid) == "checkpointed"
        assert monitor.hibernator.kernel_json("idle")["hibernated_why"] == "GPU pressure"
        assert monitor.hibernator.hibernations[-1]["why"] == "GPU pressure"
        assert await monitor.hibernate_now("nope", "GPU pressure") == "running"
    finally:
        busy.kill()
        busy.wait()


async def test_a_checkpoint_under_way_counts_against_the_pods_host_memory(fake, sleeper):
    """A kernel is suspended only where the pod's memory limit minus its usage covers its copy
    (host_margin_mib beside). Measured on an H200, a checkpoint fills host memory at 1.4-1.9
    GiB/s (docs/serverext.md): one of 40 GiB is under way for half a minute, and its copy is
    in the pod's usage only as far as it has come. Two checkpoints at once on one server (two
    swap orders in one answer; the idle reading beside the culler's host room) each found the
    headroom for itself alone, and together went over the pod's limit: its memory cgroup's
    OOM killer then ends a process, a kernel. The copy under way now counts as taken."""
    state, cgroup = fake
    set_cgroup(cgroup, 8, 1)  # 7 GiB free: room for one copy of 4 GiB, not for two
    with state_of(state) as data:
        data["bandwidth_gib_s"] = 2  # the fake driver copies 4 GiB in 2 s
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    hib = hibernator(cgroup)
    try:
        add_process(state, sleeper.pid, 4 * GIB)
        add_process(state, other.pid, 4 * GIB)
        first = asyncio.ensure_future(suspend(hib, "a", sleeper.pid, 4 * GIB))
        for _ in range(500):
            if hib.kernel_json("a")["state"] == "hibernating":
                break
            await asyncio.sleep(0.01)
        assert hib.kernel_json("a")["state"] == "hibernating"
        assert await suspend(hib, "b", other.pid, 4 * GIB) == "running", (
            "a second checkpoint started into host memory the first one is filling"
        )
        why = hib.kernel_json("b")["reason"]
        assert "host memory" in why and "under way" in why, why
        assert cuda_state(state, other.pid) == "running"
        assert await first == "hibernated"
        # the copy done is in the pod's usage now (the cgroup's reading): still no room
        set_cgroup(cgroup, 8, 5)
        assert await suspend(hib, "b", other.pid, 4 * GIB) == "running"
        set_cgroup(cgroup, 16, 5)  # room for it beside the one hibernated
        assert await suspend(hib, "b", other.pid, 4 * GIB) == "hibernated"
    finally:
        other.kill()
        other.wait()


# --- the monitor's loop while a checkpoint copies ---------------------------------------------
class _Kernels:
    """The kernel manager's parts the monitor reads; shut-downs recorded."""

    def __init__(self, kernels: dict):
        self.kernels, self.shut_down, self.last_kernel_activity = kernels, [], None

    def list_kernel_ids(self):
        return list(self.kernels)

    def get_kernel(self, kernel_id):
        return self.kernels[kernel_id]

    async def shutdown_kernel(self, kernel_id):
        self.shut_down.append(kernel_id)
        del self.kernels[kernel_id]


async def _slow_checkpoint_under_the_loop(fake, sleeper, tmp_path, monkeypatch, *, idle_s):
    """The real monitor's loop (poll_interval 0.2 s) over a simulated reading of one 4 GiB
    kernel, hibernated after 1 s through the fake driver copying 1 GiB/s (4 s: an 80 GiB kernel
    takes about a minute on an H200). Returns what was seen while its checkpoint ran."""
    from types import SimpleNamespace

    from fracspawner.serverext import monitor as monitor_module

    state, cgroup = fake
    monkeypatch.setenv("FRACSPAWNER_GPU_SLICE", "1/4")
    monkeypatch.setenv("FRACSPAWNER_KERNEL_GPU_HIBERNATE_SECONDS", "1")
    monkeypatch.setenv("FRACSPAWNER_KERNEL_GPU_IDLE_SECONDS", str(idle_s))
    monkeypatch.delenv("FRACSPAWNER_SERVER_GPU_IDLE_SECONDS", raising=False)
    with state_of(state) as data:
        data["bandwidth_gib_s"] = 1
    add_process(state, sleeper.pid, 4 * GIB)
    gpu = tmp_path / "gpu.json"
    device = {"index": "0", "name": "L4", "uuid": "GPU-0", "memory_total_mib": 10 * GIB}

    def reading(mib: float) -> None:
        gpu.write_text(json.dumps({"devices": [device], "kernels": {"k": {"memory_mib": mib}}}))

    reading(4 * GIB)
    now = monitor_module.utcnow()
    km = _Kernels({"k": SimpleNamespace(last_activity=now, execution_state="idle",
                                        provisioner=SimpleNamespace(pid=sleeper.pid))})  # fmt: skip
    settings = {"kernel_manager": km, "started": now, "last_activity_times": {}}
    monitor = monitor_module.GpuMonitor(
        settings=settings, source_spec=f"sim:{gpu}", poll_interval=0.2
    )
    monitor.hibernator = hibernator(cgroup)
    real_checkpoint = monitor.hibernator.driver.checkpoint

    def checkpoint(pid: int) -> None:  # NVML shows the memory freed once the copy is done
        real_checkpoint(pid)
        reading(0)

    monitor.hibernator.driver.checkpoint = checkpoint
    seen: dict = {"taken": [], "states": set()}
    monitor.start()
    try:
        for _ in range(500):
            if monitor.hibernator.kernel_json("k")["state"] == "hibernating":
                break
            await asyncio.sleep(0.01)
        assert monitor.hibernator.kernel_json("k")["state"] == "hibernating"
        while monitor.hibernator.kernel_json("k")["state"] == "hibernating":
            seen["taken"].append(monitor.sample_taken)
            seen["states"].add(cuda_state(state, sleeper.pid))
            await asyncio.sleep(0.05)
        seen["after"] = monitor.hibernator.kernel_json("k")["state"]
        seen["shut_down"] = list(km.shut_down)
    finally:
        await monitor.stop()
    return seen


async def test_readings_go_on_while_a_slow_checkpoint_runs(fake, sleeper, tmp_path, monkeypatch):
    """Measured on an H200, a checkpoint copies 1.4-1.9 GiB/s: an 80 GiB kernel takes about a
    minute. The loop awaited it, so for that minute nothing was read: the meter froze, the
    culler was told an old reading, and another kernel's resume checked its room on it. The
    readings now go on every poll_interval while the copy runs."""
    seen = await _slow_checkpoint_under_the_loop(fake, sleeper, tmp_path, monkeypatch, idle_s=3600)
    taken = [t for t in seen["taken"] if t is not None]
    assert seen["after"] == "hibernated"
    assert "locked" in seen["states"], "the copy was never seen under way"
    assert len(set(taken)) >= 5, f"{len(set(taken))} readings in a 4 s checkpoint"


async def test_the_cull_leaves_a_kernel_mid_checkpoint_alone(fake, sleeper, tmp_path, monkeypatch):
    """Its idle limit (2 s) passes while its checkpoint (4 s, begun at 1 s) runs, and the
    reading still shows its GPU memory: the cull, which now runs beside the copy, must not
    shut the kernel down under the driver. It is hibernated, its GPU state in host memory."""
    seen = await _slow_checkpoint_under_the_loop(fake, sleeper, tmp_path, monkeypatch, idle_s=2)
    assert seen["shut_down"] == [], "shut down while its checkpoint ran"
    assert seen["after"] == "hibernated"


async def test_a_kernel_being_shut_down_is_not_suspended_meanwhile(monkeypatch):
    """Idle hibernations run beside the loop: one may reach a kernel the cull path is shutting
    down (jupyter_client waits seconds for the process to exit). It is left alone: no checkpoint
    of a process on its way out."""
    from datetime import timedelta
    from types import SimpleNamespace

    from fracspawner.serverext import monitor as monitor_module
    from fracspawner.serverext.sources import GpuDevice, GpuProcess, GpuSample

    monkeypatch.setenv("FRACSPAWNER_GPU_SLICE", "1/4")
    monkeypatch.setenv("FRACSPAWNER_KERNEL_GPU_HIBERNATE_SECONDS", "600")
    monkeypatch.setenv("FRACSPAWNER_KERNEL_GPU_IDLE_SECONDS", "1800")
    monkeypatch.delenv("FRACSPAWNER_SERVER_GPU_IDLE_SECONDS", raising=False)
    t0 = monitor_module.utcnow() - timedelta(hours=1)
    exiting, release = asyncio.Event(), asyncio.Event()

    class SlowShutdown(_Kernels):
        async def shutdown_kernel(self, kernel_id):
            exiting.set()
            await release.wait()
            await super().shutdown_kernel(kernel_id)

    km = SlowShutdown({"a": SimpleNamespace(last_activity=t0, execution_state="idle")})
    monitor = monitor_module.GpuMonitor(
        settings={"kernel_manager": km, "started": t0}, source_spec="none"
    )
    monitor.reason, monitor.started = None, t0
    asked: list[str] = []

    async def hibernate(kid, memory_mib, why):
        asked.append(kid)
        return "hibernated"

    monitor._hibernate = hibernate
    process = GpuProcess("0", 4096, 0.0, kernel_id="a")
    device = GpuDevice("0", "H100", "GPU-0", 81920, 4096, 0)
    now = monitor_module.utcnow()
    monitor.apply(GpuSample("sim", [device], [process]), [("a", process)], {"a"}, now)
    cull = asyncio.ensure_future(monitor.cull_idle_kernels(now))
    await asyncio.wait_for(exiting.wait(), 5)
    assert await monitor.hibernate_idle_kernels(now) == []
    assert await monitor.hibernate_now("a", "GPU pressure") == "running"
    assert asked == []
    release.set()
    assert await cull == ["a"]
