"""`fracspawner doctor` (issue 22 item 6): run as a user would in a notebook terminal, beside a
real jupyter server with the extension (GPU through the fake pynvml, hibernation through the
fake checkpoint driver) that pushes its reports to a culler stand-in answering like the real
receiver (fracspawner/culler/receiver.py: 401 without a token, 204 when taken)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from fracspawner.serverext.doctor import pod_lines
from tests.test_culler_support import JupyterServer, wait_for
from tests.test_hibernation import FAKE, set_cgroup

POD_ENV = {
    "FRACSPAWNER_GPU_SLICE": "1/4",
    "FRACSPAWNER_GPU_POOL": "h100",
    "FRACSPAWNER_GPU_POOL_DISPLAY": "H100",
    "FRACSPAWNER_GPU_MEMORY_MIB": "20480",
    "FRACSPAWNER_KERNEL_GPU_HIBERNATE_SECONDS": "600",
    "FRACSPAWNER_KERNEL_GPU_IDLE_SECONDS": "1800",
    "FRACSPAWNER_SERVER_GPU_IDLE_SECONDS": "3600",
    "FRACSPAWNER_SERVER_IDLE_SECONDS": "28800",
    "CUPY_GPU_MEMORY_LIMIT": str(20480 * 2**20),
}


class CullerStandIn:
    def __init__(self) -> None:
        self.reports = 0
        me = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if not self.headers.get("Authorization"):
                    self.send_response(401)
                else:
                    me.reports += 1
                    self.send_response(204)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/services/culler/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def pod(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("doctor")
    state = tmp / "nvml.json"
    state.write_text(json.dumps({"cuda_driver_version": 12080, "gpus": [
        {"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "utilization": 3,
         "processes": [{"pid": 4242, "memory_mib": 6144, "sm": 0}]}]}))  # fmt: skip
    cgroup = tmp / "cgroup"
    cgroup.mkdir()
    set_cgroup(cgroup, 16, 4)
    (cgroup / "cpu.max").write_text("200000 100000\n")
    culler = CullerStandIn()
    env = {
        **POD_ENV,
        "PYTHONPATH": os.pathsep.join([str(FAKE), os.environ.get("PYTHONPATH", "")]),
        "FAKE_NVML_STATE": str(state),
        "FRACSPAWNER_CULLER_URL": culler.url,
        "JUPYTERHUB_API_TOKEN": "server-token",
    }
    server = JupyterServer(
        tmp, tmp / "unused.json", source="nvml", env=env,
        config={"GpuReporter": {"report_interval": 0.5}},
    )  # fmt: skip
    try:
        yield server, env, cgroup, culler
    finally:
        server.stop()
        culler.server.shutdown()


def doctor(env: dict, cgroup, tmp) -> tuple[int, str]:
    result = subprocess.run(
        [sys.executable, "-m", "fracspawner", "doctor", f"--cgroup={cgroup}"],
        env={**os.environ, **env, "JUPYTER_RUNTIME_DIR": str(tmp / "runtime")},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return result.returncode, result.stdout + result.stderr


def test_doctor_in_a_healthy_gpu_pod(pod):
    server, env, cgroup, culler = pod
    wait_for(lambda: culler.reports > 0, 30, "a report at the culler")
    rc, out = doctor(env, cgroup, server.tmp)
    assert rc == 0, out
    lines = out.splitlines()
    assert len(lines) <= 24  # one screen
    assert "Slice:       1/4 H100 · 20 GiB (pool h100)" in lines
    assert (
        "Idle policy: idle kernels hibernate 10 min, shut down 30 min; server stopped GPU-idle "
        "1 h, idle 8 h" in lines
    )
    assert (
        "Limits:      memory limit 16 GiB (12 GiB free under the pod's memory limit), 2 CPUs" in out
    )
    assert f"CUPY_GPU_MEMORY_LIMIT={20480 * 2**20}" in out
    assert "NVML:        1 device(s) visible" in lines
    assert "  0: NVIDIA H100 80GB HBM3, 6 GiB of 79.6 GiB used, utilisation 3%" in lines
    assert "Hibernation: possible (CUDA checkpoint API, driver 575.57.08, CUDA 12.8)" in out
    assert f"Culler:      reachable at {culler.url}api/reports (HTTP 401" in out
    assert "  reports:   " in out and " sent, the last at " in out
    assert out.rstrip().endswith("All fine.")


def test_doctor_says_what_is_wrong(pod, tmp_path):
    server, env, cgroup, _ = pod
    broken = {
        **env,
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),  # no cuda-python, no NVML library
        "FRACSPAWNER_CULLER_URL": "http://127.0.0.1:9/services/culler/",  # nobody there
    }
    rc, out = doctor(broken, cgroup, tmp_path)
    assert rc == 1, out
    assert "NVML:        cannot read the GPU: NVML could not start" in out
    assert "Hibernation: not possible here: cuda-python is not installed" in out
    assert "Culler:      NOT reachable at http://127.0.0.1:9/services/culler/api/reports" in out
    assert out.rstrip().endswith("Something needs attention: see the lines above.")


def test_doctor_reads_the_memory_limit_of_cgroup_v1_and_unreadable_files(tmp_path):
    # the same cgroup reading as the hibernator (checkpoint.host_headroom): a v1 pod's
    # memory/memory.limit_in_bytes is its limit, and a memory.max that cannot be read is an
    # unknown limit, not a traceback and not "no memory limit"
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 67108864 kB\nMemAvailable: 33554432 kB\n")  # 32 GiB
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text(str(6 * 2**30))
    (v1 / "memory" / "memory.usage_in_bytes").write_text(str(2 * 2**30))
    lines = pod_lines(POD_ENV, str(v1), str(meminfo))
    assert (
        "Limits:      memory limit 6 GiB (4 GiB free under the pod's memory limit), no CPU limit"
        in lines
    ), lines
    (v1 / "memory" / "memory.limit_in_bytes").write_text(str(2**63 - 4096))  # v1's "no limit"
    lines = pod_lines(POD_ENV, str(v1), str(meminfo))
    assert (
        "Limits:      no memory limit (32 GiB free under the node's memory), no CPU limit" in lines
    ), lines
    unreadable = tmp_path / "unreadable"
    (unreadable / "memory.max").mkdir(parents=True)  # exists, but read_text raises OSError
    lines = pod_lines(POD_ENV, str(unreadable), str(meminfo))
    assert (
        "Limits:      memory limit unknown (32 GiB free under the node's memory), no CPU limit"
        in lines
    ), lines


@pytest.mark.usefixtures("fake_nvml_imports")  # cuda.bindings.driver and pynvml: the fakes
def test_doctor_says_which_driver_or_gpu_condition_stops_hibernation(tmp_path, monkeypatch):
    """Issue 26 (6): an r570 driver in a container that sees some of the node's GPUs
    (NVIDIA/cuda-checkpoint #12, #24) and a MIG instance (#42) cannot checkpoint: the doctor
    names the condition instead of 'possible'."""
    import fracspawner.serverext.doctor as doc

    state = tmp_path / "nvml.json"
    state.write_text(json.dumps({"driver": "570.86.10", "cuda_driver_version": 12080,
                                 "gpus": [{"processes": []}]}))  # fmt: skip
    monkeypatch.setenv("FAKE_NVML_STATE", str(state))
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    set_cgroup(cgroup, 16, 4)
    meminfo = str(tmp_path / "meminfo")
    lines, _ok = doc.hibernation_lines(POD_ENV, str(cgroup), meminfo, ["0"], in_container=True)
    assert lines[0].startswith("Hibernation: not possible here: driver 570.86.10 cannot")
    assert "#12, #24" in lines[0] and "Hibernator.all_gpus_visible" in lines[0]
    lines, _ok = doc.hibernation_lines(POD_ENV, str(cgroup), meminfo, ["0"], in_container=False)
    assert lines[0].startswith("Hibernation: possible (CUDA checkpoint API, driver 570.86.10")
    lines, _ok = doc.hibernation_lines(POD_ENV, str(cgroup), meminfo, ["0:1"], in_container=False)
    assert "MIG" in lines[0] and "#42" in lines[0] and "not possible" in lines[0]
    report = {"kernels": [{"id": "abcdef0123", "hibernation": {
        "state": "running", "reason": "not hibernated: 1 other process it started"}}]}  # fmt: skip
    assert doc.kernel_hibernation_lines(report) == [
        "  kernel abcdef01: running: not hibernated: 1 other process it started"
    ]


def test_doctor_outside_a_notebook_pod_says_so(tmp_path):
    """Issue 27 #8: on a laptop it printed "this notebook pod ... All fine" while NVML could
    not start; outside a pod it says it is not in one, and exits 2."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k != "KUBERNETES_SERVICE_HOST" and not k.startswith(("JUPYTERHUB_", "FRACSPAWNER_"))
    }
    result = subprocess.run(
        [sys.executable, "-m", "fracspawner", "doctor"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result
    assert result.stderr.startswith("fracspawner doctor: not in a notebook pod"), result.stderr
    assert "All fine" not in result.stdout + result.stderr


def test_doctor_says_how_the_node_hands_out_gpus(pod, tmp_path):
    """Issue 34 item 1: with the device plugin's deviceListStrategy volume-mounts the devices
    arrive as /var/run/nvidia-container-devices/<id> (and, with the toolkit's
    accept-nvidia-visible-devices-envvar-when-unprivileged = false, a pod's own env cannot
    choose any); with envvar, its default, through NVIDIA_VISIBLE_DEVICES, which a pod's own
    env overrides. The doctor says which of the two its node uses."""
    from fracspawner.serverext.doctor import device_list_line

    uuid = "GPU-6b3f9a2e-1c1d-4c3e-9b7a-2f5e8d1c0a11"
    mounts = tmp_path / "nvidia-container-devices"
    mounts.mkdir()
    (mounts / uuid).touch()
    line = device_list_line({"NVIDIA_VISIBLE_DEVICES": "void"}, str(mounts))
    assert line.startswith(f"Devices:     by volume mounts ({mounts}: {uuid})"), line
    absent = str(tmp_path / "absent")
    line = device_list_line({"NVIDIA_VISIBLE_DEVICES": uuid}, absent)
    assert line.startswith(f"Devices:     by env (NVIDIA_VISIBLE_DEVICES={uuid})"), line
    assert "deviceListStrategy" in line and "install.md" in line
    for value in ("void", ""):
        line = device_list_line({"NVIDIA_VISIBLE_DEVICES": value}, absent)
        assert line.startswith("Devices:     no device-plugin GPU here"), line
    # the command says it too
    server, env, cgroup, _ = pod
    result = subprocess.run(
        [sys.executable, "-m", "fracspawner", "doctor", f"--cgroup={cgroup}",
         f"--devices-dir={mounts}"],
        env={**os.environ, **env, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert f"Devices:     by volume mounts ({mounts}: {uuid})" in result.stdout, result
