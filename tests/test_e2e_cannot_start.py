"""End to end: a server that exits at each start ends its spawn at once, in words that say
why, on the real control plane with the hub's own pod watch (ResumingPodReflector, which keeps
pods as a PodCache): the node agent restarts the container with the crash-loop back-off, its
status says CrashLoopBackOff with lastState.terminated (exit code 127, a shell's "not found"),
and FracSpawner's `pod_failure` reads that from the hub's kept pod. Before, the cache kept no
lastState: the words lacked the exit code and what is missing. The pure side is
tests/test_review56_progress.py and tests/test_podcache.py.

An image missing from its registry is not covered here: the node agent pulls no image
(devcluster/kubelet.py), so it never says ErrImagePull."""

from __future__ import annotations

import time

import pytest
import yaml

from tests.conftest import DEMO_CATALOG, DEMO_TOPOLOGY
from tests.e2e_helpers import ensure_group, progress_events, spawn

pytestmark = pytest.mark.e2e

BROKEN = "example.org/no-singleuser:1"
TOPOLOGY = yaml.safe_load(DEMO_TOPOLOGY.read_text())
# an image whose entrypoint script runs a program it does not have: the shell exits 127
TOPOLOGY["images"] = {**(TOPOLOGY.get("images") or {}), BROKEN: ["sh", "-c", "no-such-singleuser"]}
CATALOG = yaml.safe_load(DEMO_CATALOG.read_text())
CATALOG["images"]["broken"] = {"display_name": "Broken Py", "image": BROKEN}
HUB_EXTRA_CONFIG = """
c.KubeSpawner.start_timeout = 300
# the image's own entrypoint (z2jh's singleuser.cmd: null), which the topology's images map
# stands for
c.KubeSpawner.cmd = []
"""


def test_a_server_that_exits_at_each_start_ends_the_spawn_at_once_in_words(hub, devcluster):
    ensure_group(hub, "ml-research", "cora")
    began = time.monotonic()
    status, body = spawn(hub, "cora", {"gpu": "1/4", "pool": "t4", "image": "broken"})
    if status == 202:  # still starting past JupyterHub's slow_spawn_timeout: its progress
        events = progress_events(hub, "cora", timeout=180)
        assert events and events[-1].get("failed"), [e.get("message") for e in events]
        said = events[-1]["message"]
    else:  # ended within it: the POST's answer says why
        assert status == 500, (status, body)
        said = body["message"]
    took = time.monotonic() - began
    assert "Your server stopped right after starting (exit code 127)" in said, said
    assert "missing from the image Broken Py (is jupyterhub-singleuser installed?)" in said, said
    assert took < 120, f"{took:.0f} s: not at once (start_timeout is 300 s)"
