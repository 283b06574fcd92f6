"""Before a demo starts: is an earlier demo still running, or is the port taken?

A demo killed before its clean-up ran (SIGKILL, or a closed terminal before issue 38 #2) leaves
its hub holding the port; the next `make demo` then printed a new password while the old hub
answered every login with 403. The demo refuses to start instead and says what holds what.
"""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path


def processes_using(state_dir: Path) -> list[int]:
    """Other processes whose command line or environment names `state_dir` (all the demo
    starts do: the devcluster's --state-dir, the hub's -f config, its servers' KUBECONFIG)."""
    needle = (str(state_dir.resolve()) + os.sep).encode()
    mine = {os.getpid(), os.getppid()}
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone, or another user's
            continue
        if needle in cmdline + b" " or needle in environ.replace(b"\0", b" "):
            found.append(int(entry.name))
    return sorted(found)


def port_taken(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something listens on host:port (SO_REUSEADDR, as servers bind: connections of a
    stopped server in TIME_WAIT do not count)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True
            raise
    return False


def why_not_start(state_dir: Path, port: int) -> str | None:
    """None when the demo may start; else what stands in its way, in words, with what to do."""
    left = processes_using(state_dir)
    if left:
        pids = " ".join(str(p) for p in left)
        taken = f", and port {port} is taken" if port_taken(port) else ""
        return (
            f"an earlier demo is still running: {len(left)} processes use its state directory "
            f"{state_dir}{taken}. No new demo was started (its password would not work while "
            f"the old hub answers). Stop them with:\n    kill {pids}\n"
            "then start the demo again."
        )
    if port_taken(port):
        return (
            f"port {port} on 127.0.0.1 is in use by another program, so no demo was started. "
            "Pick another port: `make demo PORT=8080` (or `fracspawner demo --port 8080`)."
        )
    return None
