"""The demo's cluster: the real Kubernetes control plane with the node agent running its pods
(`fracspawner devcluster --control-plane real`, devcluster/realcluster.py), started in a process
group of its own, with its progress said on the demo's screen as it happens (issue 35).

The devcluster's own lines go to `<state>/devcluster.log`; while it starts, its progress lines
(each component starting, the control plane ready, each node registered) are read back from that
log and said with the seconds since the start. A cluster that exits, at the start or later, is
reported with the log's last lines: a control-plane component that died is named there with the
last lines of its own log (devcluster/controlplane/processes.py).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from .controlplane.binary import BinaryMissing, find_binary, kubernetes_pin
from .controlplane.processes import log_tail

READY = re.compile(r"devcluster ready: (\S+) kubeconfig=(\S+)")
#: the devcluster's progress lines in its log (realcluster.run's `say`)
PROGRESS = "devcluster: "
#: a loaded 2-core machine starts the cluster in 15-40 s; a first start in a fresh state dir
#: waits longer for etcd's first fsyncs
START_TIMEOUT = 180.0


class ClusterFailed(RuntimeError):
    """The demo's cluster did not start, or exited: the message has its log's last lines."""


def cluster_command(topology: Path, state_dir: Path) -> list[str]:
    return [
        sys.executable, "-m", "fracspawner", "devcluster", "--control-plane", "real",
        "--topology", str(topology), "--port", "0",
        "--kubeconfig", str(state_dir / "kubeconfig"), "--state-dir", str(state_dir / "cluster"),
    ]  # fmt: skip


class LogFollower:
    """The whole lines appended to a file since the last call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""

    def new_lines(self) -> list[str]:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except OSError:
            return []
        self.offset += len(chunk)
        *lines, self.partial = (self.partial + chunk).split(b"\n")
        return [line.decode(errors="replace") for line in lines]


def exited(proc: subprocess.Popen, log_path: Path) -> ClusterFailed:
    return ClusterFailed(
        f"the demo's cluster exited with {proc.returncode}; the last lines of {log_path}:\n"
        + log_tail(log_path, 30)
    )


def start_devcluster(
    topology: Path,
    state_dir: Path,
    timeout: float = START_TIMEOUT,
    say: Callable[[str], None] = lambda text: print(text, flush=True),
) -> subprocess.Popen:
    """Start the cluster in its own process group, saying its progress; return once it serves
    (its admin kubeconfig at `<state_dir>/kubeconfig`)."""
    try:
        find_binary()  # before anything starts: one line saying how to build it
    except BinaryMissing as err:
        raise ClusterFailed(str(err)) from None
    log_path = state_dir / "devcluster.log"
    log = open(log_path, "w")  # noqa: SIM115 - lives as long as the process
    started = time.monotonic()
    say(
        f"  starting Kubernetes {kubernetes_pin()} (etcd, kube-apiserver, kube-scheduler, "
        "kube-controller-manager) and the node agent that runs the demo's pods..."
    )
    proc = subprocess.Popen(
        cluster_command(topology, state_dir),
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        start_new_session=True,
        # the demo has no GPU: its GPU pods read a simulated one, so the JupyterLab meter and
        # its warnings can be seen (devcluster/kubelet.py simulated_gpu_env, which the node
        # agent's runner applies; demo only)
        env={**os.environ, "DEVCLUSTER_SIMULATED_GPU": "1"},
    )
    ready = threading.Event()

    def read_stdout() -> None:  # the READY line comes on stdout; drained to its end
        assert proc.stdout is not None
        for line in proc.stdout:
            if READY.search(line):
                ready.set()

    threading.Thread(target=read_stdout, daemon=True, name="devcluster-stdout").start()
    follower = LogFollower(log_path)

    def relay() -> None:
        for line in follower.new_lines():
            if line.startswith(PROGRESS):
                say(f"  [{time.monotonic() - started:5.1f} s] {line.removeprefix(PROGRESS)}")

    try:
        while not ready.wait(0.25):
            relay()
            if proc.poll() is not None:
                time.sleep(0.2)  # its last lines reach the log
                relay()
                raise exited(proc, log_path)
            if time.monotonic() - started > timeout:
                raise ClusterFailed(
                    f"the demo's cluster did not start in {timeout:.0f} s; the last lines of "
                    f"{log_path}:\n{log_tail(log_path, 30)}"
                )
        relay()
        say(f"  [{time.monotonic() - started:5.1f} s] cluster ready")
        return proc
    except BaseException:  # Ctrl-C or SIGTERM while it starts: not left running
        stop_process(proc)
        raise


def stop_process(proc: subprocess.Popen, timeout: float = 30) -> None:
    """SIGTERM the cluster (it stops the node agent's pods, then the control plane, etcd last),
    then SIGKILL whatever is left in its process group."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
