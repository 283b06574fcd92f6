"""The GPU meter in a real JupyterLab: the prebuilt labextension, the server extension, a browser.

GPU readings come from the **simulated** GPU source (a `sim:` file,
fracspawner/serverext/sources.py): this machine has no GPU. Everything else is real: the
labextension `make setup` built and put in the venv, loaded as any prebuilt extension is,
jupyter-server with JupyterLab and fracspawner's server extension, ipykernel kernels, and
Debian's Chromium under Playwright.

- Standalone (no hub): a jupyter-server started with the pod's environment as FracSpawner sets it
  (slice, pool, idle policy): the meter, the warning before the culler, the dark theme, no GPU.
  Refreshes docs/_static/lab-meter-*.png.
- Through the hub: JupyterLab of a server FracSpawner spawned on the devcluster, reached through
  the hub's login and proxy, shows the slice the pod's environment names.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from tests.browser_helpers import SCREENSHOTS, chromium, login, new_page
from tests.browser_log import PageLog
from tests.e2e_helpers import env_of, spawn, stop, the_pod
from tests.test_culler_support import JupyterServer, execute, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.slow]

LABEXT = Path(sys.prefix) / "share" / "jupyter" / "labextensions" / "fracspawner-gpu-meter"
KERNEL_GPU_IDLE = 1800  # the policy: an idle kernel holding GPU memory goes after 30 min
# warn this long before: all but 2 s of it, so the warning shows 2 s after the GPU goes idle
WARN_BEFORE = KERNEL_GPU_IDLE - 2
POD_ENV = {
    "FRACSPAWNER_GPU_SLICE": "1/4",
    "FRACSPAWNER_GPU_POOL": "h100",
    "FRACSPAWNER_GPU_POOL_DISPLAY": "H100",
    "FRACSPAWNER_GPU_MEMORY_MIB": "20480",
    "FRACSPAWNER_KERNEL_GPU_IDLE_SECONDS": str(KERNEL_GPU_IDLE),
    "FRACSPAWNER_SERVER_GPU_IDLE_SECONDS": "7200",
    "FRACSPAWNER_GPU_IDLE_WARN_SECONDS": str(WARN_BEFORE),
    # the test's untouched page counts away a second after its last input (presence.py): it
    # sees the warnings a person who walked away would come back to
    "FRACSPAWNER_PRESENCE_TIMEOUT_SECONDS": "1",
    # ... and out of session as soon (an open tab keeps its person in session 2 h by default)
    "FRACSPAWNER_PRESENCE_SESSION_SECONDS": "1",
}
H100 = {"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81920}
VIEWPORT = {"width": 1100, "height": 640}
STATUS_BAR_SHOT = 230  # px at the bottom of the window: the status bar and the toasts above it
NO_NEWS = {"fetchNews": "false", "checkForUpdates": False}  # no "receive Jupyter news?" toast

# The hub test: the hub runs in its state dir; the simulated GPU file, the servers' jupyter config
# (read the GPU five times a second) and JupyterLab settings live there. FracSpawner keeps this
# admin environment in every pod it plans, next to what it sets itself.
HUB_EXTRA_CONFIG = """
import os as _os
c.KubeSpawner.environment = {
    "FRACSPAWNER_GPU_SOURCE": "sim:" + _os.path.join(_os.getcwd(), "gpu.json"),
    "JUPYTER_CONFIG_PATH": _os.path.join(_os.getcwd(), "server-config"),
    "JUPYTERLAB_SETTINGS_DIR": _os.path.join(_os.getcwd(), "lab-settings"),
}
"""


class LabServer(JupyterServer):
    """`jupyter server` with JupyterLab and fracspawner's extension, a simulated GPU, a pod env."""

    def __init__(
        self,
        tmp: Path,
        env: dict | None = None,
        config: dict | None = None,
        source: str | None = None,
    ) -> None:
        self.gpu_file = tmp / "gpu.json"
        self.set_gpu({})
        self.settings = tmp / "lab-settings"
        # no "receive Jupyter news?" toast: it would sit among the meter's warnings
        self.set_setting("notification", NO_NEWS)
        self.set_theme("JupyterLab Light")
        lab_dirs = {
            "JUPYTERLAB_SETTINGS_DIR": str(self.settings),
            "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "workspaces"),
        }
        # the slice's memory comes with POD_ENV, as FracSpawner sets it
        super().__init__(
            tmp, self.gpu_file, entitlement=None, env={**POD_ENV, **lab_dirs, **(env or {})},
            config=config, source=source,
        )  # fmt: skip

    def set_gpu(self, data: dict) -> None:
        tmp = self.gpu_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(self.gpu_file)  # atomic: the monitor never reads half a file

    def set_setting(self, plugin: str, values: dict) -> None:
        path = self.settings / "@jupyterlab" / "apputils-extension"
        path = path / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))

    def set_theme(self, theme: str) -> None:
        self.set_setting("themes", {"theme": theme})


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    if not (LABEXT / "package.json").exists():
        pytest.fail(f"the GPU meter is not built into {LABEXT}: run `make setup`")
    server = LabServer(tmp_path_factory.mktemp("lab"))
    try:
        yield server
    finally:
        server.stop()
        print("---- jupyter server log (tail) ----\n" + server.logs())


#: how long JupyterLab may take to boot in Chromium (test_demo_lab waits 120 s)
LAB_BOOT_MS = 180_000


