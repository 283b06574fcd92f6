"""Review 56 of `fracspawner culler kubeflow` (fracspawner/culler/kubeflow.py): what it did
wrong against Kubeflow's own culling and the project's rules (unknown is never idle)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any

import yaml

from fracspawner.culler.decide import GpuFacts
from fracspawner.culler.kubeflow import KubeflowCuller, Outcome, find_notebooks, stop_request
from tests.test_kubeflow_culler import CATALOG as KF_CATALOG
from tests.test_kubeflow_culler import SLICE

# tests/test_kubeflow_culler.py's T4 pool and image, with an hour of GPU idleness
CATALOG = {**KF_CATALOG, "idle": {"server_gpu_idle": "1h", "server_idle": "8h"}}


def _culler(tmp_path: Path, *args: str) -> KubeflowCuller:
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(yaml.safe_dump(CATALOG))
    app = KubeflowCuller()
    app.initialize([f"--catalog={catalog}", "--prometheus-url=http://prometheus", *args])
    return app


def _pod(name: str, labels: dict[str, str], started: float) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "alice", "name": name, "labels": {**labels, **SLICE}},
        "status": {
            "phase": "Running",
            "podIP": "10.0.0.7",
            "startTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def _gpu_idle(now: float, pod: str) -> dict[tuple[str, str], GpuFacts]:
    """Prometheus: the pod's GPU idle for 3 h, fully covered."""
    return {("alice", pod): GpuFacts("prometheus", now, 2000.0, 3 * 3600.0, 3 * 3600.0)}


# --------------------------------------------------------------------------- finding 1
class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_the_stop_patch_cannot_stop_a_notebook_changed_since_it_was_read(tmp_path):
    """A cycle reads the notebooks, asks each server and Prometheus, then patches. A user who
    stops and starts the notebook meanwhile (or a second culler replica that stopped it and
    its user who started it again) gets a notebook whose stop annotation is absent again: a
    merge patch without a precondition stopped that fresh run on what was read of the old
    one. The patch now carries the resourceVersion it was judged at, which the API server
    takes as a precondition (409 Conflict when the object changed)."""
    nb_obj = {"metadata": {"namespace": "alice", "name": "nb", "resourceVersion": "4711"}}
    ws_obj = {"metadata": {"namespace": "alice", "name": "w", "resourceVersion": "4712"}}
    nb, ws = find_notebooks([nb_obj], [ws_obj], [])
    _, patch = stop_request(nb, 1767225600)
    assert patch == {
        "metadata": {
            "resourceVersion": "4711",
            "annotations": {"kubeflow-resource-stopped": "2026-01-01T00:00:00Z"},
        }
    }
    _, patch = stop_request(ws, 0)
    assert patch == {"metadata": {"resourceVersion": "4712"}, "spec": {"paused": True}}

    class Api:
        sent: list[dict[str, Any]] = []

        async def call_api(self, path: str, method: str, body: Any = None, **_: Any) -> Any:
            Api.sent.append(body)

            class Answer:
                status = 409

                async def read(self) -> bytes:
                    return json.dumps({"kind": "Status", "reason": "Conflict"}).encode()

            return Answer()

    app = _culler(tmp_path)
    app._api = Api()
    from fracspawner.culler.decide import Decision

    outcome = Outcome(nb, Decision("stop", "gpu_idle", "idle"), "t4")
    records = _Records()
    app.log.addHandler(records)
    app.log.setLevel(logging.INFO)
    asyncio.run(app.act(outcome, 1767225600))
    assert Api.sent[0]["metadata"]["resourceVersion"] == "4711"
    assert not outcome.done
    assert any("changed since it was read" in r.getMessage() for r in records.records)
    assert not [r for r in records.records if r.levelno >= logging.ERROR]


