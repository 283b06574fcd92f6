"""Presence from the person, not the poller (issue 26, item 4), on a virtual clock.

The server extension's own monitor (GpuMonitor: readings, the in-server kernel shut-down, the
report) with jupyter-server's activity as its settings hold it, and the culler's decision on the
report. What JupyterLab does is modelled from its source: while its tab is visible it polls
`/api/kernels`, `/api/sessions` and `/api/terminals` every 10 s (@jupyterlab/services 4.x
kernel/manager.ts, session/manager.ts, terminal/manager.ts: `Poll` with
`interval: 10 * 1000`, `standby: 'when-hidden'`), and each authenticated API request sets
`settings["api_last_activity"]` (jupyter_server/base/handlers.py `APIHandler.update_api_activity`,
called from `finish`). The GPU meter's tab reports presence as labextension/src/presence.ts does.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

import pytest

from fracspawner.culler.decide import ServerFacts, decide_server, server_deadlines
from fracspawner.culler.reports import parse_report
from fracspawner.model.catalog import IdlePolicy
from fracspawner.serverext import monitor as monitor_module
from fracspawner.serverext.activity import server_activity, user_activity
from fracspawner.serverext.presence import (
    SETTINGS_KEY,
    ClientReport,
    Presence,
    PresenceError,
    parse_client_report,
)
from fracspawner.serverext.sources import GpuDevice, GpuProcess, GpuSample

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=timezone.utc)
TIMEOUT = 900.0  # the presence timeout: 15 min after the last input
KERNEL_GPU_IDLE = 1800.0  # the pool's kernel limit: 30 min
POLL = 10  # JupyterLab's REST polling while its tab is visible (seconds)


def t(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


class FakeKernel:
    def __init__(self, last_activity: datetime):
        self.last_activity, self.execution_state = last_activity, "idle"


class FakeKernelManager:
    """The parts of jupyter-server's MappingKernelManager the monitor reads."""

    def __init__(self) -> None:
        self.kernels: dict[str, FakeKernel] = {}
        self.last_kernel_activity: datetime | None = None

    def list_kernel_ids(self) -> list[str]:
        return list(self.kernels)

    def get_kernel(self, kernel_id: str) -> FakeKernel:
        return self.kernels[kernel_id]

    async def shutdown_kernel(self, kernel_id: str) -> None:
        del self.kernels[kernel_id]


class Server:
    """One server: jupyter-server's settings, the extension's presence and monitor."""

    def __init__(self, monkeypatch, *, env: dict[str, str] | None = None) -> None:
        for name, value in {
            "FRACSPAWNER_GPU_SLICE": "1/4",
            "FRACSPAWNER_KERNEL_GPU_IDLE_SECONDS": str(int(KERNEL_GPU_IDLE)),
            **(env or {}),
        }.items():
            monkeypatch.setenv(name, value)
        self.km = FakeKernelManager()
        self.settings: dict = {
            "kernel_manager": self.km, "started": T0, "api_last_activity": T0,
            "last_activity_times": {},
        }  # fmt: skip
        self.presence = Presence(settings=self.settings, timeout=TIMEOUT)
        self.settings[SETTINGS_KEY] = self.presence
        self.monitor = monitor_module.GpuMonitor(settings=self.settings, source_spec="none")
        self.monitor.reason, self.monitor.started = None, T0
        self.km.kernels["k"] = FakeKernel(T0)
        self.now = T0

    def poll(self) -> None:
        """JupyterLab's REST polling: an authenticated API request."""
        self.settings["api_last_activity"] = self.now

    def tab(self, idle_seconds: float, *, visible: bool = True, client: str = "tab-1") -> None:
        body = {"client": client, "visible": visible, "focused": visible,
                "idle_seconds": idle_seconds}  # fmt: skip
        self.presence.record(*parse_client_report(body, self.now))

    def reading(self) -> list[str]:
        """One GPU reading (the kernel holds 8 GiB, idle), then the kernel rule; the culled."""
        procs = [GpuProcess("0", 8192, 0.0, kernel_id=k) for k in self.km.kernels]
        device = GpuDevice("0", "NVIDIA H100 80GB HBM3", "GPU-0", 81559, 8192, 0)
        owned = [(p.kernel_id, p) for p in procs]
        self.monitor.apply(GpuSample("sim", [device], procs), owned, set(self.km.kernels), self.now)
        return asyncio.run(self.monitor.cull_idle_kernels(self.now))

    def report(self) -> dict:
        return self.monitor.report(
            server_last_activity=server_activity(self.settings, self.now),
            user_last_activity=user_activity(self.settings, self.now),
            now=self.now,
        )