def open_lab(browser: Any, lab: LabServer) -> Any:
    """JupyterLab in a fresh page (UTC, 24-hour clock) recording console errors."""
    context = browser.new_context(viewport=VIEWPORT, locale="en-GB", timezone_id="UTC")
    page = context.new_page()
    page.errors = []
    page.on("pageerror", lambda error: page.errors.append(f"pageerror: {error}"))
    page.on(
        "console",
        lambda msg: (
            page.errors.append(f"console.{msg.type}: {msg.text}") if msg.type == "error" else None
        ),
    )
    page.log = PageLog(page)
    page.goto(f"{lab.url}/lab?token={lab.token}")
    wait_for_status_bar(page)
    return page


def wait_for_status_bar(page: Any) -> None:
    """JupyterLab's status bar shows once its shell is laid out in the theme; if it does not,
    the failure says what the page said and asked meanwhile (tests/browser_log.py)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_selector("#jp-main-statusbar", timeout=LAB_BOOT_MS)
    except PlaywrightTimeout as exc:
        raise AssertionError(f"{exc}\n{page.log.report('#jp-main-statusbar')}") from None


def open_notebook(lab: LabServer, path: str) -> str:
    """A notebook session on `path` with a python3 kernel; the kernel's id."""
    status, session = lab.api(
        "POST",
        "/api/sessions",
        {"path": path, "type": "notebook", "name": "", "kernel": {"name": "python3"}},
    )
    assert status == 201, session
    return session["kernel"]["id"]


def wait_for_memory_text(page: Any, text: str) -> None:
    """Until the meter's memory reads `text` (it refreshes every few seconds)."""
    page.wait_for_function(
        "t => document.querySelector('.fs-GpuMeter-memory')?.textContent === t", arg=text
    )


def hhmm(iso: str) -> str:
    """The time as the meter shows it to this browser (en-GB, UTC): with the date when it is
    not today (formatClock in labextension/src/format.ts), as near midnight ("29 Nov 00:00")."""
    when = datetime.fromisoformat(iso.replace("Z", "+00:00")).astimezone(timezone.utc)
    time_of_day = when.strftime("%H:%M")
    if when.date() == datetime.now(timezone.utc).date():
        return time_of_day
    return f"{when.day} {when.strftime('%b')} {time_of_day}"


def hibernating_lab(tmp_path: Path, env: dict, config: dict | None = None) -> tuple:
    """A LabServer whose kernels hibernate through the fake checkpoint driver
    (tests/fake_nvml/cuda, its state file `nvml.json`) in a 64 GiB pod cgroup using 1 GiB;
    `env` and `config` on top. Returns the server and the state file."""
    from tests.test_hibernation import FAKE, set_cgroup

    state = tmp_path / "nvml.json"
    state.write_text(json.dumps({"cuda_driver_version": 12080, "gpus": [{"processes": []}]}))
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    set_cgroup(cgroup, 64, 1)
    (tmp_path / "lab").mkdir()
    config = dict(config or {})
    config["Hibernator"] = {"cgroup_root": str(cgroup), **config.get("Hibernator", {})}
    lab = LabServer(
        tmp_path / "lab",
        env={
            "PYTHONPATH": os.pathsep.join([str(FAKE), os.environ.get("PYTHONPATH", "")]),
            "FAKE_NVML_STATE": str(state),
            **env,
        },
        config=config,
    )
    return lab, state


def kernel_on_gpu(lab: LabServer, state: Path, mib: int) -> tuple[str, int]:
    """A notebook's kernel whose process holds `mib` of GPU memory, idle (the fake driver's
    state and the simulated reading); its id and its process's."""
    from tests.test_hibernation import state_of

    kernel = open_notebook(lab, "train.ipynb")
    pid = wait_for(lambda: _kernel_pid(kernel), 30, "the kernel's process")
    with state_of(state) as data:
        data["gpus"][0]["processes"].append({"pid": pid, "memory_mib": mib, "sm": 0})
    lab.set_gpu({"devices": [H100], "kernels": {kernel: {"memory_mib": mib, "utilization": 0}}})
    return kernel, pid


def kernel_state(lab: LabServer, kernel: str) -> str | None:
    """The kernel's hibernation state in the server's report."""
    k = next((k for k in lab.gpu()["kernels"] if k["id"] == kernel), {})
    return (k.get("hibernation") or {}).get("state")


def shot(page: Any, name: str) -> None:
    """The bottom of the window, once the toasts have slid in."""
    page.wait_for_function(
        "() => [...document.querySelectorAll('.Toastify__toast')].every("
        "t => t.getAnimations({subtree: true}).every(a => a.playState !== 'running'))"
    )
    clip = {
        "x": 0,
        "y": VIEWPORT["height"] - STATUS_BAR_SHOT,
        "width": VIEWPORT["width"],
        "height": STATUS_BAR_SHOT,
    }
    # docs/_static is refreshed on request only, like the picker's screenshots: a plain test
    # run must not leave the checkout modified
    if os.environ.get("FRACSPAWNER_UPDATE_SCREENSHOTS") == "1":
        page.screenshot(path=str(SCREENSHOTS / name), clip=clip)


