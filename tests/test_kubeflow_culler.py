"""`fracspawner culler kubeflow` on the real control plane with Kubeflow's Notebook and Workspace
CRDs (the launcher's upstream YAML), notebook pods the node agent runs as real jupyter-servers,
and Debian's real Prometheus scraping a dcgm-exporter-format endpoint: an idle GPU notebook is
stopped the way Kubeflow stops one (`kubeflow-resource-stopped`; a Workspace's `spec.paused`), a
busy one is kept, and with Prometheus down nothing is stopped."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster.localhub import free_port
from fracspawner.culler.kubeflow import (
    KubeflowCuller,
    Notebook,
    find_notebooks,
    gpu_of,
    parse_time,
    stop_request,
)
from tests.test_culler_support import DcgmExporter

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parent.parent
CRDS = [
    REPO / "tests" / "devcluster_crds" / "notebooks.yaml",
    REPO / "tests" / "kubeflow_crds" / "workspaces.yaml",
]
PROFILE = {"app.kubernetes.io/part-of": "kubeflow-profile"}
TOPOLOGY = {
    "namespaces": [{"name": "alice", "labels": PROFILE}],
    "nodes": [
        {
            "name": "gpu-t4-1",
            "labels": {
                "nvidia.com/gpu.product": "Tesla-T4-SHARED",
                "nvidia.com/gpu.replicas": "4",
                "nvidia.com/gpu.count": "1",
            },
            "capacity": {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": "4"},
        }
    ],
}
CATALOG = {
    "pools": {
        "t4": {
            "gpu": "T4",
            "backend": "timeslicing",
            "replicas": 4,
            "node_selector": {"nvidia.com/gpu.product": "Tesla-T4-SHARED"},
            "offers": ["1/4"],
        }
    },
    "images": {"lab": {"image": "kubeflownotebookswg/jupyter-scipy:v1.10.0"}},
    # GPU notebooks go after 4 s of idleness; without GPU data only the 1 h plain timeout applies
    "idle": {"server_gpu_idle": "4s", "server_idle": "1h"},
}
SLICE = {"fracspawner.io/pool": "t4", "fracspawner.io/gpu": "0.25"}


# --------------------------------------------------------------------------- pure parts
def test_notebooks_and_workspaces_are_found_with_their_pods():
    pods = [
        {"metadata": {"namespace": "a", "name": "nb-0", "labels": {"notebook-name": "nb"}}},
        {"metadata": {"namespace": "a", "name": "other-0", "labels": {"notebook-name": "x"}}},
        {
            "metadata": {
                "namespace": "a",
                "name": "ws-w-8f2k1-0",
                "labels": {"notebooks.kubeflow.org/workspace-name": "w"},
            }
        },
    ]
    found = find_notebooks(
        [
            {"metadata": {"namespace": "a", "name": "nb"}},
            {
                "metadata": {
                    "namespace": "a",
                    "name": "other",
                    "annotations": {"kubeflow-resource-stopped": "2026-01-01T00:00:00Z"},
                }
            },
        ],
        [
            {
                "metadata": {"namespace": "a", "name": "w"},
                "status": {"activity": {"lastActivity": 1700000000}},
            }
        ],
        pods,
    )
    nb, other, ws = found
    assert nb.pod is pods[0] and not nb.stopped
    assert other.pod is None and other.stopped  # other-0 belongs to notebook x
    assert ws.kind == "Workspace" and ws.pod is pods[2] and ws.recorded_activity == 1700000000


def test_what_counts_as_a_gpu_and_how_a_notebook_is_stopped():
    assert gpu_of({"metadata": {"labels": SLICE}}) == ("0.25", "t4")
    limits = {"spec": {"containers": [{"resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}]}}
    assert gpu_of({"metadata": {}, **limits}) == ("gpu", None)
    assert gpu_of({"metadata": {}, "spec": {"containers": [{"name": "cpu"}]}}) == (None, None)
    nb = Notebook("Notebook", "a", "nb", None, False, None)
    (_, version, plural), patch = stop_request(nb, 1767225600)
    assert (version, plural) == ("v1", "notebooks")
    assert patch == {
        "metadata": {"annotations": {"kubeflow-resource-stopped": "2026-01-01T00:00:00Z"}}
    }
    ws = Notebook("Workspace", "a", "w", None, False, None)
    assert stop_request(ws, 0) == (
        ("kubeflow.org", "v1beta1", "workspaces"),
        {"spec": {"paused": True}},
    )
    assert parse_time("2026-01-01T00:00:00.5Z") == 1767225600.5
    assert parse_time(1767225600000) == 1767225600  # epoch milliseconds
    assert parse_time("yesterday") is None and parse_time(0) is None


# --------------------------------------------------------------------------- on a devcluster
# `exporter` (a stand-in dcgm-exporter) and `prometheus` are tests/conftest.py's


def _create(client: Any, path: str, body: dict[str, Any]) -> dict[str, Any]:
    status, answer = client.request("POST", path, body)
    assert status == 201, (path, answer)
    return answer


def notebook_cr(name: str) -> dict[str, Any]:
    """A Notebook as the Jupyter web app writes it (JWA notebook_template.yaml + form.py)."""
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "Notebook",
        "metadata": {
            "name": name,
            "namespace": "alice",
            "labels": {"app": name, "fracspawner-t4-0-25": "true"},
            "annotations": {"notebooks.kubeflow.org/creator": "alice@example.com"},
        },
        "spec": {"template": {"spec": {"containers": [{"name": name, "image": "jupyter-scipy"}]}}},
    }


def notebook_pod(name: str, pod_name: str, labels: dict[str, str], container: str, prefix: str):
    """The pod its controller makes, running a real jupyter-server under the notebook's prefix
    (Kubeflow's images start jupyter with --ServerApp.token='' and base_url $NB_PREFIX)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod_name, "namespace": "alice", "labels": {**labels, **SLICE}},
        "spec": {
            "nodeSelector": {"nvidia.com/gpu.product": "Tesla-T4-SHARED"},
            "containers": [
                {
                    "name": container,
                    "image": "jupyter-scipy",
                    "command": [
                        "jupyter-server",
                        "--ip=0.0.0.0",
                        "--port=8888",
                        "--no-browser",
                        "--allow-root",
                        "--ServerApp.token=",
                        "--ServerApp.password=",
                        f"--ServerApp.base_url={prefix}",
                    ],  # fmt: skip
                    "env": [{"name": "NB_PREFIX", "value": prefix}],
                    "ports": [{"containerPort": 8888, "name": "notebook-port"}],
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ],
        },
    }


@pytest.fixture(scope="module")
def kubeflow(devcluster):
    """Notebooks idle and busy, and a Workspace wsidle, each with its running pod."""
    client = devcluster.client()
    for crd in CRDS:
        status, body = client.request(
            "POST",
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            yaml.safe_load(crd.read_text()),
        )
        # 409 on the real control plane: its launcher installed the upstream CRD already
        assert status in (201, 409), body
    for name in ("idle", "busy"):
        _create(client, "/apis/kubeflow.org/v1/namespaces/alice/notebooks", notebook_cr(name))
        labels = {
            "app": name,
            "statefulset": name,
            "notebook-name": name,
            "fracspawner-t4-0-25": "true",
        }
        _create(
            client,
            "/api/v1/namespaces/alice/pods",
            notebook_pod(name, f"{name}-0", labels, name, f"/notebook/alice/{name}"),
        )
    workspace = {
        "apiVersion": "kubeflow.org/v1beta1",
        "kind": "Workspace",
        "metadata": {"name": "wsidle", "namespace": "alice"},
        "spec": {
            "kind": "jupyterlab",
            "podTemplate": {
                "podMetadata": {"labels": SLICE},
                "volumes": {"home": "wsidle-home"},
                "options": {"imageConfig": "jupyterlab_scipy", "podConfig": "fracspawner-t4-0-25"},
            },
        },
    }
    _create(client, "/apis/kubeflow.org/v1beta1/namespaces/alice/workspaces", workspace)
    # as the workspace controller labels the pod (kubeflow/notebooks workspace_controller.go
    # generateStatefulSet): the Workspace's podMetadata labels, workspace-name, and
    # statefulset = the Workspace's name (not the StatefulSet's generated one)
    labels = {"notebooks.kubeflow.org/workspace-name": "wsidle", "statefulset": "wsidle", **SLICE}
    _create(
        client,
        "/api/v1/namespaces/alice/pods",
        notebook_pod(
            "wsidle", "ws-wsidle-x7k2p-0", labels, "main", "/workspace/connect/alice/wsidle"
        ),
    )
    # the Workspace controller's own probe last saw activity an hour ago; the status it
    # writes whole (every field the upstream CRD requires: kubeflow/notebooks v2.0.0-beta.0
    # kubeflow.org_workspaces.yaml, as kube-apiserver enforces it)
    now = int(time.time())
    status, body = client.request(
        "PATCH",
        "/apis/kubeflow.org/v1beta1/namespaces/alice/workspaces/wsidle/status",
        {
            "status": {
                "activity": {"lastActivity": now - 3600, "lastUpdate": now},
                "lastRunningTime": now - 3600,
                "pauseTime": 0,
                "pendingRestart": False,
                "podTemplateOptions": {
                    "imageConfig": {"desired": "jupyterlab_scipy"},
                    "podConfig": {"desired": "fracspawner-t4-0-25"},
                },
                "podTemplatePod": {"name": "ws-wsidle-x7k2p-0", "nodeName": "gpu-t4-1"},
                "state": "Running",
                "stateMessage": "",
            }
        },
        content_type="application/merge-patch+json",
    )
    assert status == 200, body
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        pods = client.pods("alice")
        ready = [
            p
            for p in pods
            if any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in p.get("status", {}).get("conditions", [])
            )
        ]
        if len(ready) == 3:
            return client
        time.sleep(0.5)
    phases = [(p["metadata"]["name"], p.get("status", {}).get("phase")) for p in pods]
    raise TimeoutError(f"notebook pods not ready: {phases}")


