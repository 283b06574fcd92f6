"""Presence of a person, not of a tab (issue 36, item 3).

- A lecture: the student ran the setup cell, then put the slides in front (another tab of the
  same browser): their notebook tab is hidden but open and reporting. Their kernel may be
  hibernated, never shut down while they are in session (up to `Presence.session_timeout`).
- Other clients: while a JupyterLab tab reports presence, the API requests of the page's own
  polling are not the user's activity, but a script's, VS Code's or `jupyter console`'s requests
  (no browser page behind them) still are.

The virtual clock and the server model are tests/test_presence.py's.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from datetime import datetime

import pytest

from fracspawner.serverext.clients import from_page
from fracspawner.serverext.presence import ClientReport, Presence
from tests.test_culler_support import JupyterServer
from tests.test_presence import KERNEL_GPU_IDLE, Server, t

SESSION = 2 * 3600.0  # Presence.session_timeout's default


def run(server: Server, minutes: range, *, inputs: set[int], visible) -> int:
    """Each minute: the tab reports (visible or not by `visible(minute)`), then one GPU reading
    and the kernel rule. The minute the kernel was shut down (-1: never)."""
    last_input = 0
    for minute in minutes:
        server.now = t(minute * 60)
        if minute in inputs:
            last_input = minute
        server.tab((minute - last_input) * 60, visible=visible(minute))
        if server.reading():
            return minute
    return -1


def test_a_hidden_notebook_tab_in_a_lecture_keeps_its_kernel(monkeypatch):
    """Setup cell at minute 0-2, slides in front from minute 2 to 62 (an hour's lecture), back
    to the notebook after: the kernel is never shut down (today: at minute 2 + 30)."""
    server = Server(monkeypatch)
    culled = run(server, range(0, 62), inputs={0, 1, 2}, visible=lambda m: m <= 2)
    assert culled == -1, f"shut down at minute {culled}, in the middle of the lecture"
    report = server.report()
    assert report["presence"]["present"] is False  # hidden: may be hibernated
    assert report["presence"]["in_session"] is True  # but never shut down
    assert report["warnings"] == []  # nothing is shut down while they stay: nothing to warn of
    # back after the lecture: the same kernel, the model loaded
    assert run(server, range(62, 70), inputs={62}, visible=lambda m: True) == -1
    assert "k" in server.km.kernels


def test_a_hidden_tab_keeps_kernels_for_the_session_timeout_only(monkeypatch):
    """A hidden tab of a browser left running (another window in front, a locked screen) is not a
    person for ever: its kernel, idle for kernel_gpu_idle long before, goes when the session ends
    (last seen + the session timeout), not before."""
    server = Server(monkeypatch)
    culled = run(server, range(0, 200), inputs={0}, visible=lambda m: m == 0)
    # visible at minute 0, hidden from minute 1: last seen at minute 1
    assert culled == 1 + int(max(KERNEL_GPU_IDLE, SESSION) / 60)


def test_a_silent_reader_at_a_visible_tab_stays_in_session():
    """Reading or thinking for 45+ min at a visible tab, without a key or a click (issue 36
    item 6, the research trace): away after the presence timeout, so idle kernels may be
    hibernated, but in session (never shut down) until the session timeout after they were
    last seen. The browser cannot tell this person from an abandoned desk: that desk keeps its
    kernels as long, hibernated, and no longer."""
    p = Presence(timeout=900.0, interval=60.0)
    for second in range(0, 3600, 60):  # input at t(0), then an hour of silence, visible
        p.record("a", ClientReport(True, True, t(0), t(second)))
    assert not p.present(t(3599))  # away for hibernation after the presence timeout
    assert p.in_session(t(3599))  # but in session: no kernel shut down
    for second in range(3600, 900 + int(SESSION) + 61, 60):  # the abandoned desk, still visible
        p.record("a", ClientReport(True, False, t(0), t(second)))
    # last seen at t(900) (its input + the presence timeout): in session until + session_timeout
    assert p.in_session(t(900 + SESSION - 1))
    assert not p.in_session(t(900 + SESSION))


def test_a_closed_tab_ends_the_session_when_its_reports_stop():
    p = Presence(timeout=900.0, interval=60.0)
    p.record("a", ClientReport(False, False, t(0), t(60)))  # pagehide: hidden, then silence
    assert p.in_session(t(61))
    assert not p.in_session(t(60 + 3 * 60 + 1))  # stale: closed, frozen or offline


@pytest.mark.parametrize(
    ("headers", "page"),
    [
        ({"Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors"}, True),  # Lab's fetch()
        ({"Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "navigate"}, False),  # a person
        ({"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "cors"}, False),  # another site
        ({}, False),  # VS Code's extension host, a script, jupyter console
        ({"Host": "hub.example.org", "Referer": "http://hub.example.org/user/a/lab"}, True),
        ({"Host": "hub.example.org", "Referer": "http://elsewhere.example/"}, False),
        ({"Referer": "http://hub.example.org/user/a/lab"}, False),  # no Host: not this host
    ],
)
def test_which_requests_are_a_page_s(headers, page):
    """Fetch Metadata where the browser sends it (secure origins); over plain HTTP, where it
    sends none, a Referer of this host."""
    assert from_page(headers) is page


def _request(url: str, token: str, *, from_page: bool) -> int:
    """An authenticated GET; `from_page`: as a JupyterLab page's fetch() sends it (a browser adds
    the Fetch Metadata headers to every request; a script, VS Code's Node extension host or
    `jupyter console` send none)."""
    req = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    if from_page:
        req.add_header("Sec-Fetch-Site", "same-origin")
        req.add_header("Sec-Fetch-Mode", "cors")
        req.add_header("Sec-Fetch-Dest", "empty")
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.status


def _user_activity(server: JupyterServer) -> datetime:
    return datetime.fromisoformat(server.gpu()["user_last_activity"].replace("Z", "+00:00"))


def test_other_clients_count_while_a_lab_tab_reports(tmp_path):
    """A real jupyter server with the extension: a Lab tab reports presence (visible, its person
    away for an hour). The page's polling is not the user's activity; a script's request is."""
    gpu_file = tmp_path / "gpu.json"
    gpu_file.write_text(json.dumps({"devices": []}))
    server = JupyterServer(tmp_path, gpu_file)
    try:
        away = {"client": "tab-1", "visible": True, "focused": False, "idle_seconds": 3600}
        status, body = server.api("POST", "/api/fracspawner/presence", away)
        assert status == 200 and body["known"] and not body["present"], body
        time.sleep(1.1)
        before = _user_activity(server)
        assert _request(f"{server.url}/api/kernels", server.token, from_page=True) == 200
        assert _user_activity(server) == before  # the tab's polling: nobody
        time.sleep(1.1)
        assert _request(f"{server.url}/api/contents", server.token, from_page=False) == 200
        after = _user_activity(server)
        assert after > before, (before, after, server.logs())
        # the page's requests still leave it where the script put it
        assert _request(f"{server.url}/api/sessions", server.token, from_page=True) == 200
        assert _user_activity(server) == after
    finally:
        server.stop()


