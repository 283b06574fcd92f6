"""What the pod says about itself: the GPU slice and the idle policy, from the environment.

FracSpawner puts these in the notebook's environment (see docs/serverext.md for the names); the
monitor adds them to its report so the JupyterLab meter can show the slice and warn before the
culler acts. Everything here is pure apart from reading the environment in `from_environ`.

The deadlines are the rules themselves: a kernel holding GPU memory is shut down BY THIS SERVER
(`kernel_deadline`) once its GPU, its messages and its user have been idle for
`kernel_gpu_idle`; the culler stops the server at the moments of fracspawner/culler/decide.py
`server_deadlines` (`server_deadline` is this package's copy: it may not import the culler;
tests/test_serverext_deadline_agrees.py holds the two together). The culler acts on its next
cycle after that time, never before.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from fractions import Fraction
from typing import Any

ENV_SLICE = "FRACSPAWNER_GPU_SLICE"
ENV_POOL = "FRACSPAWNER_GPU_POOL"
ENV_POOL_DISPLAY = "FRACSPAWNER_GPU_POOL_DISPLAY"
ENV_MEMORY = "FRACSPAWNER_GPU_MEMORY_MIB"
ENV_KERNEL_GPU_IDLE = "FRACSPAWNER_KERNEL_GPU_IDLE_SECONDS"
ENV_KERNEL_GPU_HIBERNATE = "FRACSPAWNER_KERNEL_GPU_HIBERNATE_SECONDS"
ENV_SERVER_GPU_IDLE = "FRACSPAWNER_SERVER_GPU_IDLE_SECONDS"
ENV_SERVER_IDLE = "FRACSPAWNER_SERVER_IDLE_SECONDS"
ENV_WARN = "FRACSPAWNER_GPU_IDLE_WARN_SECONDS"
ENV_SERVER_UNATTENDED = "FRACSPAWNER_SERVER_UNATTENDED_SECONDS"
ENV_MAX_AGE = "FRACSPAWNER_MAX_AGE_SECONDS"
# when the hub started this server (ISO 8601): max_age counts from it, not from this process
ENV_SERVER_STARTED = "FRACSPAWNER_SERVER_STARTED"

NO_GPU = {"", "none", "0", "no"}
DEFAULT_WARN = 600.0  # warn this long before the culler may act (at most a third of the limit)

_MIG = re.compile(r"^(?:mig-)?(\d+g\.\d+gb(?:\+me)?)$")
_MEMORY = re.compile(r"^(\d+(?:\.\d+)?)\s*(gib|gi|gb|g|mib|mi|mb|m)$")


def seconds(value: str | None) -> float | None:
    """A limit in seconds from the environment: absent, empty, '0' or unparsable = off."""
    try:
        number = float((value or "").strip())
    except ValueError:
        return None
    return number if number > 0 else None


def instant(value: str | None) -> datetime | None:
    """An ISO 8601 time from the environment (UTC where it names no zone); None if unparsable."""
    try:
        dt = datetime.fromisoformat((value or "").strip())
    except ValueError:
        return None
    return dt if dt.tzinfo is not None else dt.replace(tzinfo=timezone.utc)


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def isoformat(dt: datetime | None) -> str | None:
    """A time as the report writes it: ISO 8601 with 'Z' for UTC."""
    return None if dt is None else dt.isoformat().replace("+00:00", "Z")


def gib(mib: float) -> str:
    """`20480` -> '20 GiB', `9728` -> '9.5 GiB', `512` -> '512 MiB'."""
    if mib < 1024:
        return f"{mib:.0f} MiB"
    value = mib / 1024
    return f"{value:.0f} GiB" if abs(value - round(value)) < 0.05 else f"{value:.1f} GiB"


@dataclass(frozen=True)
class GpuSlice:
    spec: str  # as the spawner wrote it
    kind: str  # "fraction" | "memory" | "mig" | "whole" | "unknown"
    text: str  # '1/4', '10 GiB', 'MIG 1g.10gb', '2', or the spec as is


def parse_slice(spec: str | None) -> GpuSlice | None:
    """The slice in words; None for no GPU. Accepts every form of the `gpu` option."""
    raw = (spec or "").strip()
    lower = raw.lower()
    if lower in NO_GPU:
        return None
    if m := _MIG.match(lower):
        return GpuSlice(raw, "mig", f"MIG {m.group(1)}")
    if m := _MEMORY.match(lower):
        amount = float(m.group(1)) * (1 if m.group(2).startswith("m") else 1024)
        return GpuSlice(raw, "memory", gib(amount))
    try:
        value = Fraction(lower)
    except (ValueError, ZeroDivisionError):
        return GpuSlice(raw, "unknown", raw)
    if value <= 0:
        return None
    if value.denominator == 1:
        return GpuSlice(raw, "whole", str(value.numerator))
    value = value.limit_denominator(64)
    return GpuSlice(raw, "fraction", f"{value.numerator}/{value.denominator}")


def slice_label(
    gpu: GpuSlice | None, pool: str | None, memory_mib: int | None, device: str | None = None
) -> str | None:
    """'1/4 H100 · 20 GiB', 'H100 · 10 GiB', 'A100 MIG 1g.10gb', '2 × H100 · 160 GiB'."""
    where = pool or device
    memory = f" · {gib(memory_mib)}" if memory_mib else ""
    if gpu is None:
        return f"{where}{memory}" if where else None
    where = where or "GPU"
    if gpu.kind == "fraction":
        return f"{gpu.text} {where}{memory}"
    if gpu.kind == "memory":
        return f"{where} · {gpu.text}"
    if gpu.kind == "mig":
        return f"{where} {gpu.text}"
    if gpu.kind == "whole":
        count = "" if gpu.text == "1" else f"{gpu.text} × "
        return f"{count}{where}{memory}"
    return f"{gpu.text} {where}{memory}"


@dataclass(frozen=True)
class IdlePolicy:
    """The culler's limits for this server (seconds; None = off or not told)."""

    kernel_gpu_idle: float | None = None
    server_gpu_idle: float | None = None
    server_idle: float | None = None
    warn_before: float | None = None  # None: DEFAULT_WARN, at most a third of the limit
    server_unattended: float | None = None  # no user activity (GPU work aside) this long
    kernel_gpu_hibernate: float | None = None  # suspend an idle GPU kernel's CUDA state
    max_age: float | None = None  # the culler stops servers this old, busy or not

    def warning_lead(self, limit: float) -> float:
        if self.warn_before is not None:
            return min(self.warn_before, limit)
        return min(DEFAULT_WARN, limit / 3)

    def as_json(self) -> dict:
        return {
            "kernel_gpu_idle": self.kernel_gpu_idle,
            "server_gpu_idle": self.server_gpu_idle,
            "server_idle": self.server_idle,
            "server_unattended": self.server_unattended,
            "warn_before": self.warn_before,
            "kernel_gpu_hibernate": self.kernel_gpu_hibernate,
            "max_age": self.max_age,
        }


