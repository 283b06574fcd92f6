"""Presence from the person, not the poller (issue 26, item 4), in a real JupyterLab.

JupyterLab in Debian's Chromium (Playwright), the prebuilt GPU meter with its presence reporter
(labextension/src/presence.ts), jupyter-server with fracspawner's server extension, an ipykernel
kernel, GPU readings from the simulated source (no GPU here; tests/test_lab_meter.py says more).

Short timings: the presence timeout is 3 s, an idle GPU kernel goes after 15 s, the tab reports
every second. 15 s is longer than JupyterLab's REST polling (every 10 s while the tab is
visible: @jupyterlab/services kernel/manager.ts and session/manager.ts, `interval: 10 * 1000`),
so before presence the open tab's polling alone kept the kernel for ever.
"""

from __future__ import annotations

import time

import pytest
from dateutil.parser import isoparse

from tests.browser_helpers import chromium
from tests.test_culler_support import wait_for
from tests.test_lab_meter import H100, LABEXT, LabServer, open_lab, open_notebook

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PRESENCE_TIMEOUT = 3
KERNEL_GPU_IDLE = 15


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    if not (LABEXT / "package.json").exists():
        pytest.fail(f"the GPU meter is not built into {LABEXT}: run `make setup`")
    server = LabServer(
        tmp_path_factory.mktemp("lab-presence"),
        env={
            "FRACSPAWNER_KERNEL_GPU_IDLE_SECONDS": str(KERNEL_GPU_IDLE),
            "FRACSPAWNER_PRESENCE_TIMEOUT_SECONDS": str(PRESENCE_TIMEOUT),
            # an untouched open tab keeps its person in session no longer than the timeout
            # (2 h by default: a reader may be silent at it; serverext/presence.py)
            "FRACSPAWNER_PRESENCE_SESSION_SECONDS": str(PRESENCE_TIMEOUT),
        },
        config={"Presence": {"interval": 1.0}},
    )
    try:
        yield server
    finally:
        server.stop()
        print("---- jupyter server log (tail) ----\n" + server.logs())


def kernel_alive(lab: LabServer, kernel_id: str) -> bool:
    kernels = lab.api("GET", "/api/kernels?no_track_activity=1")[1]  # not activity itself
    return any(k["id"] == kernel_id for k in kernels)


def idle_gpu_kernel(lab: LabServer, name: str) -> str:
    """A notebook whose kernel holds 4 GiB of GPU memory and does nothing."""
    kernel = open_notebook(lab, name)
    lab.set_gpu({"devices": [H100], "kernels": {kernel: {"memory_mib": 4096, "utilization": 0}}})
    wait_for(lambda: lab.gpu()["gpu_memory_mib"] == 4096, what="the kernel on the GPU")
    return kernel


def server_activity(lab: LabServer) -> float:
    """jupyter-server's own last_activity (GET /api/status): every API request counts."""
    return isoparse(lab.api("GET", "/api/status")[1]["last_activity"]).timestamp()


def test_an_untouched_open_tab_does_not_keep_an_idle_gpu_kernel(lab):
    kernel = idle_gpu_kernel(lab, "untouched.ipynb")
    with chromium() as browser:
        page = open_lab(browser, lab)
        # the tab reports: presence is known, and nobody touches the page
        wait_for(lambda: lab.gpu()["presence"]["known"], what="the tab's presence report")
        wait_for(lambda: not lab.gpu()["presence"]["present"], 30, "the person counted away")
        wait_for(lambda: not kernel_alive(lab, kernel), 90, "the idle GPU kernel shut down")
        (culled,) = [c for c in lab.gpu()["culled_kernels"] if c["id"] == kernel]
        culled_at = isoparse(culled["at"]).timestamp()
        # the open tab went on polling the REST API after that: jupyter-server counted it
        wait_for(
            lambda: server_activity(lab) > culled_at + 1, 30, "JupyterLab polling after the cull"
        )
        assert page.locator(".fs-GpuMeter").is_visible()
        assert page.errors == [], page.errors
        page.context.close()


def test_a_person_using_the_tab_keeps_the_kernel_without_a_request(lab):
    kernel = idle_gpu_kernel(lab, "reading.ipynb")
    with chromium() as browser:
        page = open_lab(browser, lab)
        moves = iter(range(10**6))

        def using() -> bool:
            # the person moves the mouse meanwhile: opening the page counts as input, but on a
            # busy machine the tab's first report can come more than the 3 s timeout after it
            # (fresh-clone run fresh27 under load: 'timed out waiting for the person counted
            # present')
            page.mouse.move(200 + next(moves) % 400, 320)
            return bool(lab.gpu()["presence"]["present"])

        wait_for(using, 60, "the person counted present")
        # the person reads and scrolls for twice the kernel's limit plus the timeout: input
        # every half second, never a request of their own
        until = time.monotonic() + 2 * (KERNEL_GPU_IDLE + PRESENCE_TIMEOUT)
        x = 0
        while time.monotonic() < until:
            x = (x + 37) % 600
            page.mouse.move(200 + x, 300)
            page.mouse.wheel(0, 40 if x % 2 else -40)
            assert kernel_alive(lab, kernel), "shut down under a person using the tab"
            time.sleep(0.5)
        report = lab.gpu()
        assert report["presence"]["present"] is True
        assert not [w for w in report["warnings"] if w.get("kernel_id") == kernel]
        # the person leaves the tab open and goes: the kernel goes after timeout + limit
        wait_for(lambda: not kernel_alive(lab, kernel), 90, "the idle GPU kernel shut down")
        assert page.errors == [], page.errors
        page.context.close()


def test_closing_the_tab_says_so_at_once(tmp_path):
    """A tab closed says so as it goes (`pagehide`, a request started in the event and kept
    alive past the page): the server forgets the tab at once, not 3 intervals later (3 min at
    the default interval of a minute, kept here), so its person counts as gone and a closed
    tab is never taken for a hidden one (in session); when they were last seen is kept."""
    (tmp_path / "lab").mkdir()
    lab = LabServer(tmp_path / "lab", env={"FRACSPAWNER_PRESENCE_TIMEOUT_SECONDS": "600"})
    try:
        lab.set_gpu({"devices": [H100]})
        with chromium() as browser:
            page = open_lab(browser, lab)
            wait_for(lambda: lab.gpu()["presence"]["present"], what="the person counted present")
            assert lab.gpu()["presence"]["interval"] == 60.0
            page.close()
            wait_for(lambda: lab.gpu()["presence"]["tabs"] == 0, 30, "the closed tab's report")
            presence = lab.gpu()["presence"]
            assert presence["present"] is False and presence["in_session"] is False
            assert presence["last_present"] is not None
    finally:
        lab.stop()
