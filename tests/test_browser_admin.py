"""Issue 23: the admin page, end to end. A real JupyterHub with FracSpawner on the devcluster's
demo topology, the real fracspawner service (its capacity watches, its own hub token), the real
culler (`fracspawner culler`, a process) reading GPU activity from a real Prometheus that scrapes
the dcgm-exporter stand-in, the service and the culler; Debian's Chromium via Playwright.

On the page an admin sees the pools, the servers holding slices (one busy, one idle, one whose
GPU activity nobody can read: unknown), what the culler stopped (an idle H100 server, after the
pool's 4 s policy) and that its user came back, and the charts with their tables; a user who is
not an admin gets 403. The Grafana dashboard's every query runs against that Prometheus.
With FRACSPAWNER_UPDATE_SCREENSHOTS=1 it refreshes docs/_static/admin-page*.png.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from urllib.parse import urlencode

import pytest
import yaml

from devcluster.localhub import free_port, http_json
from tests.browser_helpers import SCREENSHOTS, login, new_page
from tests.conftest import DEMO_CATALOG, REPO
from tests.e2e_helpers import spawn, the_pod, wait_until
from tests.test_culler_support import CULLER_SCOPES

# `browser`, `clean_servers`, `exporter` and `prometheus` are tests/conftest.py's
pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.usefixtures("clean_servers")]

CATALOG = yaml.safe_load(DEMO_CATALOG.read_text())
CATALOG["access"]["default"] = {"pools": "all", "max_gpu": 2}
CATALOG["pools"]["h100"]["idle"] = {"server_gpu_idle": "4s"}  # t4 keeps the catalog's hour

CULLER_TOKEN = uuid.uuid4().hex
SERVICE_PORT = free_port()
CULLER_PORT = free_port()  # the culler's /metrics and /api/state
HUB_EXTRA_CONFIG = f"""
for _service in c.JupyterHub.services:
    if _service["name"] == "fracspawner":
        _service["url"] = "http://127.0.0.1:{SERVICE_PORT}"
        _service["command"] = [*_service["command"],
            "--culler-url=http://127.0.0.1:{CULLER_PORT}/", "--history-interval=1"]
