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
from tests.e2e_helpers import Browserless

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
    deadline = time.monotonic() + 180
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
        # and leaves the tab open, visible, untouched
        hibernated = page.locator(".fs-GpuMeter-hibernation", has_text="hibernated")
        hibernated.wait_for(state="visible", timeout=HIBERNATED_WITHIN_S * 1000)
        assert page.evaluate("document.visibilityState") == "visible"
        assert "resumes when you run" in hibernated.inner_text(), hibernated.inner_text()
        page.context.close()
    finally:
        out = stop_demo(demo)
    assert "the demo has stopped." in out, out[-2000:]