def test_meter_shows_the_slice_memory_and_utilisation_then_warns_before_the_culler(lab):
    kernel = open_notebook(lab, "train.ipynb")
    lab.set_gpu({"devices": [H100], "kernels": {kernel: {"memory_mib": 6144, "utilization": 85}}})
    wait_for(lambda: lab.gpu()["gpu_memory_mib"] == 6144, what="a busy kernel on the GPU")
    report = lab.gpu()
    assert report["slice"]["label"] == "1/4 H100 · 20 GiB"
    assert report["policy"]["kernel_gpu_idle"] == KERNEL_GPU_IDLE
    assert report["warnings"] == []  # busy: the culler has nothing to do

    with chromium() as browser:
        page = open_lab(browser, lab)
        meter = page.locator(".fs-GpuMeter")
        meter.wait_for(state="visible", timeout=30_000)
        page.wait_for_function(
            "() => document.querySelector('.fs-GpuMeter-util')?.textContent === 'Util 85%'"
        )
        assert page.locator(".fs-GpuMeter-slice").inner_text() == "GPU 1/4 H100 · 20 GiB"
        assert page.locator(".fs-GpuMeter-memory").inner_text() == "Mem 6.0 / 20 GiB"
        assert page.locator(".fs-GpuMeter-util").inner_text() == "Util 85%"
        assert "(simulated GPU readings)" in meter.get_attribute("title")
        assert page.locator(".fs-GpuMeter-warning").is_hidden()
        shot(page, "lab-meter-light.png")

        # the kernel stops using the GPU but keeps 9 GiB: the warning comes, with the time
        idle = {"memory_mib": 9216, "utilization": 0}
        lab.set_gpu({"devices": [H100], "kernels": {kernel: idle}})
        warning = wait_for(lambda: lab.gpu()["warnings"], what="the idle kernel's warning")[0]
        assert warning["scope"] == "kernel" and warning["kernel_id"] == kernel
        at = hhmm(warning["cull_at"])
        badge = page.locator(".fs-GpuMeter-warning")
        badge.wait_for(state="visible", timeout=15_000)
        assert badge.inner_text() == f"⚠ Idle kernel (train.ipynb) shut down at {at}"
        assert badge.get_attribute("aria-live") == "polite"
        assert page.locator(".fs-GpuMeter-memory").inner_text() == "Mem 9.0 / 20 GiB"
        assert page.locator(".fs-GpuMeter-util").inner_text() == "Util 0%"
        toast = page.locator(".Toastify__toast", has_text="this kernel holds")
        toast.wait_for(state="visible", timeout=15_000)
        sentence = re.sub(r"\s+", " ", toast.inner_text())
        assert re.search(
            r"train\.ipynb: this kernel holds 9 GiB of GPU memory and has been GPU-idle \d+ s; "
            rf"it will be shut down at {at} unless used\.",
            sentence,
        ), sentence
        shot(page, "lab-meter-warning-light.png")

        # the same in the dark theme
        lab.set_theme("JupyterLab Dark")
        page.reload()
        page.wait_for_selector(
            "body[data-jp-theme-light='false']", state="attached", timeout=60_000
        )
        page.locator(".fs-GpuMeter-warning").wait_for(state="visible", timeout=15_000)
        page.locator(".Toastify__toast", has_text="this kernel holds").wait_for(timeout=15_000)
        shot(page, "lab-meter-dark.png")

        # "Shut down now" gives the GPU memory back at once; the warning goes with the kernel
        page.locator(".Toastify__toast", has_text="this kernel holds").get_by_role(
            "button", name="Shut down now"
        ).click()
        wait_for(lambda: not lab.api("GET", "/api/kernels")[1], what="the kernel shut down")
        page.locator(".fs-GpuMeter-warning").wait_for(state="hidden", timeout=15_000)
        assert page.errors == [], page.errors
        page.context.close()
    lab.set_theme("JupyterLab Light")


def test_max_age_warning_says_using_the_server_does_not_help(tmp_path):
    """The culler stops a server max_age after the hub started it, busy or not (culler/decide.py
    server_deadlines): the meter warns with that time, and does not say "unless used"."""
    from datetime import timedelta, timezone

    from fracspawner.serverext.podinfo import isoformat

    max_age = 12 * 3600
    started = datetime.now(timezone.utc) - timedelta(seconds=max_age - 300)  # 5 min left
    (tmp_path / "lab").mkdir()
    lab = LabServer(
        tmp_path / "lab",
        env={
            "FRACSPAWNER_MAX_AGE_SECONDS": str(max_age),
            "FRACSPAWNER_SERVER_STARTED": isoformat(started),  # as FracSpawner sets it
        },
    )
    try:
        lab.set_gpu({"devices": [H100]})

        def server() -> list[dict]:
            return [w for w in lab.gpu().get("warnings", []) if w["scope"] == "server"]

        (warning,) = wait_for(server, what="the server's max_age warning")
        assert warning["reason"] == "max_age"
        assert warning["cull_at"] == isoformat(started + timedelta(seconds=max_age))
        at = hhmm(warning["cull_at"])
        with chromium() as browser:
            page = open_lab(browser, lab)
            badge = page.locator(".fs-GpuMeter-warning")
            badge.wait_for(state="visible", timeout=30_000)
            assert badge.inner_text() == f"⚠ Server stops at {at} (maximum age)"
            toast = page.locator(".Toastify__toast", has_text="maximum age")
            toast.wait_for(state="visible", timeout=15_000)
            sentence = re.sub(r"\s+", " ", toast.inner_text())
            assert (
                f"This server reaches its maximum age (12 h); it will be stopped at {at}, in "
                "use or not. Your files stay." in sentence
            ), sentence
            assert page.errors == [], page.errors
            page.context.close()
    finally:
        lab.stop()


