"""`fracspawner devcluster` (devcluster/realcluster.py: the real control plane and the node
agent in one foreground process) and `devcluster_process`, its runner for tests and benchmarks:
a bad topology is one line and exit 2 before anything starts; `devcluster_process` shows the
log of one that could not start, and leaves nothing behind, not even what a pod started outside
its process group; a SIGKILLed devcluster takes its pods and components with it. (Moved from the
Python API server's tests by issue 35 item 4.)"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from devcluster.proctree import proc
from devcluster.testing import DevClusterProcess, _component_processes, devcluster_process

pytestmark = pytest.mark.e2e

ONE_NODE = {"nodes": [{"name": "node-1", "capacity": {"cpu": "4", "memory": "8Gi"}}]}
# a Jupyter server starts kernels in sessions of their own: the child leaves the pod's group
ESCAPE = (
    "import subprocess; "
    "child = subprocess.Popen(['sleep', '600'], start_new_session=True); "
    "print(child.pid, flush=True); subprocess.run(['sleep', '600'])"
)


def wait(probe: Any, what: str, timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (result := probe()):
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        time.sleep(0.5)
    return result


def first_word_of_log(running: DevClusterProcess, pod: str) -> int:
    def read() -> list[str]:
        done = subprocess.run(
            ["kubectl", f"--kubeconfig={running.kubeconfig}", "logs", pod, "-n", "default"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        return done.stdout.split()

    return int(wait(read, f"{pod}'s log")[0])


def create_pod(running: DevClusterProcess, name: str, container: dict[str, Any]) -> None:
    body = {"metadata": {"name": name}, "spec": {"containers": [{"name": "c", **container}]}}
    status, answer = running.client().request("POST", "/api/v1/namespaces/default/pods", body)
    assert status == 201, answer


@pytest.mark.parametrize(
    ("topology", "needle"),
    [("missing.yaml", "topology not found"), ("bad.yaml", "nodes")],
)
def test_the_cli_exits_2_with_one_line_on_a_bad_topology(tmp_path: Path, topology, needle):
    (tmp_path / "bad.yaml").write_text("pods: []\n")
    result = subprocess.run(
        [sys.executable, "-m", "fracspawner", "devcluster", "--topology", str(tmp_path / topology),
         "--kubeconfig", str(tmp_path / "kubeconfig"), "--state-dir", str(tmp_path / "state")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], result.stderr
    assert not (tmp_path / "kubeconfig").exists() and not (tmp_path / "state").exists()


def test_devcluster_process_shows_the_log_when_the_devcluster_cannot_start(tmp_path: Path):
    with pytest.raises(RuntimeError) as info:
        with devcluster_process({"nodes": "not a list"}, tmp_path):
            pass
    assert "did not start (exited 2" in str(info.value)
    assert "nodes" in str(info.value)  # the devcluster's own one-line reason


@pytest.mark.slow
def test_devcluster_process_leaves_no_process_behind(tmp_path: Path):
    from tests.test_controlplane import _binary

    _binary()
    topology = {**ONE_NODE, "images": {"example.org/escaper:1": [sys.executable, "-c", ESCAPE]}}
    with devcluster_process(topology, tmp_path) as running:
        create_pod(running, "p", {"image": "example.org/escaper:1"})
        escaped = first_word_of_log(running, "p")
        devcluster_pid = running.process.pid
        assert proc(escaped)
        assert [n["metadata"]["name"] for n in running.client().list("nodes")] == ["node-1"]
    # the context's own check passed (it raises if it had to kill anything)
    assert not proc(escaped)
    assert running.process.returncode is not None and not proc(devcluster_pid)


@pytest.mark.slow
def test_a_killed_devcluster_takes_its_pods_and_components_along(tmp_path: Path):
    """SIGKILL (no clean-up at all): the pod's process and the control plane's components
    (each with PR_SET_PDEATHSIG) end with it; the context then finds nothing to kill."""
    from tests.test_controlplane import _binary

    _binary()
    sleeper = [
        sys.executable,
        "-c",
        "import os, time; print(os.getpid(), flush=True); time.sleep(600)",
    ]  # noqa: E501
    with devcluster_process(ONE_NODE, tmp_path) as running:
        create_pod(running, "orphan", {"image": "x", "command": sleeper})
        pid = first_word_of_log(running, "orphan")
        assert proc(pid)
        running.process.kill()
        running.process.wait(10)
        wait(lambda: not proc(pid), "the pod's process ends with the devcluster", 30)
        left = lambda: _component_processes(running.state_dir)  # noqa: E731
        wait(lambda: not left(), "etcd, kube-apiserver and the rest end with it", 30)


@pytest.mark.slow
def test_a_dead_kubelet_api_is_reported_and_the_cluster_stops(tmp_path: Path):
    """The node agent's kubelet-api process SIGKILLed while the cluster serves: as for a
    control-plane component, the cluster says it died with the last lines of its log, stops
    everything (the pod's process, the components) and exits 1, instead of serving on with no
    kubectl exec or logs and no word."""
    from tests.test_controlplane import _binary

    _binary()
    sleeper = [sys.executable, "-c", "import os, time; print(os.getpid(), flush=True); time.sleep(600)"]  # fmt: skip  # noqa: E501
    with devcluster_process(ONE_NODE, tmp_path) as running:
        create_pod(running, "bystander", {"image": "x", "command": sleeper})
        pid = first_word_of_log(running, "bystander")
        components = _component_processes(running.state_dir)
        api = [p for p in components if b"kubelet-api" in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert len(api) == 1, components
        os.kill(api[0], 9)
        code = running.process.wait(90)
        log = (tmp_path / "devcluster.log").read_text()
        assert code == 1, log[-3000:]
        assert "kubelet-api exited with status -9; last lines of" in log, log[-3000:]
        assert "kubelet-api.log" in log, log[-3000:]
        assert not proc(pid), "the pod's process outlived the cluster"
        wait(lambda: not _component_processes(running.state_dir), "no component left", 30)
    # the context's own check passed: nothing of the cluster was left to kill
