"""`fracspawner demo`: it serves the hub with the demo catalog, and Ctrl-C leaves nothing behind."""

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

from devcluster.localhub import free_port, http_json
from tests.e2e_helpers import Browserless

pytestmark = pytest.mark.e2e


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if text.encode() in cmdline or text.encode() in environ:
            found.append(int(entry.name))
    return found


def test_demo_serves_the_hub_and_ctrl_c_stops_everything(tmp_path):
    port = free_port()
    state = tmp_path / "demo-state"
    demo = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fracspawner",
            "demo",
            "--port",
            str(port),
            "--state-dir",
            str(state),
            "--password",
            "pw",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        deadline = time.monotonic() + 90
        url = None
        assert demo.stdout is not None
        while time.monotonic() < deadline and url is None:
            line = demo.stdout.readline()
            if not line and demo.poll() is not None:
                break
            if m := re.search(r"fracspawner demo: (http://\S+)/hub/login", line):
                url = m.group(1)
        assert url == f"http://127.0.0.1:{port}", "demo did not print its URL"
        status, info = http_json("GET", f"{url}/hub/api/")
        assert status == 200 and "version" in info
        # a newcomer logs in, picks a slice on the form and lands in a real JupyterLab
        browser = Browserless(SimpleNamespace(url=url), "newcomer", password="pw")
        response = browser.submit({"gpu": "1/8", "pool": "h100", "image": "pytorch"})
        assert response.status_code == 200, response.text[-1000:]
        lab = None
        for _ in range(120):
            lab = browser.session.get(f"{url}/user/newcomer/lab", timeout=30)
            if lab.status_code == 200 and "JupyterLab" in lab.text:
                break
            time.sleep(0.5)
        assert lab is not None and "JupyterLab" in lab.text
        # the processes it started all point at its state dir
        assert _processes_mentioning(str(state))
    finally:
        demo.send_signal(signal.SIGINT)
        try:
            demo.wait(60)
        except subprocess.TimeoutExpired:
            demo.kill()
            raise
    assert demo.returncode == 0
    deadline = time.monotonic() + 10
    while _processes_mentioning(str(state)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _processes_mentioning(str(state)), "demo left processes behind"
