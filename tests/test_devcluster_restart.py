"""The devcluster restarts on the same port at once (issue 14, item 13): tests that take the
API away and bring it back (an outage) need the port again, not after TIME_WAIT's ~60 s."""

from __future__ import annotations

import asyncio
import http.client
import json
import urllib.request

import pytest

from devcluster import DevCluster

pytestmark = pytest.mark.e2e

ONE_NODE = {"nodes": [{"name": "node-1", "capacity": {"cpu": "4", "memory": "8Gi"}}]}


def node_names(url: str) -> list[str]:
    with urllib.request.urlopen(url + "/api/v1/nodes", timeout=10) as resp:
        return [n["metadata"]["name"] for n in json.loads(resp.read())["items"]]


def keep_alive(port: int) -> http.client.HTTPConnection:
    """A client connection left open, as the hub's watches keep theirs."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/api/v1/nodes")
    conn.getresponse().read()
    return conn


async def test_a_stopped_devcluster_starts_again_on_the_same_port(tmp_path):
    first = await DevCluster(ONE_NODE, state_dir=tmp_path / "one").start()
    port = first.port
    client = await asyncio.to_thread(keep_alive, port)
    # stopping closes the open connection from the server's side, which leaves it in
    # TIME_WAIT on the devcluster's port: without SO_REUSEADDR no bind for ~60 s
    await first.stop()
    client.close()

    second = await DevCluster(ONE_NODE, port=port, state_dir=tmp_path / "two").start()
    try:
        assert second.port == port
        assert await asyncio.to_thread(node_names, second.url) == ["node-1"]
    finally:
        await second.stop()
