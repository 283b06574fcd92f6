"""The real CUDA driver's checkpoint API against what the fake driver (tests/fake_nvml/cuda/
bindings/driver.py) models: every test here puts a real process through one case that the fake's
docstring names, records what the real driver answered (the table at the end of `make
test-gpu`), and fails where the fake answers otherwise, so a wrong model shows on the first GPU
run instead of hiding lost kernels (the lesson of NVIDIA/cuda-checkpoint#44).

The processes are plain CuPy programs (`CHILD`) driven over stdin; the calls go through
fracspawner's own `CheckpointDriver`, the code path the hibernator uses.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

CHILD = r"""
import os, sys, cupy
mib = int(sys.argv[1])
a = cupy.arange(mib * 2**20 // 8, dtype=cupy.float64)
if "managed" in sys.argv[2:]:  # 64 MiB of unified memory beside it
    managed = cupy.cuda.runtime.mallocManaged(64 * 2**20)
cupy.cuda.Device().synchronize()
expected = float(a.sum())
grown = []
spin = cupy.RawKernel(
    'extern "C" __global__ void spin(long long n)'
    '{ long long t = clock64(); while (clock64() - t < n) {} }', "spin")
print(os.getpid(), flush=True)
for line in sys.stdin:
    cmd = line.split()
    if cmd[0] == "check":
        print(float(a.sum()) == expected, flush=True)
    elif cmd[0] == "spin":  # one thread busy for about cmd[1] seconds, not waited for
        spin((1,), (1,), (cupy.int64(int(float(cmd[1]) * 2e9)),))
        print("spinning", flush=True)
    elif cmd[0] == "grow":  # cmd[1] MiB more, outside CuPy's pool
        try:
            grown.append(cupy.cuda.runtime.malloc(int(float(cmd[1]) * 2**20)))
            print("ok", flush=True)
        except cupy.cuda.runtime.CUDARuntimeError:
            print("oom", flush=True)
    elif cmd[0] == "release":
        while grown:
            cupy.cuda.runtime.free(grown.pop())
        print("ok", flush=True)
    elif cmd[0] == "exit":
        break
"""


class Child:
    """A CUDA process holding `mib` MiB with a known checksum."""

    def __init__(self, mib: int, *flags: str):
        self.p = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(mib), *flags],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.pid = int(self.read(120))

    def read(self, timeout: float) -> str:
        import select

        ready, _, _ = select.select([self.p.stdout], [], [], timeout)
        if not ready:
            raise TimeoutError(f"process {self.p.pid} did not answer in {timeout} s")
        return self.p.stdout.readline().strip()

    def ask(self, cmd: str, timeout: float = 60) -> str:
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()
        return self.read(timeout)

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGKILL)
        try:
            self.p.wait(30)
        except subprocess.TimeoutExpired:
            pass


def smi_pids() -> dict[int, float]:
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        check=True, capture_output=True, text=True, timeout=30,
    ).stdout  # fmt: skip
    return {int(p): float(m) for p, m in (line.split(",") for line in out.splitlines() if line)}


def free_mib() -> float:
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.free", "--format=csv,noheader,nounits"],
        check=True, capture_output=True, text=True, timeout=30,
    ).stdout  # fmt: skip
    return float(out.split()[0])


def nvml_free_mib() -> float:
    """Total minus used by NVML, as the server extension reads the device (sources.py)."""
    import pynvml

    pynvml.nvmlInit()
    try:
        mem = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0))
        return (mem.total - mem.used) / 2**20
    finally:
        pynvml.nvmlShutdown()


def wait_gone(pid: int) -> None:
    deadline = time.monotonic() + 30
    while pid in smi_pids() and time.monotonic() < deadline:
        time.sleep(0.3)


@pytest.fixture(scope="module")
def drv():
    from fracspawner.serverext.checkpoint import CheckpointDriver, Unsupported

    d = CheckpointDriver()
    try:
        d.check()
    except Unsupported as exc:
        pytest.skip(f"no checkpoint API here: {exc}")
    return d


def answer(call) -> str:
    """'ok' or the driver's error name."""
    from fracspawner.serverext.checkpoint import CheckpointError

    try:
        call()
        return "ok"
    except CheckpointError as exc:
        return exc.code


def state_or_code(drv, pid: int) -> str:
    from fracspawner.serverext.checkpoint import CheckpointError

    try:
        return drv.state(pid)
    except CheckpointError as exc:
        return exc.code


def test_get_state_of_a_process_that_exited_and_of_one_without_cuda(drv, gpu_record):
    """Fake: OPERATING_SYSTEM for an exited pid, NOT_INITIALIZED for a live process that never
    used CUDA (the first GPU run measured these; the fake said INVALID_VALUE and NOT_SUPPORTED,
    and the hibernator took the exited pid for a process it can never suspend)."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    plain = subprocess.Popen(["sleep", "60"])
    try:
        exited = answer(lambda: drv.state(gone.pid))
        no_cuda = answer(lambda: drv.state(plain.pid))
    finally:
        plain.kill()
    gpu_record("GetState, exited pid", exited)
    gpu_record("GetState, process without CUDA", no_cuda)
    assert (exited, no_cuda) == ("CUDA_ERROR_OPERATING_SYSTEM", "CUDA_ERROR_NOT_INITIALIZED")


def test_a_whole_cycle_and_the_states_between(drv, gpu_record):
    """Fake: Lock RUNNING->LOCKED, Checkpoint ->CHECKPOINTED (the pid leaves nvidia-smi),
    Restore ->LOCKED, Unlock ->RUNNING, data intact; the restore thread is the main thread."""
    mib = 4096
    c = Child(mib)
    seen = []
    try:
        seen.append(drv.state(c.pid))
        drv.lock(c.pid, 10_000)
        seen.append(drv.state(c.pid))
        t = time.monotonic()
        drv.checkpoint(c.pid)
        gpu_record("checkpoint GiB/s (4 GiB)", round(mib / 1024 / (time.monotonic() - t), 2))
        seen.append(drv.state(c.pid))
        listed = c.pid in smi_pids()
        _err, tid = drv._call("cuCheckpointProcessGetRestoreThreadId", c.pid)
        gpu_record("restore thread id == pid (the fake: pid + 1)", int(tid) == c.pid)
        t = time.monotonic()
        drv.restore(c.pid)
        gpu_record("restore GiB/s (4 GiB)", round(mib / 1024 / (time.monotonic() - t), 2))
        seen.append(drv.state(c.pid))
        drv.unlock(c.pid)
        seen.append(drv.state(c.pid))
        intact = c.ask("check")
    finally:
        c.kill()
    gpu_record("states", " -> ".join(seen))
    gpu_record("checkpointed pid still listed by nvidia-smi", listed)
    assert seen == ["running", "locked", "checkpointed", "locked", "running"]
    assert not listed
    assert intact == "True"


def test_lock_with_a_timeout_while_work_runs(drv, gpu_record):
    """Fake: a lock whose timeout is reached returns NOT_READY and leaves the process RUNNING
    (the docs say RUNNING; which code is an assumption, the hibernator takes TIMEOUT too)."""
    from fracspawner.serverext.checkpoint import BUSY_CODES

    c = Child(64)
    try:
        assert c.ask("spin 6") == "spinning"
        t = time.monotonic()
        code = answer(lambda: drv.lock(c.pid, 500))
        waited = time.monotonic() - t
        state = drv.state(c.pid)
        if code == "ok":
            drv.unlock(c.pid)
    finally:
        c.kill()
    gpu_record("Lock(500 ms) during a 6 s kernel", f"{code} after {waited:.1f} s, {state}")
    assert code in BUSY_CODES and state == "running"
    gpu_record("code the fake gives", "CUDA_ERROR_NOT_READY")
    assert code == "CUDA_ERROR_NOT_READY"


def test_restore_without_room_then_with_room(drv, gpu_record):
    """Fake (#44): a restore onto a GPU without room returns OUT_OF_MEMORY and leaves the
    process CHECKPOINTED; every later restore returns OPERATING_SYSTEM, room or not, and unlock
    ILLEGAL_STATE: the process is lost."""
    a = Child(4096)
    filler = None
    seen: dict[str, str] = {}
    try:
        drv.lock(a.pid, 10_000)
        drv.checkpoint(a.pid)
        wait_gone(a.pid)
        room = free_mib()
        filler = Child(int(room - 3072))  # its context takes ~0.5 GiB: ~2.5 left, A needs 4
        seen["restore, ~2.5 GiB free"] = answer(lambda: drv.restore(a.pid))
        seen["state after"] = state_or_code(drv, a.pid)
        filler.kill()
        wait_gone(filler.pid)
        seen["free MiB after the filler left"] = f"{free_mib():.0f}"
        seen["restore again, room"] = answer(lambda: drv.restore(a.pid))
        seen["state after it"] = state_or_code(drv, a.pid)
        if seen["restore again, room"] == "ok":
            seen["unlock"] = answer(lambda: drv.unlock(a.pid))
            seen["data"] = a.ask("check") if seen["unlock"] == "ok" else "-"
        else:
            seen["unlock"] = answer(lambda: drv.unlock(a.pid))
    finally:
        if filler:
            filler.kill()
        a.kill()
    for what, value in seen.items():
        gpu_record(what, value)
    assert seen["restore, ~2.5 GiB free"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert seen["state after"] == "checkpointed"
    assert seen["restore again, room"] == "CUDA_ERROR_OPERATING_SYSTEM", (
        "the fake says a restore that ran out of memory loses the process (#44); this driver "
        "restored it: tests/fake_nvml/cuda/bindings/driver.py must model that"
    )


def test_calls_from_the_wrong_state_and_the_process_own_calls(drv, gpu_record):
    """Fake: a call from another state than its own returns ILLEGAL_STATE, a call on an exited
    pid OPERATING_SYSTEM; the process's own CUDA calls block while it is LOCKED and go on after
    the unlock."""
    c = Child(64)
    seen: dict[str, str] = {}
    try:
        seen["Checkpoint, running"] = answer(lambda: drv.checkpoint(c.pid))
        seen["Restore, running"] = answer(lambda: drv.restore(c.pid))
        seen["Unlock, running"] = answer(lambda: drv.unlock(c.pid))
        drv.lock(c.pid, 10_000)
        seen["Lock, locked"] = answer(lambda: drv.lock(c.pid, 1000))
        seen["Restore, locked"] = answer(lambda: drv.restore(c.pid))
        try:
            seen["own call while locked"] = f"answered {c.ask('check', timeout=3)}"
        except TimeoutError:
            seen["own call while locked"] = "blocked"
        drv.unlock(c.pid)
        if seen["own call while locked"] == "blocked":
            seen["own call after unlock"] = c.read(30)
        drv.lock(c.pid, 10_000)
        drv.checkpoint(c.pid)
        seen["Lock, checkpointed"] = answer(lambda: drv.lock(c.pid, 1000))
        seen["Checkpoint, checkpointed"] = answer(lambda: drv.checkpoint(c.pid))
        seen["Unlock, checkpointed"] = answer(lambda: drv.unlock(c.pid))
        drv.restore(c.pid)
        drv.unlock(c.pid)
        seen["data after all that"] = c.ask("check")
    finally:
        c.kill()
    gone = subprocess.Popen(["true"])
    gone.wait()
    seen["Lock, exited pid"] = answer(lambda: drv.lock(gone.pid, 1000))
    seen["Restore, exited pid"] = answer(lambda: drv.restore(gone.pid))
    for what, value in seen.items():
        gpu_record(what, value)
    illegal = "CUDA_ERROR_ILLEGAL_STATE"
    assert seen["own call while locked"] == "blocked"
    assert seen.get("own call after unlock") == "True"
    assert seen["data after all that"] == "True"
    wrong_state = [k for k in seen if k.split(", ")[-1] in ("running", "locked", "checkpointed")]
    assert {k: seen[k] for k in wrong_state} == dict.fromkeys(wrong_state, illegal)
    assert seen["Lock, exited pid"] == seen["Restore, exited pid"] == "CUDA_ERROR_OPERATING_SYSTEM"


def test_checkpoint_of_a_process_with_unified_memory(drv, gpu_record):
    """Fake: UVM memory ("does not support UVM or IPC memory", the README) -> Checkpoint
    NOT_SUPPORTED, the process left LOCKED (or FAILED: which one is not documented)."""
    c = Child(64, "managed")
    try:
        drv.lock(c.pid, 10_000)
        code = answer(lambda: drv.checkpoint(c.pid))
        left = state_or_code(drv, c.pid)
        if left == "locked":
            drv.unlock(c.pid)
        elif left == "checkpointed":
            drv.restore(c.pid)
            drv.unlock(c.pid)
        after = state_or_code(drv, c.pid)
        data = c.ask("check", timeout=10) if after == "running" else "-"
    finally:
        c.kill()
    gpu_record("Checkpoint with 64 MiB managed", code)
    gpu_record("state it left, after settling, data", f"{left}, {after}, {data}")
    assert code == "CUDA_ERROR_NOT_SUPPORTED" and left in ("locked", "failed")


def test_how_much_free_memory_a_restore_needs(drv, gpu_record):
    """A restore refused for want of room loses the process (#44), so the server extension
    restores on NVML's word only with `SwapAgent.restore_margin_mib` (512) free beyond what
    the kernel held by NVML, and the fake refuses below exactly what it held. Here: one
    process (1 GiB) checkpointed per attempt, the GPU filled to leave `need + delta` free by
    NVML's total - used, and restored."""
    from fracspawner.serverext.swap import SwapAgent

    margin = SwapAgent.restore_margin_mib.default_value
    filler = Child(64)
    outcomes: list[tuple[float, str]] = []
    try:
        for delta in (margin, 256, 64, 0, -64):
            a = Child(1024)
            try:
                need = smi_pids()[a.pid]
                drv.lock(a.pid, 10_000)
                drv.checkpoint(a.pid)
                wait_gone(a.pid)
                grow = nvml_free_mib() - need - delta
                if grow > 0 and filler.ask(f"grow {grow:.0f}") != "ok":
                    pytest.fail(f"could not fill the GPU to {delta} MiB beyond {need} MiB")
                actual = nvml_free_mib() - need
                outcome = answer(lambda pid=a.pid: drv.restore(pid))
                outcomes.append((round(actual), outcome))
                gpu_record(f"restore of {need:.0f} MiB, free = need + {actual:.0f}", outcome)
            finally:
                a.kill()
                filler.ask("release")
                wait_gone(a.pid)
    finally:
        filler.kill()
    # the product's margin holds: with it free, a restore goes through
    assert outcomes[0][1] == "ok", outcomes
    # the fake's line: exactly what the process held suffices, less does not
    fake = ["ok" if d >= 0 else "CUDA_ERROR_OUT_OF_MEMORY" for d, _ in outcomes]
    assert [o for _, o in outcomes] == fake, outcomes


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([os.path.abspath(__file__), "-rs"]))
