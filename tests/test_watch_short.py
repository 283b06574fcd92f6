"""An API server (or a proxy in front of it) that ends every watch at once with nothing in it:
both watch loops back off and relist instead of re-watching in a tight loop, as client-go's
Reflector does (tools/cache/reflector.go, watchHandler: "very short watch: ... Unexpected watch
close - watch lasted less than a second and no items received" is an error, so
ListAndWatch's backoff applies).

The server is real HTTP driven by the real kubernetes_asyncio client; it answers lists with an
empty list and watches with an empty 200, like a proxy with a short idle timeout."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml
from kubernetes_asyncio import client, config
from tornado import web
from tornado.httpserver import HTTPServer
from traitlets.config import Config

from devcluster.localhub import free_port
from fracspawner.backends import load_catalog
from fracspawner.capacity.watch import CapacityWatcher
from fracspawner.kubeflow.cluster import PodWatch
from fracspawner.kubeflow.quota import PodIndex
from tests.conftest import DEMO_CATALOG

SECONDS = 2.0


def write_kubeconfig(path: Path, url: str) -> Path:
    """A kubeconfig for the plain-HTTP server below (it checks no credentials)."""
    cluster = {"name": "short", "cluster": {"server": url}}
    context = {"name": "short", "context": {"cluster": "short", "user": "short"}}
    user = {"name": "short", "user": {"token": "short"}}
    config = {"apiVersion": "v1", "kind": "Config", "clusters": [cluster], "contexts": [context],
              "users": [user], "current-context": "short"}  # fmt: skip
    path.write_text(yaml.safe_dump(config))
    return path


class Requests(Counter):
    """(kind, "list" | "watch") -> how many requests the server answered."""


def _app(seen: Requests) -> web.Application:
    class Handler(web.RequestHandler):
        def get(self, kind: str) -> None:
            if self.get_argument("watch", ""):
                seen[(kind, "watch")] += 1
                self.finish()  # 200, no events, the end: the whole watch
                return
            seen[(kind, "list")] += 1
            self.finish(
                {
                    "kind": "PodList" if kind == "pods" else "NodeList",
                    "apiVersion": "v1",
                    "metadata": {"resourceVersion": "7"},
                    "items": [],
                }
            )

    return web.Application([(r"/api/v1/(pods|nodes)", Handler)])


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, Requests]]:
    seen = Requests()
    port = free_port()
    http = HTTPServer(_app(seen))
    http.listen(port, "127.0.0.1")
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        http.stop()


async def test_the_capacity_watch_backs_off_when_every_watch_ends_at_once(server, tmp_path, caplog):
    url, seen = server
    saved = client.Configuration.get_default_copy()
    write_kubeconfig(tmp_path / "kubeconfig", url)
    await config.load_kube_config(config_file=str(tmp_path / "kubeconfig"))
    cfg = Config()
    cfg.ResourceReflector.initial_backoff = 0.1
    cfg.ResourceReflector.max_backoff = 0.5
    watcher = CapacityWatcher(load_catalog(DEMO_CATALOG), config=cfg)
    try:
        await watcher.start()
        await asyncio.sleep(SECONDS)
    finally:
        await watcher.stop()
        client.Configuration.set_default(saved)
    # backoff 0.1, 0.2, 0.4, 0.5 s ... (+20 % jitter): about 6 rounds in 2 s; the loop
    # without it re-watched hundreds of times
    assert 2 <= seen[("pods", "watch")] <= 12, seen
    assert seen[("pods", "list")] == seen[("pods", "watch")]  # each round relists
    # the admin's log says why the counts are stale
    assert "the watch ended within a second and without any event" in caplog.text


async def test_the_kubeflow_pod_watch_backs_off_when_every_watch_ends_at_once(server, caplog):
    url, seen = server
    async with client.ApiClient(client.Configuration(host=url)) as api:
        watch = PodWatch(client.CoreV1Api(api), PodIndex())
        watch.start()
        await asyncio.sleep(SECONDS)
        await watch.stop()
    # backoff 0.8 s, 1.6 s ...: two or three rounds in 2 s
    assert 1 <= seen[("pods", "watch")] <= 4, seen
    assert seen[("pods", "list")] == seen[("pods", "watch")]
    assert "the watch ended within a second and without any event" in caplog.text
