"""The README's walk in `fracspawner demo`'s own configuration: JupyterLab open in Chromium,
a notebook's kernel left idle hibernates within about two minutes (issue 38 #1).

With the tab open and visible (the only way to watch the meter) the person counts as present
until the presence timeout after their last input (serverext/presence.py); the demo left it at
the 900 s default, so the walk took 16 minutes. The demo gives its notebooks one minute and says
so in its banner.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from devcluster.localhub import free_port
from tests.browser_helpers import login, new_page
from tests.e2e_helpers import Browserless, wait_until
from tests.test_demo import START_S

pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.slow]

PASSWORD = "pw"
# the tab's last input (the click that opens the notebook) to "hibernated" on the meter: the
# presence timeout (1 min), then the demo's kernel_gpu_hibernate (1 min) and the server's next
# GPU reading; the margin is for a loaded machine
HIBERNATED_WITHIN_S = 200


def start_demo(state: Path) -> tuple[subprocess.Popen, str, list[str]]:
    """`fracspawner demo` as `make demo` runs it; (process, hub URL, banner lines)."""
    demo = subprocess.Popen(
        [sys.executable, "-m", "fracspawner", "demo", "--port", str(free_port())]
        + ["--state-dir", str(state), "--password", PASSWORD],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert demo.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline and not any("Ctrl-C" in line for line in lines):
        line = demo.stdout.readline()
        if not line and demo.poll() is not None:
            break
        lines.append(line.rstrip("\n"))
    url = next((m.group(1) for x in lines if (m := re.search(r"demo: (http://\S+)/hub", x))), "")
    assert url, "\n".join(lines[-40:])
    return demo, url, lines


def stop_demo(demo: subprocess.Popen) -> str:
    demo.send_signal(signal.SIGINT)
    try:
        return demo.communicate(timeout=120)[0]
    except subprocess.TimeoutExpired:
        demo.kill()
        raise


WHY_COLUMN = 5  # the culler's history: When, User, Server, Pool, What, Why, ...
PRESENT = "nothing due: its user is at a JupyterLab tab of it"


def admin_row_while_present(admin, lab, url: str):
    """The newcomer's row on the admin page once the culler keeps it for her presence; her
    pointer moves on the lab tab meanwhile (trusted input), so she stays present."""
    where = f"{url}/services/fracspawner/admin"

    def shows() -> bool:
        lab.mouse.move(200 + time.monotonic() % 100, 300)
        admin.goto(where)
        row = admin.locator('#fs-holders tbody tr[data-user="newcomer"]')
        return row.count() == 1 and PRESENT in row.inner_text()

    try:
        wait_until(shows, 120, "the admin page saying the newcomer is at her tab")
    except TimeoutError:
        raise AssertionError(admin.locator("#fs-holders").inner_text()) from None
    return admin.locator('#fs-holders tbody tr[data-user="newcomer"]')


def admin_history_row(admin, url: str, what: str):
    """The newcomer's row in "The culler's last 24 hours" whose What cell starts with `what`."""
    where = f"{url}/services/fracspawner/admin"
    rows = admin.locator('#fs-culler-history tbody tr[data-user="newcomer"]', has_text=what)

    def shows() -> bool:
        admin.goto(where)
        return rows.count() >= 1

    try:
        wait_until(shows, 60, f"the culler's history listing '{what}'")
    except TimeoutError:
        raise AssertionError(admin.locator("#fs-culler-history").inner_text()) from None
    return rows.first


def test_the_demos_idle_kernel_hibernates_with_its_lab_tab_open(tmp_path, browser):
    demo, url, banner = start_demo(tmp_path / "demo-state")
    try:
        # the banner says how long an untouched tab keeps its user present
        assert any("a tab counts as away 1 min after your last input" in line for line in banner), (
            "\n".join(banner)
        )
        newcomer = Browserless(SimpleNamespace(url=url), "newcomer", password=PASSWORD)
        response = newcomer.submit({"gpu": "1/8", "pool": "h100", "image": "pytorch"})
        assert response.status_code == 200, response.text[-1000:]
        page = new_page(browser)
        login(page, url, "newcomer", password=PASSWORD)
        page.goto(f"{url}/user/newcomer/lab", timeout=120_000)
        page.wait_for_selector("#jp-main-statusbar", timeout=120_000)
        # the person opens a notebook from the launcher: their last input
        page.locator('.jp-LauncherCard[data-category="Notebook"]').first.click()
        meter = page.locator(".fs-GpuMeter-memory")
        meter.wait_for(state="visible", timeout=120_000)
        page.wait_for_function(
            "() => /Mem [1-9]/.test(document.querySelector('.fs-GpuMeter-memory')?.textContent)",
            timeout=120_000,
        )
        # she runs a first cell: the state the README promises comes back after hibernation
        page.locator(".jp-Notebook .jp-Cell .cm-content").first.click()
        page.keyboard.type("x = 41")
        page.keyboard.press("Shift+Enter")
        page.locator(".jp-Notebook .jp-Cell .jp-InputPrompt", has_text="[1]").wait_for(
            timeout=120_000
        )
        # meanwhile the admin sees her at it, on the simulated GPU (issue 38 #3)
        admin = new_page(browser)
        login(admin, url, "admin", password=PASSWORD)
        row = admin_row_while_present(admin, page, url)
        assert "(simulated GPU)" in row.locator(".fs-gpu").inner_text()
        # and leaves the tab open, visible, untouched
        hibernated = page.locator(".fs-GpuMeter-hibernation", has_text="hibernated")
        hibernated.wait_for(state="visible", timeout=HIBERNATED_WITHIN_S * 1000)
        assert page.evaluate("document.visibilityState") == "visible"
        assert "resumes when you run" in hibernated.inner_text(), hibernated.inner_text()
        # the culler's last 24 hours list the hibernation, in the page's words (issue 38 #3)
        event = admin_history_row(admin, url, "kernel hibernated")
        assert (
            event.locator("td")
            .nth(WHY_COLUMN)
            .get_attribute("title")
            .startswith("hibernated its idle kernel")
        )
        admin.context.close()
        # the README walk's end: run a cell and the kernel comes back with its variables
        page.locator(".jp-Notebook .jp-Cell .cm-content").last.click()
        page.keyboard.type("x + 1")
        page.keyboard.press("Shift+Enter")
        page.locator(".jp-Notebook .jp-OutputArea-output", has_text="42").wait_for(timeout=120_000)
        hibernated.wait_for(state="hidden", timeout=60_000)
        # a cell that runs out of GPU memory (PyTorch's error, by name and text) is told why,
        # under its error, in the notebook (serverext/oomnote.py)
        page.locator(".jp-Notebook .jp-Cell .cm-content").last.click()
        page.keyboard.type(
            "class OutOfMemoryError(RuntimeError): pass\n"
            "raise OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB')"
        )
        page.keyboard.press("Shift+Enter")
        note = page.locator(
            ".jp-Notebook .jp-OutputArea-output", has_text="this cell ran out of GPU memory"
        )
        note.wait_for(timeout=120_000)
        assert "Your server's slice is 1/8" in note.inner_text(), note.inner_text()
        page.context.close()
    finally:
        out = stop_demo(demo)
    assert "the demo has stopped." in out, out[-2000:]
