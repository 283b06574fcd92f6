"""XSS acceptance: markup in catalog names and in the user name is shown as text, never run.

The pool's display name and description, an image's display name and the user's own name
carry script payloads. A real spawn goes through the picker (JavaScript on) and the plain form
(JavaScript off); nothing may run (`window.__xss` stays undefined, no dialog opens) and the
payloads must appear literally on the page.

JupyterHub accepts any user name without "/" (Authenticator.validate_username), so the user
name carries an <img onerror> payload (a "</script>" closing tag would need "/").
"""

from __future__ import annotations

from urllib.parse import quote

import pytest
import yaml

from tests.browser_helpers import (
    close_page,
    login,
    new_page,
    wait_for_lab,
)
from tests.conftest import DEMO_CATALOG
from tests.e2e_helpers import pods

# `browser` and `clean_servers` are tests/conftest.py's
pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.usefixtures("clean_servers")]

POOL_NAME = "<script>window.__xss=1</script>GPU"
POOL_DESCRIPTION = '<img src=x onerror="window.__xss=2;alert(2)">'
IMAGE_NAME = "<svg onload=alert(4)>Torch"
USER = "x<img src=x onerror=window.__xss=3;alert(3)>"

CATALOG = yaml.safe_load(DEMO_CATALOG.read_text())
CATALOG["pools"]["xss"] = {
    "display_name": POOL_NAME,
    "description": POOL_DESCRIPTION,
    "gpu": "H100-80GB",
    "backend": "hami",
    "node_selector": {"gpu": "on"},
    "offers": ["1/8"],
}
CATALOG["images"]["pytorch"]["display_name"] = IMAGE_NAME
CATALOG["access"]["default"] = {"pools": ["h100", "xss"], "max_gpu": 0.25}
HUB_EXTRA_CONFIG = """
if not any(r.get("name") == "user" for r in c.JupyterHub.load_roles):
    c.JupyterHub.load_roles.append(
        {"name": "user", "scopes": ["self", "access:services!service=fracspawner"]}
    )
"""


def _nothing_ran(page) -> None:
    assert page.evaluate("typeof window.__xss") == "undefined"
    assert page.dialogs == []


def _spawn_url(hub) -> str:
    return f"{hub.url}/hub/spawn/{quote(USER, safe='')}"


def test_markup_in_names_is_shown_as_text_through_a_real_spawn(hub, devcluster, browser):
    page = new_page(browser)
    login(page, hub.url, USER)
    page.goto(_spawn_url(hub))
    page.wait_for_selector(".fs-mode-tab")
    _nothing_ran(page)

    page.locator('.fs-mode-tab[data-mode="fraction"]').click()
    page.locator('input[name="gpu"][value="1/8"]').check()
    card = page.locator('.fs-pool-card[data-pool="xss"]')
    assert card.locator(".fs-pool-name").inner_text() == POOL_NAME  # the text, escaped
    assert POOL_NAME in page.locator('#fs-pool option[value="xss"]').inner_text()
    assert IMAGE_NAME in page.locator('#fs-image option[value="pytorch"]').inner_text()
    card.click()
    assert POOL_NAME in page.locator("#fs-summary-line").inner_text()
    # the user name is on the hub's own page (navbar), as text
    assert USER in page.locator("body").inner_text()
    _nothing_ran(page)

    page.get_by_role("button", name="Start").click()
    wait_for_lab(page, hub.url, quote(USER, safe=""))
    _nothing_ran(page)
    # kubespawner escapes the name for the label; the pod is found by its pool instead
    (pod,) = pods(devcluster, **{"fracspawner.io/pool": "xss"})
    assert pod["metadata"]["annotations"]["hub.jupyter.org/username"] == USER
    close_page(page)


def test_markup_in_names_is_text_in_the_plain_form(hub, browser):
    page = new_page(browser, java_script_enabled=False)
    login(page, hub.url, USER)
    page.goto(_spawn_url(hub))
    listed = page.locator('.fs-pools li[data-pool="xss"]').inner_text()
    assert listed.startswith(POOL_NAME + ":")
    # markup never became elements: no <script>, <img> or <svg> inside the form
    assert page.locator("#spawn_form img, #spawn_form svg").count() == 0
    assert page.locator("#spawn_form script").count() == 2  # the model's JSON and picker.js
    close_page(page)
