"""The demo's cluster: the real Kubernetes control plane with the node agent running its pods
(`fracspawner devcluster`, devcluster/realcluster.py), started in a process
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
    """`fracspawner devcluster`'s cluster (realcluster.run) by this module's main, which skips
    the `fracspawner` command's own start-up."""
    return [
        sys.executable, "-m", "devcluster.democluster", str(topology),
        str(state_dir / "cluster"), str(state_dir / "kubeconfig"),
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
    """The cluster's process has exited: its status and its log's last lines."""
    return ClusterFailed(
        f"the demo's cluster exited with {proc.returncode}; the last lines of {log_path}:\n"
        + log_tail(log_path, 30)
    )


class DemoCluster:
    """The cluster's process while it starts and serves: `wait_ready()` says its progress until it
    serves, then writes `ready_file` (the hub, started beside it, waits for that file)."""

    def __init__(
        self, proc: subprocess.Popen, log_path: Path, ready_file: Path, say: Callable[[str], None]
    ) -> None:
        self.proc = proc
        self.log_path = log_path
        self.ready_file = ready_file
        self.say = say
        self.started = time.monotonic()
        self._ready = threading.Event()
        self._follower = LogFollower(log_path)
        threading.Thread(target=self._read_stdout, daemon=True, name="devcluster-stdout").start()

    def _read_stdout(self) -> None:  # the READY line comes on stdout; drained to its end
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if READY.search(line):
                self._ready.set()

    def poll(self) -> int | None:
        return self.proc.poll()

    def elapsed(self) -> str:
        return f"[{time.monotonic() - self.started:5.1f} s]"

    def _relay(self) -> None:
        for line in self._follower.new_lines():
            if line.startswith(PROGRESS):
                self.say(f"  {self.elapsed()} {line.removeprefix(PROGRESS)}")

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        """Say the cluster's progress until it serves; ClusterFailed if it exits or is late."""
        while not self._ready.wait(0.25):
            self._relay()
            if self.proc.poll() is not None:
                time.sleep(0.2)  # its last lines reach the log
                self._relay()
                raise exited(self.proc, self.log_path)
            if time.monotonic() - self.started > timeout:
                raise ClusterFailed(
                    f"the demo's cluster did not start in {timeout:.0f} s; the last lines of "
                    f"{self.log_path}:\n{log_tail(self.log_path, 30)}"
                )
        self._relay()
        self.ready_file.write_text("ready\n")
        self.say(f"  {self.elapsed()} cluster ready")


def start_devcluster(
    topology: Path,
    state_dir: Path,
    say: Callable[[str], None] = lambda text: print(text, flush=True),
) -> DemoCluster:
    """Start the cluster in its own process group (its admin kubeconfig will be at
    `<state_dir>/kubeconfig`); `wait_ready()` on the answer waits until it serves."""
    try:
        find_binary()  # before anything starts: one line saying how to build it
    except BinaryMissing as err:
        raise ClusterFailed(str(err)) from None
    ready_file = state_dir / "cluster-ready"
    ready_file.unlink(missing_ok=True)  # an earlier demo's
    log_path = state_dir / "devcluster.log"
    log = open(log_path, "w")  # noqa: SIM115 - lives as long as the process
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
    return DemoCluster(proc, log_path, ready_file, say)


def hub_waits_for(ready_file: Path) -> str:
    """Hub configuration that holds the hub until the cluster is ready: the demo starts the hub
    beside the cluster, so that its imports (JupyterHub, kubespawner, fracspawner: 20 s on a
    busy 2-core machine) overlap the control plane's start. At the end of the configuration,
    before the hub reads the kubeconfig or starts its services."""
    return f"""
import os as _os, time as _time  # noqa: E401
while not _os.path.exists({str(ready_file)!r}):
    _time.sleep(0.2)
"""


def stop_process(cluster: DemoCluster, timeout: float = 30) -> None:
    """SIGTERM the cluster (it stops the node agent's pods, then the control plane, etcd last),
    then SIGKILL whatever is left in its process group."""
    proc = cluster.proc
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


def main(argv: list[str]) -> int:
    """`python -m devcluster.democluster TOPOLOGY STATE_DIR KUBECONFIG`: the real cluster in the
    foreground, as `fracspawner devcluster` runs it."""
    from .realcluster import run

    if len(argv) != 3:
        print(
            "usage: python -m devcluster.democluster TOPOLOGY STATE_DIR KUBECONFIG", file=sys.stderr
        )
        return 2
    topology, state, kubeconfig = (Path(arg) for arg in argv)
    return run(topology, state, kubeconfig)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
