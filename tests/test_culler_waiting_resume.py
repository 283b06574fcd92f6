"""Never shut down a kernel whose resume is waiting (issue 36 item 2), the culler's server stop
included: a server whose kernel waits to resume for room on the GPU (its cell sent, the GPU
full) is kept whatever its idle timeouts say; only max_age and server_unattended (no user
activity for a day) still stop it.

The capacity benchmark (breaks trace, HAMi, half the GPUs) had the culler stop brk-13's server
for server_gpu_idle while its kernel's resume had waited 2 h for room; its user came back 10 min
later to no kernel. Through the real report parsing, `Culler.gather` and `decide_server`.
"""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import datetime, timezone

from fracspawner.backends import load_catalog
from fracspawner.culler.app import Culler
from fracspawner.culler.decide import ServerFacts, combine, decide_server
from fracspawner.culler.hubapi import HubServer
from fracspawner.culler.reports import parse_report
from tests.conftest import DEMO_CATALOG


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat().replace("+00:00", "Z")


def report(now: float, waiting: bool) -> dict:
    """A server idle for 2 h (GPU idle 3 h), its one kernel hibernated; `waiting`: its resume
    has waited 2 h for room on the GPU."""
    body = {
        "available": True, "sampled_at": iso(now), "monitor_started": iso(now - 4 * 3600),
        "server_last_activity": iso(now - 7200), "user_last_activity": iso(now - 7200),
        "gpu_memory_mib": 0, "gpu_activity_known": True, "gpu_idle_since": iso(now - 3 * 3600),
        "devices": [{"index": "0", "uuid": "GPU-a", "memory_total_mib": 20390,
                     "memory_used_mib": 0}],
        "kernels": [
            {"id": "k1", "execution_state": "idle", "gpu_memory_mib": 0,
             "hibernation": {"state": "hibernated", "hibernated_gpu_memory_mib": 10000,
                             "hibernated_since": iso(now - 3 * 3600),
                             "waiting_for_gpu": waiting}},
        ],
        "swap": {"waiting": [{"kernel_id": "k1", "gpu_memory_mib": 10000,
                              "since": iso(now - 7200), "device": "GPU-a"}] if waiting else []},
    }  # fmt: skip
    return body


def decide(waiting: bool, **policy: float):
    culler = Culler(report_url="http://127.0.0.1:9")  # reports are handed over in process
    culler._catalog = load_catalog(str(DEMO_CATALOG))
    now = time.time()
    facts = ServerFacts("ann", user_options={"gpu": "1/4", "pool": "h100"}, started=now - 5 * 3600)
    culler.known[("ann", "")] = facts
    culler.reports.put("ann", "", parse_report(report(now, waiting), received_at=now))
    facts, sources = culler.gather(HubServer(facts, "/user/ann/"), None, now)
    pol = replace(culler.policy_for(facts).policy, **policy)
    rules = culler.rules()
    return decide_server(facts, combine(sources, now, rules), pol, now, rules)


def test_a_server_whose_resume_waits_is_not_stopped_for_idleness():
    assert decide(waiting=False).action == "stop"  # idle 2 h, GPU idle 3 h: server_gpu_idle
    kept = decide(waiting=True)
    assert kept.action == "keep", f"stopped with a resume waiting: {kept.reason}: {kept.message}"
    assert kept.reason == "resume_waiting"


def test_max_age_and_unattended_still_stop_it():
    assert decide(waiting=True, max_age=3600.0).reason == "max_age"
    assert decide(waiting=True, server_unattended=3600.0).reason == "unattended"