def test_the_culler_keeps_a_server_whose_user_is_in_session():
    """The lecture runs past server_gpu_idle (1 h): the server's report says its person is in
    session (a hidden tab, seen 70 min ago); the culler keeps the server, and the kernels in it,
    as it keeps a present user's. Once the session is over, the idle rules apply again."""
    from tests.test_presence import decide, gpu_report

    report = gpu_report(present=False, activity_ago=70 * 60, gpu_idle=70 * 60)
    report["presence"]["in_session"] = True
    d, _ = decide(70 * 60, report)
    assert (d.action, d.reason) == ("keep", "in_session"), d.message
    report["presence"]["elsewhere"] = True  # only by the culler's word about another server
    d, _ = decide(70 * 60, report)
    assert (d.action, d.reason) == ("stop", "gpu_idle"), d.message
    report["presence"].update(in_session=False, elsewhere=False)
    d, _ = decide(70 * 60, report)
    assert (d.action, d.reason) == ("stop", "gpu_idle"), d.message


# --- present in the hub session: a tab of another server of theirs --------------------------
def test_a_tab_on_another_server_of_theirs_keeps_this_servers_kernels(monkeypatch):
    """The user works in a visible tab of their server "cpu"; their GPU server's own tab is
    hidden (or closed). The culler, answering the GPU server's report, says its user is present
    on another server of theirs: its idle kernels may hibernate, never be shut down, for as long
    as the culler keeps saying so (then until the word is stale: 3 report intervals)."""
    server = Server(monkeypatch)
    elsewhere = {"presence": {"elsewhere": "present"}}
    for minute in range(0, 90):
        server.now = t(minute * 60)
        server.presence.on_culler_answer(elsewhere, server.now)
        assert server.reading() == [], f"shut down at minute {minute}"
    report = server.report()
    assert report["presence"]["in_session"] is True and report["presence"]["elsewhere"] is True
    # the culler stops saying so: the word runs out, then kernel_gpu_idle applies as before
    minute = 90
    while not server.reading():
        minute += 1
        server.now = t(minute * 60)
    assert minute == 89 + 3