def test_a_lab_whose_theme_never_loads_fails_with_the_reason(lab):
    """The fresh-clone failures' state: the status bar in the page but hidden. JupyterLab lays
    its shell out without the theme's sizes (--jp-statusbar-height) and lays it out again only
    once its theme's stylesheet has loaded (@jupyterlab/apputils ThemeManager._loadTheme); a
    theme request that fails is not retried ("Error Loading Theme"). open_lab's failure then
    names the request and the status bar's height (tests/browser_log.py)."""
    with chromium() as browser:
        context = browser.new_context(viewport=VIEWPORT)
        context.route("**/lab/api/themes/**", lambda route: route.abort())
        page = context.new_page()
        page.log = PageLog(page)
        page.goto(f"{lab.url}/lab?token={lab.token}")
        page.locator(".jp-Dialog", has_text="Error Loading Theme").wait_for(timeout=LAB_BOOT_MS)
        page.wait_for_selector("#jp-main-statusbar", state="attached", timeout=LAB_BOOT_MS)
        report = page.log.report("#jp-main-statusbar")
        context.close()
    assert re.search(r"GET \S+/lab/api/themes/\S+/index\.css failed", report), report
    assert re.search(r"#jp-main-statusbar\S* display=flex visibility=visible \d+x0", report), report
    # the theme's variables are missing: the shell was laid out without them
    assert re.search(r"^statusbarHeight: *$", report, re.M), report
    assert "Error Loading Theme" in report, report


def test_on_a_shared_gpu_the_meter_says_when_others_leave_less_free_than_the_slice(lab):
    """Time-slicing (a quarter; the pod's NVML reads the whole device): the kernel holds 6 GiB
    of its 20 GiB quarter, and the other pods on the GPU hold all but 2 GiB of it. A 3 GiB
    allocation fails with CUDA out of memory although the slice has 14 GiB left, so the meter
    says what is free on the GPU and why. Before, it read `Mem 6.0 / 20 GiB` alone, and the
    error came with no word why (issue 36, bug 4)."""
    kernel = open_notebook(lab, "shared.ipynb")
    mine = {kernel: {"memory_mib": 6144, "utilization": 40}}
    lab.set_gpu({"devices": [{**H100, "memory_used_mib": 81920 - 2048}], "kernels": mine})
    wait_for(lambda: lab.gpu().get("device_free_mib") == 2048, what="a crowded shared GPU")
    assert lab.gpu()["slice"]["shares_device"] is True
    with chromium() as browser:
        page = open_lab(browser, lab)
        meter, memory = page.locator(".fs-GpuMeter"), page.locator(".fs-GpuMeter-memory")
        memory.wait_for(state="visible", timeout=30_000)
        wait_for_memory_text(page, "Mem 6.0 / 20 GiB (2 GiB free on the GPU)")
        assert memory.get_attribute("data-state") == "near"
        title = re.sub(r"\s+", " ", meter.get_attribute("title"))
        assert (
            "the GPU is shared, and its other users hold all but 2 GiB of it now, less than the "
            "14 GiB left in your slice: a larger allocation fails with CUDA out of memory"
        ) in title, title
        # they give memory back: the GPU has room for what is left of the slice, and the
        # words go
        lab.set_gpu({"devices": [{**H100, "memory_used_mib": 40960}], "kernels": mine})
        wait_for_memory_text(page, "Mem 6.0 / 20 GiB")
        assert memory.get_attribute("data-state") == "ok"
        assert page.errors == [], page.errors
        page.context.close()
    lab.api("DELETE", f"/api/kernels/{kernel}")


def test_no_gpu_no_meter_and_no_console_errors(lab):
    lab.set_gpu({"devices": [H100]})
    wait_for(lambda: lab.gpu()["available"], what="a GPU")
    with chromium() as browser:
        page = open_lab(browser, lab)
        page.locator(".fs-GpuMeter").wait_for(state="visible", timeout=30_000)
        # the GPU goes away (a driver gone, a node without one): the meter goes quietly
        lab.set_gpu({"unavailable": "no NVIDIA driver on this node"})
        page.locator(".fs-GpuMeter").wait_for(state="hidden", timeout=15_000)
        assert page.errors == [], page.errors

        # a fresh JupyterLab on a server without a GPU: it asks once, then shows nothing
        with page.expect_response(lambda r: "/api/fracspawner/gpu" in r.url) as response:
            page.reload()
            wait_for_status_bar(page)
        assert response.value.json()["available"] is False
        page.wait_for_timeout(500)  # let the answer be applied: nothing may appear
        assert page.locator(".fs-GpuMeter").is_hidden()
        assert page.locator("#jp-main-statusbar").is_visible()
        assert page.errors == [], page.errors
        page.context.close()


