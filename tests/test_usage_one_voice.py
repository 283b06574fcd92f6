"""`fracspawner usage` says what `capacity`, the admin page and the picker say (issue 38 #3):
DRA pools counted from their ResourceSlices and claims, not "FREE GPU unknown" and "?/?"; a
server's slice in the picker's words ("1/8", not "0.125") and its memory in GiB as the page
says it ("3.8 GiB", not "3840")."""

from __future__ import annotations

import re

import pytest

from fracspawner.backends import load_catalog
from fracspawner.cli import usage
from fracspawner.cli.usage import render_table, usage_of
from tests.conftest import DEMO_CATALOG
from tests.test_admin import gpu_pod, t4_node
from tests.test_dra_capacity import claim, memory_slice, node

DRA_POOL = {
    "gpu": "H100-80GB",
    "backend": "dra",
    "options": {"sharing": "memory"},
    "offers": ["1/8", "10GiB", "20GiB"],
}


@pytest.fixture(scope="module")
def catalog():
    import yaml

    data = yaml.safe_load(DEMO_CATALOG.read_text())
    data["pools"]["h100-dra"] = DRA_POOL
    return load_catalog(data)


def cluster() -> tuple[list, list, list, list]:
    nodes = [t4_node(), node("dra-1")]
    pods = [gpu_pod("jupyter-alice", "alice")]
    return nodes, pods, [memory_slice("dra-1")], [claim("c0", "dra-1", "gpu-0", "10Gi")]


def test_dra_pools_are_counted_from_their_slices_and_claims(catalog):
    nodes, pods, slices, claims = cluster()
    pools, holders = usage_of(catalog, nodes, pods, slices, claims)
    dra = {p.name: p for p in pools}["h100-dra"]
    assert [(o.spec, o.free, o.total) for o in dra.offers] == [
        ("1/8", 6, 8),  # 81,559 - 10,240 MiB left: six 10,194 MiB eighths
        ("10GiB", 6, 7),
        ("20GiB", 3, 3),
    ]
    assert dra.free_gpu is not None
    line = next(x for x in render_table(pools, holders).splitlines() if x.startswith("h100-dra"))
    assert "unknown" not in line and "?" not in line, line


def test_a_servers_slice_and_memory_are_in_the_pages_words(catalog):
    nodes, pods, slices, claims = cluster()
    table = render_table(*usage_of(catalog, nodes, pods, slices, claims))
    assert re.search(r"^USER\s+SERVER\s+POOL\s+SLICE\s+GPU\s+MEMORY\s+NODE\s+SINCE$", table, re.M)
    assert re.search(
        r"^alice\s+\(default\)\s+t4\s+1/4\s+1/4\s+3\.8 GiB\s+gpu-t4-1\s", table, re.M
    ), table
    assert "0.25" not in table and "3840" not in table, table


def test_the_usage_command_reads_the_dra_objects_too(catalog, monkeypatch, capsys):
    nodes, pods, slices, claims = cluster()
    monkeypatch.setattr(usage, "read_cluster", lambda prog, args: (catalog, nodes, pods))

    async def list_dra(kubeconfig):
        return slices, claims

    from fracspawner.cli import capacity as capacity_cli

    monkeypatch.setattr(capacity_cli, "list_dra", list_dra)
    assert usage.main(["--catalog", str(DEMO_CATALOG)]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("h100-dra"))
    assert "10 GiB 6/7" in line and "unknown" not in line, out


@pytest.mark.parametrize(
    ("reason", "said"),
    [
        ("present", "nothing due: its user is at a JupyterLab tab of it"),
        ("in_session", "nothing due: its user is in session (a hidden tab of it, seen lately)"),
        ("gpu_busy", "nothing due"),
    ],
)
def test_the_admin_page_says_why_nothing_is_due(catalog, reason, said):
    """'Culler next: nothing due' for a server kept because its user is present said nothing
    of why (issue 38 #3)."""
    from fracspawner.hub.admin import holder_rows, row_texts

    _, holders = usage_of(catalog, [t4_node()], [gpu_pod("jupyter-alice", "alice")])
    culler = {
        "servers": [
            {
                "user": "alice",
                "server": "",
                "gpu": {"state": "idle", "memory_mib": 1024.0},
                "next": None,
                "decision": {"action": "keep", "reason": reason},
            }
        ]
    }
    (row,) = holder_rows(holders, culler, now=1795600800.0)
    assert row_texts(row, now=1795600800.0)["next_text"] == said


