"""The CUDA driver's checkpoint API for another process of the same user, and the pod's
host-memory headroom: the two things the hibernator (hibernate.py) asks of the machine.

`CheckpointDriver` wraps cuda-python's `cuda.bindings.driver` (imported on first use: it is not
a dependency of the [notebook] extra, an image that wants hibernation installs `cuda-python`)
with the four documented calls, CUDA Driver API group CUDA_CHECKPOINT (driver r570 / CUDA 12.8):
cuCheckpointProcessLock (RUNNING -> LOCKED; with a timeout it is left RUNNING when the timeout
is reached), cuCheckpointProcessCheckpoint (LOCKED -> CHECKPOINTED: GPU memory copied to host
memory, device handles released), cuCheckpointProcessRestore (CHECKPOINTED -> LOCKED) and
cuCheckpointProcessUnlock (LOCKED -> RUNNING); cuCheckpointProcessGetState says where a process
is. Every failure raises `CheckpointError` (a call refused, with the driver's error name) or
`Unsupported` (no API here at all, with the reason in plain words). cuCheckpointProcessGetState
may fail too (documented: INVALID_VALUE, NOT_INITIALIZED, NOT_SUPPORTED, e.g. for a pid that
exited): callers must expect it on every call, the first included.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .checkpoint_env import MIN_CUDA_VERSION

MIB = 1024 * 1024
# CUDA_ERROR_NOT_READY is the documented "not yet" return of cuCheckpointProcessLock (CUDA Driver
# API, Checkpointing: Lock returns ... CUDA_ERROR_NOT_READY); with a timeout "the process will be
# left in the RUNNING state". TIMEOUT is kept for drivers that answer a reached timeout with it.
BUSY_CODES = frozenset({"CUDA_ERROR_NOT_READY", "CUDA_ERROR_TIMEOUT"})
STATES = {
    0: "running",
    1: "locked",
    2: "checkpointed",
    3: "failed",
    4: "checkpointing",
    5: "restoring",
}


class Unsupported(Exception):
    """The checkpoint API cannot be used here at all; the message says why."""


class CheckpointError(Exception):
    """One checkpoint call was refused; `code` is the driver's error name."""

    def __init__(self, call: str, code: str):
        super().__init__(f"{call}: {code}")
        self.call, self.code = call, code


class CheckpointDriver:
    """The checkpoint calls by pid. Blocking: call it from a thread, not the event loop."""

    def __init__(self, module: Any = None, bindings_version: str | None = None):
        self._mod = module
        # cuda-python's version: read from the installed package unless a module is given
        self._bindings_version = bindings_version
        self._ready = False

    def _driver(self) -> Any:
        if self._ready:
            return self._mod
        if self._mod is None:
            try:
                from cuda.bindings import driver  # cuda-python >= 12.8
            except ImportError as exc:
                raise Unsupported(
                    "cuda-python is not installed in the notebook image (pip install cuda-python)"
                ) from exc
            self._mod = driver
            if self._bindings_version is None:
                self._bindings_version = _installed_version()
        drv = self._mod
        # cuDriverGetVersion may be called before cuInit (CUDA Driver API, Version Management)
        err, version = drv.cuDriverGetVersion()
        cuda = f"CUDA {int(version) // 1000}.{int(version) % 1000 // 10}"
        if int(err) != 0 or int(version) < MIN_CUDA_VERSION:
            raise Unsupported(
                f"the GPU driver ({cuda}) has no checkpoint API: it needs driver 570 or newer "
                "(CUDA 12.8)"
            )
        major = _major(self._bindings_version)
        if major is not None and major * 1000 > int(version):  # 13.x bindings on a 12.x driver
            raise Unsupported(
                f"cuda-python {self._bindings_version} needs a CUDA {major} driver and this one "
                f"is {cuda}: install cuda-python<{int(version) // 1000 + 1} "
                "(fracspawner[hibernate] pins the 12.x line)"
            )
        (err,) = drv.cuInit(0)
        if int(err) != 0:
            raise Unsupported(f"the CUDA driver could not start ({_name(err)})")
        if not hasattr(drv, "cuCheckpointProcessLock"):
            raise Unsupported("this cuda-python has no checkpoint API: it needs cuda-python 12.8")
        self._ready = True
        return drv

    def check(self) -> None:
        """Raise Unsupported when the API cannot be used here."""
        self._driver()

    def _call(self, name: str, *args: Any) -> tuple:
        drv = self._driver()
        try:
            result = getattr(drv, name)(*args)
        except RuntimeError as exc:  # cuda-python: 'Function "cu..." not found' in libcuda
            raise Unsupported(f"the GPU driver lacks {name}: {exc}") from exc
        if int(result[0]) != 0:
            raise CheckpointError(name, _name(result[0]))
        return result

    def cuda_version(self) -> int:
        """cuDriverGetVersion: 12080 for r570 (CUDA 12.8), 12090 for r575, 13000 for r580."""
        _err, version = self._call("cuDriverGetVersion")
        return int(version)

    def state(self, pid: int) -> str:
        _err, state = self._call("cuCheckpointProcessGetState", pid)
        return STATES.get(int(state), f"state {int(state)}")

    def lock(self, pid: int, timeout_ms: int) -> None:
        args = self._driver().CUcheckpointLockArgs()
        args.timeoutMs = int(timeout_ms)
        self._call("cuCheckpointProcessLock", pid, args)

    def checkpoint(self, pid: int) -> None:
        self._call("cuCheckpointProcessCheckpoint", pid, None)

    def restore(self, pid: int) -> None:
        self._call("cuCheckpointProcessRestore", pid, None)

    def unlock(self, pid: int) -> None:
        self._call("cuCheckpointProcessUnlock", pid, None)