@pytest.mark.e2e
def test_meter_in_jupyterlab_spawned_by_the_hub(hub, devcluster):
    """FracSpawner spawns a 1/4 H100 on the devcluster; its JupyterLab, through the hub's login
    and proxy, shows the slice the pod's environment names and the kernel's GPU use."""
    state = hub.state_dir
    (state / "server-config").mkdir(exist_ok=True)
    (state / "server-config" / "jupyter_server_config.json").write_text(
        json.dumps({"GpuMonitor": {"poll_interval": 0.2, "unavailable_retry": 0.2}})
    )
    settings = state / "lab-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "notification.jupyterlab-settings").write_text(json.dumps(NO_NEWS))
    gpu_file = state / "gpu.json"
    gpu_file.write_text(json.dumps({"devices": [H100]}))

    status, body = spawn(hub, "lena", {"gpu": "1/4", "pool": "h100"})
    assert status in (201, 202), body
    try:
        hub.wait_ready("lena")
        env = env_of(the_pod(devcluster, "lena"))
        # the label and the limit follow whatever FracSpawner put in the pod
        # (FRACSPAWNER_GPU_MEMORY_MIB, FRACSPAWNER_GPU_SLICE, ...)
        from fracspawner.serverext.podinfo import PodInfo, gib

        limit = gib(int(env["FRACSPAWNER_GPU_MEMORY_MIB"]))  # a quarter of an H100's memory
        assert limit in ("20 GiB", "19.9 GiB"), limit
        label = PodInfo.from_environ(env).slice_json(device=H100["name"])["label"]
        with chromium() as browser:
            page = new_page(browser)
            page.errors = []
            page.on("console", lambda m: m.type == "error" and page.errors.append(m.text))
            login(page, hub.url, "lena")
            page.goto(f"{hub.url}/user/lena/lab")
            page.locator(".fs-GpuMeter").wait_for(state="visible", timeout=60_000)
            assert page.locator(".fs-GpuMeter-slice").inner_text() == f"GPU {label}"
            assert page.locator(".fs-GpuMeter-memory").inner_text() == f"Mem 0.0 / {limit}"

            # the user opens a notebook; its kernel takes 6 GiB and computes
            page.locator('.jp-LauncherCard[data-category="Notebook"]').first.click()
            report_url = f"{hub.url}/user/lena/api/fracspawner/gpu"

            def kernel_id() -> str | None:
                kernels = page.request.get(report_url).json().get("kernels") or []
                return kernels[0]["id"] if kernels else None

            kernel = wait_for(kernel_id, 60, "the notebook's kernel")
            busy = {"memory_mib": 6144, "utilization": 40}
            gpu_file.write_text(json.dumps({"devices": [H100], "kernels": {kernel: busy}}))
            page.wait_for_function(
                "() => document.querySelector('.fs-GpuMeter-util')?.textContent === 'Util 40%'",
                timeout=20_000,
            )
            assert page.locator(".fs-GpuMeter-memory").inner_text() == f"Mem 6.0 / {limit}"
            assert page.errors == [], page.errors
            page.context.close()
    finally:
        stop(hub, "lena", cluster=devcluster)


def test_meter_says_the_gpu_is_hibernated_and_resume_brings_it_back(tmp_path):
    """Issue 22: a hibernated kernel (fake checkpoint driver, tests/fake_nvml/cuda) shows
    'GPU hibernated: resumes when you run a cell' with a Resume button; pressing it brings the
    kernel back; hibernated again, the meter says how long the last resume took."""
    from tests.test_hibernation import state_of

    lab, state = hibernating_lab(tmp_path, {"FRACSPAWNER_KERNEL_GPU_HIBERNATE_SECONDS": "2"})
    try:
        kernel, _pid = kernel_on_gpu(lab, state, 9216)

        def hibernated() -> bool:
            return kernel_state(lab, kernel) == "hibernated"

        wait_for(hibernated, 30, "the kernel hibernated")
        # the simulated reading follows: its memory left the GPU
        lab.set_gpu({"devices": [H100], "kernels": {}})
        with chromium() as browser:
            page = open_lab(browser, lab)
            text = page.locator(".fs-GpuMeter-hibernation")
            text.wait_for(state="visible", timeout=30_000)
            assert text.inner_text() == "GPU hibernated: resumes when you run a cell"
            resume = page.locator(".fs-GpuMeter-resume")
            assert resume.is_visible()
            shot(page, "lab-meter-hibernated.png")
            resume.click()
            text.wait_for(state="hidden", timeout=30_000)
            assert not hibernated()
            with state_of(state) as data:
                assert data["gpus"][0]["processes"][0]["cuda_state"] == "running"
            # back on the GPU; idle again: hibernated again, and the meter says how long
            # resuming took
            lab.set_gpu({"devices": [H100], "kernels": {kernel: {"memory_mib": 9216}}})
            wait_for(hibernated, 30, "hibernated again")
            text.wait_for(state="visible", timeout=30_000)
            assert re.fullmatch(
                r"GPU hibernated: resumes when you run a cell "
                r"\(last resume took \d+\.\d\u00a0s, \d\d:\d\d\)",
                text.inner_text(),
            ), text.inner_text()
            assert page.errors == [], page.errors
            page.context.close()
    finally:
        lab.stop()


