"""`devcluster_process`: `fracspawner devcluster` (the real control plane with the node agent) in
a subprocess, for tests and benchmarks."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import yaml

READY = re.compile(r"devcluster ready: (\S+) kubeconfig=(\S+)(?: server=(\S+))?")


@dataclass
class DevClusterProcess:
    """`url`: a loopback door to the apiserver with the admin's identity, as `kubectl proxy`
    (bare urllib works); `server`: the apiserver itself (https with client certificates);
    `client()`: a small JSON client speaking TLS with the admin's certificate."""

    url: str
    kubeconfig: Path
    state_dir: Path
    process: subprocess.Popen
    server: str = ""

    def client(self) -> _Client:
        return _Client(self.server, _admin_tls(self.kubeconfig))


def _admin_tls(kubeconfig: Path) -> ssl.SSLContext:
    """TLS with the kubeconfig's CA and client certificate files (the launcher writes them)."""
    config = yaml.safe_load(Path(kubeconfig).read_text())
    cluster = config["clusters"][0]["cluster"]
    user = config["users"][0]["user"]
    tls = ssl.create_default_context(cafile=cluster["certificate-authority"])
    tls.load_cert_chain(user["client-certificate"], user["client-key"])
    return tls


class _Client:
    """A tiny synchronous JSON client for assertions in tests."""

    def __init__(self, url: str, tls: ssl.SSLContext | None = None) -> None:
        self.url = url
        self._tls = tls

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, timeout=30, context=self._tls) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def get(self, path: str) -> Any:
        status, body = self.request("GET", path)
        assert status == 200, (status, body)
        return body

    def list(self, plural: str, namespace: str | None = None, **params: str) -> list[dict]:
        """Items of a kind, e.g. `list("events", "default", fieldSelector="reason=Started")`
        (`namespace=None`: across all namespaces)."""
        query = urllib.parse.urlencode(params)
        where = f"/namespaces/{namespace}" if namespace else ""
        return self.get(f"/api/v1{where}/{plural}?{query}")["items"]

    def pods(self, namespace: str = "default", **params: str) -> list[dict]:
        return self.list("pods", namespace, **params)


def _pod_processes(state_dir: Path) -> list[int]:
    """Processes of the devcluster's pods: their HOME is under the state dir (kernels too)."""
    needle = f"HOME={state_dir.resolve()}/".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes()
        except OSError:
            continue
        if any(item.startswith(needle) for item in env.split(b"\0")):
            found.append(int(entry.name))
    return found


def _component_processes(state_dir: Path) -> list[int]:
    """Processes whose command line names the state dir: the real control plane's components
    (etcd's data dir, the apiserver's certificates), which run in sessions of their own."""
    needle = str(state_dir.resolve()).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmdline:
            found.append(int(entry.name))
    return found


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _pump(stream: IO[str], log: IO[str], lines: queue.Queue[str | None]) -> None:
    """Copy the devcluster's stdout to its log (and to `lines`), so the pipe never fills."""
    for line in stream:
        log.write(line)
        log.flush()
        lines.put(line)
    lines.put(None)


@contextmanager
def devcluster_process(
    topology: Mapping[str, Any] | str | Path,
    tmp_path: Path,
    *,
    timeout: float | None = None,
) -> Iterator[DevClusterProcess]:
    """Run `python -m fracspawner devcluster` (kube-apiserver, etcd, kube-scheduler,
    kube-controller-manager and the node agent; docs/controlplane.md) in its own process group;
    stop it on exit and check that none of its processes (pods' processes and the control
    plane's components included) is left behind."""
    if timeout is None:
        timeout = 180
    tmp_path = Path(tmp_path)
    tmp_path.mkdir(parents=True, exist_ok=True)
    if isinstance(topology, Mapping):
        topo_file = tmp_path / "topology.yaml"
        topo_file.write_text(yaml.safe_dump(dict(topology)))
    else:
        topo_file = Path(topology)
    kubeconfig = tmp_path / "kubeconfig"
    state_dir = tmp_path / "state"
    log_path = tmp_path / "devcluster.log"
    log = open(log_path, "w")  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fracspawner",
            "devcluster",
            "--topology",
            str(topo_file),
            "--kubeconfig",
            str(kubeconfig),
            "--state-dir",
            str(state_dir),
        ],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert process.stdout is not None
    lines: queue.Queue[str | None] = queue.Queue()
    pump = threading.Thread(target=_pump, args=(process.stdout, log, lines), daemon=True)
    pump.start()
    try:
        url = server = None
        deadline = time.monotonic() + timeout
        while url is None and (left := deadline - time.monotonic()) > 0:
            try:
                line = lines.get(timeout=left)
            except queue.Empty:
                break
            if line is None:  # stdout closed: the devcluster is exiting
                try:
                    process.wait(5)
                except subprocess.TimeoutExpired:
                    pass
                break
            if match := READY.search(line):
                url, server = match.group(1), match.group(3) or ""
        if url is None:
            why = f"exited {process.poll()}" if process.poll() is not None else "timed out"
            process.kill()
            process.wait(5)
            pump.join(5)
            log.flush()
            raise RuntimeError(
                f"devcluster did not start ({why}; log {log_path}):\n{log_path.read_text()[-3000:]}"
            )
        yield DevClusterProcess(url, kubeconfig, state_dir, process, server or url)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                pass
        left = sorted(set(_pod_processes(state_dir)) | set(_component_processes(state_dir)))
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if process.poll() is None:
            process.kill()
            process.wait(5)
        group_left = _group_alive(process.pid)
        if group_left:
            _signal_group(process.pid, signal.SIGKILL)
        pump.join(5)
        log.close()
        assert not left, f"devcluster left pod or component processes behind: {left}"
        assert not group_left, f"processes of the devcluster's group {process.pid} were left"


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
