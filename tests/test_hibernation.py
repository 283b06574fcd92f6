"""GPU hibernation (issue 22): the real server extension in a real jupyter server with real
ipykernel kernels, the GPU read through NvmlSource from the FAKE pynvml and suspended through
the FAKE checkpoint driver (tests/fake_nvml/cuda/bindings/driver.py: the documented states and
refusals of the CUDA driver's cuCheckpointProcess* calls, each cited there).

An idle GPU kernel hibernates after the policy time and a cell the user runs resumes it first
(the cell sees its own CUDA state "running") and returns the right result; every failure
(no host-memory headroom, UVM refused, the driver leaving it failed, a restore that fails)
leaves the kernel and its data in place. What issue 26 found against the documented driver
(GetState errors, NOT_READY, children and workers, FAILED, driver conditions, foreign clients)
is in tests/test_hibernation_driver.py.
"""

from __future__ import annotations

import asyncio
import fcntl
import importlib.util
import json
import math
import os
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import pytest

from fracspawner.serverext.checkpoint import CheckpointDriver, Unsupported, host_headroom
from fracspawner.serverext.hibernate import Hibernator
from fracspawner.serverext.room import Room
from tests.test_culler_support import JupyterServer, execute, http, wait_for

FAKE = Path(__file__).parent / "fake_nvml"
GIB = 1024
HIBERNATE_AFTER = 2  # seconds: FRACSPAWNER_KERNEL_GPU_HIBERNATE_SECONDS as FracSpawner sets it
# the cell asks the fake driver for its own CUDA state: "running" proves it was resumed first
MY_STATE = (
    "import json, os\n"
    "def my_state():\n"
    "    for g in json.load(open(os.environ['FAKE_NVML_STATE']))['gpus']:\n"
    "        for p in g['processes']:\n"
    "            if p['pid'] == os.getpid():\n"
    "                return p.get('cuda_state', 'running')\n"
)


@contextmanager
def state_of(path: Path):
    """Change the fake's state under the lock the fake driver takes (it writes it too)."""
    with open(f"{path}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = json.loads(path.read_text())
        yield data
        tmp = path.with_suffix(".test.tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)


def set_cgroup(root: Path, limit_gib: float | str, usage_gib: float) -> None:
    limit = limit_gib if isinstance(limit_gib, str) else str(int(limit_gib * 2**30))
    (root / "memory.max").write_text(limit + "\n")
    (root / "memory.current").write_text(f"{int(usage_gib * 2**30)}\n")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hibernate")
    state = tmp / "state.json"
    state.write_text(
        json.dumps(
            {
                "driver": "575.57.08",
                "cuda_driver_version": 12080,
                "bandwidth_gib_s": 40,
                "gpus": [{"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559,
                          "utilization": 0, "processes": []}],
            }
        )
    )  # fmt: skip
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
                "restore_stall_seconds": 3.0,
            }
        },
    )
    try:
        yield server, state, cgroup
    finally:
        server.stop()


async def gpu_kernel(server, state: Path, memory_mib: int = 4 * GIB, **extra) -> tuple[str, int]:
    """A real kernel holding (per the fake NVML) GPU memory in its own process; x = 21 in it."""
    status, body = server.api("POST", "/api/kernels", {"name": "python3"})
    assert status == 201, body
    kid = body["id"]
    pid = int(await execute(server.url, server.token, kid, MY_STATE + "x = 21\nprint(os.getpid())"))
    with state_of(state) as data:
        data["gpus"][0]["processes"].append(
            {"pid": pid, "memory_mib": memory_mib, "sm": 0, **extra}
        )
    return kid, pid


def entry(server, kid: str) -> dict:
    return next((k for k in server.gpu()["kernels"] if k["id"] == kid), {})


def hibernation(server, kid: str) -> dict:
    return entry(server, kid).get("hibernation") or {}


def cuda_state(state: Path, pid: int) -> str:
    for p in json.loads(state.read_text())["gpus"][0]["processes"]:
        if p["pid"] == pid:
            return p.get("cuda_state", "running")
    return "gone"


