"""Sample the GPU every few seconds and keep, per kernel and for the server, when it was last busy.

While any of this server's GPU processes is busy the monitor writes
`settings["fracspawner_gpu_last_activity"]`: jupyter-server's `ServerApp.last_activity()` takes
the max of every settings key ending in `_last_activity`, so the server's own activity, what it
reports to JupyterHub, and any culler reading either, count GPU work as activity.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from traitlets import Float, Integer, Unicode, default
from traitlets.config import LoggingConfigurable

from .podinfo import Deadline, PodInfo, kernel_deadline, server_deadline
from .procmap import owner_of
from .sources import GpuSample, GpuSource, GpuUnavailable, make_source

SETTINGS_KEY = "fracspawner_gpu_last_activity"


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def isoformat(dt: datetime | None) -> str | None:
    return None if dt is None else dt.isoformat().replace("+00:00", "Z")


@dataclass
class KernelGpu:
    memory_mib: float = 0.0
    utilization: float | None = 0.0
    last_gpu_activity: datetime | None = None


def attribute(
    sample: GpuSample,
    kernel_ids: set[str],
    server_pid: int,
    proc: Path = Path("/proc"),
) -> list[tuple[str | None, Any]]:
    """(kernel id or None, process) for each of the server's processes in the sample.

    A process is the server's when its kernel is one of the server's kernels or when the server
    process is among its ancestors (a terminal's python, a kernel's child). Others' processes on
    a shared GPU are left out: they must not keep this server alive.
    """
    owned = []
    for p in sample.processes:
        if p.kernel_id is not None:  # simulated by kernel id
            if p.kernel_id in kernel_ids:
                owned.append((p.kernel_id, p))
            continue
        if p.pid is None:
            continue
        owner = owner_of(p.pid, proc)
        if owner.kernel_id in kernel_ids:
            owned.append((owner.kernel_id, p))
        elif server_pid in owner.ancestors:
            owned.append((None, p))
    return owned


class GpuMonitor(LoggingConfigurable):
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
        self.kernels: dict[str, KernelGpu] = {}
        self.processes: list[tuple[str | None, Any]] = []
        self.last_gpu_activity: datetime | None = None
        self._task: asyncio.Task | None = None
        # the slice and the culler's idle policy, as FracSpawner put them in the environment
        self.pod = PodInfo.from_environ(os.environ, memory_mib=self.memory_entitlement_mib)
        try:
            self.source = make_source(self.source_spec)
        except ValueError as exc:
            self.reason = str(exc)
        if self.source is None and self.reason is None:
            self.reason = "GPU reading is turned off (source 'none')"

    # --- the loop -----------------------------------------------------------------------------
    def start(self) -> None:
        if self.source is not None and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        if self.source is not None:
            self.source.close()

    async def _run(self) -> None:
        while True:
            delay = self.poll_interval
            try:
                await self.poll_once()
            except Exception:  # one bad reading must not end monitoring for the server's life
                self.log.exception("fracspawner: GPU reading failed")
            if self.reason is not None:
                delay = max(delay, self.unavailable_retry)
            await asyncio.sleep(delay)

    def _kernel_ids(self) -> set[str]:
        km = self.settings.get("kernel_manager")
        return set(km.list_kernel_ids()) if km is not None else set()

    async def poll_once(self) -> None:
        """Take one reading (off the event loop: NVML and /proc reads block) and apply it."""
        assert self.source is not None
        kernel_ids = self._kernel_ids()
        try:
            sample = await asyncio.to_thread(self.source.sample)
            owned = await asyncio.to_thread(attribute, sample, kernel_ids, self.server_pid)
        except GpuUnavailable as exc:
            if self.reason != str(exc):
                self.log.info("fracspawner: no GPU to read: %s", exc)
            self.reason = str(exc)
            return
        self.reason = None
        self.apply(sample, owned, kernel_ids, utcnow())

    def apply(self, sample: GpuSample, owned: list, kernel_ids: set[str], now: datetime) -> None:
        """Fold one reading into the per-kernel and server state."""
        self.sample, self.sampled_at, self.processes = sample, now, owned
        kernels = {kid: self.kernels.get(kid, KernelGpu()) for kid in kernel_ids}
        for k in kernels.values():
            k.memory_mib, k.utilization = 0.0, 0.0
        server_busy = False
        for kernel_id, p in owned:
            # unknown utilisation (MIG instances cannot report it) is neither busy nor idle: the
            # kernel is marked unknown so the culler leaves it alone, and the server's activity
            # is not touched (which would keep it alive for ever)
            busy = p.utilization is not None and p.utilization >= self.busy_threshold
            server_busy = server_busy or busy
            if kernel_id is None:
                continue
            k = kernels[kernel_id]
            k.memory_mib += p.memory_mib
            if p.utilization is None or k.utilization is None:
                k.utilization = None
            else:
                k.utilization = max(k.utilization, p.utilization)
            if busy:
                k.last_gpu_activity = now
        self.kernels = kernels
        if server_busy:
            self.last_gpu_activity = now
            self.settings[SETTINGS_KEY] = now

    def _kernel_state(self, kernel_id: str) -> tuple[str | None, datetime | None]:
        """Execution state and message activity, as GET /api/kernels has them (saves a request)."""
        km = self.settings.get("kernel_manager")
        try:
            kernel = km.get_kernel(kernel_id)
        except Exception:  # gone since the last reading (jupyter-server raises HTTPError 404)
            return None, None
        return getattr(kernel, "execution_state", None), getattr(kernel, "last_activity", None)

    # --- the report ---------------------------------------------------------------------------
    def _utilization(self) -> float | None:
        """The server's share of the GPU: its processes' SM utilisation added up (None: unknown)."""
        utils = [p.utilization for _, p in self.processes]
        if any(u is None for u in utils):
            return None
        return round(min(100.0, sum(utils)), 1)

    def report(self, server_last_activity: datetime | None = None) -> dict:
        if self.reason is not None or self.sample is None:
            return {
                "available": False,
                "reason": self.reason or "no GPU reading yet",
                "server_last_activity": isoformat(server_last_activity),
                "slice": self.pod.slice_json(),
                "policy": self.pod.policy.as_json(),
            }
        sample = self.sample
        now = utcnow()
        live = self._kernel_ids()  # kernels shut down since the last reading are left out
        device = sample.devices[0].name if sample.devices else None
        kernels = []
        warnings = []
        for kid, k in sorted(self.kernels.items()):
            if kid not in live:
                continue
            execution_state, last_activity = self._kernel_state(kid)
            due = kernel_deadline(
                self.pod.policy,
                gpu_memory_mib=k.memory_mib,
                activity_known=k.utilization is not None,
                execution_state=execution_state,
                gpu_idle_since=k.last_gpu_activity or self.started,
                last_activity=last_activity,
            )
            kernels.append(
                {
                    "id": kid,
                    "execution_state": execution_state,
                    "last_activity": isoformat(last_activity),
                    "gpu_memory_mib": round(k.memory_mib, 1),
                    "gpu_utilization": k.utilization,
                    "gpu_activity_known": k.utilization is not None,
                    "last_gpu_activity": isoformat(k.last_gpu_activity),
                    "idle_since": isoformat(due.idle_since) if due else None,
                    "cull_at": isoformat(due.cull_at) if due else None,
                }
            )
            if due is not None and due.warns(now):
                warnings.append(self._warning("kernel", due, now, k.memory_mib, kernel_id=kid))
        memory = round(sum(p.memory_mib for _, p in self.processes), 1)
        server_due = server_deadline(
            self.pod.policy,
            holds_gpu=self.pod.gpu is not None or memory > 0,
            gpu_idle_since=self.last_gpu_activity or self.started,
            last_activity=server_last_activity,
        )
        if server_due is not None and server_due.warns(now):
            warnings.append(self._warning("server", server_due, now, memory))
        return {
            "available": True,
            "source": sample.source,
            "sampled_at": isoformat(self.sampled_at),
            "monitor_started": isoformat(self.started),
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
            "gpu_utilization": self._utilization(),
            "last_gpu_activity": isoformat(self.last_gpu_activity),
            "server_last_activity": isoformat(server_last_activity),
            "server_idle": {
                "idle_since": isoformat(server_due.idle_since) if server_due else None,
                "cull_at": isoformat(server_due.cull_at) if server_due else None,
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
                }
                for kid, p in self.processes
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
        return warning
