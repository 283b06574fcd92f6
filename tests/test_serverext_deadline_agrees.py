"""The user's warning (serverext/podinfo.py `server_deadline`, shown by the JupyterLab meter) names
the moment the culler stops the server: culler/decide.py `server_deadlines`, its earliest entry.

serverext may import nothing of fracspawner (tests/test_layout.py), so it keeps its own copy of
the rules; this table holds the two together. Each case is one set of facts, given to each side
the way it gets them: the culler as the hub's server model plus this server's GPU report
(serverext's own JSON, through culler/reports.py `parse_report`, the only GPU source here), the
extension as its environment (choice/notebook_env.py: the pool's policy and the hub's start
time) plus what its monitor knows (its activity, its GPU idle clock, when it began watching).

What the extension cannot know, and so where the warning may only come EARLIER, never later
(`test_the_warning_is_never_later_where_the_culler_knows_more`): the hub's last activity (proxy
traffic the server does not count) later than the server's own. Where the culler knows LESS
(Prometheus failing, this server's report not arriving) it falls back to the plain idle timeout
and may stop before the warning: the extension cannot see that (docs/serverext.md says so).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import pytest

from fracspawner.choice.notebook_env import policy_env, started_env
from fracspawner.culler.decide import ServerFacts, combine, server_deadlines
from fracspawner.culler.reports import parse_report
from fracspawner.model.catalog import IdlePolicy
from fracspawner.serverext.podinfo import PodInfo, isoformat, server_deadline

# whole seconds everywhere: every sum is exact in floating point
NOW = datetime(2027, 1, 15, 12, 0, tzinfo=timezone.utc)
M, H = 60.0, 3600.0


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


@dataclass(frozen=True)
class Case:
    started: float  # the hub started the server this long ago (orm_spawner.started)
    watched: float  # the extension's monitor started this long ago (its GPU history)
    activity: float  # the server's own last activity, GPU work included
    user: float  # the same without GPU work
    gpu_idle: float | None  # its GPU busy (or unknown) last this long ago; None: never seen
    known: bool = True  # False: the GPU's activity cannot be read (MIG through NVML)
    slice: str | None = "1/4"
    memory: float = 2048.0
    sampled: float = 0.0  # the monitor's last reading, this long ago
    hub_later: float = 0.0  # the hub's last activity this much after the server's own


CASES = [
    Case(20 * H, 20 * H - M, 10 * M, 10 * M, 0.0),  # GPU busy just now
    Case(20 * H, 20 * H - M, 3 * H, 3 * H, 90 * M),
    Case(20 * H, 20 * H - M, 50 * M, 23 * H, 50 * M),  # user long gone, GPU work kept it
    Case(30 * H, 30 * H, 0.0, 23 * H + 30 * M, 0.0),  # GPU busy, user away nearly a day
    Case(9 * H, 9 * H, 9 * H, 9 * H, None),  # never active, GPU never seen busy
    Case(20 * M, 19 * M, 19 * M, 19 * M, None),  # young: history too short for any window
    Case(30 * M, 29 * M, 5 * M, 5 * M, 5 * M),  # young, GPU seen busy
    Case(10 * H, 15 * M, 15 * M, 15 * M, None),  # the server restarted in its pod: short history
    Case(10 * H, 15 * M, 12 * M, 12 * M, 14 * M),  # the same, GPU seen busy since
    Case(5 * H, 5 * H, 2 * H, 2 * H, 3 * H, known=False),  # unknown is never idle
    Case(20 * H, 20 * H, 3 * H, 3 * H, 4 * H, slice=None, memory=0.0),  # holds no GPU
    Case(20 * H, 20 * H, 30 * M, 30 * M, 6 * H, slice=None),  # no slice asked, memory held
    Case(20 * H, 20 * H - M, 40 * M, 40 * M, 45 * M, sampled=5.0),  # read 5 s ago
]

POLICIES = [
    IdlePolicy(server_gpu_idle=H, server_idle=8 * H, server_unattended=24 * H),
    # the plain timeout shorter than the GPU one: a GPU seen busy still keeps the server
    IdlePolicy(server_gpu_idle=2 * H, server_idle=H, server_unattended=24 * H),
    IdlePolicy(server_gpu_idle=30 * M, server_idle=10 * M, max_age=30 * H),
    IdlePolicy(server_idle=2 * H),  # server_gpu_idle off
    IdlePolicy(server_gpu_idle=H, max_age=3 * H),
    IdlePolicy(server_gpu_idle=H, server_idle=H, max_age=10 * H, server_unattended=10 * H),
    IdlePolicy(server_gpu_idle=H),  # only the GPU rule: unknown GPU never stops
    IdlePolicy(max_age=12 * H),
    IdlePolicy(),  # every rule off: never
]


def report(case: Case) -> dict:
    """The parts of the extension's report (monitor.py `report`) the culler reads."""
    gpu_idle_since = ago(case.watched if case.gpu_idle is None else case.gpu_idle)
    return {
        "available": True,
        "sampled_at": isoformat(ago(case.sampled)),
        "monitor_started": isoformat(ago(case.watched)),
        "server_last_activity": isoformat(ago(case.activity)),
        "user_last_activity": isoformat(ago(case.user)),
        "gpu_memory_mib": case.memory,
        "gpu_activity_known": case.known,
        "gpu_unknown_reasons": [] if case.known else ["MIG: no per-process utilisation"],
        "gpu_idle_since": isoformat(gpu_idle_since) if case.known else None,
    }


