"""The watch loop every fracspawner watch shares (capacity/rawwatch.py `watch_once`): events
reach the cache as raw dicts, watch after watch, and a new watch costs no new API client.

kubernetes_asyncio's `Watch.__init__` makes an `ApiClient` only to build model objects, which a
raw watch never does; each such client builds an SSL context (the CA bundle loaded, ~20 ms of
CPU), and a watch is made again every time the server ends one (`timeoutSeconds`), for each
kind, in the hub, the culler and the webhook (issue 28 item 14: the hub's CPU in a spawn storm).

The server is real HTTP driven by the real kubernetes_asyncio client; each watch answers one
ADDED event and then ends, as the API server does when `timeoutSeconds` runs out."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio import client, watch
from tornado import web
from tornado.httpserver import HTTPServer

from devcluster.localhub import free_port
from fracspawner.capacity.rawwatch import RawWatch, watch_once


def _pod(name: str, version: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "resourceVersion": version},
    }


def _app() -> web.Application:
    class Handler(web.RequestHandler):
        def get(self) -> None:
            assert self.get_argument("watch", "").lower() == "true"
            after = int(self.get_argument("resourceVersion", "0"))
            version = str(after + 1)
            event = {"type": "ADDED", "object": _pod(f"pod-{version}", version)}
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps(event) + "\n")  # one event, then the watch's end

    return web.Application([(r"/api/v1/pods", Handler)])


@pytest.fixture
async def api_url() -> AsyncIterator[str]:
    port = free_port()
    http = HTTPServer(_app())
    http.listen(port, "127.0.0.1")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        http.stop()


async def test_watches_feed_raw_pods_without_a_new_api_client_each(api_url, monkeypatch):
    built = []
    original = client.ApiClient.__init__

    def counting(self, *args, **kwargs):
        built.append(self)
        original(self, *args, **kwargs)

    async with client.ApiClient(client.Configuration(host=api_url)) as api:
        core = client.CoreV1Api(api)
        monkeypatch.setattr(client.ApiClient, "__init__", counting)
        seen: list[dict] = []
        version = "0"
        for _ in range(3):  # three watches in a row, each resumed where the last ended
            version = await watch_once(
                core.list_pod_for_all_namespaces,
                version,
                put=seen.append,
                drop=lambda obj: None,
                delivered=lambda: None,
                timeout_seconds=5,
            )
    assert [p["metadata"]["name"] for p in seen] == ["pod-1", "pod-2", "pod-3"]
    assert all(isinstance(p, dict) for p in seen)  # the raw objects, no V1Pod
    assert version == "3"
    assert built == []  # before: one ApiClient (and SSL context) per watch


async def test_raw_watch_has_what_kubernetes_asyncio_watch_uses():
    """RawWatch sets Watch's attributes itself (not calling Watch.__init__): a
    kubernetes_asyncio that adds one must be noticed here, not in a hub's watch."""
    plain, raw = watch.Watch(), RawWatch()
    try:
        assert sorted(vars(raw)) == sorted(vars(plain))
    finally:
        await plain.close()
        await raw.close()
