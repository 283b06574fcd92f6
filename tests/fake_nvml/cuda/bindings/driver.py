"""A FAKE of cuda-python's `cuda.bindings.driver`, for tests only: the CUDA driver's checkpoint
API (cuCheckpointProcess*) acting on the processes that tests/fake_nvml/pynvml.py shows. It is
not CUDA. Put tests/fake_nvml first on PYTHONPATH of the server under test.

State lives in the same JSON file as the fake NVML (`$FAKE_NVML_STATE`): a process in
`gpus[i].processes` (or `gpus[i].mig[j].processes`) gains `"cuda_state"` (running, locked,
checkpointed, failed; absent = running) and `"host_mib"` (GPU memory copied to host memory).

Sources, cited below by their letter:

[API]  CUDA Driver API reference, 6.x "CUDA Checkpointing" (group__CUDA__CHECKPOINT), the
       Returns and Description of each cuCheckpointProcess* call;
       https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__CHECKPOINT.html
[ENUM] CUprocessState: RUNNING 0 "default process state", LOCKED 1 "CUDA API locks are taken
       so further CUDA API calls will block", CHECKPOINTED 2 "application memory contents have
       been checkpointed and underlying allocations and device handles have been released",
       FAILED 3 "application entered an uncorrectable error during the checkpoint/restore
       process" (cuda.bindings.driver.CUprocessState).
[README] NVIDIA/cuda-checkpoint README ("570 Features", "The Utility", "Functionality").
[#n]   NVIDIA/cuda-checkpoint issue n.
[GPU]  Measured on a real driver: 580.159.04 (CUDA 13.0), one H200, cuda-bindings 13 through
       fracspawner's CheckpointDriver, by tests/gpu/test_real_checkpoint_driver.py (`make
       test-gpu`; docs/serverext.md has the figures). What it measured replaced the
       assumptions that stood here; what it could not provoke stays marked "assumption".

What each call does, and the line it models:

- Every call returns a tuple whose first item is a `CUresult` (cuda-python's convention:
  `err, state = cuCheckpointProcessGetState(pid)`). A libcuda without the entry point raises
  `RuntimeError('Function "cuCheckpointProcessLock" not found')` (cuda-python's lazy symbol
  lookup); the checkpoint entry points arrived with r570 / CUDA 12.8 ([README] "570 Features":
  "CUDA Driver interfaces at feature parity with the cuda-checkpoint utility").
  `"cuda_driver_version"` below 12080 models an older driver.
- A pid that is no process (it exited): every checkpoint call, GetState included, returns
  CUDA_ERROR_OPERATING_SYSTEM ([GPU]: GetState, Lock and Restore; not among GetState's
  documented returns, [API]).
- cuCheckpointProcessGetState ([API] Returns: SUCCESS, INVALID_VALUE, NOT_INITIALIZED,
  NOT_SUPPORTED): a live process that never used CUDA -> CUDA_ERROR_NOT_INITIALIZED ([GPU]);
  `"getstate_error": "CUDA_ERROR_..."` on a process forces any (tests). Before cuInit (this
  process's): NOT_INITIALIZED (documented return; cuInit's contract).
- cuCheckpointProcessLock: RUNNING -> LOCKED ([API]: "Process must be in the RUNNING state in
  order to lock. Upon successful return the process will be in the LOCKED state"); any other
  state: CUDA_ERROR_ILLEGAL_STATE (a documented return). "If timeoutMs is specified and the
  timeout is reached the process will be left in the RUNNING state upon return" ([API]): a
  process with `"lock_busy": n` (n > 0, counted down; `true` = always) has CUDA work that does
  not finish: the call waits min(timeoutMs, 200) ms and returns CUDA_ERROR_NOT_READY, left
  RUNNING. NOT_READY is the one "not yet" code among Lock's documented returns (SUCCESS,
  INVALID_VALUE, NOT_INITIALIZED, ILLEGAL_STATE, NOT_SUPPORTED, NOT_READY), and a reached
  timeout returns it, after the timeout, the process RUNNING ([GPU]: Lock(500 ms) during a 6 s
  kernel). Every call from another state than its own returns ILLEGAL_STATE ([GPU]: Lock on
  LOCKED or CHECKPOINTED, Checkpoint on RUNNING or CHECKPOINTED, Restore on RUNNING or
  LOCKED, Unlock on RUNNING or CHECKPOINTED).
  Lock waits for submitted work ([README]: "already-submitted CUDA work ... are completed").
- cuCheckpointProcessCheckpoint: LOCKED -> CHECKPOINTED; "The GPU memory contents will be
  brought into host memory and all underlying references will be released" ([API]), so NVML no
  longer lists the process ([README]'s nvidia-smi example). Refusals:
  - UVM or IPC memory ([README] "Functionality": "does not support UVM or IPC memory"):
    `"refuse": "uvm"|"ipc"` -> CUDA_ERROR_NOT_SUPPORTED;
  - a MIG instance ([#42] "Fails with 'out of memory' on MIG-enabled GPUs", the maintainer:
    "MIG isn't supported right now") -> CUDA_ERROR_OUT_OF_MEMORY;
  - a container that sees a subset of the node's GPUs (`"node_gpus"` at the top level larger
    than the GPUs in the state) on a driver before 575.57.08 ([#24]: "CHECKPOINT_DEVICES failed
    ... operation not permitted" with partial device passthrough, a comment: fixed in
    575.57.08's release notes; [#12]: the restore fails the same way) ->
    CUDA_ERROR_NOT_PERMITTED;
  the process is then left LOCKED ([GPU]: 64 MiB of cudaMallocManaged beside a plain
  allocation -> NOT_SUPPORTED, LOCKED, and it runs on with its data after the unlock), or
  FAILED with `"refuse_leaves": "failed"` ([README]: it "does not attempt to keep the process
  in a good state if an error ... is encountered during checkpoint or restore"; no refusal
  measured left it FAILED: assumption, kept for the other refusals).
- cuCheckpointProcessRestore: CHECKPOINTED -> LOCKED ([API]: "Process must be in the
  CHECKPOINTED state to restore"; the state after it is LOCKED, as the README's resume
  sequence ends "CUDA driver APIs are unlocked" only at the unlock). "The GPU to restore onto
  needs to have enough memory" ([API]): when the GPU's free memory (memory_total_mib minus what
  its listed processes hold) is below what the process had, -> CUDA_ERROR_OUT_OF_MEMORY and
  the process stays CHECKPOINTED ([#44]; [GPU]: a process NVML listed at 1,546 MiB was
  restored with 63 MiB more than that free, and refused with 1 MiB less).
  `"restore_failures": n` fails the next n restores the same way (a co-tenant filled the GPU
  meanwhile, without timing a second process).
  After such a refusal the process is lost for good, as [#44] reports on driver 580.95.05 /
  CUDA 13.0 (NVIDIA/cuda-checkpoint#44, "Restore permanently fails after initial OOM - process
  stuck in CHECKPOINTED state": "all subsequent restore attempts fail with
  CUDA_ERROR_OPERATING_SYSTEM (304) - even after freeing GPU memory ... unlock returns
  CUDA_ERROR_ILLEGAL_STATE (401). The only option is to kill the process"): every later
  restore returns CUDA_ERROR_OPERATING_SYSTEM, room or not, GetState still answers
  CHECKPOINTED, unlock CUDA_ERROR_ILLEGAL_STATE (it is not LOCKED), and the process's own CUDA
  calls block for ever. The issue is open and names no fixed driver: modelled on every
  driver version ([GPU]: the same on 580.159.04, after the memory that was missing was free
  again). `"restore_transient": n` fails the next n restores with
  CUDA_ERROR_NOT_READY, the process staying CHECKPOINTED and restorable (assumption: a
  stand-in for a failure that passes; the docs name none). `"restore_leaves": "failed"` makes
  the next restore fail and leave the process FAILED ([README] "Functionality", as above).
  Each restore called is counted in the process's `"restore_calls"` (tests).
  `"restore_blocks_s": n` makes the next restore return only after n seconds
  (NVIDIA/cuda-checkpoint#17, "cuda-checkpoint toggle program does not respond when restoring":
  "the execution of the command was blocked and it never returned"; open, no cause named; n
  seconds stand in for ever), other calls answering meanwhile (assumption).
- cuCheckpointProcessUnlock: LOCKED -> RUNNING ([API]: "Process must be in the LOCKED state.
  Upon successful return the process will be in the RUNNING state"); `"unlock_failures": n`
  fails the next n unlocks with CUDA_ERROR_NOT_SUPPORTED, the process staying LOCKED
  (assumption: a documented return, when it happens is not).
- FAILED is terminal: every call but GetState returns CUDA_ERROR_ILLEGAL_STATE ([ENUM]
  "uncorrectable"; [README] "does not attempt to keep the process in a good state").
- cuCheckpointProcessGetRestoreThreadId: a thread other than the process's main one ([API]:
  "Returns in *tid the thread ID of the CUDA restore thread"; [GPU]: not the pid). The fake
  answers pid + 1 (assumption: which other thread; nothing here uses it).
- The process's own CUDA calls: `fake_cuda_call()` (not a CUDA name: a test-only stand-in for
  any runtime or driver call the process itself makes, e.g. a cell touching a tensor) blocks
  while its state is LOCKED or CHECKPOINTED ([API] Lock: "which will block further CUDA API
  calls"; [README]: CPU threads may go on "calling runtime or driver APIs (which may block
  until CUDA is resumed)"; [GPU]: a CuPy sum blocked while LOCKED and answered after the
  unlock) and raises in FAILED (assumption: an uncorrectable error).
- Copy time: `"bandwidth_gib_s"` (top level; default 0 = instant) makes Checkpoint and Restore
  sleep memory / bandwidth seconds. [GPU] measured 1.4 to 1.9 GiB/s for a checkpoint and 3.4
  to 5.5 GiB/s for a restore (4 GiB and 84 GiB processes): one rate for both is a model.
"""

