"""Over-commit with swap through the product path (issue 26, item 3): a real JupyterHub with
FracSpawner on devcluster, a time-sliced T4 pool with `replicas: 4, overcommit: 2`, so eight
1/4 servers on ONE simulated GPU; real single-user servers with the notebook extension and real
ipykernel kernels; the GPU read through NvmlSource from the FAKE pynvml and suspended through
the FAKE CUDA checkpoint driver (tests/fake_nvml: documented states; a restore is refused with
CUDA_ERROR_OUT_OF_MEMORY when the GPU lacks room for it); the culler in this process, taking
the servers' reports and answering them.

Each kernel holds its quarter of the GPU (the test registers the kernel's process with 3840 MiB,
as a real allocation would show in NVML) only when the GPU has room for it, as cudaMalloc on a
full time-sliced GPU would fail. The culler's margin (the pool's largest slice, a quarter) keeps
that room: whenever the fourth quarter lands, the least recently used idle kernel is swapped out.
Then idle users come back: one finds room (the margin) and the next least recently used idle
kernel goes; with no margin, two at once to a GPU with room for one: one of them waits while
another idle kernel is swapped out; then all, one by one. No restore is tried without the
culler's grant of room (the fake driver follows NVIDIA/cuda-checkpoint#44: a restore refused for
want of room loses the kernel's GPU state, and none is refused here). Throughout, a watcher
samples the fake GPU and the memory on it never exceeds its size; every kernel's data survives.

Eight servers are real; the machine has two cores, so the servers read the GPU twice a second,
report every two seconds, and every wait is on a condition.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from devcluster.localhub import free_port, http_json
from fracspawner.culler import Culler
from fracspawner.serverext.hibernate import GPU_FULL
from tests.conftest import DEMO_TOPOLOGY, REPO
from tests.e2e_helpers import spawn, stop_all, the_pod, wait_until
from tests.test_culler_support import CULLER_SCOPES, execute

pytestmark = pytest.mark.e2e

FAKE = REPO / "tests" / "fake_nvml"
T4_MIB = 15360  # NVML's total for a T4 (fracspawner.model.gpumodels), the catalog's model
QUARTER = T4_MIB // 4
USERS = [f"u{i}" for i in range(1, 9)]

# one T4 node, time-sliced by the device plugin with replicas 4 x overcommit 2 = 8
TOPOLOGY = {
    "nodes": [
        {
            "name": "gpu-t4-1",
            "labels": {
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": "Tesla-T4-SHARED",
                "nvidia.com/gpu.count": "1",
                "nvidia.com/gpu.replicas": "8",
                "nvidia.com/gpu.memory": str(T4_MIB),
                "nvidia.com/gpu.sharing-strategy": "time-slicing",
            },
            "capacity": {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": "8"},
        },
        *[n for n in yaml.safe_load(DEMO_TOPOLOGY.read_text())["nodes"] if n["name"] == "cpu-1"],
    ]
}
CATALOG = {
    "pools": {
        "t4": {
            "display_name": "T4 (time-sliced, over-committed)",
            "gpu": "T4",
            "backend": "timeslicing",
            "replicas": 4,
            "overcommit": 2,
            "node_selector": {"nvidia.com/gpu.product": "Tesla-T4-SHARED"},
            "offers": ["1/4"],
        }
    },
    "access": {"default": {"pools": "all", "max_gpu": 1}},
    # only the pressure swaps kernels out here: no idle hibernation, no culling
    "idle": {"kernel_gpu_hibernate": "off", "kernel_gpu_idle": "off", "server_gpu_idle": "1d",
             "server_idle": "1d"},
}  # fmt: skip

CULLER_TOKEN = "c" * 32
REPORT_PORT = free_port()
PREFIX = "/services/gpu-culler/"
HUB_EXTRA_CONFIG = f"""
import os as _os
c.KubeSpawner.environment = {{
    "FRACSPAWNER_GPU_SOURCE": "nvml",
    "FAKE_NVML_STATE": _os.path.join(_os.getcwd(), "nvml.json"),
    "JUPYTER_CONFIG_PATH": _os.path.join(_os.getcwd(), "server-config"),
    "PYTHONPATH": {str(FAKE)!r} + _os.pathsep + {str(REPO)!r},
}}
c.FracSpawner.culler_url = "http://127.0.0.1:{REPORT_PORT}{PREFIX}"
c.JupyterHub.services.append({{"name": "gpu-culler", "api_token": {CULLER_TOKEN!r}}})
c.JupyterHub.load_roles.append(
    {{"name": "gpu-culler", "scopes": {CULLER_SCOPES!r}, "services": ["gpu-culler"]}}
)
"""
# the cell asks the fake driver for its own CUDA state: "running" proves it was resumed first
MY_STATE = (
    "import json, os\n"
    "def my_state():\n"
    "    for p in json.load(open(os.environ['FAKE_NVML_STATE']))['gpus'][0]['processes']:\n"
    "        if p['pid'] == os.getpid():\n"
    "            return p.get('cuda_state', 'running')\n"
)


@contextmanager
def fake_state(path: Path):
    """Change the fake GPU under the lock the fake driver takes (it writes it too)."""
    with open(f"{path}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = json.loads(path.read_text())
        yield data
        tmp = path.with_suffix(".test.tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)


def on_gpu(path: Path) -> dict[int, float]:
    """pid -> MiB each process holds on the GPU now (a checkpointed one holds none)."""
    processes = json.loads(path.read_text())["gpus"][0]["processes"]
    return {p["pid"]: p.get("memory_mib", 0) for p in processes}


class Watcher(threading.Thread):
    """Samples the memory on the fake GPU all through the test: its peak and every sample."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path, self.peak, self.samples, self.done = path, 0.0, 0, threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                self.peak = max(self.peak, sum(on_gpu(self.path).values()))
                self.samples += 1
            except (OSError, ValueError):  # mid-replace: the next sample reads it
                pass
            time.sleep(0.02)


