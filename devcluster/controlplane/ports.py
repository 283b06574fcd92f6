"""Loopback ports for one cluster's components that no other cluster on this machine takes.

A port is reserved by holding an exclusive flock on a file named after it in a shared lock
directory (devcluster/filelock.py) for as long as the cluster runs: a second cluster (another
test worker, a test run beside the demo) that draws the same port fails the lock and draws
again, and a crashed cluster's reservations vanish with its process. Ports come from above the
kernel's ephemeral range so no outgoing connection is handed one between our check and the
component's bind.
"""

from __future__ import annotations

import random
import socket
import tempfile
from pathlib import Path

from devcluster import filelock

LOCK_DIR = Path(tempfile.gettempdir()) / "fracspawner-controlplane-ports"


def _candidate_range() -> range:
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    if 65535 - high >= 500:
        return range(high + 1, 65536)
    return range(max(1024, low - 10000), low)


def listening_free(port: int) -> bool:
    """Nothing listens there. SO_REUSEADDR as Go's listeners set it: connections of a stopped
    cluster still in TIME_WAIT do not keep the port from the next one."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class PortReservation:
    """`count` ports held until release() (or this process ends)."""

    def __init__(self, count: int, lock_dir: Path = LOCK_DIR) -> None:
        lock_dir.mkdir(parents=True, exist_ok=True)
        self._files: list[filelock.HeldLock] = []
        self.ports: list[int] = []
        candidates = list(_candidate_range())
        random.shuffle(candidates)
        for port in candidates:
            if len(self.ports) == count:
                break
            held = filelock.claim(lock_dir, str(port))
            if held is None:  # another cluster's
                continue
            if not listening_free(port):
                held.close()
                continue
            self._files.append(held)
            self.ports.append(port)
        if len(self.ports) < count:
            self.release()
            span = f"{min(candidates)}-{max(candidates)}"
            raise RuntimeError(f"no {count} free loopback ports in {span}")

    def release(self) -> None:
        for held in self._files:
            held.close()
        self._files.clear()