def culler(devcluster, tmp_path: Path, prometheus_url: str) -> KubeflowCuller:
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(yaml.safe_dump(CATALOG))
    app = KubeflowCuller()
    app.initialize(
        [
            f"--kubeconfig={devcluster.kubeconfig}",
            f"--catalog={catalog}",
            f"--prometheus-url={prometheus_url}",
            "--status-url=http://{pod_ip}:8888/notebook/{namespace}/{name}/api/status",
            "--workspace-status-url=http://{pod_ip}:8888/workspace/connect/{namespace}/{name}/api/status",
            "--KubeflowCuller.pod_label=exported_pod",
            "--KubeflowCuller.namespace_label=exported_namespace",
            "--KubeflowCuller.max_sample_gap=5",
            "--KubeflowCuller.coverage_step=1",
        ]
    )
    return app


def annotations(client: Any, name: str) -> dict[str, str]:
    nb = client.get(f"/apis/kubeflow.org/v1/namespaces/alice/notebooks/{name}")
    return nb["metadata"].get("annotations") or {}


def paused(client: Any) -> bool:
    ws = client.get("/apis/kubeflow.org/v1beta1/namespaces/alice/workspaces/wsidle")
    return bool(ws["spec"].get("paused"))


def set_gpus(exporter: DcgmExporter) -> None:
    exporter.set("idle-0", util=0, memory=3000, namespace="alice")
    exporter.set("busy-0", util=85, memory=9000, namespace="alice")
    exporter.set("ws-wsidle-x7k2p-0", util=0, memory=2000, namespace="alice")


