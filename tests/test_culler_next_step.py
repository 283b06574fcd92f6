"""The admin page's "what the culler does next, and when" (culler/state.py `next_step`) against
the culler's own decision (culler/decide.py `decide_server`): pure, table-driven, fast.

"If nothing changes" is modelled here as the culler would see it: nobody uses the server, its
GPU does no more work, and each later cycle reads fresh GPU data that has counted that idle time
(missing or unknown data stays so). The moment `next_step` names must be the first moment
`decide_server` says stop, with the same reason; where it names none, no stop may ever come.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from fracspawner.culler.decide import GpuFacts, Reading, Rules, ServerFacts, decide_server
from fracspawner.culler.state import next_step
from fracspawner.model.catalog import IdlePolicy

# whole seconds everywhere: every sum below is exact in floating point
NOW = 1_800_000_000.0
M, H = 60.0, 3600.0
HORIZON = 30 * 24 * H  # "never" is checked this far ahead

POLICIES = [
    IdlePolicy(server_gpu_idle=H, server_idle=8 * H, server_unattended=24 * H),
    # the plain timeout shorter than the GPU one: a GPU seen busy still keeps the server
    IdlePolicy(server_gpu_idle=2 * H, server_idle=H, server_unattended=24 * H),
    # server_gpu_idle off: the GPU seen busy within server_idle keeps it, then plain idle
    IdlePolicy(server_idle=2 * H),
    IdlePolicy(server_gpu_idle=H, max_age=3 * H),
    IdlePolicy(server_gpu_idle=H, server_idle=H, max_age=10 * H, server_unattended=10 * H),
    IdlePolicy(server_gpu_idle=H),  # only the GPU rule: unknown GPU never stops
    IdlePolicy(),  # every rule off: never
]


def server(
    started_ago: float, activity_ago: float | None, user_ago: float | None, gpu: str | None
) -> ServerFacts:
    return ServerFacts(
        user="alice",
        user_options={"gpu": gpu, "pool": "h100"} if gpu else {},
        started=NOW - started_ago,
        last_activity=None if activity_ago is None else NOW - activity_ago,
        user_last_activity=None if user_ago is None else NOW - user_ago,
    )


FACTS = [
    server(20 * H, 10 * M, 10 * M, "1/4"),
    server(20 * H, 3 * H, 3 * H, "1/4"),
    server(20 * H, 50 * M, 23 * H, "1/4"),  # user gone long ago, GPU work kept it active
    server(9 * H, 9 * H, None, "1/4"),  # no report: the hub's activity is the user's
    server(2 * H, None, None, None),  # never active, no GPU asked for
    server(30 * M, 5 * M, 5 * M, None),
]


def gpu(idle_for: float | None, covered_for: float | None, *, age: float = 0.0) -> Reading:
    return Reading(GpuFacts("prometheus", NOW - age, 2048.0, idle_for, covered_for))


READINGS = [
    gpu(0.0, None),  # busy just now
    gpu(10 * M, None),
    gpu(90 * M, 5 * H),  # idle for 90 min, busy seen before that
    gpu(6 * H, None),
    gpu(20 * M, 20 * M),  # never seen busy, too little history for any window
    gpu(5 * H, 5 * H),  # never seen busy, history long enough
    gpu(30 * M, None, age=60.0),  # read a minute ago
    Reading(GpuFacts("prometheus", NOW, 0.0, 4 * H, None)),  # no GPU memory held
    Reading(GpuFacts("prometheus", NOW, 2048.0, None, None, "MIG")),  # unknown is never idle
    Reading(None, "GPU source prometheus has no data for it"),  # missing: never idle either
]


def later(reading: Reading, t: float) -> Reading:
    """The same reading as a cycle at `t` would get it if the GPU did nothing since."""
    g = reading.gpu
    if g is None or g.idle_for is None:
        return replace(reading, gpu=None if g is None else replace(g, observed_at=t))
    gone = t - g.observed_at
    covered = None if g.covered_for is None else g.covered_for + gone
    return replace(
        reading, gpu=replace(g, observed_at=t, idle_for=g.idle_for + gone, covered_for=covered)
    )


def decide_at(facts: ServerFacts, reading: Reading, policy: IdlePolicy, t: float, rules: Rules):
    return decide_server(facts, later(reading, t), policy, t, rules)


CASES = list(itertools.product(FACTS, READINGS, POLICIES))


@pytest.mark.parametrize("rules", [Rules(), Rules(exempt_users=frozenset({"alice"}))])
def test_next_step_is_when_decide_server_first_stops(rules: Rules) -> None:
    promised = 0
    for facts, reading, policy in CASES:
        case = (facts, reading, policy)
        decision = decide_server(facts, reading, policy, NOW, rules)
        step = next_step(facts, reading, decision, policy, NOW)
        if step is None:
            # nothing due: no stop, now or in the next 30 days
            for i in range(61):
                assert not decide_at(facts, reading, policy, NOW + i * HORIZON / 60, rules).cull, (
                    case
                )
            continue
        promised += 1
        at = step["at"]
        assert at >= NOW, case
        d = decide_at(facts, reading, policy, at, rules)
        assert (d.action, d.reason) == (step["action"], step["reason"]), (case, step, d.message)
        if at > NOW:
            # the first stop: kept just before it, and at every moment sampled since now
            for t in [at - 0.5] + [NOW + i * (at - NOW) / 50 for i in range(50)]:
                d = decide_at(facts, reading, policy, t, rules)
                assert not d.cull, (case, step, t - NOW, d.reason, d.message)
    # exemption promises nothing; otherwise most cases have a stop ahead
    assert promised == 0 if rules.exempt_users else promised > len(CASES) // 2


@pytest.mark.parametrize("reading", READINGS[-2:])
def test_unknown_gpu_promises_no_stop_on_gpu_grounds(reading: Reading) -> None:
    # unknown is never idle: with only the GPU rule on, nothing is due, then or ever
    facts, policy = FACTS[1], IdlePolicy(server_gpu_idle=H)
    keep = decide_server(facts, reading, policy, NOW)
    assert next_step(facts, reading, keep, policy, NOW) is None
    assert not decide_at(facts, reading, policy, NOW + HORIZON, Rules()).cull
    # the plain idle timeout still applies, and is what is shown
    policy = IdlePolicy(server_gpu_idle=H, server_idle=8 * H)
    keep = decide_server(facts, reading, policy, NOW)
    assert next_step(facts, reading, keep, policy, NOW) == {
        "action": "stop",
        "reason": "idle",
        "at": NOW - 3 * H + 8 * H,
    }
