"""Watches that lose the API server: counts are marked stale at once, never serve a frozen
cache as fresh, never refuse (or admit) a spawn on frozen counts, and come back by themselves
when the API server does, on the same address, with what the cluster holds then.

The devcluster runs in this process and is stopped and started again on the same port, with
the cluster changed while it was down (issue 14, items 11 and 13: "after a 63 s API outage
counts stayed frozen at '4 of 4 free' and a spawn into a full pool was accepted").
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from kubernetes_asyncio import client, config
from traitlets.config import Config

from devcluster import DevCluster
from fracspawner.backends import load_catalog
from fracspawner.capacity.watch import CapacityWatcher
from fracspawner.choice.offers import build_offer_model
from fracspawner.choice.options import OptionsError, resolve_choice
from fracspawner.hub.form import render_form
from tests.conftest import DEMO_CATALOG
from tests.e2e_helpers import demo_topology_with_t4_jobs

pytestmark = pytest.mark.e2e

CATALOG = load_catalog(DEMO_CATALOG)
RULE = CATALOG.rule_for("cora", ["ml-research"])
T4 = {"gpu": "1/4", "pool": "t4"}


def _fast_retries() -> Config:
    """Retry within a second instead of client-go's 30 s cap, and end each watch request
    after 2 s: the same code paths, on a test's time scale."""
    cfg = Config()
    cfg.ResourceReflector.initial_backoff = 0.1
    cfg.ResourceReflector.max_backoff = 0.5
    cfg.ResourceReflector.timeout_seconds = 2
    return cfg


async def _until(check: Callable[[], bool], what: str, timeout: float = 30) -> None:
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
async def kube(tmp_path: Path) -> AsyncIterator[Path]:
    """Point the default kubernetes_asyncio configuration at a kubeconfig in tmp_path (the
    devcluster writes it) and restore the previous one afterwards."""
    saved = client.Configuration.get_default_copy()
    try:
        yield tmp_path
    finally:
        client.Configuration.set_default(saved)


async def _cluster(topology: dict, where: Path, port: int = 0) -> DevCluster:
    cluster = DevCluster(
        topology, port=port, state_dir=where / "state", kubeconfig=where / "kubeconfig"
    )
    await cluster.start()
    await config.load_kube_config(config_file=str(where / "kubeconfig"))
    return cluster


async def test_an_outage_marks_counts_stale_and_the_watch_comes_back_with_the_truth(kube):
    cluster = await _cluster(demo_topology_with_t4_jobs(0), kube)
    watcher = CapacityWatcher(CATALOG, config=_fast_retries())
    try:
        await watcher.start()
        fresh = watcher.snapshot()
        assert not fresh.stale and _t4(fresh) == (4, 4)
        assert not _model(watcher)["stale"]

        port = cluster.port
        await cluster.stop()
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

        # while the API server is away, the cluster fills up: three training jobs and
        # another user's notebook now hold all four T4 replicas
        full = demo_topology_with_t4_jobs(4)
        cluster = await _cluster(full, kube, port=port)

        # no new start() call: the watch keeps retrying in the background and relists
        await _until(lambda: not watcher.snapshot().stale, "the watch is back")
        assert _t4(watcher.snapshot()) == (0, 4)
        model = _model(watcher)
        assert not model["stale"]
        assert _offer(model, "t4", "1/4")["reason"] == "None free right now."
        assert 'id="fs-stale-counts" role="status" hidden>' in render_form(model)
        with pytest.raises(OptionsError, match="right now"):
            resolve_choice(CATALOG, T4, rule=RULE, capacity=watcher.snapshot())
    finally:
        await watcher.stop()
        await cluster.stop()


async def test_frozen_counts_neither_refuse_nor_count_as_fresh(kube):
    """A pool that was full when the API server went away: unknown now, so the spawn is not
    refused on counts (the scheduler decides) and the offer is not shown as full."""
    cluster = await _cluster(demo_topology_with_t4_jobs(4), kube)
    watcher = CapacityWatcher(CATALOG, config=_fast_retries())
    try:
        await watcher.start()
        assert _t4(watcher.snapshot()) == (0, 4)
        with pytest.raises(OptionsError, match="right now"):
            resolve_choice(CATALOG, T4, rule=RULE, capacity=watcher.snapshot())

        await cluster.stop()
        await _until(lambda: watcher.snapshot().stale, "the snapshot says the watch is down")
        choice = resolve_choice(CATALOG, T4, rule=RULE, capacity=watcher.snapshot())
        assert choice.pool is not None and choice.pool.name == "t4"
        offer = _offer(_model(watcher), "t4", "1/4")
        assert offer["allowed"] and offer["reason"] is None
        assert (offer["free"], offer["total"]) == (0, 4)  # shown, with the stale marker
    finally:
        await watcher.stop()
        await cluster.stop()


async def test_a_watcher_started_while_the_api_is_down_catches_up_by_itself(kube):
    cluster = await _cluster(demo_topology_with_t4_jobs(1), kube)
    port = cluster.port
    await cluster.stop()
    watcher = CapacityWatcher(CATALOG, config=_fast_retries(), first_load_timeout=0.2)
    try:
        await watcher.start()  # returns although nothing answers
        down = watcher.snapshot()
        assert down.stale and down.nodes_seen == 0 and _t4(down) == (None, None)
        model = _model(watcher)
        assert model["stale"] and _offer(model, "t4", "1/4")["free"] is None

        cluster = await _cluster(demo_topology_with_t4_jobs(1), kube, port=port)
        await _until(lambda: not watcher.snapshot().stale, "the first list, in the background")
        assert _t4(watcher.snapshot()) == (3, 4)
    finally:
        await watcher.stop()
        await cluster.stop()


async def test_a_role_that_may_list_pods_but_not_watch_them_backs_off_its_relists(
    kube, monkeypatch
):
    """Every refused watch relists every pod of the cluster: the backoff must grow until a
    watch delivers, not start over after each successful list (which relisted every 0.8 s
    forever, a load on the API server that grows with the cluster)."""
    cluster = await _cluster(demo_topology_with_t4_jobs(1), kube)
    # RBAC without `watch` on pods: the apiserver answers each watch request 403 Forbidden
    cluster.forbidden.add(("watch", "pods"))
    loop = asyncio.get_running_loop()
    lists: list[float] = []
    list_raw = cluster.store.list_raw

    def counted(key, *args, **kwargs):
        if key == "pods":
            lists.append(loop.time())
        return list_raw(key, *args, **kwargs)

    monkeypatch.setattr(cluster.store, "list_raw", counted)
    cfg = _fast_retries()
    cfg.ResourceReflector.initial_backoff = 0.05
    cfg.ResourceReflector.max_backoff = 2.0
    watcher = CapacityWatcher(CATALOG, config=cfg)
    try:
        await watcher.start()
        await _until(lambda: len(lists) >= 6, "six lists of pods")
        # each list works (the counts are the cluster's), each watch is refused
        assert _t4(watcher.snapshot()) == (3, 4)
        gaps = [b - a for a, b in zip(lists[:-1], lists[1:], strict=True)]
        # 0.05 s doubling: the fifth retry waits 0.8 s (not 0.05 s again); a busy machine
        # only makes gaps longer
        assert gaps[-1] >= 8 * 0.05, gaps

        # the role gets `watch`: the watch comes back by itself, current, and stays
        cluster.forbidden.clear()
        pods = watcher._reflectors[1]
        await _until(lambda: pods.failures == 0, "a watch that delivers")
        assert not watcher.snapshot().stale
    finally:
        await watcher.stop()
        await cluster.stop()