def culler_stops(case: Case, policy: IdlePolicy) -> tuple[float, str] | None:
    """The culler's first stop (unix time, reason), from the hub's model and the report."""
    got = parse_report(report(case), received_at=NOW.timestamp())
    facts = ServerFacts(
        user="alice",
        user_options={"gpu": case.slice, "pool": "h100"} if case.slice else {},
        started=ago(case.started).timestamp(),
        last_activity=ago(case.activity - case.hub_later).timestamp(),
        own_last_activity=got.server_last_activity,
        user_last_activity=got.user_last_activity,
    )
    reading = combine({"extension": got.gpu}, NOW.timestamp())
    due = server_deadlines(facts, reading, policy)
    return min(due, key=lambda d: d[0]) if due else None


def warned(case: Case, policy: IdlePolicy, *, told_started: bool = True):
    """The extension's deadline, from its environment and what its monitor knows (the
    arguments monitor.py `report` passes)."""
    env = {
        "FRACSPAWNER_GPU_SLICE": case.slice or "",
        **policy_env(policy),
        **(started_env(ago(case.started)) if told_started else {}),
    }
    pod = PodInfo.from_environ(env)
    watched = ago(case.watched)
    return server_deadline(
        pod.policy,
        holds_gpu=pod.gpu is not None or case.memory > 0,
        gpu_idle_since=watched if case.gpu_idle is None else ago(case.gpu_idle),
        last_activity=ago(case.activity),
        gpu_known=case.known,
        user_last_activity=ago(case.user),
        watched_since=watched,
        observed_at=ago(case.sampled),
        started=pod.started,
    )


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c}")
def test_the_warning_names_the_culler_s_stop(case: Case) -> None:
    for policy in POLICIES:
        stop = culler_stops(case, policy)
        due = warned(case, policy)
        got = None if due is None else (due.cull_at.timestamp(), due.reason)
        assert got == stop, (policy, due, stop)


def test_the_table_reaches_every_rule() -> None:
    # the table is worth something only if every rule is the first to stop in some case
    reasons = {
        stop[1]
        for case, policy in itertools.product(CASES, POLICIES)
        if (stop := culler_stops(case, policy)) is not None
    }
    assert reasons == {"max_age", "unattended", "gpu_idle", "idle"}