@pytest.fixture(scope="module")
def gpu(hub) -> Path:
    state = hub.state_dir / "nvml.json"
    state.write_text(
        json.dumps(
            {"driver": "575.57.08", "cuda_driver_version": 12080,
             "gpus": [{"name": "Tesla T4", "memory_total_mib": T4_MIB, "utilization": 0,
                       "processes": []}]}
        )
    )  # fmt: skip
    config = hub.state_dir / "server-config"
    config.mkdir(exist_ok=True)
    # the pod's memory as the hibernator reads it: plenty of host memory for the copies
    cgroup = hub.state_dir / "cgroup"
    cgroup.mkdir(exist_ok=True)
    (cgroup / "memory.max").write_text(str(64 * 2**30))
    (cgroup / "memory.current").write_text(str(2**30))
    meminfo = hub.state_dir / "meminfo"
    meminfo.write_text(f"MemAvailable: {256 * 2**20} kB\n")
    (config / "jupyter_server_config.json").write_text(
        json.dumps(
            {
                "GpuMonitor": {"poll_interval": 0.5, "unavailable_retry": 0.5},
                "GpuReporter": {"report_interval": 2.0},
                "Hibernator": {"cgroup_root": str(cgroup), "meminfo_path": str(meminfo),
                               "cpu_probe_seconds": 0.2, "retry_first": 2.0,
                               "retry_refused_after": 1.0},
                "SwapAgent": {"room_check": 0.3},
            }
        )
    )  # fmt: skip
    return state


def culler(hub) -> Culler:
    c = Culler(api_token=CULLER_TOKEN)
    c.initialize(
        [
            f"--url={hub.api_url}",
            f"--catalog={hub.state_dir / 'catalog.yaml'}",  # the file the hub loaded
            f"--report-url=http://127.0.0.1:{REPORT_PORT}",
            f"--Culler.report_prefix={PREFIX}",
            "--Culler.max_staleness=30",
            "--Culler.report_rate=600",  # the servers report every 2 s (and sooner when asked)
            "--Culler.report_burst=100",
            "--Culler.swap_report_in=1",
        ]
    )
    c.log.propagate = True
    return c


def server_api(hub, user: str, method: str, path: str, body=None):
    return http_json(
        method, f"{hub.url}/user/{user}/" + path.lstrip("/"), body, token=hub.admin_token,
        timeout=60,
    )  # fmt: skip


def meter(hub, user: str) -> dict:
    """What the JupyterLab GPU meter reads (GET api/fracspawner/gpu)."""
    status, body = server_api(hub, user, "GET", "/api/fracspawner/gpu")
    assert status == 200, body
    return body


def hibernation(hub, user: str, kid: str) -> dict:
    return next((k["hibernation"] for k in meter(hub, user)["kernels"] if k["id"] == kid), {})


async def cell(hub, user: str, kid: str, code: str) -> str:
    """Run a cell as the user's notebook does; its output (notices included). The bound only
    ends a failing test."""
    run = execute(f"{hub.url}/user/{user}", hub.admin_token, kid, code)
    return await asyncio.wait_for(run, 180)


def holds_quarter(hub, user: str) -> bool:
    return any(k["gpu_memory_mib"] == QUARTER for k in meter(hub, user)["kernels"])


def room_for_a_quarter(state: Path) -> bool:
    return sum(on_gpu(state).values()) + QUARTER <= T4_MIB


