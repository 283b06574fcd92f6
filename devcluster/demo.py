"""`fracspawner demo`: devcluster (demo topology) + a real JupyterHub with FracSpawner.

Everything listens on loopback. Ctrl-C stops the hub (which stops the servers and deletes
their pods), then the devcluster (which ends any process still running): nothing stray.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from importlib.resources import files
from pathlib import Path

from .localhub import REPO, start_hub

# Who sees what in the demo (examples/catalogs/demo.yaml's access rules): a newcomer logging in
# as "alice" sees one pool and no MIG, so the banner and the README say why.
DEMO_GROUPS = 'c.JupyterHub.load_groups = {"ml-research": {"users": ["mira", "ravi"]}}\n'
WHO_SEES_WHAT = (
    "  who sees what (access rules of examples/catalogs/demo.yaml):\n"
    "    any name (alice, bob, ...)  the H100 only, 1/8 or 1/4, at most 1/4 GPU in total\n"
    "    mira, ravi (ml-research)    every pool: H100 (HAMi), A100 MIG, T4; up to 2 GPUs\n"
    "    admin                       everything, no quota; also the admin page\n"
)

READY = re.compile(r"devcluster ready: (\S+) kubeconfig=(\S+)")


def demo_topology() -> Path:
    return Path(str(files("devcluster") / "topologies" / "demo.yaml"))


def demo_catalog() -> Path:
    return REPO / "examples" / "catalogs" / "demo.yaml"


def start_devcluster(topology: Path, state_dir: Path, timeout: float = 60) -> subprocess.Popen:
    """Start the devcluster in its own process group; return once it serves."""
    kubeconfig = state_dir / "kubeconfig"
    log = open(state_dir / "devcluster.log", "w")  # noqa: SIM115 - lives as long as the process
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fracspawner",
            "devcluster",
            "--topology",
            str(topology),
            "--port",
            "0",
            "--kubeconfig",
            str(kubeconfig),
            "--state-dir",
            str(state_dir / "cluster"),
        ],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"devcluster exited with {proc.returncode}; see {state_dir / 'devcluster.log'}"
                )
            continue
        if READY.search(line):
            return proc
    stop_process(proc)
    raise TimeoutError("devcluster did not become ready")


def stop_process(proc: subprocess.Popen, timeout: float = 30) -> None:
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


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="fracspawner demo", description=__doc__)
    parser.add_argument("--port", type=int, default=8000, help="hub port on 127.0.0.1")
    parser.add_argument("--topology", type=Path, default=None, help="devcluster topology YAML")
    parser.add_argument("--catalog", type=Path, default=None, help="fracspawner catalog YAML")
    parser.add_argument("--state-dir", type=Path, default=Path(".demo"), help="where state goes")
    parser.add_argument(
        "--password", default=None, help="the password every demo user logs in with"
    )
    args = parser.parse_args(argv)
    state_dir = args.state_dir.resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    password = args.password or secrets.token_urlsafe(6)

    cluster = start_devcluster(args.topology or demo_topology(), state_dir)
    hub = None
    try:
        hub = start_hub(
            state_dir=state_dir / "hub",
            kubeconfig=state_dir / "kubeconfig",
            catalog_file=(args.catalog or demo_catalog()).resolve(),
            port=args.port,
            password=password,
            log_to_console=True,
            extra_config=DEMO_GROUPS,
        )
        print(
            f"\n  fracspawner demo: {hub.url}/hub/login   password: {password}\n"
            f"{WHO_SEES_WHAT}"
            "  Ctrl-C stops everything.\n",
            flush=True,
        )
        signal.signal(signal.SIGTERM, _interrupt)
        while hub.process.poll() is None and cluster.poll() is None:
            time.sleep(0.5)
    except KeyboardInterrupt:
        print("\nstopping the demo...", flush=True)
    finally:
        if hub is not None:
            hub.stop()
        stop_process(cluster)
    return 0