def run_day(server: Server, minutes: int, inputs: set[int], *, tab_open: bool = True) -> int:
    """Minutes go by; JupyterLab polls while its tab is open; the person touches the tab at the
    minutes in `inputs`. Returns the minute the kernel was shut down (-1: never)."""
    last_input = 0.0
    for second in range(0, minutes * 60, POLL):
        server.now = t(second)
        if tab_open:
            server.poll()
        if second % 60 == 0:
            if second // 60 in inputs:
                last_input = second
            if tab_open:  # the tab's report, every minute
                server.tab(second - last_input)
            if server.reading():
                return second // 60
    return -1


def test_an_untouched_open_tab_does_not_keep_an_idle_gpu_kernel(monkeypatch):
    """The most common waste: JupyterLab left open on a desk. Its polling every 10 s used to
    keep every idle GPU kernel alive for ever; now the kernel goes once its person has been
    away for kernel_gpu_idle (away: no input for the presence timeout) and out of session (a
    visible tab nobody touches may be a person reading: in session for the session timeout
    after they were last seen, issue 36; serverext/presence.py)."""
    server = Server(monkeypatch)
    culled_at = run_day(server, 200, inputs={0, 5})
    # last input at minute 5; away from minute 20 (15 min later), in session until 2 h after
    assert culled_at == 5 + TIMEOUT / 60 + max(KERNEL_GPU_IDLE, 7200.0) / 60
    assert server.km.kernels == {}
    # JupyterLab kept polling all along: jupyter-server's own activity says "just now"
    assert server.settings["api_last_activity"] == t(culled_at * 60)


def test_a_lecture_with_sparse_clicks_keeps_its_kernel(monkeypatch):
    """A person in a lecture touches the tab now and then (gaps up to 14 min): present, and the
    kernel stays however long the lecture goes on, with no API request counted at all."""
    server = Server(monkeypatch)
    clicks = {0, 14, 20, 33, 47, 60, 61, 75, 89, 100, 114, 128, 140, 154, 168}
    assert run_day(server, 180, inputs=clicks) == -1
    assert "k" in server.km.kernels
    report = server.report()
    assert report["presence"]["present"] is True
    assert report["warnings"] == []  # nothing to warn a present person of


def test_without_a_reporting_tab_the_api_still_counts(monkeypatch):
    """Another client (an older JupyterLab, VS Code, a script) reports no presence: its
    requests count as activity, as before (unknown is never idle)."""
    server = Server(monkeypatch)
    for second in range(0, 3 * 3600, POLL):
        server.now = t(second)
        server.poll()
        if second % 60 == 0:
            assert server.reading() == []
    assert server.report()["presence"]["known"] is False


@pytest.mark.parametrize("says_goodbye", [True, False])
def test_a_closed_tab_stops_counting_and_polling_stops_with_it(monkeypatch, says_goodbye):
    """The tab closed at minute 10: no more polling, no more reports. Closing reports the tab
    hidden (presence.ts on `pagehide`): the person was there until then. A tab that vanishes
    without a word (a crash, the network gone) counts until its report is stale (3 min)."""
    server = Server(monkeypatch)
    run_day(server, 10, inputs={0, 9})
    server.now = t(10 * 60)
    if says_goodbye:
        server.tab(60, visible=False)
    gone = 10 if says_goodbye else 9 + 3  # the last report (minute 9) plus 3 intervals
    minute = 10
    while not server.reading():
        minute += 1
        server.now = t(minute * 60)
    assert minute == gone + KERNEL_GPU_IDLE / 60