from __future__ import annotations

import enum
import fcntl
import json
import os
import time
from contextlib import contextmanager


class CUresult(enum.IntEnum):
    # values from cuda.h's enum cudaError_enum
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_OUT_OF_MEMORY = 2
    CUDA_ERROR_NOT_INITIALIZED = 3
    CUDA_ERROR_NO_DEVICE = 100
    CUDA_ERROR_OPERATING_SYSTEM = 304
    CUDA_ERROR_ILLEGAL_STATE = 401
    CUDA_ERROR_NOT_READY = 600
    CUDA_ERROR_NOT_PERMITTED = 800
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
PARTIAL_PASSTHROUGH_FIXED = (575, 57, 8)  # [#24]: fixed in 575.57.08's release notes


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


def _devices(data: dict):
    """(device, is_mig) for every GPU and MIG instance in the state."""
    for gpu in data.get("gpus", []):
        yield gpu, False
        for mig in gpu.get("mig") or []:
            yield mig, True


def _find(data: dict, pid: int) -> tuple[dict | None, dict | None, bool]:
    """(process, its device, on a MIG instance) for a CUDA process in the state."""
    for dev, is_mig in _devices(data):
        for p in dev.get("processes", []):
            if int(p["pid"]) == int(pid):
                return p, dev, is_mig
    return None, None, False


