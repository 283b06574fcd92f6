"""Reports servers push to the culler: parsing, whose they are, and what an unavailable one
still says. Pure functions; the HTTP path runs through a real hub in test_culler_trust_e2e."""

from __future__ import annotations

import pytest

from fracspawner.culler import Culler, combine, decide_server
from fracspawner.culler.decide import GpuFacts, ServerFacts
from fracspawner.culler.hubapi import HubServer
from fracspawner.culler.identity import Identity, Refused, identity_from_model
from fracspawner.culler.reports import ReportError, ReportStore, parse_report
from fracspawner.model.catalog import DEFAULT_IDLE

T = 1_800_000_000.0
H = 3600.0


def iso(t: float) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(t, timezone.utc).isoformat()


def report(**kw) -> dict:
    body = {
        "available": True,
        "sampled_at": iso(T - 5),
        "monitor_started": iso(T - 5 * H),
        "gpu_memory_mib": 4096,
        "gpu_activity_known": True,
        "gpu_idle_since": iso(T - 2 * H),
        "server_last_activity": iso(T - 2 * H),
        "user_last_activity": iso(T - 3 * H),
    }
    return {**body, **kw}


def test_unavailable_report_keeps_the_servers_own_activity():
    # no GPU readable (no NVML in the image, a driver error): the server's activity still counts
    parsed = parse_report(
        report(available=False, reason="NVML could not start", sampled_at=None), received_at=T
    )
    assert parsed.gpu is None and parsed.reason == "NVML could not start"
    assert parsed.server_last_activity == T - 2 * H
    assert parsed.user_last_activity == T - 3 * H
    # through the culler: a server the hub thinks idle for 9 h, active 2 h ago by its own word
    c = Culler(api_token="x", report_url="http://127.0.0.1:1")
    c.initialize([])
    facts = ServerFacts(
        "ann", user_options={"gpu": "1/4"}, started=T - 10 * H, last_activity=T - 9 * H
    )
    c.reports.put("ann", "", parsed)
    merged, sources = c.gather(HubServer(facts, "/user/ann/"), None, T)
    assert merged.own_last_activity == T - 2 * H
    assert sources == {"extension": None}  # no GPU reading: a failed source for a GPU server
    d = decide_server(merged, combine(sources, T), DEFAULT_IDLE, T)
    assert d.action == "keep" and d.gpu_failsafe  # 2 h < server_idle 8 h


def test_a_gpu_source_down_stops_no_gpu_server_on_gpu_grounds_even_without_a_slice():
    # a pod may hold a GPU without user_options["gpu"]: its own report (4096 MiB, GPU idle 2 h)
    # says so, and with Prometheus down it is not stopped for gpu_idle on the report alone
    c = Culler(api_token="x", report_url="http://127.0.0.1:1", prometheus_url="http://127.0.0.1:1")
    c.initialize([])
    ann = ServerFacts("ann", started=T - 10 * H, last_activity=T - 2 * H)
    c.reports.put("ann", "", parse_report(report(), received_at=T))
    merged, sources = c.gather(HubServer(ann, "/user/ann/"), None, T)
    assert sources["prometheus"] is None  # configured and down: failed for this server
    d = decide_server(merged, combine(sources, T), DEFAULT_IDLE, T)
    assert (d.action, d.reason, d.gpu_failsafe) == ("keep", "active", True)  # 2 h < 8 h
    assert "prometheus has no data for it: not culled on GPU grounds" in d.message
    # the mirror: Prometheus sees its GPU memory, and no fresh report came
    bob = HubServer(ServerFacts("bob", started=T - 10 * H, last_activity=T - 2 * H), "/user/bob/")
    prom = {c.pod_of(bob): GpuFacts("prometheus", T - 5, 4096, 2 * H, 5 * H)}
    merged, sources = c.gather(bob, prom, T)
    assert sources["extension"] is None
    d = decide_server(merged, combine(sources, T), DEFAULT_IDLE, T)
    assert (d.reason, d.gpu_failsafe) == ("active", True)
    # meanwhile a server holding no GPU by any word (its report: 0 MiB; or no report) is still
    # stopped for plain idleness
    idle = {"server_last_activity": iso(T - 9 * H), "user_last_activity": iso(T - 9 * H)}
    c.reports.put("cpu", "", parse_report(report(gpu_memory_mib=0, **idle), received_at=T))
    for user in ("cpu", "silent"):
        facts = ServerFacts(user, started=T - 10 * H, last_activity=T - 9 * H)
        merged, sources = c.gather(HubServer(facts, f"/user/{user}/"), None, T)
        assert "prometheus" not in sources
        d = decide_server(merged, combine(sources, T), DEFAULT_IDLE, T)
        assert (d.action, d.reason, d.gpu_failsafe) == ("stop", "idle", False), user


