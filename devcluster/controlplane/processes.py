"""The component processes of one cluster: started with their logs in files, watched, and ended.

Each component runs in a session of its own (a terminal's Ctrl-C reaches the launcher, which
stops them in order) and is asked by the kernel to die with its launcher (PR_SET_PDEATHSIG), so
a launcher killed outright leaves no etcd or apiserver behind. Start a cluster from a thread
that lives as long as it: the death signal follows the thread that started the process.
"""

from __future__ import annotations

import ctypes
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from devcluster.proctree import Proc, end_all, proc

PR_SET_PDEATHSIG = 1
#: loaded here, not in the child: between fork and exec only the prctl call itself runs
_LIBC = ctypes.CDLL(None, use_errno=True)


class ComponentDied(RuntimeError):
    """A component exited while the cluster should be running; the message has its log's tail."""


def _die_with_parent() -> None:
    _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def log_tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


@dataclass
class Component:
    name: str
    argv: list[str]
    log: Path
    process: subprocess.Popen | None = field(default=None, repr=False)
    proc: Proc | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,  # prctl only: safe between fork and exec
            )
        self.proc = proc(self.process.pid) or Proc(self.process.pid, 0)

    def check(self) -> None:
        """ComponentDied if the process exited, with its exit status and its log's last lines."""
        if self.process is None:
            return
        code = self.process.poll()
        if code is not None:
            raise ComponentDied(
                f"{self.name} exited with status {code}; last lines of {self.log}:\n"
                f"{log_tail(self.log)}"
            )

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM, SIGKILL after `grace` seconds; reaped, so no zombie stays behind."""
        if self.process is None or self.proc is None:
            return
        end_all([self.proc], grace=grace)
        try:
            self.process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
