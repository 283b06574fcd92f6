"""Unknown is never idle: the real server extension in a real jupyter server with a real
ipykernel kernel, reading the GPU through NvmlSource from a FAKE pynvml (tests/fake_nvml) that
reproduces what drivers really tell a container: MIG, PIDs from another namespace, no PIDs, a
job re-parented to PID 1. Each report then goes through the culler's own parsing and decision.

The server also shuts its own idle GPU kernels down here (policy from its environment, as
FracSpawner sets it): never while its user works on the server, and without touching its
activity.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from dateutil.parser import isoparse

from fracspawner.culler import decide_server
from fracspawner.culler.decide import ServerFacts
from fracspawner.culler.reports import parse_report
from fracspawner.model.catalog import IdlePolicy
from fracspawner.serverext.attribution import has_own_pid_namespace
from tests.test_culler_support import JupyterServer, execute, wait_for

FAKE_NVML = Path(__file__).parent / "fake_nvml"
KERNEL_GPU_IDLE = 2  # seconds: the policy FracSpawner would put in the environment
# a GPU-idle server is stopped after 1 s here: only unknown activity can keep it
CULL_FAST = IdlePolicy(None, server_gpu_idle=1.0, server_idle=3600.0, max_age=None)
PID_MAX = int(Path("/proc/sys/kernel/pid_max").read_text())


@pytest.fixture(scope="module")
def nvml_state(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("nvml") / "state.json"
    path.write_text(json.dumps({"gpus": []}))
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory, nvml_state):
    tmp = tmp_path_factory.mktemp("jupyter")
    s = JupyterServer(
        tmp,
        tmp / "unused.json",
        source="nvml",
        env={
            "PYTHONPATH": os.pathsep.join([str(FAKE_NVML), os.environ.get("PYTHONPATH", "")]),
            "FAKE_NVML_STATE": str(nvml_state),
            "FRACSPAWNER_GPU_SLICE": "1/4",
            "FRACSPAWNER_KERNEL_GPU_IDLE_SECONDS": str(KERNEL_GPU_IDLE),
        },
        # as in a pod: a PID namespace of its own (this test machine has none)
        monitor={"own_pid_namespace": True},
    )
    try:
        yield s
    finally:
        s.stop()


def set_state(path: Path, **state) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"driver": "575.57.08", "host_pid_offset": 0, **state}))
    tmp.replace(path)


def gpu(processes, *, utilization=0, **kw) -> dict:
    return {"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559,
            "utilization": utilization, "processes": processes, **kw}  # fmt: skip


@pytest.fixture(scope="module")
def kernel(server):
    status, body = server.api("POST", "/api/kernels", {"name": "python3"})
    assert status == 201, body
    code = "import os; print(os.getpid())"
    pid = int(asyncio.run(execute(server.url, server.token, body["id"], code)))
    return body["id"], pid


def report_when(server: JupyterServer, check, what: str) -> dict:
    found: list[dict] = []

    def probe() -> bool:
        status, body = server.api("GET", "/api/fracspawner/gpu")
        found[:] = [body]
        return status == 200 and bool(check(body))

    wait_for(probe, 15, what)
    return found[0]


def culler_decides(report: dict) -> tuple[str, bool]:
    """What the culler makes of this report for an idle GPU server: (action, failsafe)."""
    now = time.time()
    parsed = parse_report(report, received_at=now)
    facts = ServerFacts(
        "u", user_options={"gpu": "1/4"}, started=now - 600, last_activity=now - 600
    )
    d = decide_server(facts, parsed.gpu, CULL_FAST, now)
    return d.action, d.gpu_failsafe


def kernel_alive(server: JupyterServer, kernel_id: str) -> bool:
    # a monitoring request: not the user's activity
    kernels = server.api("GET", "/api/kernels?no_track_activity=1")[1]
    return any(k["id"] == kernel_id for k in kernels)


def unknown_for(server, kernel_id, reason_part: str) -> dict:
    report = report_when(
        server,
        lambda r: (
            r.get("gpu_state") == "unknown"
            and any(reason_part in x for x in r["gpu_unknown_reasons"])
        ),
        f"GPU activity unknown ({reason_part})",
    )
    assert report["gpu_activity_known"] is False and report["gpu_idle_since"] is None
    assert culler_decides(report) == ("keep", True)  # never idle: only the plain timeout
    time.sleep(KERNEL_GPU_IDLE + 1)  # the kernel holds memory, sends nothing: still kept
    assert kernel_alive(server, kernel_id)
    return report


def test_mig_utilisation_cannot_be_read_so_it_is_unknown(server, nvml_state, kernel):
    kernel_id, pid = kernel
    mig = {"name": "NVIDIA A100-SXM4-80GB MIG 2g.20gb", "memory_total_mib": 19968,
           "processes": [{"pid": pid, "memory_mib": 6144, "sm": 0}]}  # fmt: skip
    set_state(nvml_state, gpus=[gpu([], mig=[mig])])
    report = unknown_for(server, kernel_id, "MIG")
    (entry,) = [k for k in report["kernels"] if k["id"] == kernel_id]
    assert entry["gpu_memory_mib"] == 6144 and entry["gpu_activity_known"] is False
    assert report["devices"][0]["utilization"] is None


def test_utilisation_samples_from_another_pid_namespace(server, nvml_state, kernel):
    # drivers 535.113.01-575.57.08 without hostPID: the kernel's process is listed with its
    # PID in the pod, its busy utilisation sample with its host PID
    kernel_id, pid = kernel
    set_state(
        nvml_state,
        driver="560.35.03",
        host_pid_offset=PID_MAX + 1,
        gpus=[gpu([{"pid": pid, "memory_mib": 4096, "sm": 85}], utilization=85)],
    )
    report = unknown_for(server, kernel_id, "whole device")
    (proc,) = report["processes"]
    assert proc["kernel_id"] == kernel_id and proc["gpu_utilization"] == 85
    # the same on a current driver: translated, busy, activity
    set_state(nvml_state, gpus=[gpu([{"pid": pid, "memory_mib": 4096, "sm": 85}], utilization=85)])
    busy = report_when(server, lambda r: r.get("gpu_state") == "busy", "busy")
    assert culler_decides(busy) == ("keep", False)


def test_host_pids_on_old_drivers_are_unmatched_work(server, nvml_state, kernel):
    kernel_id, pid = kernel
    set_state(
        nvml_state,
        driver="530.30.02",
        host_pid_offset=PID_MAX + 1,
        gpus=[gpu([{"pid": pid, "memory_mib": 4096, "sm": 70}], utilization=70)],
    )
    report = unknown_for(server, kernel_id, "cannot match")
    # counted: every GPU process the pod can see holds the server's memory
    assert report["gpu_memory_mib"] == 4096 and report["unattributed_gpu_memory_mib"] == 4096


def test_a_busy_device_listing_no_process_is_unknown(server, nvml_state, kernel):
    # a driver before 535.113.01: the pod's own processes may be hidden from it
    kernel_id, pid = kernel
    state = gpu([{"pid": pid, "memory_mib": 4096, "sm": 90}], utilization=90, list_processes=False)
    set_state(nvml_state, driver="530.30.02", gpus=[state])
    unknown_for(server, kernel_id, "lists no process")


def test_a_neighbours_work_on_a_shared_device_is_not_this_servers(server, nvml_state, kernel):
    """Issue 36, item 7: a 1/4 slice of a time-sliced GPU, a current driver (the pod's own
    processes are listed by their PID in the pod), the server's kernel holds nothing on the GPU:
    the device is busy with a neighbour's work, listed or not. That is not this server's
    activity: its GPU reads idle, not unknown, and its idle clock goes on."""
    neighbour = {"pid": PID_MAX + 7, "memory_mib": 20000, "sm": 95}  # not in this pod's /proc
    set_state(nvml_state, gpus=[gpu([neighbour], utilization=95, list_processes=False)])
    idle = report_when(server, lambda r: r.get("gpu_state") == "idle", "idle, not unknown")
    assert idle["gpu_activity_known"] is True and idle["gpu_unknown_reasons"] == []
    set_state(nvml_state, gpus=[gpu([neighbour], utilization=95)])  # listed, another pod's
    idle = report_when(server, lambda r: r.get("gpu_state") == "idle", "idle, not unknown")
    assert idle["gpu_activity_known"] is True and idle["gpu_unknown_reasons"] == []


async def test_a_job_re_parented_to_pid_1_is_the_pods(server, nvml_state, kernel):
    kernel_id, _ = kernel
    # `nohup python train.py &` from a terminal that then exits: the job's parent is gone
    code = (
        "import os, subprocess, sys\n"
        "r, w = os.pipe()\n"
        "if os.fork() == 0:\n"
        "    child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'],\n"
        "                             start_new_session=True)\n"
        "    os.write(w, str(child.pid).encode()); os._exit(0)\n"
        "os.wait(); print(os.read(r, 32).decode())\n"
    )
    orphan = int(await execute(server.url, server.token, kernel_id, code))
    try:
        assert server.process.pid not in _ancestors(orphan)
        set_state(nvml_state, gpus=[gpu([{"pid": orphan, "memory_mib": 8192, "sm": 95}])])
        report = report_when(server, lambda r: r.get("gpu_state") == "busy", "the job's work")
        assert report["gpu_memory_mib"] == 8192 and report["last_gpu_activity"]
        assert culler_decides(report) == ("keep", False)
    finally:
        os.kill(orphan, signal.SIGKILL)


def _ancestors(pid: int) -> set[int]:
    from fracspawner.serverext.procmap import owner_of

    return set(owner_of(pid).ancestors)


def test_a_pid_namespace_of_its_own_is_detected():
    """What decides whether a re-parented job counts: run the check in a new PID namespace (as in
    a pod) with util-linux's unshare, where this machine allows it."""
    import shutil
    import subprocess
    import sys

    code = "from fracspawner.serverext.attribution import has_own_pid_namespace as f; print(f())"
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare (util-linux)")
    done = subprocess.run(
        [unshare, "--pid", "--fork", "--mount-proc", sys.executable, "-c", code],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    if done.returncode:
        pytest.skip(f"no new PID namespace here: {done.stderr.strip()[-200:]}")
    assert done.stdout.strip() == "True"
    # and a /proc without the namespace link (not Linux): the strict side, descendants only
    assert has_own_pid_namespace(Path("/nonexistent")) is False


def user_works(
    server: JupyterServer,
    kernel_id: str,
    seconds: float,
    *,
    then: Callable[[], None],
    until: Callable[[], bool],
) -> bool:
    """The user works in the server (browses files: API requests) while, after their first
    request, `then()` makes the kernel's GPU idle; once `until()` (the server says so), they
    keep working for `seconds`. The kernel is checked after each request. True: it stayed.
    False: this test itself could not keep the user working (a loaded machine stalled it or
    the server for half the limit), and the server may rightly have taken them for gone. A
    kernel shut down while the server saw activity well within the limit fails the test.

    The server records a request's activity when it ends (jupyter-server's
    `APIHandler.finish`): with every request ending within half the limit of its start and
    starting within half the limit of the previous start, the server never saw the user idle
    for the limit (`finish[i+1] - finish[i] <= end[i+1] - start[i] < limit`). The kernel only
    becomes idle after the first request has ended, so no idle time from before the user
    began (the previous test's last message, a slow wait for the idle report) can count: it
    once did, and the kernel was rightly shut down before the first request (issue 28, 13)."""
    half = KERNEL_GPU_IDLE / 2
    previous: float | None = None
    deadline: float | None = None
    give_up = time.monotonic() + 15  # the idle report never came
    while deadline is None or time.monotonic() < deadline:
        start = time.monotonic()
        status = server.api("GET", "/api/contents")[0]
        ended = time.monotonic()
        assert status == 200
        stalled = (previous is not None and start - previous >= half) or ended - start >= half
        if not kernel_alive(server, kernel_id):
            assert stalled, "the kernel was shut down while its user worked"
            return False
        if stalled:
            return False
        if previous is None:
            then()
        previous = start
        if deadline is None and until():
            deadline = time.monotonic() + seconds
        assert deadline is not None or time.monotonic() < give_up, "no idle report came"
        time.sleep(0.3)
    return True


def test_idle_gpu_kernel_shut_down_by_its_server_never_while_its_user_works(
    server, nvml_state, kernel
):
    kernel_id, pid = kernel
    for _attempt in range(5):
        # the kernel computes on its GPU: never shut down
        set_state(
            nvml_state, gpus=[gpu([{"pid": pid, "memory_mib": 4096, "sm": 90}], utilization=90)]
        )
        report_when(server, lambda r: r.get("gpu_state") == "busy", "busy")
        # the user works in the same server (saves files, browses) while the kernel's GPU
        # goes idle: the idle kernel stays
        idle = [{"pid": pid, "memory_mib": 4096, "sm": 0}]
        if user_works(
            server,
            kernel_id,
            3 * KERNEL_GPU_IDLE,
            then=lambda: set_state(nvml_state, gpus=[gpu(idle)]),  # noqa: B023
            until=lambda: server.api("GET", "/api/fracspawner/gpu")[1].get("gpu_state") == "idle",
        ):
            break
        # the machine stalled this test: the user did not work all along. Again, on a new
        # kernel if the old one is gone
        if not kernel_alive(server, kernel_id):
            status, body = server.api("POST", "/api/kernels", {"name": "python3"})
            assert status == 201, body
            kernel_id = body["id"]
            code = "import os; print(os.getpid())"
            pid = int(asyncio.run(execute(server.url, server.token, kernel_id, code)))
    else:
        pytest.fail("the machine stalled the test's user 5 times: nothing was shown")
    # the user goes away: the server shuts the kernel down itself
    before = server.api("GET", "/api/status")[1]["last_activity"]
    wait_for(lambda: not kernel_alive(server, kernel_id), 15, "the idle GPU kernel shut down")
    report = report_when(
        server,
        lambda r: any(c["id"] == kernel_id for c in r.get("culled_kernels", [])),
        "the cull reported",
    )
    (culled,) = [c for c in report["culled_kernels"] if c["id"] == kernel_id]
    assert culled["gpu_memory_mib"] == 4096
    # shutting it down was not activity: the server's last activity is what it was
    after = server.api("GET", "/api/status")[1]["last_activity"]
    assert isoparse(after) == isoparse(before)
    assert "shutting down kernel " + kernel_id in server.logs()


def test_whose_unplaced_work_is_a_neighbours():
    from fracspawner.serverext.neighbours import neighbours_work

    shared = {"FRACSPAWNER_GPU_SLICE": "1/4"}
    assert neighbours_work(shared, "575.57.08", own_namespace=True)
    assert neighbours_work({"FRACSPAWNER_GPU_SLICE": "10GiB"}, "575.57.08", True)
    # the pod's own work may be hidden: whole GPUs, MPS, old drivers, no PID namespace
    assert neighbours_work({"FRACSPAWNER_GPU_SLICE": "1"}, "575.57.08", True) is None
    assert neighbours_work({**shared, "CUDA_MPS_PIPE_DIRECTORY": "/mps"}, "575.57.08", True) is None
    assert neighbours_work(shared, "530.30.02", True) is None
    assert neighbours_work(shared, None, True) is None
    assert neighbours_work(shared, "575.57.08", False) is None
    assert neighbours_work({"FRACSPAWNER_GPU_SLICE": "mig-1g.10gb"}, "575.57.08", True) is None
