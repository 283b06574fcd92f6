"""Sample the GPU every few seconds and keep, per kernel and for the server, when it was last busy.

While any of this server's GPU processes is busy the monitor writes
`settings["fracspawner_gpu_last_activity"]`: jupyter-server's `ServerApp.last_activity()` takes
the max of every settings key ending in `_last_activity`, so the server's own activity, what it
reports to JupyterHub, and any culler reading either, count GPU work as activity.

Unknown is never idle: a reading the monitor cannot place (utilisation NVML cannot give on MIG,
the device's utilisation standing in for a process's, GPU work by a process it cannot match, a
busy device listing no process) makes the GPU activity "unknown": not activity (it could be a
neighbour's), not idle either, and an idle clock starts only after it ends. The monitor also
shuts this server's idle GPU kernels down itself (`cull_idle_kernels`), by the policy
FracSpawner put in the environment: no one outside the server calls into it to do so.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from traitlets import Bool, Float, Integer, Unicode, default

from .activity import in_session, presence_json, presence_of, user_activity
from .attribution import attribute, has_own_pid_namespace
from .foreign import watch_iopub
from .hibernate import Hibernator
from .loop import BackgroundLoop
from .neighbours import neighbours_work, shared_slice
from .podinfo import (
    ENV_SLICE,
    Deadline,
    PodInfo,
    hibernate_deadline,
    isoformat,
    kernel_deadline,
    server_deadline,
    utcnow,
)
from .procmap import kernel_id_of
from .room import virtualised_nvml
from .sources import GpuSample, GpuSource, GpuUnavailable, make_source

__all__ = ["GpuMonitor", "SETTINGS_KEY", "attribute", "utcnow", "isoformat"]

SETTINGS_KEY = "fracspawner_gpu_last_activity"
#: how long the culler's count of what a HAMi pod's GPUs have free is shown (s): it answers
#: each report, every minute on an over-committed pool; an older word is not today's room
CULLER_FREE_FRESH_S = 180.0
#: why a swap order was refused: its person is at the server now (presence.py)
PRESENT_NOW = (
    "not hibernated: its user is at the server now (a tab of it visible and used within the "
    "presence timeout); tried again later"
)


@dataclass
class KernelGpu:
    memory_mib: float = 0.0
    utilization: float | None = 0.0
    last_gpu_activity: datetime | None = None
    exact: bool = True  # False: the device's utilisation stands in for the kernel's
    last_not_idle: datetime | None = None  # last reading busy or unknown: the idle clock's start
    known: bool = True


class GpuMonitor(BackgroundLoop):
    """Reads the GPU on a timer and keeps GPU activity per kernel and for the server."""

    poll_interval = Float(5.0, config=True, help="Seconds between two GPU readings.")
    busy_threshold = Float(
        1.0,
        config=True,
        help="A process whose SM utilisation (percent) reaches this is busy: GPU work counts as "
        "activity for its kernel and for the server.",
    )
    unavailable_retry = Float(
        60.0,
        config=True,
        help="Seconds between tries when no GPU can be read (no NVML, no driver, no device).",
    )
    source_spec = Unicode(
        config=True,
        help="Where GPU readings come from: 'nvml', 'sim:/path/file.json' (simulated, for demos "
        "and tests) or 'none'. Default: $FRACSPAWNER_GPU_SOURCE, else 'nvml'.",
    )
    memory_entitlement_mib = Integer(
        None,
        allow_none=True,
        config=True,
        help="GPU memory (MiB) the server's slice entitles it to, reported to the user. "
        "Default: $FRACSPAWNER_GPU_MEMORY_MIB (set by FracSpawner), else unknown.",
    )

    own_pid_namespace = Bool(
        config=True,
        help="Whether the server has a PID namespace of its own (a container): every process it "
        "sees is then the pod's and counts as the server's, a job re-parented to PID 1 "
        "included. Otherwise only its descendants do. Default: detected from /proc/self/ns/pid.",
    )
    unlisted_memory_mib = Float(
        256.0,
        config=True,
        help="A device using more memory than this (MiB) while listing no process, with its "
        "utilisation unreadable (MIG), reads as GPU activity unknown, not idle.",
    )
    late_tolerance = Float(
        1.0,
        config=True,
        help="Seconds the monitor's loop may wake up late and still shut down or hibernate "
        "kernels in that round. A later loop (a starved or blocked server) may not have "
        "processed the requests and messages waiting for it yet: it only reads the GPU, and "
        "decides on the next round.",
    )
    cull_kernels = Bool(
        True,
        config=True,
        help="Shut down this server's kernels that hold GPU memory and have been idle (GPU, "
        "messages and user) for kernel_gpu_idle ($FRACSPAWNER_KERNEL_GPU_IDLE_SECONDS, set by "
        "FracSpawner from the catalog). Nothing is shut down without that policy.",
    )

    @default("own_pid_namespace")
    def _default_own_pid_namespace(self) -> bool:
        return has_own_pid_namespace()

    @default("source_spec")
    def _default_source(self) -> str:
        return os.environ.get("FRACSPAWNER_GPU_SOURCE", "nvml")

    @default("memory_entitlement_mib")
    def _default_entitlement(self) -> int | None:
        value = os.environ.get("FRACSPAWNER_GPU_MEMORY_MIB", "")
        return int(value) if value.strip().isdigit() else None

    def __init__(self, *, settings: dict, server_pid: int | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.settings = settings
        self.server_pid = server_pid or os.getpid()
        self.started = utcnow()
        self.source: GpuSource | None = None
        self.reason: str | None = None
        self.sample: GpuSample | None = None
        self.sampled_at: datetime | None = None
        # when the latest reading was taken (it may have come back later): what it says about
        # the GPU holds until then, not until it came back
        self.sample_taken: datetime | None = None
        # the latest try to read the GPU failed (GpuUnavailable or any error), and since when a
        # reading under way has not come back: `sample` still names the devices, but no longer
        # stands for their free memory (`current_sample`)
        self.reading_failed = False
        self.reading_since: datetime | None = None
        self.kernels: dict[str, KernelGpu] = {}
        self.processes: list[tuple[str | None, Any]] = []
        self.unmatched: list[Any] = []
        self.last_gpu_activity: datetime | None = None
        self.gpu_state = "idle"  # the latest reading: "busy" | "idle" | "unknown"
        self.unknown_reasons: list[str] = []
        self.last_not_idle: datetime | None = None  # last reading busy or unknown
        self.culled: list[dict] = []  # kernels this server shut down (newest last, bounded)
        # the loop's idle hibernations, run beside it: a checkpoint copies 1.4-1.9 GiB/s (a
        # minute for 80 GiB on an H200), and the readings, the culls and the room checks of
        # other kernels' resumes must not wait for it
        self._hibernating: asyncio.Task | None = None
        # kernels the cull path is shutting down now (seconds each): never suspended meanwhile
        self._shutting_down: set[str] = set()
        # kernels whose swap order was refused as their person is at the server: logged once
        # while the person stays (the culler may say the order again before it hears)
        self._refused_present: set[str] = set()
        # how late the loop's latest round woke, or was held while it ran (s), and when the
        # loop's next timer is due: the next round's, or while a round runs its own tick's
        # (loop clock; None without the loop): `loop_on_time`
        self._late = 0.0
        self._round_due: float | None = None
        self._ticker: asyncio.TimerHandle | None = None
        # kernels kept on the GPU rather than shut down for idleness (swap.py: on an
        # over-committed pool, one waiting for the culler's room in its node's host budget)
        self.kept_on_gpu: Callable[[str], bool] = lambda kernel_id: False
        # the slice and the culler's idle policy, as FracSpawner put them in the environment
        virtual = virtualised_nvml(os.environ) is not None
        # what the culler counts free on this server's GPUs (MiB) and when it said so, where
        # the pod's NVML shows only its slice (HAMi-core): `on_culler_answer`
        self.culler_free: tuple[float, datetime] | None = None
        self.pod = replace(
            PodInfo.from_environ(os.environ, memory_mib=self.memory_entitlement_mib),
            counts_hibernated=virtual,
            shares_device=not virtual and shared_slice(os.environ.get(ENV_SLICE, "")),
        )
        # the first rung: idle GPU kernels suspended to host memory (hibernate.py)
        self.hibernator = Hibernator(parent=self, log=self.log)
        # a client that bypasses the websocket resumes a hibernated kernel too (foreign.py)
        self.hibernator.watch = lambda kid: watch_iopub(
            self.settings, self.hibernator, kid, self.log
        )
        try:
            self.source = make_source(self.source_spec)
        except ValueError as exc:
            self.reason = str(exc)
        # the demo's simulated GPU comes with its simulated checkpoint driver (simcheckpoint.py)
        simulated_driver = getattr(self.source, "checkpoint_driver", None)
        if simulated_driver is not None:
            self.hibernator.driver = simulated_driver
            self.hibernator.simulated = True
        if self.source is None and self.reason is None:
            self.reason = "GPU reading is turned off (source 'none')"

    # --- the loop -----------------------------------------------------------------------------
    def start(self) -> None:
        if self.source is not None:
            self._start_loop()

    async def stop(self) -> None:
        await self._stop_loop()  # first: it starts no hibernation after this
        self._stop_ticks()
        self._round_due = None
        task, self._hibernating = self._hibernating, None
        if task is not None and not task.done():
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        if self.source is not None:
            self.source.close()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        expected: float | None = None  # when this round should have begun (loop clock)
        while True:
            delay = self.poll_interval
            late = 0.0 if expected is None else max(0.0, loop.time() - expected)
            self._late = late  # this round has begun: it ticks while it runs
            self._tick()
            try:
                await self.poll_once()
                if self.loop_on_time():
                    await self.cull_idle_kernels()
                    self._start_hibernations()
                else:
                    # requests and kernel messages that came while the loop was held may still
                    # wait to be processed: an idle time computed now could be a working
                    # user's (issue 28, 13a)
                    self.log.info(
                        "fracspawner: the monitor's loop was held %.1f s: no kernel is shut "
                        "down or hibernated this round",
                        max(self._late, self._overdue()),
                    )
            except Exception:  # one bad reading must not end monitoring for the server's life
                self.log.exception("fracspawner: GPU reading failed")
            finally:
                self._stop_ticks()
            if self.reason is not None:
                delay = max(delay, self.unavailable_retry)
            expected = self._round_due = loop.time() + delay
            await asyncio.sleep(delay)

    def _overdue(self) -> float:
        """How long the loop's next timer (`_round_due`) is overdue now (s; 0 without one)."""
        if self._round_due is None:
            return 0.0
        return max(0.0, asyncio.get_running_loop().time() - self._round_due)

    def _tick(self) -> None:
        """A round's own timer, every half `late_tolerance` while it runs: a round awaits a
        GPU reading in a thread (NVML may block for long) and each kernel's shutdown (seconds),
        and the loop may be held meanwhile. A tick that comes late counts as the round's
        lateness (`_late`, until the next round begins); one overdue, as the next round's
        timer between rounds does (`loop_on_time`)."""
        self._late = max(self._late, self._overdue())
        loop = asyncio.get_running_loop()
        step = max(0.05, self.late_tolerance / 2)
        self._round_due = loop.time() + step
        self._ticker = loop.call_later(step, self._tick)

    def _stop_ticks(self) -> None:
        """The round ends: a hold its last tick did not see yet counts as its lateness too."""
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
            self._late = max(self._late, self._overdue())

    def loop_on_time(self) -> bool:
        """Whether the loop keeps time now, as `late_tolerance` asks of a round that decides:
        its latest round woke within it and was not held longer while it ran, and the loop's
        next timer (the next round's, or the running round's tick) is not overdue by more. A
        hibernation round runs beside the loop for minutes (a checkpoint copies 1.4-1.9
        GiB/s), a round's shut-downs take seconds each, and the server may be held meanwhile
        (CPU starvation, a blocking call): requests and messages that came then may still wait
        to be processed, so no later kernel is decided on them, nor any order of the culler
        taken. Always on time without the loop (its rounds are someone else's)."""
        if self._late > self.late_tolerance:
            return False
        due = self._round_due
        if due is None:
            return True
        try:
            now = asyncio.get_running_loop().time()
        except RuntimeError:
            return True
        return now - due <= self.late_tolerance

    def _start_hibernations(self) -> None:
        """Run `hibernate_idle_kernels` beside the loop, one round at a time: the next round
        starts at the first reading after it ends."""
        if self._hibernating is None or self._hibernating.done():
            self._hibernating = asyncio.get_running_loop().create_task(self._hibernate_round())

    async def _hibernate_round(self) -> None:
        try:
            await self.hibernate_idle_kernels()
        except Exception:  # the next reading tries again
            self.log.exception("fracspawner: hibernating idle kernels failed")

    def _kernel_ids(self) -> set[str]:
        km = self.settings.get("kernel_manager")
        return set(km.list_kernel_ids()) if km is not None else set()

    async def poll_once(self) -> None:
        """Take one reading (off the event loop: NVML and /proc reads block) and apply it."""
        assert self.source is not None
        kernel_ids = self._kernel_ids()
        taken = self.reading_since = utcnow()
        try:
            sample = await asyncio.to_thread(self.source.sample)
            found = await asyncio.to_thread(
                attribute,
                sample,
                kernel_ids,
                self.server_pid,
                own_namespace=self.own_pid_namespace,
            )
        except GpuUnavailable as exc:
            if self.reason != str(exc):
                self.log.info("fracspawner: no GPU to read: %s", exc)
            self.reason, self.reading_failed = str(exc), True
            return
        except Exception:  # _run logs it
            self.reading_failed = True
            raise
        finally:
            self.reading_since = None
        self.reason, self.reading_failed = None, False
        self.apply(
            sample, found.owned, kernel_ids, utcnow(), unmatched=found.unmatched, taken=taken
        )

    def current_sample(self) -> GpuSample | None:
        """The latest reading while it still stands for the GPU's memory (the room check before
        a restore: swap.py): None once a later try to read the GPU failed, or while a reading
        has not come back for two poll intervals (NVML can block while the driver resets). A
        co-tenant may have filled the GPU since; a restore tried on that old word may be
        refused for want of room, and that loses the kernel's GPU state on current drivers
        (NVIDIA/cuda-checkpoint#44)."""
        if self.reading_failed:
            return None
        since = self.reading_since
        if since is not None and (utcnow() - since).total_seconds() > 2 * self.poll_interval:
            return None
        return self.sample

    def _state(self, p: Any) -> str:
        """One process's reading: busy, idle, or unknown (never read as idle when unsure)."""
        if p.utilization is None:
            return "unknown"  # MIG: NVML cannot say
        if p.utilization >= self.busy_threshold:
            # the device's utilisation standing in for the process's may be a neighbour's
            return "busy" if p.exact else "unknown"
        return "idle"

    def apply(
        self,
        sample: GpuSample,
        owned: list,
        kernel_ids: set[str],
        now: datetime,
        unmatched: list | tuple = (),
        taken: datetime | None = None,
    ) -> None:
        """Fold one reading into the per-kernel and server state. `now`: when it came back (a
        busy reading counts until then); `taken`: when it was taken (an idle reading says
        nothing later than that), `now` if not told."""
        self.sample, self.sampled_at, self.processes = sample, now, owned
        self.sample_taken = min(taken or now, now)
        # a MIG instance is known from the first reading: the report says why nothing is
        # hibernated there (NVIDIA/cuda-checkpoint#42), before any kernel is tried
        self.hibernator.device_indices = [d.index for d in sample.devices]
        self.unmatched = list(unmatched)
        kernels = {kid: self.kernels.get(kid, KernelGpu()) for kid in kernel_ids}
        for k in kernels.values():
            k.memory_mib, k.utilization, k.exact, k.known = 0.0, 0.0, True, True
        server_busy = False
        unknown: list[str] = []
        for kernel_id, p in owned:
            # a locked or suspended kernel does no GPU work: never busy, never unknown
            state = "idle" if self.hibernator.suspended(kernel_id or "") else self._state(p)
            server_busy = server_busy or state == "busy"
            if state == "unknown":
                unknown.append(
                    "GPU utilisation cannot be read here (MIG)"
                    if p.utilization is None
                    else "only the whole device's utilisation is known, and it is busy"
                )
            if kernel_id is None:
                continue
            k = kernels[kernel_id]
            k.memory_mib += p.memory_mib
            if p.utilization is None or k.utilization is None:
                k.utilization = None
            else:
                k.utilization = max(k.utilization, p.utilization)
            k.exact = k.exact and p.exact
            if state == "busy":
                k.last_gpu_activity = now
            if state != "idle":
                k.last_not_idle, k.known = now, k.known and state == "busy"
        # on a device shared with other pods, work this server cannot place is a neighbour's
        # where the driver lists the pod's own processes by their PID (neighbours.py)
        theirs = neighbours_work(os.environ, sample.driver, bool(self.own_pid_namespace))
        for p in self.unmatched:
            if self._state(p) != "idle" and theirs is None:
                unknown.append(f"GPU work by a process this server cannot match (pid {p.pid})")
        listed = {p.device for p in sample.processes}
        for d in sample.devices:
            if d.index in listed or theirs is not None:
                continue
            if d.utilization is not None and d.utilization >= self.busy_threshold:
                unknown.append(f"device {d.index} is busy but lists no process")
            elif d.utilization is None and d.memory_used_mib > self.unlisted_memory_mib:
                unknown.append(f"device {d.index} holds memory but lists no process")
        self.kernels = kernels
        self.unknown_reasons = unknown
        self.gpu_state = "busy" if server_busy else "unknown" if unknown else "idle"
        if server_busy:
            self.last_gpu_activity = now
            self.settings[SETTINGS_KEY] = now
        if self.gpu_state != "idle":
            self.last_not_idle = now

    def _kernel_state(self, kernel_id: str) -> tuple[str | None, datetime | None]:
        """Execution state and message activity, as GET /api/kernels has them (saves a request);
        a message sent to the kernel (seen by resume.py) counts as soon as it is sent, and a
        restore from hibernation when it is done: it serves a message that may have waited long
        for room, so the idle clock starts again there (never shut down or hibernated again as
        it comes back)."""
        km = self.settings.get("kernel_manager")
        try:
            kernel = km.get_kernel(kernel_id)
        except Exception:  # gone since the last reading (jupyter-server raises HTTPError 404)
            return None, None
        sleep = self.hibernator.kernels.get(kernel_id)
        times = [
            getattr(kernel, "last_activity", None),
            self.hibernator.last_message.get(kernel_id),
            sleep.last_resumed_at if sleep is not None else None,
        ]
        known = [t for t in times if isinstance(t, datetime)]
        return getattr(kernel, "execution_state", None), max(known) if known else None

    def _kernel_pid(self, kernel_id: str) -> int | None:
        """The kernel process's pid (jupyter_client's local provisioner), None if not known."""
        km = self.settings.get("kernel_manager")
        try:
            kernel = km.get_kernel(kernel_id)
        except Exception:
            return None
        pid = getattr(getattr(kernel, "provisioner", None), "pid", None) or getattr(
            kernel, "pid", None
        )
        return int(pid) if isinstance(pid, int) else None

    # --- the report ---------------------------------------------------------------------------
    def _utilization(self) -> float | None:
        """The server's share of the GPU: its processes' SM utilisation added up (None: unknown)."""
        utils = [p.utilization for _, p in self.processes]
        if any(u is None for u in utils):
            return None
        return round(min(100.0, sum(utils)), 1)

    def kernel_dues(
        self, user_last_activity: datetime | None
    ) -> list[tuple[str, KernelGpu, str | None, datetime | None, Deadline | None]]:
        """(id, GPU use, execution state, last message, when it is shut down) per live kernel.

        The one place the kernel rule is applied: the report's warnings and `cull_idle_kernels`
        both read it, so what the user is told is what happens."""
        live = self._kernel_ids()  # kernels shut down since the last reading are left out
        server_known = self.gpu_state != "unknown"
        out = []
        for kid in [k for k in self.hibernator.kernels if k not in live]:
            self.hibernator.forget(kid)  # shut down or gone: its state with it
        self._refused_present &= live  # and whether its refusal was logged
        for kid, k in sorted(self.kernels.items()):
            if kid not in live:
                continue
            execution_state, last_activity = self._kernel_state(kid)
            suspended = self.hibernator.suspended(kid)
            # a suspend under way (hibernate_idle_kernels runs beside the loop, the culler's
            # hibernate_now too) still holds its GPU memory: never shut down under the driver
            if self.kept_on_gpu(kid) or self.hibernator.suspending(kid):
                out.append((kid, k, execution_state, last_activity, None))
                continue
            due = kernel_deadline(
                self.pod.policy,
                # a hibernated kernel holds no GPU memory (its state is in host memory, which
                # the culler bounds per node): kept, never shut down for it, a resume that
                # waits for room included (issue 36, item 2); what it has on the GPU counts
                gpu_memory_mib=k.memory_mib,
                activity_known=suspended or (k.known and server_known),
                execution_state=execution_state,
                gpu_idle_since=k.last_not_idle or self.started,
                last_activity=last_activity,
                user_last_activity=user_last_activity,
            )
            out.append((kid, k, execution_state, last_activity, due))
        return out

    def _decided_at(self, now: datetime | None) -> datetime:
        """The moment a decision may take as now: no later than the latest GPU reading was
        taken (what it shows idle is not known to be idle after that)."""
        at = now or utcnow()
        return min(at, self.sample_taken) if self.sample_taken is not None else at

    async def hibernate_idle_kernels(self, now: datetime | None = None) -> list[str]:
        """Suspend the kernels idle for kernel_gpu_hibernate (hibernate.py); their ids.

        The same idle rule as the shut-down (GPU, messages and user idle; never while it
        executes or its GPU activity is unknown, never while its user is present), checked after
        each reading, for each kernel with the activity as it is just before suspending it: a
        suspend before it took time, and the user may have come back meanwhile. Each only
        while the loop keeps time (`loop_on_time`): a request that came while the server was
        held may not have been processed yet."""
        limit = self.pod.policy.kernel_gpu_hibernate
        if not self.hibernator.enabled or limit is None:
            return []
        if self.reason is not None or self.sample is None:
            return []
        done = []
        for kid in sorted(self.kernels):
            # readings go on while a kernel before it is suspended: each read as it is now
            if self.reason is not None:
                break
            k = self.kernels.get(kid)
            if k is None or k.memory_mib <= 0 or self.hibernator.suspended(kid):
                continue
            if kid in self._shutting_down:
                continue
            at = self._decided_at(now)
            execution_state, last_activity = self._kernel_state(kid)
            due = hibernate_deadline(
                self.pod.policy,
                gpu_memory_mib=k.memory_mib,
                activity_known=k.known and self.gpu_state != "unknown",
                execution_state=execution_state,
                gpu_idle_since=k.last_not_idle or self.started,
                last_activity=last_activity,
                user_last_activity=user_activity(self.settings, now),
            )
            if due is None or at < due.cull_at:
                continue
            if not self.loop_on_time():  # the loop's late rule, per kernel
                self.log.info(
                    "fracspawner: the monitor's loop is late: no more kernels hibernated this round"
                )
                break
            if await self._hibernate(kid, k.memory_mib, "idle") == "hibernated":
                done.append(kid)
        return done

    async def _hibernate(self, kid: str, memory_mib: float, why: str) -> str:
        """Ask the hibernator to suspend the kernel's own process (never a child's alone)."""
        assert self.sample is not None
        self.hibernator.device_indices = [d.index for d in self.sample.devices]
        pids = sorted({p.pid for owner, p in self.processes if owner == kid and p.pid})
        kernel_pid = self._kernel_pid(kid)
        if kernel_pid is None:  # the provisioner does not say: the process naming the kernel
            kernel_pid = next((p for p in pids if kernel_id_of(p) == kid), None)
        return await self.hibernator.hibernate(
            kid, pids, memory_mib, kernel_pid=kernel_pid, why=why
        )

    async def hibernate_now(self, kernel_id: str, reason: str) -> str:
        """Hibernate an idle kernel now, whatever its idle time: for the culler's request under
        GPU pressure (the answer to this server's report). Only a kernel holding GPU memory
        that is idle right now (no cell executing, its GPU reading idle and known) is suspended,
        with every safety of `Hibernator.hibernate`; returns its hibernation state ("hibernated",
        or "running" with the reason in `hibernator.kernel_json(kernel_id)`). Not while the
        loop is late (`loop_on_time`): what came while it was held may not be processed yet;
        nor while its person is present (presence.py), the culler's own rule checked now."""
        k = self.kernels.get(kernel_id)
        if self.hibernator.suspended(kernel_id):
            return self.hibernator.kernels[kernel_id].state
        if kernel_id in self._shutting_down:
            return "running"
        if not self.hibernator.enabled or self.sample is None or self.reason is not None:
            return "running"
        if not self.loop_on_time():
            # the loop was held: a cell sent meanwhile may not have reached the kernel yet (its
            # execution state still idle), nor the user's return the culler's order; refused as
            # a busy kernel is (the culler asks again, or another kernel)
            self.log.info(
                "fracspawner: the monitor's loop is late: kernel %s not swapped out now", kernel_id
            )
            return "running"
        if k is None or k.memory_mib <= 0 or kernel_id not in self._kernel_ids():
            return "running"
        execution_state, _last = self._kernel_state(kernel_id)
        gpu_idle = k.known and k.utilization is not None and k.utilization < self.busy_threshold
        if execution_state != "idle" or not gpu_idle or self.gpu_state == "unknown":
            return "running"
        presence = presence_of(self.settings)
        if presence is not None and presence.present():
            # the culler leaves present people out, but by a report up to an interval old: the
            # person may have sat down since. A refusal that may pass (`next_try`): the culler
            # asks another kernel meanwhile
            if kernel_id not in self._refused_present:
                self._refused_present.add(kernel_id)
                self.log.info(
                    "fracspawner: kernel %s not swapped out (%s): its user is at the server now",
                    kernel_id,
                    reason,
                )
            return self.hibernator.refuse(kernel_id, PRESENT_NOW)
        self._refused_present.discard(kernel_id)
        return await self._hibernate(kernel_id, k.memory_mib, reason)

    async def cull_idle_kernels(self, now: datetime | None = None) -> list[str]:
        """Shut down the kernels whose time has come (`kernel_dues`); their ids.

        Called in the server, after each reading: the kernel manager's shutdown stops watching
        the kernel's messages first, so this is not activity (no `last_activity` moves). Each
        kernel's deadline is computed again just before it is shut down: the shut-downs before
        it took time (seconds each), and its user may have come back meanwhile; and only while
        the loop keeps time (`loop_on_time`): the loop may have been held during the shut-down
        before it, a request that came then not processed yet."""
        if not self.cull_kernels or self.reason is not None or self.sample is None:
            return []
        if in_session(self.settings, now):  # a person is there: hibernate at most (presence.py)
            return []
        km = self.settings.get("kernel_manager")
        done = []
        first = self._decided_at(now)
        due_now = [
            kid
            for kid, _k, _s, _l, due in self.kernel_dues(user_activity(self.settings, now))
            if due is not None and first >= due.cull_at
        ]
        for kid in due_now:
            at = self._decided_at(now)
            current = {e[0]: e for e in self.kernel_dues(user_activity(self.settings, now))}
            if kid not in current:
                continue
            _, k, _state, _last, due = current[kid]
            if due is None or at < due.cull_at or in_session(self.settings, at):
                continue
            if not self.loop_on_time():  # held during a shut-down before it: the late rule
                self.log.info(
                    "fracspawner: the monitor's loop is late: no more kernels shut down this round"
                )
                break
            self.log.info(
                "fracspawner: shutting down kernel %s: it holds %.0f MiB of GPU memory and its "
                "GPU, messages and user have been idle since %s (kernel_gpu_idle %ss)",
                kid,
                k.memory_mib,
                isoformat(due.idle_since),
                int(due.limit),
            )
            self._shutting_down.add(kid)
            try:
                await km.shutdown_kernel(kid)
            except Exception as exc:  # gone already, or failing: try again next reading
                self.log.warning("fracspawner: shutting down kernel %s failed: %s", kid, exc)
                continue
            finally:
                self._shutting_down.discard(kid)
            done.append(kid)
            self.hibernator.forget(kid)
            stamp = now or utcnow()
            self.culled = [
                *self.culled[-49:],
                {"id": kid, "at": isoformat(stamp), "gpu_memory_mib": round(k.memory_mib, 1)},
            ]
        return done

    def on_culler_answer(self, answer: Any, now: datetime | None = None) -> None:
        """The culler's answer to this server's report: `{"gpu": {"free_mib": n}}` where its
        pod's NVML shows only its slice (HAMi-core), what its GPUs have free by the culler's
        count."""
        word = answer.get("gpu") if isinstance(answer, dict) else None
        mib = word.get("free_mib") if isinstance(word, dict) else None
        if isinstance(mib, int | float) and not isinstance(mib, bool) and mib >= 0:
            self.culler_free = (float(mib), now or utcnow())

    def _device_free(self, sample: GpuSample, now: datetime) -> tuple[float | None, str | None]:
        """What this server's devices have free, and by whose reading, where other pods share
        them (an allocation beyond it fails with CUDA out of memory, whatever the slice has
        left): the devices' own NVML where the pod reads them whole; the culler's count where
        HAMi-core shows the pod its slice, while its last word is fresh; (None, None)
        elsewhere (a whole GPU, a MIG instance: nobody else's memory there)."""
        if self.pod.shares_device and sample.devices:
            free = sum(max(0.0, d.memory_total_mib - d.memory_used_mib) for d in sample.devices)
            return free, "nvml"
        told = self.culler_free
        # counts_hibernated is set where HAMi-core virtualises the pod's NVML (__init__)
        if self.pod.counts_hibernated and told is not None:
            if 0 <= (now - told[1]).total_seconds() <= CULLER_FREE_FRESH_S:
                return told[0], "culler"
        return None, None

    def report(
        self,
        server_last_activity: datetime | None = None,
        user_last_activity: datetime | None = None,
        now: datetime | None = None,
    ) -> dict:
        now = now or utcnow()
        presence = presence_json(self.settings, now)
        present = bool(presence and presence["present"])
        # in session (a hidden tab of a person seen lately): no kernel is shut down either
        session = present or bool(presence and presence.get("in_session"))
        activity = {
            "monitor_started": isoformat(self.started),
            # whether a person is at the server (presence.py): the culler keeps a present
            # user's server, and trusts these activity times (the polling left out) where known
            "presence": presence,
            "server_last_activity": isoformat(server_last_activity),
            "user_last_activity": isoformat(user_last_activity),
            "culled_kernels": list(self.culled),
            "hibernated_gpu_memory_mib": self.hibernator.total_mib(),
            "hibernation": self.hibernator.summary(self.pod.policy.kernel_gpu_hibernate),
        }
        if self.reason is not None or self.sample is None:
            return {
                "available": False,
                "reason": self.reason or "no GPU reading yet",
                **activity,
                "slice": self.pod.slice_json(),
                "policy": self.pod.policy.as_json(),
            }
        sample = self.sample
        device = sample.devices[0].name if sample.devices else None
        free, free_by = self._device_free(sample, now)
        kernels = []
        warnings = []
        for kid, k, execution_state, last_activity, due in self.kernel_dues(user_last_activity):
            kernels.append(
                {
                    "id": kid,
                    "execution_state": execution_state,
                    "last_activity": isoformat(last_activity),
                    "gpu_memory_mib": round(k.memory_mib, 1),
                    "gpu_utilization": k.utilization,
                    "gpu_activity_known": k.known,
                    "last_gpu_activity": isoformat(k.last_gpu_activity),
                    "idle_since": isoformat(due.idle_since) if due else None,
                    "cull_at": isoformat(due.cull_at) if due else None,
                    "hibernation": self.hibernator.kernel_json(kid),
                }
            )
            # nothing to warn a present person of: nothing is shut down while they stay
            if due is not None and due.warns(now) and not session:
                warnings.append(self._warning("kernel", due, now, k.memory_mib, kernel_id=kid))
        unattributed = round(sum(p.memory_mib for p in self.unmatched), 1)
        memory = round(sum(p.memory_mib for _, p in self.processes) + unattributed, 1)
        known = self.gpu_state != "unknown"
        gpu_idle_since = self.last_not_idle or self.started
        # the culler's view of this server (decide.py server_deadlines), from this report: it
        # holds a GPU by its slice or the GPU memory reported, its history began with the monitor
        server_due = server_deadline(
            self.pod.policy,
            holds_gpu=self.pod.gpu is not None or memory > 0,
            gpu_idle_since=gpu_idle_since,
            last_activity=server_last_activity,
            observed_at=self.sampled_at or now,
            gpu_known=known,
            user_last_activity=user_last_activity,
            watched_since=self.started,
            started=self.pod.started,
            present=session,  # the culler keeps a server in session as a present one
        )
        if server_due is not None and server_due.warns(now):
            warnings.append(self._warning("server", server_due, now, memory))
        return {
            "available": True,
            "source": sample.source,
            "sampled_at": isoformat(self.sampled_at),
            **activity,
            "poll_interval": self.poll_interval,
            "busy_threshold": self.busy_threshold,
            "devices": [
                {
                    "index": d.index,
                    "name": d.name,
                    "uuid": d.uuid,
                    "memory_total_mib": round(d.memory_total_mib, 1),
                    "memory_used_mib": round(d.memory_used_mib, 1),
                    "utilization": d.utilization,
                }
                for d in sample.devices
            ],
            "entitlement": {"memory_mib": self.memory_entitlement_mib},
            "slice": self.pod.slice_json(device=device),
            "policy": self.pod.policy.as_json(),
            "gpu_memory_mib": memory,
            "device_free_mib": None if free is None else round(free, 1),
            "device_free_by": free_by,
            "gpu_utilization": self._utilization(),
            "last_gpu_activity": isoformat(self.last_gpu_activity),
            # the server as a whole: unknown is never idle; the idle clock starts after the last
            # reading that was busy or unknown
            "gpu_state": self.gpu_state,
            "gpu_activity_known": known,
            "gpu_unknown_reasons": sorted(set(self.unknown_reasons)),
            "gpu_idle_since": isoformat(gpu_idle_since) if known else None,
            "unattributed_gpu_memory_mib": unattributed,
            "server_idle": {
                "idle_since": isoformat(server_due.idle_since) if server_due else None,
                "cull_at": isoformat(server_due.cull_at) if server_due else None,
                "reason": server_due.reason if server_due else None,
            },
            "kernels": kernels,
            "warnings": warnings,
            "processes": [
                {
                    "pid": p.pid,
                    "kernel_id": kid,
                    "device": p.device,
                    "gpu_memory_mib": round(p.memory_mib, 1),
                    "gpu_utilization": p.utilization,
                    "matched": True,
                }
                for kid, p in self.processes
            ]
            + [
                {
                    "pid": p.pid,
                    "kernel_id": None,
                    "device": p.device,
                    "gpu_memory_mib": round(p.memory_mib, 1),
                    "gpu_utilization": p.utilization,
                    "matched": False,
                }
                for p in self.unmatched
            ],
        }

    @staticmethod
    def _warning(
        scope: str, due: Deadline, now: datetime, memory_mib: float, kernel_id: str | None = None
    ) -> dict:
        """One coming cull, for the user: what, since when, and when (the meter words it)."""
        warning = {
            "scope": scope,  # "kernel": shut down, the server stays; "server": stopped
            "gpu_memory_mib": round(memory_mib, 1),
            "idle_since": isoformat(due.idle_since),
            "idle_seconds": round(max(0.0, (now - due.idle_since).total_seconds())),
            "limit_seconds": due.limit,
            "cull_at": isoformat(due.cull_at),
        }
        if kernel_id is not None:
            warning["kernel_id"] = kernel_id
        if due.reason:  # the culler's rule: "max_age", "unattended", "gpu_idle" or "idle"
            warning["reason"] = due.reason
        return warning