c.JupyterHub.services.append({{"name": "gpu-culler", "api_token": {CULLER_TOKEN!r}}})
c.JupyterHub.load_roles.append(
    {{"name": "gpu-culler", "scopes": {CULLER_SCOPES!r}, "services": ["gpu-culler"]}}
)
"""
PROMETHEUS_EXTRA_JOBS = {
    "fracspawner-service": (f"127.0.0.1:{SERVICE_PORT}", "/services/fracspawner/metrics"),
    "fracspawner-culler": (f"127.0.0.1:{CULLER_PORT}", "/metrics"),
}
DASHBOARD = REPO / "charts" / "fracspawner" / "dashboards" / "fracspawner.json"


@pytest.fixture(scope="module")
def culler(hub, prometheus, tmp_path_factory):
    """`fracspawner culler` beside the hub, every 2 s, Prometheus as its GPU source."""
    log = tmp_path_factory.mktemp("culler") / "culler.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTERHUB_")}
    env["JUPYTERHUB_API_TOKEN"] = CULLER_TOKEN
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "fracspawner", "culler", f"--url={hub.api_url}",
                f"--catalog={hub.state_dir / 'catalog.yaml'}", f"--prometheus-url={prometheus.url}",
                "--namespace=default", "--cull-every=2", f"--metrics-port={CULLER_PORT}",
                "--metrics-ip=127.0.0.1", "--Culler.pod_label=exported_pod",
                "--Culler.namespace_label=exported_namespace", "--Culler.coverage_step=1",
                "--Culler.max_sample_gap=5", "--Culler.max_staleness=30",
            ],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        print("---- culler log (tail) ----\n" + log.read_text(errors="replace")[-3000:])


def admin_page_url(hub, **args) -> str:
    return f"{hub.url}/services/fracspawner/admin" + (f"?{urlencode(args)}" if args else "")


def rows(page) -> dict[str, str]:
    return {
        el.get_attribute("data-user"): el.get_attribute("data-gpu")
        for el in page.locator("#fs-holders tbody tr[data-user]").all()
    }


def test_admin_sees_pools_holders_culler_history_and_charts(
    hub, devcluster, browser, exporter, prometheus, culler
):
    servers = {
        "alice": {"gpu": "1/4", "pool": "h100"},  # busy
        "bob": {"gpu": "1/4", "pool": "t4"},  # idle (the catalog's hour: kept)
        "carol": {"gpu": "1/8", "pool": "h100"},  # no GPU series: unknown, never idle
        "dave": {"gpu": "1/4", "pool": "h100"},  # idle past the pool's 4 s: stopped
    }
    for user, options in servers.items():
        status, body = spawn(hub, user, options)
        assert status in (201, 202), body
    for user in servers:
        hub.wait_ready(user)
    pod = {user: the_pod(devcluster, user)["metadata"]["name"] for user in servers}
    exporter.set(pod["alice"], util=90, memory=6144)
    exporter.set(pod["bob"], util=0, memory=2048)
    exporter.set(pod["dave"], util=0, memory=4096)
    hub.wait_stopped("dave", timeout=120)  # the culler's cycle stopped the idle H100 server
    # dave comes back (a CPU server) within 30 min
    status, body = spawn(hub, "dave", {"gpu": "none"})
    assert status in (201, 202), body
    hub.wait_ready("dave")

    page = new_page(browser)
    login(page, hub.url, "admin")
    # a picker on the page lands runs the service's OAuth in the background: let it finish
    # (see test_a_user_who_is_not_an_admin_gets_403)
    page.wait_for_load_state("networkidle")
    response = page.goto(admin_page_url(hub))
    assert response.status == 200, response.text()

    def shows_everything() -> bool:
        page.reload()
        summary = page.locator("#fs-culler-summary")
        return (
            rows(page) == {"alice": "busy", "bob": "idle", "carol": "unknown"}
            and summary.count() == 1
            and "1 of those users came back within 30 min" in " ".join(summary.inner_text().split())
        )

    wait_until(shows_everything, 90, "the page showing holders and the culler's history")
    # the pools, now: two H100 slices and a T4 quarter held; the T4 quarter idle
    h100 = page.locator('section[data-pool="h100"]')
    assert h100.locator('dd[data-field="held"]').inner_text() == "2 slices (3/8 GPU)"
    t4 = page.locator('section[data-pool="t4"]')
    assert t4.locator('dd[data-field="idle"]').inner_text() == "1/4 GPU"
    assert t4.locator('dd[data-field="free"]').inner_text() == "3/4 GPU"
    # the culler's history: dave's server, why, the memory it held
    (stopped,) = page.locator('#fs-culler-history tbody tr[data-user="dave"]').all()
    text = " ".join(stopped.inner_text().split())
    assert "server stopped (1/4)" in text and "4.0 GiB" in text, text
    # why, in the page's words; the culler's log line is the cell's tooltip (issue 38 #3)
    why = stopped.locator("td").nth(5)
    assert why.inner_text() == (
        "its GPU sat idle longer than an idle GPU server may keep it (server_gpu_idle)"
    )
    assert why.get_attribute("title"), "the culler's own line, for the details"
    # the holders: what the culler does next, the link to the hub's admin entry
    (bob,) = page.locator('#fs-holders tr[data-user="bob"]').all()
    assert "stop (gpu idle) in" in bob.inner_text()
    assert bob.locator("a").get_attribute("href").endswith("/hub/admin?name_filter=bob")
    assert "2.0 GiB of 3.8 GiB" in bob.inner_text()
    # the charts: drawn by the vendored uPlot (no network), each with its table
    wait_until(lambda: page.locator(".fs-chart canvas").count() == 3, 30, "three charts")
    assert int(page.locator('.fs-chart[data-pool="h100"]').get_attribute("data-drawn")) >= 1
    page.locator('section[data-pool="h100"] details summary').click()
    assert page.locator('section[data-pool="h100"] .fs-chart-table tbody tr').count() >= 1
    assert "go back to" in page.locator("#fs-history-note").inner_text()
    # sortable: by GPU, descending puts the busy one first
    page.goto(admin_page_url(hub, sort="gpu", order="desc"))
    assert list(rows(page).values()) == ["busy", "idle", "unknown"]
    assert page.locator('th[aria-sort="descending"]').inner_text().startswith("GPU")
    assert page.errors == [] and page.dialogs == []
    if os.environ.get("FRACSPAWNER_UPDATE_SCREENSHOTS") == "1":
        page.goto(admin_page_url(hub))
        page.wait_for_selector(".fs-chart canvas")
        page.screenshot(path=str(SCREENSHOTS / "admin-page.png"), full_page=True)
        page.emulate_media(color_scheme="dark")  # the page follows the browser, as the picker
        page.reload()
        page.wait_for_selector(".fs-chart canvas")
        assert page.evaluate("document.documentElement.dataset.bsTheme") == "dark"
        page.screenshot(path=str(SCREENSHOTS / "admin-page-dark.png"), full_page=True)
    # the hub's navigation, as on the service page; its theme toggle (the hub's darkmode.js)
    # recolours the charts: they are drawn again, the old canvas goes
    nav = page.locator("nav.navbar")
    assert nav.get_by_role("link", name="Admin").get_attribute("href") == "/hub/admin"
    assert nav.locator("#logout").get_attribute("href") == "/hub/logout"
    theme = page.evaluate("document.documentElement.dataset.bsTheme")
    old = page.locator(".fs-chart canvas").first.element_handle()
    nav.get_by_role("button", name="Toggle dark mode").click()
    assert page.evaluate("document.documentElement.dataset.bsTheme") != theme
    wait_until(lambda: not old.evaluate("e => e.isConnected"), 10, "the charts drawn again")
    assert page.locator(".fs-chart canvas").count() == 3
    assert page.errors == []
    page.context.close()


def test_a_user_who_is_not_an_admin_gets_403(hub, browser):
    page = new_page(browser)
    # erin lands on the spawn form, whose picker fetches the service's offers at once and so
    # runs the service's OAuth in the background. Two OAuth flows begun together share one
    # state cookie (jupyterhub/services/auth.py HubOAuth.set_state_cookie picks another name
    # only when the request already carries one) and the later callback is refused 403
    # ("oauth state does not match", HubOAuthCallbackHandler): a race of JupyterHub's, not
    # the admin page's answer. Let the picker's flow finish before opening the page.
    with page.expect_response(
        lambda r: "/services/fracspawner/api/offers" in r.url and r.status == 200
    ):
        login(page, hub.url, "erin")
    response = page.goto(admin_page_url(hub))
    assert response.status == 403
    assert "read:servers" in page.content()
    # a page of the hub, not bare text: its navigation and a way back (issue 27 #9)
    assert page.get_by_role("navigation", name="JupyterHub").is_visible()
    assert page.get_by_role("link", name="Back to your Home page").is_visible()
    assert page.goto(admin_page_url(hub).replace("/admin", "/admin/api")).status == 403
    # the user's own service page still works
    assert page.goto(f"{hub.url}/services/fracspawner/").status == 200
    page.context.close()


def test_every_dashboard_query_runs_on_prometheus_scraping_the_service_and_culler(
    hub, prometheus, culler
):
    def scraped() -> bool:
        up = {r["metric"]["job"]: r["value"][1] for r in prometheus.query("up")}
        return up.get("fracspawner-service") == "1" and up.get("fracspawner-culler") == "1"

    wait_until(scraped, 60, "Prometheus scraping the service and the culler")
    board = json.loads(DASHBOARD.read_text())
    for panel in board["panels"]:
        for target in panel["targets"]:
            status, body = http_json(
                "GET", f"{prometheus.url}/api/v1/query?{urlencode({'query': target['expr']})}"
            )
            assert status == 200 and body["status"] == "success", (panel["title"], body)
    # the per-pool gauges and the culler's series are there, per pool
    held = prometheus.query("fracspawner_pool_gpu_equivalents_held")
    assert {r["metric"]["pool"] for r in held} == {"a100-mig", "h100", "t4"}
    assert prometheus.query("fracspawner_culler_last_cycle_timestamp_seconds")