def test_with_prometheus_down_nothing_is_stopped(
    devcluster, kubeflow, exporter, prometheus, tmp_path
):
    set_gpus(exporter)
    prometheus.wait_scraped(8)  # the GPU data would say idle: the culler must not get it
    app = culler(devcluster, tmp_path, f"http://127.0.0.1:{free_port()}")
    outcomes = asyncio.run(app.cull_once())
    assert sorted(o.notebook.name for o in outcomes) == ["busy", "idle", "wsidle"]
    assert not any(o.decision.cull for o in outcomes)
    assert all(o.decision.gpu_failsafe for o in outcomes)
    assert "kubeflow-resource-stopped" not in annotations(kubeflow, "idle")
    assert not paused(kubeflow)


def test_an_idle_gpu_notebook_is_stopped_and_a_busy_one_kept(
    devcluster, kubeflow, exporter, prometheus, tmp_path
):
    set_gpus(exporter)
    app = culler(devcluster, tmp_path, prometheus.url)
    deadline = time.monotonic() + 90
    seen: list[str] = []
    while time.monotonic() < deadline:
        outcomes = {o.notebook.name: o for o in asyncio.run(app.cull_once())}
        seen.append(", ".join(f"{n}: {o.decision.reason}" for n, o in sorted(outcomes.items())))
        if "kubeflow-resource-stopped" in annotations(kubeflow, "idle") and paused(kubeflow):
            break
        time.sleep(1)
    else:
        raise AssertionError(f"idle notebooks not stopped; decisions: {seen[-3:]}")
    stopped = annotations(kubeflow, "idle")["kubeflow-resource-stopped"]
    assert abs(parse_time(stopped) - time.time()) < 120  # an RFC 3339 time, as Kubeflow writes
    assert "kubeflow-resource-stopped" not in annotations(kubeflow, "busy")
    # every cycle kept the busy notebook: for its recent activity (run first in its module,
    # the notebooks are minutes old), then for its GPU work
    assert all(re.search(r"\bbusy: (active|gpu_busy)\b", line) for line in seen), seen
    assert "busy: gpu_busy" in seen[-1], seen
    # the next cycle leaves stopped notebooks alone
    assert {o.notebook.name for o in asyncio.run(app.cull_once())} == {"busy"}


