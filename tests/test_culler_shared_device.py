"""Issue 36 item 4 (and 7): activity of a neighbour on a shared device is not this server's
activity, in the culler's Prometheus source too.

dcgm-exporter reads devices: on a GPU shared by time-slicing (or HAMi, DRA shares, MPS) every
pod on it gets the device's utilisation (NVIDIA/dcgm-exporter#587: with
--kubernetes-virtual-gpus "all pods receive identical device-level utilization values"; without
it one pod gets them, #307). "Busy from any source wins" then kept an emptied server on a shared
GPU as long as a neighbour worked, although its own report (the extension, which tells its own
processes from a neighbour's: serverext/neighbours.py) knew it idle. On a slice less than a
whole GPU the culler takes DCGM's reading as the device's, not the server's: where the server's
own report knows its GPU activity, that decides; where it does not, DCGM still counts (a busy
device keeps the server, bounded by server_unattended; an idle device is an idle server).
"""

from __future__ import annotations

from fracspawner.culler import Culler
from fracspawner.culler.decide import GpuFacts, ServerFacts, combine, decide_server
from fracspawner.culler.hubapi import HubServer
from fracspawner.culler.reports import parse_report
from fracspawner.model.catalog import DEFAULT_IDLE
from tests.test_culler_reports import H, T, report


def culler_with(slice_: str, body: dict) -> tuple[ServerFacts, dict]:
    """The culler's facts and sources for ann's server on a `slice_`, with its report `body`
    and DCGM seeing the device busy just now (a neighbour's work) over 5 hours of data."""
    c = Culler(api_token="x", report_url="http://127.0.0.1:1", prometheus_url="http://p:9090")
    c.initialize([])
    facts = ServerFacts(
        "ann", user_options={"gpu": slice_}, started=T - 10 * H, last_activity=T - 9 * H
    )
    c.reports.put("ann", "", parse_report(body, received_at=T))
    busy = GpuFacts("prometheus", T - 10, 9000.0, 0.0, 5 * H)
    server = HubServer(facts, "/user/ann/")
    return c.gather(server, {c.pod_of(server): busy}, T)


def test_a_neighbours_work_seen_by_dcgm_does_not_keep_an_idle_server_on_a_shared_gpu():
    """Ann's server on a quarter of a GPU: its own report knows its GPU idle for 2 hours and
    its user gone for 3; DCGM sees the device busy (a neighbour). Past server_gpu_idle (1 h by
    default) it is stopped, as on a GPU of its own."""
    merged, sources = culler_with("1/4", report())
    reading = combine(sources, T)
    assert reading.gpu is not None and reading.gpu.idle_for == 2 * H - 5, reading
    decision = decide_server(merged, reading, DEFAULT_IDLE, T)
    assert decision.action == "stop", decision


def test_on_a_whole_gpu_or_without_the_servers_own_knowledge_dcgm_busy_still_keeps_it():
    # a whole GPU (or a MIG instance) is the pod's own: DCGM's busy is its work
    for slice_ in ("1", "mig-1g.10gb"):
        merged, sources = culler_with(slice_, report())
        reading = combine(sources, T)
        assert reading.gpu.idle_for == 0.0, (slice_, reading)
        assert decide_server(merged, reading, DEFAULT_IDLE, T).action == "keep"
    # a shared GPU where the server cannot tell its own work (MPS, an old driver): the device's
    # busy keeps it (unknown is never idle); server_unattended bounds that
    unknown = report(gpu_activity_known=False, gpu_unknown_reasons=["MPS"])
    merged, sources = culler_with("1/4", unknown)
    reading = combine(sources, T)
    assert reading.gpu.idle_for == 0.0, reading
    assert decide_server(merged, reading, DEFAULT_IDLE, T).action == "keep"
