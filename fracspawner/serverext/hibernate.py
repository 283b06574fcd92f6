"""GPU hibernation: an idle GPU kernel's CUDA state is suspended to host memory and resumed the
moment it is needed (its next message, or Resume in the JupyterLab meter).

The first rung of the idle ladder (catalog `idle.kernel_gpu_hibernate`, in the environment as
`FRACSPAWNER_KERNEL_GPU_HIBERNATE_SECONDS`): the monitor (monitor.py) asks for it when a kernel
holding GPU memory has been idle (GPU, messages, user) that long; `kernel_gpu_idle` and the
server cull stay as they are. Safe in every failure:

- no host-memory headroom for the copy (the pod's cgroup limit minus its usage): not suspended,
  and the report says why;
- a kernel the API cannot suspend (no API, driver too old, UVM or IPC memory, GPU memory held
  by several processes) is left running and reported "cannot hibernate: <reason>", never
  ended for it;
- a restore that fails keeps the kernel locked, not lost: retried with backoff, the user is told
  (meter and notebook) and may restart the kernel;
- a suspended kernel is never GPU-busy nor activity (the monitor reads it as idle), and nothing
  here touches the server's activity.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from traitlets import Bool, Float, Integer, Unicode
from traitlets.config import LoggingConfigurable

from .checkpoint import CheckpointDriver, CheckpointError, Unsupported, host_headroom
from .podinfo import gib, isoformat, utcnow

SUSPENDED = frozenset({"hibernating", "hibernated", "resuming", "restore_failed"})
HISTORY = 50  # recent hibernations and resumes kept for the report (the culler counts them)


class _Busy(Exception):
    """The lock timed out: the process had CUDA work that did not finish (left RUNNING)."""


class _Refused(Exception):
    def __init__(self, code: str, left: str):
        super().__init__(code)
        self.code, self.left = code, left


@dataclass
class KernelSleep:
    """One kernel's hibernation state (`state`: running | hibernating | hibernated | resuming
    | restore_failed)."""

    kernel_id: str
    state: str = "running"
    pid: int | None = None
    memory_mib: float = 0.0  # GPU memory held in host memory while hibernated
    since: datetime | None = None
    note: str | None = None  # why it was not suspended last time (may change: headroom, busy)
    cannot: str | None = None  # why it can never be suspended: not tried again
    restore_error: str | None = None
    attempts: int = 0
    next_retry: datetime | None = None
    last_resume_seconds: float | None = None
    last_resumed_at: datetime | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    task: asyncio.Task | None = None

    def as_json(self) -> dict:
        return {
            "state": "cannot_hibernate" if self.cannot else self.state,
            "reason": self.cannot or self.note,
            "hibernated_gpu_memory_mib": round(self.memory_mib, 1)
            if self.state in SUSPENDED
            else 0.0,
            "hibernated_since": isoformat(self.since) if self.state in SUSPENDED else None,
            "restore_error": self.restore_error,
            "restore_attempts": self.attempts,
            "next_retry": isoformat(self.next_retry),
            "last_resume_seconds": self.last_resume_seconds,
            "last_resumed_at": isoformat(self.last_resumed_at),
        }


class Hibernator(LoggingConfigurable):
    """Suspends and resumes kernels through the CUDA driver's checkpoint API."""

    enabled = Bool(
        True,
        config=True,
        help="Suspend idle GPU kernels' CUDA state to host memory after kernel_gpu_hibernate "
        "($FRACSPAWNER_KERNEL_GPU_HIBERNATE_SECONDS, set by FracSpawner from the catalog); they "
        "resume on their next message. Nothing is suspended without that policy.",
    )
    lock_timeout_ms = Integer(
        5000,
        config=True,
        help="Milliseconds cuCheckpointProcessLock may wait for the kernel's submitted CUDA work; "
        "past it the kernel is left running and tried again at its next idle period.",
    )
    host_margin_mib = Float(
        512.0,
        config=True,
        help="Host memory (MiB) left free beyond the copied GPU memory: a kernel is suspended only "
        "where the pod's memory limit minus its usage covers both.",
    )
    cgroup_root = Unicode(
        "/sys/fs/cgroup",
        config=True,
        help="Where the container's cgroup memory files are (v2 memory.max/memory.current, v1 "
        "memory/memory.limit_in_bytes and memory.usage_in_bytes).",
    )
    meminfo_path = Unicode(
        "/proc/meminfo",
        config=True,
        help="The node's memory (MemAvailable caps the cgroup's headroom; all there is without a "
        "limit).",
    )
    retry_first = Float(
        5.0, config=True, help="Seconds before the first retry of a failed restore."
    )
    retry_max = Float(300.0, config=True, help="Longest wait (seconds) between restore retries.")

    def __init__(self, driver: Any = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.driver = driver if driver is not None else CheckpointDriver()
        self.kernels: dict[str, KernelSleep] = {}
        self.unsupported: str | None = None  # set once: the API is not there
        self._checked = False
        self.last_message: dict[str, datetime] = {}  # kernel id -> last message sent to it
        self.hibernations: list[dict] = []
        self.resumes: list[dict] = []
        # called (kernel id, text) when a restore fails: connections tell the notebook
        self.on_restore_failed: list[Callable[[str, str], None]] = []

    # --- queries ------------------------------------------------------------------------------
    def suspended(self, kernel_id: str) -> bool:
        s = self.kernels.get(kernel_id)
        return s is not None and s.state in SUSPENDED

    def memory_of(self, kernel_id: str) -> float:
        s = self.kernels.get(kernel_id)
        return s.memory_mib if s is not None and s.state in SUSPENDED else 0.0

    def total_mib(self) -> float:
        return round(sum(self.memory_of(k) for k in self.kernels), 1)

    def kernel_json(self, kernel_id: str) -> dict:
        s = self.kernels.get(kernel_id)
        if s is None:
            s = KernelSleep(
                kernel_id, cannot=self.unsupported and f"cannot hibernate: {self.unsupported}"
            )
        return s.as_json()

    def available(self) -> str | None:
        """None where the checkpoint API is usable, else why not (checked once)."""
        if not self._checked:
            self._checked = True
            try:
                self.driver.check()
            except Unsupported as exc:
                self.unsupported = str(exc)
            except Exception as exc:  # a broken binding: same as none
                self.unsupported = f"the checkpoint API failed to start: {exc}"
        return self.unsupported

    def summary(self, limit: float | None) -> dict:
        headroom = host_headroom(self.cgroup_root, self.meminfo_path)
        return {
            "enabled": self.enabled and limit is not None,
            "after_seconds": limit,
            "available": self.unsupported is None if self._checked else None,
            "reason": self.unsupported,
            "host_memory_free_mib": None
            if headroom.free_mib is None
            else round(headroom.free_mib, 1),
            "host_memory_where": headroom.where,
            "hibernated_gpu_memory_mib": self.total_mib(),
            "hibernations": list(self.hibernations),
            "resumes": list(self.resumes),
        }

    def disable(self, reason: str) -> None:
        self.enabled, self.unsupported, self._checked = False, reason, True

    def note_message(self, kernel_id: str) -> None:
        self.last_message[kernel_id] = utcnow()

    def forget(self, kernel_id: str) -> None:
        s = self.kernels.pop(kernel_id, None)
        if s is not None and s.task is not None and not s.task.done():
            s.task.cancel()
        self.last_message.pop(kernel_id, None)

    # --- suspend ------------------------------------------------------------------------------
    async def hibernate(self, kernel_id: str, pids: list[int], memory_mib: float) -> str:
        """Suspend the kernel's CUDA process; returns its state afterwards (see KernelSleep)."""
        s = self.kernels.setdefault(kernel_id, KernelSleep(kernel_id))
        if s.state != "running" or s.cannot or s.lock.locked():
            return s.state
        reason = await asyncio.to_thread(self.available)
        if reason is not None:
            s.cannot = f"cannot hibernate: {reason}"
            return s.state
        if len(pids) != 1:
            s.cannot = (
                "cannot hibernate: its GPU process is not known"
                if not pids
                else f"cannot hibernate: {len(pids)} processes hold its GPU memory (a worker or "
                "subprocess); the checkpoint API suspends one process"
            )
            return s.state
        headroom = host_headroom(self.cgroup_root, self.meminfo_path)
        need = memory_mib + self.host_margin_mib
        if headroom.free_mib is None or headroom.free_mib < need:
            free = "an unknown amount" if headroom.free_mib is None else gib(headroom.free_mib)
            s.note = (
                f"not hibernated: it needs {gib(need)} of host memory and {free} is free under "
                f"{headroom.where}"
            )
            return s.state
        async with s.lock:
            s.state, s.pid, s.note = "hibernating", pids[0], None
            started = time.monotonic()
            try:
                await asyncio.to_thread(self._suspend, pids[0])
            except _Busy:
                s.state = "running"
                s.note = (
                    f"not hibernated: its CUDA work did not pause within "
                    f"{self.lock_timeout_ms / 1000:g} s; tried again at its next idle period"
                )
                return s.state
            except _Refused as exc:
                s.state = "running"  # never ended for it: left as the driver left it
                s.cannot = f"cannot hibernate: the driver refused ({exc.code})" + (
                    ""
                    if exc.left == "running"
                    else f"; the driver left its CUDA state {exc.left}: restart the kernel to use "
                    "the GPU again"
                )
                self.log.warning("fracspawner: kernel %s %s", kernel_id, s.cannot)
                return s.state
            except Unsupported as exc:
                self.unsupported = str(exc)
                s.state, s.cannot = "running", f"cannot hibernate: {exc}"
                return s.state
            seconds = round(time.monotonic() - started, 3)
            s.state, s.memory_mib, s.since = "hibernated", memory_mib, utcnow()
            s.restore_error, s.attempts, s.next_retry = None, 0, None
            self.hibernations = [
                *self.hibernations[-(HISTORY - 1) :],
                {"kernel_id": kernel_id, "at": isoformat(s.since),
                 "gpu_memory_mib": round(memory_mib, 1), "seconds": seconds},
            ]  # fmt: skip
            self.log.info(
                "fracspawner: kernel %s hibernated: %s of GPU memory moved to host memory (%.1f s)",
                kernel_id,
                gib(memory_mib),
                seconds,
            )
            return s.state

    def _suspend(self, pid: int) -> None:
        """Lock, then checkpoint; on a refusal put the process back as far as the driver lets."""
        drv = self.driver
        state = drv.state(pid)
        if state != "running":
            raise _Refused(f"the process is {state}", state)
        try:
            drv.lock(pid, self.lock_timeout_ms)
        except CheckpointError as exc:
            if exc.code == "CUDA_ERROR_TIMEOUT":
                raise _Busy() from exc  # documented: left RUNNING
            raise _Refused(exc.code, self._state_or_unknown(pid)) from exc
        try:
            drv.checkpoint(pid)
        except CheckpointError as exc:
            left = self._state_or_unknown(pid)
            if left == "locked":
                drv.unlock(pid)
                left = "running"
            raise _Refused(exc.code, left) from exc

    def _state_or_unknown(self, pid: int) -> str:
        try:
            return self.driver.state(pid)
        except (CheckpointError, Unsupported):
            return "unknown"

    # --- resume -------------------------------------------------------------------------------
    def resume(self, kernel_id: str, why: str) -> asyncio.Task | None:
        """Start (or join) bringing the kernel back; None when it is running already."""
        s = self.kernels.get(kernel_id)
        if s is None or (s.state not in SUSPENDED and not s.lock.locked()):
            return None
        if s.task is None or s.task.done():
            s.task = asyncio.get_running_loop().create_task(self._resume(s, why))
        return s.task

    async def _resume(self, s: KernelSleep, why: str) -> bool:
        async with s.lock:  # after a suspend in progress
            delay = self.retry_first
            while s.state in ("hibernated", "restore_failed", "resuming"):
                previous, s.state = s.state, "resuming"
                started = time.monotonic()
                try:
                    assert s.pid is not None
                    await asyncio.to_thread(self._restore, s.pid)
                except (CheckpointError, Unsupported, _Refused) as exc:
                    if s.pid is not None and not os.path.exists(f"/proc/{s.pid}"):
                        # the process is gone (the kernel was restarted or died): nothing to
                        # bring back, and its messages go to the kernel there is now
                        self.log.info(
                            "fracspawner: kernel %s restarted while hibernated", s.kernel_id
                        )
                        s.state, s.memory_mib, s.restore_error = "running", 0.0, None
                        return True
                    s.state, s.attempts = "restore_failed", s.attempts + 1
                    s.restore_error = str(exc)
                    s.next_retry = utcnow() + timedelta(seconds=delay)
                    text = (
                        f"fracspawner: this kernel's GPU state could not be restored yet ({exc}); "
                        f"trying again in {delay:.0f} s. Nothing is lost: the kernel and its data "
                        "are kept. Your cell runs once the GPU state is back; or restart the "
                        "kernel to start over."
                    )
                    if previous != "restore_failed" or s.attempts % 5 == 1:
                        self.log.warning("fracspawner: kernel %s: %s", s.kernel_id, exc)
                    for notify in list(self.on_restore_failed):
                        try:
                            notify(s.kernel_id, text)
                        except Exception:  # a closed websocket must not stop the retries
                            self.log.debug(
                                "fracspawner: restore notice not delivered", exc_info=True
                            )
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, self.retry_max)
                    if self.kernels.get(s.kernel_id) is not s:  # shut down meanwhile
                        return False
                    continue
                seconds = round(time.monotonic() - started, 3)
                s.state, s.last_resume_seconds, s.last_resumed_at = "running", seconds, utcnow()
                s.restore_error, s.next_retry, s.attempts = None, None, 0
                self.resumes = [
                    *self.resumes[-(HISTORY - 1) :],
                    {"kernel_id": s.kernel_id, "at": isoformat(s.last_resumed_at),
                     "seconds": seconds, "gpu_memory_mib": round(s.memory_mib, 1), "why": why},
                ]  # fmt: skip
                s.memory_mib = 0.0
                self.log.info(
                    "fracspawner: kernel %s resumed (%s) in %.1f s", s.kernel_id, why, seconds
                )
            return s.state == "running"

    def _restore(self, pid: int) -> None:
        drv = self.driver
        state = drv.state(pid)
        if state == "checkpointed":
            drv.restore(pid)
            state = drv.state(pid)
        if state == "locked":
            drv.unlock(pid)
            return
        if state != "running":
            raise _Refused(f"the process is {state}", state)
