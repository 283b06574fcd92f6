"""The picker's quota line when the fracspawner service cannot tell what a user's servers hold
("unknown is never idle, and never allowed"): a hub without node/pod read access
(`live_capacity = False`, the service with `--no-live-capacity`) whose service was registered
before it could read users' servers (no `read:servers!user`). The form's numbers, from the
hub's own state, stay, marked as of page load; a refresh never turns them into "0 in use" nor
a size the quota ruled out into an allowed one.

Real JupyterHub, proxy, fracspawner service and devcluster; Debian's Chromium via Playwright.
"""

from __future__ import annotations

import pytest

from tests.browser_helpers import close_page, login, new_page, open_spawn_form
from tests.e2e_helpers import spawn

# `browser` and `clean_servers` are tests/conftest.py's
pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.usefixtures("clean_servers")]

HUB_EXTRA_CONFIG = """
c.FracSpawner.live_capacity = False
for _service in c.JupyterHub.services:
    if _service["name"] == "fracspawner":
        _service["command"] = [*_service["command"], "--no-live-capacity"]
        _service["oauth_client_allowed_scopes"] = ["read:users:groups!user"]
"""
REFRESH_WAIT_MS = 30_000  # two picker refreshes (10 s) plus a slow first OAuth round trip
AS_OF = "As of page load; the hub checks your quota again when you press Start."


def _text(page, selector: str) -> str:
    return " ".join(page.locator(selector).inner_text().split())


def test_a_refresh_that_cannot_tell_usage_keeps_the_forms_quota(hub, devcluster, browser):
    # the demo's default rule: the H100 pool, at most 1/4 GPU; another server holds 1/8
    status, body = spawn(hub, "una", {"gpu": "1/8", "pool": "h100"}, server="side")
    assert status in (201, 202), body
    hub.wait_ready("una", "side")
    # a quarter more is refused; the form comes back with it chosen, as the user left it
    status, body = spawn(hub, "una", {"gpu": "1/4", "pool": "h100"})
    assert status == 400 and body["message"].startswith("Quota:"), body

    page = new_page(browser)
    login(page, hub.url, "una")
    open_spawn_form(page, hub.url, "una")
    quota = "Your GPU quota: 1/8 of 1/4 GPU in use, 1/8 GPU left."
    # the form's own numbers (a first refresh may already have added the note below)
    assert _text(page, "#fs-quota").startswith(quota)
    unavailable = "is unavailable: Needs 1/4 GPU; your quota has 1/8 GPU left."
    assert page.locator('input[name="gpu"][value="1/4"]').is_checked()
    assert unavailable in _text(page, "#fs-summary-line")

    # the service answers, but does not know what una's servers hold
    api = page.request.get(hub.url + "/services/fracspawner/api/offers").json()["quota"]
    assert (api["used_gpu"], api["used_text"], api["remaining_text"]) == (None, "unknown", None)
    page.locator(".fs-quota-asof").wait_for(state="visible", timeout=REFRESH_WAIT_MS)
    assert _text(page, "#fs-quota") == f"{quota} {AS_OF}"
    assert unavailable in _text(page, "#fs-summary-line")
    card = page.locator(".fs-pool-card[data-pool=h100]")
    assert "unavailable" in card.get_attribute("class")
    assert "Unavailable: Needs 1/4 GPU; your quota has 1/8 GPU left." in card.inner_text()

    # the service's own page says it does not know, never "0 in use"
    page.goto(hub.url + "/services/fracspawner/")
    assert _text(page, "#fs-page-quota") == (
        "Your GPU quota: 1/4 GPU; what your servers hold now is not known here, the hub checks "
        "it when you press Start."
    )
    assert not page.errors and not page.dialogs
    close_page(page)
