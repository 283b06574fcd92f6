"""The culling decision: pure functions of facts, policy and the time. No I/O here.

Everything the culler knows about a server arrives as plain data: `ServerFacts` (the hub's
view, plus what the server itself last reported about its activity) and one `GpuFacts` per
configured GPU source, or None where that source failed for the server. `combine` folds the
sources into one reading; `decide_server` applies the policy (the catalog's `IdlePolicy`, or
any object with its attributes). The rules, in order:

- servers that are not ready, exempt or excluded (default/named) are kept;
- `max_age`: servers older than this are stopped, busy or not (as jupyterhub-idle-culler does);
- a server whose user is present (a JupyterLab tab of it is visible and was used within the
  presence timeout, as its own report says: serverext/presence.py) is kept, and so is one whose
  user is in session (a tab of it open and hidden, its person seen within the session timeout:
  the lecture's slides in front of the notebook);
- `server_unattended`: no user activity for this long stops a server even while its GPU is busy
  (GPU work is not user activity: a neighbour's work or a forgotten job cannot hold it for ever);
- a server whose report has a kernel waiting to resume for room on the GPU (a cell of its user
  is waiting: serverext/swap.py) is kept: stopping it would shut that kernel down, which issue 36
  item 2 forbids; only `max_age` and `server_unattended` stop it;
- a server **needed** (`needed_at`: away.py): a server pod of its pool waits for a node and
  its user left a while ago (no tab open and in session, no activity, no GPU work, no cell
  running): stopped for it, least recently active first, before the GPU idle timeouts;
- a server **kept hibernated** (`kept_hibernated`: every kernel of it hibernated, holding no GPU
  memory, on a pool where that memory is usable by others, and nobody waiting for what it
  holds: keep.py) is not stopped for GPU idleness: the plain `server_idle` (with
  `server_unattended` and `max_age`) still stops it;
- a server holding a GPU whose GPU is known to have been idle for `server_gpu_idle`, and whose
  activity is as old, is stopped; known means a source read it and no configured source failed:
  a failed source, stale data, utilisation nobody can read or too short a history is never
  idle, and then only the plain `server_idle` applies ("fail-safe");
- any server idle past `server_idle` is stopped.

`server_deadlines` turns these rules into the moment each would fire; `decide_server` stops when
one has come, and the admin page's "next step" (culler/state.py) shows the earliest, so the two
cannot disagree.

Kernels are not decided here: a server shuts its own idle GPU kernels down (fracspawner.serverext),
so the culler never calls into a user's server.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol

NO_GPU = {"", "none", "0", "no"}


class Policy(Protocol):
    kernel_gpu_idle: float | None
    server_gpu_idle: float | None
    server_idle: float | None
    max_age: float | None
    server_unattended: float | None


@dataclass(frozen=True)
class ServerFacts:
    user: str
    name: str = ""  # "" is the default server
    user_options: dict = field(default_factory=dict, hash=False, compare=False)
    started: float | None = None  # unix seconds
    last_activity: float | None = None  # as the hub knows it
    ready: bool = True
    pending: str | None = None
    # None: the hub did not say (the culler's token lacks read:users:groups)
    groups: tuple[str, ...] | None = ()
    # what the server itself last reported (None: no report): its activity with GPU work
    # counted, and its user's activity (everything jupyter-server counts, GPU work excepted)
    own_last_activity: float | None = None
    user_last_activity: float | None = None
    # what the server's report says of its person (serverext/presence.py): True present, False
    # away, None unknown (no tab reports presence, or no report)
    present: bool | None = None
    # in session (serverext/presence.py): a hidden tab of a person seen lately: kept like present
    in_session: bool = False
    # its report has a kernel whose resume waits for room on the GPU (serverext/swap.py): a
    # cell its user sent is waiting; stopping the server would shut that kernel down (issue
    # 36 item 2: never), so only max_age and server_unattended stop it
    resume_waiting: bool = False
    # every kernel of it hibernated (no GPU memory held) on a pool where hibernation frees
    # memory others use, and no server pod of its pool waits for a node (keep.py): stopping it
    # would give nobody anything and lose its user's kernels, so GPU idleness does not stop it
    kept_hibernated: bool = False
    # released for a server pod of its pool that waits for a node (away.py): its user left
    # (no tab of theirs open and in session, no activity, no GPU work, no cell running) and it
    # is among the least recently active of such servers; from this moment (unix seconds)
    needed_at: float | None = None

    @property
    def pool(self) -> str | None:
        """The pool the spawner wrote into user_options: the pool the pod is on (FracSpawner
        writes it back at spawn and after a hub restart, and refuses names it would rewrite)."""
        value = self.user_options.get("pool")
        return value if isinstance(value, str) and value else None

    @property
    def gpu_slice(self) -> str | None:
        """The GPU slice asked for at spawn (CONTRACT: user_options["gpu"]), or None."""
        spec = str(self.user_options.get("gpu") or "").strip().lower()
        return None if spec in NO_GPU else spec

    @property
    def log_name(self) -> str:
        return f"{self.user}/{self.name}" if self.name else self.user

    @property
    def activity(self) -> float | None:
        """The newest evidence of any activity: the hub's and the server's own. Where the
        server knows its person's presence, its own word alone: the hub's last_activity counts
        every request through the proxy, an open tab's polling every 10 s included."""
        if self.present is not None and self.own_last_activity is not None:
            return max(self.own_last_activity, self.started or self.own_last_activity)
        times = [t for t in (self.last_activity, self.own_last_activity) if t is not None]
        return max(times) if times else self.started

    @property
    def user_activity(self) -> float | None:
        """The newest user activity: the server's own word where it reported, else the hub's
        (which, with the extension installed, may include GPU work: the lenient side)."""
        if self.user_last_activity is not None:
            return max(self.user_last_activity, self.started or self.user_last_activity)
        return self.last_activity if self.last_activity is not None else self.started


