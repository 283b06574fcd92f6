"""The meter's promises in Chromium (issue 38 #6): opening a notebook leaves its hibernated
kernel hibernated until a cell runs ("resumes when you run a cell"); the Resume button is whole
in the status bar at 1100 px with a notebook open; script-made events are not a person.

The demo's simulated GPU and checkpoint driver (as tests/test_lab_meter.py's demo tests), a real
jupyter-server with JupyterLab and the prebuilt meter, Debian's Chromium under Playwright.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from tests.browser_helpers import chromium
from tests.test_culler_support import execute, wait_for
from tests.test_hibernation import set_cgroup
from tests.test_lab_meter import LABEXT, LabServer, demo_gpu_env, open_lab, open_notebook

pytestmark = [pytest.mark.browser, pytest.mark.slow]

H100_POD = {"spec": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}}
H100_SLICE = {"resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10240"}}}
NOTEBOOK = {
    "cells": [
        {
            "cell_type": "code",
            "execution_count": None,
            "id": "c1",
            "metadata": {},
            "outputs": [],
            "source": "print(x + 1)",
        }
    ],
    "metadata": {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
    },
    "nbformat": 4,
    "nbformat_minor": 5,
}


def hibernation(lab: LabServer, kernel: str) -> dict:
    k = next((k for k in lab.gpu()["kernels"] if k["id"] == kernel), {})
    return k.get("hibernation") or {}


@pytest.fixture
def hibernated_lab(tmp_path):
    """A server whose notebook demo.ipynb has a kernel (x = 41) that is hibernated."""
    if not (LABEXT / "package.json").exists():
        pytest.fail(f"the GPU meter is not built into {LABEXT}: run `make setup`")
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    set_cgroup(cgroup, 64, 1)  # room in host memory for the parked GPU memory
    (tmp_path / "lab").mkdir()
    (tmp_path / "lab" / "demo.ipynb").write_text(json.dumps(NOTEBOOK))
    lab = LabServer(
        tmp_path / "lab",
        env={
            **demo_gpu_env(H100_POD, H100_SLICE),
            "FRACSPAWNER_KERNEL_GPU_HIBERNATE_SECONDS": "2",
        },
        config={"Hibernator": {"cgroup_root": str(cgroup)}},
        source="simulated-demo",
    )
    try:
        kernel = open_notebook(lab, "demo.ipynb")
        wait_for(lambda: lab.gpu().get("gpu_memory_mib") == 1536, 60, "the simulated kernel")
        assert asyncio.run(execute(lab.url, lab.token, kernel, "x = 41")) is not None
        wait_for(lambda: hibernation(lab, kernel).get("state") == "hibernated", 60, "hibernated")
        # no more hibernations while the test looks (it runs a cell, then checks the meter)
        lab.kernel = kernel
        yield lab
    finally:
        lab.stop()
        print("---- jupyter server log (tail) ----\n" + lab.logs()[-4000:])


def open_the_notebook(browser, lab: LabServer):
    page = open_lab(browser, lab)
    page.goto(f"{lab.url}/lab/tree/demo.ipynb?token={lab.token}")
    # connected to its kernel: JupyterLab asked for kernel_info (and the rest it asks on opening)
    page.locator(".jp-Notebook").wait_for(timeout=60_000)
    page.wait_for_function(
        "() => [...document.querySelectorAll('#jp-main-statusbar .jp-StatusBar-TextItem')]"
        ".some(e => /^Python 3.*\\| Idle$/.test(e.textContent.trim()))",
        timeout=60_000,
    )
    return page


def test_opening_a_notebook_leaves_its_hibernated_kernel_until_a_cell_runs(hibernated_lab):
    lab = hibernated_lab
    with chromium() as browser:
        page = open_the_notebook(browser, lab)
        text = page.locator(".fs-GpuMeter-hibernation")
        text.wait_for(state="visible", timeout=30_000)
        # (at 1100 px with a notebook open the status bar shows its first words: the next test)
        assert text.text_content() == "Simulated GPU hibernated: resumes when you run a cell"
        # the opening's requests have all been answered (the kernel shows Idle); it stays
        # hibernated while the notebook sits open
        for _ in range(10):
            assert hibernation(lab, lab.kernel).get("state") == "hibernated", hibernation(
                lab, lab.kernel
            )
            time.sleep(0.5)
        assert not hibernation(lab, lab.kernel).get("last_resumed_at")
        # running the cell resumes it, with its data
        page.locator(".jp-Cell").first.click()
        page.keyboard.press("Shift+Enter")
        page.locator(".jp-OutputArea-output", has_text="42").wait_for(timeout=60_000)
        assert hibernation(lab, lab.kernel).get("last_resumed_at")
        assert page.errors == [], page.errors
        page.context.close()


def test_the_resume_button_is_whole_at_1100_px_with_a_notebook_open(hibernated_lab):
    lab = hibernated_lab
    with chromium() as browser:
        page = open_the_notebook(browser, lab)
        resume = page.locator(".fs-GpuMeter-resume")
        resume.wait_for(state="visible", timeout=30_000)
        box = resume.bounding_box()
        bar = page.locator("#jp-main-statusbar").bounding_box()
        assert box and bar and page.viewport_size["width"] == 1100
        # inside the window and the status bar, and nothing drawn over it
        assert box["x"] >= 0 and box["x"] + box["width"] <= bar["x"] + bar["width"], (box, bar)
        assert box["y"] >= bar["y"] and box["y"] + box["height"] <= bar["y"] + bar["height"]
        whole = page.evaluate(
            """() => {
                const b = document.querySelector('.fs-GpuMeter-resume');
                const r = b.getBoundingClientRect();
                // its own box is not cut by an ancestor that hides overflow
                for (let e = b.parentElement; e; e = e.parentElement) {
                    const s = getComputedStyle(e);
                    if (s.overflow === 'visible' && s.overflowX === 'visible') continue;
                    const p = e.getBoundingClientRect();
                    if (r.left < p.left - 0.5 || r.right > p.right + 0.5) return e.className;
                }
                const points = [[r.left + 2, r.top + r.height / 2],
                                [r.right - 2, r.top + r.height / 2]];
                return points.every(([x, y]) => b.contains(document.elementFromPoint(x, y)))
                    ? 'whole' : 'covered';
            }"""
        )
        assert whole == "whole", whole
        # the sentence gives way, cut with an ellipsis, but its first words stay, and its
        # tooltip says it whole
        sentence = page.locator(".fs-GpuMeter-hibernation")
        assert sentence.is_visible() and sentence.bounding_box()["width"] > 60
        assert sentence.get_attribute("title").startswith("Simulated (the demo has no GPU)")
        page.context.close()


def test_script_made_events_do_not_count_as_a_person(tmp_path):
    """A page's own script scrolling, or dispatching input events, is nobody: the person who
    stopped using the tab stays away; their own wheel then counts at once."""
    (tmp_path / "lab").mkdir()
    (tmp_path / "lab" / "demo.ipynb").write_text(json.dumps(NOTEBOOK))
    lab = LabServer(
        tmp_path / "lab",
        env={"FRACSPAWNER_PRESENCE_TIMEOUT_SECONDS": "3"},
        config={"Presence": {"interval": 1.0}},
    )
    try:
        lab.set_gpu({"devices": [{"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81920}]})
        with chromium() as browser:
            page = open_lab(browser, lab)
            wait_for(lambda: lab.gpu()["presence"]["known"], 30, "the tab's report")
            wait_for(lambda: not lab.gpu()["presence"]["present"], 30, "counted away")
            # a script scrolls the page and dispatches input events, every 100 ms, for 6 s
            page.evaluate(
                """() => {
                    const panel = document.querySelector('.jp-DirListing-content')
                        || document.scrollingElement;
                    let n = 0;
                    const t = setInterval(() => {
                        panel.scrollTop = (n % 2) * 5;
                        panel.dispatchEvent(new Event('scroll'));
                        window.dispatchEvent(new Event('scroll'));
                        for (const type of ['keydown', 'pointerdown', 'pointermove', 'wheel',
                                            'touchstart']) {
                            document.body.dispatchEvent(new Event(type, {bubbles: true}));
                        }
                        if (++n >= 60) clearInterval(t);
                    }, 100);
                }"""
            )
            for _ in range(12):
                presence = lab.gpu()["presence"]
                assert presence["present"] is False, presence
                time.sleep(0.5)
            # a person's own wheel is input
            page.mouse.move(300, 300)
            page.mouse.wheel(0, 40)
            wait_for(lambda: lab.gpu()["presence"]["present"], 30, "the person's own input")
            page.context.close()
    finally:
        lab.stop()