def test_under_hami_core_the_meter_counts_a_hibernated_kernel_against_the_slice(tmp_path):
    """HAMi-core (its limit in the pod's environment) keeps counting a hibernated kernel's
    memory against the slice until the kernel exits (docs/culler.md): the GPU reads it as
    gone, yet the next allocation beyond what the slice has left fails. The meter counts it
    too: 18 of the 20 GiB hibernated read 'near limit', and the sentence says why and what
    frees it. Without HAMi-core (the test above) hibernated memory takes nothing."""
    lab, state = hibernating_lab(
        tmp_path,
        {
            "FRACSPAWNER_KERNEL_GPU_HIBERNATE_SECONDS": "2",
            "CUDA_DEVICE_MEMORY_LIMIT_0": "20480m",  # HAMi's device plugin sets it
        },
    )
    try:
        kernel_on_gpu(lab, state, 18432)
        wait_for(lambda: lab.gpu()["hibernated_gpu_memory_mib"] == 18432, 30, "hibernated")
        lab.set_gpu({"devices": [H100], "kernels": {}})  # its memory left the GPU
        report = lab.gpu()
        assert report["slice"]["counts_hibernated"] is True
        # its NVML is HAMi-core's view of the slice, not the shared device's: no device room
        assert report["slice"]["shares_device"] is False and report["device_free_mib"] is None
        with chromium() as browser:
            page = open_lab(browser, lab)
            page.locator(".fs-GpuMeter-hibernation").wait_for(state="visible", timeout=30_000)
            memory = page.locator(".fs-GpuMeter-memory")
            assert memory.inner_text() == "Mem 0.0 (+18.0 hibernated) / 20 GiB (near limit)"
            title = page.locator(".fs-GpuMeter").get_attribute("title") or ""
            assert (
                "0 MiB of 20 GiB GPU memory in use, and 18 GiB of hibernated kernels that still "
                "count against the slice here (shut one down to free its share)" in title
            ), title
            assert page.errors == [], page.errors
            page.context.close()
    finally:
        lab.stop()


def test_the_meter_says_a_restore_that_does_not_return(tmp_path):
    """The driver's restore can block (NVIDIA/cuda-checkpoint#17); past restore_stall_seconds
    the meter says so, in words and as a failure, with what restarting the kernel costs."""
    from tests.test_hibernation import state_of

    lab, state = hibernating_lab(
        tmp_path,
        {"FRACSPAWNER_KERNEL_GPU_HIBERNATE_SECONDS": "2"},
        {"Hibernator": {"restore_stall_seconds": 1.0}},
    )
    try:
        kernel, pid = kernel_on_gpu(lab, state, 9216)
        wait_for(lambda: kernel_state(lab, kernel) == "hibernated", 30, "the kernel hibernated")
        lab.set_gpu({"devices": [H100], "kernels": {}})
        with state_of(state) as data:
            (p,) = [p for p in data["gpus"][0]["processes"] if p["pid"] == pid]
            # the restore a cell starts returns 20 s later: the meter has 19 s to say so
            p["restore_blocks_s"] = 20
        out: list[str] = []
        cell = threading.Thread(
            target=lambda: out.append(
                asyncio.run(execute(lab.url, lab.token, kernel, "print(6 * 7)"))
            ),
            daemon=True,
        )
        with chromium() as browser:
            page = open_lab(browser, lab)
            text = page.locator(".fs-GpuMeter-hibernation")
            text.wait_for(state="visible", timeout=30_000)  # the lab is up: hibernated
            cell.start()
            page.wait_for_function(
                "() => document.querySelector('.fs-GpuMeter-hibernation')?.textContent"
                " === 'GPU restore not returning'",
                timeout=30_000,
            )
            title = text.get_attribute("title") or ""
            assert "NVIDIA/cuda-checkpoint#17" in title and "restart the kernel" in title, title
            assert page.errors == [], page.errors
            page.context.close()
        cell.join(60)  # the restore returned: the cell ran, told why it waited
        (said,) = out
        assert "has not finished after" in said and said.strip().endswith("42"), said
    finally:
        lab.stop()


def test_during_a_copy_the_meter_says_so_and_offers_no_resume(tmp_path):
    """Copies take time on a real GPU (docs/serverext.md "First run on a GPU": an H200
    checkpointed at 1.4-1.9 GiB/s and restored at 3.4-5.5 GiB/s, a minute to hibernate 80 GiB).
    While the copy to host memory was under way the meter said 'GPU hibernated: resumes when you
    run a cell' with '0 B' parked, and while resuming the same: a cell run then waits for the
    copy, with no word. It says what moves instead, and that a cell waits. It offered Resume
    meanwhile too, which only waited for the copy: the button shows once the kernel is
    hibernated, and not while either copy is under way. The fake driver copies at 0.5 GiB/s:
    18 s each way for the kernel's 9 GiB."""
    from tests.test_hibernation import state_of

    lab, state = hibernating_lab(tmp_path, {"FRACSPAWNER_KERNEL_GPU_HIBERNATE_SECONDS": "2"})
    try:
        with state_of(state) as data:
            data["bandwidth_gib_s"] = 0.5
        with chromium() as browser:
            page = open_lab(browser, lab)  # up before the kernel idles: the copy is seen
            text = page.locator(".fs-GpuMeter-hibernation")
            # the words and the button, read at one moment (one reading sets both)
            seen = """() => {
                const b = document.querySelector('.fs-GpuMeter-resume');
                return [document.querySelector('.fs-GpuMeter-hibernation')?.textContent,
                        !!b && !b.hidden && b.getClientRects().length > 0];
            }"""

            def says(short: str, resume: bool) -> None:
                from playwright.sync_api import TimeoutError as PlaywrightTimeout

                try:
                    page.wait_for_function(
                        f"([t, r]) => {{ const [s, b] = ({seen})(); return s === t && b === r; }}",
                        arg=[short, resume],
                        timeout=30_000,
                    )
                except PlaywrightTimeout:
                    said, button = page.evaluate(seen)
                    raise AssertionError(
                        f"the meter said {said!r} with the Resume button "
                        f"{'shown' if button else 'hidden'}, not {short!r} with it "
                        f"{'shown' if resume else 'hidden'}"
                    ) from None

            kernel, _pid = kernel_on_gpu(lab, state, 9216)
            wait_for(lambda: kernel_state(lab, kernel) == "hibernating", 30, "the copy begins")
            says("GPU hibernating: moving 9 GiB to host memory", resume=False)
            assert kernel_state(lab, kernel) == "hibernating"  # said during the copy
            title = re.sub(r"\s+", " ", text.get_attribute("title") or "")
            assert title == (
                "The kernel's GPU state (9 GiB) is being copied to host memory. A cell you run "
                "now waits until the copy is done; then the state comes back to the GPU and the "
                "cell runs. Resume is offered once the copy is done."
            ), title
            wait_for(lambda: kernel_state(lab, kernel) == "hibernated", 60, "the copy is done")
            lab.set_gpu({"devices": [H100], "kernels": {}})  # its memory left the GPU
            says("GPU hibernated: resumes when you run a cell", resume=True)
            page.locator(".fs-GpuMeter-resume").click()
            says("GPU resuming: bringing 9 GiB back from host memory", resume=False)
            assert kernel_state(lab, kernel) == "resuming"
            title = re.sub(r"\s+", " ", text.get_attribute("title") or "")
            assert title == (
                "The kernel's GPU state (9 GiB) is being copied back from host memory to the "
                "GPU; a cell you run waits until it is back, then runs."
            ), title
            text.wait_for(state="hidden", timeout=60_000)
            assert kernel_state(lab, kernel) == "running"
            assert page.locator(".fs-GpuMeter-resume").is_hidden()
            assert page.errors == [], page.errors
            page.context.close()
    finally:
        lab.stop()


