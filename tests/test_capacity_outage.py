"""Watches that lose the API server: counts are marked stale at once, never serve a frozen
cache as fresh, never refuse (or admit) a spawn on frozen counts, and come back by themselves
when the API server does, on the same address, with what the cluster holds then (issue 14,
items 11 and 13: "after a 63 s API outage counts stayed frozen at '4 of 4 free' and a spawn into
a full pool was accepted").

On the real control plane (issue 35): kube-apiserver, etcd, the scheduler and the controller
manager, and the node agent registering the demo topology's nodes (its pods do not run). Two
outages: kube-apiserver itself stopped and started again (etcd keeps the cluster), and the
hub's connection to it cut by a TCP relay the watcher goes through, while an admin fills the
cluster (what a hub behind a broken network sees). A role that may list pods but not watch
them is the chart's capacity ClusterRole re-applied without `watch`, with its service's token.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes_asyncio import client, config
from traitlets.config import Config

from devcluster.controlplane import ControlPlane
from devcluster.controlplane.serviceaccounts import apply
from devcluster.nodeagent import NodeAgent
from devcluster.topology import load_topology
from fracspawner.backends import load_catalog
from fracspawner.capacity.watch import CapacityWatcher
from fracspawner.choice.offers import build_offer_model
from fracspawner.choice.options import OptionsError, resolve_choice
from fracspawner.hub.form import render_form
from tests.conftest import DEMO_CATALOG, DEMO_TOPOLOGY

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CATALOG = load_catalog(DEMO_CATALOG)
RULE = CATALOG.rule_for("cora", ["ml-research"])
T4 = {"gpu": "1/4", "pool": "t4"}
PODS = "/api/v1/namespaces/default/pods"


class Relay:
    """A TCP relay on a fixed loopback port to the apiserver (TLS passes through: its
    certificate names 127.0.0.1); `cut()` closes the port and every connection through it,
    as a broken network would, `restore()` listens on the same port again."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream = upstream_port
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self.restore()

    def restore(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            conns, self._conns = self._conns, []
        for s in [listener, *conns]:
            if s is not None:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                down, _ = listener.accept()
            except OSError:
                return
            try:
                up = socket.create_connection(("127.0.0.1", self.upstream), timeout=5)
            except OSError:
                down.close()
                continue
            up.settimeout(None)
            with self._lock:
                if self._listener is not listener:  # cut meanwhile
                    down.close(), up.close()
                    return
                self._conns += [down, up]
            for a, b in ((down, up), (up, down)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


# ------------------------------------------------------------------ the cluster
@pytest.fixture(scope="module")
def cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    from tests.test_controlplane import _binary

    _binary()
    with ControlPlane.start(tmp_path_factory.mktemp("controlplane")) as running:
        yield running


@pytest.fixture(scope="module")
def agent(cp: ControlPlane) -> Iterator[NodeAgent]:
    """The demo topology's nodes ("pods do not run": a bound pod is reported Running)."""
    topology = load_topology(DEMO_TOPOLOGY)
    with NodeAgent.start(topology, cp.server, cp.pki.ca, cp.state_dir / "nodeagent") as running:
        _wait(lambda: _t4_ready(cp), "gpu-t4-1 Ready and untainted")
        yield running


def _wait(check: Callable[[], bool], what: str, timeout: float = 120) -> None:
    """A hang guard for the cluster's own work (not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.2)


def _t4_ready(cp: ControlPlane) -> bool:
    node = cp.client.get_json("/api/v1/nodes/gpu-t4-1") or {}
    ready = any(c["type"] == "Ready" and c["status"] == "True"
                for c in (node.get("status") or {}).get("conditions") or [])  # fmt: skip
    return ready and not (node.get("spec") or {}).get("taints")


def _training_pods(cp: ControlPlane) -> list[dict]:
    listing = cp.client.get_json(f"{PODS}?labelSelector=app%3Dtraining") or {}
    return listing.get("items") or []


def _jobs(cp: ControlPlane, n: int) -> None:
    """Exactly `n` training jobs hold a T4 replica each, bound to gpu-t4-1 and Running (an
    admin's `kubectl run`s), made or deleted through the admin's client."""
    have = sorted(p["metadata"]["name"] for p in _training_pods(cp))
    want = [f"training-{i}" for i in range(n)]
    for name in set(have) - set(want):
        cp.client.request("DELETE", f"{PODS}/{name}", {"gracePeriodSeconds": 0})
    for name in set(want) - set(have):
        job = {"name": "job", "image": "trainer", "command": ["sleep", "infinity"],
               "resources": {"limits": {"nvidia.com/gpu": "1"}}}  # fmt: skip
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "labels": {"app": "training"}},
               "spec": {"nodeName": "gpu-t4-1", "containers": [job]}}  # fmt: skip
        status, text = cp.client.request("POST", PODS, pod)
        assert status == 201, text
    _wait(
        lambda: sorted(
            p["metadata"]["name"] for p in _training_pods(cp)
            if (p.get("status") or {}).get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")
        ) == want and len(_training_pods(cp)) == n,
        f"{n} training jobs running",
    )  # fmt: skip


def _apiserver(cp: ControlPlane):
    return next(c for c in cp.components if c.name == "kube-apiserver")


def _stop_apiserver(cp: ControlPlane) -> None:
    """kube-apiserver stopped (SIGTERM); etcd, the scheduler, the controller manager and the
    node agent stay up, as when an apiserver is restarted or lost."""
    _apiserver(cp).stop()


async def _start_apiserver(cp: ControlPlane) -> None:
    """kube-apiserver started again with its flags, on its port; back once ready. Started
    from this (the main) thread: a component dies with the thread that started it
    (PR_SET_PDEATHSIG), and asyncio's worker threads end with each test's event loop."""
    _apiserver(cp).start()

    def ready() -> bool:
        _apiserver(cp).check()
        try:
            return cp.client.request("GET", "/readyz", timeout=5)[0] == 200
        except OSError:
            return False

    await asyncio.to_thread(_wait, ready, "kube-apiserver ready again", 180)


# ------------------------------------------------------------------ the watcher
def _fast_retries() -> Config:
    """Retry within a second instead of client-go's 30 s cap, and end each watch request
    after 2 s: the same code paths, on a test's time scale."""
    cfg = Config()
    cfg.ResourceReflector.initial_backoff = 0.1
    cfg.ResourceReflector.max_backoff = 0.5
    cfg.ResourceReflector.timeout_seconds = 2
    return cfg


async def _until(check: Callable[[], bool], what: str, timeout: float = 60) -> None:
    """Wait for a condition the watcher reaches in the background (a hang guard, not a
    timing assertion)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        assert loop.time() < deadline, f"never happened: {what}"
        await asyncio.sleep(0.05)


def _t4(snapshot) -> tuple[int | None, int | None]:
    counts = snapshot.get("t4", "1/4")
    return counts.free, counts.total


def _model(watcher: CapacityWatcher) -> dict:
    return build_offer_model(CATALOG, rule=RULE, used_gpu=0.0, capacity=watcher.snapshot())


def _offer(model: dict, pool: str, spec: str) -> dict:
    found = [o for p in model["pools"] if p["name"] == pool for o in p["offers"]]
    return next(o for o in found if o["spec"] == spec)


@pytest.fixture
async def kube(cp: ControlPlane, agent: NodeAgent) -> AsyncIterator[Callable]:
    """`await kube(kubeconfig)` points the default kubernetes_asyncio configuration at a
    kubeconfig (as kubespawner's load_config does in the hub); restored afterwards, and
    kube-apiserver started again should a failed test have left it stopped."""
    saved = client.Configuration.get_default_copy()

    async def use(kubeconfig: Path) -> None:
        await config.load_kube_config(config_file=str(kubeconfig))

    try:
        yield use
    finally:
        client.Configuration.set_default(saved)
        if _apiserver(cp).process is None or _apiserver(cp).process.poll() is not None:
            await _start_apiserver(cp)


def _through(relay: Relay, cp: ControlPlane, where: Path) -> Path:
    """The admin's kubeconfig with its server at the relay."""
    kubeconfig = yaml.safe_load(cp.kubeconfig.read_text())
    for cluster in kubeconfig["clusters"]:
        cluster["cluster"]["server"] = f"https://127.0.0.1:{relay.port}"
    path = where / "through-relay.kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig))
    return path


# ------------------------------------------------------------------ the tests
async def test_an_outage_marks_counts_stale_and_the_watch_comes_back_with_the_truth(
    cp, kube, tmp_path
):
    await asyncio.to_thread(_jobs, cp, 0)
    relay = Relay(int(cp.server.rsplit(":", 1)[1]))
    await kube(_through(relay, cp, tmp_path))
    watcher = CapacityWatcher(CATALOG, config=_fast_retries())
    try:
        await watcher.start()
        fresh = watcher.snapshot()
        assert not fresh.stale and _t4(fresh) == (4, 4)
        assert not _model(watcher)["stale"]

        relay.cut()  # the hub loses the API server
        await _until(lambda: watcher.snapshot().stale, "the snapshot says the watch is down")

        # the last counts stay visible, marked as possibly out of date, on the page and in
        # the picker's JSON; a start() call does not wait for the API
        await watcher.start()
        frozen = watcher.snapshot()
        assert _t4(frozen) == (4, 4) and frozen.age_seconds >= 0
        model = _model(watcher)
        assert model["stale"] and model["stale_seconds"] is not None
        html = " ".join(render_form(model).split())
        assert "Counts may be out of date: the cluster has not answered for" in html
        assert 'id="fs-stale-counts" role="status">' in html  # shown, not hidden

        # while the hub cannot reach the API server, the cluster fills up: four training
        # jobs now hold all four T4 replicas
        await asyncio.to_thread(_jobs, cp, 4)
        relay.restore()

        # no new start() call: the watch keeps retrying in the background and relists
        await _until(lambda: not watcher.snapshot().stale, "the watch is back")
        await _until(lambda: _t4(watcher.snapshot()) == (0, 4), "the counts of now")
        model = _model(watcher)
        assert not model["stale"]
        assert _offer(model, "t4", "1/4")["reason"] == "None free right now."
        assert 'id="fs-stale-counts" role="status" hidden>' in render_form(model)
        with pytest.raises(OptionsError, match="right now"):
            resolve_choice(CATALOG, T4, rule=RULE, capacity=watcher.snapshot())
    finally:
        await watcher.stop()
        relay.cut()


async def test_frozen_counts_neither_refuse_nor_count_as_fresh(cp, kube):
    """A pool that was full when kube-apiserver went away: unknown now, so the spawn is not
    refused on counts (the scheduler decides) and the offer is not shown as full."""
    await asyncio.to_thread(_jobs, cp, 4)
    await kube(cp.kubeconfig)
    watcher = CapacityWatcher(CATALOG, config=_fast_retries())
    try:
        await watcher.start()
        assert _t4(watcher.snapshot()) == (0, 4)
        with pytest.raises(OptionsError, match="right now"):
            resolve_choice(CATALOG, T4, rule=RULE, capacity=watcher.snapshot())

        await asyncio.to_thread(_stop_apiserver, cp)
        await _until(lambda: watcher.snapshot().stale, "the snapshot says the watch is down")
        choice = resolve_choice(CATALOG, T4, rule=RULE, capacity=watcher.snapshot())
        assert choice.pool is not None and choice.pool.name == "t4"
        offer = _offer(_model(watcher), "t4", "1/4")
        assert offer["allowed"] and offer["reason"] is None
        assert (offer["free"], offer["total"]) == (0, 4)  # shown, with the stale marker

        await _start_apiserver(cp)
        await _until(lambda: not watcher.snapshot().stale, "the watch is back")
        assert _t4(watcher.snapshot()) == (0, 4)
    finally:
        await watcher.stop()


async def test_a_watcher_started_while_the_api_is_down_catches_up_by_itself(cp, kube):
    await asyncio.to_thread(_jobs, cp, 1)
    await kube(cp.kubeconfig)
    await asyncio.to_thread(_stop_apiserver, cp)
    watcher = CapacityWatcher(CATALOG, config=_fast_retries(), first_load_timeout=0.2)
    try:
        await watcher.start()  # returns although nothing answers
        down = watcher.snapshot()
        assert down.stale and down.nodes_seen == 0 and _t4(down) == (None, None)
        model = _model(watcher)
        assert model["stale"] and _offer(model, "t4", "1/4")["free"] is None

        await _start_apiserver(cp)
        await _until(lambda: not watcher.snapshot().stale, "the first list, in the background")
        assert _t4(watcher.snapshot()) == (3, 4)
    finally:
        await watcher.stop()


async def test_a_role_that_may_list_pods_but_not_watch_them_backs_off_its_relists(
    cp, kube, monkeypatch, tmp_path
):
    """Every refused watch relists every pod of the cluster: the backoff must grow until a
    watch delivers, not start over after each successful list (which relisted every 0.8 s
    forever, a load on the API server that grows with the cluster)."""
    from kubernetes_asyncio.client import rest

    from tests.rbac_support import SERVICE, install, rendered_rbac, without_verb

    await asyncio.to_thread(_jobs, cp, 1)
    objs = rendered_rbac({})
    capacity = next(o for o in objs if o["kind"] == "ClusterRole"
                    and o["metadata"]["name"].endswith("capacity"))  # fmt: skip
    tokens = await asyncio.to_thread(install, cp, objs, tmp_path)
    # the chart's capacity ClusterRole without `watch` on pods: kube-apiserver's RBAC
    # authoriser answers each of the service's watch requests 403 Forbidden
    await asyncio.to_thread(
        apply, cp.client, [without_verb(objs, "ClusterRole", capacity["metadata"]["name"],
                                        "pods", "watch")],
    )  # fmt: skip
    await asyncio.to_thread(_wait, lambda: not _may(cp, "watch"), "watch refused")
    loop = asyncio.get_running_loop()
    lists: list[float] = []
    original = rest.RESTClientObject.request

    async def counted(self, method, url, query_params=None, *args, **kwargs):
        query = dict(query_params or [])
        if (
            method == "GET"
            and url.split("?")[0].endswith("/api/v1/pods")
            and not query.get("watch")
        ):
            lists.append(loop.time())
        return await original(self, method, url, query_params, *args, **kwargs)

    monkeypatch.setattr(rest.RESTClientObject, "request", counted)
    await kube(tokens[SERVICE])
    cfg = _fast_retries()
    cfg.ResourceReflector.initial_backoff = 0.05
    cfg.ResourceReflector.max_backoff = 2.0
    watcher = CapacityWatcher(CATALOG, config=cfg)
    try:
        await watcher.start()
        await _until(lambda: len(lists) >= 6, "six lists of pods")
        # each list works (the counts are the cluster's), each watch is refused
        assert _t4(watcher.snapshot()) == (3, 4)
        pods = watcher._reflectors[1]
        assert pods.failures >= 1
        gaps = [b - a for a, b in zip(lists[:-1], lists[1:], strict=True)]
        # 0.05 s doubling: the fifth retry waits 0.8 s (not 0.05 s again); a busy machine
        # only makes gaps longer
        assert gaps[-1] >= 8 * 0.05, gaps

        # the role gets `watch` back, as the chart renders it: the watch comes back by
        # itself, current, and stays
        await asyncio.to_thread(apply, cp.client, [capacity])
        await _until(lambda: pods.failures == 0, "a watch that delivers")
        assert not watcher.snapshot().stale
    finally:
        await watcher.stop()
        await asyncio.to_thread(apply, cp.client, [capacity])


def _may(cp: ControlPlane, verb: str) -> bool:
    """Whether kube-apiserver's authoriser lets the live-offers service's account `verb`
    pods cluster-wide (a SubjectAccessReview, as `kubectl auth can-i --as` asks)."""
    import json

    from tests.chart_support import NAMESPACE
    from tests.rbac_support import SERVICE

    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": f"system:serviceaccount:{NAMESPACE}:{SERVICE}",
            "groups": ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}"],
            "resourceAttributes": {"verb": verb, "resource": "pods"},
        },
    }
    status, text = cp.client.request(
        "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review
    )
    assert status == 201, text
    return bool(json.loads(text)["status"].get("allowed"))
