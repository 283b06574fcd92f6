"""Helpers for the browser tests: Debian's Chromium driven by Playwright, logging in to the hub.

The browser is never downloaded: Playwright drives /usr/bin/chromium (Debian's package).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

from tests.missing import missing

CHROMIUM = "/usr/bin/chromium"
# Headless, loopback only: nothing in the browser may phone home during the tests.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# Wide enough for JupyterHub's col-md-8 column, the layout most users see.
VIEWPORT = {"width": 1100, "height": 900}
REPO = Path(__file__).resolve().parent.parent
SCREENSHOTS = REPO / "docs" / "_static"


def require_chromium() -> None:
    """Debian's chromium and Playwright, or skip (fail in CI: tests/missing.py)."""
    problem = None
    if not os.access(CHROMIUM, os.X_OK):
        problem = f"{CHROMIUM} not installed (apt-get install chromium)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            problem = "playwright is not installed (pip install -e '.[test]')"
    if problem:
        missing(problem)


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Debian Chromium under Playwright; closed (process ended) on exit."""
    require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield browser
        finally:
            browser.close()


def new_page(browser: Any, **context_options: Any) -> Any:
    """A page in a fresh context (own cookies) that records dialogs and page errors.

    `page.dialogs` and `page.errors` let tests assert that no alert() ran and no script broke.
    """
    context = browser.new_context(viewport=VIEWPORT, **context_options)
    page = context.new_page()
    page.dialogs = []
    page.errors = []

    def on_dialog(dialog: Any) -> None:
        page.dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", on_dialog)
    page.on("pageerror", lambda error: page.errors.append(str(error)))
    return page


def close_page(page: Any) -> None:
    """Close a test's page and its context, after leaving for about:blank. A page closed while a
    navigation commits (Start's POST, the pending page's redirect into Lab) can hang for ever in
    Chromium: `Target.closeTarget` is acknowledged and the target never goes (microsoft/playwright
    #42366, #41900, #42068; a fresh-clone run hung 600 s in `page.close()` after Start). Going to
    about:blank first ends any navigation under way; one that another navigation interrupts is
    tried once more."""
    for attempt in (1, 2):
        try:
            page.goto("about:blank")
            break
        except Exception:  # interrupted by the page's own redirect, or the page is gone
            if attempt == 2 or page.is_closed():
                break
    page.context.close()


def login(page: Any, hub_url: str, user: str, password: str = "any") -> None:
    """Log in through the hub's real login page (DummyAuthenticator takes any password)."""
    page.goto(f"{hub_url}/hub/login")
    page.fill("#username_input", user)
    page.fill("#password_input", password)
    page.click("#login_submit")
    page.wait_for_url(re.compile(r".*/hub/(home|spawn|spawn-pending|user)/?.*|.*/user/.*"))


def open_spawn_form(page: Any, hub_url: str, user: str, server: str = "") -> None:
    page.goto(f"{hub_url}/hub/spawn/{user}" + (f"/{server}" if server else ""))
    page.wait_for_selector("#spawn_form")


def wait_for_lab(page: Any, hub_url: str, user: str, timeout_s: float = 120) -> None:
    """Follow the spawn-pending page until JupyterLab of the user's server has loaded."""
    page.wait_for_url(
        re.compile(re.escape(f"{hub_url}/user/{user}/") + r"lab.*"), timeout=timeout_s * 1000
    )
    page.wait_for_load_state("domcontentloaded")


def tab_to(page: Any, selector: str, limit: int = 60) -> None:
    """Press Tab until the element matching selector has focus (keyboard only, no clicks)."""
    for _ in range(limit):
        page.keyboard.press("Tab")
        if page.evaluate("(s) => document.activeElement.matches(s)", selector):
            return
    raise AssertionError(f"could not reach {selector} with Tab in {limit} presses")


def preview_html(form_html: str, theme: str = "light") -> str:
    """JupyterHub's spawn page layout around a rendered form, with JupyterHub's own CSS.

    For looking at the picker without a hub; the tests that matter use the real page.
    """
    from jupyterhub._data import DATA_FILES_PATH

    # the file starts with a byte order mark, which breaks its first rule when inlined
    css = (Path(DATA_FILES_PATH) / "static" / "css" / "style.min.css").read_text().lstrip("\ufeff")
    return f"""<!DOCTYPE html>
<html lang="en" data-bs-theme="{theme}"><head><meta charset="utf-8"><style>{css}</style></head>
<body><div class="container"><div class="row text-center"><h1>Server Options</h1></div>
<div class="row justify-content-center"><div class="col-md-8">
<form id="spawn_form" method="post" onsubmit="return false">{form_html}<br>
<div class="feedback-container">
<button type="submit" class="btn btn-jupyter form-control">Start</button></div>
</form></div></div></div></body></html>"""


def focus_visible(page: Any) -> bool:
    """Whether the focused element draws a focus indicator (an outline or a focus ring shadow)."""
    return page.evaluate(
        """() => {
            const style = getComputedStyle(document.activeElement);
            const outline = style.outlineStyle !== 'none' && parseFloat(style.outlineWidth) > 0;
            return outline || (style.boxShadow && style.boxShadow !== 'none');
        }"""
    )


def posted_fields(post_data: str) -> dict[str, str]:
    """The fields of a multipart/form-data body (the spawn form's enctype)."""
    return dict(re.findall(r'name="([^"]+)"\r\n\r\n([^\r]*)\r\n', post_data or ""))


def badge_text(page: Any, pool: str) -> str:
    return page.locator(f'.fs-pool-card[data-pool="{pool}"] .fs-badge').inner_text().strip()


def free_count(text: str) -> int:
    match = re.search(r"(\d+) of (\d+) free", text)
    assert match, f"no 'N of M free' in {text!r}"
    return int(match.group(1))


def stop_all_servers(hub: Any, cluster: Any) -> None:
    """Stop every server of every user, so one failed test leaves nothing for the next."""
    from tests.e2e_helpers import pods, stop, wait_until

    status, users = hub.api("GET", "/users")
    assert status == 200, users
    for user in users:
        for server in (user.get("servers") or {}).keys():
            stop(hub, quote(user["name"], safe=""), server)
    # by label, not user name: kubespawner escapes names that are not label-safe
    wait_until(lambda: not pods(cluster, component="singleuser-server"), what="pods deleted")