async def test_idle_kernel_hibernates_and_a_cell_resumes_it(env):
    server, state, _ = env
    kid, pid = await gpu_kernel(server, state)
    wait_for(lambda: entry(server, kid).get("gpu_memory_mib") == 4 * GIB, 15, "GPU memory read")
    before = server.api("GET", "/api/status")[1]["last_activity"]
    wait_for(lambda: hibernation(server, kid).get("state") == "hibernated", 20, "hibernation")
    report = server.gpu()
    assert cuda_state(state, pid) == "checkpointed"
    # its GPU memory is free (NVML no longer lists the process) and held in host memory
    wait_for(lambda: entry(server, kid).get("gpu_memory_mib") == 0, 15, "GPU memory freed")
    assert hibernation(server, kid)["hibernated_gpu_memory_mib"] == 4 * GIB
    assert report["hibernated_gpu_memory_mib"] == 4 * GIB
    assert report["hibernation"]["hibernations"][-1]["kernel_id"] == kid
    # hibernating is not activity: the server's last_activity did not move
    assert server.api("GET", "/api/status")[1]["last_activity"] == before
    # the user runs a cell: resumed before the kernel gets it, the right result
    out = await execute(server.url, server.token, kid, "print(x * 2, my_state())")
    assert out.strip() == "42 running"  # the kernel's own CUDA state when the cell ran
    h = hibernation(server, kid)
    # the resume itself, not the state now: idle for HIBERNATE_AFTER after the cell, a loaded
    # machine may already see it hibernating again
    assert h["last_resume_seconds"] is not None
    assert server.gpu()["hibernation"]["resumes"][-1]["kernel_id"] == kid
    wait_for(lambda: entry(server, kid).get("gpu_memory_mib") == 4 * GIB, 15, "memory back")
    server.api("DELETE", f"/api/kernels/{kid}")


async def test_resume_button(env):
    server, state, _ = env
    kid, pid = await gpu_kernel(server, state, 2 * GIB)
    wait_for(lambda: hibernation(server, kid).get("state") == "hibernated", 20, "hibernation")
    status, body = server.api("POST", "/api/fracspawner/gpu/resume", {"kernel_id": kid})
    assert status == 200, body
    assert body["kernels"][kid]["state"] == "running" and cuda_state(state, pid) == "running"
    assert server.api("POST", "/api/fracspawner/gpu/resume", {"kernel_id": "nope"})[0] == 404
    assert http("POST", server.url + "/api/fracspawner/gpu/resume", None, {})[0] == 403
    server.api("DELETE", f"/api/kernels/{kid}")


async def test_resume_all_does_not_wait_for_a_copy_under_way(env):
    """`POST .../gpu/resume` `{}` (every kernel) waited for a kernel whose checkpoint was still
    copying its GPU state out (a minute for 80 GiB on an H200), then copied it back: the
    meter hides Resume during a copy, the API did not. It brings back the hibernated kernels
    whose copy is done and names the others, for the client to ask again (202)."""
    server, state, _ = env
    done, _ = await gpu_kernel(server, state, 1 * GIB)
    wait_for(lambda: hibernation(server, done).get("state") == "hibernated", 20, "hibernation")
    with state_of(state) as data:
        data["bandwidth_gib_s"] = 0.5  # the fake driver copies 1 GiB in 2 s, 6 GiB in 12 s
    try:
        big, b_pid = await gpu_kernel(server, state, 6 * GIB)
        wait_for(lambda: hibernation(server, big).get("state") == "hibernating", 20, "the copy")
        status, body = server.api("POST", "/api/fracspawner/gpu/resume", {})
        assert status == 202, body  # not every kernel is back: ask again
        assert body["kernels"][done]["state"] == "running"
        # (the fake driver copies under its state file's lock: the restore waited for the copy)
        assert body["kernels"][big]["state"] in ("hibernating", "hibernated")
        (named,) = (body.get("copying") or {}).items()
        assert named[0] == big and "being copied to host memory" in named[1], named
        # the copy ends, and nothing brings the kernel back: nobody asked for it
        wait_for(lambda: hibernation(server, big).get("state") == "hibernated", 30, "copy done")
        await asyncio.sleep(1)
        assert hibernation(server, big)["state"] == "hibernated"
        assert cuda_state(state, b_pid) == "checkpointed"
        assert big not in [r["kernel_id"] for r in server.gpu()["hibernation"]["resumes"]]
    finally:
        with state_of(state) as data:
            data["bandwidth_gib_s"] = 40
    for kid in (done, big):
        server.api("DELETE", f"/api/kernels/{kid}")


async def test_no_host_memory_headroom_keeps_it_running(env):
    server, state, cgroup = env
    set_cgroup(cgroup, 3, 2)  # 1 GiB free under the pod's limit; 4 GiB to copy
    try:
        kid, pid = await gpu_kernel(server, state)
        wait_for(
            lambda: "not hibernated" in str(hibernation(server, kid).get("reason")), 20, "refusal"
        )
        h = hibernation(server, kid)
        assert h["state"] == "running"
        assert h["reason"] == (
            "not hibernated: it needs 4.5 GiB of host memory and 1 GiB is free under the pod's "
            "memory limit"
        )
        assert cuda_state(state, pid) == "running"
    finally:
        set_cgroup(cgroup, 64, 1)
    # with headroom again it goes on its next idle reading
    wait_for(lambda: hibernation(server, kid).get("state") == "hibernated", 20, "hibernation")
    assert (await execute(server.url, server.token, kid, "print(x + 1)")).strip() == "22"
    server.api("DELETE", f"/api/kernels/{kid}")


