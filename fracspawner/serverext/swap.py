"""Over-commit's swap, in the server: the culler's orders to swap idle kernels out, and kernels
that wait for room on a full GPU.

On a pool that commits more GPU memory than its GPUs have (catalog `overcommit`), the culler
keeps what is resident on each GPU within its size (fracspawner/culler/pressure.py). It never
calls into this server: its orders come back in the answer to this server's own report
(reporter.py `on_answer`): `{"swap": {"hibernate": [{"kernel_id", "reason"}], "report_in": s}}`.
This module

- hibernates each kernel named, if it is still one of this server's kernels and idle, through
  the monitor's `hibernate_now` (every safety of the hibernator holds: only the kernel's own
  process, never one that executes, its data kept; a refusal is reported and the culler asks
  the next least recently used kernel);
- says whether a hibernated kernel may be restored now (the hibernator asks before every
  restore: room.py). On an over-committed pool, and wherever HAMi-core virtualises NVML, only
  the culler's grant counts: the answer's `swap.resume: [{"kernel_id", "gpu_memory_mib"}]`,
  in force `GRANT_SECONDS`; elsewhere NVML of the device, with `restore_margin_mib`;
- reports the kernels whose resume waits for room as `swap.waiting` (since when they wait), at
  once (a report now, not at the next minute): that is the demand the culler makes room for.
  When the culler's answer says they wait (`swap.wait: [{"kernel_id", "reason"}]`) the cell
  says so once (hibernate.GPU_FULL; GPU_IN_USE with the culler's reason where people present
  at the GPU hold it: no swap is promised), and the meter shows it;
- where NVML counts, tries such a resume again as soon as the GPU shows room for it (the
  monitor's readings of the device's used memory), not at the end of a backoff;
- reports again when the culler says (`report_in`), so a GPU under pressure hears of its swaps
  in seconds rather than a minute;
- hibernates a kernel only with room for it in its node's host memory budget, where it reports
  to a culler (`ask_host_room`): a kernel due to hibernate is reported at once as
  `swap.hibernate_wanted`, and hibernated once the answer gives it room
  (`swap.host_room: [{"kernel_id", "gpu_memory_mib"}]`, in force `GRANT_SECONDS`; a swap order
  is such room too); where the answer says why not (`swap.host_wait`) it stays on the GPU
  (culler/hostroom.py). So the node's hibernated kernels never hold more than the budget.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from traitlets import Float
from traitlets.config import LoggingConfigurable

from .hibernate import GPU_FULL, GPU_IN_USE
from .podinfo import isoformat
from .room import Room, environ_grant_only, room_for, virtualised_nvml

MAX_ORDERS = 16  # kernels one answer may name (a server has a few)
GRANT_SECONDS = 30.0  # a grant of room from the culler is in force this long
ENV_OVERCOMMIT = "FRACSPAWNER_GPU_OVERCOMMIT"  # the pool's overcommit, set by FracSpawner
IN_USE = "the GPU is in use by "  # the culler's reason for a resume behind present people
WANT_SECONDS = 120.0  # a kernel not asked for again this long is no longer due to hibernate
CONTENDED_SECONDS = 120.0  # the GPU counts as contended this long after an answer says so
HOST_WAIT = (
    "not hibernated yet: waiting for the culler's room in its node's host memory budget for "
    "hibernated kernels; it stays on the GPU meanwhile"
)


def mib_up(mib: float) -> float:
    """MiB as a report says them (a tenth of a MiB, rounded up; float noise below a millionth
    is not a tenth more): the culler grants what a waiting kernel's report asks, and the room
    check compares that grant with this same figure (`SwapAgent.room`), so a grant of what was
    asked always covers it. Rounded to the nearest, a grant fell 0.02 MiB short of a kernel of
    40,632.32 MiB (NVML counts bytes) and its restore waited for ever."""
    return math.ceil(round(mib * 10, 6)) / 10


def waiting_words(reason: Any) -> str:
    """What the cell says while its resume waits: behind people present at the GPU (the
    culler's reason names them: culler/swapdesk.py `wait_reason`), or for a swap (GPU_FULL)."""
    if isinstance(reason, str) and reason.startswith(IN_USE) and reason.isprintable():
        return GPU_IN_USE.format(reason=reason[:200])
    return GPU_FULL


def entries(swap: dict, key: str) -> list:
    """The first MAX_ORDERS entries of a list in the culler's answer; [] for anything else."""
    value = swap.get(key)
    return value[:MAX_ORDERS] if isinstance(value, list) else []


def own_kernel(entry: Any, live: set[str]) -> str | None:
    """The kernel id an entry of the culler's answer names, where it is one of this server's
    own (by the ids it reported); None for anything else (a list or a mapping is no id: `in`
    a set would raise, and the rest of the answer would be lost)."""
    kid = entry.get("kernel_id") if isinstance(entry, dict) else None
    return kid if isinstance(kid, str) and kid in live else None


def resuming(s: Any) -> bool:
    """Whether kernel `s` (hibernate.KernelSleep) is being resumed or suspended now: its
    resume task (hibernate.Hibernator.resume) is alive, or its lock is held."""
    return s.lock.locked() or (s.task is not None and not s.task.done())


def resuming_now(s: Any) -> bool:
    """Whether the driver is restoring kernel `s`'s GPU state now (hibernate.py sets
    "resuming" just before the restore, after the room check)."""
    return s.state == "resuming"


def back_since(s: Any, taken: datetime | None) -> bool:
    """Whether kernel `s`'s GPU state came back after a reading taken at `taken` (None: not
    known when, taken as now) and is on the GPU still: the reading shows its memory free.
    A restore that returned then was in NVML's figures by the time they were read."""
    return (
        taken is not None
        and s.last_resumed_at is not None
        and s.last_resumed_at > taken
        and s.state in ("running", "hibernating")  # its checkpoint under way holds it too
    )


def _overcommit(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        return 1.0
    return value if value == value and value >= 1 else 1.0


class SwapAgent(LoggingConfigurable):
    """Acts on the culler's swap orders and reports kernels waiting for room."""

    room_check = Float(
        1.0,
        config=True,
        help="Seconds between two looks at the GPU's free memory while a kernel waits to resume "
        "for want of room (it is tried again as soon as there is room for it).",
    )
    restore_margin_mib = Float(
        512.0,
        config=True,
        help="GPU memory (MiB) that must stay free beyond what a kernel held before its state is "
        "restored on NVML's word (where the culler's grant is not required): a reading a moment "
        "old may be overtaken, and on current drivers a restore refused for want of room loses "
        "the kernel's GPU state (NVIDIA/cuda-checkpoint#44).",
    )

    def __init__(self, monitor: Any, report_soon: Callable[[float], None], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.monitor = monitor
        self.report_soon = report_soon
        self._tasks: set[asyncio.Task] = set()
        self._watching: asyncio.Task | None = None
        self.orders: list[dict] = []  # the latest orders taken (doctor, tests)
        # FracSpawner says the pool over-commits (backends.plan_slice): only then does the
        # culler make room, and a kernel refused for want of room waits for it
        self.overcommit = _overcommit(os.environ.get(ENV_OVERCOMMIT, ""))
        monitor.hibernator.swap_managed = self.overcommit > 1
        # only the culler's grant counts here (over-commit, HAMi-core's virtualised NVML): why
        self.grant_only = environ_grant_only(self.overcommit)
        self.virtualised = virtualised_nvml(os.environ) is not None
        monitor.hibernator.room = self.room
        monitor.hibernator.on_waiting.append(self._started_waiting)
        # the node's host budget (culler/hostroom.py): asked only where a reporter sends this
        # server's reports to a culler (__init__.py sets it); elsewhere the pod's memory limit
        self.ask_host_room = False
        self.host_room: dict[str, datetime] = {}  # kernel id -> room given until
        self.host_wanted: dict[str, tuple[float, datetime]] = {}  # kernel id -> (MiB, asked)
        # kernel id -> the culler's word why it waits for host room (None: none readable), and
        # when the culler last said it waits
        self.host_wait: dict[str, tuple[str | None, datetime]] = {}
        monitor.hibernator.host_gate = self.host_gate
        monitor.kept_on_gpu = self.kept_on_gpu
        self.contended_at: datetime | None = None  # the culler's latest answer asking word soon

    # --- the culler's answer ------------------------------------------------------------------
    def on_answer(self, answer: dict) -> None:
        """Take the culler's answer to a report (reporter.py)."""
        swap = answer.get("swap") if isinstance(answer, dict) else None
        if not isinstance(swap, dict):
            return
        report_in = swap.get("report_in")
        if isinstance(report_in, int | float) and not isinstance(report_in, bool):
            self.report_soon(max(1.0, float(report_in)))
            # the culler wants word soon: its GPU is under pressure, or a resume waits there
            self.contended_at = self.monitor.hibernator.now()
        live = self.monitor._kernel_ids()
        hib = self.monitor.hibernator
        for grant in entries(swap, "resume"):
            kid = own_kernel(grant, live)
            if kid is not None:
                mib = grant.get("gpu_memory_mib")
                if isinstance(mib, int | float) and not isinstance(mib, bool) and mib >= 0:
                    hib.grant(kid, float(mib), GRANT_SECONDS)
        for wait in entries(swap, "wait"):
            kid = own_kernel(wait, live)
            if kid is not None:
                hib.tell_waiting(kid, waiting_words(wait.get("reason")))
        roomed = False
        for room in entries(swap, "host_room"):
            kid = own_kernel(room, live)
            if kid is not None:
                self.host_room[kid] = self._room_until()
                self.host_wait.pop(kid, None)
                roomed = True
        if roomed:  # the room is held for a short while: hibernate now, not at the next reading
            task = asyncio.get_running_loop().create_task(self._hibernate_due())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        for wait in entries(swap, "host_wait"):
            kid = own_kernel(wait, live)
            if kid is not None:
                why = wait.get("reason")
                if not (isinstance(why, str) and why.isprintable()):
                    why = self._host_why(kid)  # keep the last readable
                self.host_wait[kid] = (why[:300] if why else None, self.monitor.hibernator.now())
        for order in entries(swap, "hibernate"):
            kid = own_kernel(order, live)
            if kid is None:
                continue
            reason = order.get("reason")
            self.host_room[kid] = self._room_until()  # ordered within the node's budget
            why = reason if isinstance(reason, str) and reason else "swapped out"
            self.orders = [*self.orders[-49:], {"kernel_id": kid, "reason": why[:300]}]
            task = asyncio.get_running_loop().create_task(self._swap_out(kid, why[:300]))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        for order in entries(swap, "shutdown"):
            kid = own_kernel(order, live)
            if kid is not None:
                task = asyncio.get_running_loop().create_task(self._shut_down(kid))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _shut_down(self, kernel_id: str) -> None:
        """The culler's host-memory budget for this node (culler/hostbudget.py): shut down a
        hibernated kernel, the last resort, counted as a kernel shutdown. Only one still
        hibernated whose resume does not wait, nor is under way (its user may have come back
        meanwhile: the order was computed from a report sent before their cell)."""
        s = self.monitor.hibernator.kernels.get(kernel_id)
        if s is None or s.state not in ("hibernated", "restore_failed") or s.waiting():
            return
        if resuming(s):
            # a cell is held for it (hibernate.py retries a failed restore, or reads the
            # room, under its lock): never ended under it. Not counted as shut down, and
            # reported now, so the culler sees the kernel still there and in use
            self.log.info(
                "fracspawner: kernel %s not shut down for the node's host memory budget: its "
                "resume is under way",
                kernel_id,
            )
            self.report_soon(0.0)
            return
        if not self.monitor.loop_on_time():
            # the server was held: a cell sent to the kernel meanwhile may not have reached
            # resume.py yet. The culler tells it again later (culler/hostroom.py EVICT_SECONDS)
            self.log.info(
                "fracspawner: kernel %s not shut down for the node's host memory budget now: the "
                "monitor's loop is late",
                kernel_id,
            )
            return
        mib = s.memory_mib
        km = self.monitor.settings.get("kernel_manager")
        try:
            await km.shutdown_kernel(kernel_id)
        except Exception:  # gone already, or failing: the next report says which
            self.log.exception("fracspawner: shutting down kernel %s failed", kernel_id)
            return
        self.log.info(
            "fracspawner: shut down hibernated kernel %s (%.0f MiB in host memory): the node's "
            "host memory budget for hibernated kernels is spent (the culler's order)",
            kernel_id,
            mib,
        )
        self.monitor.hibernator.forget(kernel_id)
        at = isoformat(self.monitor.hibernator.now())
        self.monitor.culled = [
            *self.monitor.culled[-49:],
            {"id": kernel_id, "at": at, "gpu_memory_mib": round(mib, 1)},
        ]
        self.report_soon(0.0)

    async def _swap_out(self, kernel_id: str, why: str) -> None:
        try:
            state = await self.monitor.hibernate_now(kernel_id, why)
        except Exception:  # one failed order must not stop the next
            self.log.exception("fracspawner: swapping kernel %s out failed", kernel_id)
            return
        self.log.info("fracspawner: the culler asked to swap kernel %s out: %s", kernel_id, state)
        if state == "hibernated":
            self.report_soon(0.0)  # the culler counts what left at once
        # refused (busy now, or the hibernator's reason): the next report says so, and the
        # culler asks the next kernel; an immediate report could only bring the same order back

    # --- the node's host memory budget ---------------------------------------------------------
    def host_gate(self, kernel_id: str, memory_mib: float) -> str | None:
        """Whether this kernel may hibernate now (hibernate.Hibernator.host_gate): None with
        the culler's room for it in force, else why not (and it is reported as wanted)."""
        if not self.ask_host_room:
            return None
        now = self.monitor.hibernator.now()
        until = self.host_room.get(kernel_id)
        if until is not None and until > now:
            self.host_wanted.pop(kernel_id, None)
            return None
        self.host_room.pop(kernel_id, None)
        new = kernel_id not in self.host_wanted
        self.host_wanted[kernel_id] = (memory_mib, now)
        if new:
            self.report_soon(0.0)  # the culler's answer brings the room, or why not
        return self._host_why(kernel_id) or HOST_WAIT

    def _host_why(self, kernel_id: str) -> str | None:
        """The culler's last readable word why `kernel_id` waits for host room."""
        said = self.host_wait.get(kernel_id)
        return said[0] if said else None

    def kept_on_gpu(self, kernel_id: str) -> bool:
        """Whether kernel_gpu_idle must leave this kernel on the GPU: on an over-committed pool,
        while it waits for the culler's room in its node's host budget to hibernate. There
        the culler frees GPU memory when someone needs it, by a swap order that may shut down
        the oldest hibernated kernels of people away to make host room (hostroom.py); shutting
        this one down for idleness alone would lose the most recently idle kernel, for no one's
        gain while the GPU has room (capacity replay, breaks, time-sliced, half the GPUs: 2 of
        19 kernel shut-downs; the other kernels shut down 30 min after their person left, on a
        full budget, sat on a contended GPU, below). Only while the culler itself says so (its
        answer's `host_wait`, within `CONTENDED_SECONDS`): a culler that does not answer
        manages nothing, and kernel_gpu_idle is then the server's own safety. Not while the
        culler's answers say its GPU is contended: a swap order may find no host room either,
        and shutting it down then frees the GPU."""
        if not (self.overcommit > 1 and self.ask_host_room and kernel_id in self.host_wanted):
            return False
        now = self.monitor.hibernator.now()
        said = self.host_wait.get(kernel_id)
        if said is None or (now - said[1]).total_seconds() > CONTENDED_SECONDS:
            return False
        at = self.contended_at
        return at is None or (now - at).total_seconds() > CONTENDED_SECONDS

    def _room_until(self) -> datetime:
        return self.monitor.hibernator.now() + timedelta(seconds=GRANT_SECONDS)

    async def _hibernate_due(self) -> None:
        try:
            done = await self.monitor.hibernate_idle_kernels(self.monitor.hibernator.now())
        except Exception:  # the next reading tries again
            self.log.exception("fracspawner: hibernating with the culler's host room failed")
            return
        if done:
            self.report_soon(0.0)  # the culler counts them in the node's budget at once

    def hibernate_wanted(self) -> list[dict]:
        """The kernels due to hibernate that wait for the culler's room (asked recently)."""
        hib = self.monitor.hibernator
        now, live = hib.now(), self.monitor._kernel_ids()
        for kid in list(self.host_wanted):
            _mib, asked = self.host_wanted[kid]
            if (
                kid not in live
                or hib.suspended(kid)
                or (now - asked).total_seconds() > WANT_SECONDS
            ):
                del self.host_wanted[kid]
                self.host_wait.pop(kid, None)
        return [
            {"kernel_id": kid, "gpu_memory_mib": mib_up(mib)}
            for kid, (mib, _asked) in sorted(self.host_wanted.items())
        ]

    # --- kernels waiting for room -------------------------------------------------------------
    def waiting(self) -> list[dict]:
        """Kernels whose resume waits for room on the GPU (hibernate.KernelSleep.gpu_full)."""
        hib = self.monitor.hibernator
        device = self._device_uuid()
        out = []
        for kid, s in sorted(hib.kernels.items()):
            if s.waiting():
                entry = {
                    "kernel_id": kid,
                    "gpu_memory_mib": mib_up(s.memory_mib),
                    "since": isoformat(s.waiting_since or s.since),
                }
                if device:
                    entry["device"] = device
                out.append(entry)
        return out

    def extend(self, report: dict) -> dict:
        """The report with `swap.waiting` (what the culler makes room for)."""
        report["swap"] = {"waiting": self.waiting()}
        wanted = self.hibernate_wanted()
        if wanted:
            report["swap"]["hibernate_wanted"] = wanted
        return report

    def _device_uuid(self) -> str | None:
        sample = self.monitor.sample
        if sample is None or len(sample.devices) != 1:
            return None  # several devices: the culler takes the first; unknown: none
        return sample.devices[0].uuid

    # --- room on the GPU ----------------------------------------------------------------------
    def room(self, s: Any) -> Room:
        """Whether kernel `s` (hibernate.KernelSleep) may be restored now (room.py); no room
        by a reading the GPU has not confirmed since (monitor.GpuMonitor.current_sample)."""
        sample = self.monitor.current_sample()
        devices = (
            [(d.memory_total_mib, d.memory_used_mib) for d in sample.devices]
            if sample is not None
            else None
        )
        hib = self.monitor.hibernator
        restoring = self._coming_back(s)
        return room_for(
            mib_up(s.memory_mib),  # as its report asked it: a grant of that covers it
            granted_mib=hib.granted(s),
            devices=devices,
            grant_only=self.grant_only,
            margin_mib=self.restore_margin_mib,
            virtualised=self.virtualised,
            restoring_mib=restoring,
        )

    def _coming_back(self, besides: Any = None) -> float:
        """MiB the monitor's latest reading shows free that this server's other kernels
        (not `besides`) hold or are taking: restores under way (a reading shows them only
        in part) and restores done after it was taken (it shows none of them: for up to a
        poll interval, room for a second restore that is no longer there)."""
        taken = getattr(self.monitor, "sample_taken", None)
        return sum(
            o.memory_mib if resuming_now(o) else o.restored_mib
            for o in self.monitor.hibernator.kernels.values()
            if o is not besides and (resuming_now(o) or back_since(o, taken))
        )

    def _started_waiting(self, kernel_id: str) -> None:
        """A resume waits for room: tell the culler now; where NVML counts, watch for room."""
        self.report_soon(0.0)
        if not self.virtualised and (self._watching is None or self._watching.done()):
            self._watching = asyncio.get_running_loop().create_task(self._watch_room())

    async def _watch_room(self) -> None:
        """While kernels wait for room: wake each as soon as the device shows room for it (the
        hibernator looks again, with the margin, before it restores)."""
        while True:
            if not self.wake_if_room():
                return
            await asyncio.sleep(self.room_check)

    def wake_if_room(self) -> bool:
        """One look of `_watch_room`: wake each waiting kernel the device shows room for.
        False when no kernel waits."""
        hib = self.monitor.hibernator
        waiting = [s for s in hib.kernels.values() if s.waiting()]
        if not waiting:
            return False
        free = self._free_mib()
        if free is not None:
            free -= self._coming_back()
        for s in sorted(waiting, key=lambda w: w.memory_mib):
            # granted: the culler kept the margin; the reading need only show the room
            granted = hib.granted(s) is not None
            margin = 0.0 if granted else self.restore_margin_mib
            if (
                free is not None
                and (granted or self.grant_only is None)
                and (free - margin >= s.memory_mib)
            ):
                hib.retry_now(s.kernel_id)
                free -= s.memory_mib
        return True

    def _free_mib(self) -> float | None:
        """The device's free memory by the monitor's latest reading that still stands (one
        device only)."""
        sample = self.monitor.current_sample()
        if sample is None or len(sample.devices) != 1:
            return None
        d = sample.devices[0]
        return d.memory_total_mib - d.memory_used_mib
