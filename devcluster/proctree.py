"""The processes a process started, and ending them all: a hub starts the proxy and its
services in process groups of their own (JupyterHub's LocalProcessSpawner and the proxy's
`start_new_session`), so killing the hub's group leaves them running, reparented to init, when
the hub is killed before its own clean-up stopped them (issue 27 #2)."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Proc:
    """A process by pid and start time: a pid reused by a newer process is not this one."""

    pid: int
    started: int

    def alive(self) -> bool:
        stat = _stat(self.pid)
        return stat is not None and stat[2] == self.started and stat[0] != "Z"


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, starttime) from /proc/<pid>/stat (proc(5): fields 3, 4 and 22)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw.rsplit(") ", 1)[1].split()  # the command name may hold spaces and ')'
    return fields[0], int(fields[1]), int(fields[19])


def proc(pid: int) -> Proc | None:
    """The living process `pid` (with its start time), None when there is none."""
    stat = _stat(pid)
    return None if stat is None or stat[0] == "Z" else Proc(pid, stat[2])


def descendants(root: int) -> list[Proc]:
    """Every living descendant of `root`, parents before children."""
    children: dict[int, list[int]] = {}
    started: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        stat = _stat(int(entry.name))
        if stat is None or stat[0] == "Z":
            continue
        children.setdefault(stat[1], []).append(int(entry.name))
        started[int(entry.name)] = stat[2]
    found: list[Proc] = []
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop(0)
        if pid in started:
            found.append(Proc(pid, started[pid]))
            todo.extend(children.get(pid, []))
    return found


def end_all(procs: list[Proc], grace: float = 5.0) -> None:
    """SIGTERM those still alive, SIGKILL what is left after `grace` seconds. Each one's
    process group goes too where it leads one (a service's own children)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        left = [p for p in procs if p.alive()]
        if not left:
            return
        for proc in left:
            _signal(proc, sig)
        if sig == signal.SIGTERM:
            deadline = time.monotonic() + grace
            while any(p.alive() for p in left) and time.monotonic() < deadline:
                time.sleep(0.05)


def _signal(proc: Proc, sig: int) -> None:
    try:
        if os.getpgid(proc.pid) == proc.pid:
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