@pytest.mark.parametrize(
    "extra, state, reason",
    [
        (
            {"refuse": "uvm"},
            "cannot_hibernate",
            "cannot hibernate: the driver refused (CUDA_ERROR_NOT_SUPPORTED)",
        ),
        (
            {"refuse": "ipc", "refuse_leaves": "failed"},
            "failed",  # terminal: told, never tried again
            "the driver refused (CUDA_ERROR_NOT_SUPPORTED) and left its CUDA state failed: "
            "restart the kernel to use the GPU again",
        ),
    ],
)
async def test_refused_kernels_are_left_running_never_ended(env, extra, state, reason):
    server, fake, _ = env
    kid, pid = await gpu_kernel(server, fake, **extra)
    wait_for(lambda: hibernation(server, kid).get("state") == state, 20, "refusal")
    assert hibernation(server, kid)["reason"] == reason
    assert cuda_state(fake, pid) == ("failed" if "refuse_leaves" in extra else "running")
    # the kernel and its data are there; nothing shut it down
    assert (await execute(server.url, server.token, kid, "print(x * 3)")).strip() == "63"
    assert entry(server, kid)["gpu_memory_mib"] == 4 * GIB
    server.api("DELETE", f"/api/kernels/{kid}")


async def cell_resuming(server, kid: str, seen: Callable[[dict], bool], what: str) -> tuple:
    """Once kernel `kid` has hibernated, a cell that resumes it (printing x * 2 and its CUDA
    state) and the kernel's hibernation entry once `seen(entry)` holds; the entry and the
    cell's future."""
    wait_for(lambda: hibernation(server, kid).get("state") == "hibernated", 20, "hibernation")
    cell = asyncio.ensure_future(execute(server.url, server.token, kid, "print(x * 2, my_state())"))
    entry = await asyncio.to_thread(
        wait_for, lambda: (h := hibernation(server, kid)) and seen(h) and h, 20, what
    )
    return entry, cell


async def test_failed_restore_keeps_the_kernel_and_tells_the_user(env):
    """A restore failure that passes (not for want of room: that one loses the state on current
    drivers, NVIDIA/cuda-checkpoint#44, and is never risked: test_hibernation_room.py)."""
    server, state, _ = env
    kid, pid = await gpu_kernel(server, state, 2 * GIB, restore_transient=2)
    # the meter is told while it retries (1 s, then 2 s)
    seen, cell = await cell_resuming(
        server, kid, lambda h: h.get("state") == "restore_failed", "restore failure in the report"
    )
    assert "CUDA_ERROR_NOT_READY" in seen["restore_error"] and seen["next_retry"]
    out = await asyncio.wait_for(cell, 60)
    # the notebook was told, and the cell ran once the GPU state was back
    assert "could not be restored yet" in out and "The kernel is kept" in out
    assert out.strip().endswith("42 running")
    # restored, and the report says so (not "running" itself: idle for HIBERNATE_AFTER after
    # the cell, a loaded machine may already see it hibernate again; CI did once)
    assert hibernation(server, kid)["state"] != "restore_failed"
    assert server.gpu()["hibernation"]["resumes"][-1]["kernel_id"] == kid
    server.api("DELETE", f"/api/kernels/{kid}")


async def test_a_restore_that_does_not_return_is_told_and_the_cell_still_runs(env):
    """The driver's restore can block (NVIDIA/cuda-checkpoint#17: it "never returned"; here
    15 s). Past restore_stall_seconds (3 s here) the cell is told why it waits and what
    restarting would cost, and the report says since when; once the restore returns the cell
    runs on the kernel's own state. Before, the cell waited without a word."""
    server, state, _ = env
    kid, pid = await gpu_kernel(server, state, 2 * GIB, restore_blocks_s=15)
    seen, cell = await cell_resuming(
        server, kid, lambda h: bool(h.get("restore_stalled_since")), "the stalled restore"
    )
    assert seen["state"] == "resuming", seen
    out = await asyncio.wait_for(cell, 60)
    assert "has not finished after" in out and "NVIDIA/cuda-checkpoint#17" in out, out
    assert "restart the kernel (its variables are lost)" in out, out
    assert out.strip().endswith("42 running")
    assert hibernation(server, kid).get("restore_stalled_since") is None
    server.api("DELETE", f"/api/kernels/{kid}")


