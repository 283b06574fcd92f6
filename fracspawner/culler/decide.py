"""The culling decision: a pure function of facts, policy and the time. No I/O here.

Everything the culler knows about a server arrives as plain data (`ServerFacts`, `GpuFacts`,
`KernelFacts`); the policy is the catalog's `IdlePolicy` (any object with the four attributes).
The rules, in order:

- servers that are not ready, exempt or excluded (default/named) are kept;
- `max_age`: servers older than this are stopped, busy or not (as jupyterhub-idle-culler does);
- GPU busy within the window that applies = active, whatever the message activity says;
- a server holding a GPU (a slice in its user_options, or GPU memory in use) idle past
  `server_gpu_idle` is stopped, but only on FRESH GPU data: with none (source down, no series,
  stale), the server is never culled on GPU grounds and only `server_idle` applies;
- any server idle past `server_idle` is stopped;
- a kernel holding GPU memory whose GPU and messages were both idle past `kernel_gpu_idle` is
  shut down (its server and the user's files stay); unknown GPU activity keeps it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

NO_GPU = {"", "none", "0", "no"}


class Policy(Protocol):
    kernel_gpu_idle: float | None
    server_gpu_idle: float | None
    server_idle: float | None
    max_age: float | None


@dataclass(frozen=True)
class ServerFacts:
    user: str
    name: str = ""  # "" is the default server
    user_options: dict = field(default_factory=dict, hash=False, compare=False)
    started: float | None = None  # unix seconds
    last_activity: float | None = None  # as the hub knows it
    ready: bool = True
    pending: str | None = None
    groups: tuple[str, ...] = ()

    @property
    def pool(self) -> str | None:
        return self.user_options.get("pool") or None

    @property
    def gpu_slice(self) -> str | None:
        """The GPU slice asked for at spawn (CONTRACT: user_options["gpu"]), or None."""
        spec = str(self.user_options.get("gpu") or "").strip().lower()
        return None if spec in NO_GPU else spec

    @property
    def log_name(self) -> str:
        return f"{self.user}/{self.name}" if self.name else self.user


@dataclass(frozen=True)
class GpuFacts:
    """What GPU sources saw of one server, as of `observed_at` (unix seconds)."""

    source: str  # "prometheus", "extension" or "prometheus+extension"
    observed_at: float
    memory_mib: float  # GPU memory the server's processes hold
    # seconds the GPU was seen continuously idle, ending at observed_at (0: busy just now).
    # A lower bound: Prometheus can only say "idle over the whole window w", giving w.
    idle_for: float
    # the server's own last activity (from the extension), unaffected by the culler's requests
    # through the proxy, which do refresh the hub's value
    server_last_activity: float | None = None
    # how far back the data reaches. idle_for < covered_for: busy was SEEN idle_for ago;
    # idle_for == covered_for: no busy sample, but too little history to say more (a gap,
    # a young series), which counts as missing data. None: unbounded.
    covered_for: float | None = None

    @property
    def busy_seen(self) -> bool:
        return self.covered_for is None or self.idle_for < self.covered_for


@dataclass(frozen=True)
class KernelFacts:
    id: str
    last_activity: float | None  # last kernel message (jupyter-server's kernel.last_activity)
    execution_state: str
    gpu_memory_mib: float
    gpu_idle_for: float | None  # None: utilisation unknown (MIG) or no reading


@dataclass(frozen=True)
class Rules:
    """Culler-wide settings that are not part of a pool's idle policy."""

    max_staleness: float = 300.0  # GPU data older than this is treated as missing
    exempt_users: frozenset[str] = frozenset()
    exempt_groups: frozenset[str] = frozenset()
    cull_default_servers: bool = True
    cull_named_servers: bool = True
    cull_busy_kernels: bool = False  # like jupyter-server's MappingKernelManager.cull_busy


@dataclass(frozen=True)
class Decision:
    action: Literal["keep", "stop", "shutdown"]
    reason: str  # short code, used as the metrics label
    message: str  # one sentence for the log
    gpu_failsafe: bool = False  # GPU rules were skipped because GPU data was missing or stale

    @property
    def cull(self) -> bool:
        return self.action != "keep"