def test_available_report_to_facts():
    gpu = parse_report(report(), received_at=T).gpu
    assert (gpu.idle_for, gpu.covered_for, gpu.memory_mib) == (2 * H - 5, 5 * H - 5, 4096)
    unknown = parse_report(
        report(
            gpu_activity_known=False, gpu_unknown_reasons=["device 0 is busy but lists no process"]
        ),
        received_at=T,
    ).gpu
    assert not unknown.known and "lists no process" in unknown.note


def test_a_report_is_never_idle_for_longer_than_it_covers():
    # forged: GPU idle for 2 h by a monitor that started 30 min ago (none: no history at all)
    server = ServerFacts(
        "ann", user_options={"gpu": "1/4"}, started=T - 10 * H, last_activity=T - 2 * H
    )
    for started in (iso(T - 0.5 * H), None):
        gpu = parse_report(report(monitor_started=started), received_at=T).gpu
        assert gpu.idle_for == gpu.covered_for < H and not gpu.busy_seen, started
        d = decide_server(server, gpu, DEFAULT_IDLE, T)  # idle 2 h < server_idle 8 h
        assert (d.action, d.reason, d.gpu_failsafe) == ("keep", "active", True), d.message


def test_times_from_the_future_are_clamped_to_arrival():
    parsed = parse_report(report(user_last_activity=iso(T + 10 * H)), received_at=T)
    assert parsed.user_last_activity == T


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], "JSON object"),
        (report(sampled_at=None), "sampled_at"),
        (report(sampled_at="yesterday"), "not an ISO 8601 time"),
        (report(gpu_memory_mib=-1), "gpu_memory_mib"),
        (report(culled_kernels=[{"at": iso(T)}]), "culled_kernels"),
    ],
)
def test_malformed_reports_are_refused_with_a_reason(body, message):
    with pytest.raises(ReportError, match=message):
        parse_report(body, received_at=T)


def test_store_keeps_one_incarnation_and_counts_kernel_culls_once():
    store = ReportStore()
    culled = [{"id": "k1", "at": iso(T - 60), "gpu_memory_mib": 2048}]
    first = parse_report(report(culled_kernels=culled), received_at=T)
    assert [k.id for k in store.put("ann", "gpu", first)] == ["k1"]
    assert store.put("ann", "gpu", first) == []  # told again in the next report: counted once
    server = ServerFacts("ann", "gpu", started=T - 5 * H - 30)
    assert store.for_server(server) is first
    # the server was restarted: the old incarnation's report is not about it
    assert store.for_server(ServerFacts("ann", "gpu", started=T - 60)) is None
    store.prune(T + 1)
    assert store.for_server(server) is None


SERVER_TOKEN_MODEL = {  # GET /hub/api/user with a server's token (JupyterHub 5/6)
    "kind": "user",
    "name": "ann",
    "scopes": ["access:servers!server=ann/gpu", "users:activity!user=ann"],
}


def test_identity_comes_from_the_token_not_the_body():
    assert identity_from_model(SERVER_TOKEN_MODEL, "gpu") == Identity("ann", "gpu")
    assert identity_from_model(SERVER_TOKEN_MODEL, None) == Identity("ann", "gpu")
    # the body cannot speak for another server, nor another user's
    with pytest.raises(Refused, match="may not report about server ''"):
        identity_from_model(SERVER_TOKEN_MODEL, "")
    with pytest.raises(Refused) as refused:
        identity_from_model({**SERVER_TOKEN_MODEL, "kind": "service", "name": "x"}, "gpu")
    assert refused.value.code == 403
    # a token of the user's own (access to all their servers) may report for any of them
    own = {"kind": "user", "name": "ann", "scopes": ["access:servers!user=ann"]}
    assert identity_from_model(own, "") == Identity("ann", "")
    with pytest.raises(Refused, match="which server"):
        identity_from_model(own, None)


