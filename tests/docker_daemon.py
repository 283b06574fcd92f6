"""A Docker daemon of the tests' own: Debian's dockerd (package docker.io) on a private socket,
started and stopped by the test session (tests/test_images.py) or `make images`.

It touches nothing of the machine's networking, so the browser tests running beside it see no
network change (issue 34 #12): no bridge (`--bridge=none`), no iptables rules; builds use the
host's network (`docker build --network host`), containers run with `--network none`. Its
images and build cache live under `data_root` (kept between runs: tests/image_builds.py), its
sockets and state under a fresh short directory in /tmp (a unix socket path must stay under 108
bytes), removed on stop. `stop()` waits until dockerd and the containerd it started are gone:
no daemon outlives the test session.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: Debian's docker CLI is the one paired with its dockerd (the machine may have a newer one first
#: in PATH); the classic builder with DOCKER_BUILDKIT=1 is BuildKit (no buildx plugin needed)
DOCKER_CLI = "/usr/bin/docker"
#: where Debian's dockerd is when /usr/sbin is not in PATH (a non-login root shell)
DOCKERD_FALLBACK = "/usr/sbin/dockerd"


class DockerUnavailable(Exception):
    """No daemon can be had here; the message is one line saying what is missing."""


def require_tools() -> str:
    """The dockerd to run, or DockerUnavailable naming what is missing."""
    if os.geteuid() != 0:
        raise DockerUnavailable(
            "dockerd needs root here (no rootless set-up): run the tests as root"
        )
    dockerd = shutil.which("dockerd") or (
        DOCKERD_FALLBACK if os.access(DOCKERD_FALLBACK, os.X_OK) else None
    )
    if not dockerd or not os.access(DOCKER_CLI, os.X_OK):
        raise DockerUnavailable(
            "dockerd is not installed (apt-get install docker.io; make system-deps)"
        )
    return dockerd


class DockerDaemon:
    """One running dockerd; `docker(...)` runs Debian's CLI against it."""

    def __init__(self, data_root: Path, storage_driver: str = "overlay2") -> None:
        self.data_root = data_root
        self.storage_driver = storage_driver
        self.run_dir = Path(tempfile.mkdtemp(prefix="fsdk-", dir="/tmp"))
        self.socket = self.run_dir / "docker.sock"
        self.log_path = self.run_dir / "dockerd.log"
        self.process: subprocess.Popen | None = None

    @property
    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "DOCKER_HOST": f"unix://{self.socket}",
            "DOCKER_BUILDKIT": "1",
            # the CLI's own state (contexts, auth) stays out of the user's ~/.docker
            "DOCKER_CONFIG": str(self.run_dir / "cli"),
        }

    def start(self, timeout: float = 60) -> None:
        dockerd = require_tools()
        self.data_root.mkdir(parents=True, exist_ok=True)
        self._end_stale()
        command = [
            dockerd,
            "--iptables=false",
            "--ip6tables=false",
            "--bridge=none",
            f"--storage-driver={self.storage_driver}",
            f"--data-root={self.data_root}",
            f"--exec-root={self.run_dir / 'exec'}",
            f"--pidfile={self.run_dir / 'dockerd.pid'}",
            f"--host=unix://{self.socket}",
            # no /etc/docker/daemon.json of the machine's: this daemon is the tests' alone
            f"--config-file={self._config_file()}",
        ]
        with open(self.log_path, "wb") as log:
            # a process group of its own: a Ctrl-C meant for pytest does not kill it mid-build
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise DockerUnavailable(f"dockerd did not start: {self._why()}")
            if self.socket.exists() and self.docker("version", check=False).returncode == 0:
                return
            time.sleep(0.3)
        self.stop()
        raise DockerUnavailable(f"dockerd did not answer within {timeout:.0f} s: {self._why()}")

    def _end_stale(self) -> None:
        """A dockerd this harness started on the same data root in a run that was killed
        (SIGKILL leaves no chance to stop it) would hold the data root: end it. Callers that
        share a data root hold a lock (tests/image_builds.py), so one running now is stale."""
        needle = f"--data-root={self.data_root}".encode()
        stale = []
        for entry in Path("/proc").iterdir():
            try:
                args = (entry / "cmdline").read_bytes().split(b"\0") if entry.name.isdigit() else []
            except OSError:
                continue
            if args and args[0].endswith(b"dockerd") and needle in args:
                stale.append(int(entry.name))
        for pid in stale:
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while stale and time.monotonic() < deadline:
            stale = [pid for pid in stale if _alive(pid)]
            time.sleep(0.2)

    def _config_file(self) -> Path:
        path = self.run_dir / "daemon.json"
        path.write_text("{}\n")
        return path

    def _why(self) -> str:
        """Why dockerd failed, from its log: the line it exits with ("failed to start daemon:
        ...", printed without logrus's fields), else its first fatal or error line. Not the
        last error: shutting down after the cause, dockerd logs more (a busy machine's run
        ended on libcontainerd's "Failed to get event ... transport is closing", after the
        storage driver's error)."""
        lines = (
            self.log_path.read_text(errors="replace").splitlines() if self.log_path.exists() else []
        )
        exits = [line for line in lines if line.startswith("failed to start daemon")]
        errors = [line for line in lines if "level=fatal" in line or "level=error" in line]
        why = exits[-1:] or errors[:1] or lines[-1:] or ["no output"]
        return why[0][:300] + f" (log: {self.log_path})"

    def docker(
        self, *args: str, check: bool = True, timeout: float | None = 600, **kwargs
    ) -> subprocess.CompletedProcess:
        """`docker ARGS` against this daemon, output captured as text."""
        kwargs.setdefault("capture_output", True)
        proc = subprocess.run(
            [DOCKER_CLI, *args], env=self.env, text=True, timeout=timeout,
            stdin=subprocess.DEVNULL, **kwargs,
        )  # fmt: skip
        if check and proc.returncode != 0:
            raise subprocess.CalledProcessError(
                proc.returncode, proc.args, proc.stdout, proc.stderr
            )
        return proc

    def descendants(self) -> list[int]:
        """PIDs still running that this daemon started (containerd, shims): found by the run
        directory their command lines name, since containerd outlives a killed dockerd."""
        found = []
        needle = str(self.run_dir).encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if needle in cmdline:
                found.append(int(entry.name))
        return found

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM dockerd (it stops its containers and its containerd), wait; SIGKILL what is
        left after `timeout`. The run directory is removed."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        deadline = time.monotonic() + 10
        while (left := self.descendants()) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        # dockerd bind-mounts its data root onto itself and its network namespaces under the
        # exec root; a clean stop undoes both, a failed start or a SIGKILL leaves them
        for target in self.mounts():
            subprocess.run(["umount", "--lazy", target], capture_output=True, check=False)
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def mounts(self) -> list[str]:
        """Mount points this daemon made that are still there, innermost first."""
        found = []
        for line in Path("/proc/self/mounts").read_text().splitlines():
            target = line.split()[1].replace("\\040", " ")
            inside = (self.data_root, self.run_dir)
            if any(target == str(d) or target.startswith(f"{d}/") for d in inside):
                found.append(target)
        return sorted(found, key=len, reverse=True)


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for a parent that is not ours to reap it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@contextmanager
def running_daemon(data_root: Path) -> Iterator[DockerDaemon]:
    """A started daemon (overlay2, or vfs where overlay2 cannot mount), stopped on exit."""
    daemon = DockerDaemon(data_root)
    try:
        daemon.start()
    except DockerUnavailable:
        log = daemon.log_path.read_text(errors="replace") if daemon.log_path.exists() else ""
        daemon.stop()
        if "overlay" not in log and "graphdriver" not in log:
            raise
        daemon = DockerDaemon(data_root, storage_driver="vfs")
        daemon.start()
    try:
        yield daemon
    finally:
        daemon.stop()
