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
    now_said = server.api("GET", "/api/status")[1]["last_activity"]
    # a kernel's own message (a late status or kernel_info reply of the new kernels) is
    # activity and may land meanwhile (jupyter_server's last_kernel_activity); neither an idle
    # GPU nor the polling may move it past that (seen flaky on a loaded machine)
    messages = [kernel_entry(server, k).get("last_activity") for k in (busy, idle)]
    allowed = max([isoparse(settled)] + [isoparse(m) for m in messages if m])
    assert isoparse(now_said) <= allowed, (now_said, settled, messages)
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
    # the demo's simulated GPU only where the devcluster's kubelet describes it (issue 21 item 2)
    saved = os.environ.pop("FRACSPAWNER_SIMULATED_GPU", None)
    try:
        with pytest.raises(ValueError, match="only the devcluster's kubelet sets"):
            make_source("simulated-demo")
    finally:
        if saved is not None:
            os.environ["FRACSPAWNER_SIMULATED_GPU"] = saved
    if not Path("/dev/nvidiactl").exists():  # a GPU machine checks NVML for real instead
        with pytest.raises(GpuUnavailable, match="NVML"):
            NvmlSource().sample()


# --- the pod's slice and idle policy in the report (what the JupyterLab meter shows) ----------
def test_report_without_pod_environment_labels_the_device(server):
    """Outside FracSpawner (no slice, no policy in the environment): no warnings, ever."""
    write_gpu(server, {"devices": [{"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81920}]})
    report = gpu_when(server, lambda r: "H100" in str(r.get("devices")), "a reading")
    assert report["slice"]["label"] == "NVIDIA H100 80GB HBM3 · 10 GiB"
    assert report["slice"]["spec"] is None
    assert report["policy"] == {
        "kernel_gpu_idle": None,
        "server_gpu_idle": None,
        "server_idle": None,
        "server_unattended": None,
        "warn_before": None,
        "kernel_gpu_hibernate": None,
        "max_age": None,
    }
    assert report["warnings"] == [] and report["server_idle"]["cull_at"] is None
    assert report["gpu_utilization"] == 0


@pytest.mark.parametrize(
    "spec, pool, memory, label",
    [
        ("1/4", "H100", 20480, "1/4 H100 · 20 GiB"),
        ("0.25", "H100", 20480, "1/4 H100 · 20 GiB"),
        (".125", None, 10240, "1/8 GPU · 10 GiB"),
        ("10GiB", "H100", 10240, "H100 · 10 GiB"),
        ("10G", "H100", None, "H100 · 10 GiB"),
        ("10240MiB", "H100", 10240, "H100 · 10 GiB"),
        ("mig-1g.10gb", "A100", 9728, "A100 MIG 1g.10gb"),
        ("1g.10gb", "A100", None, "A100 MIG 1g.10gb"),
        ("1", "H100", 81920, "H100 · 80 GiB"),
        ("2", "H100", 163840, "2 × H100 · 160 GiB"),
        ("none", "H100", None, "H100"),
    ],
)
def test_slice_labels(spec, pool, memory, label):
    from fracspawner.serverext.podinfo import parse_slice, slice_label

    assert slice_label(parse_slice(spec), pool, memory) == label


def test_pod_environment_names():
    from fracspawner.serverext.podinfo import PodInfo

    pod = PodInfo.from_environ(
        {
            "FRACSPAWNER_GPU_SLICE": "1/4",
            "FRACSPAWNER_GPU_POOL": "h100",
            "FRACSPAWNER_GPU_POOL_DISPLAY": "H100",
            "FRACSPAWNER_GPU_MEMORY_MIB": "20480",
            "FRACSPAWNER_KERNEL_GPU_IDLE_SECONDS": "1800",
            "FRACSPAWNER_SERVER_GPU_IDLE_SECONDS": "7200",
            "FRACSPAWNER_SERVER_IDLE_SECONDS": "0",  # off
            "FRACSPAWNER_SERVER_UNATTENDED_SECONDS": "86400",
            "FRACSPAWNER_GPU_IDLE_WARN_SECONDS": "300",
            "FRACSPAWNER_KERNEL_GPU_HIBERNATE_SECONDS": "600",
        }
    )
    assert pod.slice_json()["label"] == "1/4 H100 · 20 GiB"
    assert pod.slice_json()["pool"] == "h100"
    assert pod.slice_json()["counts_hibernated"] is False  # HAMi-core's limit not in the env
    assert pod.policy.as_json() == {
        "kernel_gpu_idle": 1800.0,
        "server_gpu_idle": 7200.0,
        "server_idle": None,
        "server_unattended": 86400.0,
        "warn_before": 300.0,
        "kernel_gpu_hibernate": 600.0,
        "max_age": None,
    }
    # unset or nonsense: no policy, so no warning (rather than a wrong one)
    nonsense = PodInfo.from_environ({"FRACSPAWNER_KERNEL_GPU_IDLE_SECONDS": "30m"})
    assert nonsense.policy.as_json() == {
        "kernel_gpu_idle": None,
        "server_gpu_idle": None,
        "server_idle": None,
        "server_unattended": None,
        "warn_before": None,
        "kernel_gpu_hibernate": None,
        "max_age": None,
    }


class FakeKernel:
    def __init__(self, last_activity, execution_state="idle"):
        self.last_activity, self.execution_state = last_activity, execution_state


class FakeKernelManager:
    def __init__(self, kernels):
        self.kernels = kernels

    def list_kernel_ids(self):
        return list(self.kernels)

    def get_kernel(self, kernel_id):
        return self.kernels[kernel_id]

    async def shutdown_kernel(self, kernel_id):
        del self.kernels[kernel_id]


def test_warnings_come_before_the_culler_acts_and_agree_with_it(monkeypatch):
    """The report's cull times are the moments the server shuts its kernel down and the
    culler's rules turn to 'stop'."""
    import asyncio
    from datetime import timedelta

    from fracspawner.culler.decide import ServerFacts, decide_server
    from fracspawner.culler.reports import parse_report
    from fracspawner.serverext import monitor as monitor_module
    from fracspawner.serverext.sources import GpuDevice, GpuProcess, GpuSample

    for name, value in {
        "FRACSPAWNER_GPU_SLICE": "1/4",
        "FRACSPAWNER_KERNEL_GPU_IDLE_SECONDS": "1800",
        "FRACSPAWNER_SERVER_GPU_IDLE_SECONDS": "7200",
        "FRACSPAWNER_SERVER_IDLE_SECONDS": "28800",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("FRACSPAWNER_GPU_IDLE_WARN_SECONDS", raising=False)
    t0 = monitor_module.utcnow()
    clock = [t0]
    monkeypatch.setattr(monitor_module, "utcnow", lambda: clock[0])
    kernels = {"k-idle": FakeKernel(t0), "k-busy": FakeKernel(t0, "busy")}
    monitor = monitor_module.GpuMonitor(
        settings={"kernel_manager": FakeKernelManager(kernels)}, source_spec="none"
    )
    monitor.reason = None
    device = GpuDevice("0", "H100", "GPU-0", 81920, 9216, 0)
    processes = [
        GpuProcess("0", 9216, 0.0, kernel_id="k-idle"),
        GpuProcess("0", 1024, 0.0, kernel_id="k-busy"),
    ]
    owned = [(p.kernel_id, p) for p in processes]

    def at(seconds: float) -> dict:
        clock[0] = t0 + timedelta(seconds=seconds)
        live = [(kid, p) for kid, p in owned if kid in kernels]  # a shut-down kernel's is gone
        monitor.apply(
            GpuSample("simulated", [device], [p for _, p in live]), live, set(kernels), clock[0]
        )
        return monitor.report(server_last_activity=t0)

    # 30 min policy: warned 10 min before (a third of the limit at most), not earlier
    assert at(1199)["warnings"] == []
    report = at(1200)
    (warning,) = report["warnings"]  # the executing kernel is not culled, so not warned
    assert warning["scope"] == "kernel" and warning["kernel_id"] == "k-idle"
    assert warning["gpu_memory_mib"] == 9216 and warning["idle_seconds"] == 1200
    cull_at = t0 + timedelta(seconds=1800)
    assert warning["cull_at"] == monitor_module.isoformat(cull_at)

    class Policy:
        kernel_gpu_idle, server_gpu_idle, server_idle, max_age = 1800, 7200, 28800, None
        server_unattended = None

    def culler_says(seconds: float) -> tuple[str, str]:
        report = at(seconds)
        now = clock[0].timestamp()
        facts = parse_report(report, received_at=now)
        shut = asyncio.run(monitor.cull_idle_kernels(clock[0]))
        server = ServerFacts(user="u", user_options={"gpu": "1/4"}, last_activity=t0.timestamp())
        return (
            "shutdown" if "k-idle" in shut else "keep",
            decide_server(server, facts.gpu, Policy, now).action,
        )

    assert culler_says(1799) == ("keep", "keep")
    assert culler_says(1800)[0] == "shutdown"  # the server shut its own kernel down
    assert set(kernels) == {"k-busy"}
    # the server: warned from 7200 - 600 s, stopped from 7200 s, as the report said
    assert at(6599)["warnings"] == []
    report = at(6600)
    assert [w["scope"] for w in report["warnings"]] == ["server"]
    assert report["server_idle"]["cull_at"] == monitor_module.isoformat(
        t0 + timedelta(seconds=7200)
    )
    assert culler_says(7199)[1] == "keep"
    assert culler_says(7200)[1] == "stop"
