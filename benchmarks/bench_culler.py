"""Culler benchmarks.

(a) One culling cycle over 5,000 ready servers: wall time and HTTP requests, fracspawner's
culler and jupyterhub-idle-culler 2.0 against the same hub API, in the same run.
A stand-in hub API (JupyterHub's paginated `GET /users?state=ready` and `DELETE` server
endpoints, same JSON) is used: 5,000 real single-user servers need hundreds of GiB of memory
(a jupyter server is ~80 MiB), far beyond this 2-core, 24 GiB machine. GPU data comes from a
real Prometheus scraping a dcgm-exporter-format endpoint with the GPU servers' pods.

(b) A day of notebook activity on a small GPU pool (benchmarks/culler_trace.py), replayed under
no culler, jupyterhub-idle-culler with z2jh's defaults (timeout 3600 s, every 600 s, message
activity only), and fracspawner's culler (every 300 s, the production decision functions).
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import socket
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from tornado import web
from tornado.httpserver import HTTPServer

from benchmarks.culler_trace import DAY, MIN, make_trace
from fracspawner.culler.app import Culler, DefaultPolicy
from fracspawner.culler.decide import (
    GpuFacts,
    KernelFacts,
    ServerFacts,
    decide_kernel,
    decide_server,
)

N_SERVERS = 5000
GPU_SHARE = 0.3
MAX_PAGE = 200  # JupyterHub's default api_page_max_limit


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _iso(dt: datetime) -> str:
    return dt.isoformat().replace("+00:00", "Z")


def make_users(now: datetime) -> list[dict]:
    users = []
    for i in range(N_SERVERS):
        gpu = i % int(1 / GPU_SHARE) == 0
        idle = timedelta(minutes=(i * 37) % 900)  # 0 - 15 h, spread
        users.append(
            {
                "kind": "user",
                "name": f"user{i:05d}",
                "last_activity": _iso(now - idle),
                "servers": {
                    "": {
                        "name": "",
                        "last_activity": _iso(now - idle),
                        "started": _iso(now - idle - timedelta(hours=1)),
                        "pending": None,
                        "ready": True,
                        "stopped": False,
                        "url": f"/user/user{i:05d}/",
                        "user_options": {"gpu": "1/4", "pool": "h100"} if gpu else {},
                    }
                },
            }
        )
    return users


class StandInHub:
    """JupyterHub's REST shapes for the calls the two cullers make; counts requests."""

    def __init__(self, users: list[dict]):
        self.users = users
        self.requests = 0
        self.deleted: list[str] = []
        hub = self

        class Base(web.RequestHandler):
            def prepare(self) -> None:
                hub.requests += 1

        class Root(Base):
            def get(self) -> None:
                self.write({"version": "5.2.1"})

        class Users(Base):
            def get(self) -> None:
                offset = int(self.get_argument("offset", "0"))
                limit = min(int(self.get_argument("limit", "50") or 50), MAX_PAGE)
                items = hub.users[offset : offset + limit]
                nxt = None
                if offset + limit < len(hub.users):
                    base = f"{self.request.protocol}://{self.request.host}/hub/api/users"
                    url = f"{base}?state=ready&offset={offset + limit}&limit={limit}"
                    nxt = {"offset": offset + limit, "limit": limit, "url": url}
                if "pagination" in self.request.headers.get("Accept", ""):
                    self.write(
                        {
                            "items": items,
                            "_pagination": {
                                "offset": offset,
                                "limit": limit,
                                "total": len(hub.users),
                                "next": nxt,
                            },
                        }
                    )
                else:
                    self.write(json.dumps(hub.users))

        class Server(Base):
            def delete(self, user: str) -> None:
                hub.deleted.append(user)
                self.set_status(204)

        self.app = web.Application(
            [
                (r"/hub/api/", Root),
                (r"/hub/api/users", Users),
                (r"/hub/api/users/([^/]+)/server", Server),
            ]
        )


