"""The picker and a full waiting line (admission "wait", `max_waiting`): the hub's form knows
the line is full and rules full sizes out with the words Start would be refused with; the
fracspawner service, another process, does not know the line, and its refreshes never turn
such a size back into "your server would wait for one". Only one free again makes it takeable.

Debian's Chromium via Playwright runs the real form (rendered by a real FracSpawner for a
JupyterHub user, tests/hub_support.py) with the real picker script, in JupyterHub's page
layout (tests/browser_helpers.py `preview_html`). The service's answers stand in for
`GET /services/fracspawner/api/offers?admission=wait`: built by the same `build_offer_model`
call as the service's OffersHandler, from the same counts. The whole hub and service with a
line are tests/test_e2e_wait.py's; the picker against the real service is
tests/test_browser_picker.py's.
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from fracspawner.backends import load_catalog
from fracspawner.capacity import compute_capacity
from fracspawner.choice.offers import build_offer_model
from fracspawner.hub.waiting import WaitingSpawns
from tests.browser_helpers import close_page, new_page, preview_html
from tests.hub_support import HubUsers
from tests.test_admission import NODES, pod
from tests.test_waiting_line import CATALOG, FULL_T4, FullPool, everyone_at_once

pytestmark = [pytest.mark.browser]

PAGE = "http://hub.test/hub/spawn/b"
CLOSED = (
    "None free right now. Waiting is closed for now: 1 server already waits in line on this "
    "hub, the most it keeps waiting at once, so that others can still start."
)
AS_OF_LOAD = (
    "None free right now. Waiting is closed for now: 1 server already waits in line on this "
    "hub, the most it keeps waiting at once, so that others can still start (when this page "
    "was loaded; reload it to see whether a place has freed)."
)
ONE_FREE_T4 = compute_capacity(
    load_catalog(CATALOG), NODES, [pod(f"job-{i}", "t4", {"nvidia.com/gpu": "1"}) for i in range(3)]
)


def service_answer(capacity) -> str:
    """What the service answers the picker of a hub with admission "wait": it knows the counts
    and the user's rules, not the hub's line."""
    catalog = load_catalog(CATALOG)
    model = build_offer_model(
        catalog,
        rule=catalog.rule_for("b", []),
        used_gpu=0.0,
        capacity=capacity,
        full_waits=True,
    )
    assert model["waiting_line"]["known"] is False
    return json.dumps(model)


async def full_line_form() -> str:
    """b's form while a waits in the one place of the line, the T4 full; b chose 1/4 on the
    T4 last time (the form comes back with it)."""
    WaitingSpawns.shared().keys.clear()
    hub = HubUsers({"FracSpawner": {"catalog": CATALOG, "admission": "wait", "max_waiting": 1}})
    assert await everyone_at_once(hub, ["a"]) == ["in line"]
    b = hub.spawner(hub.user("b"))
    b.orm_spawner.user_options = {"gpu": "1/4", "pool": "t4"}
    b._capacity_watcher = FullPool  # type: ignore[method-assign]
    try:
        return await b._render_options_form_async(b)
    finally:
        WaitingSpawns.shared().keys.clear()


def text(page, selector: str) -> str:
    return " ".join(page.locator(selector).inner_text().split())


def test_a_full_line_stays_closed_through_the_services_refreshes(browser):
    # the hub's side on an event loop of its own (Playwright's runs in this thread)
    with ThreadPoolExecutor(1) as hub_thread:
        form = hub_thread.submit(asyncio.run, full_line_form()).result()
    # refresh every half second instead of 10 s
    form = form.replace('data-api-url="', 'data-refresh-ms="500" data-api-url="', 1)
    answers = {"now": None}  # None: the service does not answer (yet)
    asked = []

    def offers(route):
        asked.append(route.request.url)
        if answers["now"] is None:
            route.fulfill(status=503, body="not yet")
        else:
            route.fulfill(status=200, content_type="application/json", body=answers["now"])

    page = new_page(browser)
    try:
        html = preview_html(form)
        page.route(PAGE, lambda route: route.fulfill(content_type="text/html", body=html))
        page.route("**/services/fracspawner/api/offers*", offers)
        page.goto(PAGE)
        card = page.locator(".fs-pool-card[data-pool=t4]")
        start = page.locator("#spawn_form [type=submit]")
        # the page as the hub rendered it: the size cannot wait, Start is off
        card.wait_for()
        assert f"Unavailable: {CLOSED}" in text(page, ".fs-pool-card[data-pool=t4]")
        assert f"is unavailable: {CLOSED} Start is off" in text(page, "#fs-summary-line")
        assert start.is_disabled()

        # the service answers: the T4 still full, its offer "waits" (it cannot know the line)
        answers["now"] = service_answer(FULL_T4)
        page.wait_for_function(
            "() => document.querySelector('.fs-pool-card[data-pool=t4]')"
            ".textContent.includes('when this page was loaded')",
            timeout=10_000,
        )
        assert f"Unavailable: {AS_OF_LOAD}" in text(page, ".fs-pool-card[data-pool=t4]")
        summary = text(page, "#fs-summary-line")
        assert f"is unavailable: {AS_OF_LOAD} Start is off" in summary, summary
        assert "would wait" not in text(page, "#fracspawner-picker")
        assert "wait in line" not in summary
        assert start.is_disabled()
        assert all("admission=wait" in url for url in asked)

        # a replica frees: nobody has to wait, so the line does not matter
        answers["now"] = service_answer(ONE_FREE_T4)
        page.wait_for_function(
            "() => !document.querySelector('.fs-pool-card[data-pool=t4]')"
            ".classList.contains('unavailable')",
            timeout=10_000,
        )
        assert "Unavailable" not in text(page, ".fs-pool-card[data-pool=t4]")
        assert text(page, "#fs-summary-line").startswith("You will get: 1/4 of a T4")
        assert start.is_enabled()
        assert not page.errors and not page.dialogs
    finally:
        close_page(page)
