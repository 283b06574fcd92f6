"""Real parts for the culler and extension tests (no tests here): a jupyter server, a kernel
client, a dcgm-exporter stand-in the test controls, and Prometheus from Debian's package."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from devcluster.localhub import free_port
from tests.missing import missing

REPO = Path(__file__).resolve().parent.parent


def wait_for(check, timeout: float = 30, what: str = "condition", every: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(every)
    raise TimeoutError(f"timed out waiting for {what}")


def http(method: str, url: str, token: str | None = None, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if token:
        req.add_header("Authorization", f"token {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            raw, status = resp.read(), resp.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read(), exc.code
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode(errors="replace")


# --- a jupyter server with the extension, no hub -----------------------------------------
class JupyterServer:
    def __init__(
        self,
        tmp: Path,
        gpu_file: Path,
        entitlement: int | None = 10240,
        *,
        source: str | None = None,
        env: dict[str, str] | None = None,
        monitor: dict[str, Any] | None = None,
        config: dict[str, Any] | None = None,
    ):
        self.tmp, self.gpu_file = tmp, gpu_file
        extra_config = config
        self.token = uuid.uuid4().hex
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = tmp / "config"
        config.mkdir(exist_ok=True)
        # poll fast; the extension itself is enabled by the repository's auto-enable file
        settings = {"poll_interval": 0.2, "unavailable_retry": 0.2, **(monitor or {})}
        (config / "jupyter_server_config.json").write_text(
            json.dumps({"GpuMonitor": settings, **(extra_config or {})})
        )
        env = {**os.environ, **(env or {})}
        env.update(
            FRACSPAWNER_GPU_SOURCE=source or f"sim:{gpu_file}",
            JUPYTER_CONFIG_DIR=str(config),
            JUPYTER_CONFIG_PATH=str(REPO / "jupyter-config"),
            JUPYTER_RUNTIME_DIR=str(tmp / "runtime"),
            JUPYTER_DATA_DIR=str(tmp / "data"),
        )
        if entitlement is not None:
            env["FRACSPAWNER_GPU_MEMORY_MIB"] = str(entitlement)
        self.log = open(tmp / "server.log", "wb")  # noqa: SIM115
        self.process = subprocess.Popen(
            [
                sys.executable, "-m", "jupyter_server", "--allow-root", "--no-browser",
                "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={self.port}",
                "--ServerApp.port_retries=0", f"--IdentityProvider.token={self.token}",
                f"--ServerApp.root_dir={tmp}",
            ],
            env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        wait_for(self._up, 60, "jupyter server")

    def _up(self) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(f"jupyter server exited:\n{self.logs()}")
        try:
            return self.api("GET", "/api/status")[0] == 200
        except OSError:
            return False

    def api(self, method: str, path: str, body: Any = None, token: str | None = "") -> tuple:
        return http(method, self.url + path, self.token if token == "" else token, body)

    def gpu(self) -> dict:
        status, body = self.api("GET", "/api/fracspawner/gpu")
        assert status == 200, body
        return body

    def logs(self) -> str:
        return (self.tmp / "server.log").read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # jupyter server shuts its kernels down
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(5)
        self.log.close()


async def execute(server_url: str, token: str, kernel_id: str, code: str, wait: bool = True) -> str:
    """Run code in a kernel over the websocket (protocol v5 JSON); return its stdout."""
    from tornado.websocket import websocket_connect

    ws_url = server_url.replace("http", "ws", 1).rstrip("/") + f"/api/kernels/{kernel_id}/channels"
    from tornado.httpclient import HTTPRequest

    conn = await websocket_connect(HTTPRequest(ws_url, headers={"Authorization": f"token {token}"}))
    msg_id = uuid.uuid4().hex
    conn.write_message(
        json.dumps(
            {
                "header": {
                    "msg_id": msg_id, "msg_type": "execute_request", "username": "test",
                    "session": uuid.uuid4().hex, "version": "5.3", "date": "",
                },
                "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
                "content": {"code": code, "silent": False, "store_history": False,
                            "user_expressions": {}, "allow_stdin": False, "stop_on_error": True},
            }
        )
    )  # fmt: skip
    out = []
    if not wait:  # return once the kernel said it is busy with this request
        while True:
            msg = json.loads(await conn.read_message())
            if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status":
                conn.close()
                return ""
    while True:
        raw = await conn.read_message()
        if raw is None:
            raise RuntimeError("kernel websocket closed")
        msg = json.loads(raw)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            raise RuntimeError("\n".join(msg["content"]["traceback"]))
        elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            conn.close()
            return "".join(out)


# --- dcgm-exporter stand-in and Prometheus -----------------------------------------------
class DcgmExporter:
    """Serves dcgm-exporter-format metrics for the pods the test sets (on loopback)."""

    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], tuple[float, float]] = {}  # -> (util %, memory MiB)
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                body = exporter.render().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def set(self, pod: str, util: float, memory: float, namespace: str = "default") -> None:
        self.pods[(namespace, pod)] = (util, memory)

    def render(self) -> str:
        lines = [
            "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).",
            "# TYPE DCGM_FI_DEV_GPU_UTIL gauge",
        ]
        rows = list(self.pods.items())
        for i, ((ns, pod), (util, _)) in enumerate(rows):
            lines.append(f"DCGM_FI_DEV_GPU_UTIL{{{self._labels(i, ns, pod)}}} {util}")
        lines += [
            "# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).",
            "# TYPE DCGM_FI_DEV_FB_USED gauge",
        ]
        for i, ((ns, pod), (_, mem)) in enumerate(rows):
            lines.append(f"DCGM_FI_DEV_FB_USED{{{self._labels(i, ns, pod)}}} {mem}")
        return "\n".join(lines) + "\n"

    @staticmethod
    def _labels(i: int, ns: str, pod: str) -> str:
        return (
            f'gpu="{i % 8}",UUID="GPU-00000000-0000-0000-0000-{i:012d}",device="nvidia{i % 8}",'
            f'modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-{i // 8}",'
            f'container="notebook",namespace="{ns}",pod="{pod}"'
        )

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Prometheus:
    """Debian's prometheus on a loopback port, scraping the exporter every second.

    The scrape target carries its own `pod`/`namespace` labels, as a ServiceMonitor's target does,
    so the exporter's labels arrive as `exported_pod`/`exported_namespace`.
    """

    def __init__(
        self,
        tmp: Path,
        exporter_port: int,
        extra_jobs: dict[str, tuple[str, str]] | None = None,
        more_scrape_configs: str = "",
    ):
        """`extra_jobs`: job name -> (host:port, metrics path), scraped beside the exporter;
        `more_scrape_configs`: YAML items appended to scrape_configs as they are."""
        binary = shutil.which("prometheus") or "/usr/bin/prometheus"
        if not Path(binary).exists():
            missing("prometheus not installed (make system-deps installs Debian's package)")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = tmp / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            "  - job_name: dcgm-exporter\n"
            "    static_configs:\n"
            f"      - targets: ['127.0.0.1:{exporter_port}']\n"
            "        labels: {pod: dcgm-exporter-x7k2p, namespace: gpu-operator}\n"
            + "".join(
                f"  - job_name: {job}\n    metrics_path: {path}\n    static_configs:\n"
                f"      - targets: ['{target}']\n"
                for job, (target, path) in (extra_jobs or {}).items()
            )
            + more_scrape_configs
        )
        self.log = open(tmp / "prometheus.log", "wb")  # noqa: SIM115
        self.process = subprocess.Popen(
            [
                binary, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        wait_for(self._ready, 60, "prometheus ready")

    def _ready(self) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(Path(self.log.name).read_text(errors="replace")[-3000:])
        try:
            return http("GET", self.url + "/-/ready")[0] == 200
        except OSError:
            return False

    def query(self, promql: str) -> list:
        status, body = http(
            "GET", self.url + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        )
        assert status == 200, body
        return body["data"]["result"]

    def wait_scraped(self, n: int = 3) -> None:
        """Until the exporter has been scraped n times (so windows have data in them)."""
        wait_for(
            lambda: (
                self.query('count_over_time(up{job="dcgm-exporter"}[1m])')
                and float(self.query('count_over_time(up{job="dcgm-exporter"}[1m])')[0]["value"][1])
                >= n
            ),
            60,
            "scrapes",
        )

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self.log.close()


class BackfilledPrometheus(Prometheus):
    """Debian's prometheus serving samples written with their own timestamps (promtool's
    OpenMetrics backfill): hours of 15 s or 60 s scrapes, gaps, young series, in a second.
    Query it at a time in that past (`query(..., at=...)`). `series`: (labels, [(t, v)])."""

    def __init__(self, tmp: Path, series: list[tuple[dict[str, str], list[tuple[float, float]]]]):
        promtool = shutil.which("promtool") or "/usr/bin/promtool"
        if not Path(promtool).exists():
            missing("promtool not installed (Debian's prometheus package ships it)")
        by_metric: dict[str, list[str]] = {}
        for labels, samples in series:
            name = labels["__name__"]
            text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "__name__")
            by_metric.setdefault(name, []).extend(
                f"{name}{{{text}}} {v} {t:.3f}" for t, v in samples
            )
        lines = []
        for name, rows in by_metric.items():
            lines += [f"# TYPE {name} gauge", *rows]
        tmp.mkdir(parents=True, exist_ok=True)
        source = tmp / "backfill.om"
        source.write_text("\n".join([*lines, "# EOF"]) + "\n")
        data = tmp / "data"
        done = subprocess.run(
            [promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        if done.returncode:
            raise RuntimeError(f"promtool: {done.stderr[-2000:]}")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = tmp / "prometheus.yml"
        config.write_text("global: {scrape_interval: 15s}\n")
        self.log = open(tmp / "prometheus.log", "wb")  # noqa: SIM115
        self.process = subprocess.Popen(
            [
                shutil.which("prometheus") or "/usr/bin/prometheus", f"--config.file={config}",
                f"--storage.tsdb.path={data}", "--storage.tsdb.retention.time=100y",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        wait_for(self._ready, 60, "prometheus ready")


# --- a real JupyterHub with local single-user servers (no Kubernetes) ----------------------
# no access:servers: the culler never calls into a user's server
CULLER_SCOPES = [
    "list:users",
    "read:users:activity",
    "read:servers",
    "delete:servers",
]


class LocalProcessHub:
    """JupyterHub + configurable-http-proxy + jupyterhub-singleuser servers as local processes,
    each with the extension (enabled by the repository's auto-enable file) on a simulated GPU."""

    def __init__(self, tmp: Path, gpu_file: Path):
        from devcluster.localhub import find_proxy

        self.tmp = tmp
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.admin_token, self.culler_token = uuid.uuid4().hex, uuid.uuid4().hex
        config_dir = tmp / "server-config"
        config_dir.mkdir(exist_ok=True)
        (config_dir / "jupyter_server_config.json").write_text(
            json.dumps({"GpuMonitor": {"poll_interval": 0.2, "unavailable_retry": 0.2}})
        )
        singleuser_env = {
            "FRACSPAWNER_GPU_SOURCE": f"sim:{gpu_file}",
            "JUPYTER_CONFIG_PATH": os.pathsep.join([str(config_dir), str(REPO / "jupyter-config")]),
            "PATH": os.environ["PATH"],
            # `make` installs fracspawner into the venv; a bare checkout may not have it
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        }
        (tmp / "jupyterhub_config.py").write_text(
            f"""
c = get_config()  # noqa
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = {self.port}
c.JupyterHub.hub_port = {free_port()}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{free_port()}"
c.ConfigurableHTTPProxy.command = [{find_proxy()!r}]
c.JupyterHub.db_url = "sqlite:///{tmp}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = "{tmp}/cookie_secret"
c.JupyterHub.pid_file = "{tmp}/jupyterhub.pid"
c.ConfigurableHTTPProxy.pid_file = "{tmp}/proxy.pid"
c.JupyterHub.authenticator_class = "dummy"
c.Authenticator.allow_all = True
c.JupyterHub.allow_named_servers = True
c.JupyterHub.spawner_class = "simple"
c.SimpleLocalProcessSpawner.home_dir_template = "{tmp}/home/{{username}}"
c.Spawner.args = ["--allow-root"]
c.Spawner.environment = {singleuser_env!r}
c.JupyterHub.services = [
    {{"name": "admin", "api_token": {self.admin_token!r}}},
    {{"name": "culler", "api_token": {self.culler_token!r}}},
]
c.JupyterHub.load_roles = [
    {{"name": "admin-svc", "scopes": ["admin:users", "admin:servers", "access:servers",
      "list:users", "read:users"], "services": ["admin"]}},
    {{"name": "culler", "scopes": {CULLER_SCOPES!r}, "services": ["culler"]}},
]
"""
        )
        self.log = open(tmp / "hub.log", "wb")  # noqa: SIM115
        self.process = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", str(tmp / "jupyterhub_config.py")],
            cwd=tmp, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        wait_for(self._up, 60, "jupyterhub")

    @property
    def api_url(self) -> str:
        return self.url + "/hub/api"

    def _up(self) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(self.logs())
        try:
            return self.api("GET", "/")[0] == 200
        except OSError:
            return False

    def api(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        return http(method, self.api_url + path, self.admin_token, body)

    def server_api(self, user: str, method: str, path: str, body: Any = None, server: str = ""):
        base = f"{self.url}/user/{user}/" + (f"{server}/" if server else "")
        return http(method, base + path.lstrip("/"), self.admin_token, body)

    def spawn(self, user: str, options: dict, server: str = "") -> dict:
        self.api("POST", f"/users/{user}", {})
        path = f"/users/{user}/servers/{server}" if server else f"/users/{user}/server"
        status, body = self.api("POST", path, options)
        assert status in (201, 202), body
        return wait_for(lambda: self.ready(user, server), 60, f"{user}/{server} ready")

    def ready(self, user: str, server: str = "") -> dict | None:
        status, model = self.api("GET", f"/users/{user}")
        s = (model.get("servers") or {}).get(server) if status == 200 else None
        return s if s and s.get("ready") else None

    def running(self, user: str, server: str = "") -> bool:
        status, model = self.api("GET", f"/users/{user}")
        return status == 200 and server in (model.get("servers") or {})

    def logs(self) -> str:
        return (self.tmp / "hub.log").read_text(errors="replace")[-5000:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # cleanup_servers stops the servers
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # the proxy, should it be left
        except ProcessLookupError:
            pass
        self.log.close()


async def prometheus_facts_of(culler: Any, servers: list, at: float | None) -> Any:
    """`culler.prometheus_facts` with the hub client it needs: only its HTTP client and a
    request counter (it asks the hub nothing)."""
    from tornado.httpclient import AsyncHTTPClient

    class Hub:
        http = AsyncHTTPClient(force_instance=True)
        requests = 0

    try:
        return await culler.prometheus_facts(Hub, servers, at=at)
    finally:
        Hub.http.close()
