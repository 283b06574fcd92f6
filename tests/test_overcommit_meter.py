"""The JupyterLab GPU meter on an over-committed pool (issue 26, item 3): a kernel the culler
swaps out says so ("GPU swapped out", and why); its resume on a full GPU waits while another
idle kernel is swapped out, and the meter says that too, then goes quiet once the kernel is
back. Real JupyterLab and Chromium; the kernel is suspended through the FAKE checkpoint driver
(tests/fake_nvml/cuda). On an over-committed pool a restore waits for the culler's grant of
room (serverext/room.py: a restore refused for want of room loses the state on current
drivers, NVIDIA/cuda-checkpoint#44). The culler is a stand-in that answers the server's report
as fracspawner's culler does (culler/swapdesk.py: 200 with the order, the wait, the grant).
"""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from devcluster.localhub import free_port
from tests.browser_helpers import chromium
from tests.test_culler_support import execute, wait_for
from tests.test_lab_meter import (
    H100,
    LABEXT,
    LabServer,
    hibernating_lab,
    kernel_on_gpu,
    open_lab,
    open_notebook,
    wait_for_memory_text,
)

pytestmark = pytest.mark.e2e
REASON = (
    "swapped out: the GPU it shares with other notebooks (15 GiB) was full and it was the least "
    "recently used idle kernel"
)