# --------------------------------------------------------------------------- the status probe
class _Status:
    """A tenant's jupyter-server answering /api/status as it likes (issue 19 item 13)."""

    def __init__(self) -> None:
        from tornado import web

        self.fresh_asked = 0
        outer = self

        class Status(web.RequestHandler):
            def get(self, how: str, what: str) -> None:
                if what == "kernels":
                    self.write(json.dumps([{"id": "k", "execution_state": "idle"}]))
                    return
                if how == "future":
                    self.write({"last_activity": "2100-01-01T00:00:00Z", "kernels": 1})
                elif how == "redirect":
                    self.redirect("/fresh/api/status", status=302)
                elif how == "big":
                    pad = "x" * 2_000_000
                    self.write({"last_activity": "2020-01-01T00:00:00Z", "pad": pad})
                elif how == "fresh":
                    outer.fresh_asked += 1
                    self.write({"last_activity": "2100-01-01T00:00:00Z"})
                else:
                    self.write({"last_activity": "2020-01-01T00:00:00Z"})

        self.app = web.Application([(r"/(\w+)/api/(status|kernels)", Status)])


def _nb(name: str, recorded: float | None = None) -> Notebook:
    pod = {
        "metadata": {"name": f"{name}-0", "namespace": "alice", "labels": {"notebook-name": name}},
        "status": {"phase": "Running", "podIP": "127.0.0.1", "startTime": "2020-01-01T00:00:00Z"},
    }
    return Notebook("Notebook", "alice", name, pod, False, recorded)


def test_the_status_probe_follows_no_redirect_reads_a_bounded_body_and_clamps(tmp_path):
    """jupyter-server is the tenant's: the culler's GET /api/status must not be sent elsewhere
    by a redirect, must not read 100 MB, and a last_activity in the future must not keep the
    notebook out of server_unattended/server_idle; the hub culler clamps a server's reported
    times at their arrival (fracspawner/culler/reports.py `_ts`), and so does this one."""
    from tornado.httpclient import AsyncHTTPClient

    from fracspawner.culler.kubeflow import STATUS_MAX_BYTES

    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(yaml.safe_dump({**CATALOG, "idle": {"server_idle": "1h"}}))
    server = _Status()

    async def run() -> dict[str, float | None]:
        sockets = server.app.listen(0, "127.0.0.1")
        port = next(iter(sockets._sockets.values())).getsockname()[1]
        app = KubeflowCuller()
        app.initialize(
            [f"--catalog={catalog}", f"--status-url=http://127.0.0.1:{port}/{{name}}/api/status"]
        )
        http = AsyncHTTPClient(force_instance=True, max_body_size=STATUS_MAX_BYTES)
        try:
            got = {}
            for how in ("plain", "future", "redirect", "big"):
                probed = await app.probe(http, _nb(how))
                got[how] = None if probed is None else probed.last_activity
            return got
        finally:
            http.close()
            sockets.stop()

    before = time.time()
    got = asyncio.run(run())
    assert got["plain"] == parse_time("2020-01-01T00:00:00Z")
    assert got["redirect"] is None and server.fresh_asked == 0  # not followed: unknown
    assert got["big"] is None  # cut off at STATUS_MAX_BYTES: unknown
    assert got["future"] is not None and before <= got["future"] <= time.time()

    # what Kubeflow recorded on the Notebook (an annotation its members may edit) likewise
    app = KubeflowCuller()
    app.initialize([f"--catalog={catalog}", "--status-url="])
    now = time.time()
    ahead = app.judge(_nb("nb", recorded=parse_time("2100-01-01T00:00:00Z")), None, {}, now)
    honest = app.judge(_nb("nb", recorded=now), None, {}, now)
    assert ahead.decision == honest.decision


