"""`fracspawner demo` in a terminal that is closed: nothing of the demo survives (issue 38 #2).

A closed terminal window is a pty whose master end goes away: the kernel hangs the terminal up
and SIGHUPs the session leader (the interactive shell), which SIGHUPs its jobs and exits; the
kernel then SIGHUPs the terminal's foreground process group again as the session leader exits.
The demo gets SIGHUP twice, a few hundred microseconds apart; the second used to land in the
clean-up (KeyboardInterrupt at its `signal.signal(sig, SIG_IGN)`) and abort it, leaving the
devcluster, hub, proxy, services and servers running (3 times in 9). A race: run several times.
"""

from __future__ import annotations

import os
import pty
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from devcluster.localhub import free_port
from tests.test_demo import START_S, _processes_mentioning

pytestmark = pytest.mark.e2e

BANNER_END = b"Ctrl-C stops everything."


def _read_until(fd: int, needle: bytes, timeout: float) -> bytes:
    """Read the pty's output until `needle` shows (the pty must be drained: a full one blocks
    the demo's writes)."""
    seen = b""
    deadline = time.monotonic() + timeout
    while needle not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 1)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # EIO: the shell has gone
                break
            if not chunk:
                break
            seen += chunk
    return seen


def _interactive_shell() -> tuple[int, int]:
    """`bash -i` (job control on) on a new pty, as a terminal window starts it: (pid, master)."""
    pid, master = pty.fork()
    if pid == 0:  # the child: session leader with the pty as its controlling terminal
        env = {**os.environ, "PS1": "$ ", "HISTFILE": "/dev/null", "PYTHONUNBUFFERED": "1"}
        os.execvpe("bash", ["bash", "--norc", "--noprofile", "-i"], env)
    return pid, master


def _wait_gone(text: str, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := _processes_mentioning(text)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def _end(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.parametrize("attempt", range(3))
def test_closing_the_terminal_stops_the_whole_demo(tmp_path: Path, attempt: int) -> None:
    state = tmp_path / "demo-state"
    port = free_port()
    shell, master = _interactive_shell()
    try:
        command = (
            f"{sys.executable} -m fracspawner demo --port {port} --state-dir {state} "
            "--password pw\n"
        )
        os.write(master, command.encode())
        out = _read_until(master, BANNER_END, START_S)
        assert BANNER_END in out, out[-3000:].decode(errors="replace")
        assert _processes_mentioning(str(state))
    finally:
        os.close(master)  # the terminal window closes
    os.waitpid(shell, 0)
    left = _wait_gone(str(state), 90)
    _end(left)
    assert not left, f"the demo left {len(left)} processes running after its terminal closed"
    # and the port is free again for the next `make demo` (SO_REUSEADDR, as servers bind: the
    # closed connections' TIME_WAIT does not hold it)
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", port))


# The race above, made certain: the demo's main() with a fake cluster and hub, in a process of its
# own. The first SIGHUP comes while it serves; once it has said it is stopping, another arrives
# before each line main() runs from then on (a closed terminal's second SIGHUP landed at the
# clean-up's first line), and more, with a Ctrl-C, while the hub stops.
SIGNALS_DURING_CLEAN_UP = r"""
import os, signal, sys, time
import devcluster.demo as demo

done = []
stopping = []

def hangup():
    os.kill(os.getpid(), signal.SIGHUP)  # handled before os.kill returns

class Process:
    calls = 0
    ready_file = "cluster-ready"
    def wait_ready(self):
        pass
    def poll(self):
        Process.calls += 1
        if Process.calls == 2:
            hangup()
        return None

class Hub:
    url = "http://127.0.0.1:1"
    log_path = "hub.log"
    process = Process()
    def stop(self, grace):
        hangup()
        os.kill(os.getpid(), signal.SIGINT)
        done.append("hub")

said = demo._say
def say(text):
    said(text)
    if "stopping" in text:
        stopping.append(True)

def trace_main(frame, event, arg):
    return each_line if frame.f_code is demo.main.__code__ else None

def each_line(frame, event, arg):
    if event == "line" and stopping:
        hangup()
    return each_line

demo._say = say
demo.start_devcluster = lambda topology, state_dir: Process()
demo.launch_hub = lambda **kwargs: Hub()
demo.wait_hub = lambda hub, timeout: hub
demo.stop_process = lambda proc: done.append("cluster")
sys.settrace(trace_main)
try:
    demo.main(["--state-dir", sys.argv[1], "--password", "pw", "--port", sys.argv[2]])
finally:
    sys.settrace(None)
    print("cleaned up:", ",".join(done), flush=True)
"""


def test_a_second_sighup_during_the_clean_up_does_not_abort_it(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-c", SIGNALS_DURING_CLEAN_UP, str(tmp_path), str(free_port())],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "cleaned up: hub,cluster" in run.stdout, run.stdout + run.stderr[-3000:]
    assert run.returncode == 0, run.stderr[-3000:]


def _demo_refusal(state: Path, port: int, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fracspawner", "demo", "--port", str(port)]
        + ["--state-dir", str(state), "--password", "pw"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )


def test_a_control_plane_not_built_is_said_before_anything_starts(tmp_path: Path) -> None:
    """`fracspawner demo` without `make controlplane` (or with a binary that is not there): one
    line saying what is missing, no password, nothing started."""
    state = tmp_path / "demo-state"
    run = _demo_refusal(state, free_port(), FRACSPAWNER_CONTROLPLANE_BIN=str(tmp_path / "none"))
    assert run.returncode == 1, run.stdout + run.stderr
    assert "password" not in run.stdout, run.stdout
    assert run.stderr.strip() == (
        f"fracspawner demo: FRACSPAWNER_CONTROLPLANE_BIN={tmp_path / 'none'} is not an "
        "executable file"
    ), run.stderr
    assert not (state / "devcluster.log").exists() and not (state / "hub").exists()


LISTEN = "import socket, sys, time; s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1])))\n"
LISTEN += "s.listen(); time.sleep(300)"


def test_a_demo_left_running_is_named_instead_of_a_new_password(tmp_path: Path) -> None:
    """The hub of a demo whose clean-up never ran holds the port (and answers 403): the next
    demo says so and what to stop, and prints no password that would not work."""
    state = tmp_path / "demo-state"
    port = free_port()
    # a leftover "hub": listens on the port, its command line names a file in the state dir
    hub = subprocess.Popen(
        [sys.executable, "-c", LISTEN, str(port), str(state / "hub" / "jupyterhub_config.py")]
    )
    try:
        time.sleep(1)
        run = _demo_refusal(state, port)
    finally:
        hub.kill()
        hub.wait()
    assert run.returncode == 1, run.stdout + run.stderr
    assert "password" not in run.stdout, run.stdout
    assert "an earlier demo is still running" in run.stderr, run.stderr
    assert f"port {port} is taken" in run.stderr and f"kill {hub.pid}" in run.stderr, run.stderr


def test_a_port_taken_by_another_program_is_said(tmp_path: Path) -> None:
    port = free_port()
    other = subprocess.Popen([sys.executable, "-c", LISTEN, str(port)])
    try:
        time.sleep(1)
        run = _demo_refusal(tmp_path / "demo-state", port)
    finally:
        other.kill()
        other.wait()
    assert run.returncode == 1 and "password" not in run.stdout, run.stdout + run.stderr
    assert f"port {port} on 127.0.0.1 is in use by another program" in run.stderr, run.stderr