def _exists(data: dict, pid: int) -> bool:
    return bool(data.get("any_pid")) or os.path.exists(f"/proc/{int(pid)}")


def _copy_pause(data: dict, memory_mib: float) -> None:
    bandwidth = float(data.get("bandwidth_gib_s", 0) or 0)
    if bandwidth > 0:
        time.sleep(memory_mib / 1024 / bandwidth)


def _driver_tuple(data: dict) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in str(data.get("driver", "575.57.08")).split("."))
    except ValueError:
        return (0,)


def _countdown(p: dict, key: str) -> bool:
    """A per-process test switch: `true` always, n > 0 the next n times."""
    value = p.get(key)
    if value is True:
        return True
    if isinstance(value, int) and value > 0:
        p[key] = value - 1
        return True
    return False


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
        if not _exists(data, pid):
            return (CUresult.CUDA_ERROR_OPERATING_SYSTEM,)  # exited: [GPU]
        p, dev, is_mig = _find(data, pid)
        if p is None:
            return (CUresult.CUDA_ERROR_INVALID_VALUE,)  # no CUDA in it: assumption
        if p.get("cuda_state", "running") != start:
            return (CUresult.CUDA_ERROR_ILLEGAL_STATE,)  # FAILED included: terminal
        if act is not None:
            err = act(data, p, dev, is_mig)
            if err is not None:
                return (err,)
        p["cuda_state"] = end
        return (CUresult.CUDA_SUCCESS,)


def cuCheckpointProcessGetState(pid: int) -> tuple:  # noqa: N802
    _require("cuCheckpointProcessGetState")
    if not _initialised:
        return CUresult.CUDA_ERROR_NOT_INITIALIZED, None
    data = _peek()
    if not _exists(data, pid):
        return CUresult.CUDA_ERROR_OPERATING_SYSTEM, None  # exited: [GPU]
    p, _dev, _mig = _find(data, pid)
    if p is None:
        return CUresult.CUDA_ERROR_NOT_INITIALIZED, None  # no CUDA in it: [GPU]
    if p.get("getstate_error"):
        return CUresult[p["getstate_error"]], None
    return CUresult.CUDA_SUCCESS, _STATES[p.get("cuda_state", "running")]


def cuCheckpointProcessGetRestoreThreadId(pid: int) -> tuple:  # noqa: N802
    _require("cuCheckpointProcessGetRestoreThreadId")
    if not _initialised:
        return CUresult.CUDA_ERROR_NOT_INITIALIZED, None
    data = _peek()
    if not _exists(data, pid):
        return CUresult.CUDA_ERROR_OPERATING_SYSTEM, None
    p, _dev, _mig = _find(data, pid)
    if p is None:
        return CUresult.CUDA_ERROR_INVALID_VALUE, None
    return CUresult.CUDA_SUCCESS, int(pid) + 1  # not the main thread: [GPU]


