"""GPU hibernation: an idle GPU kernel's CUDA state is suspended to host memory and resumed the
moment it is needed (its next message, or Resume in the JupyterLab meter).

The first rung of the idle ladder (catalog `idle.kernel_gpu_hibernate`, in the environment as
`FRACSPAWNER_KERNEL_GPU_HIBERNATE_SECONDS`): the monitor (monitor.py) asks for it when a kernel
holding GPU memory has been idle (GPU, messages, user) that long; `kernel_gpu_idle` and the
server cull stay as they are; the culler may also ask for it under GPU pressure
(`GpuMonitor.hibernate_now`). Safe in every failure, on a driver that behaves as NVIDIA documents
(CUDA Driver API "Checkpointing"; NVIDIA/cuda-checkpoint's README and issues, cited in
tests/fake_nvml/cuda/bindings/driver.py):

- only the kernel's own process is suspended, and only while no process it started holds GPU
  memory (a subprocess, a background run, a DataLoader worker): suspended alone they would stall
  while the kernel looks idle, and no message would resume them. Such a kernel is tried again
  later, as are the other refusals that may pass: its CUDA work did not pause (Lock's
  CUDA_ERROR_NOT_READY), its process is working on the CPU (a thread), the driver does not know
  the process now (GetState's CUDA_ERROR_INVALID_VALUE, or any error once the pid has exited:
  CUDA_ERROR_OPERATING_SYSTEM on driver 580), no host-memory headroom for the copy;
- conditions that cannot work are stated, and nothing is tried: no API, a driver before
  575.57.08 in a container that sees only some GPUs (NVIDIA/cuda-checkpoint #12, #24), MIG (#42),
  NCCL peers (#30), UVM or IPC memory ("cannot hibernate: <reason>"); never ended for it;
- a kernel is never left "hibernating": whatever a call raises, the process is put back as far
  as the driver lets (unlocked after a refused checkpoint; if the unlock fails it is retried
  like a restore, since its CUDA calls block meanwhile);
- a restore is tried only where a reading that sees the whole physical GPU says there is room
  for it, with a margin (room.py: the culler's grant; NVML of the device where it is not
  virtualised): on current drivers a restore refused for want of room loses the kernel's GPU
  state for good (NVIDIA/cuda-checkpoint#44: after CUDA_ERROR_OUT_OF_MEMORY every later restore
  fails with CUDA_ERROR_OPERATING_SYSTEM). Until there is room the kernel waits, its state in
  host memory; past `wait_bound` the user is told how long, why, and that stopping one of their
  own kernels makes room. If the driver refuses anyway (a reading overtaken), the user is told
  at once; one more restore is tried when there is room, and its 304 is final: the kernel is
  marked lost ("failed", nothing retries it) and the user is told to restart it;
- a restore that fails otherwise keeps the kernel locked: retried with backoff, the user is
  told (meter and notebook) and may restart the kernel. A process the driver reports FAILED is
  terminal: no more retries, and the user is told its GPU data may be lost;
- clients that reach a hibernated kernel without this server's websocket (jupyter console on
  the connection file, a thread printing) show on its iopub channel, which the monitor watches
  while it is hibernated (foreign.py): any such message resumes it;
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

from traitlets import Bool, Float, Integer, Unicode, default
from traitlets.config import LoggingConfigurable

from .attribution import has_own_pid_namespace
from .checkpoint import BUSY_CODES, CheckpointDriver, CheckpointError, Unsupported, host_headroom
from .checkpoint_env import (
    cpu_seconds,
    driver_problem,
    mig_problem,
    nccl_peers,
    nvml_driver_version,
)
from .podinfo import gib, isoformat, utcnow
from .room import Room

SUSPENDED = frozenset({"hibernating", "hibernated", "resuming", "restore_failed"})
HISTORY = 50  # recent hibernations and resumes kept for the report (the culler counts them)


#: what the cell says while its kernel waits for room on a full GPU (over-commit: swap.py)
GPU_FULL = (
    "fracspawner: the GPU this notebook shares is full right now, so this kernel waits while "
    "another notebook's idle kernel is swapped out to host memory. Your cell runs as soon as "
    "there is room; until then the kernel's GPU state stays in host memory (it is never "
    "restored into a full GPU)."
)
#: what the cell says while its kernel waits behind people present at the GPU (the culler's
#: reason, e.g. "the GPU is in use by 4 people now; you are next": their kernels are never
#: swapped out, so no swap is promised)
GPU_IN_USE = (
    "fracspawner: {reason}. This kernel waits: your cell runs as soon as one of them leaves or "
    "their notebooks go idle; until then the kernel's GPU state stays in host memory (it is "
    "never restored into a full GPU)."
)
#: what the cell says when the driver refused a restore for want of room after all
AT_RISK = (
    "fracspawner: the CUDA driver refused to restore this kernel's GPU state: the GPU had no "
    "room for it ({code}). On current drivers that refusal can lose it for good "
    "(NVIDIA/cuda-checkpoint#44): one more restore is tried when there is room; if it fails "
    "too, restart the kernel."
)
#: what the cell says when a restore has not returned for Hibernator.restore_stall_seconds
STALLED = (
    "fracspawner: restoring this kernel's GPU state has not finished after {waited}: the CUDA "
    "driver's restore has not returned (it can block: NVIDIA/cuda-checkpoint#17). Your cell runs "
    "once it does; the kernel is kept meanwhile. To start over instead, restart the kernel (its "
    "variables are lost)."
)
#: the words of a kernel whose GPU state the driver lost (#44: 304 after an out-of-memory)
LOST = "the kernel's GPU state was lost: restart the kernel"


def _duration(seconds: float) -> str:
    """`42` -> '42 s', `150` -> '3 min'."""
    return f"{seconds:.0f} s" if seconds < 60 else f"{round(seconds / 60)} min"


def _code(exc: Exception) -> str | None:
    return exc.code if isinstance(exc, CheckpointError) else None


def _refusal_hint(exc: Exception) -> str:
    """What a refused checkpoint's code is known to mean where it misleads: on a MIG instance
    the checkpoint answers CUDA_ERROR_OUT_OF_MEMORY however much memory is free
    (NVIDIA/cuda-checkpoint#42, "Fails with 'out of memory' on MIG-enabled GPUs"; the
    maintainer: "MIG isn't supported right now"). A MIG instance named as NVML names it is
    refused before any call (checkpoint_env.mig_problem): this is for one that was not."""
    if (
        isinstance(exc, CheckpointError)
        and exc.call == "cuCheckpointProcessCheckpoint"
        and exc.code == "CUDA_ERROR_OUT_OF_MEMORY"
    ):
        return (
            "; the driver answers so on a MIG instance, which the checkpoint API does not "
            "support: NVIDIA/cuda-checkpoint #42"
        )
    return ""


def _exited(pid: int) -> bool:
    """The process is gone (this server and its kernels share a PID namespace)."""
    return not os.path.exists(f"/proc/{pid}")


def _gpu_full(exc: Exception) -> bool:
    """A restore refused for want of room on the GPU (cuCheckpointProcessRestore's
    CUDA_ERROR_OUT_OF_MEMORY)."""
    return _code(exc) == "CUDA_ERROR_OUT_OF_MEMORY"


class _Later(Exception):
    """Not suspended this time, for a reason that may pass: tried again after
    `retry_refused_after` (its CUDA work did not pause, the driver does not know the process
    now)."""


class _Cannot(Exception):
    """The driver refused this process for good (its memory kind, a state it cannot leave)."""


@dataclass
class KernelSleep:
    """One kernel's hibernation state (`state`: running | hibernating | hibernated | resuming
    | restore_failed | failed). `failed` is terminal: the driver reports the process FAILED
    ("an uncorrectable error during the checkpoint/restore process"); nothing is retried until
    the kernel is restarted."""

    kernel_id: str
    state: str = "running"
    pid: int | None = None
    memory_mib: float = 0.0  # GPU memory in host memory while hibernated, or being copied there
    since: datetime | None = None
    note: str | None = None  # why it was not suspended last time (may pass: tried again)
    cannot: str | None = None  # why this process can never be suspended (a new process may)
    restore_error: str | None = None
    attempts: int = 0
    next_retry: datetime | None = None
    next_try: datetime | None = None  # no new suspension attempt before this
    last_resume_seconds: float | None = None
    last_resumed_at: datetime | None = None
    restored_mib: float = 0.0  # what its last resume brought back to the GPU (swap.py room)
    why: str | None = None  # what asked for the last hibernation ("idle", the culler's reason)
    # its resume waits for room on the GPU (room.py; over-commit: while an idle kernel is
    # swapped out, serverext/swap.py), since when and why; what wakes it early
    gpu_full: bool = False
    waiting_since: datetime | None = None
    wait_why: str | None = None
    told_waiting: bool = False
    escalated: bool = False
    # the culler's grant of room on the GPU for this kernel (swap.py), in force until
    grant_mib: float | None = None
    grant_until: datetime | None = None
    # the driver refused a restore for want of room: on #44 drivers the next one answers 304
    at_risk: bool = False
    # a restore called then has not returned for restore_stall_seconds (#17); None: none
    restore_stalled_since: datetime | None = None
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    task: asyncio.Task | None = None
    unwatch: Callable[[], None] | None = None

    def as_json(self) -> dict:
        return {
            "state": "cannot_hibernate" if self.cannot and self.state == "running" else self.state,
            "reason": self.restore_error if self.state == "failed" else self.cannot or self.note,
            "hibernated_gpu_memory_mib": round(self.host_mib(), 1),
            "hibernated_since": isoformat(self.since) if self.state in SUSPENDED else None,
            "hibernated_why": self.why if self.state in SUSPENDED else None,
            "restore_error": self.restore_error,
            "restore_stalled_since": isoformat(self.restore_stalled_since),
            "restore_attempts": self.attempts,
            "next_retry": isoformat(self.next_retry),
            "next_try": isoformat(self.next_try) if self.note else None,
            "last_resume_seconds": self.last_resume_seconds,
            "last_resumed_at": isoformat(self.last_resumed_at),
            "waiting_for_gpu": self.gpu_full and self.state in SUSPENDED,
            "waiting_since": isoformat(self.waiting_since) if self.gpu_full else None,
            "waiting_why": self.wait_why if self.gpu_full else None,
            "gpu_state_at_risk": self.at_risk and self.state in SUSPENDED,
        }

    def host_mib(self) -> float:
        """GPU memory its GPU state takes in host memory: a copy under way counts from its
        start (the pod's memory fills as it goes, and the culler's host budget counts it)."""
        return self.memory_mib if self.state in SUSPENDED else 0.0

    def waiting(self) -> bool:
        """Its resume waits for room on the GPU."""
        return self.gpu_full and self.state in ("hibernated", "restore_failed", "resuming")


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
    restore_stall_seconds = Float(
        60.0,
        config=True,
        help="Seconds after which a restore that has not returned is reported: the cell is told "
        "(the driver's restore can block: NVIDIA/cuda-checkpoint#17), the report says since when "
        "(kernels[].hibernation.restore_stalled_since) and the log warns. Nothing can interrupt "
        "the driver's call: the kernel keeps waiting for it. 0: never reported.",
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
    room_poll = Float(
        2.0,
        config=True,
        help="Seconds between two looks at the room on the GPU while a resume waits for it "
        "(a grant from the culler or room in a reading wakes it at once).",
    )
    wait_bound = Float(
        120.0,
        config=True,
        help="Seconds a resume may wait for room on the GPU before the user is told how long, "
        "why, and that stopping one of their own kernels makes room (the culler asks idle "
        "kernels out for it first).",
    )
    retry_refused_after = Float(
        60.0,
        config=True,
        help="Seconds before a kernel that was not suspended for a reason that may pass (its "
        "CUDA work did not pause, other processes it started hold GPU memory, its process was "
        "working, too little host memory) is tried again.",
    )
    cpu_probe_seconds = Float(
        1.0,
        config=True,
        help="Seconds the kernel's process is watched just before it is suspended: one that "
        "uses the CPU then (a thread or a background task working in it while no cell runs) is "
        "not suspended, since its next CUDA call would block until someone resumes it. 0: off.",
    )
    cpu_busy_percent = Float(
        10.0,
        config=True,
        help="CPU use (percent of one core) during the probe above which the kernel's process "
        "counts as working. An idle ipykernel uses well under 1 %.",
    )
    all_gpus_visible = Bool(
        False,
        config=True,
        help="Whether notebook containers see every GPU of their node (one-GPU nodes, whole-node "
        "pools). Drivers before 575.57.08 cannot checkpoint in a container that sees only some "
        "of the node's GPUs (NVIDIA/cuda-checkpoint #12, #24): there hibernation stays off "
        "unless this says the pods see them all.",
    )
    in_container = Bool(
        config=True,
        help="Whether the server runs in a container (a PID namespace of its own). Default: "
        "detected from /proc/self/ns/pid.",
    )

    @default("in_container")
    def _default_in_container(self) -> bool:
        return has_own_pid_namespace()

    def __init__(self, driver: Any = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.driver = driver if driver is not None else CheckpointDriver()
        self.simulated = False  # the demo's simulated driver (simcheckpoint.py): reports say so
        self.kernels: dict[str, KernelSleep] = {}
        # kernel id -> MiB its checkpoint under way copies to host memory: in the pod's usage
        # only as far as the copy has come (1.4-1.9 GiB/s measured on an H200, a minute for
        # 80 GiB), so the headroom check of another kernel counts it as taken
        self.copying: dict[str, float] = {}
        self.unsupported: str | None = None  # set once: the API is not there
        self._checked = False
        self.last_message: dict[str, datetime] = {}  # kernel id -> last message sent to it
        self.hibernations: list[dict] = []
        self.resumes: list[dict] = []
        # called (kernel id, text) when a restore fails: connections tell the notebook
        self.on_restore_failed: list[Callable[[str, str], None]] = []
        # MIG (the monitor sets it from each reading): no checkpointing on MIG instances
        self.device_indices: list[str] = []
        # an over-committed pool (swap.py): the culler swaps idle kernels out to make room, so
        # a restore refused for want of room waits for it, and the cell says so
        self.swap_managed = False
        # called with a kernel id once it is hibernated; returns what stops watching it (the
        # monitor watches the kernel's iopub for clients that bypass this server: foreign.py)
        self.watch: Callable[[str], Callable[[], None] | None] | None = None
        # whether a kernel's GPU state may be restored now (room.py; swap.py sets it). None:
        # nothing reads the GPU's room, so nothing is restored from host memory
        self.room: Callable[[KernelSleep], Room] | None = None
        # called with a kernel id when its resume starts to wait for room (swap.py reports it)
        self.on_waiting: list[Callable[[str], None]] = []
        # whether the node's host memory budget has room to hibernate this kernel (kernel id,
        # MiB): None when it has, else why not (swap.py asks the culler: culler/hostroom.py).
        # Unset: only the pod's memory limit bounds it
        self.host_gate: Callable[[str, float], str | None] | None = None

    # the clock, and how a blocking driver call leaves the event loop: the real ones (a replay
    # in virtual time, benchmarks/bench_culler.py, sets its own on the instance)
    def now(self) -> datetime:
        return utcnow()

    async def offload(self, call: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.to_thread(call, *args)

    # --- queries ------------------------------------------------------------------------------
    def suspended(self, kernel_id: str) -> bool:
        s = self.kernels.get(kernel_id)
        return s is not None and s.state in SUSPENDED

    def suspending(self, kernel_id: str) -> bool:
        """Whether a suspend of the kernel is under way: its checkpoint, or the checks just
        before it (under its lock, the state still "running")."""
        s = self.kernels.get(kernel_id)
        if s is None:
            return False
        return s.state == "hibernating" or (s.lock.locked() and s.state == "running")

    def memory_of(self, kernel_id: str) -> float:
        """GPU memory the kernel's GPU state takes in host memory, a copy under way included
        (`KernelSleep.host_mib`: what its report entry says)."""
        s = self.kernels.get(kernel_id)
        return 0.0 if s is None else s.host_mib()

    def total_mib(self) -> float:
        """The server's hibernated total (the report's, so the culler's admin page and
        fracspawner_hibernated_bytes): its kernels' entries added up, copies under way too."""
        return round(sum(self.memory_of(k) for k in self.kernels), 1)

    def kernel_json(self, kernel_id: str) -> dict:
        s = self.kernels.get(kernel_id)
        if s is None:  # never tried: what stops every kernel here (checked or seen) says why
            why = self.unsupported or mig_problem(self.device_indices)
            s = KernelSleep(kernel_id, cannot=why and f"cannot hibernate: {why}")
        return s.as_json()

    def available(self) -> str | None:
        """None where the checkpoint API is usable, else why not (checked once)."""
        if not self._checked:
            self._checked = True
            try:
                self.driver.check()
                self.unsupported = driver_problem(
                    nvml_driver_version(), self.in_container, self.all_gpus_visible
                )
            except Unsupported as exc:
                self.unsupported = str(exc)
            except Exception as exc:  # a broken binding: same as none
                self.unsupported = f"the checkpoint API failed to start: {exc}"
        return self.unsupported or mig_problem(self.device_indices)

    def summary(self, limit: float | None) -> dict:
        headroom = host_headroom(self.cgroup_root, self.meminfo_path)
        return {
            "simulated": self.simulated,
            "enabled": self.enabled and limit is not None,
            "after_seconds": limit,
            "available": self.unsupported is None if self._checked else None,
            "reason": self.unsupported or mig_problem(self.device_indices),
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
        self.last_message[kernel_id] = self.now()

    def forget(self, kernel_id: str) -> None:
        s = self.kernels.pop(kernel_id, None)
        if s is not None and s.task is not None and not s.task.done():
            s.task.cancel()
        if s is not None:
            self._stop_watching(s)
        self.last_message.pop(kernel_id, None)

    # --- suspend ------------------------------------------------------------------------------
    async def hibernate(
        self,
        kernel_id: str,
        pids: list[int],
        memory_mib: float,
        *,
        kernel_pid: int | None = None,
        why: str = "idle",
    ) -> str:
        """Suspend the kernel's own CUDA process; returns its state afterwards (KernelSleep).

        `pids` are the processes holding the kernel's GPU memory (its own and its descendants'),
        `kernel_pid` the kernel process itself. Only the kernel's own process is ever suspended,
        and only while no other process it started holds GPU memory: a subprocess or a
        DataLoader worker suspended alone would stall while the kernel looks idle, and nothing
        would resume it. Nothing here ever ends a kernel."""
        s = self.kernels.setdefault(kernel_id, KernelSleep(kernel_id))
        if s.lock.locked():
            return s.state
        async with s.lock:
            started = self.now()
            target = kernel_pid  # never "the one process there is": it may be a child
            if s.pid is not None and target is not None and target != s.pid:
                # a restarted kernel is a new process: what held for the old one does not
                if s.state == "failed" or s.cannot:
                    s.state, s.cannot, s.restore_error, s.note = "running", None, None, None
            if s.state != "running" or s.cannot:
                return s.state
            if s.next_try is not None and started < s.next_try:
                return s.state
            reason = await self.offload(self.available)
            if reason is not None:
                s.cannot = f"cannot hibernate: {reason}"
                return s.state
            if target is None:
                return self._later(s, "not hibernated: its GPU process is not known")
            others = sorted(p for p in pids if p != target)
            if others:
                n = len(others)
                return self._later(
                    s,
                    f"not hibernated: {n} other process{'es' if n > 1 else ''} it started "
                    f"(pid {', '.join(map(str, others[:5]))}) hold GPU memory: a subprocess, a "
                    "background run or a DataLoader worker is never suspended, nor the kernel "
                    "while they hold the GPU; tried again later",
                )
            if await self.offload(nccl_peers, target):
                return self._later(
                    s,
                    "not hibernated: its process is in an NCCL communicator (torch.distributed), "
                    "whose peers hang while one rank is suspended (NVIDIA/cuda-checkpoint #30); "
                    "tried again later",
                )
            working = await self._cpu_busy(target)
            if working is not None:
                return self._later(
                    s,
                    f"not hibernated: its process used {working:.0f} % of a CPU while no cell "
                    "ran (a thread or a background task works in it, and its next CUDA call "
                    "would wait); tried again later",
                )
            if self.host_gate is not None:
                held_back = self.host_gate(kernel_id, memory_mib)
                if held_back is not None:  # asked again at the next reading: no retry delay
                    s.note = held_back
                    return s.state
            headroom = host_headroom(self.cgroup_root, self.meminfo_path)
            need = memory_mib + self.host_margin_mib
            # other kernels' checkpoints under way: their copies are not all in usage yet
            copying = sum(mib for kid, mib in self.copying.items() if kid != kernel_id)
            if headroom.free_mib is None or headroom.free_mib - copying < need:
                free = "an unknown amount" if headroom.free_mib is None else gib(headroom.free_mib)
                under_way = (
                    f", and {gib(copying)} of it is taken by another kernel's checkpoint under way"
                    if copying > 0 and headroom.free_mib is not None
                    else ""
                )
                return self._later(
                    s,
                    f"not hibernated: it needs {gib(need)} of host memory and {free} is free "
                    f"under {headroom.where}{under_way}",
                )
            last = self.last_message.get(kernel_id)
            if last is not None and last >= started:
                return s.state  # a message came while it was being looked at: it is in use
            return await self._suspend_locked(s, target, memory_mib, why)

    def refuse(self, kernel_id: str, note: str) -> str:
        """Not hibernated now, for a reason that may pass: the report's `reason` and `next_try`
        say so, which the culler reads as a refusal (it asks another kernel meanwhile)."""
        return self._later(self.kernels.setdefault(kernel_id, KernelSleep(kernel_id)), note)

    def _later(self, s: KernelSleep, note: str) -> str:
        s.note, s.next_try = note, self.now() + timedelta(seconds=self.retry_refused_after)
        return s.state

    async def _cpu_busy(self, pid: int) -> float | None:
        """The process's CPU use (percent of a core) over the probe if it is working, else None."""
        if self.cpu_probe_seconds <= 0:
            return None
        before, t0 = cpu_seconds(pid), time.monotonic()
        await asyncio.sleep(self.cpu_probe_seconds)
        after, t1 = cpu_seconds(pid), time.monotonic()
        if before is None or after is None or t1 <= t0:
            return None
        percent = (after - before) / (t1 - t0) * 100
        return percent if percent >= self.cpu_busy_percent else None

    async def _suspend_locked(self, s: KernelSleep, pid: int, memory_mib: float, why: str) -> str:
        s.state, s.pid, s.note, s.next_try = "hibernating", pid, None, None
        # the report says what its copy moves to host memory from its start (a minute for
        # 80 GiB): a culler that restarts, or first hears of this server, mid-copy counts it
        # in the node's host memory budget (culler/hostbudget.py), and its GPU memory as
        # still held there (the state says so: culler/pressure.py)
        s.memory_mib, s.since, s.why = memory_mib, self.now(), why
        self.copying[s.kernel_id] = memory_mib
        try:
            return await self._suspend_copying(s, pid, memory_mib, why)
        finally:  # done, refused or cancelled: its copy is in usage now, or nothing is
            self.copying.pop(s.kernel_id, None)
            if s.state not in SUSPENDED:  # refused or cancelled: nothing in host memory
                s.memory_mib = 0.0

    async def _suspend_copying(self, s: KernelSleep, pid: int, memory_mib: float, why: str) -> str:
        started = time.monotonic()
        try:
            await self.offload(self._suspend, pid)
        except _Later as exc:
            s.state = "running"
            return self._later(s, str(exc))
        except Unsupported as exc:
            self.unsupported = str(exc)
            s.state, s.cannot = "running", f"cannot hibernate: {exc}"
            return s.state
        except Exception as exc:  # _Cannot, a driver error anywhere, a broken binding
            left = await self._after_refusal(s, pid, exc)
            if left != "checkpointed":
                return left
            # the checkpoint went through after all: hibernated as any other, holding what
            # it held (the report's host memory, the room its resume asks), watched, recorded
            self.log.warning(
                "fracspawner: kernel %s: the driver answered the checkpoint with %s, yet its "
                "process is checkpointed: hibernated",
                s.kernel_id,
                _code(exc) or exc,
            )
        except BaseException:  # cancelled: never left "hibernating", read as idle for ever
            s.state = "running"
            raise
        return self._hibernated(s, memory_mib, why, round(time.monotonic() - started, 3))

    def _hibernated(self, s: KernelSleep, memory_mib: float, why: str, seconds: float) -> str:
        """`s`'s GPU state is in host memory now: say what it holds and why, record it, and
        watch its iopub for clients that bypass this server (foreign.py)."""
        s.state, s.memory_mib, s.since, s.why = "hibernated", memory_mib, self.now(), why
        s.restore_error, s.attempts, s.next_retry = None, 0, None
        self.hibernations = [
            *self.hibernations[-(HISTORY - 1) :],
            {"kernel_id": s.kernel_id, "at": isoformat(s.since),
             "gpu_memory_mib": round(memory_mib, 1), "seconds": seconds, "why": why},
        ]  # fmt: skip
        self.log.info(
            "fracspawner: kernel %s hibernated (%s): %s of GPU memory moved to host memory "
            "(%.1f s)",
            s.kernel_id,
            why,
            gib(memory_mib),
            seconds,
        )
        if self.watch is not None:
            try:
                s.unwatch = self.watch(s.kernel_id)
            except Exception:  # watching is a help: the websocket still resumes it
                self.log.warning("fracspawner: cannot watch kernel %s", s.kernel_id, exc_info=True)
        return s.state

    async def _after_refusal(self, s: KernelSleep, pid: int, exc: Exception) -> str:
        """Put the process back as far as the driver lets, and say so; "checkpointed" where
        the checkpoint went through after all (the caller hibernates it), else its state."""
        left = await self.offload(self._settle, pid)
        code = exc.code if isinstance(exc, CheckpointError) else str(exc)
        if left == "locked":
            # unlock failed: its CUDA calls block; the resume loop keeps trying to unlock
            s.state, s.memory_mib, s.since = "restore_failed", 0.0, self.now()
            s.restore_error = f"unlocking after a refused checkpoint ({code}) failed"
            s.cannot = f"cannot hibernate: the driver refused ({code})"
            self.log.warning("fracspawner: kernel %s left locked: %s", s.kernel_id, s.restore_error)
            self.resume(s.kernel_id, "unlock after a refused checkpoint")
            return s.state
        if left == "failed":
            s.state = "failed"
            s.restore_error = (
                f"the driver refused ({code}) and left its CUDA state failed: restart the kernel "
                "to use the GPU again"
            )
            s.cannot = f"cannot hibernate: {s.restore_error}"
            self.log.warning("fracspawner: kernel %s %s", s.kernel_id, s.cannot)
            return s.state
        if left == "checkpointed":  # the checkpoint went through after all: resume on use
            return left
        s.state = "running"  # never ended for it: left as the driver left it
        s.cannot = f"cannot hibernate: the driver refused ({code}{_refusal_hint(exc)})"
        self.log.warning("fracspawner: kernel %s %s", s.kernel_id, s.cannot)
        return s.state

    def _suspend(self, pid: int) -> None:
        """GetState, Lock, Checkpoint. Raises _Later for what may pass, else the driver's error."""
        drv = self.driver
        try:
            state = drv.state(pid)
        except CheckpointError as exc:
            # a pid that exited meanwhile: CUDA_ERROR_OPERATING_SYSTEM on driver 580.159.04
            # (tests/gpu/test_real_checkpoint_driver.py), INVALID_VALUE by the docs' returns
            if exc.code == "CUDA_ERROR_INVALID_VALUE" or _exited(pid):
                raise _Later(
                    f"not hibernated: the driver does not know its process now ({exc}); "
                    "tried again later"
                ) from exc
            raise _Cannot(exc.code) from exc
        if state != "running":
            raise _Cannot(f"the process is {state}")
        try:
            drv.lock(pid, self.lock_timeout_ms)
        except CheckpointError as exc:
            if exc.code in BUSY_CODES:  # documented: left RUNNING
                raise _Later(
                    f"not hibernated: its CUDA work did not pause within "
                    f"{self.lock_timeout_ms / 1000:g} s; tried again later"
                ) from exc
            raise
        drv.checkpoint(pid)

    def _settle(self, pid: int) -> str:
        """After a refusal: unlock a LOCKED process; its state then ("unknown" if unreadable)."""
        left = self._state_or_unknown(pid)
        if left == "locked":
            try:
                self.driver.unlock(pid)
            except (CheckpointError, Unsupported):
                return "locked"
            left = self._state_or_unknown(pid)
        return left

    def _state_or_unknown(self, pid: int) -> str:
        try:
            return self.driver.state(pid)
        except Exception:
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

    def _notify(self, kernel_id: str, text: str) -> None:
        for notify in list(self.on_restore_failed):
            try:
                notify(kernel_id, text)
            except Exception:  # a closed websocket must not stop the retries
                self.log.debug("fracspawner: restore notice not delivered", exc_info=True)

    def _stop_watching(self, s: KernelSleep) -> None:
        unwatch, s.unwatch = s.unwatch, None
        if unwatch is not None:
            try:
                unwatch()
            except Exception:
                self.log.debug("fracspawner: unwatch failed", exc_info=True)

    async def _resume(self, s: KernelSleep, why: str) -> bool:
        async with s.lock:  # after a suspend in progress
            delay = self.retry_first
            while s.state in ("hibernated", "restore_failed", "resuming"):
                assert s.pid is not None
                room = await self._gate(s)
                if room is not None:  # no room on the GPU: it waits, never restored into it
                    await self._wait_for_room(s, room)
                    if self.kernels.get(s.kernel_id) is not s:  # shut down meanwhile
                        return False
                    continue
                previous, s.state = s.state, "resuming"
                started = time.monotonic()
                s.grant_mib = s.grant_until = None  # one grant, one restore
                try:
                    await self._restore_watched(s, started)
                except Exception as exc:  # CheckpointError, Unsupported, _Cannot, a broken binding
                    if s.pid is not None and _exited(s.pid):
                        # the process is gone (the kernel was restarted or died): nothing to
                        # bring back, and its messages go to the kernel there is now
                        self.log.info(
                            "fracspawner: kernel %s restarted while hibernated", s.kernel_id
                        )
                        s.state, s.memory_mib, s.restore_error = "running", 0.0, None
                        self._stop_watching(s)
                        return True
                    left = await self.offload(self._state_or_unknown, s.pid)
                    if left == "failed":
                        return self._failed(s, exc)
                    if s.at_risk and _code(exc) not in (None, "CUDA_ERROR_OUT_OF_MEMORY"):
                        return self._lost(s, exc)  # #44: 304 after an out-of-memory
                    s.state, s.attempts = "restore_failed", s.attempts + 1
                    s.restore_error = str(exc)
                    s.next_retry = self.now() + timedelta(seconds=delay)
                    if previous != "restore_failed" or s.attempts % 5 == 1:
                        self.log.warning("fracspawner: kernel %s: %s", s.kernel_id, exc)
                    if _gpu_full(exc):
                        # no room after all (a reading overtaken): on #44 drivers the state may
                        # be lost already; said at once, and tried once more when there is room
                        first = not s.at_risk
                        s.at_risk, s.gpu_full = True, True
                        if first:
                            self._notify(s.kernel_id, AT_RISK.format(code=_code(exc)))
                        # the reading that said room is overtaken: never straight back at it
                        await self._pause(s, delay)
                        delay = min(delay * 2, self.retry_max)
                        if self.kernels.get(s.kernel_id) is not s:  # shut down meanwhile
                            return False
                        continue
                    self._notify(
                        s.kernel_id,
                        f"fracspawner: this kernel's GPU state could not be restored yet ({exc}); "
                        f"trying again in {delay:.0f} s. The kernel is kept, its GPU state in "
                        "host memory: your cell runs once it is back; or restart the kernel to "
                        "start over.",
                    )
                    await self._pause(s, delay)
                    delay = min(delay * 2, self.retry_max)
                    if self.kernels.get(s.kernel_id) is not s:  # shut down meanwhile
                        return False
                    continue
                seconds = round(time.monotonic() - started, 3)
                self._done_waiting(s)
                s.state, s.last_resume_seconds, s.last_resumed_at = "running", seconds, self.now()
                s.restore_error, s.next_retry, s.attempts = None, None, 0
                self.resumes = [
                    *self.resumes[-(HISTORY - 1) :],
                    {"kernel_id": s.kernel_id, "at": isoformat(s.last_resumed_at),
                     "seconds": seconds, "gpu_memory_mib": round(s.memory_mib, 1), "why": why},
                ]  # fmt: skip
                s.restored_mib, s.memory_mib = s.memory_mib, 0.0
                self._stop_watching(s)
                self.log.info(
                    "fracspawner: kernel %s resumed (%s) in %.1f s", s.kernel_id, why, seconds
                )
            return s.state == "running"

    async def _restore_watched(self, s: KernelSleep, started: float) -> None:
        """The driver's restore of `s`; where it has not returned after restore_stall_seconds
        the cell and the log are told once (NVIDIA/cuda-checkpoint#17: a restore that never
        returned), and the report says since when. The call itself cannot be interrupted."""
        assert s.pid is not None
        call = asyncio.ensure_future(self.offload(self._restore, s.pid))
        try:
            if self.restore_stall_seconds > 0:
                done, _ = await asyncio.wait({call}, timeout=self.restore_stall_seconds)
                if not done:
                    s.restore_stalled_since = self.now()
                    waited = _duration(time.monotonic() - started)
                    self.log.warning(
                        "fracspawner: kernel %s: the driver's restore has not returned after %s",
                        s.kernel_id,
                        waited,
                    )
                    self._notify(s.kernel_id, STALLED.format(waited=waited))
            await call
        finally:  # returned, failed, or the wait was cancelled (the kernel shut down)
            s.restore_stalled_since = None

    async def _gate(self, s: KernelSleep) -> Room | None:
        """None: restore now. A Room saying why not where the process's GPU state is (or, its
        state unreadable, may be) in host memory and nothing says the physical GPU has room
        for it (room.py)."""
        assert s.pid is not None
        state = await self.offload(self._state_or_unknown, s.pid)
        if state in ("locked", "running", "failed"):
            return None  # an unlock, a restore done, failed: no memory to bring back
        if state != "checkpointed":
            if _exited(s.pid):
                return None  # gone: the restart path, nothing to bring back
            # unreadable (GetState failed) or between states: its memory may still be in host
            # memory, and _restore reads the state again and restores if it is: it waits
            return Room(
                False,
                "no room is confirmed for it: its CUDA state could not be read just now (the "
                "CUDA driver's GetState failed)"
                if state == "unknown"
                else f"no room is confirmed for it: its CUDA state reads {state}",
            )
        if self.room is None:
            return Room(False, "nothing reads the GPU's free memory here")
        try:
            room = self.room(s)
        except Exception as exc:  # a broken reading is no room
            self.log.warning("fracspawner: reading the GPU's room failed", exc_info=True)
            return Room(False, f"the GPU's free memory could not be read ({exc})")
        return None if room.ok else room

    async def _wait_for_room(self, s: KernelSleep, room: Room) -> None:
        """One look's worth of waiting for room; the user is told as the module says."""
        first = not s.gpu_full or s.waiting_since is None
        s.gpu_full, s.wait_why = True, room.why
        if s.waiting_since is None:
            s.waiting_since = self.now()
        if first:
            self.log.info("fracspawner: kernel %s waits for room: %s", s.kernel_id, room.why)
            for started in list(self.on_waiting):
                try:
                    started(s.kernel_id)
                except Exception:
                    self.log.debug("fracspawner: waiting notice failed", exc_info=True)
            if not self.swap_managed and not s.at_risk:  # nobody makes room: said at once
                self.tell_waiting(
                    s.kernel_id,
                    "fracspawner: there is no room on the GPU for this kernel's GPU state now "
                    f"({room.why}), so it waits in host memory and your cell runs as soon as "
                    "there is room (it is never restored into a full GPU).",
                )
        waited = (self.now() - s.waiting_since).total_seconds()
        if waited >= self.wait_bound and not s.escalated:
            s.escalated = True
            self._notify(s.kernel_id, self._escalation(waited, room))
        await self._pause(s, max(0.01, min(self.room_poll, self.wait_bound - waited + 0.01)))

    def _escalation(self, waited: float, room: Room) -> str:
        others = (
            "the culler asks idle kernels of other notebooks to make room first"
            if self.swap_managed
            else "other notebooks on this GPU hold the memory, and nothing moves theirs here"
        )
        return (
            f"fracspawner: this kernel has waited {_duration(waited)} for room on the GPU "
            f"({room.why}); {others}. To make room now, shut down another of your own "
            "kernels that holds GPU memory, or restart this one to start over; its GPU state "
            "stays in host memory until then."
        )

    def tell_waiting(self, kernel_id: str, text: str = GPU_FULL) -> None:
        """Tell the notebook once that its kernel waits for room (swap.py: the culler's
        answer says the GPU is full)."""
        s = self.kernels.get(kernel_id)
        if s is None or not s.waiting() or s.told_waiting:
            return
        s.told_waiting = True
        self._notify(kernel_id, text)

    def grant(self, kernel_id: str, mib: float, seconds: float) -> None:
        """The culler made room for this kernel's restore (swap.py): in force `seconds`."""
        s = self.kernels.get(kernel_id)
        if s is None or not s.waiting():
            return
        s.grant_mib, s.grant_until = mib, self.now() + timedelta(seconds=seconds)
        s.wake.set()

    def granted(self, s: KernelSleep) -> float | None:
        """The culler's grant for `s` in force now, or None."""
        if s.grant_until is None or s.grant_until <= self.now():
            return None
        return s.grant_mib

    def _done_waiting(self, s: KernelSleep) -> None:
        s.gpu_full, s.waiting_since, s.wait_why, s.at_risk = False, None, None, False
        s.told_waiting = s.escalated = False
        s.grant_mib = s.grant_until = None

    def _lost(self, s: KernelSleep, exc: Exception) -> bool:
        """NVIDIA/cuda-checkpoint#44: after a restore refused for want of room, the driver
        answers every restore with CUDA_ERROR_OPERATING_SYSTEM and only ending the process
        helps. Terminal like FAILED: nothing retries it, and the user is told at once."""
        self._done_waiting(s)
        s.state, s.next_retry, s.memory_mib = "failed", None, 0.0
        s.restore_error = (
            f"{LOST} (the CUDA driver refused to restore its GPU state for want of room and now "
            f"answers {_code(exc) or exc}: NVIDIA/cuda-checkpoint#44; only a restart recovers "
            "it; its other variables are still there until then)"
        )
        s.cannot = f"cannot hibernate: {s.restore_error}"
        self.log.warning("fracspawner: kernel %s: %s", s.kernel_id, s.restore_error)
        self._stop_watching(s)
        self._notify(s.kernel_id, f"fracspawner: {s.restore_error}")
        return False

    async def _pause(self, s: KernelSleep, delay: float) -> None:
        """Wait `delay` seconds before the next restore, or until `retry_now` says there is room."""
        s.wake.clear()
        try:
            await asyncio.wait_for(s.wake.wait(), delay)
        except asyncio.TimeoutError:
            pass

    def retry_now(self, kernel_id: str) -> None:
        """Try a waiting restore again now (swap.py: the GPU has room for it)."""
        s = self.kernels.get(kernel_id)
        if s is not None:
            s.wake.set()

    def _failed(self, s: KernelSleep, exc: Exception) -> bool:
        """FAILED is terminal (CUprocessState: "an uncorrectable error during the
        checkpoint/restore process"; the cuda-checkpoint README: the driver "does not attempt to
        keep the process in a good state"): no more retries, and the user is told the truth."""
        self._done_waiting(s)
        s.state, s.next_retry, s.memory_mib = "failed", None, 0.0
        s.restore_error = (
            f"the CUDA driver could not restore this kernel's GPU state ({exc}) and reports its "
            "process FAILED, which it cannot recover from: what the kernel held on the GPU may "
            "be lost (its other variables are still there). Restart the kernel to use the GPU "
            "again."
        )
        self.log.warning("fracspawner: kernel %s: %s", s.kernel_id, s.restore_error)
        self._stop_watching(s)
        self._notify(s.kernel_id, f"fracspawner: {s.restore_error}")
        return False

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
            raise _Cannot(f"the process is {state}")
