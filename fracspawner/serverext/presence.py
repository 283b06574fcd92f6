"""Whether a person is at this server: told by the browser, never inferred from its polling.

JupyterLab polls the server's REST API while its tab is visible (kernels, sessions and
terminals every 10 s: @jupyterlab/services kernel/manager.ts, session/manager.ts and
terminal/manager.ts, `Poll` with `interval: 10 * 1000` and `standby: 'when-hidden'`), and
jupyter-server counts every authenticated API request as activity (`APIHandler.finish` ->
`update_api_activity` -> `settings["api_last_activity"]`, read by
`ServerWebApplication.last_activity()`). So a tab left open on a desk looks busy for ever, and
a person reading a notebook for half an hour without a request looks gone.

The GPU meter (labextension/src/presence.ts) tells the server what only the browser knows: is
the tab visible, is it focused, how long since the last keyboard, mouse, touch or scroll input.
The server decides with its own `timeout` (the browser reports facts, not a verdict): a person
is present while some tab is visible and had input within `timeout`, as of a report no older
than `stale`. While any tab reports (presence "known"), the API requests of the polling no
longer count as the user's activity (activity.py); where no tab reports (another client, an
older JupyterLab, every tab closed), nothing changes: unknown is never idle.

A person is more than a visible tab with input: a student whose notebook tab is hidden behind
the lecture's slides (another tab of the same browser) is still there, and so is a researcher
reading or thinking for 45 minutes at a visible tab without a key or a click. So a tab that is
open and reporting, hidden or visible, keeps its user **in session** for `session_timeout` after
they were last seen: their idle kernels may then be hibernated (the GPU memory goes to host
memory and comes back on the next cell), never shut down (issue 36, item 3). The browser cannot
tell the silent reader from an abandoned desk (a visible tab nobody is at): the desk keeps its
kernels as long, hibernated, and its server is stopped once the session ends. A person is also
in session here while the culler says they are present (or in session) at a tab of **another
server of theirs** (`on_culler_answer`, in the answer to this server's report), until its word
is stale.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from traitlets import Float, Integer, default
from traitlets.config import LoggingConfigurable

ENV_TIMEOUT = "FRACSPAWNER_PRESENCE_TIMEOUT_SECONDS"
ENV_SESSION = "FRACSPAWNER_PRESENCE_SESSION_SECONDS"
SESSION_DEFAULT = 2 * 3600.0  # a lecture with its lab part (90 min), with room to spare
SETTINGS_KEY = "fracspawner_presence"  # the Presence object in the web app's settings
# jupyter-server's last_activity() takes every settings key ending in "_last_activity": the
# person's presence is kept there too, so what the server tells the hub includes it
ACTIVITY_KEY = "fracspawner_presence_last_activity"
CLIENT_MAX = 64  # characters of a client (tab) id
MAX_CLIENTS = 32  # tabs remembered at once (the oldest report is forgotten first)


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class PresenceError(ValueError):
    """A presence report that does not make sense; the message says which field."""


@dataclass
class ClientReport:
    """One tab's latest word, in the server's clock."""

    visible: bool
    focused: bool
    last_input: datetime  # received_at - idle_seconds
    received_at: datetime
    closing: bool = False  # the page is going away (closed, reloaded, navigated from)


def parse_client_report(body: Any, received_at: datetime) -> tuple[str, ClientReport]:
    """`{"client": "...", "visible": true, "focused": false, "idle_seconds": 12.5}` (and
    `"closing": true` from a page going away) -> facts. Raises PresenceError naming the field
    for anything else."""
    if not isinstance(body, dict):
        raise PresenceError("expected a JSON object")
    client = body.get("client")
    if not isinstance(client, str) or not client or len(client) > CLIENT_MAX:
        raise PresenceError(f"client: expected a tab id of 1 to {CLIENT_MAX} characters")
    flags = {}
    for name in ("visible", "focused"):
        value = body.get(name)
        if not isinstance(value, bool):
            raise PresenceError(f"{name}: expected true or false")
        flags[name] = value
    idle = body.get("idle_seconds")
    if isinstance(idle, bool) or not isinstance(idle, int | float) or not 0 <= idle < 10**9:
        raise PresenceError("idle_seconds: expected a number of seconds, 0 or more")
    last_input = received_at - timedelta(seconds=float(idle))
    closing = body.get("closing", False)
    if not isinstance(closing, bool):
        raise PresenceError("closing: expected true or false")
    report = ClientReport(flags["visible"], flags["focused"], last_input, received_at, closing)
    return client, report


class Presence(LoggingConfigurable):
    """The tabs' reports and what they say about the person (see the module's docstring)."""

    timeout = Float(
        config=True,
        help="Seconds after a tab's last keyboard, mouse, touch or scroll input that its user "
        "still counts as present (while the tab is visible). A person reading or listening "
        "without touching anything for longer counts as away: their idle GPU kernels may then "
        "be hibernated (shut down only once `session_timeout` has passed too). Default: "
        f"${ENV_TIMEOUT} (an admin may put it in the notebooks' environment), else 900 (15 "
        "min). A tab's reports are its user's word, like their API requests: they can keep "
        "their own server, never anyone else's.",
    )
    session_timeout = Float(
        config=True,
        help="Seconds after its user was last seen (a visible tab with input) that a tab still "
        "open and reporting, hidden or not, keeps them in session: their idle GPU kernels may "
        "be hibernated then, never shut down (a student whose notebook is hidden behind the "
        "lecture's slides, a reader silent at a visible tab). Default: "
        f"${ENV_SESSION}, else {SESSION_DEFAULT:.0f} (2 h); never less than `timeout`.",
    )
    interval = Float(
        60.0,
        config=True,
        help="Seconds between two presence reports of a tab (the browser also reports at once "
        "when the tab is shown, hidden, or used again after a pause).",
    )
    stale_after = Integer(
        3,
        config=True,
        help="A tab that has not reported for this many intervals counts as gone (closed, "
        "frozen or offline): its presence ends with its last report.",
    )

    @default("timeout")
    def _default_timeout(self) -> float:
        try:
            value = float(os.environ.get(ENV_TIMEOUT, "").strip())
        except ValueError:
            return 900.0
        return value if value > 0 else 900.0

    @default("session_timeout")
    def _default_session_timeout(self) -> float:
        try:
            value = float(os.environ.get(ENV_SESSION, "").strip())
        except ValueError:
            return SESSION_DEFAULT
        return value if value > 0 else SESSION_DEFAULT

    def __init__(self, *, settings: dict | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.settings = settings if settings is not None else {}
        self.clients: dict[str, ClientReport] = {}
        self._closed: dict[str, None] = {}  # ids of pages that said they went away (ordered)
        self._last_present: datetime | None = None
        # the culler's word that the user is at a tab of another server of theirs, until when
        self._elsewhere_until: datetime | None = None
        # called when a report turns "away" (or unknown) into "present": the server reports to
        # the culler at once (serverext/__init__.py), which otherwise holds the last report's
        # "away" for up to a report interval and may release the server of a person sitting
        # down at it
        self.on_back: Callable[[], None] | None = None

    @property
    def stale(self) -> timedelta:
        return timedelta(seconds=self.interval * self.stale_after)

    def _present_until(self, c: ClientReport) -> datetime | None:
        """Until when this tab's last report keeps its user present (None: it does not)."""
        if not c.visible:
            return None
        return min(c.last_input + timedelta(seconds=self.timeout), c.received_at + self.stale)

    def _fold(self, c: ClientReport, now: datetime) -> None:
        """Carry what `c` says into the last moment a person was seen, up to `now`."""
        seen = [c.last_input]  # an input is a person, visible or not
        until = self._present_until(c)
        if until is not None and until >= c.received_at:
            seen.append(min(until, now))
        latest = max(t for t in seen if t <= now) if any(t <= now for t in seen) else None
        if latest is not None and (self._last_present is None or latest > self._last_present):
            self._last_present = latest
            self.settings[ACTIVITY_KEY] = latest

    def record(self, client: str, report: ClientReport) -> None:
        """A tab's report: the previous one of the same tab is folded in up to this moment."""
        was = self.present(report.received_at)
        self._record(client, report)
        if not was and self.on_back is not None and self.present(report.received_at):
            try:
                self.on_back()
            except Exception:  # the report is recorded; the culler hears at the next interval
                self.log.exception("fracspawner: telling the culler a person is back failed")

    def _record(self, client: str, report: ClientReport) -> None:
        old = self.clients.get(client)
        if old is not None:
            self._fold(old, report.received_at)
        if report.closing or client in self._closed:
            # a closed or reloaded page is no tab any more, hidden or not: what it said of
            # its person stays folded in, but it keeps no one in session (its "hidden" report,
            # sent just before, may arrive after this one: the id is remembered)
            self.clients.pop(client, None)
            if report.closing and client not in self._closed:
                self._closed[client] = None
                while len(self._closed) > MAX_CLIENTS:
                    del self._closed[next(iter(self._closed))]
            self._fold(report, report.received_at)
            return
        self.clients[client] = report
        if len(self.clients) > MAX_CLIENTS:
            oldest = min(self.clients, key=lambda k: self.clients[k].received_at)
            gone = self.clients.pop(oldest)
            self._fold(gone, report.received_at)
        self._fold(report, report.received_at)

    def _fresh(self, now: datetime) -> list[ClientReport]:
        return [c for c in self.clients.values() if now - c.received_at <= self.stale]

    def known(self, now: datetime | None = None) -> bool:
        """Whether some tab reports presence now (otherwise presence is unknown)."""
        return bool(self._fresh(now or utcnow()))

    def present(self, now: datetime | None = None) -> bool:
        now = now or utcnow()
        return any((self._present_until(c) or now) > now for c in self._fresh(now))

    def on_culler_answer(self, answer: Any, now: datetime | None = None) -> None:
        """The culler's answer to this server's report: `{"presence": {"elsewhere": "present"
        | "in_session"}}` when its user is at a tab of another server of theirs."""
        word = answer.get("presence") if isinstance(answer, dict) else None
        if isinstance(word, dict) and word.get("elsewhere") in ("present", "in_session"):
            self._elsewhere_until = (now or utcnow()) + self.stale

    def elsewhere(self, now: datetime | None = None) -> bool:
        """Whether the culler's word (at a tab of another server of theirs) still holds."""
        until = self._elsewhere_until
        return until is not None and (now or utcnow()) < until

    def session_until(self, now: datetime | None = None) -> datetime | None:
        """Until when its user is in session (see the module's docstring): a person seen within
        `session_timeout`, with a tab open and reporting that is hidden (or present), or at a
        tab of another server of theirs as the culler says. None: not in session now."""
        now = now or utcnow()
        here = self._session_here(now)
        if self.elsewhere(now):
            assert self._elsewhere_until is not None
            return max(here or now, self._elsewhere_until)
        return here

    def _session_here(self, now: datetime) -> datetime | None:
        fresh = self._fresh(now)
        if not fresh:
            return None
        if self.present(now):
            return now
        last = self.last_present(now)
        if last is None:
            return None
        until = last + timedelta(seconds=max(self.session_timeout, self.timeout))
        return until if until > now else None

    def in_session(self, now: datetime | None = None) -> bool:
        return self.session_until(now) is not None

    def last_present(self, now: datetime | None = None) -> datetime | None:
        """The last moment a person was seen at a tab ('now' while present); None: never."""
        now = now or utcnow()
        for c in self.clients.values():
            self._fold(c, now)
        return self._last_present

    def as_json(self, now: datetime | None = None) -> dict:
        """For the report: the culler keeps a present user's server, and reads the server's own
        activity (the polling left out) where presence is known."""
        now = now or utcnow()
        last = self.last_present(now)
        fresh = self._fresh(now)
        return {
            "known": bool(fresh),
            "present": self.present(now),
            "last_present": None if last is None else last.isoformat().replace("+00:00", "Z"),
            "tabs": len(fresh),
            "visible_tabs": sum(c.visible for c in fresh),
            # a hidden tab of a person seen within session_timeout: kernels never shut down
            "in_session": self.in_session(now),
            # in session only by the culler's word about another server of theirs: the culler
            # never counts this as evidence for that other server (no loop between two servers)
            "elsewhere": self.elsewhere(now) and self._session_here(now) is None,
            "timeout": self.timeout,
            "session_timeout": self.session_timeout,
            "interval": self.interval,
        }
