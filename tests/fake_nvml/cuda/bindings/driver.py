"""A FAKE of cuda-python's `cuda.bindings.driver`, for tests only: the CUDA driver's checkpoint
API (cuCheckpointProcess*) acting on the processes that tests/fake_nvml/pynvml.py shows. It is
not CUDA. Put tests/fake_nvml first on PYTHONPATH of the server under test.

State lives in the same JSON file as the fake NVML (`$FAKE_NVML_STATE`): a process in
`gpus[i].processes` gains `"cuda_state"` (running, locked, checkpointed, failed; absent =
running) and `"host_mib"` (GPU memory copied to host memory). What each call does, and why:

- cuda-python's driver functions return a tuple whose first item is a `CUresult`
  (`err, state = cuCheckpointProcessGetState(pid)`), and raise `RuntimeError('Function
  "cuCheckpointProcessLock" not found')` where the loaded libcuda lacks the symbol: the
  checkpoint entry points arrived with the r570 driver / CUDA 12.8 (NVIDIA/cuda-checkpoint
  README, "570 Features": "CUDA Driver interfaces at feature parity with the cuda-checkpoint
  utility"); `"cuda_driver_version"` below 12080 models an older driver.
- States and transitions (CUDA Driver API, group CUDA_CHECKPOINT; cuda.bindings ProcessState):
  Lock: RUNNING -> LOCKED, "Process must be in the RUNNING state"; "If timeoutMs is specified and
  the timeout is reached the process will be left in the RUNNING state" (`"lock_timeout": true`
  on a process models work that does not finish: CUDA_ERROR_TIMEOUT). Checkpoint: LOCKED ->
  CHECKPOINTED, "The GPU memory contents will be brought into host memory and all underlying
  references will be released" (so NVML no longer lists it: the README's nvidia-smi example).
  Restore: CHECKPOINTED -> LOCKED. Unlock: LOCKED -> RUNNING. Any other starting state:
  CUDA_ERROR_ILLEGAL_STATE (a documented return of each call).
- Refusals: the README's "Functionality" section: no UVM or IPC memory
  (`"refuse": "uvm"`/`"ipc"` -> CUDA_ERROR_NOT_SUPPORTED from Checkpoint), and it "does not
  attempt to keep the process in a good state if an error ... is encountered during checkpoint
  or restore": `"refuse_leaves": "failed"` leaves it FAILED, the default leaves it LOCKED.
- `"restore_failures": n` makes the next n Restores fail with CUDA_ERROR_OUT_OF_MEMORY (a
  time-sliced GPU filled up meanwhile) and the process stays CHECKPOINTED: an assumption (the
  docs do not say what a failed restore leaves); the extension never relies on it, it asks.
- Copy time: `"bandwidth_gib_s"` (top level; default 0 = instant) makes Checkpoint and
  Restore sleep memory / bandwidth seconds, a PCIe-class copy.
- A pid that is not a CUDA process in the state: CUDA_ERROR_INVALID_VALUE.
"""

from __future__ import annotations

import enum
import fcntl
import json
import os
import time
from contextlib import contextmanager


class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_OUT_OF_MEMORY = 2
    CUDA_ERROR_NOT_INITIALIZED = 3
    CUDA_ERROR_NO_DEVICE = 100
    CUDA_ERROR_ILLEGAL_STATE = 401
    CUDA_ERROR_NOT_SUPPORTED = 801
    CUDA_ERROR_TIMEOUT = 909


class CUprocessState(enum.IntEnum):
    CU_PROCESS_STATE_RUNNING = 0
    CU_PROCESS_STATE_LOCKED = 1
    CU_PROCESS_STATE_CHECKPOINTED = 2
    CU_PROCESS_STATE_FAILED = 3


class _Args:
    def __init__(self) -> None:
        self.timeoutMs = 0  # noqa: N815 (cuda.h's names)
        self.reserved0 = 0


CUcheckpointLockArgs = CUcheckpointCheckpointArgs = _Args
CUcheckpointRestoreArgs = CUcheckpointUnlockArgs = _Args

_STATES = {
    "running": CUprocessState.CU_PROCESS_STATE_RUNNING,
    "locked": CUprocessState.CU_PROCESS_STATE_LOCKED,
    "checkpointed": CUprocessState.CU_PROCESS_STATE_CHECKPOINTED,
    "failed": CUprocessState.CU_PROCESS_STATE_FAILED,
}
_initialised = False


@contextmanager
def _state():
    """Read-modify-write of the shared state file under an exclusive lock (threads, processes)."""
    path = os.environ["FAKE_NVML_STATE"]
    with open(path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with open(path) as f:
            data = json.load(f)
        yield data
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)


