"""Container probes and the restart back-off (issue 29 item 3).

Probes as the kubelet's prober runs them (kubernetes pkg/kubelet/prober/prober.go runProbe,
worker.go doProbe; pkg/probe/http, tcp, exec): httpGet succeeds on a status in [200, 400),
tcpSocket on a connection, exec on exit code 0; each is tried every `periodSeconds` (10) after
`initialDelaySeconds` (0) with `timeoutSeconds` (1), and the result flips after
`successThreshold` (1) successes or `failureThreshold` (3) failures. Failure messages read as the
kubelet's `Unhealthy` events print them after "Readiness probe failed: ".

The back-off is the kubelet's crash-loop back-off (pkg/kubelet/kuberuntime/kuberuntime_manager.go
doBackOff with flowcontrol.Backoff, initial 10 s doubling to 5 min; pkg/kubelet/kubelet.go
backOffPeriod/MaxContainerBackOff): the first restart is at once, later ones wait 10 s, 20 s, ...
up to 5 min; a container that ran for twice the maximum starts from the beginning again.
"""

from __future__ import annotations

import asyncio
import http.client
import socket
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

#: (initial, maximum) seconds of the crash-loop back-off, as the kubelet's defaults
DEFAULT_BACKOFF = (10.0, 300.0)


@dataclass
class Probe:
    spec: Mapping[str, Any]
    initial_delay: float
    period: float
    timeout: float
    success_threshold: int
    failure_threshold: int

    @classmethod
    def of(cls, spec: Mapping[str, Any] | None) -> Probe | None:
        if not spec:
            return None
        return cls(
            spec,
            float(spec.get("initialDelaySeconds") or 0),
            float(spec.get("periodSeconds") or 10),
            float(spec.get("timeoutSeconds") or 1),
            int(spec.get("successThreshold") or 1),
            int(spec.get("failureThreshold") or 3),
        )


def _port(value: Any, container: Mapping[str, Any]) -> int:
    """A probe's port: a number, or the name of one of the container's ports."""
    if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
        return int(value)
    for port in container.get("ports") or []:
        if port.get("name") == value:
            return int(port["containerPort"])
    raise ValueError(f"couldn't find port: {value} in {container.get('name')}")


def _http(ip: str, spec: Mapping[str, Any], container: Mapping[str, Any], timeout: float):
    host = spec.get("host") or ip
    port = _port(spec.get("port"), container)
    path = spec.get("path") or "/"
    scheme = (spec.get("scheme") or "HTTP").lower()
    url = f"{scheme}://{host}:{port}{path}"
    if scheme == "https":  # the kubelet does not verify a probe's certificate
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            host, port, timeout=timeout, context=context
        )
    else:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
    headers = {h["name"]: h["value"] for h in spec.get("httpHeaders") or []}
    headers.setdefault("User-Agent", "kube-probe/1.34")
    try:
        conn.request("GET", path, headers=headers)
        status = conn.getresponse().status
    except (ConnectionRefusedError, OSError) as exc:
        reason = "connection refused" if isinstance(exc, ConnectionRefusedError) else str(exc)
        if isinstance(exc, (TimeoutError, socket.timeout)):
            reason = "context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
            return False, f'Get "{url}": {reason}'
        return False, f'Get "{url}": dial tcp {host}:{port}: connect: {reason}'
    finally:
        conn.close()
    if 200 <= status < 400:
        return True, ""
    return False, f"HTTP probe failed with statuscode: {status}"


def _tcp(ip: str, spec: Mapping[str, Any], container: Mapping[str, Any], timeout: float):
    host = spec.get("host") or ip
    port = _port(spec.get("port"), container)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True, ""
    except ConnectionRefusedError:
        return False, f"dial tcp {host}:{port}: connect: connection refused"
    except OSError as exc:
        return False, f"dial tcp {host}:{port}: {exc}"


async def run(
    probe: Probe,
    ip: str,
    container: Mapping[str, Any],
    env: Mapping[str, str],
    cwd: str,
    beside: Callable[[list[str]], list[str]] = lambda command: command,
) -> tuple[bool, str]:
    """One try: (succeeded, the failure's message). `beside`: an exec probe's command in the
    container's namespaces (kubelet.Running.beside), as the runtime runs it in the container."""
    spec = probe.spec
    try:
        if "httpGet" in spec:
            return await asyncio.to_thread(_http, ip, spec["httpGet"], container, probe.timeout)
        if "tcpSocket" in spec:
            return await asyncio.to_thread(_tcp, ip, spec["tcpSocket"], container, probe.timeout)
        if "exec" in spec:
            command = list(spec["exec"].get("command") or [])
            return await _exec(command, beside(command), env, cwd, probe.timeout)
    except ValueError as exc:
        return False, str(exc)
    return True, ""  # grpc: not modelled, counts as passing


async def _exec(
    command: list[str], argv: list[str], env: Mapping[str, str], cwd: str, timeout: float
) -> tuple[bool, str]:
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            env=dict(env),
            cwd=cwd,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError as exc:
        return False, f'exec: "{command[0] if command else ""}": {exc.strerror or exc}'
    try:
        output, _ = await asyncio.wait_for(process.communicate(), timeout)
    except asyncio.TimeoutError:
        process.kill()
        await process.wait()
        return False, f"command timed out after {timeout:g}s"
    if process.returncode == 0:
        return True, ""
    return False, output.decode(errors="replace").strip()


def next_backoff(
    previous: float | None, ran_for: float, backoff: tuple[float, float] = DEFAULT_BACKOFF
) -> float:
    """The wait before the next restart: 0 for the first (and after a long run), then the
    initial back-off, doubling to the maximum."""
    initial, maximum = backoff
    if previous is None or ran_for > 2 * maximum:
        return 0.0
    if previous == 0:
        return initial
    return min(previous * 2, maximum)


class Tracker:
    """A probe's schedule and thresholds for one container run."""

    def __init__(self, probe: Probe, started_at: float, initially: bool | None) -> None:
        """`initially`: the result before any try; None (unknown) lets either threshold flip
        it, as a startup probe's must (failureThreshold failures kill the container)."""
        self.probe = probe
        self.next_at = started_at + probe.initial_delay
        self.result = initially
        self.successes = 0
        self.failures = 0

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def record(self, ok: bool, now: float) -> bool | None:
        """Count a try; the new result where it flips, else None."""
        self.next_at = now + self.probe.period
        if ok:
            self.successes, self.failures = self.successes + 1, 0
            if not self.result and self.successes >= self.probe.success_threshold:
                self.result = True
                return True
        else:
            self.failures, self.successes = self.failures + 1, 0
            if self.result is not False and self.failures >= self.probe.failure_threshold:
                self.result = False
                return False
        return None