async def bench_cycle(results_dir: Path) -> dict:
    from jupyterhub_idle_culler import cull_idle

    from tests.test_culler_support import DcgmExporter, Prometheus

    now = datetime.now(timezone.utc)
    users = make_users(now)
    port = _free_port()
    hub = StandInHub(users)
    server = HTTPServer(hub.app)
    server.listen(port, "127.0.0.1")
    url = f"http://127.0.0.1:{port}/hub/api"
    quiet = logging.getLogger("bench-idle-culler")
    quiet.setLevel(logging.WARNING)
    out: dict = {
        "servers": N_SERVERS,
        "gpu_servers": sum(1 for u in users if u["servers"][""]["user_options"]),
    }

    exporter = DcgmExporter()
    for u in users:
        if u["servers"][""]["user_options"]:
            exporter.set(f"jupyter-{u['name']}", util=0, memory=10240)
    tmp = Path(tempfile.mkdtemp(prefix="bench-prom-"))
    prom = Prometheus(tmp, exporter.port)
    try:
        prom.wait_scraped(3)
        # jupyterhub-idle-culler 2.0, z2jh's settings (timeout 3600, concurrency 10)
        hub.requests, hub.deleted = 0, []
        t0 = time.perf_counter()
        await cull_idle(url, "token", 3600, quiet, concurrency=10, api_page_size=MAX_PAGE)
        out["jupyterhub_idle_culler"] = {
            "cycle_seconds": round(time.perf_counter() - t0, 3),
            "http_requests": hub.requests,
            "stopped": len(hub.deleted),
        }
        for label, prometheus_url, timeouts in (
            # same plain timeout as jupyterhub-idle-culler: the same servers are stopped
            (
                "fracspawner_culler_timeout_3600",
                "",
                {"server_idle": "3600", "server_gpu_idle": "3600"},
            ),
            ("fracspawner_culler", "", {}),
            ("fracspawner_culler_with_prometheus", prom.url, {}),
        ):
            hub.requests, hub.deleted = 0, []
            c = Culler(
                url=url,
                api_token="token",
                concurrency=10,
                api_page_size=MAX_PAGE,
                prometheus_url=prometheus_url,
                log_level=logging.WARNING,
                **timeouts,
            )
            t0 = time.perf_counter()
            result = await c.cull_once()
            out[label] = {
                "cycle_seconds": round(time.perf_counter() - t0, 3),
                "http_requests": result.requests,
                "hub_requests": hub.requests,
                "stopped": len(hub.deleted),
            }
    finally:
        prom.stop()
        exporter.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        server.stop()
    out["note"] = (
        "stand-in hub API (same JSON and pagination as JupyterHub 5, max page 200): 5,000 real "
        "single-user servers do not fit this machine. Prometheus is real (Debian 2.42), scraping "
        f"{out['gpu_servers']} GPU pods; its data covers seconds, so no GPU window is complete "
        "and no server is stopped on GPU grounds here (fail-safe): the plain 8 h timeout stops "
        "CPU servers, while jupyterhub-idle-culler stops every server idle > 1 h."
    )
    return out


def simulate(kind: str) -> dict:
    """Replay the trace minute by minute; kind: none | idle-culler | fracspawner."""
    policy = DefaultPolicy(30 * MIN, 2 * 3600, 8 * 3600, None)
    trace = make_trace()
    idle_mib_minutes = 0.0
    culls = false_culls = kernel_culls = 0
    for nb in trace:
        running = False  # server up
        holding = False  # kernel holds GPU memory
        started = last_msg = last_gpu = None
        killed_training = False
        for m in range(DAY):
            now = m * MIN
            if nb.session[m] and not running:  # the user (re)starts their server
                running, started, last_msg, killed_training = True, now, now, False
            if not running:
                continue
            if nb.gpu_start[m] or (nb.gpu_busy[m] and not killed_training):
                holding = True
            busy = nb.gpu_busy[m] and holding
            if nb.message[m]:
                last_msg = now
            if busy:
                last_gpu = now
            if holding and not busy and not nb.session[m]:
                idle_mib_minutes += nb.memory_mib
            every = {"none": None, "idle-culler": 600, "fracspawner": 300}[kind]
            if every is None or now % every:
                continue
            if kind == "idle-culler":
                if now - max(last_msg, started) >= 3600:
                    culls += 1
                    false_culls += busy
                    running = holding = False
                    killed_training = busy
                continue
            gpu_since = max(x for x in (last_gpu, started) if x is not None)
            activity = max(x for x in (last_msg, last_gpu, started) if x is not None)
            facts = ServerFacts(
                nb.user, user_options={"gpu": "1/4"}, started=started, last_activity=last_msg
            )
            gpu = GpuFacts(
                "prometheus+extension",
                now,
                nb.memory_mib if holding else 0.0,
                now - gpu_since,
                activity,
            )
            decision = decide_server(facts, gpu, policy, now)
            if decision.cull:
                culls += 1
                false_culls += busy
                running = holding = False
                killed_training = busy
                continue
            if holding:
                k = KernelFacts("k", last_msg, "idle", nb.memory_mib, now - gpu_since)
                if decide_kernel(k, policy, now).cull:
                    kernel_culls += 1
                    false_culls += busy
                    holding = False
    return {
        "idle_gpu_memory_gib_hours": round(idle_mib_minutes / 1024 / 60, 1),
        "server_culls": culls,
        "kernel_culls": kernel_culls,
        "false_culls_of_busy_notebooks": false_culls,
    }


def run(results_dir: Path) -> dict:
    cycle = asyncio.run(bench_cycle(results_dir))
    trace = make_trace()
    day = {
        "notebooks": len(trace),
        "training_minutes": sum(sum(nb.gpu_busy) for nb in trace),
        "no_culler": simulate("none"),
        "jupyterhub_idle_culler_z2jh_defaults": simulate("idle-culler"),
        "fracspawner_culler": simulate("fracspawner"),
    }
    result = {"cycle_5000_servers": cycle, "day_on_small_gpu_pool": day}
    (results_dir / "culler.md").write_text(
        "# Culler benchmarks\n\n"
        + (__doc__ or "")
        + "\n```json\n"
        + json.dumps(result, indent=2)
        + "\n```\n"
    )
    return result