@dataclass(frozen=True)
class GpuFacts:
    """What one GPU source (or several, combined) saw of one server, as of `observed_at`."""

    source: str  # "prometheus", "extension" or "prometheus+extension"
    observed_at: float  # unix seconds
    memory_mib: float  # GPU memory the server's processes hold
    # seconds the GPU was seen continuously idle, ending at observed_at (0: busy just now);
    # None: the source answered but cannot tell (MIG through NVML, a process it cannot match)
    idle_for: float | None
    # how far back the data reaches. idle_for < covered_for: busy (or unknown) was SEEN
    # idle_for ago; idle_for == covered_for: never seen busy, but too little history to say
    # more (a gap, a young series), which counts as missing data. None: unbounded.
    covered_for: float | None = None
    note: str = ""  # why activity is unknown, for the log

    @property
    def known(self) -> bool:
        return self.idle_for is not None

    @property
    def busy_seen(self) -> bool:
        return self.covered_for is None or (
            self.idle_for is not None and self.idle_for < self.covered_for
        )


@dataclass(frozen=True)
class Rules:
    """Culler-wide settings that are not part of a pool's idle policy."""

    max_staleness: float = 300.0  # GPU data older than this is treated as missing
    exempt_users: frozenset[str] = frozenset()
    exempt_groups: frozenset[str] = frozenset()
    cull_default_servers: bool = True
    cull_named_servers: bool = True


@dataclass(frozen=True)
class Decision:
    action: Literal["keep", "stop"]
    reason: str  # short code, used as the metrics label
    message: str  # one sentence for the log
    gpu_failsafe: bool = False  # GPU rules were skipped: GPU activity unknown or data missing

    @property
    def cull(self) -> bool:
        return self.action != "keep"