def test_a_list_answered_429_is_asked_again_when_the_apiserver_says():
    """The apiserver answers 429 "storage is (re)initializing" to the first list of a kind
    whose watch cache is not ready (a CRD's objects, first asked; seen on the real control
    plane for Workspaces: tests/test_rbac_real.py): the culler waits as told and asks again,
    as client-go does, instead of failing the cycle."""
    import json

    from fracspawner.culler.kubeflow import KubeflowCuller, retry_after

    status = {"kind": "Status", "code": 429, "message": "storage is (re)initializing",
              "details": {"retryAfterSeconds": 1}}  # fmt: skip
    assert retry_after("2", b"") == 2.0
    assert retry_after(None, json.dumps(status).encode()) == 1.0
    assert retry_after("soon", b"not json") == 1.0
    assert retry_after("3600", b"") == 10.0  # bounded

    class Answer:
        def __init__(self, code: int, body: dict) -> None:
            self.status, self.headers, self._body = code, {"Retry-After": "0"}, body

        async def read(self) -> bytes:
            return json.dumps(self._body).encode()

    class Api:
        def __init__(self) -> None:
            self.answers = [Answer(429, status), Answer(429, status),
                            Answer(200, {"items": [{"metadata": {"name": "ws"}}]})]  # fmt: skip

        async def call_api(self, path: str, method: str, **_: Any) -> Any:
            return self.answers.pop(0)

    culler = KubeflowCuller()
    api = Api()
    culler._api = api
    items = asyncio.run(culler._list("/apis/kubeflow.org/v1beta1/workspaces", optional=True))
    assert items == [{"metadata": {"name": "ws"}}] and api.answers == []


# --------------------------------------------------------------------------- unreadable namespace
def _forbidden_status(resource: str, group: str, namespace: str) -> dict[str, Any]:
    """The RBAC authoriser's 403 Status, as kube-apiserver words it."""
    user = "system:serviceaccount:kubeflow:fracspawner-kubeflow-culler"
    in_group = f' in API group "{group}"' if group else ' in API group ""'
    return {
        "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden",
        "code": 403,
        "message": f'{resource}{"." + group if group else ""} is forbidden: User "{user}" '
                   f'cannot list resource "{resource}"{in_group} in the namespace "{namespace}"',
    }  # fmt: skip


class _Namespaces:
    """An API server for the culler's lists and patches: namespaces alpha and beta, each with
    Notebook `idle` (activity recorded two hours ago) and its running GPU pod; `refused` says
    which namespace answers which lists 403 (all four lists, or only the pods')."""

    def __init__(self) -> None:
        self.refused: dict[str, str] = {}  # namespace -> "all" | "pods"
        self.patched: list[str] = []

    @staticmethod
    def _notebook(ns: str) -> dict[str, Any]:
        then = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 7200))
        annotations = {"notebooks.kubeflow.org/last-activity": then}
        meta = {"name": "idle", "namespace": ns, "resourceVersion": "7"}
        return {"metadata": {**meta, "annotations": annotations}}

    @staticmethod
    def _pod(ns: str) -> dict[str, Any]:
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 3 * 3600))
        return {
            "metadata": {"name": "idle-0", "namespace": ns,
                         "labels": {"notebook-name": "idle", **SLICE}},
            "status": {"phase": "Running", "startTime": started,
                       "conditions": [{"type": "Ready", "status": "True"}]},
        }  # fmt: skip

    async def call_api(self, path: str, method: str, **kw: Any) -> Any:
        ns = path.split("/namespaces/")[1].split("/")[0]
        if method == "PATCH":
            self.patched.append(path)
            return _Answer(200, {})
        resource = path.rsplit("/", 1)[1]
        refused = self.refused.get(ns)
        if refused == "all" or (refused == "pods" and resource == "pods"):
            group = "" if resource == "pods" else "kubeflow.org"
            return _Answer(403, _forbidden_status(resource, group, ns))
        if resource == "notebooks":
            return _Answer(200, {"items": [self._notebook(ns)]})
        selector = dict(kw.get("query_params") or []).get("labelSelector")
        if resource == "pods" and selector == "notebook-name":
            return _Answer(200, {"items": [self._pod(ns)]})
        return _Answer(200, {"items": []})

    async def close(self) -> None:
        pass


class _Answer:
    def __init__(self, code: int, body: dict[str, Any]) -> None:
        self.status, self.headers, self._body = code, {}, body

    async def read(self) -> bytes:
        return json.dumps(self._body).encode()