# --------------------------------------------------------------------------- finding 2
def test_a_notebook_whose_server_did_not_answer_is_kept_whatever_the_annotation_says(tmp_path):
    """Kubeflow's culler writes `notebooks.kubeflow.org/last-activity` only from a successful
    GET /api/kernels that lists kernels: now at creation, then the newest kernel activity; a
    failed probe or no kernel leaves it as it was (kubeflow/notebooks notebook-controller
    culling_controller.go updateNotebookLastActivityAnnotation), so it may be hours old while
    the user works in a terminal or the file browser. When the culler's own GET /api/status
    failed (a server too busy to answer in time, a mesh refusing the culler), that annotation
    alone decided, and an idle GPU stopped the notebook: activity that cannot be read was taken
    as idle. docs/kubeflow.md says a notebook whose activity cannot be learnt is kept."""
    now = time.time()
    app = _culler(tmp_path)  # the default status_url: the server is asked
    annotation = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - 3 * 3600))
    nb_obj = {
        "metadata": {
            "namespace": "alice",
            "name": "nb",
            "annotations": {"notebooks.kubeflow.org/last-activity": annotation},
        }
    }
    pod = _pod("nb-0", {"notebook-name": "nb"}, now - 5 * 3600)
    (nb,) = find_notebooks([nb_obj], [], [pod])
    outcome = app.judge(nb, None, _gpu_idle(now, "nb-0"), now)  # its /api/status: no answer
    assert not outcome.decision.cull, outcome.decision
    assert outcome.decision.reason == "activity_unknown"
    # its server answered: the newest of the two decides, as before
    outcome = app.judge(nb, now - 2 * 3600, _gpu_idle(now, "nb-0"), now)
    assert outcome.decision.cull and outcome.decision.reason == "gpu_idle", outcome.decision
    # where the admin asks no server (status_url ''), Kubeflow's own record is what there is
    bare = _culler(tmp_path, "--status-url=")
    assert bare.judge(nb, None, _gpu_idle(now, "nb-0"), now).decision.reason == "gpu_idle"


# --------------------------------------------------------------------------- finding 3
def test_a_workspaces_recorded_activity_counts_as_idle_only_until_its_probe(tmp_path):
    """The Workspace controller writes status.activity.lastActivity from its activity probe,
    which runs every probeIntervalSeconds (3600 by default) and on failure leaves it as it was
    (lastUpdate, the probe's end, not advanced either); it pauses only right after a fresh
    successful probe, "otherwise a Workspace could be paused based on a stale lastActivity even
    though the user resumed activity since the last probe" (kubeflow/notebooks notebooks-v2
    workspaces/controller/internal/controller/workspace_activity.go, evaluatePauseDecision).
    Without its own probe (workspace_status_url '', the default) the culler took lastActivity
    as if it were current: a user back at the Workspace since the last probe, with the GPU idle,
    was paused. Now the idle time it proves ends at lastUpdate; without lastUpdate it proves
    none."""
    now = time.time()
    app = _culler(tmp_path)  # workspace_status_url '': the Workspace's own record only
    pod = _pod("ws-w-x7k2p-0", {"notebooks.kubeflow.org/workspace-name": "w"}, now - 5 * 3600)

    def workspace(activity: dict[str, Any]) -> Any:
        obj = {"metadata": {"namespace": "alice", "name": "w"}, "status": {"activity": activity}}
        (ws,) = find_notebooks([], [obj], [pod])
        return ws

    ms = lambda t: int(t * 1000)  # noqa: E731  the controller writes epoch milliseconds
    # active 3 h ago as its probe saw 10 min later; no successful probe since (failing, or
    # not due): 10 min of idleness is known, not 3 h
    stale = workspace({"lastActivity": ms(now - 3 * 3600), "lastUpdate": ms(now - 170 * 60)})
    outcome = app.judge(stale, None, _gpu_idle(now, "ws-w-x7k2p-0"), now)
    assert not outcome.decision.cull, outcome.decision
    # a probe a minute ago still saw it idle since then: paused, as the controller would
    fresh = workspace({"lastActivity": ms(now - 3 * 3600), "lastUpdate": ms(now - 60)})
    outcome = app.judge(fresh, None, _gpu_idle(now, "ws-w-x7k2p-0"), now)
    assert outcome.decision.cull and outcome.decision.reason == "gpu_idle", outcome.decision
    # no lastUpdate: nothing says when that activity was read
    bare = workspace({"lastActivity": ms(now - 3 * 3600)})
    outcome = app.judge(bare, None, _gpu_idle(now, "ws-w-x7k2p-0"), now)
    assert not outcome.decision.cull, outcome.decision
    # the culler's own probe of the Workspace answered: that is current, as before
    asked = _culler(tmp_path, "--workspace-status-url=http://{pod_ip}/api/status")
    outcome = asked.judge(stale, now - 2 * 3600, _gpu_idle(now, "ws-w-x7k2p-0"), now)
    assert outcome.decision.cull and outcome.decision.reason == "gpu_idle", outcome.decision