def test_presence_rules():
    p = Presence(timeout=600.0, interval=60.0)
    assert not p.known(T0) and p.last_present(T0) is None
    p.record("a", ClientReport(True, True, t(0), t(0)))
    assert p.known(t(1)) and p.present(t(1))
    assert p.last_present(t(120)) == t(120)  # present: now
    # reports every minute, no input for longer than the timeout: away since input + timeout
    for second in range(60, 661, 60):
        p.record("a", ClientReport(True, False, t(0), t(second)))
    assert p.known(t(660)) and not p.present(t(660))
    assert p.last_present(t(700)) == t(600)
    # hidden: away at once; the input it reports still counts as a moment seen
    p.record("b", ClientReport(False, False, t(650), t(680)))
    assert not p.present(t(690)) and p.last_present(t(690)) == t(650)
    # a second tab, visible and used: present
    p.record("c", ClientReport(True, True, t(700), t(700)))
    assert p.present(t(701))
    # every tab silent for 3 intervals: presence unknown (closed, frozen, offline)
    assert not p.known(t(700 + 181)) and not p.present(t(700 + 181))
    assert p.last_present(t(2000)) == t(880)  # the last report's presence ran until stale


def test_a_reloaded_page_s_old_tab_keeps_no_one_in_session():
    """A reload sends the old page's "hidden" report, then its "closing" one (pagehide), in
    either order; the new page is visible and untouched. The old tab is gone at once: not a
    hidden tab of a person seen lately (in session, so no kernel would be shut down or warned
    of) until its reports go stale three minutes later."""
    for order in ("hidden first", "closing first"):
        p = Presence(timeout=1.0, interval=60.0, session_timeout=7200.0)
        p.record("old", ClientReport(True, True, t(0), t(0)))
        hidden = ClientReport(False, False, t(5), t(5))
        closing = ClientReport(False, False, t(5), t(5), closing=True)
        for report in (hidden, closing) if order == "hidden first" else (closing, hidden):
            p.record("old", report)
        p.record("new", ClientReport(True, False, t(5), t(6)))
        assert list(p.clients) == ["new"], order
        assert p.as_json(t(30))["tabs"] == 1, order  # the new page only
        assert p.last_present(t(30)) == t(6), order  # what the old page said still counts


def test_a_closing_report_must_say_true_or_false():
    body = {"client": "a", "visible": False, "focused": False, "idle_seconds": 0}
    assert parse_client_report({**body, "closing": True}, T0)[1].closing
    with pytest.raises(PresenceError, match="closing"):
        parse_client_report({**body, "closing": "yes"}, T0)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ([], "JSON object"),
        ({"visible": True, "focused": True, "idle_seconds": 0}, "client"),
        ({"client": "x" * 65, "visible": True, "focused": True, "idle_seconds": 0}, "client"),
        ({"client": "a", "visible": "yes", "focused": True, "idle_seconds": 0}, "visible"),
        ({"client": "a", "visible": True, "idle_seconds": 0}, "focused"),
        ({"client": "a", "visible": True, "focused": True, "idle_seconds": -1}, "idle_seconds"),
        ({"client": "a", "visible": True, "focused": True, "idle_seconds": "1"}, "idle_seconds"),
        ({"client": "a", "visible": True, "focused": True}, "idle_seconds"),
    ],
)
def test_bad_presence_reports_say_which_field(body, field):
    with pytest.raises(PresenceError, match=field):
        parse_client_report(body, T0)


# --- the culler: a present user's server is kept; the poller's activity does not count -----
M, H = 60.0, 3600.0
NOW = T0.timestamp() + 10 * H
POLICY = IdlePolicy(
    kernel_gpu_idle=30 * M, server_gpu_idle=1 * H, server_idle=8 * H, max_age=None,
    server_unattended=24 * H,
)  # fmt: skip


def facts(**kw) -> ServerFacts:
    base = {"user": "alice", "user_options": {"gpu": "1/4", "pool": "h100"},
            "started": NOW - 12 * H}  # fmt: skip
    return ServerFacts(**{**base, **kw})


def gpu_report(*, present: bool | None, activity_ago: float, gpu_idle: float) -> dict:
    def iso(seconds_ago: float) -> str:
        return datetime.fromtimestamp(NOW - seconds_ago, timezone.utc).isoformat()

    body = {
        "available": True, "sampled_at": iso(0), "monitor_started": iso(12 * H),
        "server_last_activity": iso(activity_ago), "user_last_activity": iso(activity_ago),
        "gpu_idle_since": iso(gpu_idle), "gpu_memory_mib": 8192, "gpu_activity_known": True,
    }  # fmt: skip
    if present is not None:
        body["presence"] = {"known": True, "present": present}
    return body


def decide(hub_last_ago: float, report: dict, policy=POLICY):
    parsed = parse_report(report, received_at=NOW)
    server = facts(
        last_activity=NOW - hub_last_ago,
        own_last_activity=parsed.server_last_activity,
        user_last_activity=parsed.user_last_activity,
        present=parsed.present,
        in_session=parsed.in_session,
    )
    return decide_server(server, parsed.gpu, policy, NOW), server


