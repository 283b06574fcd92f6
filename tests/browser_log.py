"""What a browser page said and asked, for the message of a test that fails on it.

A JupyterLab that does not finish loading says why only in the browser: a console error, a
request that failed or never came back, a stylesheet missing, a dialog. `PageLog` records those
from the page's first request; `PageLog.report` adds what the page looks like now around an
element that stayed hidden (its ancestors' display and size, the theme's stylesheet, whether
the page still renders frames).
"""

from __future__ import annotations

import time
from typing import Any

#: the page's state around a selector, in the page (JupyterLab's shell and theme included)
_LAYOUT_JS = """async (selector) => {
  const chain = [];
  for (let n = document.querySelector(selector); n && n !== document.documentElement;
       n = n.parentElement) {
    const s = getComputedStyle(n), r = n.getBoundingClientRect();
    chain.push(`${n.id ? '#' + n.id : n.tagName.toLowerCase()}.${[...n.classList].join('.')}`
      + ` display=${s.display} visibility=${s.visibility}`
      + ` ${Math.round(r.width)}x${Math.round(r.height)}`);
  }
  // a stylesheet that failed has an empty sheet: its rules say whether it arrived
  const rules = l => { try { return l.sheet ? l.sheet.cssRules.length : 'none'; }
                       catch (e) { return String(e); } };
  const sheets = [...document.querySelectorAll('link[rel=stylesheet]')].map(
    l => `${l.href} rules=${rules(l)}`);
  // JupyterLab hides its shell while a theme loads and shows it in an animation frame
  const frame = await new Promise(done => {
    const timer = setTimeout(() => done(false), 2000);
    requestAnimationFrame(() => { clearTimeout(timer); done(true); });
  });
  const dialogs = [...document.querySelectorAll('.jp-Dialog')].map(d => d.innerText.slice(0, 300));
  return {
    found: chain.length > 0, chain, sheets, frame, dialogs,
    visibility: document.visibilityState, focus: document.hasFocus(),
    splash: !!document.getElementById('jupyterlab-splash'),
    statusbarHeight: getComputedStyle(document.documentElement)
      .getPropertyValue('--jp-statusbar-height'),
  };
}"""


class PageLog:
    """Console messages, page errors and requests of one page, timed from its creation."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.start = time.monotonic()
        self.lines: list[str] = []
        self.pending: dict[Any, tuple[float, str]] = {}
        self.status: dict[Any, int] = {}
        page.on("console", lambda m: self._note(f"console.{m.type}: {m.text[:500]}"))
        page.on("pageerror", lambda e: self._note(f"pageerror: {e}"))
        page.on("crash", lambda _p: self._note("the page crashed"))
        page.on("request", self._request)
        page.on("response", self._response)
        page.on("requestfinished", self._finished)
        page.on("requestfailed", self._failed)

    def _now(self) -> float:
        return time.monotonic() - self.start

    def _note(self, line: str) -> None:
        self.lines.append(f"{self._now():7.2f}s {line}")

    def _request(self, request: Any) -> None:
        self.pending[request] = (self._now(), f"{request.method} {request.url}")

    def _response(self, response: Any) -> None:
        # the status from the event itself: no call back into the browser from a handler
        self.status[response.request] = response.status

    def _finished(self, request: Any) -> None:
        began, what = self.pending.pop(request, (self._now(), request.url))
        status = self.status.pop(request, None)
        if status is None or status >= 400 or self._now() - began > 10:
            self._note(f"{what} -> {status} after {self._now() - began:.1f}s")

    def _failed(self, request: Any) -> None:
        self.pending.pop(request, None)
        self.status.pop(request, None)
        self._note(f"{request.method} {request.url} failed: {request.failure}")

    def report(self, selector: str) -> str:
        """Everything recorded, the requests still open, and the layout around `selector`."""
        out = ["---- the page's log ----", *self.lines]
        now = self._now()
        for began, what in self.pending.values():
            out.append(f"still open after {now - began:.1f}s: {what}")
        try:
            state = self.page.evaluate(_LAYOUT_JS, selector)
        except Exception as exc:  # a crashed or closed page: the log is all there is
            state = {"error": str(exc)}
        out.append(f"---- {selector} now ----")
        out += [f"{key}: {value}" for key, value in state.items()]
        return "\n".join(out)