async def test_eight_quarters_on_one_gpu_swap_least_recently_used_and_nothing_is_lost(
    hub, devcluster, gpu
):
    c = culler(hub)
    receiver = c.start_receiver()
    watcher = Watcher(gpu)
    watcher.start()
    kernels: dict[str, tuple[str, int]] = {}  # user -> (kernel id, pid)
    try:
        for user in USERS:
            status, body = spawn(hub, user, {"gpu": "1/4", "pool": "t4"})
            assert status in (201, 202), body
        for user in USERS:
            hub.wait_ready(user, timeout=300)
        # all eight on the one GPU's node, each a quarter by quota and memory
        for user in USERS:
            pod = the_pod(devcluster, user)
            assert pod["spec"]["nodeName"] == "gpu-t4-1"
            assert pod["spec"]["nodeSelector"]["nvidia.com/gpu.replicas"] == "8"
            assert pod["metadata"]["annotations"]["fracspawner.io/gpu-memory-mib"] == str(QUARTER)
        await c.cull_once()  # the culler learns the hub's record of the servers (pool, slice)
        swapped: list[str] = []  # users whose kernel the culler swapped out, in order

        def swapped_now() -> list[str]:
            return [u for u, (_k, pid) in kernels.items() if on_gpu(gpu).get(pid) == 0]

        for i, user in enumerate(USERS):
            # the GPU has room for this user's quarter: the margin the culler keeps
            await asyncio.to_thread(
                wait_until, lambda: room_for_a_quarter(gpu), 90, f"room for {user}'s quarter"
            )
            status, body = server_api(hub, user, "POST", "/api/kernels", {"name": "python3"})
            assert status == 201, body
            kid = body["id"]
            code = MY_STATE + f"x = {i + 1} * 1000\nprint(os.getpid())"
            pid = int(await cell(hub, user, kid, code))
            with fake_state(gpu) as data:  # its allocation shows in NVML
                data["gpus"][0]["processes"].append({"pid": pid, "memory_mib": QUARTER, "sm": 0})
            kernels[user] = (kid, pid)
            await asyncio.to_thread(
                wait_until,
                lambda u=user: holds_quarter(hub, u),
                60,
                f"{user}'s monitor reading its quarter",
            )
            for u in swapped_now():
                if u not in swapped:
                    swapped.append(u)
        # the fourth quarter filled the GPU: from then on, one swap per newcomer, oldest first
        await asyncio.to_thread(
            wait_until, lambda: room_for_a_quarter(gpu), 90, "the margin kept after the eighth"
        )
        for u in swapped_now():
            if u not in swapped:
                swapped.append(u)
        assert swapped == USERS[:5], swapped
        orders = c.metrics.registry.get_sample_value(
            "fracspawner_swap_orders_total", {"pool": "t4"}
        )
        assert orders is not None and orders >= 5
        # the meter of a swapped-out kernel says what happened
        h = hibernation(hub, "u1", kernels["u1"][0])
        assert h["state"] == "hibernated" and h["hibernated_gpu_memory_mib"] == QUARTER
        assert "least recently used idle kernel" in h["hibernated_why"]

        # u1 comes back: there is room (the margin), it resumes and has its data (on the
        # culler's grant: its view may lag a report behind the swap that made the room, and
        # then the cell is told it waits a moment)
        out = await cell(hub, "u1", kernels["u1"][0], "print(x, my_state())")
        assert out.strip().splitlines()[-1] == "1000 running", out
        assert all(line == GPU_FULL for line in out.strip().splitlines()[:-1]), out
        # the GPU is full again: the least recently used idle kernel goes (u6's)
        await asyncio.to_thread(
            wait_until, lambda: on_gpu(gpu)[kernels["u6"][1]] == 0, 90, "u6 swapped out"
        )
        assert all(on_gpu(gpu)[kernels[u][1]] == QUARTER for u in ("u1", "u7", "u8"))

        # without a margin the culler swaps only on demand. u2 and u3 come back at once to a
        # GPU with room for one: the other waits while u7's idle kernel (the least recently
        # used) is swapped out, and its cell says so
        c.swap_margin_mib = 0.0
        outs = await asyncio.gather(
            cell(hub, "u2", kernels["u2"][0], "print(x, my_state())"),
            cell(hub, "u3", kernels["u3"][0], "print(x, my_state())"),
        )
        assert [o.strip().splitlines()[-1] for o in outs] == ["2000 running", "3000 running"]
        # one of them waited for the room the swap made (its cell may have been told so)
        assert all("Nothing is lost" not in o and "restart the kernel" not in o for o in outs)
        assert on_gpu(gpu)[kernels["u7"][1]] == 0  # the least recently used idle one left
        assert on_gpu(gpu)[kernels["u8"][1]] == QUARTER  # one swap for one waiting kernel

        # every kernel's data survives: each cell resumes its kernel, one at a time
        for i, user in enumerate(USERS):
            out = await cell(hub, user, kernels[user][0], "print(x, my_state())")
            assert out.strip().splitlines()[-1] == f"{(i + 1) * 1000} running", (user, out)
    finally:
        watcher.done.set()
        watcher.join(5)
        receiver.stop()
    # the memory on the GPU never exceeded its size, and no restore was ever tried into a full
    # GPU (the fake driver follows NVIDIA/cuda-checkpoint#44: one refused restore loses the
    # kernel's GPU state)
    assert watcher.samples > 100 and watcher.peak <= T4_MIB, (watcher.peak, watcher.samples)
    processes = json.loads(gpu.read_text())["gpus"][0]["processes"]
    assert not [p["pid"] for p in processes if p.get("restore_oom")], processes
    stop_all(hub, devcluster, [(u, "") for u in USERS])
