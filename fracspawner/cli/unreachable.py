"""One line for an API server that does not answer, instead of aiohttp's
"Cannot connect to host 127.0.0.1:6443 ssl:default [Connect call failed ('127.0.0.1', 6443)]"
(issue 38 #5): which server, from which kube context, why, and what to check."""

from __future__ import annotations

import asyncio
import errno
import os
import socket
from pathlib import Path

from ..capacity.apiconfig import load_configuration

#: errno -> why, in words
_WHY = {
    errno.ECONNREFUSED: "connection refused",
    errno.ETIMEDOUT: "no answer (timed out)",
    errno.EHOSTUNREACH: "host unreachable",
    errno.ENETUNREACH: "network unreachable",
    errno.ECONNRESET: "connection reset",
}


def connection_failure(exc: BaseException) -> OSError | None:
    """The OS error under a failed connection (aiohttp's ClientConnectorError carries it), or
    None when `exc` is not one (an HTTP error, a bad answer: said as they are)."""
    try:
        from aiohttp import ClientConnectorError
    except ImportError:  # pragma: no cover - kubernetes_asyncio brings aiohttp
        return None
    if isinstance(exc, ClientConnectorError):
        return exc.os_error
    if isinstance(exc, (ConnectionError, socket.gaierror, TimeoutError, asyncio.TimeoutError)):
        return exc if isinstance(exc, OSError) else TimeoutError(errno.ETIMEDOUT, "timed out")
    return None


def _why(error: OSError) -> str:
    if isinstance(error, socket.gaierror):
        return "its host name does not resolve"
    if isinstance(error, TimeoutError) or error.errno == errno.ETIMEDOUT:
        return _WHY[errno.ETIMEDOUT]
    if error.errno in _WHY:
        return _WHY[error.errno]
    return os.strerror(error.errno).lower() if error.errno else str(error) or "failed"


def _context(kubeconfig: str | None) -> str:
    """ "kube context 'NAME' of FILE", or "in-cluster config"."""
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        return "in-cluster config"
    import yaml

    paths = [kubeconfig] if kubeconfig else None
    if paths is None:
        env = os.environ.get("KUBECONFIG", "")
        paths = [p for p in env.split(os.pathsep) if p] or [os.path.expanduser("~/.kube/config")]
    for path in paths:
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(data, dict) and data.get("current-context"):
            return f"kube context {data['current-context']!r} of {path}"
    return "kube context of " + ", ".join(paths)


def _server(kubeconfig: str | None) -> str:
    try:
        return asyncio.run(load_configuration(kubeconfig)).host or "the API server"
    except Exception:  # the same config loaded a moment ago; only the words are lost
        return "the API server"


def unreachable_line(exc: BaseException, kubeconfig: str | None) -> str | None:
    """'cannot connect to the Kubernetes API at URL (kube context 'X' of FILE): connection
    refused; check ...', or None when `exc` is no failure to connect."""
    error = connection_failure(exc)
    if error is None:
        return None
    return (
        f"cannot connect to the Kubernetes API at {_server(kubeconfig)} "
        f"({_context(kubeconfig)}): {_why(error)}; check the kube context "
        "(kubectl config current-context) and that the cluster is up"
    )