def _peek() -> dict:
    with open(os.environ["FAKE_NVML_STATE"]) as f:
        return json.load(f)


def _require(name: str) -> None:
    if int(_peek().get("cuda_driver_version", 12080)) < 12080:
        raise RuntimeError(f'Function "{name}" not found')


def _process(data: dict, pid: int) -> dict | None:
    if not data.get("any_pid") and not os.path.exists(f"/proc/{int(pid)}"):
        return None  # a process that has exited is no CUDA process (INVALID_VALUE)
    for gpu in data.get("gpus", []):
        for p in gpu.get("processes", []):
            if int(p["pid"]) == int(pid):
                return p
    return None


def _copy_pause(data: dict, memory_mib: float) -> None:
    bandwidth = float(data.get("bandwidth_gib_s", 0) or 0)
    if bandwidth > 0:
        time.sleep(memory_mib / 1024 / bandwidth)


def cuInit(flags: int) -> tuple:  # noqa: N802
    global _initialised
    if not _peek().get("gpus"):
        return (CUresult.CUDA_ERROR_NO_DEVICE,)
    _initialised = True
    return (CUresult.CUDA_SUCCESS,)


def cuDriverGetVersion() -> tuple:  # noqa: N802
    return CUresult.CUDA_SUCCESS, int(_peek().get("cuda_driver_version", 12080))


def cuGetErrorName(err: CUresult) -> tuple:  # noqa: N802
    return CUresult.CUDA_SUCCESS, CUresult(err).name.encode()


def _transition(name: str, pid: int, start: str, end: str, act=None) -> tuple:
    _require(name)
    if not _initialised:
        return (CUresult.CUDA_ERROR_NOT_INITIALIZED,)
    with _state() as data:
        p = _process(data, pid)
        if p is None:
            return (CUresult.CUDA_ERROR_INVALID_VALUE,)
        if p.get("cuda_state", "running") != start:
            return (CUresult.CUDA_ERROR_ILLEGAL_STATE,)
        if act is not None:
            err = act(data, p)
            if err is not None:
                return (err,)
        p["cuda_state"] = end
        return (CUresult.CUDA_SUCCESS,)


def cuCheckpointProcessGetState(pid: int) -> tuple:  # noqa: N802
    _require("cuCheckpointProcessGetState")
    if not _initialised:
        return CUresult.CUDA_ERROR_NOT_INITIALIZED, None
    p = _process(_peek(), pid)
    if p is None:
        return CUresult.CUDA_ERROR_INVALID_VALUE, None
    return CUresult.CUDA_SUCCESS, _STATES[p.get("cuda_state", "running")]


def cuCheckpointProcessLock(pid: int, args: _Args | None) -> tuple:  # noqa: N802
    def act(data, p):
        if p.get("lock_timeout"):
            if args is not None and args.timeoutMs:
                time.sleep(min(args.timeoutMs, 200) / 1000)
                return CUresult.CUDA_ERROR_TIMEOUT  # left RUNNING
        return None

    return _transition("cuCheckpointProcessLock", pid, "running", "locked", act)


def cuCheckpointProcessCheckpoint(pid: int, args: _Args | None) -> tuple:  # noqa: N802
    def act(data, p):
        if p.get("refuse"):
            p["cuda_state"] = "failed" if p.get("refuse_leaves") == "failed" else "locked"
            return CUresult.CUDA_ERROR_NOT_SUPPORTED
        _copy_pause(data, p.get("memory_mib", 0))
        p["host_mib"], p["memory_mib"] = p.get("memory_mib", 0), 0
        return None

    with_refusal = _transition("cuCheckpointProcessCheckpoint", pid, "locked", "checkpointed", act)
    return with_refusal


def cuCheckpointProcessRestore(pid: int, args: _Args | None) -> tuple:  # noqa: N802
    def act(data, p):
        if int(p.get("restore_failures", 0)) > 0:
            p["restore_failures"] = int(p["restore_failures"]) - 1
            return CUresult.CUDA_ERROR_OUT_OF_MEMORY  # stays CHECKPOINTED
        _copy_pause(data, p.get("host_mib", 0))
        p["memory_mib"], p["host_mib"] = p.get("host_mib", 0), 0
        return None

    return _transition("cuCheckpointProcessRestore", pid, "checkpointed", "locked", act)


def cuCheckpointProcessUnlock(pid: int, args: _Args | None) -> tuple:  # noqa: N802
    return _transition("cuCheckpointProcessUnlock", pid, "locked", "running")