async def test_concurrent_reports_with_one_token_ask_the_hub_once():
    """A burst of reports (a restarted culler, every server at once) costs one hub request
    per token; a refused token is remembered too, and the hub never sees the body."""
    import asyncio
    import json

    from tornado import web
    from tornado.httpserver import HTTPServer

    from devcluster.localhub import free_port
    from fracspawner.culler.identity import TokenVerifier

    asked: list[str] = []

    class WhoAmI(web.RequestHandler):
        async def get(self) -> None:
            token = self.request.headers["Authorization"].split()[-1]
            asked.append(token)
            await asyncio.sleep(0.2)  # a slow hub: the burst arrives while it answers
            if token != "good":
                raise web.HTTPError(403)
            self.write(json.dumps(SERVER_TOKEN_MODEL))

    port = free_port()
    server = HTTPServer(web.Application([(r"/hub/api/user", WhoAmI)]))
    server.listen(port, "127.0.0.1")
    verifier = TokenVerifier(f"http://127.0.0.1:{port}/hub/api")
    try:
        found = await asyncio.gather(*(verifier.verify("good", "gpu") for _ in range(20)))
        assert set(found) == {Identity("ann", "gpu")} and asked == ["good"]
        for _ in range(3):
            with pytest.raises(Refused) as refused:
                await verifier.verify("stolen", "gpu")
            assert refused.value.code == 403
        assert asked == ["good", "stolen"]
    finally:
        verifier.close()
        server.stop()


def test_hibernation_reaches_the_culler_metrics():
    """Issue 22: hibernated memory, suspends and resumes from the servers' reports, each counted
    once, in fracspawner_hibernated_bytes, fracspawner_hibernations/resumes and the duration
    histogram; a malformed hibernation field is refused like any other."""
    from fracspawner.culler.decide import ServerFacts
    from tests.conftest import DEMO_CATALOG

    c = Culler(api_token="x", report_url="http://127.0.0.1:1", catalog=str(DEMO_CATALOG))
    c.initialize([])
    # the hub's record of ann's server (a cycle's list): its pool labels the metrics
    c.known[("ann", "")] = ServerFacts("ann", "", user_options={"gpu": "1/4", "pool": "h100"})
    hib = {
        "hibernated_gpu_memory_mib": 4096,
        "hibernations": [{"kernel_id": "k1", "at": iso(T - 60), "gpu_memory_mib": 4096,
                          "seconds": 0.2}],
        "resumes": [{"kernel_id": "k0", "at": iso(T - 30), "gpu_memory_mib": 2048,
                     "seconds": 0.6, "why": "a message to the kernel"}],
    }  # fmt: skip
    body = report(hibernated_gpu_memory_mib=4096, hibernation=hib, slice={"pool": "t4"})
    who = Identity("ann", "")  # the pool the report names (t4) is not the hub's (h100)
    for _ in range(2):  # the same events told twice: counted once
        c.on_report(who, c.reports.put("ann", "", parse_report(body, received_at=T)))
    value = c.metrics.registry.get_sample_value
    assert value("fracspawner_hibernated_bytes", {"pool": "h100"}) == 4096 * 2**20
    assert value("fracspawner_hibernations_total", {"pool": "h100"}) == 1
    assert value("fracspawner_resumes_total", {"pool": "h100"}) == 1
    assert value("fracspawner_hibernation_duration_seconds_count", {"operation": "resume"}) == 1
    assert value("fracspawner_hibernation_duration_seconds_sum", {"operation": "resume"}) == 0.6
    # everything resumed: the gauge follows the latest report
    body = report(hibernated_gpu_memory_mib=0, hibernation={**hib, "hibernated_gpu_memory_mib": 0},
                  slice={"pool": "h100"})  # fmt: skip
    c.on_report(who, c.reports.put("ann", "", parse_report(body, received_at=T + 60)))
    assert value("fracspawner_hibernated_bytes", {"pool": "h100"}) == 0
    bad = report(hibernation={"resumes": [{"kernel_id": "k", "at": iso(T), "seconds": -1}]})
    with pytest.raises(ReportError, match=r"hibernation.resumes\[0\].seconds"):
        parse_report(bad, received_at=T)