def test_a_namespace_the_culler_may_not_read_is_skipped_and_the_others_culled(tmp_path):
    """The admin lists two namespaces for the culler and the RoleBinding of one is missing
    (or the namespace was deleted, its binding with it): its lists answer 403. The idle
    notebook of the namespace it can read is stopped all the same; the other namespace's
    notebooks are kept, not judged, also when only its pods' list is refused (no notebook is
    judged without its pod); the log says which namespace and why once, not every cycle, and
    once more when it can be read again; fracspawner_culler_namespace_unreadable says it."""
    import logging

    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(yaml.safe_dump({**CATALOG, "idle": {"server_idle": "1h"}}))
    app = KubeflowCuller()
    app.initialize([f"--catalog={catalog}", "--status-url=",
                    "--namespace=alpha", "--namespace=beta"])  # fmt: skip
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append  # type: ignore[method-assign]
    app.log.addHandler(handler)
    api = _Namespaces()

    def gauge(name: str, labels: dict[str, str] | None = None) -> float | None:
        return app.metrics.registry.get_sample_value(name, labels)

    def unreadable(ns: str) -> float | None:
        return gauge("fracspawner_culler_namespace_unreadable", {"kubeflow_namespace": ns})

    def cycle() -> dict[str, str]:
        app._api = api  # the cycle closes its client
        api.patched.clear()
        outcomes = asyncio.run(app.cull_once())
        return {o.notebook.log_name: o.decision.reason for o in outcomes if o.done}

    def warnings() -> list[str]:
        return [r.getMessage() for r in records if r.levelno >= logging.WARNING]

    try:
        api.refused["beta"] = "all"
        assert cycle() == {"Notebook alpha/idle": "idle"}
        assert [p.split("/namespaces/")[1] for p in api.patched] == ["alpha/notebooks/idle"]
        (line,) = warnings()
        assert line.startswith("namespace beta cannot be read"), line
        assert "ServiceAccount fracspawner-kubeflow-culler may not list notebooks.kubeflow.org" \
               " in namespace beta" in line, line  # fmt: skip
        assert "the chart's kubeflow-culler ClusterRole grants list" in line, line
        assert "its notebooks are kept" in line, line
        assert unreadable("beta") == 1 and unreadable("alpha") == 0
        assert app.unreadable == {"beta": "403"}

        # the next cycles: the same refusal is not said again; beta's Notebook list allowed but
        # not its pods' (a Role fixed by half) still leaves all of beta unjudged
        assert cycle() == {"Notebook alpha/idle": "idle"}
        api.refused["beta"] = "pods"
        assert cycle() == {"Notebook alpha/idle": "idle"}
        assert all("beta" not in p for p in api.patched), api.patched
        assert len(warnings()) == 1, warnings()

        # beta readable again: said once, and its idle notebook stopped
        del api.refused["beta"]
        assert cycle() == {"Notebook alpha/idle": "idle", "Notebook beta/idle": "idle"}
        again = [r.getMessage() for r in records if "can be read again" in r.getMessage()]
        assert again == ["namespace beta can be read again: its notebooks are judged again"]
        assert unreadable("beta") == 0
        assert app.unreadable == {}

        # no namespace readable: the cycle failed, as it fails when every namespace is listed
        # and that list is refused; the cycle's timestamp is not set
        api.refused.update(alpha="all", beta="all")
        last = gauge("fracspawner_culler_last_cycle_timestamp_seconds")
        app._api = api
        with pytest.raises(RuntimeError, match="no namespace of the culler's could be read"):
            asyncio.run(app.cull_once())
        assert gauge("fracspawner_culler_last_cycle_timestamp_seconds") == last
    finally:
        app.log.removeHandler(handler)

    everywhere = KubeflowCuller()
    everywhere.initialize([f"--catalog={catalog}", "--status-url="])
    everywhere._api = _Everywhere()
    with pytest.raises(RuntimeError, match="may not list notebooks.kubeflow.org in any namespace"):
        asyncio.run(everywhere.cull_once())


class _Everywhere(_Namespaces):
    """Every namespace's lists, refused at the cluster scope."""

    async def call_api(self, path: str, method: str, **kw: Any) -> Any:
        resource = path.rsplit("/", 1)[1]
        group = "" if resource == "pods" else "kubeflow.org"
        status = _forbidden_status(resource, group, "")
        cluster = " at the cluster scope"  # the authoriser's words for a list of every namespace
        status["message"] = status["message"].replace(' in the namespace ""', cluster)
        return _Answer(403, status)