class Culler(ThreadingHTTPServer):
    """Takes reports (kept in `posts`); answers `order` (the culler's answer under pressure)
    while it is set."""

    order: dict | None = None
    posts: list[dict]

    @classmethod
    def start(cls) -> Culler:
        class Reports(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.server.posts.append(json.loads(body or b"{}"))
                order = self.server.order
                if order is None:
                    self.send_response(204)
                    self.end_headers()
                    return
                body = json.dumps(order).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        server = cls(("127.0.0.1", free_port()), Reports)
        server.posts = []
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server


def state_of_process(state, pid: int) -> dict:
    return next(p for p in json.loads(state.read_text())["gpus"][0]["processes"] if p["pid"] == pid)


def test_the_meter_says_a_resume_waits_for_room_on_a_full_gpu(tmp_path):
    if not (LABEXT / "package.json").exists():
        pytest.fail(f"the GPU meter is not built into {LABEXT}: run `make setup`")
    culler = Culler.start()
    lab, state = hibernating_lab(
        tmp_path,
        {
            "FRACSPAWNER_KERNEL_GPU_HIBERNATE_SECONDS": "0",  # only the culler's swap
            "FRACSPAWNER_GPU_OVERCOMMIT": "2",  # as FracSpawner sets it on such a pool
            # where the server reports, with its own token, as FracSpawner sets them
            "FRACSPAWNER_CULLER_URL": f"http://127.0.0.1:{culler.server_port}/",
            "JUPYTERHUB_API_TOKEN": "the-servers-own-token",
        },
        {"Hibernator": {"retry_first": 600.0}, "GpuReporter": {"report_interval": 1.0}},
    )
    full = {**H100, "memory_used_mib": H100["memory_total_mib"]}
    try:
        kernel, pid = kernel_on_gpu(lab, state, 9216)

        def hibernation() -> dict:
            k = next((k for k in lab.gpu()["kernels"] if k["id"] == kernel), {})
            return k.get("hibernation") or {}

        # the user ran a cell, long ago (the kernel is idle, not starting)
        assert asyncio.run(execute(lab.url, lab.token, kernel, "print(6 * 7)")).strip() == "42"
        # the GPU comes under pressure: the culler's answer to this server's report names it
        culler.order = {"swap": {"hibernate": [{"kernel_id": kernel, "reason": REASON}]}}
        wait_for(lambda: hibernation().get("state") == "hibernated", 30, "the kernel swapped out")
        culler.order = None
        assert hibernation()["hibernated_why"] == REASON
        lab.set_gpu({"devices": [full], "kernels": {}})  # co-tenants filled the GPU meanwhile
        with chromium() as browser:
            page = open_lab(browser, lab)
            text = page.locator(".fs-GpuMeter-hibernation")
            text.wait_for(state="visible", timeout=30_000)
            assert text.inner_text().endswith("GPU swapped out: resumes when you run a cell")
            assert REASON in (text.get_attribute("title") or "")
            # the culler has no room to give: it says the kernel waits
            culler.order = {"swap": {"wait": [{"kernel_id": kernel, "reason": "full"}]}}
            page.locator(".fs-GpuMeter-resume").click()  # as a cell would: resume
            wait_for(lambda: hibernation().get("waiting_for_gpu"), 30, "the resume waiting")
            page.wait_for_function(
                "el => el.innerText.endsWith('GPU full: waiting for room')",
                arg=text.element_handle(),
                timeout=30_000,
            )
            title = text.get_attribute("title") or ""
            assert (
                "swapped out to host memory" in title and "never restored into a full" in title
            ), title
            assert state_of_process(state, pid).get("restore_calls", 0) == 0
            # another idle kernel leaves the GPU: the culler grants the room, and the kernel is
            # back at once (its retries are ten minutes apart: only the grant brings it back)
            lab.set_gpu({"devices": [H100], "kernels": {}})
            culler.order = {"swap": {"resume": [{"kernel_id": kernel, "gpu_memory_mib": 9216}]}}
            text.wait_for(state="hidden", timeout=60_000)
            assert hibernation().get("state") == "running"
            assert page.errors == [], page.errors
            page.context.close()
    finally:
        lab.stop()
        culler.shutdown()


def test_on_hami_the_meter_says_what_the_culler_counts_free_on_the_gpu(tmp_path):
    """HAMi-core shows the pod its own slice, so the pod cannot see that co-tenants of an
    over-committed GPU left it less free than its slice has left (an allocation then fails at
    the GPU: HAMi#1128). The culler counts the whole GPU and says it in the answer to each
    report; the meter shows it: 6 of 20 GiB in use, 2 GiB free on the GPU by the culler's
    count. Once the culler counts room for the rest of the slice, the words go. Before, the
    meter read `Mem 6.0 / 20 GiB` and a failing allocation came with no word why."""
    if not (LABEXT / "package.json").exists():
        pytest.fail(f"the GPU meter is not built into {LABEXT}: run `make setup`")
    culler = Culler.start()
    culler.order = {"gpu": {"free_mib": 2048}}
    lab = LabServer(
        tmp_path,
        env={
            "CUDA_DEVICE_MEMORY_LIMIT_0": "20480m",  # HAMi's device plugin sets it
            "FRACSPAWNER_GPU_OVERCOMMIT": "2",
            "FRACSPAWNER_CULLER_URL": f"http://127.0.0.1:{culler.server_port}/",
            "JUPYTERHUB_API_TOKEN": "the-servers-own-token",
        },
        config={"GpuReporter": {"report_interval": 1.0}},
    )
    try:
        kernel = open_notebook(lab, "train.ipynb")
        mine = {kernel: {"memory_mib": 6144, "utilization": 0}}
        lab.set_gpu({"devices": [H100], "kernels": mine})
        wait_for(lambda: lab.gpu().get("device_free_mib") == 2048, 30, "the culler's count")
        report = lab.gpu()
        assert (report["device_free_by"], report["slice"]["shares_device"]) == ("culler", False)
        with chromium() as browser:
            page = open_lab(browser, lab)
            memory = page.locator(".fs-GpuMeter-memory")
            memory.wait_for(state="visible", timeout=30_000)
            wait_for_memory_text(page, "Mem 6.0 / 20 GiB (2 GiB free on the GPU)")
            title = page.locator(".fs-GpuMeter").get_attribute("title") or ""
            assert "hold all but 2 GiB of it now by the culler's count" in title, title
            culler.order = {"gpu": {"free_mib": 40960}}
            wait_for_memory_text(page, "Mem 6.0 / 20 GiB")
            assert page.errors == [], page.errors
            page.context.close()
    finally:
        lab.stop()
        culler.shutdown()
