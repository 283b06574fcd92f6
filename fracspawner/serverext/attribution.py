"""Whose is each GPU process in a reading: one of the server's kernels, the server, or unknown.

- A process whose ancestors include one of the server's kernels is that kernel's (a DataLoader
  worker, a subprocess); one under the server process is the server's (a terminal's python).
- In a pod with its own PID namespace (a container: the default) every process the server can
  see in /proc is the pod's, so the server's too: a `nohup` job whose parent exited and that was
  re-parented to PID 1 (tini in the Jupyter images) still counts. Where servers share the host's
  PID namespace (local spawners, the devcluster), such a process may be another user's: ignored.
- A PID that is not in /proc at all (drivers before 535.113.01 report host PIDs inside a
  container: NVIDIA/nvidia-docker#1483), or no PID, is "unmatched": its work may well be this
  server's, so busy or unknown unmatched work makes the server's GPU activity unknown, never idle.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .procmap import owner_of
from .sources import GpuSample

# the initial PID namespace's inode number (PROC_PID_INIT_INO, include/linux/proc_ns.h)
INIT_PID_NAMESPACE_INODE = 0xEFFFFFFC


def has_own_pid_namespace(proc: Path = Path("/proc")) -> bool:
    """Whether this process runs in a PID namespace of its own (a container), not the host's."""
    try:
        return os.stat(proc / "self" / "ns" / "pid").st_ino != INIT_PID_NAMESPACE_INODE
    except OSError:  # no /proc/self/ns (not Linux): assume a shared namespace, the strict side
        return False


@dataclass
class Attribution:
    owned: list[tuple[str | None, Any]] = field(default_factory=list)  # (kernel id or None, p)
    unmatched: list[Any] = field(default_factory=list)  # processes nobody here can place


def attribute(
    sample: GpuSample,
    kernel_ids: set[str],
    server_pid: int,
    *,
    own_namespace: bool = False,
    proc: Path = Path("/proc"),
) -> Attribution:
    """Sort the reading's processes into the server's (per kernel), unmatched, and others'."""
    result = Attribution()
    for p in sample.processes:
        if p.kernel_id is not None:  # simulated by kernel id: another server's kernel otherwise
            if p.kernel_id in kernel_ids:
                result.owned.append((p.kernel_id, p))
            continue
        if not p.pid or not (proc / str(p.pid)).exists():
            result.unmatched.append(p)
            continue
        owner = owner_of(p.pid, proc)
        if owner.kernel_id in kernel_ids:
            result.owned.append((owner.kernel_id, p))
        elif server_pid in owner.ancestors or own_namespace:
            result.owned.append((None, p))
    return result
