"""What the notebook extension costs a chatty cell: kernel output through the websocket.

Every message between JupyterLab and a kernel passes the extension's websocket connection class
(fracspawner/serverext: resume on use for what the browser sends, the GPU out-of-memory note
for what the kernel publishes on iopub). A cell that prints is where that is felt: each line
is an iopub message. This runs one and the same cell in a real jupyter server with the extension
and in one without it (jupyter-server's own `ZMQChannelsWebsocketConnection`, the baseline), in
the same run, arms interleaved: `for i in range(N): print(i, flush=True)`, each line its own
stream message, read by a client speaking JupyterLab's v1 websocket protocol. jupyter-server's
iopub rate limit is off in both arms (it would drop most of them), and the extension's GPU
reading comes from the simulated source (no GPU here).

Per round: seconds from the execute request to the kernel's idle status, iopub messages
received; `per_message_us`: the extension's extra time per message (median of the rounds' time
difference over the messages). A round without every line in both arms is an error.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from devcluster.localhub import free_port

REPO = Path(__file__).resolve().parent.parent
V1 = "v1.kernel.websocket.jupyter.org"
LINES = int(os.environ.get("FRACSPAWNER_BENCH_WS_LINES", "20000"))
ROUNDS = int(os.environ.get("FRACSPAWNER_BENCH_WS_ROUNDS", "3"))


class Server:
    """A real jupyter server on loopback, with the extension or without it."""

    def __init__(self, tmp: Path, extension: bool):
        self.token, self.port = uuid.uuid4().hex, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (tmp / "gpu.json").write_text(json.dumps({"devices": [{"memory_total_mib": 81559}]}))
        env = {
            **os.environ,
            "JUPYTER_CONFIG_DIR": str(tmp / "config"),
            "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
            "JUPYTER_DATA_DIR": str(tmp / "data"),
            "FRACSPAWNER_GPU_SOURCE": f"sim:{tmp / 'gpu.json'}",
            "FRACSPAWNER_GPU_SLICE": "1/4",
            "FRACSPAWNER_GPU_MEMORY_MIB": "20389",
        }
        # the repository's auto-enable file turns the extension on; off, whatever else is there
        env["JUPYTER_CONFIG_PATH"] = str(REPO / "jupyter-config") if extension else ""
        args = [
            sys.executable, "-m", "jupyter_server", "--allow-root", "--no-browser",
            "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0", f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={tmp}", "--ZMQChannelsWebsocketConnection.limit_rate=False",
        ]  # fmt: skip
        if not extension:
            off = {"ServerApp": {"jpserver_extensions": {"fracspawner.serverext": False}}}
            (tmp / "config" / "jupyter_server_config.json").write_text(json.dumps(off))
        self.log = open(tmp / "server.log", "wb")  # noqa: SIM115
        self.process = subprocess.Popen(
            args, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.tmp, self.extension = tmp, extension

    async def up(self) -> None:
        from tornado.httpclient import AsyncHTTPClient

        client = AsyncHTTPClient()
        for _ in range(600):
            if self.process.poll() is not None:
                raise RuntimeError(f"jupyter server exited: {self.logs()}")
            try:
                r = await client.fetch(f"{self.url}/api/status", headers=self.auth)
                if r.code == 200:
                    break
            except Exception:
                await asyncio.sleep(0.1)
        else:
            raise RuntimeError(f"jupyter server did not come up: {self.logs()}")
        r = await client.fetch(
            f"{self.url}/api/fracspawner/gpu", headers=self.auth, raise_error=False
        )
        loaded = r.code == 200
        if self.extension != loaded:
            raise RuntimeError(f"extension loaded: {loaded}, wanted {self.extension}")

    @property
    def auth(self) -> dict:
        return {"Authorization": f"token {self.token}"}

    def logs(self) -> str:
        return (self.tmp / "server.log").read_text(errors="replace")[-3000:]

    async def kernel(self) -> str:
        from tornado.httpclient import AsyncHTTPClient

        r = await AsyncHTTPClient().fetch(
            f"{self.url}/api/kernels", method="POST", headers=self.auth, body="{}"
        )
        return json.loads(r.body)["id"]

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


async def run_cell(server: Server, kernel_id: str, code: str) -> tuple[float, int, int]:
    """(seconds to idle, iopub messages under the request, stream lines) over a v1 websocket."""
    from jupyter_server.services.kernels.connection.base import (
        deserialize_msg_from_ws_v1,
        serialize_msg_to_ws_v1,
    )
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    url = server.url.replace("http", "ws", 1) + f"/api/kernels/{kernel_id}/channels"
    conn = await websocket_connect(HTTPRequest(url, headers=server.auth), subprotocols=[V1])
    msg_id = uuid.uuid4().hex
    header = {"msg_id": msg_id, "msg_type": "execute_request", "username": "bench",
              "session": uuid.uuid4().hex, "version": "5.3", "date": ""}  # fmt: skip
    content = {"code": code, "silent": False, "store_history": False, "user_expressions": {},
               "allow_stdin": False, "stop_on_error": True}  # fmt: skip
    parts = [json.dumps(p).encode() for p in (header, {}, {}, content)]
    started = time.perf_counter()
    conn.write_message(serialize_msg_to_ws_v1(parts, "shell"), binary=True)
    messages = lines = 0
    while True:
        raw = await conn.read_message()
        if raw is None:
            raise RuntimeError("kernel websocket closed")
        channel, parts = deserialize_msg_from_ws_v1(raw)
        if channel != "iopub" or json.loads(parts[1]).get("msg_id") != msg_id:
            continue
        messages += 1
        kind = json.loads(parts[0])["msg_type"]
        if kind == "stream":
            lines += json.loads(parts[3])["text"].count("\n")
        elif kind == "status" and json.loads(parts[3])["execution_state"] == "idle":
            break
    took = time.perf_counter() - started
    conn.close()
    return took, messages, lines


async def measure(lines: int = LINES, rounds: int = ROUNDS) -> dict[str, Any]:
    code = f"for i in range({lines}):\n    print(i, flush=True)"
    with tempfile.TemporaryDirectory() as tmp:
        servers = {}
        for name, ext in (("baseline", False), ("fracspawner", True)):
            d = Path(tmp) / name
            (d / "config").mkdir(parents=True)
            servers[name] = Server(d, ext)
        try:
            kernels = {}
            for name, s in servers.items():
                await s.up()
                kernels[name] = await s.kernel()
                await run_cell(s, kernels[name], "print('warm')")  # the kernel has started
            out: dict[str, list] = {name: [] for name in servers}
            for r in range(rounds):  # interleaved: ABBA, BAAB, ...
                order = list(servers) if r % 2 == 0 else list(reversed(servers))
                for name in order + order[::-1]:
                    took, messages, got = await run_cell(servers[name], kernels[name], code)
                    if got != lines:
                        raise RuntimeError(f"{name}: {got} of {lines} lines arrived")
                    out[name].append({"seconds": round(took, 4), "iopub_messages": messages})
        finally:
            for s in servers.values():
                s.stop()
    base = [x["seconds"] for x in out["baseline"]]
    ours = [x["seconds"] for x in out["fracspawner"]]
    messages = statistics.median(x["iopub_messages"] for x in out["fracspawner"])
    diffs = [(o - b) / messages * 1e6 for o, b in zip(ours, base, strict=True)]
    return {
        "lines": lines,
        "rounds": out,
        "baseline_median_s": round(statistics.median(base), 4),
        "fracspawner_median_s": round(statistics.median(ours), 4),
        "ratio": round(statistics.median(ours) / statistics.median(base), 3),
        "per_message_us": round(statistics.median(diffs), 2),
        "load_average": os.getloadavg(),
    }


def hook_cost(n: int = 200_000) -> dict[str, float]:
    """The outgoing hook alone, in this process: microseconds it adds to one iopub stream
    message (the common case, let through after a look at its header) and to reading a GPU
    out-of-memory error (found, before the note)."""
    from jupyter_client.session import Session
    from jupyter_server.services.kernels.connection.channels import (
        ZMQChannelsWebsocketConnection,
    )

    from fracspawner.serverext.oomnote import explaining_connection_class

    cls = explaining_connection_class(ZMQChannelsWebsocketConnection)
    conn = cls.__new__(cls)  # only its session is used here
    conn.session = s = Session(key=b"bench")
    stream = s.serialize(s.msg("stream", {"name": "stdout", "text": "1\n"}), ident=[b"k"])
    error = {"ename": "OutOfMemoryError", "evalue": "CUDA out of memory.", "traceback": []}
    # a new cell each time: each error is read in full (a cell's second is not)
    errors = [
        s.serialize(s.msg("error", error, parent=s.msg_header("execute_request")), ident=[b"k"])
        for _ in range(n // 20)
    ]
    figures = {}
    for name, messages in (("stream", [stream] * n), ("gpu_oom_error", errors)):
        started = time.perf_counter()
        for frames in messages:
            conn._gpu_oom_parent("iopub", frames)
        figures[f"hook_us_per_{name}_message"] = round(
            (time.perf_counter() - started) / len(messages) * 1e6, 2
        )
    return figures


def run(results_dir: Path) -> dict[str, Any]:
    return {**asyncio.run(measure()), **hook_cost()}


if __name__ == "__main__":
    print(json.dumps(run(REPO / "benchmarks" / "results"), indent=2))