def _kernel_pid(kernel_id: str) -> int | None:
    """The ipykernel process whose command line names this kernel's connection file."""
    from fracspawner.serverext.procmap import kernel_id_of

    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and kernel_id_of(int(entry.name)) == kernel_id:
            return int(entry.name)
    return None


def test_the_demos_simulated_gpu_feeds_the_meter(tmp_path):
    """Issue 21 item 2: the demo's GPU pods read the SIMULATED source the devcluster's kubelet
    names (FRACSPAWNER_SIMULATED_GPU, DemoSimulatedSource): each kernel holds 1.5 GiB of a
    made-up H100 and its CPU work stands for GPU work, so the meter, its utilisation and the
    pre-cull warning show in the demo's JupyterLab. Refreshes docs/_static/lab-meter-demo.png."""
    from devcluster.kubelet import simulated_gpu_env

    pod = {"spec": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}}
    container = {"resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10240"}}}
    old = {
        k: os.environ.pop(k, None) for k in ("DEVCLUSTER_SIMULATED_GPU", "FRACSPAWNER_GPU_SOURCE")
    }
    try:
        assert simulated_gpu_env(pod, container) == {}  # not enabled: nothing simulated
        os.environ["DEVCLUSTER_SIMULATED_GPU"] = "1"
        assert simulated_gpu_env(pod, {"resources": {}}) == {}  # a CPU pod: no GPU
        env = simulated_gpu_env(pod, container)
    finally:
        os.environ.pop("DEVCLUSTER_SIMULATED_GPU", None)
        os.environ.update({k: v for k, v in old.items() if v is not None})
    assert env["FRACSPAWNER_GPU_SOURCE"] == "simulated-demo"
    (tmp_path / "lab").mkdir()
    lab = LabServer(tmp_path / "lab", env=env, source="simulated-demo")
    try:
        kernel = open_notebook(lab, "demo.ipynb")
        wait_for(lambda: lab.gpu().get("gpu_memory_mib") == 1536, 60, "the simulated kernel")
        report = lab.gpu()
        assert report["source"] == "simulated"
        assert report["devices"][0]["name"] == "NVIDIA H100 80GB HBM3 (simulated)"
        with chromium() as browser:
            page = open_lab(browser, lab)
            page.locator(".fs-GpuMeter").wait_for(state="visible", timeout=30_000)
            assert page.locator(".fs-GpuMeter-memory").inner_text() == "Mem 1.5 / 20 GiB"
            assert "(simulated GPU readings)" in page.locator(".fs-GpuMeter").get_attribute("title")
            # the kernel computes: its CPU work reads as GPU work (Playwright's loop is this
            # thread's: the websocket client runs in another)
            busy = "import time\nt = time.time()\nwhile time.time() - t < 3: pass"
            worker = threading.Thread(
                target=lambda: asyncio.run(execute(lab.url, lab.token, kernel, busy, wait=False))
            )
            worker.start()
            worker.join(60)
            page.wait_for_function(
                "() => /Util [1-9]/.test(document.querySelector('.fs-GpuMeter-util')?.textContent)",
                timeout=30_000,
            )
            # idle again: the warning before the kernel is shut down (2 s after, as POD_ENV says)
            page.locator(".fs-GpuMeter-warning").wait_for(state="visible", timeout=60_000)
            page.locator(".Toastify__toast", has_text="this kernel holds").wait_for(timeout=30_000)
            shot(page, "lab-meter-demo.png")
            assert page.errors == [], page.errors
            page.context.close()
    finally:
        lab.stop()


def demo_gpu_env(pod: dict, container: dict) -> dict[str, str]:
    """The env the devcluster's kubelet gives a GPU pod under `make demo` (its simulated GPU)."""
    from devcluster.kubelet import simulated_gpu_env

    old = os.environ.pop("FRACSPAWNER_GPU_SOURCE", None)
    os.environ["DEVCLUSTER_SIMULATED_GPU"] = "1"
    try:
        return simulated_gpu_env(pod, container)
    finally:
        os.environ.pop("DEVCLUSTER_SIMULATED_GPU", None)
        if old is not None:
            os.environ["FRACSPAWNER_GPU_SOURCE"] = old


