"""The pending page says what is being started (issue 13 item 7), in a real hub and browser.

`slow_spawn_timeout = 0` makes JupyterHub send the browser to its pending page at once instead
of waiting up to 10 s for the spawn, so the page is seen while the pod is still starting (the
pod's scheduling and its jupyter-server start take longer than one redirect).
"""

from __future__ import annotations

import os

import pytest

from tests.browser_helpers import (
    SCREENSHOTS,
    chromium,
    login,
    new_page,
    open_spawn_form,
    stop_all_servers,
    wait_for_lab,
)

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

HUB_EXTRA_CONFIG = """
c.JupyterHub.tornado_settings = {"slow_spawn_timeout": 0}
"""


@pytest.fixture(scope="module")
def browser():
    with chromium() as launched:
        yield launched


@pytest.fixture(autouse=True)
def _clean_servers(hub, devcluster):
    yield
    stop_all_servers(hub, devcluster)


def test_pending_page_names_the_slice(hub, devcluster, browser):
    page = new_page(browser)
    login(page, hub.url, "uma")  # the demo's default rule: H100 only
    open_spawn_form(page, hub.url, "uma")
    page.locator('.fs-mode-tab[data-mode="fraction"]').click()
    page.locator('input[name="gpu"][value="1/8"]').check()
    page.locator(".fs-pool-card[data-pool=h100]").click()
    page.get_by_role("button", name="Start").click()
    page.wait_for_url("**/hub/spawn-pending/uma*")
    line = page.locator(".fs-pending-slice")
    assert line.inner_text() == "Starting with 1/8 GPU on H100 80GB (HAMi) · PyTorch (CUDA 12)."
    if os.environ.get("FRACSPAWNER_UPDATE_SCREENSHOTS") == "1":
        page.screenshot(path=str(SCREENSHOTS / "picker-pending.png"), full_page=True)
    wait_for_lab(page, hub.url, "uma")
    page.close()
