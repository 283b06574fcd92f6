"""Real CUDA processes as kernels, read through real NVML, and hibernated through the real CUDA
checkpoint API: what only a GPU can show (tests/gpu/conftest.py says when it runs).

- NVML readings of a real kernel's allocation, attributed to that kernel (the /proc walk), and
  the meter's numbers against nvidia-smi;
- the framework memory caps FracSpawner puts in the pod's env (CUPY_GPU_MEMORY_LIMIT, from
  backends._soft_caps) honoured by a real allocation;
- hibernate/resume of a real kernel: memory freed per NVML, data intact after resume, resume time;
- a swap round trip: two kernels whose memory together exceeds the GPU, each checkpointed in
  turn so the other fits, both restored with their data; driver version, checkpoint and restore
  seconds per GiB and the host memory the copy takes are printed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.test_culler_support import JupyterServer, execute, wait_for

ALLOC_MIB = 1024
ALLOC = (
    "import cupy, os\n"
    f"a = cupy.arange({ALLOC_MIB} * 2**20 // 8, dtype=cupy.float64)\n"
    "cupy.cuda.Device().synchronize()\n"
    "expected = float(a.sum())\n"
    "print(os.getpid())"
)


def smi(query: str) -> list[list[str]]:
    out = subprocess.run(
        ["nvidia-smi", f"--query-{query}", "--format=csv,noheader,nounits"],
        check=True, capture_output=True, text=True, timeout=30,
    ).stdout  # fmt: skip
    return [[c.strip() for c in line.split(",")] for line in out.strip().splitlines() if line]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpu")
    s = JupyterServer(
        tmp,
        tmp / "unused.json",
        source="nvml",
        env={"FRACSPAWNER_GPU_SLICE": "1", "FRACSPAWNER_KERNEL_GPU_HIBERNATE_SECONDS": "5",
             "FRACSPAWNER_KERNEL_GPU_IDLE_SECONDS": "3600"},
        monitor={"poll_interval": 0.5},
        config={"Hibernator": {"lock_timeout_ms": 20000}},
    )  # fmt: skip
    try:
        yield s
    finally:
        s.stop()


def new_kernel(server) -> str:
    status, body = server.api("POST", "/api/kernels", {"name": "python3"})
    assert status == 201, body
    return body["id"]


def entry(server, kid: str) -> dict:
    return next((k for k in server.gpu()["kernels"] if k["id"] == kid), {})


async def test_nvml_attributes_a_real_allocation_to_its_kernel(server, gpu_record):
    kid = new_kernel(server)
    pid = int(await execute(server.url, server.token, kid, ALLOC))
    wait_for(lambda: entry(server, kid).get("gpu_memory_mib", 0) >= ALLOC_MIB, 60, "NVML reading")
    apps = {int(p): float(m) for p, m in smi("compute-apps=pid,used_memory")}
    assert pid in apps, apps  # nvidia-smi sees the same process (hostPID-less: same namespace)

    def agree() -> tuple[float, float] | None:
        # the two readings are moments apart and the kernel's memory may still grow by a few
        # MiB after its cell (CuPy loading kernels: 1542 vs 1546 MiB on the first H200 run)
        theirs = {int(p): float(m) for p, m in smi("compute-apps=pid,used_memory")}.get(pid)
        seen = entry(server, kid).get("gpu_memory_mib", 0)
        return (seen, theirs) if theirs is not None and abs(seen - theirs) <= 2 else None

    seen, theirs = wait_for(agree, 20, "the meter's reading to be nvidia-smi's")
    gpu_record("kernel GPU memory (report) MiB", seen)
    gpu_record("the same pid per nvidia-smi MiB", theirs)

    def device_agrees() -> tuple[float, float, float] | None:
        # NVML's nvmlDeviceGetMemoryInfo (v1), which the meter reads, counts the driver's
        # reserved memory as used (total - free: what can be allocated); nvidia-smi's
        # memory.used leaves it out (615 MiB on an H200, driver 580.159.04). Sampled moments
        # apart, so read until they agree
        used, reserved = (float(v) for v in smi("gpu=memory.used,memory.reserved")[0])
        ours = server.gpu()["devices"][0]["memory_used_mib"]
        return (ours, used, reserved) if abs(ours - used - reserved) <= 64 else None

    ours, used, reserved = wait_for(device_agrees, 20, "the meter's device reading")
    gpu_record("device used: report / nvidia-smi used + reserved", f"{ours} / {used} + {reserved}")
    server.api("DELETE", f"/api/kernels/{kid}")


def test_cupy_memory_cap_from_the_pods_env_is_honoured(gpu_record):
    from fracspawner.backends import _soft_caps

    total = float(smi("gpu=memory.total")[0][0])
    env = {**os.environ, **_soft_caps(512, int(total))}
    code = (
        "import cupy\n"
        "try:\n"
        "    cupy.empty(768 * 2**20, dtype=cupy.uint8)\n"
        "    print('allocated')\n"
        "except cupy.cuda.memory.OutOfMemoryError:\n"
        "    print('refused')\n"
        "cupy.empty(256 * 2**20, dtype=cupy.uint8)\n"
        "print('small ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.split()
    gpu_record("768 MiB over a 512 MiB CUPY_GPU_MEMORY_LIMIT", out[0])
    assert out == ["refused", "small", "ok"]


async def test_hibernate_and_resume_a_real_kernel(server, gpu_record):
    from fracspawner.serverext.checkpoint import CheckpointDriver, Unsupported

    try:
        CheckpointDriver().check()
    except Unsupported as exc:
        pytest.skip(f"hibernation not possible on this machine: {exc}")
    kid = new_kernel(server)
    pid = int(await execute(server.url, server.token, kid, ALLOC))
    wait_for(lambda: entry(server, kid).get("gpu_memory_mib", 0) >= ALLOC_MIB, 60, "NVML reading")
    started = time.monotonic()
    wait_for(
        lambda: (entry(server, kid).get("hibernation") or {}).get("state") == "hibernated",
        120,
        "hibernation",
    )
    gpu_record("hibernated after (s, policy 5 s)", round(time.monotonic() - started, 1))
    # NVML: the process holds no GPU memory any more
    wait_for(
        lambda: pid not in {int(p) for p, _ in smi("compute-apps=pid,used_memory")}, 30, "freed"
    )
    gpu_record("hibernated MiB", entry(server, kid)["hibernation"]["hibernated_gpu_memory_mib"])
    out = await execute(server.url, server.token, kid, "print(float(a.sum()) == expected)")
    assert out.strip() == "True"  # the data survived, on the GPU again
    h = entry(server, kid)["hibernation"]
    gpu_record("resume seconds (1 GiB)", h["last_resume_seconds"])
    assert h["state"] == "running"
    assert pid in {int(p) for p, _ in smi("compute-apps=pid,used_memory")}
    server.api("DELETE", f"/api/kernels/{kid}")


def _meminfo_available_mib() -> float:
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _rss_mib(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _cgroup_current_mib(pid: int) -> float | None:
    """memory.current of the process's cgroup (v2), as the hibernator reads the pod's."""
    try:
        path = open(f"/proc/{pid}/cgroup").read().strip().split("::", 1)[1]
        return int(open(f"/sys/fs/cgroup{path}/memory.current").read()) / 2**20
    except (OSError, IndexError, ValueError):
        return None


def _fill(mib: int) -> str:
    """A cell holding `mib` MiB of float64 on the GPU with a known checksum."""
    return (
        "import cupy, os\n"
        f"a = cupy.arange({mib} * 2**20 // 8, dtype=cupy.float64)\n"
        "cupy.cuda.Device().synchronize()\n"
        "expected = float(a.sum())\n"
        "print(os.getpid())"
    )


async def test_swap_round_trip_two_kernels_whose_memory_exceeds_the_gpu(server, gpu_record):
    """Issue 26 (6): two kernels on one GPU whose memory together exceeds it. Kernel A fills
    60 % of the free memory and goes idle: it is checkpointed (its memory leaves the GPU, per
    nvidia-smi). Kernel B then allocates another 60 % and checks it, which only fits because A
    is in host memory, and lets it go. A's next cell restores A with its data intact. Only
    documented paths: the restore happens with room on the GPU ("The GPU to restore onto needs
    to have enough memory", cuCheckpointProcessRestore), and one copy at a time is in host
    memory (a node with less host memory than the GPU has could not hold two)."""
    from fracspawner.serverext.checkpoint import CheckpointDriver, Unsupported
    from fracspawner.serverext.checkpoint_env import driver_problem, nvml_driver_version

    try:
        CheckpointDriver().check()
    except Unsupported as exc:
        pytest.skip(f"hibernation not possible on this machine: {exc}")
    driver = nvml_driver_version()
    gpu_record("driver (NVML)", driver)
    gpu_record("CUDA (cuDriverGetVersion)", CheckpointDriver().cuda_version())
    problem = driver_problem(driver, in_container=True, all_gpus_visible=False)
    gpu_record("partial-passthrough check (in a container)", problem or "fine")

    (total, free), *_ = [(float(t), float(f)) for t, f in smi("gpu=memory.total,memory.free")]
    host = _meminfo_available_mib()
    each = int(min(free * 0.6, host * 0.8))  # the copy must fit in host memory too
    gpu_record("GPU total / free MiB, host available MiB", f"{total:.0f} / {free:.0f}, {host:.0f}")
    gpu_record("each kernel allocates MiB", each)
    if 2 * each <= free:
        pytest.skip(f"host memory ({host:.0f} MiB) too small to swap out more than half the GPU")

    def settled(kid: str) -> dict | None:
        h = entry(server, kid).get("hibernation") or {}
        return h if h.get("state") in ("hibernated", "cannot_hibernate", "failed") else None

    def on_gpu() -> dict[int, float]:
        return {int(p): float(m) for p, m in smi("compute-apps=pid,used_memory")}

    a = new_kernel(server)
    pid_a = int(await execute(server.url, server.token, a, _fill(each)))
    rss_before = _rss_mib(pid_a)
    available_before = _meminfo_available_mib()
    cgroup_before = _cgroup_current_mib(pid_a)
    h = wait_for(lambda: settled(a), 300, "kernel A hibernated (or refused)")
    if h["state"] == "cannot_hibernate":  # a driver or container condition (doctor says which)
        server.api("DELETE", f"/api/kernels/{a}")
        pytest.skip(f"hibernation refused here: {h['reason']}")
    assert h["state"] == "hibernated", h
    wait_for(lambda: pid_a not in on_gpu(), 60, "A's memory off the GPU")
    out_a = server.gpu()["hibernation"]["hibernations"][-1]
    assert out_a["kernel_id"] == a
    gpu_record("checkpoint s/GiB", round(out_a["seconds"] / (each / 1024), 3))
    # the host copy against what the hibernator checks before it (the NVML listing plus
    # Hibernator.host_margin_mib under the pod's cgroup limit)
    gpu_record("A's GPU memory by NVML (hibernated) MiB", out_a["gpu_memory_mib"])
    gpu_record("A's RSS grew by MiB (host copy)", round(_rss_mib(pid_a) - rss_before))
    if cgroup_before is not None:
        grew = _cgroup_current_mib(pid_a) - cgroup_before
        gpu_record("A's cgroup memory.current grew by MiB", round(grew))
    gpu_record(
        "host MemAvailable dropped by MiB", round(available_before - _meminfo_available_mib())
    )

    # B allocates what only fits because A is in host memory, checks it and lets it go
    b = new_kernel(server)
    out_b = await execute(
        server.url,
        server.token,
        b,
        _fill(each) + "\n"
        "print(float(a.sum()) == expected)\n"
        "del a\n"
        "cupy.get_default_memory_pool().free_all_blocks()\n",
    )
    pid_b, ok_b = out_b.split()
    assert ok_b == "True"
    gpu_record("A + B committed / GPU total MiB", f"{2 * each} / {total:.0f}")
    assert entry(server, a)["hibernation"]["state"] == "hibernated"  # A untouched meanwhile
    wait_for(lambda: on_gpu().get(int(pid_b), 0) < each / 2, 60, "B's memory released")

    # A's next cell restores A: its data intact. The server may not have read B's memory
    # leave yet (its monitor polls): then the cell says A waits for room, and runs once the
    # GPU shows it free (never restored into a full GPU, NVIDIA/cuda-checkpoint#44)
    check_a = await execute(server.url, server.token, a, "print(float(a.sum()) == expected)")
    *note, last = check_a.strip().splitlines()
    assert last == "True", check_a
    assert all("waits in host memory" in line for line in note), check_a
    gpu_record("A's cell waited for room first", bool(note))
    h_a = entry(server, a)["hibernation"]
    gpu_record("restore s/GiB", round(h_a["last_resume_seconds"] / (each / 1024), 3))
    assert pid_a in on_gpu()
    server.api("DELETE", f"/api/kernels/{a}")
    server.api("DELETE", f"/api/kernels/{b}")


#: a process outside the server that fills the GPU until `target` MiB are free (cudaMemGetInfo),
#: then holds it until its stdin closes: the co-tenant of a shared GPU
_FILLER = (
    "import sys, cupy\n"
    "target = float(sys.argv[1]) * 2**20\n"
    "held, step = [], 256 * 2**20\n"
    "while cupy.cuda.runtime.memGetInfo()[0] - step > target:\n"
    "    held.append(cupy.empty(step, dtype=cupy.uint8))\n"
    "cupy.cuda.Device().synchronize()\n"
    "print(cupy.cuda.runtime.memGetInfo()[0] / 2**20, flush=True)\n"
    "sys.stdin.read()\n"
)


async def test_two_resumes_into_room_for_one(server, gpu_record):
    """Issue 36 (1) on the real driver: two hibernated kernels of one server whose next cells
    come at once, on a GPU a co-tenant has filled to room for one of them. A restore refused
    for want of room loses the process (NVIDIA/cuda-checkpoint#44, measured on this driver by
    test_real_checkpoint_driver.py), so exactly one may restore; the other must wait in host
    memory with the reason, and restore with its data once the first kernel is shut down.
    Neither may end `failed` or `restore_failed`."""
    import asyncio

    from fracspawner.serverext.checkpoint import CheckpointDriver, Unsupported

    try:
        CheckpointDriver().check()
    except Unsupported as exc:
        pytest.skip(f"hibernation not possible on this machine: {exc}")
    each = 6144

    def hibernated(kid: str) -> dict | None:
        h = entry(server, kid).get("hibernation") or {}
        return h if h.get("state") in ("hibernated", "cannot_hibernate", "failed") else None

    kids = [new_kernel(server), new_kernel(server)]
    for kid in kids:
        await execute(server.url, server.token, kid, _fill(each))
    states = [wait_for(lambda k=k: hibernated(k), 300, f"kernel {k} hibernated") for k in kids]
    if any(h["state"] == "cannot_hibernate" for h in states):
        pytest.skip(f"hibernation refused here: {states}")
    assert [h["state"] for h in states] == ["hibernated", "hibernated"], states
    need = max(h["hibernated_gpu_memory_mib"] for h in states)
    # room for one restore (with the server's 512 MiB margin) and half of another
    target = need + 512 + need / 2
    filler = subprocess.Popen(
        [sys.executable, "-c", _FILLER, str(target)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        free_after = float(filler.stdout.readline())
        gpu_record("each kernel held MiB / free after the co-tenant filled MiB",
                   f"{need:.0f} / {free_after:.0f}")  # fmt: skip
        assert need + 512 <= free_after < 2 * need + 512, free_after
        await asyncio.sleep(2)  # the server's monitor (0.5 s polls) reads the full GPU
        check = "print(float(a.sum()) == expected)"
        cells = {k: asyncio.ensure_future(execute(server.url, server.token, k, check))
                 for k in kids}  # fmt: skip
        done, _ = await asyncio.wait(cells.values(), timeout=180, return_when="FIRST_COMPLETED")
        assert done, "neither kernel was restored within 180 s"
        first = next(k for k, t in cells.items() if t in done)
        second = next(k for k in kids if k != first)
        assert cells[first].result().strip().splitlines()[-1] == "True"
        # at once: 5 s idle would hibernate the first again, which also makes room
        assert not cells[second].done(), cells[second].result()
        waiting = entry(server, second)["hibernation"]
        gpu_record("the second while the GPU is full", f"{waiting['state']}")
        assert waiting["state"] in ("hibernated", "restore_failed"), waiting
        server.api("DELETE", f"/api/kernels/{first}")  # its memory leaves the GPU
        out = await asyncio.wait_for(cells[second], 180)
        *note, last = out.strip().splitlines()
        gpu_record("the second's cell said first", " | ".join(note)[:400])
        assert last == "True", out  # restored, data intact: nothing lost
        assert note and all("waits in host memory" in line for line in note), out
        assert entry(server, second)["hibernation"]["state"] == "running"
    finally:
        filler.stdin.close()
        filler.wait(timeout=60)
        for kid in kids:
            server.api("DELETE", f"/api/kernels/{kid}")
