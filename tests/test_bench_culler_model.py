"""The capacity benchmark's model of a pod, a tab and a waiting spawn (benchmarks/bench_culler.py)
as the product meets them: what it replays must not count against the culler what a real pod
would not show it."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone
from pathlib import Path

from benchmarks.bench_culler import Sim, bench_catalog, pod_host, replay, v
from benchmarks.culler_trace import Cluster, User
from fracspawner.serverext.presence import SETTINGS_KEY as PRESENCE_KEY


def _at(m: int) -> datetime:
    return datetime.fromtimestamp(v(m), timezone.utc)


def test_a_page_opened_in_a_hidden_tab_keeps_its_person_in_session(tmp_path: Path):
    """A student whose spawn waited turns to the lecture's slides; JupyterLab then loads in
    the hidden tab. Opening the page is the person's act (labextension/src/presence.ts
    `_lastInput`): they are in session, not away since their morning lab's last key."""
    u = User("cls-00", 8192)
    for m in range(0, 5):  # the morning lab: at the keyboard
        u.present[m] = u.tab_open[m] = u.input[m] = True
    for m in range(300, 330):  # the afternoon lecture, the notebook behind the slides
        u.present[m] = u.tab_hidden[m] = True
    sim = Sim([u], "fracspawner", Cluster(1), "reserving", bench_catalog(None))
    sim.host = pod_host(tmp_path)
    s = sim.demand(u, 0)
    for m in range(0, 5):
        sim.tab(u, s, m, _at(m))
    sim.stop(u.name)
    s = sim.demand(u, 310)  # its spawn waited: the page loads in the hidden tab
    for m in range(310, 320):
        sim.tab(u, s, m, _at(m))
    presence = s.settings[PRESENCE_KEY]
    assert presence.in_session(_at(319)), (
        f"away since {presence.last_present(_at(319))}: the page's load is not counted"
    )


def test_a_neighbour_s_memory_on_a_time_sliced_gpu_is_not_this_server_s(tmp_path: Path):
    """On a time-sliced GPU the device's reading holds the neighbours' kernels. In a pod (a PID
    namespace of its own, a driver that lists the pod's processes by their PID in it:
    535.113.01 or later) memory the server cannot place is a neighbour's (neighbours.py), so
    an emptied server's GPU is idle, not unknown, and its idle clock runs."""
    users = [User("a", 20000), User("b", 20000)]
    for u in users:
        u.present[0] = u.tab_open[0] = True
    sim = Sim(users, "fracspawner", Cluster(1), "time_sliced", bench_catalog(None))
    sim.host = pod_host(tmp_path)
    a, b = (sim.demand(u, 0) for u in users)
    a.ensure_kernel(_at(0))
    a.holds_memory = True  # a's kernel holds 20 GB of the GPU; b holds nothing
    sim.read(b, _at(1))
    assert b.monitor.gpu_state == "idle", b.monitor.unknown_reasons


def test_a_slot_whose_person_left_is_released_for_a_newcomer_within_the_minute(tmp_path: Path):
    """One quarter slot. Ann runs a GPU cell, closes her tab and leaves at minute 5; Bob
    arrives at minute 25. The culler releases Ann's server for Bob's waiting pod in a cycle
    `cull_when_waiting` after it (culler/away.py): Bob is seated in the minute he arrived, not
    turned away after waiting for Ann's `server_gpu_idle` hour."""
    ann, bob = User("ann", 8192), User("bob", 8192)
    for m in range(0, 5):
        ann.present[m] = ann.tab_open[m] = ann.input[m] = True
    ann.cell[0] = ann.gpu_cell[0] = ann.cell[1] = ann.gpu_cell[1] = True
    for m in range(25, 40):
        bob.present[m] = bob.tab_open[m] = bob.input[m] = True
    one_slot = Cluster(1, slots_per_gpu=1)
    sims: list[Sim] = []
    row = asyncio.run(
        replay([ann, bob], "fracspawner", "reserving", one_slot, tmp_path, minutes=40, sims=sims)
    )
    assert row["wait_episodes"] == 0 and row["slot_freed_within_a_minute"] == 1, row
    assert row["culls_while_present"] == 0 and row["false_culls"] == 0
    assert sorted(sims[0].servers) == ["bob"]


def test_a_person_back_at_a_tab_reaches_the_culler_in_that_minute(tmp_path: Path):
    """The product's server reports at once when its person comes back to a tab
    (serverext/__init__.py: Presence.on_back -> GpuReporter.report_soon(0)). The replay sends
    that report in the same minute, before the culler's early cycle, with this moment's
    presence: a culler releasing kept servers for a newcomer then sees the person back."""
    from tests.test_bench_culler import _culler

    u = User("cls-00", 8192)
    for m in range(0, 5):
        u.present[m] = u.tab_open[m] = u.input[m] = True
    for m in range(40, 45):  # back after a break with the tab closed
        u.present[m] = u.tab_open[m] = u.input[m] = True
    sim = Sim([u], "fracspawner", Cluster(1), "reserving", bench_catalog(None))
    sim.host = pod_host(tmp_path)
    culler = _culler(sim)
    s = sim.demand(u, 0)
    for m in range(0, 40):
        sim.minute, sim.now_t = m, v(m)
        sim.tab(u, s, m, _at(m))
        asyncio.run(sim.report_back(culler))  # only at minute 0: the first tab's report
    assert culler.reports.get(u.name, "").received_at == v(0)
    sim.minute = 40
    sim.now_t = v(40)
    sim.tab(u, s, 40, _at(40))
    asyncio.run(sim.report_back(culler))
    report = culler.reports.get(u.name, "")
    assert report is not None and report.received_at == v(40), "no report when the person came back"
    assert report.present is True
