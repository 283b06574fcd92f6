"""The notebook server extension in a real `jupyter server` with real ipykernel kernels.

GPU readings come from the simulated source (this machine has no GPU); everything else is real:
the auto-enable config file, the handler's authentication, the /proc walk from a GPU process
to its kernel, and GPU work counted in the server's own last_activity.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from dateutil.parser import isoparse

from fracspawner.serverext.procmap import owner_of
from fracspawner.serverext.sources import GpuUnavailable, NvmlSource, make_source
from tests.test_culler_support import JupyterServer, execute, wait_for


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("jupyter")
    gpu_file = tmp / "gpu.json"
    gpu_file.write_text("{}")
    s = JupyterServer(tmp, gpu_file)
    try:
        yield s
    finally:
        s.stop()


def write_gpu(server: JupyterServer, data: dict) -> None:
    tmp = server.gpu_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(server.gpu_file)  # atomic: the monitor never reads half a file


def new_kernel(server: JupyterServer) -> str:
    status, body = server.api("POST", "/api/kernels", {"name": "python3"})
    assert status == 201, body
    return body["id"]


def gpu_when(server: JupyterServer, check, what: str) -> dict:
    """The extension's report, once `check(report)` holds (readings come every 0.2 s)."""
    found: list[dict] = []

    def probe() -> bool:
        found[:] = [server.gpu()]
        return bool(check(found[0]))

    wait_for(probe, 10, what)
    return found[0]


def kernel_entry(server: JupyterServer, kernel_id: str) -> dict:
    return next((k for k in server.gpu()["kernels"] if k["id"] == kernel_id), {})


def test_requires_authentication(server):
    status, _ = server.api("GET", "/api/fracspawner/gpu", token=None)
    assert status == 403
    status, _ = server.api("GET", "/api/fracspawner/gpu", token="wrong")
    assert status == 403


def test_no_gpu_says_why(server):
    write_gpu(server, {"unavailable": "no NVIDIA driver on this node"})
    report = gpu_when(server, lambda r: not r["available"], "no GPU")
    assert report["reason"] == "no NVIDIA driver on this node"
    write_gpu(server, {})
    wait_for(lambda: server.gpu()["available"], 10, "GPU back")


async def test_gpu_memory_and_activity_per_kernel(server):
    busy, idle = new_kernel(server), new_kernel(server)
    write_gpu(
        server,
        {
            "devices": [{"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81920}],
            "kernels": {
                busy: {"memory_mib": 4096, "utilization": 85},
                idle: {"memory_mib": 2048, "utilization": 0},
            },
        },
    )
    wait_for(lambda: kernel_entry(server, idle).get("gpu_memory_mib") == 2048, 10, "reading")
    report = server.gpu()
    assert report["source"] == "simulated"
    assert report["entitlement"] == {"memory_mib": 10240}
    assert report["devices"][0]["name"] == "NVIDIA H100 80GB HBM3"
    assert report["gpu_memory_mib"] == 6144
    b, i = kernel_entry(server, busy), kernel_entry(server, idle)
    assert b["gpu_memory_mib"] == 4096 and b["last_gpu_activity"] is not None
    assert i["gpu_memory_mib"] == 2048 and i["last_gpu_activity"] is None
    assert i["execution_state"] in ("idle", "starting") and i["last_activity"]
    # the busy GPU keeps the server's own last_activity (what JupyterHub is told) current
    status, before = server.api("GET", "/api/status")
    wait_for(
        lambda: (
            isoparse(server.api("GET", "/api/status")[1]["last_activity"])
            > isoparse(before["last_activity"])
        ),
        10,
        "last_activity to advance with GPU work alone",
    )
    # once the GPU goes idle, it stops advancing: polling /api/fracspawner/gpu is not activity
    write_gpu(server, {"kernels": {busy: {"memory_mib": 4096, "utilization": 0}}})
    wait_for(lambda: kernel_entry(server, busy).get("gpu_utilization") == 0, 10, "idle reading")
    settled = server.api("GET", "/api/status")[1]["last_activity"]
    for _ in range(5):
        server.gpu()
    wait_for(lambda: kernel_entry(server, busy).get("gpu_utilization") == 0, 10, "more readings")
    assert server.api("GET", "/api/status")[1]["last_activity"] == settled
    for kid in (busy, idle):
        server.api("DELETE", f"/api/kernels/{kid}")


async def test_gpu_process_in_a_kernel_child_maps_to_the_kernel(server):
    """A DataLoader-style child process on the GPU is found by walking /proc up to its kernel."""
    kernel_id = new_kernel(server)
    pid = int(
        await execute(
            server.url,
            server.token,
            kernel_id,
            "import subprocess, sys\n"
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
            "print(p.pid)",
        )
    )
    try:
        assert owner_of(pid).kernel_id == kernel_id
        write_gpu(server, {"pids": {str(pid): {"memory_mib": 1536, "utilization": 40}}})
        wait_for(
            lambda: kernel_entry(server, kernel_id).get("gpu_memory_mib") == 1536,
            10,
            "child's GPU memory on its kernel",
        )
        entry = kernel_entry(server, kernel_id)
        assert entry["last_gpu_activity"] is not None
        # a GPU process of someone else (not under this server) is not counted
        write_gpu(server, {"pids": {"1": {"memory_mib": 999, "utilization": 90}}})
        wait_for(lambda: server.gpu()["gpu_memory_mib"] == 0, 10, "foreign process ignored")
    finally:
        os.kill(pid, signal.SIGKILL)
        server.api("DELETE", f"/api/kernels/{kernel_id}")


def test_unknown_utilisation_is_not_activity(server):
    kernel_id = new_kernel(server)
    write_gpu(server, {"kernels": {kernel_id: {"memory_mib": 1024, "utilization": None}}})
    wait_for(lambda: kernel_entry(server, kernel_id).get("gpu_memory_mib") == 1024, 10, "reading")
    entry = kernel_entry(server, kernel_id)
    assert entry["gpu_activity_known"] is False and entry["last_gpu_activity"] is None
    server.api("DELETE", f"/api/kernels/{kernel_id}")


def test_sources():
    assert make_source("none") is None
    assert make_source("sim:/x.json").name == "simulated"
    with pytest.raises(ValueError, match="unknown GPU source"):
        make_source("cuda")
    if not Path("/dev/nvidiactl").exists():  # a GPU machine checks NVML for real instead
        with pytest.raises(GpuUnavailable, match="NVML"):
            NvmlSource().sample()