# --------------------------------------------------------------------------- a running kernel
class _Jupyter:
    """Notebook servers as jupyter-server answers: `/api/status` (last_activity) and
    `/api/kernels` (each kernel's execution_state), per notebook name."""

    def __init__(self, last_activity: dict[str, float], kernels: dict[str, Any]) -> None:
        from tornado import web

        self.asked: list[str] = []
        outer = self

        class Server(web.RequestHandler):
            def get(self, name: str, what: str) -> None:
                outer.asked.append(self.request.uri or "")
                if what == "status":
                    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(last_activity[name]))
                    self.write({"last_activity": stamp, "kernels": 1})
                elif kernels[name] is None:
                    self.set_status(503)  # its kernels could not be read
                else:
                    self.set_header("Content-Type", "application/json")
                    self.write(json.dumps(kernels[name]))

        self.app = web.Application([(r"/notebook/alice/([\w-]+)/api/(status|kernels)", Server)])


class _Cluster:
    """The API server, as the culler calls it: its Notebooks and their pods; PATCHes kept."""

    def __init__(self, notebooks: list[dict[str, Any]], pods: list[dict[str, Any]]) -> None:
        self.notebooks, self.pods, self.patched = notebooks, pods, []

    async def call_api(self, path: str, method: str, **kwargs: Any) -> Any:
        selector = dict(kwargs.get("query_params") or []).get("labelSelector", "")
        code, body = 200, {"items": []}
        if method == "PATCH":
            self.patched.append(path.rsplit("/", 1)[1])
            body = {}
        elif path.endswith("/notebooks"):
            body = {"items": self.notebooks}
        elif path.endswith("/workspaces"):
            code = 404  # Notebooks 2.0 not installed
        elif path.endswith("/pods") and selector == "notebook-name":
            body = {"items": self.pods}

        class Answer:
            status = code

            async def read(self) -> bytes:
                return json.dumps(body).encode()

        return Answer()

    async def close(self) -> None:
        pass