def test_the_culler_never_stops_a_present_user_s_server():
    """Present per its own report: kept, even where every idle rule has fired."""
    long_idle = IdlePolicy(None, server_gpu_idle=60.0, server_idle=60.0, max_age=None,
                           server_unattended=60.0)  # fmt: skip
    report = gpu_report(present=True, activity_ago=5 * H, gpu_idle=5 * H)
    d, server = decide(5 * H, report, long_idle)
    assert (d.action, d.reason) == ("keep", "present"), d.message
    assert server_deadlines(server, _reading(report), long_idle) == []


def _reading(report: dict):
    from fracspawner.culler.decide import Reading

    return Reading(parse_report(report, received_at=NOW).gpu)


def test_max_age_still_stops_a_present_user_s_server():
    """max_age is the operator's hard bound, busy, used or not (and the meter warns of it)."""
    policy = IdlePolicy(None, server_gpu_idle=None, server_idle=None, max_age=11 * H)
    d, _ = decide(0, gpu_report(present=True, activity_ago=0, gpu_idle=5 * H), policy)
    assert (d.action, d.reason) == ("stop", "max_age")


def test_an_abandoned_tab_s_polling_does_not_keep_the_server():
    """The hub's last_activity counts the open tab's polling (through the proxy and the
    server's activity posts): seconds ago. The server knows its person is away and has been
    for 2 h: its GPU server is stopped by server_gpu_idle, as if the tab were closed."""
    report = gpu_report(present=False, activity_ago=2 * H, gpu_idle=3 * H)
    d, _ = decide(10.0, report)
    assert (d.action, d.reason) == ("stop", "gpu_idle"), d.message
    # without presence (an older extension, another client) the hub's word still counts
    report.pop("presence")
    d, _ = decide(10.0, report)
    assert (d.action, d.reason) == ("keep", "active"), d.message


def test_the_report_carries_presence(monkeypatch):
    server = Server(monkeypatch)
    server.now = t(60)
    server.tab(10)
    report = server.report()
    assert report["presence"] == {
        "known": True, "present": True, "last_present": "2026-03-02T09:01:00Z", "tabs": 1,
        "visible_tabs": 1, "in_session": True, "elsewhere": False, "timeout": TIMEOUT,
        "session_timeout": 7200.0, "interval": 60.0,
    }  # fmt: skip
    assert parse_report(report, received_at=t(60).timestamp()).present is True
    # the server's own activity leaves the polling out where presence is known
    for second in range(120, 3601, 60):
        server.now = t(second)
        server.poll()
        server.tab(second - 50)
    assert server_activity(server.settings, server.now) == t(50 + TIMEOUT)
    assert server.report()["presence"]["present"] is False


def test_a_person_back_at_a_tab_is_told_to_the_culler_at_once():
    """A person who was away and is back at a tab (visible, used) makes the server report to
    the culler at once, not at its next report interval: until then the culler holds the
    previous report's "away", and may release the server of a person sitting down at it (a
    scratch replay of the classroom on half the GPUs culled a present user that way). Only the
    step from away (or unknown) to present asks; a present person's next reports do not."""
    backs: list[datetime] = []
    p = Presence(timeout=600.0, interval=60.0)
    p.on_back = lambda: backs.append(p.last_present(t(0)) or T0)
    p.record("a", ClientReport(True, True, t(0), t(0)))  # unknown -> present
    assert len(backs) == 1
    for second in range(60, 601, 60):  # present: no more
        p.record("a", ClientReport(True, second < 300, t(min(second, 240)), t(second)))
    assert len(backs) == 1
    p.record("a", ClientReport(True, False, t(240), t(900)))  # away since 240 + 600
    assert not p.present(t(900)) and len(backs) == 1
    p.record("b", ClientReport(False, False, t(240), t(950)))  # a hidden tab: still away
    assert len(backs) == 1
    p.record("a", ClientReport(True, True, t(1000), t(1000)))  # back
    assert len(backs) == 2
    # a callback that raises does not lose the tab's report
    p.on_back = lambda: 1 / 0
    p.record("c", ClientReport(True, True, t(5000), t(5000)))
    assert "c" in p.clients and p.present(t(5001))