def test_the_culler_tells_a_server_its_user_is_present_on_another():
    from fracspawner.culler.app import Culler
    from fracspawner.culler.decide import ServerFacts
    from fracspawner.culler.identity import Identity
    from fracspawner.culler.reports import parse_report
    from tests.test_presence import NOW, gpu_report

    culler = Culler()
    for name in ("", "cpu"):
        culler.known[("ann", name)] = ServerFacts("ann", name)
    culler.known[("bob", "")] = ServerFacts("bob", "")
    gpu = gpu_report(present=False, activity_ago=3600, gpu_idle=3600)
    cpu = gpu_report(present=True, activity_ago=0, gpu_idle=3600)
    for user, name, body in (("ann", "", gpu), ("ann", "cpu", cpu), ("bob", "", gpu)):
        culler.reports.put(user, name, parse_report(body, received_at=NOW))
    answer = culler.answer_report(Identity("ann", ""), now=NOW)
    assert answer == {"presence": {"elsewhere": "present"}}
    assert culler.answer_report(Identity("bob", ""), now=NOW) is None  # not ann's
    # a server kept only by the word about another is no evidence for that other (no loop)
    loop = gpu_report(present=False, activity_ago=3600, gpu_idle=3600)
    loop["presence"].update(in_session=True, elsewhere=True)
    culler.reports.put("ann", "cpu", parse_report(loop, received_at=NOW))
    assert culler.answer_report(Identity("ann", ""), now=NOW) is None


def test_a_hidden_notebook_tab_in_a_lecture_may_hibernate_never_be_shut_down(monkeypatch):
    """The same lecture on a pool that hibernates idle kernels after 10 min: the setup cell's
    model goes to host memory 10 min after the student was last seen (the tab hidden at minute
    3), and the kernel is still there, hibernated, when the lecture ends an hour later."""
    from fracspawner.serverext.hibernate import KernelSleep

    server = Server(monkeypatch, env={"FRACSPAWNER_KERNEL_GPU_HIBERNATE_SECONDS": "600"})
    hib = server.monitor.hibernator
    hib.enabled = True
    hibernated_at: list[int] = []

    async def hibernate(kid, pids, memory_mib, *, kernel_pid=None, why="idle") -> str:
        hibernated_at.append(int((server.now - t(0)).total_seconds() // 60))
        hib.kernels[kid] = KernelSleep(kid, state="hibernated", memory_mib=memory_mib)
        return "hibernated"

    monkeypatch.setattr(hib, "hibernate", hibernate)
    last_input = 0
    for minute in range(0, 65):
        server.now = t(minute * 60)
        last_input = minute if minute <= 2 else last_input
        server.tab((minute - last_input) * 60, visible=minute <= 2)
        assert server.reading() == [], f"shut down at minute {minute}"
        asyncio.run(server.monitor.hibernate_idle_kernels(server.now))
    assert hibernated_at == [3 + 10]
    assert "k" in server.km.kernels and hib.kernels["k"].state == "hibernated"


def test_a_person_back_at_a_tab_makes_the_server_report_at_once(tmp_path):
    """A real jupyter server with the extension, reporting to a culler every hour: a tab that
    says its person is back (visible, just used) makes it report now, so the culler does not
    act for an hour on the last report's "away"."""
    from tests.test_overcommit_meter import Culler

    receiver = Culler.start()
    posts = receiver.posts
    gpu_file = tmp_path / "gpu.json"
    gpu_file.write_text(json.dumps({"devices": []}))
    env = {
        "FRACSPAWNER_CULLER_URL": f"http://127.0.0.1:{receiver.server_address[1]}/",
        "JUPYTERHUB_API_TOKEN": "server-token",
    }
    server = JupyterServer(
        tmp_path, gpu_file, env=env, config={"GpuReporter": {"report_interval": 3600}}
    )
    try:
        deadline = time.monotonic() + 60
        while not posts and time.monotonic() < deadline:  # the report at start
            time.sleep(0.2)
        assert posts, server.logs()
        away = {"client": "tab-1", "visible": True, "focused": False, "idle_seconds": 3600}
        assert server.api("POST", "/api/fracspawner/presence", away)[0] == 200
        time.sleep(2)
        first = len(posts)  # an away tab asks nothing
        back = {"client": "tab-1", "visible": True, "focused": True, "idle_seconds": 0}
        status, body = server.api("POST", "/api/fracspawner/presence", back)
        assert status == 200 and body["present"], body
        deadline = time.monotonic() + 30
        while len(posts) == first and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(posts) > first, ("no report after the person came back", server.logs())
        assert posts[-1]["presence"]["present"] is True, posts[-1]["presence"]
    finally:
        server.stop()
        receiver.shutdown()
