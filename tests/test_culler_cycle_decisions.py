"""One culler cycle decides each server once (issue 36): `keep_hibernated`,
`release_for_waiting` and the cycle's own loop each combined a server's sources and asked
`decide_server` about it, up to three times a cycle on the same inputs (the same facts, the
same sources, `now` and rules). Now the reading and the decision are computed once per cycle
for the same inputs and reused (`Culler.decide`); a server whose facts a step changed
(kept hibernated, released for a waiting pod) is decided again on its new facts.

Driven through a whole `Culler.cull_once` against the benchmark's stand-in hub
(tests/test_culler_keep_hibernated.py's `cycle`), with a pod waiting so that every step runs.
"""

from __future__ import annotations

from fracspawner.culler import app
from tests.test_culler_keep_hibernated import cycle


async def test_a_cycle_decides_each_server_once_on_the_same_inputs(monkeypatch):
    decided: list = []  # the facts each decision was asked about (kept: ids stay unique)
    combined: list = []
    decide, combine = app.decide_server, app.combine

    def decide_spy(facts, *args, **kwargs):
        decided.append(facts)
        return decide(facts, *args, **kwargs)

    def combine_spy(sources, *args, **kwargs):
        combined.append(sources)
        return combine(sources, *args, **kwargs)

    monkeypatch.setattr(app, "decide_server", decide_spy)
    monkeypatch.setattr(app, "combine", combine_spy)
    # ann's kernels are hibernated (kept, then released for the waiting pod), bob's too (kept),
    # cat holds GPU memory and was active half an hour ago; a quarter waits for a node
    servers = {"ann": (3.0, 0.0), "bob": (2.0, 0.0), "cat": (0.5, 2000.0)}
    stopped, said = await cycle(servers, waiting=1)
    assert stopped == ["ann"], said  # as before (test_culler_keep_hibernated)
    twice = [f.user for i, f in enumerate(decided) if any(f is g for g in decided[:i])]
    assert twice == [], f"decided again on the same facts in one cycle: {twice}"
    assert len(combined) == len(servers), "a server's sources combined more than once a cycle"