async def test_a_kernel_restarted_while_hibernated_just_runs(env):
    """Restarting is the user's way out: the old process (and its parked state) goes, and the
    new kernel gets the messages at once (the fake driver, like the real one, knows no exited
    process)."""
    server, state, _ = env
    kid, pid = await gpu_kernel(server, state, GIB)
    wait_for(lambda: hibernation(server, kid).get("state") == "hibernated", 20, "hibernation")
    status, _ = server.api("POST", f"/api/kernels/{kid}/restart")
    assert status == 200
    out = await execute(server.url, server.token, kid, "import os\nprint(os.getpid())")
    assert int(out) != pid
    assert hibernation(server, kid)["state"] == "running"
    server.api("DELETE", f"/api/kernels/{kid}")


# --- in process: the API missing, the host-memory readings ------------------------------------
def fake_driver_module():
    spec = importlib.util.spec_from_file_location(
        "fake_cuda_driver", FAKE / "cuda" / "bindings" / "driver.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_api_missing_or_too_old(tmp_path, monkeypatch):
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"gpus": [{"processes": []}], "cuda_driver_version": 12040}))
    monkeypatch.setenv("FAKE_NVML_STATE", str(state))
    old = Hibernator(driver=CheckpointDriver(fake_driver_module()))
    assert old.available() == (
        "the GPU driver (CUDA 12.4) has no checkpoint API: it needs driver 570 or newer (CUDA 12.8)"
    )
    assert old.kernel_json("k")["state"] == "cannot_hibernate"
    if importlib.util.find_spec("cuda") is None:  # this machine: no cuda-python
        with pytest.raises(Unsupported, match="cuda-python is not installed"):
            CheckpointDriver().check()
    state.write_text(json.dumps({"gpus": [], "cuda_driver_version": 12080}))
    none = Hibernator(driver=CheckpointDriver(fake_driver_module()))
    assert none.available() == "the CUDA driver could not start (CUDA_ERROR_NO_DEVICE)"


def test_host_headroom_from_cgroup_files(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 67108864 kB\nMemAvailable: 33554432 kB\n")  # 32 GiB
    v2 = tmp_path / "v2"
    v2.mkdir()
    set_cgroup(v2, 8, 3)
    assert host_headroom(v2, str(meminfo)).free_mib == 5 * GIB
    set_cgroup(v2, "max", 3)  # no limit: the node's available memory
    h = host_headroom(v2, str(meminfo))
    assert (h.free_mib, h.where) == (32 * GIB, "the node's memory")
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text(str(6 * 2**30))
    (v1 / "memory" / "memory.usage_in_bytes").write_text(str(2 * 2**30))
    assert host_headroom(v1, str(meminfo)).free_mib == 4 * GIB
    assert host_headroom(v1, str(meminfo)).limit_mib == 6 * GIB
    assert h.limit_mib == math.inf  # "max": no limit, which is not unknown
    nothing = host_headroom(tmp_path / "none", str(tmp_path / "no-meminfo"))
    assert nothing.free_mib is None  # unknown: never suspended on it
    assert nothing.limit_mib is None


async def test_work_that_does_not_pause_leaves_it_running(tmp_path, monkeypatch):
    """cuCheckpointProcessLock with a timeout leaves the process RUNNING when the timeout is
    reached (CUDA Driver API): not hibernated, tried again later."""
    state = tmp_path / "state.json"
    me = os.getpid()
    state.write_text(json.dumps({"cuda_driver_version": 12080, "gpus": [
        {"processes": [{"pid": me, "memory_mib": 1024, "lock_busy": True}]}]}))  # fmt: skip
    monkeypatch.setenv("FAKE_NVML_STATE", str(state))
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    set_cgroup(cgroup, 64, 1)
    hib = Hibernator(
        driver=CheckpointDriver(fake_driver_module()),
        cgroup_root=str(cgroup),
        lock_timeout_ms=100,
        retry_refused_after=0,
        cpu_probe_seconds=0,
    )
    assert await hib.hibernate("k", [me], 1024, kernel_pid=me) == "running"
    assert hib.kernel_json("k")["reason"] == (
        "not hibernated: its CUDA work did not pause within 0.1 s; tried again later"
    )
    assert cuda_state(state, me) == "running"
    with state_of(state) as data:  # the work finished: the next try suspends it
        data["gpus"][0]["processes"][0]["lock_busy"] = False
    assert await hib.hibernate("k", [me], 1024, kernel_pid=me) == "hibernated"
    assert hib.total_mib() == 1024
    hib.room = lambda s: Room(True, "the fake GPU is empty")  # as the server's SwapAgent says
    task = hib.resume("k", "test")
    assert task is not None and await task
    assert cuda_state(state, me) == "running" and hib.total_mib() == 0
