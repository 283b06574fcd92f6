"""Issue 23: the admin's picture. Fast tests of its parts: per-pool and per-server usage from
pod records (capacity/usage.py, `fracspawner usage`), the culler's state (what it will do next,
its 24 h history, who came back) and its API's gate, the admin page's model and rendering, the
service's per-pool gauges, and the Grafana dashboard's queries against the metrics exported.
The browser, a real Prometheus and a real culler are in test_browser_admin.py.
"""

from __future__ import annotations

import json
import re
import time
from html.parser import HTMLParser

import pytest
import yaml

from fracspawner.backends import load_catalog
from fracspawner.capacity.count import compute_capacity
from fracspawner.choice.offers import build_offer_model
from fracspawner.cli.usage import render_json, render_table, usage_of
from fracspawner.culler.decide import Decision, GpuFacts, Reading, ServerFacts
from fracspawner.culler.metrics import CullerMetrics
from fracspawner.culler.state import CullerState, CullEvent, gpu_state, next_step, server_row
from fracspawner.hub.admin import (
    PoolMetrics,
    build_admin_model,
    holders_from_servers,
    may_see,
    render_admin_page,
    row_texts,
    sort_and_page,
)
from fracspawner.hub.form import render_service_page
from fracspawner.model.catalog import AccessRule, IdlePolicy
from tests.conftest import DEMO_CATALOG, REPO

DASHBOARD = REPO / "charts" / "fracspawner" / "dashboards" / "fracspawner.json"


@pytest.fixture(scope="module")
def catalog():
    return load_catalog(DEMO_CATALOG)