@dataclass(frozen=True)
class PodInfo:
    gpu: GpuSlice | None
    pool: str | None
    pool_display: str | None
    memory_mib: int | None
    policy: IdlePolicy
    started: datetime | None = None  # when the hub started this server (None: not told)
    # the slice's limit still counts a hibernated kernel's memory (HAMi-core: its count moves
    # only in its allocation hooks and when a process exits, and cuda-checkpoint frees memory
    # through none of them; docs/culler.md): the meter says so (monitor.py sets it)
    counts_hibernated: bool = False
    # its device is shared with other pods and its NVML reads the whole device (a fraction of a
    # GPU by time-slicing, MPS or over-commit; not HAMi-core's virtualised view, not a MIG
    # instance): what the device has free may be less than what is left of the slice
    shares_device: bool = False

    @classmethod
    def from_environ(cls, env: Mapping[str, str], memory_mib: int | None = None) -> PodInfo:
        def text(name: str) -> str | None:
            return (env.get(name) or "").strip() or None

        if memory_mib is None:
            raw = text(ENV_MEMORY) or ""
            memory_mib = int(raw) if raw.isdigit() and int(raw) > 0 else None
        return cls(
            gpu=parse_slice(env.get(ENV_SLICE)),
            pool=text(ENV_POOL),
            pool_display=text(ENV_POOL_DISPLAY),
            memory_mib=memory_mib,
            policy=IdlePolicy(
                kernel_gpu_idle=seconds(env.get(ENV_KERNEL_GPU_IDLE)),
                server_gpu_idle=seconds(env.get(ENV_SERVER_GPU_IDLE)),
                server_idle=seconds(env.get(ENV_SERVER_IDLE)),
                server_unattended=seconds(env.get(ENV_SERVER_UNATTENDED)),
                kernel_gpu_hibernate=seconds(env.get(ENV_KERNEL_GPU_HIBERNATE)),
                max_age=seconds(env.get(ENV_MAX_AGE)),
                warn_before=(
                    None if text(ENV_WARN) is None else max(0.0, seconds(env[ENV_WARN]) or 0.0)
                ),
            ),
            started=instant(env.get(ENV_SERVER_STARTED)),
        )

    def slice_json(self, device: str | None = None) -> dict:
        return {
            "spec": self.gpu.spec if self.gpu else None,
            "kind": self.gpu.kind if self.gpu else None,
            "text": self.gpu.text if self.gpu else None,
            "pool": self.pool,
            "pool_display": self.pool_display,
            "memory_mib": self.memory_mib,
            "label": slice_label(self.gpu, self.pool_display or self.pool, self.memory_mib, device),
            "counts_hibernated": self.counts_hibernated,
            "shares_device": self.shares_device,
        }