def fmt(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    s = int(max(seconds, 0))
    return f"{s // 3600:d}:{s % 3600 // 60:02d}:{s % 60:02d}"


@dataclass(frozen=True)
class Reading:
    """The combined GPU reading of a server: facts, or None with the reason it is missing."""

    gpu: GpuFacts | None
    missing: str = ""  # "" when gpu is set
    # missing, for a server that holds a GPU by its sources' word: one saw GPU memory, or one
    # failed (recorded only for a server holding a GPU: Culler.gather); for the log and metric
    held: bool = False


def combine(sources: Mapping[str, GpuFacts | None], now: float, rules: Rules = Rules()) -> Reading:
    """Fold every configured source's reading of one server into one (pure).

    A source that failed for the server (None) or whose data is stale makes the whole reading
    missing: the other source may miss what it would have seen. A source that answered
    "unknown" defers to one that knows; busy from any source wins (the shorter idle time);
    memory is the larger reading.
    """
    if not sources:
        return Reading(None, "no GPU source configured")
    held = any(f is None or f.memory_mib > 0 for f in sources.values())
    for name, facts in sources.items():
        if facts is None:
            return Reading(None, f"GPU source {name} has no data for it", held)
        if now - facts.observed_at > rules.max_staleness:
            return Reading(None, f"{name} data stale ({fmt(now - facts.observed_at)} old)", held)
    readings = list(sources.values())
    known = [f for f in readings if f.known]
    name = "+".join(sources)
    memory = max(f.memory_mib for f in readings)
    observed = min(f.observed_at for f in readings)
    if not known:
        notes = "; ".join(f"{f.source}: {f.note}" for f in readings if f.note)
        return Reading(GpuFacts(name, observed, memory, None, None, notes or "unknown"))
    # the shorter idle time wins, with the coverage that goes with it
    short = min(known, key=lambda f: (f.idle_for, -(f.covered_for or float("inf"))))
    return Reading(GpuFacts(name, observed, memory, short.idle_for, short.covered_for))


def _holds_gpu(server: ServerFacts, gpu: GpuFacts | None) -> bool:
    return server.gpu_slice is not None or (gpu is not None and gpu.memory_mib > 0)


def server_deadlines(
    server: ServerFacts, reading: Reading, policy: Policy
) -> list[tuple[float, str]]:
    """When each stop rule of `decide_server` first holds if nothing changes after `reading`:
    nobody uses the server, its GPU does no more work, and its GPU data stays as it is (known
    data counts that idle time; missing or unknown data stays so and never culls on GPU
    grounds). (unix time, reason) in the rules' order; a past time: the rule holds already.
    The keep rules (not ready, exempt, excluded) are `decide_server`'s alone."""
    due: list[tuple[float, str]] = []
    if policy.max_age and server.started is not None:
        due.append((server.started + policy.max_age, "max_age"))
    if server.present or server.in_session:
        return due  # a person is at it: nothing but max_age stops it while they stay
    unattended = getattr(policy, "server_unattended", None)
    user_last = server.user_activity
    if unattended and user_last is not None:
        due.append((user_last + unattended, "unattended"))
    if server.resume_waiting:
        return due  # a cell waits for its kernel: no idle timeout stops it
    if server.needed_at is not None:
        due.append((server.needed_at, "needed"))
    last, gpu = server.activity, reading.gpu
    if last is None:
        return due
    if server.kept_hibernated:  # nothing needs what it holds: the plain idle timeout only
        if policy.server_idle is not None:
            due.append((last + policy.server_idle, "idle"))
        return due
    if not _holds_gpu(server, gpu) or gpu is None or gpu.idle_for is None:
        # no GPU held, or its activity missing or unknown: the plain idle timeout only
        if policy.server_idle is not None:
            due.append((last + policy.server_idle, "idle"))
        return due
    # once the GPU has been idle for `window`, no activity for as long stops the server
    window = policy.server_gpu_idle if policy.server_gpu_idle is not None else policy.server_idle
    if window is None:
        return due
    reason = "gpu_idle" if policy.server_gpu_idle is not None else "idle"
    if gpu.idle_for >= window:
        due.append((last + window, reason))
        return due
    # until then a GPU seen busy keeps the server; data too short to tell leaves the plain
    # idle timeout, which holds only while the window is not yet covered
    window_at = gpu.observed_at - gpu.idle_for + window
    if not gpu.busy_seen and policy.server_idle is not None:
        at = last + policy.server_idle
        if at <= gpu.observed_at or at < window_at:
            due.append((at, "idle"))
    due.append((max(window_at, last + window), reason))
    return due


def decide_server(
    server: ServerFacts,
    reading: Reading | GpuFacts | None,
    policy: Policy,
    now: float,
    rules: Rules = Rules(),
) -> Decision:
    if server.pending or not server.ready:
        return Decision("keep", "not_ready", f"not ready (pending: {server.pending})")
    if server.user in rules.exempt_users:
        return Decision("keep", "exempt", f"user {server.user} is exempt")
    if rules.exempt_groups and server.groups is None:
        # unknown is never "in no group": an exempt user's server is never culled for want
        # of the scope
        return Decision(
            "keep",
            "exempt",
            "groups unknown (the culler's token lacks read:users:groups): kept while "
            "exempt_groups is set",
        )
    exempt_groups = rules.exempt_groups.intersection(server.groups or ())
    if exempt_groups:
        return Decision("keep", "exempt", f"group {sorted(exempt_groups)[0]} is exempt")
    if server.name and not rules.cull_named_servers:
        return Decision("keep", "excluded", "named servers are not culled")
    if not server.name and not rules.cull_default_servers:
        return Decision("keep", "excluded", "default servers are not culled")

    if isinstance(reading, GpuFacts):  # one source's facts: checked for staleness like any
        reading = combine({reading.source: reading}, now, rules)
    elif reading is None:
        reading = Reading(None, "GPU data missing")
    gpu = reading.gpu
    # the rules that hold now; the GPU data taken as of now: the time since it was read is
    # not known to be idle
    current = reading if gpu is None else Reading(replace(gpu, observed_at=now))
    fired = {reason for at, reason in server_deadlines(server, current, policy) if at <= now}

    if "max_age" in fired:
        assert server.started is not None and policy.max_age
        age = now - server.started
        return Decision("stop", "max_age", f"age {fmt(age)} >= max_age {fmt(policy.max_age)}")
    if server.present:
        return Decision(
            "keep", "present", "its user is at a JupyterLab tab of it (the server's presence)"
        )
    if server.in_session:
        return Decision(
            "keep",
            "in_session",
            "its user is in session: a JupyterLab tab of it is open, hidden, and they were seen "
            "within the session timeout (the server's presence)",
        )
    if "unattended" in fired:
        user_last, unattended = server.user_activity, getattr(policy, "server_unattended", None)
        assert user_last is not None
        return Decision(
            "stop",
            "unattended",
            f"no user activity for {fmt(now - user_last)} >= server_unattended "
            f"{fmt(unattended)} (GPU work does not count)",
        )
    if server.resume_waiting:
        return Decision(
            "keep",
            "resume_waiting",
            "a kernel of it waits to resume for room on the GPU (a cell of its user is "
            "waiting): never stopped for idleness",
        )
    if "needed" in fired:
        away = None if server.activity is None else now - server.activity
        return Decision(
            "stop",
            "needed",
            f"a server pod of its pool waits for a node, and its user left {fmt(away)} ago (no "
            "tab of theirs open and in session, no activity, no GPU work, no cell running): "
            "released for it, least recently active first",
        )

    # which GPU rule applies, for the message; whether it stops is `fired`'s
    stop = "idle" in fired
    last = server.activity
    idle = None if last is None else now - last
    if server.kept_hibernated and last is not None:
        if stop:
            return _plain_idle(idle, policy, stop)
        return Decision(
            "keep",
            "hibernated",
            f"its kernels are all hibernated (no GPU memory held) and no server of its pool "
            f"waits for a node: kept while idle for {fmt(idle)} < server_idle "
            f"{'off' if policy.server_idle is None else fmt(policy.server_idle)}",
        )
    if not _holds_gpu(server, gpu) and not reading.held:
        return _plain_idle(idle, policy, stop)

    if gpu is None:
        return _plain_idle(idle, policy, stop, f"{reading.missing}: not culled on GPU grounds")
    if not gpu.known:
        return _plain_idle(
            idle, policy, stop, f"GPU activity unknown ({gpu.note}): not culled on GPU grounds"
        )
    assert gpu.idle_for is not None
    window = policy.server_gpu_idle if policy.server_gpu_idle is not None else policy.server_idle
    if window is not None and gpu.idle_for < window:
        if not gpu.busy_seen:
            return _plain_idle(
                idle,
                policy,
                stop,
                f"GPU data covers only {fmt(gpu.covered_for)} of {fmt(window)}: not culled "
                "on GPU grounds",
            )
        return Decision(
            "keep",
            "gpu_busy",
            f"GPU busy within the last {fmt(window)} ({gpu.source}; "
            f"idle for {fmt(gpu.idle_for)}, {gpu.memory_mib:.0f} MiB)",
        )
    if policy.server_gpu_idle is None:
        return _plain_idle(idle, policy, stop)
    if "gpu_idle" in fired:
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


def _plain_idle(idle: float | None, policy: Policy, stop: bool, note: str = "") -> Decision:
    suffix = f"; {note}, plain idle timeout only" if note else ""
    if stop:
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
