"""The scale benchmark's storm ends when every started server is ready (benchmarks/bench_scale.py
`_count`). JupyterHub's `GET /users?state=ready` filters ready users out of each page only after
counting: its `_pagination.total` is the count of ACTIVE users (ready or still starting;
jupyterhub/apihandlers/users.py, UserListAPIHandler.get: `total_count = full_query.count()`,
`post_filter` applied to the page's rows only). A storm that read that total stopped measuring
as soon as the spawn requests answered, with pods still being created (issue 37)."""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from benchmarks.bench_scale import _count

# 5 active users, 2 of them ready; page limit as JupyterHub's api_page_max_limit would cut it
ACTIVE = [f"u{i}" for i in range(5)]
READY = {"u1", "u4"}
MAX_LIMIT = 2


class _Hub(BaseHTTPRequestHandler):
    """JupyterHub 6's paginated user list, as far as state= goes."""

    def do_GET(self) -> None:
        query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
        state = query["state"][0]
        offset = int(query.get("offset", ["0"])[0])
        limit = min(int(query.get("limit", ["50"])[0]), MAX_LIMIT)
        rows = ACTIVE[offset : offset + limit]
        items = [{"name": u} for u in rows if state == "active" or u in READY]
        body = json.dumps(
            {
                "items": items,
                "_pagination": {"offset": offset, "limit": limit, "total": len(ACTIVE)},
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def hub() -> Iterator[SimpleNamespace]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield SimpleNamespace(
            api_url=f"http://127.0.0.1:{server.server_address[1]}/hub/api", admin_token="t"
        )
    finally:
        server.shutdown()
        server.server_close()


def test_ready_counts_only_ready_users_across_pages(hub: SimpleNamespace):
    assert _count(hub, "active") == 5
    assert _count(hub, "ready") == 2  # not the active total JupyterHub reports for state=ready