def fmt(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    s = int(max(seconds, 0))
    return f"{s // 3600:d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def gpu_fresh(gpu: GpuFacts | None, now: float, rules: Rules) -> bool:
    return gpu is not None and now - gpu.observed_at <= rules.max_staleness


def decide_server(
    server: ServerFacts,
    gpu: GpuFacts | None,
    policy: Policy,
    now: float,
    rules: Rules = Rules(),
) -> Decision:
    if server.pending or not server.ready:
        return Decision("keep", "not_ready", f"not ready (pending: {server.pending})")
    if server.user in rules.exempt_users:
        return Decision("keep", "exempt", f"user {server.user} is exempt")
    exempt_groups = rules.exempt_groups.intersection(server.groups)
    if exempt_groups:
        return Decision("keep", "exempt", f"group {sorted(exempt_groups)[0]} is exempt")
    if server.name and not rules.cull_named_servers:
        return Decision("keep", "excluded", "named servers are not culled")
    if not server.name and not rules.cull_default_servers:
        return Decision("keep", "excluded", "default servers are not culled")

    age = None if server.started is None else now - server.started
    if policy.max_age and age is not None and age >= policy.max_age:
        return Decision("stop", "max_age", f"age {fmt(age)} >= max_age {fmt(policy.max_age)}")

    fresh = gpu_fresh(gpu, now, rules)
    last = server.last_activity
    if fresh and gpu.server_last_activity is not None:
        last = gpu.server_last_activity
    if last is None:
        last = server.started
    idle = None if last is None else now - last
    holds_gpu = server.gpu_slice is not None or (fresh and gpu.memory_mib > 0)

    if holds_gpu and not fresh:
        why = "missing" if gpu is None else f"stale ({fmt(now - gpu.observed_at)} old)"
        return _plain_idle(
            server,
            idle,
            policy,
            note=f"GPU data {why}: not culled on GPU grounds, plain idle timeout only",
        )

    if holds_gpu and policy.server_gpu_idle is not None:
        window = policy.server_gpu_idle
    else:
        window = policy.server_idle
    if holds_gpu and window is not None and gpu.idle_for < window:
        if not gpu.busy_seen:
            return _plain_idle(
                server,
                idle,
                policy,
                note=f"GPU data covers only {fmt(gpu.covered_for)} of {fmt(window)}: not culled "
                "on GPU grounds, plain idle timeout only",
            )
        return Decision(
            "keep",
            "gpu_busy",
            f"GPU busy within the last {fmt(window)} ({gpu.source}; "
            f"idle for {fmt(gpu.idle_for)}, {gpu.memory_mib:.0f} MiB)",
        )
    if holds_gpu and policy.server_gpu_idle is not None:
        if idle is not None and idle >= policy.server_gpu_idle:
            return Decision(
                "stop",
                "gpu_idle",
                f"holds a GPU ({server.gpu_slice or 'in use'}, {gpu.memory_mib:.0f} MiB) and idle "
                f"for {fmt(idle)} >= server_gpu_idle {fmt(policy.server_gpu_idle)}; GPU idle for "
                f">= {fmt(gpu.idle_for)} ({gpu.source})",
            )
        return Decision(
            "keep",
            "active",
            f"holds a GPU, idle for {fmt(idle)} < server_gpu_idle {fmt(policy.server_gpu_idle)}",
        )
    return _plain_idle(server, idle, policy)


def _plain_idle(
    server: ServerFacts, idle: float | None, policy: Policy, note: str = ""
) -> Decision:
    suffix = f"; {note}" if note else ""
    if policy.server_idle is not None and idle is not None and idle >= policy.server_idle:
        return Decision(
            "stop",
            "idle",
            f"idle for {fmt(idle)} >= server_idle {fmt(policy.server_idle)}{suffix}",
            gpu_failsafe=bool(note),
        )
    limit = "off" if policy.server_idle is None else fmt(policy.server_idle)
    return Decision(
        "keep",
        "active",
        f"idle for {fmt(idle)} < server_idle {limit}{suffix}",
        gpu_failsafe=bool(note),
    )


def decide_kernel(
    kernel: KernelFacts,
    policy: Policy,
    now: float,
    rules: Rules = Rules(),
) -> Decision:
    limit = policy.kernel_gpu_idle
    if limit is None:
        return Decision("keep", "disabled", "kernel_gpu_idle is off")
    if kernel.gpu_memory_mib <= 0:
        return Decision("keep", "no_gpu_memory", "holds no GPU memory")
    if kernel.gpu_idle_for is None:
        return Decision(
            "keep",
            "gpu_unknown",
            "GPU activity unknown: not culled on GPU grounds",
            gpu_failsafe=True,
        )
    if kernel.execution_state == "busy" and not rules.cull_busy_kernels:
        return Decision("keep", "executing", "is executing code (cull_busy_kernels is off)")
    if kernel.gpu_idle_for < limit:
        return Decision(
            "keep", "gpu_busy", f"GPU busy {fmt(kernel.gpu_idle_for)} ago (< {fmt(limit)})"
        )
    idle = None if kernel.last_activity is None else now - kernel.last_activity
    if idle is not None and idle < limit:
        return Decision("keep", "active", f"last message {fmt(idle)} ago (< {fmt(limit)})")
    return Decision(
        "shutdown",
        "kernel_gpu_idle",
        f"holds {kernel.gpu_memory_mib:.0f} MiB of GPU memory; GPU idle for "
        f"{fmt(kernel.gpu_idle_for)} and no message for {fmt(idle)} "
        f">= kernel_gpu_idle {fmt(limit)}",
    )