def test_a_running_kernel_keeps_a_notebook_whose_status_is_old(tmp_path):
    """Kubeflow's culler reads /api/kernels and takes any kernel whose execution_state is not
    "idle" as activity now (kubeflow/kubeflow components/notebook-controller/controllers/
    culling_controller.go: allKernelsAreIdle, updateTimestampFromKernelsActivity). This one read
    /api/status alone, whose last_activity a long silent cell does not move: a GPU notebook
    running a CPU-bound cell for 3 h (GPU idle) was stopped and its computation lost. Now its
    kernels are read beside its status (not counted as activity by the server:
    no_track_activity), a running kernel keeps it, and kernels that cannot be read keep it like
    a server that did not answer. It is not user activity: server_unattended (1 d by default)
    still stops a notebook nobody has used for that long, as a busy GPU does not hold a hub
    server past it (docs/culler.md)."""
    now = time.time()
    names = ["busy", "starting", "odd", "unread", "idle", "nokernel", "forgotten"]
    last = {name: now - 3 * 3600 for name in names}
    last["forgotten"] = now - 25 * 3600  # nobody at it for more than a day
    kernels: dict[str, Any] = {
        "busy": [{"id": "a", "execution_state": "idle"}, {"id": "b", "execution_state": "busy"}],
        "starting": [{"id": "a", "execution_state": "starting"}],
        "odd": [{"id": "a"}],  # no state said: unknown is never idle
        "unread": None,  # /api/kernels answers 503
        "idle": [{"id": "a", "execution_state": "idle"}, {"id": "b", "execution_state": "idle"}],
        "nokernel": [],
        "forgotten": [{"id": "a", "execution_state": "busy"}],
    }
    server = _Jupyter(last, kernels)
    notebooks = [{"metadata": {"namespace": "alice", "name": n}} for n in names]
    pods = []
    for name in names:
        pod = _pod(f"{name}-0", {"notebook-name": name}, now - 30 * 3600)
        pod["status"]["podIP"] = "127.0.0.1"
        pods.append(pod)
    cluster = _Cluster(notebooks, pods)

    async def run() -> dict[str, Outcome]:
        sockets = server.app.listen(0, "127.0.0.1")
        port = next(iter(sockets._sockets.values())).getsockname()[1]
        app = _culler(
            tmp_path,
            f"--status-url=http://{{pod_ip}}:{port}/notebook/{{namespace}}/{{name}}/api/status",
        )
        app._api = cluster

        async def gpu_idle(http: Any, judged: list[Any], at: Any) -> Any:
            return {key: facts for n in names for key, facts in _gpu_idle(now, f"{n}-0").items()}

        app.prometheus_facts = gpu_idle  # type: ignore[method-assign]
        try:
            return {o.notebook.name: o for o in await app.cull_once(now)}
        finally:
            sockets.stop()

    outcomes = asyncio.run(run())
    decisions = {name: outcomes[name].decision for name in names}
    for name in ("busy", "starting", "odd"):
        d = decisions[name]
        assert not d.cull and d.reason == "kernel_running", (name, d)
        assert "a kernel is running" in d.message, d.message
    assert "busy" in decisions["busy"].message and "starting" in decisions["starting"].message
    # its kernels could not be read: unknown, kept (as a server that did not answer)
    assert not decisions["unread"].cull and decisions["unread"].reason == "activity_unknown"
    # the control: every kernel idle (or none), status 3 h old, GPU idle 3 h: stopped
    for name in ("idle", "nokernel"):
        assert decisions[name].cull and decisions[name].reason == "gpu_idle", decisions[name]
    # a running kernel is not a user: nobody for a day stops it
    assert decisions["forgotten"].cull and decisions["forgotten"].reason == "unattended"
    assert sorted(cluster.patched) == ["forgotten", "idle", "nokernel"]
    # the kernels are read beside the status, without counting as activity on the server
    kernel_reads = [uri for uri in server.asked if "/api/kernels" in uri]
    assert "/notebook/alice/busy/api/kernels?no_track_activity=1" in kernel_reads
    assert len(kernel_reads) == len(names)


def test_the_kernels_url_is_beside_the_status_url(tmp_path):
    """The same base and the same server as /api/status; a status URL template whose path does
    not end in /api/status is refused at start (the kernels could not be found beside it)."""
    import pytest

    from fracspawner.culler.kubeflow import kernels_url, running_kernels

    assert (
        kernels_url("http://nb.alice.svc.cluster.local/notebook/alice/nb/api/status")
        == "http://nb.alice.svc.cluster.local/notebook/alice/nb/api/kernels?no_track_activity=1"
    )
    assert kernels_url("http://10.0.0.7:8888/api/status?x=1") == (
        "http://10.0.0.7:8888/api/kernels?no_track_activity=1&x=1"
    )
    assert running_kernels(b"[]") == ()
    assert running_kernels(b'[{"execution_state": "idle"}, {"execution_state": "busy"}]') == (
        "busy",
    )
    for body in (b'{"kernels": []}', b"[1]", b"not json"):
        with pytest.raises(ValueError):
            running_kernels(body)
    with pytest.raises(SystemExit, match="/api/status"):
        _culler(tmp_path, "--status-url=http://{pod_ip}:8888/notebook/{namespace}/{name}")
    with pytest.raises(SystemExit, match="workspace_status_url"):
        _culler(tmp_path, "--workspace-status-url=http://{pod_ip}:8888/")