def test_the_admin_page_says_the_demos_gpu_is_simulated(catalog):
    """The README said the admin page names the demo's GPU simulated; it never did (issue 38
    #3). A server's report says where its readings come from; the culler keeps it and the
    page's GPU column says '(simulated GPU)'."""
    from fracspawner.culler.reports import parse_report
    from fracspawner.hub.admin import holder_rows, row_texts
    from tests.test_culler_reports import T, report

    simulated = parse_report(report(source="simulated"), received_at=T)
    real = parse_report(report(source="nvml"), received_at=T)
    assert getattr(simulated, "simulated", None) is True and real.simulated is False
    culler_row = {
        "user": "alice",
        "server": "",
        "gpu": {"state": "idle", "memory_mib": 1536.0, "since": T - 60, "simulated": True},
        "next": None,
        "decision": {"action": "keep", "reason": "gpu_busy"},
    }
    _, holders = usage_of(catalog, [t4_node()], [gpu_pod("jupyter-alice", "alice")])
    (row,) = holder_rows(holders, {"servers": [culler_row]}, now=T)
    assert row_texts(row, now=T)["gpu_text"] == "idle for 60 s (simulated GPU)"


def test_the_cullers_row_carries_the_reports_word(catalog):
    from fracspawner.culler.decide import Decision, GpuFacts, Reading, ServerFacts
    from fracspawner.culler.state import server_row
    from fracspawner.model.catalog import DEFAULT_IDLE
    from tests.test_culler_reports import T

    facts = ServerFacts(user="alice", name="", started=T - 3600, last_activity=T - 60)
    gpu = GpuFacts("extension", T, 1536.0, 60.0, 3600.0)
    row = server_row(
        facts, Reading(gpu=gpu), Decision("keep", "gpu_busy", ""), DEFAULT_IDLE, "h100", T,
        0.0, True,
    )  # fmt: skip
    assert row["gpu"]["simulated"] is True


def test_the_admin_pages_why_is_in_its_own_words(catalog):
    """The culler's history said why with the culler's log line ('holds a GPU (1/8, 0 MiB) and
    idle for 0:10:52 >= server_gpu_idle 0:10:00; ...'): the page says it in words, the line is
    the cell's tooltip (issue 38 #3)."""
    import html
    import re
    import time

    from fracspawner.hub.admin import render_admin_page
    from tests.test_admin import culler_state, model_for

    now = time.time()
    state = culler_state(now)
    line = "holds a GPU (1/4, 2048 MiB) and idle for 0:10:52 >= server_gpu_idle 0:10:00"
    state["history"][0]["message"] = line
    page = render_admin_page(
        model_for(catalog, ["alice"], state, now),
        user="admin",
        hub_prefix="/hub/",
        static_prefix="/static/",
    )
    row = re.search(r'<tr data-user="dave".*?</tr>', page, re.S).group(0)
    cells = re.findall(r"<td([^>]*)>(.*?)</td>", row, re.S)
    attributes, why = cells[5]
    assert why == "its GPU sat idle longer than an idle GPU server may keep it (server_gpu_idle)"
    assert html.unescape(attributes) == f' title="{line}"'


def test_hibernations_are_in_the_cullers_last_24_hours(catalog):
    """The admin page's 'The culler's last 24 hours' listed stops and kernel shutdowns but not
    the hibernations the servers report (issue 38 #3): each is a row, counted in the summary
    apart from the servers stopped, and said in words."""
    import re
    import time

    from fracspawner.culler import Culler
    from fracspawner.culler.decide import ServerFacts
    from fracspawner.culler.identity import Identity
    from fracspawner.culler.reports import parse_report
    from fracspawner.hub.admin import render_admin_page
    from tests.test_admin import model_for
    from tests.test_culler_reports import iso, report

    now = time.time()
    c = Culler(api_token="x", report_url="http://127.0.0.1:1", catalog=str(DEMO_CATALOG))
    c.initialize([])
    c.known[("ann", "")] = ServerFacts("ann", "", user_options={"gpu": "1/4", "pool": "h100"})
    hib = {
        "hibernated_gpu_memory_mib": 4096,
        "hibernations": [
            {"kernel_id": "k1", "at": iso(now - 60), "gpu_memory_mib": 4096, "seconds": 0.2}
        ],
    }
    body = report(sampled_at=iso(now - 5), hibernated_gpu_memory_mib=4096, hibernation=hib)
    for _ in range(2):  # told twice: one row
        c.on_report(Identity("ann", ""), c.reports.put("ann", "", parse_report(body, now)))
    state = c.state.to_json(now)
    rows = [e for e in state["history"] if e["user"] == "ann"]
    assert [(e["kind"], e["reason"]) for e in rows] == [("hibernate", "kernel_gpu_hibernate")]
    summary = state["summary"]
    assert (summary["servers_stopped"], summary["kernels_hibernated"]) == (0, 1), summary
    page = render_admin_page(
        model_for(catalog, ["ann"], state, now),
        user="admin",
        hub_prefix="/hub/",
        static_prefix="/static/",
    )
    history = page[page.index('id="fs-culler-history"') :]
    row = re.search(r'<tr data-user="ann".*?</tr>', history, re.S).group(0)
    text = " ".join(re.sub(r"<[^>]+>", " ", row).split())
    assert "kernel hibernated" in text and "4.0 GiB" in text, text
    assert "its GPU memory went to host memory until its next cell" in text, text
    summary_text = re.search(r'id="fs-culler-summary">(.*?)</p>', page, re.S).group(1)
    assert "1 kernel hibernated" in " ".join(summary_text.split()), summary_text