def cuCheckpointProcessLock(pid: int, args: _Args | None) -> tuple:  # noqa: N802
    def act(data, p, dev, is_mig):
        if _countdown(p, "lock_busy"):
            wait_ms = args.timeoutMs if args is not None and args.timeoutMs else 200
            time.sleep(min(wait_ms, 200) / 1000)
            return CUresult.CUDA_ERROR_NOT_READY  # left RUNNING
        return None

    return _transition("cuCheckpointProcessLock", pid, "running", "locked", act)


def cuCheckpointProcessCheckpoint(pid: int, args: _Args | None) -> tuple:  # noqa: N802
    def act(data, p, dev, is_mig):
        err = None
        if p.get("refuse"):
            err = CUresult.CUDA_ERROR_NOT_SUPPORTED  # UVM / IPC memory
        elif is_mig:
            err = CUresult.CUDA_ERROR_OUT_OF_MEMORY  # #42
        elif (
            int(data.get("node_gpus", 0)) > len(data.get("gpus", []))
            and _driver_tuple(data) < PARTIAL_PASSTHROUGH_FIXED
        ):
            err = CUresult.CUDA_ERROR_NOT_PERMITTED  # #12, #24
        if err is not None:
            p["cuda_state"] = "failed" if p.get("refuse_leaves") == "failed" else "locked"
            return err
        _copy_pause(data, p.get("memory_mib", 0))
        p["host_mib"], p["memory_mib"] = p.get("memory_mib", 0), 0
        return None

    return _transition("cuCheckpointProcessCheckpoint", pid, "locked", "checkpointed", act)


def cuCheckpointProcessRestore(pid: int, args: _Args | None) -> tuple:  # noqa: N802
    # `"restore_blocks_s"` (#17, the module's docstring): slept outside the state lock, so
    # other calls answer meanwhile; then the restore goes on as below
    blocks = 0.0
    with _state() as data:
        p, _dev, _mig = _find(data, pid)
        if p is not None:
            blocks = float(p.pop("restore_blocks_s", 0) or 0)
    if blocks > 0:
        time.sleep(blocks)

    def act(data, p, dev, is_mig):
        p["restore_calls"] = int(p.get("restore_calls", 0)) + 1
        if p.get("restore_leaves") == "failed":
            p.pop("restore_leaves")
            p["cuda_state"] = "failed"
            return CUresult.CUDA_ERROR_NOT_SUPPORTED
        if p.get("restore_oom"):  # #44: lost since an earlier restore ran out of memory
            return CUresult.CUDA_ERROR_OPERATING_SYSTEM
        if _countdown(p, "restore_transient"):
            return CUresult.CUDA_ERROR_NOT_READY  # stays CHECKPOINTED, restorable: assumption
        held = sum(q.get("memory_mib", 0) for q in dev.get("processes", []))
        free = float(dev.get("memory_total_mib", 81559)) - held
        if _countdown(p, "restore_failures") or free < float(p.get("host_mib", 0)):
            p["restore_oom"] = True  # stays CHECKPOINTED, and lost (#44)
            return CUresult.CUDA_ERROR_OUT_OF_MEMORY
        _copy_pause(data, p.get("host_mib", 0))
        p["memory_mib"], p["host_mib"] = p.get("host_mib", 0), 0
        return None

    return _transition("cuCheckpointProcessRestore", pid, "checkpointed", "locked", act)


def cuCheckpointProcessUnlock(pid: int, args: _Args | None) -> tuple:  # noqa: N802
    def act(data, p, dev, is_mig):
        if _countdown(p, "unlock_failures"):
            return CUresult.CUDA_ERROR_NOT_SUPPORTED  # stays LOCKED: assumption
        return None

    return _transition("cuCheckpointProcessUnlock", pid, "locked", "running", act)


# --- the process's own side (test-only, not a CUDA name) ------------------------------------
def fake_cuda_call(pid: int | None = None, poll_s: float = 0.02, timeout_s: float = 300.0) -> str:
    """Stand in for a CUDA call made by process `pid` (default: this one): blocks while its
    state is LOCKED or CHECKPOINTED, raises in FAILED, returns "running" (see the module
    docstring). `timeout_s` only keeps a broken test from hanging for ever."""
    pid = os.getpid() if pid is None else pid
    deadline = time.monotonic() + timeout_s
    while True:
        p, _dev, _mig = _find(_peek(), pid)
        state = "running" if p is None else p.get("cuda_state", "running")
        if state == "running":
            return state
        if state == "failed":
            raise RuntimeError("CUDA error: the process's CUDA state is FAILED")
        if time.monotonic() > deadline:
            raise TimeoutError(f"CUDA call blocked for {timeout_s:g} s (state {state})")
        time.sleep(poll_s)
