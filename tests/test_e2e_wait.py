"""End to end with `c.FracSpawner.admission = "wait"`: a full pool makes the pod wait in
Pending, progress messages say what it waits for in the user's terms, and it starts once a
slot frees."""

from __future__ import annotations

import time

import pytest

from devcluster.localhub import http_json
from tests.e2e_helpers import (
    demo_topology_with_t4_jobs,
    ensure_group,
    progress_events,
    server_pods,
    spawn,
    stop,
    wait_until,
)

pytestmark = pytest.mark.e2e

TOPOLOGY = demo_topology_with_t4_jobs(4)
HUB_EXTRA_CONFIG = """
c.FracSpawner.admission = "wait"
# JupyterHub refuses every spawn while this many are pending ("Too many users trying to log in
# right now"); spawns in line are pending. FracSpawner lets half of it (1) wait
c.JupyterHub.concurrent_spawn_limit = 2
# z2jh sets this from hub.consecutiveFailureLimit (5 by default; jupyterhub/values.yaml and
# files/hub/jupyterhub_config.py): JupyterHub exits once that many spawns in a row end in an
# error. 1 here, so that one is enough
c.Spawner.consecutive_failure_limit = 1

def _short_line(spawner):
    # one user's place in line is kept for seconds instead of FracSpawner's 30 minutes (past
    # JupyterHub's slow_spawn_timeout, 10 s: the POST answers 202 and the spawn goes on)
    if spawner.user.name == "gus":
        spawner.queue_timeout = 15

c.Spawner.pre_spawn_hook = _short_line
"""


def test_a_place_given_up_in_line_is_no_hub_error(hub, devcluster):
    """A spawn whose place in line is given up (queue_timeout) is a refusal, not an error of
    the hub: JupyterHub counts only errors (a 5xx, any other exception) toward
    `consecutive_failure_limit` and exits at it (jupyterhub/handlers/base.py
    `_track_failure_count`: "increment on error only, not on handled rejections"). Counted,
    z2jh's hub would restart after five people in a row gave up waiting for a full pool, and
    everyone else's place in line would go with it. Runs while the T4's four jobs fill it
    (the next test ends one)."""
    ensure_group(hub, "ml-research", "gus")
    status, body = spawn(hub, "gus", {"gpu": "1/4", "pool": "t4"})
    assert status == 202, body
    events = progress_events(hub, "gus")
    assert events[-1].get("failed"), events
    assert "your place is given up" in events[-1]["message"], events[-1]

    def cleaned_up() -> bool:
        status, model = hub.api("GET", "/users/gus")
        return status == 200 and not model.get("pending") and not model.get("servers")

    wait_until(cleaned_up, what="gus's given-up spawn cleaned up")
    time.sleep(1)  # the spawn future's done callbacks (the count among them) have run
    # a counted failure logs "Aborting due to 1 consecutive spawn failures" at once and
    # exits the hub 2 s later
    assert "consecutive spawn failures" not in hub.log(), hub.log()[-3000:]
    assert hub.api("GET", "/")[0] == 200
    assert hub.process.poll() is None


def test_the_line_leaves_room_for_spawns_that_start_now(hub, devcluster):
    """Spawns in line are pending to JupyterHub, which refuses every spawn, CPU-only too,
    once `concurrent_spawn_limit` are pending (z2jh: 64). So at most half of it wait: one
    here. A second spawn for the full T4 is refused at once with what is free, and someone
    asking for no GPU still starts. Runs while the T4's four jobs fill it."""
    ensure_group(hub, "ml-research", "hana", "ivan")
    status, body = spawn(hub, "hana", {"gpu": "1/4", "pool": "t4"})
    assert status == 202, body  # in line
    wait_until(lambda: server_pods(devcluster, "hana"), what="hana's pod")

    def unschedulable() -> bool:  # what FracSpawner reads to know a pod waits in line
        (pod,) = server_pods(devcluster, "hana")
        conditions = pod["status"].get("conditions") or []
        return any(c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
                   for c in conditions)  # fmt: skip

    wait_until(unschedulable, what="the scheduler's word that hana's pod has no node")

    status, body = spawn(hub, "ivan", {"gpu": "1/4", "pool": "t4"})
    assert status == 400, body
    assert body["message"].startswith("No 1/4 GPU is free on T4 16GB (time-sliced) right now")
    assert body["message"].endswith(
        "Waiting is closed for now: 1 server already waits in line on this hub, the most it "
        "keeps waiting at once, so that others can still start."
    )
    assert not server_pods(devcluster, "ivan")

    status, body = spawn(hub, "jo", {"gpu": "none"})
    assert status in (201, 202), body  # not "Too many users trying to log in right now"
    hub.wait_ready("jo", timeout=90)
    stop(hub, "jo", cluster=devcluster)
    stop(hub, "hana", cluster=devcluster)


def test_pending_pod_explains_what_it_waits_for_and_starts_when_a_slot_frees(hub, devcluster):
    ensure_group(hub, "ml-research", "wanda")
    status, body = spawn(hub, "wanda", {"gpu": "1/4", "pool": "t4"})
    assert status == 202, body  # accepted: it waits instead of being refused

    pod = wait_until(lambda: server_pods(devcluster, "wanda"), what="wanda's pod")[0]
    assert pod["status"]["phase"] == "Pending"

    def a_training_job_ends():  # its slot goes to the waiting notebook
        url = f"{devcluster.url}/api/v1/namespaces/default/pods/training-0"
        assert http_json("DELETE", url)[0] == 200

    events = progress_events(hub, "wanda", "Waiting for a free", a_training_job_ends)
    messages = [e.get("message", "") for e in events]
    waiting = [m for m in messages if "Waiting for a free" in m]
    assert waiting, messages
    assert waiting[0].startswith("Waiting for a free 1/4 GPU on T4 16GB (time-sliced): 0 of 4 free")
    # the promise is bounded: how long the place in line is kept (FracSpawner.queue_timeout)
    assert waiting[0].endswith(
        "; it starts by itself as soon as one frees (your place is kept for 30 minutes)."
    )
    # the scheduler's words (what it lacks) stay in the event log beside the sentence
    first_wait = next(e for e in events if "Waiting for a free" in e.get("message", ""))
    assert "Insufficient nvidia.com/gpu" in first_wait["html_message"]
    assert events[-1].get("ready"), messages
    # every pod event in the user's words, in the order the cluster reported them
    steps = [m for m in messages if m and not m.startswith(("Waiting", "Server ", "Spawning"))]
    wanted = [
        "Your 1/4 GPU on T4 16GB (time-sliced) is reserved; preparing your server.",
        "The image PyTorch (CUDA 12) is ready.",
        "Your server's container is created.",
        "Your server has started; waiting for Jupyter to answer.",
    ]
    assert [m for m in steps if m in wanted] == wanted, steps
    assert not [m for m in messages if "[Normal]" in m or "[Warning]" in m], messages
    # Kubernetes' own words stay for the event log, escaped, beside the sentence
    scheduled = next(e for e in events if e.get("message") == wanted[0])
    assert '<span class="fs-raw">(' in scheduled["html_message"]
    assert "Successfully assigned" in scheduled["html_message"]
    assert "to gpu-t4-1" in scheduled["html_message"]

    hub.wait_ready("wanda", timeout=90)
    pod = server_pods(devcluster, "wanda")[0]
    assert pod["spec"]["nodeName"] == "gpu-t4-1"
    stop(hub, "wanda", cluster=devcluster)
