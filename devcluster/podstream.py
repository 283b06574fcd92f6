"""pods/exec and pods/attach over the websocket channel protocol (issue 29 item 5).

As the apiserver proxies them to the kubelet's streaming server (kubernetes
staging/src/k8s.io/apiserver/pkg/util/wsstream/conn.go; the protocol of
staging/src/k8s.io/client-go/tools/remotecommand/websocket.go, KEP-4006): a GET upgraded to a
websocket with subprotocol `v5.channel.k8s.io` or `v4.channel.k8s.io`; every binary message is
one channel byte then data: 0 stdin, 1 stdout, 2 stderr, 3 error (the final `Status` JSON:
Success, or Failure with reason NonZeroExitCode and the code as an ExitCode cause), 4 resize;
v5 adds 255 "close", whose data is the channel being closed (the client's end of stdin).
The query names the command (`command=` once per argument), `stdin`/`stdout`/`stderr`/`tty`
and `container`. exec runs the command as a process beside the pod's own, with the container's
environment and working directory; attach streams the container's output from now on (its
stdin is not open: a devcluster container has none).
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from tornado import websocket

from .store import ApiError

if TYPE_CHECKING:
    from .cluster import DevCluster

PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")
STDIN, STDOUT, STDERR, ERROR, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255


def exit_status(code: int, command: list[str]) -> dict[str, Any]:
    """The error channel's Status (kubelet cri streaming: remotecommand's writeStatus)."""
    if code == 0:
        return {"metadata": {}, "status": "Success"}
    return {
        "metadata": {},
        "status": "Failure",
        "message": (
            "command terminated with non-zero exit code: error executing command "
            f"[{' '.join(command)}], exit code {code}"
        ),
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
    }


class PodStream(websocket.WebSocketHandler):
    def initialize(self, cluster: DevCluster) -> None:
        self.cluster = cluster
        self.process: asyncio.subprocess.Process | None = None
        self.task: asyncio.Task | None = None
        self.early: list[bytes] = []  # stdin that came before the process started

    def check_origin(self, origin: str) -> bool:
        return True  # API clients, not browsers

    def select_subprotocol(self, subprotocols: list[str]) -> str | None:
        for protocol in PROTOCOLS:
            if protocol in subprotocols:
                return protocol
        return None

    def _refuse(self, code: int, reason: str, message: str) -> None:
        self.set_status(code)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(ApiError(code, reason, message).status()))

    async def get(self, namespace: str, name: str, action: str) -> None:  # type: ignore[override]
        try:
            pod = self.cluster.store.get("pods", namespace, name)
        except ApiError as exc:
            self._refuse(exc.code, "NotFound", str(exc.status().get("message")))
            return
        if (namespace, name) not in self.cluster.kubelet.running:
            # the apiserver's words for a pod whose container is not running
            container = pod["spec"]["containers"][0]["name"]
            phase = (pod.get("status") or {}).get("phase", "Pending")
            why = (
                f"container not found ({container})"
                if phase == "Running"
                else (f"pod does not exist or is not running ({phase})")
            )
            self._refuse(400, "BadRequest", f"unable to upgrade connection: {why}")
            return
        if action == "exec" and not self.get_arguments("command"):
            self._refuse(400, "BadRequest", "you must specify at least 1 command")
            return
        if self.request.headers.get("Upgrade", "").lower() != "websocket":
            self._refuse(
                400, "BadRequest", "Upgrade request required: use the websocket channel protocol"
            )
            return
        await super().get(namespace, name, action)

    def _flag(self, name: str, default: bool = False) -> bool:
        value = self.get_argument(name, None)
        return default if value is None else value.lower() in ("1", "true")

    def open(self, namespace: str, name: str, action: str) -> None:  # type: ignore[override]
        if action == "exec":
            self.task = asyncio.ensure_future(self._exec(namespace, name))
        else:
            self.task = asyncio.ensure_future(self._attach(namespace, name))

    def _send(self, channel: int, data: bytes) -> None:
        try:
            self.write_message(bytes([channel]) + data, binary=True)
        except websocket.WebSocketClosedError:
            pass

    def _finish(self, status: dict[str, Any]) -> None:
        self._send(ERROR, json.dumps(status).encode())
        self.close(1000)  # a normal closure: kubectl reads 1005 (no status) as an error

    async def _exec(self, namespace: str, name: str) -> None:
        running = self.cluster.kubelet.running.get((namespace, name))
        command = self.get_arguments("command")
        if running is None:
            self._finish({"metadata": {}, "status": "Failure", "message": "container not running"})
            return
        argv = running.beside(command)  # in the container's namespaces
        try:
            self.process = await asyncio.create_subprocess_exec(
                *argv,
                env=running.env,
                cwd=running.cwd or None,
                stdin=asyncio.subprocess.PIPE
                if self._flag("stdin")
                else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            # the runtime's words for a command it cannot start (exit code 126/127 in a shell)
            message = (
                f"OCI runtime exec failed: exec failed: unable to start container process: exec: "
                f'"{command[0]}": {exc.strerror or exc}: unknown'
            )
            self._finish({"metadata": {}, "status": "Failure", "message": message,
                          "reason": "InternalError"})  # fmt: skip
            return

        for message in self.early:
            self._stdin(message)
        self.early.clear()

        async def pump(stream: asyncio.StreamReader | None, channel: int) -> None:
            while stream is not None:
                data = await stream.read(65536)
                if not data:
                    return
                if self._flag("stdout" if channel == STDOUT else "stderr", True):
                    self._send(channel, data)

        await asyncio.gather(pump(self.process.stdout, STDOUT), pump(self.process.stderr, STDERR))
        code = await self.process.wait()
        self._finish(exit_status(code, command))

    async def _attach(self, namespace: str, name: str) -> None:
        path = self.cluster.kubelet.pod_dir(namespace, name) / "container.log"
        offset = path.stat().st_size if path.exists() else 0
        while (namespace, name) in self.cluster.kubelet.running:
            size = path.stat().st_size if path.exists() else 0
            if size > offset:
                with open(path, "rb") as f:
                    f.seek(offset)
                    data = f.read(size - offset)
                offset = size
                self._send(STDOUT, data)
            await asyncio.sleep(0.1)
        self._finish({"metadata": {}, "status": "Success"})

    def on_message(self, message: str | bytes) -> None:
        if not isinstance(message, bytes) or not message:
            return
        if self.process is None:
            self.early.append(message)
            return
        self._stdin(message)

    def _stdin(self, message: bytes) -> None:
        channel, data = message[0], message[1:]
        process = self.process
        if process is None or process.stdin is None or process.stdin.is_closing():
            return
        if channel == STDIN and data:
            process.stdin.write(data)
        elif channel == CLOSE and data[:1] == bytes([STDIN]):
            process.stdin.close()

    def on_close(self) -> None:
        if self.process is not None and self.process.returncode is None:
            try:
                self.process.kill()
            except ProcessLookupError:
                pass