def _installed_version() -> str | None:
    from importlib import metadata

    for dist in ("cuda-bindings", "cuda-python"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def _major(version: str | None) -> int | None:
    try:
        return int(str(version).split(".")[0]) if version else None
    except ValueError:
        return None


def _name(err: Any) -> str:
    return getattr(err, "name", None) or f"CUresult {int(err)}"


# --- host memory -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Headroom:
    free_mib: float | None  # None: unknown (no cgroup files, no /proc/meminfo)
    where: str  # what the number is: "the pod's memory limit" | "the node's memory"
    limit_mib: float | None = None  # the cgroup's limit; math.inf: none; None: unknown


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _meminfo_available(meminfo: Path) -> float | None:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024  # kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def host_headroom(
    root: str | os.PathLike[str] = "/sys/fs/cgroup", meminfo: str = "/proc/meminfo"
) -> Headroom:
    """Memory this container may still take: its cgroup limit minus its usage.

    cgroup v2: memory.max ("max" = no limit) and memory.current; v1: memory/memory.limit_in_bytes
    (a huge number = no limit) and memory/memory.usage_in_bytes. Without a limit, the node's
    MemAvailable is what there is."""
    base = Path(root)
    limit = usage = None
    unlimited = False
    if (base / "memory.max").exists():
        raw = (base / "memory.max").read_text().strip() if _readable(base / "memory.max") else ""
        unlimited = raw == "max"
        limit = None if unlimited else _read_int(base / "memory.max")
        usage = _read_int(base / "memory.current")
    elif (base / "memory" / "memory.limit_in_bytes").exists():
        limit = _read_int(base / "memory" / "memory.limit_in_bytes")
        if limit is not None and limit >= 2**60:  # v1's "no limit" (PAGE_COUNTER_MAX pages)
            limit, unlimited = None, True
        usage = _read_int(base / "memory" / "memory.usage_in_bytes")
    node = _meminfo_available(Path(meminfo))
    limit_mib = math.inf if unlimited else None if limit is None else limit / MIB
    if limit is not None and usage is not None:
        free = max(0.0, (limit - usage) / MIB)
        return Headroom(
            free if node is None else min(free, node), "the pod's memory limit", limit_mib
        )
    return Headroom(node, "the node's memory", limit_mib)


def _readable(path: Path) -> bool:
    try:
        path.read_text()
    except OSError:
        return False
    return True
