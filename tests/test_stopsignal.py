"""A managed service stops on the hub's SIGINT even when it was started with SIGINT ignored.

JupyterHub stops its managed services with SIGINT, then SIGTERM after `interrupt_timeout`
(10 s). Started from a background job (a non-interactive shell's `&`), a process inherits SIGINT
ignored and Python leaves it so: the picker service then ignored the hub's SIGINT and every hub
shutdown waited for SIGTERM (seen as ~34 s teardowns of the test hubs in a fresh-clone run)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from devcluster.localhub import REPO, free_port


def _ignoring_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # what `cmd &` in a script leaves a child


@pytest.mark.parametrize(
    "argv",
    [
        ["service", "--catalog", str(REPO / "examples/catalogs/demo.yaml"), "--no-live-capacity"],
        ["culler", "--url=http://127.0.0.1:9/hub/api", "--cull-every=3600"],
    ],
    ids=["service", "culler"],
)
def test_a_service_started_with_sigint_ignored_stops_on_sigint(argv: list[str]) -> None:
    env = {
        **os.environ,
        "JUPYTERHUB_API_TOKEN": "not-a-hub-token",
        "JUPYTERHUB_API_URL": "http://127.0.0.1:9/hub/api",
        "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{free_port()}",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "fracspawner", *argv],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=_ignoring_sigint,
    )
    try:
        time.sleep(8)  # past its imports and into its loop (more is harmless)
        assert process.poll() is None, process.communicate()[0]
        process.send_signal(signal.SIGINT)
        try:
            out, _ = process.communicate(timeout=60)  # a generous wait, not a timing assertion
        except subprocess.TimeoutExpired:
            pytest.fail("still running 60 s after SIGINT: the hub would have to send SIGTERM")
        assert process.returncode == 0, out
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
