"""End to end with `c.FracSpawner.admission = "wait"`: a full pool makes the pod wait in
Pending, progress messages say what it waits for in the user's terms, and it starts once a
slot frees."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest

from devcluster.localhub import http_json
from tests.e2e_helpers import (
    demo_topology_with_t4_jobs,
    ensure_group,
    server_pods,
    spawn,
    stop,
    wait_until,
)

pytestmark = pytest.mark.e2e

TOPOLOGY = demo_topology_with_t4_jobs(4)
HUB_EXTRA_CONFIG = 'c.FracSpawner.admission = "wait"'


def progress_messages(hub, user: str, until: str, timeout: float = 60) -> list[str]:
    """Read the hub's spawn progress event stream until a message contains `until`."""
    request = urllib.request.Request(f"{hub.api_url}/users/{user}/server/progress")
    request.add_header("Authorization", f"token {hub.admin_token}")
    messages: list[str] = []
    deadline = time.monotonic() + timeout
    with urllib.request.urlopen(request, timeout=timeout) as stream:
        for raw in stream:
            line = raw.decode().strip()
            if line.startswith("data:"):
                event = json.loads(line[5:])
                messages.append(event.get("message", ""))
                if until in messages[-1]:
                    break
            if time.monotonic() > deadline:
                break
    return messages


def test_pending_pod_explains_what_it_waits_for_and_starts_when_a_slot_frees(hub, devcluster):
    ensure_group(hub, "ml-research", "wanda")
    status, body = spawn(hub, "wanda", {"gpu": "1/4", "pool": "t4"})
    assert status == 202, body  # accepted: it waits instead of being refused

    pod = wait_until(lambda: server_pods(devcluster, "wanda"), what="wanda's pod")[0]
    assert pod["status"]["phase"] == "Pending"
    messages = progress_messages(hub, "wanda", until="Waiting for a free")
    waiting = [m for m in messages if "Waiting for a free" in m]
    assert waiting, messages
    assert waiting[-1].startswith("Waiting for a free 1/4 GPU in pool t4: 0 of 4 free")
    assert "insufficient nvidia.com/gpu" in waiting[-1]

    # a training job ends: its slot goes to the waiting notebook
    status, _ = http_json("DELETE", f"{devcluster.url}/api/v1/namespaces/default/pods/training-0")
    assert status == 200
    hub.wait_ready("wanda", timeout=90)
    pod = server_pods(devcluster, "wanda")[0]
    assert pod["spec"]["nodeName"] == "gpu-t4-1"
    stop(hub, "wanda", cluster=devcluster)
