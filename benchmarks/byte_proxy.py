"""A TCP forwarder that counts the bytes an API server sends to one client (the hub), for the
scale benchmark's "API-server bytes per idle hour" (issue 37). It forwards TLS untouched: the
kubeconfig it writes differs from the cluster's only in the port, so certificates still match.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Any

import yaml


class ByteProxy:
    """Listen on a loopback port and forward each connection to `target` (host, port),
    counting bytes in both directions (`received`: what the server sent to the client)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.received = 0
        self.sent = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            threading.Thread(target=self._pipe, args=(server, client, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(client, server, False), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, downstream: bool) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
                with self._lock:
                    if downstream:
                        self.received += len(data)
                    else:
                        self.sent += len(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def write_kubeconfig(self, original: Path, to: Path) -> Path:
        """A copy of `original` whose clusters point at this proxy."""
        config: dict[str, Any] = yaml.safe_load(original.read_text())
        for entry in config.get("clusters") or []:
            server = entry["cluster"]["server"]
            scheme, rest = server.split("://", 1)
            host = rest.split("/", 1)[0].rsplit(":", 1)[0]
            entry["cluster"]["server"] = f"{scheme}://{host}:{self.port}"
        to.write_text(yaml.safe_dump(config))
        return to

    def close(self) -> None:
        self._closed = True
        self._listener.close()


def target_of(kubeconfig: Path) -> tuple[str, int]:
    """The (host, port) of the kubeconfig's first cluster."""
    config = yaml.safe_load(kubeconfig.read_text())
    server = config["clusters"][0]["cluster"]["server"]
    scheme, rest = server.split("://", 1)
    host, _, port = rest.split("/", 1)[0].rpartition(":")
    return host.strip("[]"), int(port or (443 if scheme == "https" else 80))