@dataclass(frozen=True)
class Deadline:
    idle_since: datetime
    cull_at: datetime
    warn_at: datetime
    limit: float
    # the server's: the culler's rule (decide.py server_deadlines' reasons): "max_age",
    # "unattended", "gpu_idle" or "idle"
    reason: str = ""

    def warns(self, now: datetime) -> bool:
        return now >= self.warn_at


def deadline(
    policy: IdlePolicy, limit: float | None, idle_since: datetime, reason: str = ""
) -> Deadline | None:
    if limit is None:
        return None
    cull_at = idle_since + timedelta(seconds=limit)
    return Deadline(
        idle_since=idle_since,
        cull_at=cull_at,
        warn_at=cull_at - timedelta(seconds=policy.warning_lead(limit)),
        limit=limit,
        reason=reason,
    )


def kernel_deadline(
    policy: IdlePolicy,
    *,
    gpu_memory_mib: float,
    activity_known: bool,
    execution_state: str | None,
    gpu_idle_since: datetime,
    last_activity: datetime | None,
    user_last_activity: datetime | None = None,
    hibernate: bool = False,
) -> Deadline | None:
    """When this server shuts the kernel down (fracspawner.serverext.kernels); None = never.

    A kernel holding GPU memory goes once its GPU, its messages AND its user (any activity on
    the server but GPU work) have all been idle for kernel_gpu_idle: never while the user works
    on the server, never while it executes code, never while its GPU activity is unknown.
    `hibernate`: the same rule at the first rung's limit, kernel_gpu_hibernate."""
    if gpu_memory_mib <= 0 or not activity_known or execution_state == "busy":
        return None
    times = (gpu_idle_since, last_activity, user_last_activity)
    since = max(t for t in times if t is not None)
    limit = policy.kernel_gpu_hibernate if hibernate else policy.kernel_gpu_idle
    return deadline(policy, limit, since)


