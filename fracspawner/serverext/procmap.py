"""Map a GPU process id to the kernel that owns it, reading /proc directly.

A kernel's GPU work may run in the kernel process itself or in a child it started (a DataLoader
worker, a subprocess). Walking up the parent chain until a process whose command line names its
connection file `kernel-<id>.json` finds the owning kernel either way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

KERNEL_FILE = re.compile(r"kernel-([0-9a-fA-F-]{8,})\.json")
MAX_DEPTH = 64  # parent chains are short; this only guards against a corrupt /proc


@dataclass(frozen=True)
class Owner:
    kernel_id: str | None  # the first ipykernel ancestor's id (or the process itself)
    ancestors: frozenset[int]  # every pid on the chain, the process itself included


def parent_pid(pid: int, proc: Path = Path("/proc")) -> int | None:
    """The ppid field of /proc/<pid>/stat; None when the process is gone."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    # comm (field 2) is in parentheses and may hold spaces or ')': split after the LAST ')'
    fields = stat[stat.rfind(")") + 2 :].split()
    try:
        return int(fields[1])  # fields: state, ppid, ...
    except (IndexError, ValueError):
        return None


def kernel_id_of(pid: int, proc: Path = Path("/proc")) -> str | None:
    """The kernel id in the process's command line, if it is a kernel."""
    try:
        cmdline = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None
    for arg in cmdline.split(b"\0"):
        match = KERNEL_FILE.search(arg.decode("utf8", "replace"))
        if match:
            return match.group(1)
    return None


def owner_of(pid: int, proc: Path = Path("/proc")) -> Owner:
    """Walk from `pid` up to init, noting the first kernel on the way and every pid seen."""
    kernel_id = None
    seen: list[int] = []
    current: int | None = pid
    while current and current not in seen and len(seen) < MAX_DEPTH:
        seen.append(current)
        if kernel_id is None:
            kernel_id = kernel_id_of(current, proc)
        current = parent_pid(current, proc)
    return Owner(kernel_id=kernel_id, ancestors=frozenset(seen))