def t4_node() -> dict:
    # the demo topology's T4 node: 1 GPU time-sliced 4 ways (devcluster/topologies/demo.yaml)
    return {
        "metadata": {
            "name": "gpu-t4-1",
            "labels": {"nvidia.com/gpu.product": "Tesla-T4-SHARED", "nvidia.com/gpu.replicas": "4"},
        },
        "spec": {},
        "status": {
            "allocatable": {"cpu": "8", "nvidia.com/gpu": "4"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def gpu_pod(name: str, user: str, *, server: str = "", node: str | None = "gpu-t4-1") -> dict:
    """A pod as FracSpawner makes it for 1/4 of the t4 pool (CONTRACT labels/annotations;
    kubespawner's username/servername annotations: kubespawner/spawner.py
    _build_common_annotations)."""
    annotations = {
        "hub.jupyter.org/username": user,
        "fracspawner.io/gpu-equivalent": "0.25",
        "fracspawner.io/gpu-memory-mib": "3840",
    }
    if server:
        annotations["hub.jupyter.org/servername"] = server
    return {
        "metadata": {
            "name": name,
            "namespace": "jhub",
            "uid": f"uid-{name}",
            "creationTimestamp": "2026-11-25T10:00:00Z",
            "labels": {"fracspawner.io/pool": "t4", "fracspawner.io/gpu": "0.25"},
            "annotations": annotations,
        },
        "spec": {
            "nodeName": node,
            "containers": [{"name": "notebook", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
        "status": {"phase": "Running" if node else "Pending"},
    }


def test_usage_per_pool_and_per_server_from_pods(catalog):
    pods = [
        gpu_pod("jupyter-alice", "alice"),
        gpu_pod("jupyter-bob--train", "bob", server="train", node=None),
    ]
    pools, holders = usage_of(catalog, [t4_node()], pods)
    t4 = {p.name: p for p in pools}["t4"]
    assert (t4.held, t4.waiting, t4.held_gpu, t4.waiting_gpu) == (1, 1, 0.25, 0.25)
    assert t4.free_gpu == 0.75  # 3 of 4 quarters free
    assert [(o.spec, o.free, o.total) for o in t4.offers] == [("1/4", 3, 4)]
    assert {p.name: p.free_gpu for p in pools}["h100"] == 0  # no node serves it
    alice, bob = holders
    assert (alice.user, alice.server, alice.node, alice.waiting) == ("alice", "", "gpu-t4-1", False)
    assert (bob.user, bob.server, bob.waiting, bob.memory_limit_mib) == ("bob", "train", True, 3840)
    assert alice.since == 1795600800.0  # the pod's creationTimestamp, 2026-11-25T10:00:00Z
    table = render_table(pools, holders)
    # the picker's words (issue 27 #6): "1/4" and "3/4", never 0.25 and 0.75
    assert re.search(r"^t4\s+1\s+1\s+1/4\s+3/4\s+1/4 3/4$", table, re.M), table
    # the slice and its memory in the page's words too (issue 38 #3)
    assert re.search(r"^bob\s+train\s+t4\s+1/4\s+1/4\s+3\.8 GiB\s+\(waiting\)", table, re.M)
    body = json.loads(render_json(pools, holders))
    assert body["servers"][0]["user"] == "alice" and body["pools"][2]["free_gpu"] == 0.75


def test_usage_command_prints_the_pools_of_a_kube_context(devcluster, capsys):
    from fracspawner.cli import main

    assert (
        main(["usage", "--catalog", str(DEMO_CATALOG), "--kubeconfig", str(devcluster.kubeconfig)])
        == 0
    )
    out = capsys.readouterr().out
    # the demo topology's T4: one GPU time-sliced 4 ways, nothing held
    assert re.search(r"^t4\s+0\s+0\s+0\s+1\s+1/4 4/4$", out, re.M), out
    # two idle A100s in their MIG layout: every MIG device is free, added up, in the picker's
    # words; it said 0.857 (the largest profile's count times its size, issue 27 #6)
    assert re.search(
        r"^a100-mig\s+0\s+0\s+0\s+2\s+MIG 1g\.10gb 4/4, MIG 2g\.20gb 2/2, MIG 3g\.40gb 2/2$",
        out,
        re.M,
    ), out
    assert "FREE GPU of a100-mig: the MIG devices not in use, added up" in out
    assert "FREE GPU of h100, t4: the most that can still be handed out" in out
    assert "No pod holds a GPU slice." in out
    assert (
        main(
            [
                "usage",
                "-o",
                "json",
                "--catalog",
                str(DEMO_CATALOG),
                "--kubeconfig",
                str(devcluster.kubeconfig),
            ]
        )
        == 0
    )
    assert {p["name"] for p in json.loads(capsys.readouterr().out)["pools"]} == {
        "a100-mig",
        "h100",
        "t4",
    }
    assert main(["usage", "--kubeconfig", "/nonexistent"]) == 2


# --- the culler's state ------------------------------------------------------------------------
POLICY = IdlePolicy(
    kernel_gpu_idle=None,
    server_gpu_idle=3600,
    server_idle=8 * 3600,
    max_age=None,
    server_unattended=86400,
)
NOW = 1_800_000_000.0


def facts(user="alice", **kw) -> ServerFacts:
    return ServerFacts(
        user=user,
        user_options={"gpu": "1/4", "pool": "h100"},
        started=NOW - 7200,
        last_activity=NOW - 600,
        **kw,
    )


def test_gpu_state_unknown_is_never_idle():
    assert gpu_state(None) == ("unknown", None)
    assert gpu_state(GpuFacts("prometheus", NOW, 100, None)) == ("unknown", None)
    assert gpu_state(GpuFacts("prometheus", NOW, 100, 0)) == ("busy", None)
    assert gpu_state(GpuFacts("prometheus", NOW, 100, 900)) == ("idle", 900)


def test_next_step_says_what_the_culler_does_and_when():
    keep = Decision("keep", "active", "")
    # GPU idle for 15 min, user active 10 min ago: the GPU rule stops it 1 h after the activity
    idle = Reading(GpuFacts("prometheus", NOW, 2048, 900, 3600))
    assert next_step(facts(), idle, keep, POLICY, NOW) == {
        "action": "stop",
        "reason": "gpu_idle",
        "at": NOW - 600 + 3600,
    }
    # unknown GPU: only the plain idle timeout
    unknown = Reading(None, "GPU source prometheus has no data for it")
    assert next_step(facts(), unknown, keep, POLICY, NOW) == {
        "action": "stop",
        "reason": "idle",
        "at": NOW - 600 + 8 * 3600,
    }
    assert next_step(facts(), idle, Decision("keep", "exempt", ""), POLICY, NOW) is None
    assert next_step(facts(), idle, Decision("stop", "gpu_idle", ""), POLICY, NOW)["at"] == NOW


def test_history_is_bounded_24h_and_counts_users_who_came_back():
    state = CullerState(NOW - 90000, limit=3)

    def event(at: float, user: str) -> CullEvent:
        return CullEvent(at, user, "", "h100", "1/4", "server", "gpu_idle", "m", 2048, 0.25)

    state.record(event(NOW - 25 * 3600, "old"))  # older than 24 h: pruned
    state.record(event(NOW - 3600, "alice"))
    state.record(event(NOW - 1800, "bob"))
    state.record(event(NOW - 60, "carol"))
    assert len(state.history) == 3  # the bound
    row = server_row(
        facts("alice"),
        Reading(GpuFacts("prometheus", NOW, 1, 0)),
        Decision("keep", "gpu_busy", ""),
        POLICY,
        "h100",
        NOW,
    )
    # alice started again 10 min after her stop, bob 40 min after his, carol not yet
    back = [ServerFacts("alice", started=NOW - 3000), ServerFacts("bob", started=NOW - 1800 + 2400)]
    state.cycle([row], back, NOW)
    body = state.to_json(NOW)
    assert [e["user"] for e in body["history"]] == ["alice", "bob", "carol"]
    assert body["summary"]["came_back_30min"] == 1
    assert body["summary"]["servers_stopped"] == 3
    assert body["summary"]["gpu_memory_mib"] == 3 * 2048
    # slice-hours: 1/4 GPU until each came back (alice 600 s, bob 2400 s) or now (carol 60 s)
    assert body["summary"]["slice_hours"] == round(0.25 * (600 + 2400 + 60) / 3600, 3)
    assert body["servers"][0]["gpu"] == {**body["servers"][0]["gpu"], "state": "busy", "since": NOW}
    # still busy a cycle later: busy since the first cycle that saw it
    state.cycle(
        [
            server_row(
                facts("alice"),
                Reading(GpuFacts("prometheus", NOW + 30, 1, 0)),
                Decision("keep", "gpu_busy", ""),
                POLICY,
                "h100",
                NOW + 30,
            )
        ],
        [],
        NOW + 30,
    )
    assert state.servers[0]["gpu"]["since"] == NOW


async def test_state_api_answers_only_tokens_that_read_every_server():
    from tornado.httpclient import AsyncHTTPClient
    from tornado.httpserver import HTTPServer
    from tornado.web import Application

    from devcluster.localhub import free_port
    from fracspawner.culler.identity import Refused
    from fracspawner.culler.stateapi import state_handler

    class Verifier:  # the hub's answers to GET /hub/api/user, per token
        state_limit = None  # the state API's own budget of unknown tokens (not limited here)

        async def model(self, token, source, limit=None):
            models = {
                "service": {
                    "kind": "service",
                    "name": "fracspawner",
                    "scopes": ["list:users", "read:servers"],
                },
                "user": {"kind": "user", "name": "alice", "scopes": ["read:servers!user=alice"]},
            }
            if token not in models:
                raise Refused(403, "the hub does not know this token")
            return models[token]

    port = free_port()
    server = HTTPServer(
        Application([state_handler("/api/state", lambda: Verifier(), lambda now: {"servers": []})])
    )
    server.listen(port, "127.0.0.1")
    http = AsyncHTTPClient(force_instance=True)
    try:

        async def get(token):
            headers = {"Authorization": f"token {token}"} if token else {}
            r = await http.fetch(
                f"http://127.0.0.1:{port}/api/state", headers=headers, raise_error=False
            )
            return r.code

        assert await get(None) == 401
        assert await get("user") == 403
        assert await get("forged") == 403
        assert await get("service") == 200
    finally:
        http.close()
        server.stop()


# --- the admin page ----------------------------------------------------------------------------
def culler_state(now: float) -> dict:
    def row(user, state, idle_for=None):
        return {
            "user": user, "server": "", "pool": "t4", "slice": "1/4", "started": now - 3600,
            "gpu": {"state": state, "idle_for": idle_for, "memory_mib": 1024.0,
                    "source": "prometheus", "note": "", "since": now - 300},
            "next": {"action": "stop", "reason": "gpu_idle", "at": now + 1800},
        }  # fmt: skip

    # fmt: off
    return {
        "since": now - 7200, "last_cycle_at": now,
        "servers": [row("alice", "busy"), row("bob", "idle", 300), row("<b>eve</b>", "unknown")],
        "history": [{"at": now - 60, "user": "dave", "server": "", "pool": "t4", "slice": "1/4",
                     "kind": "server", "reason": "gpu_idle", "message": "idle",
                     "gpu_memory_mib": 2048.0, "gpu_equivalent": 0.25, "came_back_at": None}],
        "summary": {"servers_stopped": 1, "kernels_shut_down": 0, "gpu_memory_mib": 2048.0,
                    "slice_hours": 0.004, "came_back_30min": 0},
    }
    # fmt: on


def model_for(catalog, users, culler, now):
    pods = [gpu_pod(f"jupyter-{u}", u) for u in users]
    pools, holders = usage_of(catalog, [t4_node()], pods)
    capacity = compute_capacity(catalog, [t4_node()], pods)
    history = {"t4": [[now - 120, 0.5, 0.5, 0.25], [now - 60, 0.75, 0.25, 0.25]]}
    return build_admin_model(catalog, capacity, holders, culler, history, now)


def test_admin_model_joins_pods_with_the_cullers_view(catalog):
    now = time.time()
    model = model_for(catalog, ["alice", "bob", "<b>eve</b>"], culler_state(now), now)
    rows = {r["user"]: row_texts(r, now) for r in model["servers"]}
    assert (rows["alice"]["gpu"], rows["bob"]["gpu"], rows["<b>eve</b>"]["gpu"]) == (
        "busy",
        "idle",
        "unknown",
    )
    assert rows["bob"]["memory_text"] == "1.0 GiB of 3.8 GiB"
    assert rows["bob"]["next_text"].startswith("stop (gpu idle) in 30 min")
    # alice's GPU is busy: the projection holds only if it goes idle now, not "stays" idle
    assert rows["alice"]["next_text"].endswith("if its GPU and its user are idle until then")
    t4 = {p["name"]: p for p in model["pools"]}["t4"]
    assert (t4["held"], t4["held_gpu"], t4["idle_held_gpu"], t4["free_gpu"]) == (
        3,
        0.75,
        0.25,
        0.25,
    )
    # without a culler, idle-held is unknown (never 0) and every GPU state unknown
    alone = model_for(catalog, ["alice"], None, now)
    assert {p["name"]: p for p in alone["pools"]}["t4"]["idle_held_gpu"] is None
    assert alone["servers"][0]["gpu"] == "unknown"


def test_a_plain_idle_stop_of_a_server_whose_gpu_the_culler_reads_names_the_gpu_too(catalog):
    """decide.py server_deadlines: a GPU server's plain idle timeout (server_gpu_idle off, or
    its GPU history still short) stops it only if its GPU is idle too; the page said only
    "if nobody uses it". Unknown GPU data does not count, so there the plain words stay."""
    now = time.time()
    state = culler_state(now)
    for row in state["servers"]:
        row["next"]["reason"] = "idle"
    model = model_for(catalog, ["alice", "bob", "<b>eve</b>"], state, now)
    words = {r["user"]: row_texts(r, now)["next_text"] for r in model["servers"]}
    assert words["alice"].endswith("if nobody uses it and its GPU is idle until then")
    assert words["bob"].endswith("if nobody uses it and its GPU is idle until then")
    assert words["<b>eve</b>"].endswith("if nobody uses it")


def test_admin_page_escapes_sorts_pages_and_says_how_far_back(catalog):
    now = time.time()
    model = model_for(catalog, ["alice", "bob", "<b>eve</b>"], culler_state(now), now)
    info = {"since": now - 600, "interval": 60, "samples": 1440}
    html = render_admin_page(
        model,
        user="admin",
        hub_prefix="/hub/",
        static_prefix="/s/",
        sort="gpu",
        order="desc",
        history_info=info,
    )
    assert "<b>eve</b>" not in html and "&lt;b&gt;eve&lt;/b&gt;" in html
    assert 'href="/hub/admin?name_filter=%3Cb%3Eeve%3C/b%3E"' in html
    assert "at most 1440 per pool, 24.0 h" in html and "when the service last started" in html
    assert 'aria-sort="descending"' in html
    assert "<td>1/4</td>" in html  # the slice in the picker's words, not the label's 0.25
    # pools' amounts in the picker's words too, and what "free" means (issue 27 #6)
    t4_card = html[html.index('data-pool="t4"') :]
    assert re.search(r'data-field="held"[^>]*>3 slices \(3/4 GPU\)', t4_card), t4_card[:800]
    assert re.search(r'data-field="free"[^>]*>1/4 GPU<', t4_card), t4_card[:800]
    assert "Free: the most that can still be handed out" in t4_card
    order = re.findall(r'<tr data-user="([^"]+)" data-server="" data-gpu="(\w+)"', html)
    assert [g for _, g in order] == ["busy", "idle", "unknown"]
    assert '<script src="/s/uplot/uPlot.iife.min.js">' in html  # shipped with the page
    assert "1 server stopped" in html and "dave" in html
    # 120 holders: 50 a page, the last page has 20
    rows = [dict(model["servers"][0], user=f"u{i:03}") for i in range(120)]
    page, pages = sort_and_page(rows, "user", "asc", 3)
    assert pages == 3 and len(page) == 20 and page[0]["user"] == "u100"


def test_history_json_cannot_end_its_script_element(catalog):
    now = time.time()
    model = model_for(catalog, [], None, now)
    model["history"] = {"</script><script>alert(1)</script>": [[now, 1, 1, None]]}
    html = render_admin_page(model, user="admin", hub_prefix="/hub/", static_prefix="/s/")
    assert "</script><script>alert(1)" not in html


def test_holders_from_the_hubs_server_models_without_a_watch(catalog):
    users = [{"name": "alice", "servers": {
        "": {"ready": True, "started": "2026-11-25T10:00:00Z",
             "user_options": {"gpu": "1/4", "pool": "h100"}},
        "cpu": {"ready": True, "user_options": {"gpu": "none"}},
    }}]  # fmt: skip
    (holder,) = holders_from_servers(catalog, users)
    assert (holder.pool, holder.gpu_equivalent, holder.memory_limit_mib) == (
        "h100",
        0.25,
        20389,
    )  # a quarter of 81559 MiB


def test_page_is_for_tokens_that_read_every_server():
    assert may_see({"name": "admin", "scopes": ["read:servers", "admin:servers"]})
    assert not may_see(
        {"name": "alice", "scopes": ["read:servers!user=alice", "read:servers!user"]}
    )
    assert not may_see({"name": "bob"})


def test_pool_gauges_leave_unknown_out(catalog):
    now = time.time()
    metrics = PoolMetrics()
    metrics.update(model_for(catalog, ["alice"], None, now))
    value = metrics.registry.get_sample_value
    assert value("fracspawner_pool_gpu_equivalents_held", {"pool": "t4"}) == 0.25
    assert value("fracspawner_pool_slices", {"pool": "t4", "state": "held"}) == 1
    assert value("fracspawner_pool_gpu_equivalents_free", {"pool": "t4"}) == 0.75
    assert value("fracspawner_pool_gpu_equivalents_idle_held", {"pool": "t4"}) is None  # no culler
    # counts turn unknown (the watch lost its nodes): the series goes, it never reads 0
    model = model_for(catalog, ["alice"], None, now)
    {p["name"]: p for p in model["pools"]}["t4"]["free_gpu"] = None
    metrics.update(model)
    assert value("fracspawner_pool_gpu_equivalents_free", {"pool": "t4"}) is None


# --- the Grafana dashboard ---------------------------------------------------------------------
def exported_metric_names() -> set[str]:
    """Every sample name the service's and the culler's registries can export."""
    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_sum", "_count", "_created"),
        "gauge": ("",),
    }
    names = set()
    for registry in (PoolMetrics().registry, CullerMetrics().registry):
        for family in registry.collect():
            names.update(family.name + s for s in suffixes.get(family.type, ("",)))
    return names


def dashboard_queries() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    return [t["expr"] for panel in board["panels"] for t in panel["targets"]]


def metric_names(expr: str) -> set[str]:
    # identifiers that are neither label names (inside braces/by()) nor functions
    stripped = re.sub(r"\{[^}]*\}|\b(by|without)\s*\([^)]*\)|\[[^\]]*\]", "", expr)
    return {m for m in re.findall(r"[a-zA-Z_:][\w:]*", stripped) if m.startswith("fracspawner_")}


def test_every_dashboard_query_names_a_metric_the_project_exports():
    exported = exported_metric_names()
    queries = dashboard_queries()
    assert queries
    for expr in queries:
        names = metric_names(expr)
        assert names, f"{expr!r} names no fracspawner metric"
        assert names <= exported, f"{expr!r}: {names - exported} not exported"
    covered = {n for e in queries for n in metric_names(e)}
    for gauge in (
        "fracspawner_pool_slices",
        "fracspawner_pool_gpu_equivalents_held",
        "fracspawner_pool_gpu_equivalents_idle_held",
        "fracspawner_culls_total",
    ):
        assert gauge in covered


# --- the chart: the dashboard ConfigMap, the service's scrape target -------------------------
def test_chart_ships_the_dashboard_for_grafanas_sidecar_behind_a_flag():
    import helm_python as helm

    from tests.chart_support import by_kind, objects, one, render

    def dashboards(objs):
        return [
            o for o in by_kind(objs, "ConfigMap") if o["metadata"]["name"].endswith("dashboard")
        ]

    assert dashboards(objects(render())) == []  # off by default
    values = {
        "metrics": {
            "grafanaDashboard": {"enabled": True, "namespace": "monitoring"},
            "serviceMonitor": {"enabled": True},
        }
    }
    objs = objects(render(values))
    (cm,) = dashboards(objs)
    # kube-prometheus-stack's Grafana sidecar loads ConfigMaps labelled grafana_dashboard: "1"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == "monitoring"
    assert json.loads(cm["data"]["fracspawner.json"]) == json.loads(DASHBOARD.read_text())
    # Prometheus scrapes the service's gauges at its prefix, and the culler's
    service = one(objs, "ServiceMonitor", "service")
    assert service["spec"]["endpoints"][0]["path"] == "/services/fracspawner/metrics"
    # the service asks the culler's state API on the culler's metrics port, which admits it
    (container,) = one(objs, "Deployment", "service")["spec"]["template"]["spec"]["containers"]
    assert "--culler-url=http://fracspawner-culler.jhub.svc:9090/" in container["command"]
    policy = one(objs, "NetworkPolicy", "culler")["spec"]["ingress"]
    assert any(
        rule["from"][0]
        .get("podSelector", {})
        .get("matchLabels", {})
        .get("app.kubernetes.io/component")
        == "service"
        for rule in policy
    )
    with pytest.raises(helm.HelmValuesError) as info:
        render({"metrics": {"grafanaDashboard": {"enable": True}}})
    assert "additional properties 'enable' not allowed" in str(info.value)


async def test_when_neither_watch_nor_hub_can_tell_held_is_unknown_never_zero(catalog):
    # no pod watch (--no-live-capacity) and a hub that does not answer (nothing listens there)
    from devcluster.localhub import free_port
    from fracspawner.hub.admin import AdminData

    data = AdminData(
        catalog, None, hub_api_url=f"http://127.0.0.1:{free_port()}/hub/api", token="t"
    )
    model = await data.model()
    assert model["holders_known"] is False
    assert {p["held"] for p in model["pools"]} == {None}
    assert (
        data.metrics.registry.get_sample_value(
            "fracspawner_pool_gpu_equivalents_held", {"pool": "t4"}
        )
        is None
    )
    html = render_admin_page(model, user="admin", hub_prefix="/hub/", static_prefix="/s/")
    assert "Who holds what is unknown" in html and "0 slices" not in html
    data.http.close()


async def test_a_hub_redirect_never_carries_the_services_token_and_is_unknown(catalog):
    # the hub's users API answers a redirect to another port (a misconfigured proxy, or an
    # attacker able to answer there); the service's token must not follow it, and the server
    # list is then unknown, as when the hub does not answer: never an empty "nobody holds"
    from tornado.httpserver import HTTPServer
    from tornado.web import Application, RequestHandler

    from devcluster.localhub import free_port
    from fracspawner.hub.admin import AdminData

    hub_port, other_port = free_port(), free_port()
    seen: list[str | None] = []

    class Elsewhere(RequestHandler):
        def get(self, path: str) -> None:
            seen.append(self.request.headers.get("Authorization"))
            self.write(json.dumps({"items": [], "_pagination": {"next": None}}))

    class Redirects(RequestHandler):
        def get(self, path: str) -> None:
            self.redirect(f"http://127.0.0.1:{other_port}/{path}?{self.request.query}")

    servers = [HTTPServer(Application([(r"/(.*)", Redirects)]))]
    servers.append(HTTPServer(Application([(r"/(.*)", Elsewhere)])))
    servers[0].listen(hub_port, "127.0.0.1")
    servers[1].listen(other_port, "127.0.0.1")
    data = AdminData(
        catalog, None, hub_api_url=f"http://127.0.0.1:{hub_port}/hub/api", token="secret"
    )
    try:
        assert await data.hub_users() is None
        model = await data.model()
        assert model["holders_known"] is False
        assert {p["held"] for p in model["pools"]} == {None}
        assert seen == []  # the other port was never asked, with or without the token
    finally:
        data.http.close()
        for server in servers:
            server.stop()


def test_hibernated_gpu_memory_shows_where_a_server_reports_it(catalog):
    # the culler's row carries what the server's own report says its hibernated kernels keep
    # in host memory (GPU hibernation, issue 22); the page shows it beside the GPU state
    row = server_row(
        facts("bob"), Reading(GpuFacts("prometheus", NOW, 0, 600)),
        Decision("keep", "active", ""), POLICY, "t4", NOW, hibernated_mib=3072.0,
    )  # fmt: skip
    assert row["gpu"]["hibernated_mib"] == 3072.0
    now = time.time()
    state = culler_state(now)
    state["servers"][1]["gpu"]["hibernated_mib"] = 3072.0  # bob
    model = model_for(catalog, ["alice", "bob"], state, now)
    html = render_admin_page(model, user="admin", hub_prefix="/hub/", static_prefix="/s/")
    assert "hibernated: 3.0 GiB of GPU memory kept in host memory" in html
    assert html.count('data-field="hibernated"') == 1


def test_admin_page_says_a_slice_in_words_whatever_the_catalogs_fraction_step():
    # a catalog in quarters (fraction_step 4, not the demo's 8); bob's pod was made while the
    # catalog was in eighths and keeps its label: the page still says what it holds in words
    data = yaml.safe_load(DEMO_CATALOG.read_text())
    data["fraction_step"] = 4
    data["pools"]["h100"]["offers"] = ["1/4", "1/2", "10GiB", "20GiB", "1"]
    quarters = load_catalog(data)
    now = time.time()
    pods = [gpu_pod("jupyter-alice", "alice"), gpu_pod("jupyter-bob", "bob")]
    pods[1]["metadata"]["labels"]["fracspawner.io/gpu"] = "0.125"
    _, holders = usage_of(quarters, [t4_node()], pods)
    capacity = compute_capacity(quarters, [t4_node()], pods)
    model = build_admin_model(quarters, capacity, holders, None, {}, now)
    html = render_admin_page(model, user="admin", hub_prefix="/hub/", static_prefix="/s/")
    table = html[html.index('id="fs-holders"') :]
    rows = re.findall(r'<tr data-user="(\w+)"(.*?)</tr>', table, re.S)
    slices = {user: re.findall(r"<td>(.*?)</td>", cells, re.S)[3] for user, cells in rows}
    assert slices == {"alice": "1/4", "bob": "1/8"}


class _Nav(HTMLParser):
    """The page's first <nav>: its links as (text, href), the ids in it and its text."""

    def __init__(self) -> None:
        super().__init__()
        self.depth, self.done, self.in_link = 0, False, False
        self.links: list[tuple[str, str]] = []
        self.ids: set[str] = set()
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        if self.done or (tag != "nav" and not self.depth):
            return
        attrs = dict(attrs)
        self.depth += tag == "nav"
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        if tag == "a":
            self.in_link = True
            self.links.append(("", attrs.get("href") or ""))

    def handle_endtag(self, tag):
        self.in_link = self.in_link and tag != "a"
        if tag == "nav" and self.depth:
            self.depth -= 1
            self.done = not self.depth

    def handle_data(self, data):
        if not self.depth or self.done:
            return
        self.text.append(data)
        if self.in_link and data.strip():
            text, href = self.links[-1]
            self.links[-1] = (text + data.strip(), href)

    @classmethod
    def of(cls, html: str) -> _Nav:
        nav = cls()
        nav.feed(html)
        return nav


def test_admin_page_has_the_hubs_navigation_as_the_service_page_does(catalog):
    now = time.time()
    model = model_for(catalog, ["alice"], None, now)
    name = '<img src=x onerror="alert(1)">'
    html = render_admin_page(model, user=name, hub_prefix="/hub/", static_prefix="/s/")
    nav = _Nav.of(html)
    links = dict(nav.links)
    # JupyterHub's navbar (jupyterhub/jupyterhub share/jupyterhub/templates/page.html, blocks
    # nav_bar_left_items and nav_bar_right_items): Home, Token, Admin, theme toggle, user, Logout
    assert (links["Home"], links["Token"], links["Admin"]) == (
        "/hub/home",
        "/hub/token",
        "/hub/admin",
    )
    assert links["Logout"] == "/hub/logout" and links["GPU usage"] == ""
    assert {"jupyterhub-logo", "dark-theme-toggle", "login_widget", "logout"} <= nav.ids
    assert '<script src="/hub/static/js/darkmode.js"></script>' in html  # runs the toggle
    # the user's name is text, never markup
    assert name in " ".join(nav.text) and "<img src=x" not in html
    assert "&lt;img src=x onerror=&#34;alert(1)&#34;&gt;" in html
    # the same navigation as the service's own page (one template, not a copy)
    service = _Nav.of(
        render_service_page(
            build_offer_model(catalog, rule=AccessRule(pools=("t4",), max_gpu=None), used_gpu=0),
            user=name,
            hub_prefix="/hub/",
        )
    )
    assert service.ids == nav.ids
    assert [link for link in service.links if link[0] != "GPU pools"] == [
        link for link in nav.links if link[0] not in ("Admin", "GPU usage")
    ]


async def test_the_services_health_turns_ready_once_its_role_is_granted(catalog, monkeypatch):
    """Issue 34 item 10: /health (the chart's readiness probe) is 503 while the service's token
    lacks scopes and asks the hub again while it does (nobody reaches an unready pod's admin
    page to make it ask), so the pod turns Ready once the role is granted; /health/live (the
    liveness probe) answers throughout."""
    from tornado.httpclient import AsyncHTTPClient
    from tornado.httpserver import HTTPServer
    from tornado.web import Application, RequestHandler

    from devcluster.localhub import free_port
    from fracspawner.hub import admin as admin_module
    from fracspawner.hub.admin import AdminData
    from fracspawner.hub.service import make_app

    granted: list[str] = []  # the service token's scopes, as GET /hub/api/user answers

    class WhoAmI(RequestHandler):
        def get(self) -> None:
            self.write(json.dumps({"kind": "service", "name": "fracspawner", "scopes": granted}))

    hub_port, port = free_port(), free_port()
    hub = HTTPServer(Application([(r"/hub/api/user", WhoAmI)]))
    hub.listen(hub_port, "127.0.0.1")
    data = AdminData(
        catalog, None, hub_api_url=f"http://127.0.0.1:{hub_port}/hub/api", token="secret"
    )
    server = HTTPServer(make_app(catalog, None, "/services/fracspawner/", data))
    server.listen(port, "127.0.0.1")
    client = AsyncHTTPClient()

    async def get(path: str) -> tuple[int, dict]:
        url = f"http://127.0.0.1:{port}/services/fracspawner/{path}"
        resp = await client.fetch(url, raise_error=False)
        return resp.code, json.loads(resp.body)

    try:
        await data.check_scopes()  # at start (hub/service.py serve)
        code, answer = await get("health")
        assert code == 503 and answer["missing"] == ["list:users", "read:servers"]
        assert "list:users (list the users with running servers)" in answer["message"]
        assert (await get("health/live"))[0] == 200
        granted[:] = ["list:users", "read:servers", "read:users:name"]
        monkeypatch.setattr(admin_module, "SCOPE_RECHECK_S", 0.0)
        assert await get("health") == (200, {"status": "ok"})
        assert data.problems == []
    finally:
        server.stop()
        hub.stop()
        data.http.close()