def hibernate_deadline(policy: IdlePolicy, **kernel: Any) -> Deadline | None:
    """When this server suspends the kernel's CUDA state (kernel_gpu_hibernate); None = never.

    The same idle rule as `kernel_deadline` (GPU, messages and user all idle; never while it
    executes or its activity is unknown), with the first rung's limit."""
    return kernel_deadline(policy, hibernate=True, **kernel)


def server_deadline(
    policy: IdlePolicy,
    *,
    holds_gpu: bool,
    gpu_idle_since: datetime,
    last_activity: datetime | None,
    observed_at: datetime,
    gpu_known: bool = True,
    user_last_activity: datetime | None = None,
    watched_since: datetime | None = None,
    started: datetime | None = None,
    present: bool = False,
) -> Deadline | None:
    """When the culler stops this server if nothing changes (nobody uses it, its GPU does no
    more work); None = never. The earliest of fracspawner/culler/decide.py `server_deadlines`,
    from what this server reports to the culler: its activity, the GPU idle since
    `gpu_idle_since` as of `observed_at` (its GPU history reaching back to `watched_since`), and
    the hub's start time `started` (FRACSPAWNER_SERVER_STARTED; None: max_age is not known).
    `present`: a person is at a tab of this server (presence.py): only max_age stops it.
    Keep it in step with decide.py: tests/test_serverext_deadline_agrees.py."""
    if present:
        due = deadline(policy, policy.max_age, started, "max_age") if started else None
        return due
    last = last_activity or started
    user_last = _user_last(user_last_activity, last_activity, started)
    due = [
        deadline(policy, policy.max_age, started, "max_age") if started else None,
        deadline(policy, policy.server_unattended, user_last, "unattended") if user_last else None,
    ]
    if last is not None:
        due += _gpu_deadlines(
            policy, holds_gpu, gpu_known, gpu_idle_since, last, observed_at, watched_since
        )
    found = [d for d in due if d is not None]
    # at a tie the rule listed first, as decide_server checks them
    return min(found, key=lambda d: d.cull_at) if found else None


def _user_last(
    user_last: datetime | None, last: datetime | None, started: datetime | None
) -> datetime | None:
    """The user's last activity as the culler takes it (decide.py ServerFacts.user_activity):
    never before the server started; without a word from the server, its activity."""
    if user_last is not None:
        return max(user_last, started or user_last)
    return last if last is not None else started


def _gpu_deadlines(
    policy: IdlePolicy,
    holds_gpu: bool,
    gpu_known: bool,
    gpu_idle_since: datetime,
    last: datetime,
    observed_at: datetime,
    watched_since: datetime | None,
) -> list[Deadline | None]:
    """The idle rules of decide.py `server_deadlines`, in its order."""
    if not holds_gpu or not gpu_known:
        # no GPU held, or its activity unknown: the plain idle timeout only
        return [deadline(policy, policy.server_idle, last, "idle")]
    gpu_window = policy.server_gpu_idle
    window = gpu_window if gpu_window is not None else policy.server_idle
    if window is None:
        return []
    reason = "gpu_idle" if gpu_window is not None else "idle"
    idle_for = max(0.0, (observed_at - gpu_idle_since).total_seconds())
    if idle_for >= window:
        return [deadline(policy, window, last, reason)]
    # until then a GPU seen busy keeps the server; a history too short to tell (never seen
    # busy since watching began) leaves the plain idle timeout while the window is not covered
    window_at = gpu_idle_since + timedelta(seconds=window)
    busy_seen = watched_since is None or gpu_idle_since > watched_since
    due: list[Deadline | None] = []
    if not busy_seen and policy.server_idle is not None:
        plain = deadline(policy, policy.server_idle, last, "idle")
        if plain is not None and (plain.cull_at <= observed_at or plain.cull_at < window_at):
            due.append(plain)
    due.append(deadline(policy, window, max(gpu_idle_since, last), reason))
    return due