def test_the_warning_is_never_later_where_the_culler_knows_more() -> None:
    # the hub saw activity the server did not count: the culler stops later, never earlier
    for case, policy in itertools.product(CASES, POLICIES):
        case = Case(**{**case.__dict__, "hub_later": 10 * M})
        stop, due = culler_stops(case, policy), warned(case, policy)
        if stop is None:
            continue
        assert due is not None and due.cull_at.timestamp() <= stop[0], (case, policy)


def test_without_the_start_time_max_age_is_not_warned_of() -> None:
    # a pod spawned before the hub told its start time: the extension cannot know max_age's
    # moment and warns of the other rules only (the culler still stops at max_age)
    case, policy = CASES[0], IdlePolicy(server_gpu_idle=H, max_age=20 * H + 30 * M)
    assert culler_stops(case, policy) == (NOW.timestamp() + 30 * M, "max_age")
    due = warned(case, policy, told_started=False)
    assert due is not None and due.reason == "gpu_idle"
    assert warned(case, policy).reason == "max_age"


@pytest.mark.parametrize(
    "busy_at, read_at, cull_at, reason",
    [
        # the server restarted in its pod 20 min ago, GPU never seen busy since: a history too
        # short for the 1 h GPU window, so the culler stops at the plain 30 min idle timeout
        (None, 20 * M, 30 * M, "idle"),
        # GPU seen busy 5 min in: kept until max_age, 3 h after the hub started it 2 h before
        # this server (the GPU rule alone would keep it until 5 min + 1 h)
        (5 * M, 50 * M, H, "max_age"),
    ],
)
def test_the_meter_s_report_warns_of_the_culler_s_stop(
    monkeypatch, busy_at, read_at, cull_at, reason
):
    """The same through the monitor's report (what the meter shows and the culler reads)."""
    from fracspawner.serverext import monitor as monitor_module
    from fracspawner.serverext.sources import GpuDevice, GpuProcess, GpuSample

    t0 = NOW
    policy = IdlePolicy(server_gpu_idle=H, server_idle=30 * M, max_age=3 * H)
    env = {
        "FRACSPAWNER_GPU_SLICE": "1/4",
        **policy_env(policy),
        **started_env(t0 - timedelta(hours=2)),
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("FRACSPAWNER_GPU_IDLE_WARN_SECONDS", raising=False)
    monkeypatch.setattr(monitor_module, "utcnow", lambda: t0)
    monitor = monitor_module.GpuMonitor(settings={}, source_spec="none")
    monitor.reason = None
    device = GpuDevice("0", "H100", "GPU-0", 81920, 2048, 0)

    def read(seconds: float, utilization: float) -> None:
        process = GpuProcess("0", 2048, utilization, kernel_id="k")
        at = t0 + timedelta(seconds=seconds)
        monitor.apply(GpuSample("simulated", [device], [process]), [("k", process)], {"k"}, at)

    if busy_at is not None:
        read(busy_at, 90.0)
    read(read_at, 0.0)
    now = t0 + timedelta(seconds=read_at)
    got = monitor.report(server_last_activity=t0, user_last_activity=t0, now=now)
    assert got["server_idle"] == {
        "idle_since": got["server_idle"]["idle_since"],
        "cull_at": isoformat(t0 + timedelta(seconds=cull_at)),
        "reason": reason,
    }
    facts = parse_report(got, received_at=now.timestamp())
    server = ServerFacts(
        user="alice",
        user_options={"gpu": "1/4"},
        started=(t0 - timedelta(hours=2)).timestamp(),
        last_activity=t0.timestamp(),
        own_last_activity=facts.server_last_activity,
        user_last_activity=facts.user_last_activity,
    )
    due = server_deadlines(server, combine({"extension": facts.gpu}, now.timestamp()), policy)
    assert min(due, key=lambda d: d[0]) == ((t0 + timedelta(seconds=cull_at)).timestamp(), reason)
    # and warned now, 10 min before (a third of the limit at most)
    warnings = [w for w in got["warnings"] if w["scope"] == "server"]
    assert [w["cull_at"] for w in warnings] == [got["server_idle"]["cull_at"]]
    assert warnings[0]["reason"] == reason