def demo_lab(tmp_path: Path, pod: dict, container: dict) -> LabServer:
    """A jupyter-server on the demo's simulated GPU of this pod, hibernating idle kernels after
    2 s, with 63 GiB of host memory free in its cgroup (room for any parked memory)."""
    from tests.test_hibernation import set_cgroup

    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    set_cgroup(cgroup, 64, 1)
    (tmp_path / "lab").mkdir()
    return LabServer(
        tmp_path / "lab",
        env={**demo_gpu_env(pod, container), "FRACSPAWNER_KERNEL_GPU_HIBERNATE_SECONDS": "2"},
        config={"Hibernator": {"cgroup_root": str(cgroup)}},
        source="simulated-demo",
    )


def test_the_demos_simulated_gpu_hibernates_and_resumes_and_says_it_is_simulated(tmp_path):
    """Issue 27 #4: in the demo an idle kernel said "cannot hibernate: cuda-python is not
    installed" (the demo has no GPU; installing it would not help). The demo's simulated GPU
    comes with a simulated checkpoint driver (serverext/simcheckpoint.py): an idle kernel
    hibernates (its simulated GPU memory leaves the GPU), the meter says so and that it is
    simulated, a cell resumes it with its data, and the report marks it simulated."""
    pod = {"spec": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}}
    container = {"resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10240"}}}
    lab = demo_lab(tmp_path, pod, container)
    try:
        kernel = open_notebook(lab, "demo.ipynb")
        wait_for(lambda: lab.gpu().get("gpu_memory_mib") == 1536, 60, "the simulated kernel")
        assert asyncio.run(execute(lab.url, lab.token, kernel, "x = 41")) is not None

        def hibernation() -> dict:
            k = next((k for k in lab.gpu()["kernels"] if k["id"] == kernel), {})
            return k.get("hibernation") or {}

        wait_for(lambda: hibernation().get("state") == "hibernated", 60, "hibernated")
        report = lab.gpu()
        assert report["source"] == "simulated" and report["hibernation"]["simulated"] is True
        wait_for(lambda: lab.gpu().get("gpu_memory_mib") == 0, 30, "memory off the GPU")
        with chromium() as browser:
            page = open_lab(browser, lab)
            text = page.locator(".fs-GpuMeter-hibernation")
            text.wait_for(state="visible", timeout=30_000)
            assert text.inner_text() == "Simulated GPU hibernated: resumes when you run a cell"
            assert text.get_attribute("title").startswith("Simulated (the demo has no GPU): ")
            page.context.close()
        # a cell resumes it, with its data
        out = asyncio.run(execute(lab.url, lab.token, kernel, "print(x + 1)"))
        assert "42" in out, out
        assert hibernation().get("state") != "hibernated"
        assert hibernation().get("last_resumed_at")
    finally:
        lab.stop()


def test_the_demos_simulated_mig_slice_reads_no_utilisation(tmp_path):
    """Issue 27 #9: the demo's MIG meter said "Util 0%" where the user guide says MIG reads
    "n/a" (a MIG instance cannot report utilisation: NVML answers NOT_SUPPORTED). The simulated
    MIG slice reports none either, so the meter says "Util n/a" as on a real one."""
    from fracspawner.serverext.sources import DemoSimulatedSource

    pod = {"spec": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}}}
    container = {"resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}
    env = demo_gpu_env(pod, container)
    source = DemoSimulatedSource(env["FRACSPAWNER_SIMULATED_GPU"])
    sample = source.sample()
    assert sample.devices[0].name == "NVIDIA A100 SXM4 80GB MIG 1g.10gb (simulated)"
    assert sample.devices[0].utilization is None
    assert all(p.utilization is None for p in sample.processes)


def test_the_demos_simulated_mig_slice_says_why_its_kernels_do_not_hibernate(tmp_path):
    """The checkpoint API does not support MIG (NVIDIA/cuda-checkpoint#42): on the demo's MIG
    slice, with hibernation turned on, an idle kernel is not hibernated, and the server's
    report (what the culler and `fracspawner doctor` read) says why from the first reading,
    for the server and for the kernel. The demo named its MIG device as a whole GPU ("0"), so
    the report said nothing, and its simulated driver checkpointed what no GPU would."""
    pod = {"spec": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}}}
    container = {"resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}
    lab = demo_lab(tmp_path, pod, container)  # room in host memory: MIG is the only reason
    why = (
        "the GPU is a MIG instance, which the CUDA checkpoint API does not support "
        "(NVIDIA/cuda-checkpoint #42)"
    )
    try:
        kernel = open_notebook(lab, "demo.ipynb")
        wait_for(lambda: lab.gpu().get("gpu_memory_mib") == 1536, 60, "the simulated kernel")
        time.sleep(5)  # idle past kernel_gpu_hibernate (2 s)
        report = lab.gpu()
        assert report["hibernation"]["reason"] == why, report["hibernation"]
        (k,) = [k for k in report["kernels"] if k["id"] == kernel]
        assert k["hibernation"]["state"] == "cannot_hibernate", k["hibernation"]
        assert k["hibernation"]["reason"] == f"cannot hibernate: {why}", k["hibernation"]
        assert report["gpu_memory_mib"] == 1536 and report["hibernated_gpu_memory_mib"] == 0
    finally:
        lab.stop()
