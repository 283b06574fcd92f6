"""Culler benchmarks: what co-tenants gain, against jupyterhub-idle-culler at z2jh's defaults.

(a) Capacity (issue 26, item 5): days of notebook use (benchmarks/culler_trace.py: classroom in
two sections with lectures, research with long silent runs, users taking 30-90 minute breaks;
presence modelled from the person: keyboard and mouse input, tabs closed or left open and
polling) on a FIXED cluster per mix (culler_trace.CLUSTERS: fewer quarter-GPU slots than
users), replayed minute by minute on a virtual clock. A user at the keyboard without a server
asks for one; with no free slot they wait, and leave without one (turned away) if none frees
before they go. Per backend family:

- reserving (HAMi, DRA shares, MIG): a slice is held by its pod from start to stop, its memory
  reserved whether the kernel uses it or not: only a server stop gives anything to others. The
  pool is the demo catalog's HAMi `h100`, with its idle defaults.
- time_sliced (time-slicing, MPS): pods hold the scheduler's replicas the same way, but memory
  is shared: what kernels hold on the GPU is what co-tenants lack, and hibernation gives it
  back. The pool is an H100 time-sliced four ways (`h100-ts`), with its idle defaults.

Against jupyterhub-idle-culler 2.0 with z2jh's defaults (timeout 3600 s, every 600 s; its own
`cull_idle` against a hub API whose times are shifted to its real clock) on the same trace and
cluster; the hub's last_activity counts what the real one does (the proxy's traffic and the
servers' activity posts: every API request, an open tab's polling included). Every fracspawner
decision goes through the real code:

- each server's GPU facts come from the server extension's own monitor (GpuMonitor: apply, the
  in-server kernel shut-down and hibernation, report) fed with the minute's GPU reading, its
  presence from the extension's own Presence fed with the tab's reports as
  labextension/src/presence.ts sends them (every minute while open: visible, seconds since the
  last input; hidden when it closes), and reach the culler as the JSON report it would push
  (parsed by the culler's own reports.parse_report); the tab's meter counts opening the page
  (visible, or loaded in a hidden tab behind the lecture's slides) and showing the tab as
  input, as presence.ts does;
- each pod is a container (a PID namespace of its own) on a driver that lists its processes
  by their PID in it (580.95.05, #44's): on a time-sliced GPU, memory and work of the
  neighbours are theirs (serverext/neighbours.py), not this server's unknown activity;
- the culler runs its whole cycle (`Culler.cull_once(now=...)`) every 5 min against a stand-in
  hub API that serves the simulated servers with JupyterHub's JSON and pagination, and stops
  them on DELETE; its GPU source is the servers' reports (no Prometheus in this replay); and
  `cull_when_waiting` (15 s) after a user's pod began to wait for a slot, as its pod watch
  wakes it (app.Culler.until_next_cycle): a slot it releases (culler/away.py) seats that user
  within the minute, counted apart (`slot_freed_within_a_minute`), not as a wait episode;
- each server reports to the culler every minute where its pool over-commits (before each
  culler cycle elsewhere), and again within the minute where the answer or its swap agent asks
  (`report_in`, a swap done, a resume that starts to wait: up to 2 reports 30 s apart, the
  culler's `swap_report_in` set to 30 s), and at once where its person comes back to a tab
  (a tab's report turns away or unknown into present: `Presence.on_back` ->
  `report_soon(0)`, as serverext/__init__.py wires it), in that minute before the culler's
  cycle, with the monitor's last reading (from before their cells); the culler's real
  `answer_report` answers (swap orders under memory pressure, grants of room for waiting
  resumes, the host memory budget's shut-downs, presence elsewhere) and the server's real
  `SwapAgent` takes the answer. The culler's pod watch is the replay's (each pod's node; on
  HAMi the device its allocation names; a user waiting for a slot has a pod without a node,
  as under the hub's admission "wait", which is how the culler sees that a kept hibernated
  server is needed: keep.py); reports name each physical GPU by its own UUID;
- hibernation runs through the real Hibernator with a fake checkpoint driver: a suspended
  kernel's memory leaves the GPU for its pod's host memory (a 64 GiB pod limit using 8 GiB), and
  the user's next cell resumes it first, in 0.2 s + memory / 5.5 GiB/s (measured), through
  the product's restore path: the room check before every restore (serverext/room.py: on an
  over-committed pool and under HAMi-core only the culler's grant counts, elsewhere NVML of the
  device with a margin), the resume waiting for room meanwhile (`memory_waits`: cell-minutes;
  `kernel_wait_minutes`: the person-minutes at the keyboard with such a cell queued).
  Each pod's NVML is what it would read: the whole GPU on time-slicing, HAMi-core's virtualised
  view on the reserving pool: its slice's limit, and as used HAMi-core's count of what the pod's
  kernels allocated, a hibernated one's included (`SimServer.charged_mib`), which is also what
  HAMi-core holds the pod's allocations to (a kernel cannot grow into its hibernated sibling's
  share). A physical GPU short of room fails an allocation with CUDA out of memory on either
  pool (HAMi-core reads no `CUDA_OVERSUBSCRIBE`: docs/culler.md). The driver follows
  NVIDIA/cuda-checkpoint#44: a restore the physical GPU has no room for fails with
  OUT_OF_MEMORY and every later one with 304, the kernel's GPU state lost (`gpu_state_lost`).
  The Hibernator's clock is the replay's (`Hibernator.now`), its driver calls run inline;
- users as they behave (benchmarks/culler_trace.py): hidden notebook tabs in lectures, silences
  of 45-75 min at a visible tab, kernels that grow, and silent runs in a child process of the
  kernel (its GPU process another pid than the kernel's, the kernel idle meanwhile), slices
  from 1/8 to a whole GPU (the user's on the reserving pool; a quarter replica on the
  time-sliced pool, which offers only that), and a second notebook (a second kernel in the
  server, with its own memory, idle between its cells);
- on an over-committed pool a new server is admitted by the hub's admission by presence (issue
  36 item 5), the product's: the culler's room answer (`Culler.room_json`: a present user's
  server holds its whole slice, an absent one what the swap cannot take off) and the hub's
  verdict and line (hub/room.py), with the servers admitted since the culler's last count in
  flight; a user with a free slot but no room waits in line with the hub's reason
  (`admission_waits`; `Sim.room_reasons`). The culler has listed the hub before the day starts.

The headline (issue 36): the same trace on HALF the GPUs of each mix's cluster, over-committed
(`overcommit: 2`), against jupyterhub-idle-culler on all of them (`capacity.<mix>.<family>.
half_gpus`). The host memory budget per node is the culler's default, derived as in a cluster:
`host_memory_budget_fraction` (a quarter) of each Node's allocatable memory, the nodes being GCP
a3-highgpu-2g machines (2 H100, 468 GB; `NODE_MEMORY`: 420.3 GiB allocatable, a 105.1 GiB budget),
ordered by `answer_report` and carried out by each server's SwapAgent (`host_budget_orders`,
counted as kernel shut-downs): the oldest hibernated kernels of users neither present nor in
session; the peak is read every minute.

Measures per mix and family (`culler.json` -> `capacity`; percentages are of
jupyterhub-idle-culler's figure on the same trace and cluster): users who had to wait or were
turned away (wait episodes) and the 95th percentile of their waits, idle reserved slice-hours
(slices held while their user is away and their GPU idle), idle GPU memory on the GPU (GiB-hours
held by idle kernels while their user is away), disruptions (a kernel shut down or a server
stopped that its user comes back to within 30 min), culls of a present user, false culls (while
the GPU worked), `resume_failures` (cells that met CUDA out of memory: a first allocation or
a growing kernel at its own slice's limit under HAMi-core, or with no room beside its co-tenants
on a shared GPU; `cuda_oom_co_tenants` counts the latter), stalled background runs (a silent
run killed, suspended, or never started for want of a server), runs lost to CUDA out of memory
(`runs_lost_to_cuda_oom`, `..._co_tenants`: a run ends at its first error, see `Sim.run_failed`),
and the host memory hibernation takes, peak per node.
Goals: waiting <= 50 % of the baseline on every mix, disruptions <= the baseline, 0 culls of a
present user, 0 false culls. Beside them each row has the person-minutes its users and the
baseline's waited for a server (`wait_minutes`, `baseline_wait_minutes`) and the `floor` of the
cluster it ran on (benchmarks/culler_floor.py: what any culler keeping the issue's rules must make
people wait, from the trace alone), which says what limits a goal that is missed.

The `hibernation` key keeps the figures of the row that gives memory back by hibernation alone
(hibernate after 5 min, kernels never shut down for GPU idleness, GPU server after 2 h), on the
time-sliced pool, where the memory it frees is usable by others.

(b) One culling cycle over 5,000 ready servers (cycle time, HTTP requests) for both cullers
against the same stand-in hub API: 5,000 real single-user servers do not fit this machine.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from unittest import mock

import yaml
from tornado import web
from tornado.httpserver import HTTPServer

from benchmarks.culler_floor import floor
from benchmarks.culler_trace import (
    CLUSTERS,
    HORIZON,
    MIXES,
    SECOND_SHARE,
    SEED,
    Cluster,
    User,
    make_mix,
)
from devcluster.localhub import free_port
from fracspawner.culler.app import Culler
from fracspawner.culler.identity import Identity
from fracspawner.culler.nodememory import NodeMemory
from fracspawner.culler.placement import Placement
from fracspawner.culler.podname import pod_name
from fracspawner.culler.reports import parse_report
from fracspawner.hub.room import RoomLine, counted_tags, server_tag
from fracspawner.hub.room import verdict as room_verdict
from fracspawner.serverext import hibernate as hibernate_module
from fracspawner.serverext.activity import server_activity, user_activity
from fracspawner.serverext.hibernate import Hibernator
from fracspawner.serverext.monitor import GpuMonitor
from fracspawner.serverext.podinfo import ENV_SLICE, PodInfo
from fracspawner.serverext.presence import SETTINGS_KEY as PRESENCE_KEY
from fracspawner.serverext.presence import Presence, parse_client_report
from fracspawner.serverext.room import HAMI_ENV
from fracspawner.serverext.sources import GpuDevice, GpuProcess, GpuSample
from fracspawner.serverext.swap import ENV_OVERCOMMIT, SwapAgent

REPO = Path(__file__).resolve().parent.parent
N_SERVERS = 5000
GPU_SHARE = 0.3
MAX_PAGE = 200  # JupyterHub's default api_page_max_limit
T0 = 1_700_006_400.0 - 1_700_006_400.0 % 86400 + 6 * 3600  # 06:00 UTC, the virtual day one
BUSY = 90.0  # a working GPU's utilisation
GPU_MIB = 81559  # an H100 80GB HBM3 as NVML reports it
QUIET = logging.getLogger("bench-culler")
QUIET.setLevel(logging.ERROR)

# the backend families and the catalog pool each is replayed on
FAMILIES = {"reserving": "h100", "time_sliced": "h100-ts"}
HIBERNATE_ROW = "fracspawner_hibernate"
# the reserving pool with the in-server kernel shut-down the catalog turns on (30 min, the default
# before kernel_gpu_idle followed the backend): on a reserving backend a kernel shut down frees
# memory nobody else may use (the slice stays its pod's), so this row shows what the shut-downs
# cost there; by default they are off there (fracspawner/model/idle_defaults.py)
KERNEL_ON_ROW = "fracspawner_reserving_kernel_30m"
# over-commit with swap (issue 26 item 3; the catalog's `overcommit` on both pools): twice the
# slots per GPU, idle kernels hibernated after 10 min (the default where a pool over-commits)
# so the memory on each GPU fits; the `capacity` figures are these rows'
OVERCOMMIT = 2
OVERCOMMIT_KIND = "fracspawner_overcommit"
# the same, with hibernation as the only way kernels give memory back (kernel_gpu_idle off):
# what the in-server kernel shut-downs cost once hibernation swaps idle kernels out
OVERCOMMIT_KERNEL_OFF = "fracspawner_overcommit_kernel_off"
# GPU hibernation as the way to give memory back: suspend after 5 min, never shut the kernel
# down for GPU idleness, stop a GPU-idle server after 2 h
HIBERNATE_IDLE = {"kernel_gpu_hibernate": "5m", "kernel_gpu_idle": "off", "server_gpu_idle": "2h"}
# the fake checkpoint driver's resume time: a fixed part (re-acquiring the GPU, restoring contexts
# and streams) plus the memory at the rate the real driver restores, not the link's: measured by
# `make test-gpu` on an H200, driver 580.159.04 (docs/serverext.md): a 1.5 GiB kernel's resume
# 0.41-0.49 s, an 84 GiB one's 0.16-0.18 s/GiB, i.e. about 0.2 s + memory / 5.5 GiB/s. PCIe's
# 25 GiB/s, the model before, made resumes look 4 to 5 times shorter than users wait
COPY_GIB_S = 5.5
COPY_FIXED_S = 0.2
POD_HOST_MEMORY_GIB, POD_HOST_USED_GIB = 64, 8  # each pod's memory limit and what it uses
CAME_BACK_MIN = 30  # a cull its user comes back to within this is a disruption
GROWS_BY, GROWS_TO = 0.01, 1.5  # a growing kernel: 1 % of its size a working minute, to 1.5 x


ROUNDS, ROUND_SECONDS = 2, 30  # reports within a minute where the culler or a swap asks one
CHILD_PID = 50_000  # a kernel's child process: another pid than the kernel's
GPU_NAME = "NVIDIA H100 80GB HBM3"
DRIVER = "580.95.05"  # the driver of NVIDIA/cuda-checkpoint#44, which the fake driver follows
FOREVER = 1e9  # seconds: a real-clock timeout that never comes in a replay


async def settle() -> None:
    """Let the tasks the replay started (a resume, a swap order, a shut-down) run until each
    waits for something: offload is inline and real-clock timeouts never come, so they all do
    within a few turns of the loop, in the same order on every run."""
    loop = asyncio.get_running_loop()
    for _ in range(10_000):
        await asyncio.sleep(0)
        if not loop._ready:  # type: ignore[attr-defined]  # nothing left to run now
            return


async def _inline(call: Callable[..., Any], *args: Any) -> Any:
    """Hibernator.offload in the replay: the fake driver does not block, and in the event loop
    the replay's order of events is the same on every run."""
    return call(*args)


def copy_seconds(memory_mib: float) -> float:
    return round(COPY_FIXED_S + memory_mib / 1024 / COPY_GIB_S, 3)


class SimCheckpointDriver:
    """The fake checkpoint driver for the replay: the documented states (running -> locked ->
    checkpointed -> locked -> running; tests/fake_nvml/cuda/bindings/driver.py cites them) by
    pid, in memory; copy time from `copy_seconds` (virtual: nothing sleeps).

    A restore follows NVIDIA/cuda-checkpoint#44 (driver 580.95.05, CUDA 13.0), as the test
    driver does: where the physical GPU has no room for the kernel's memory (`fits(pid)`, the
    replay's reading of its GPU) it fails with CUDA_ERROR_OUT_OF_MEMORY, the process stays
    CHECKPOINTED, and every later restore answers CUDA_ERROR_OPERATING_SYSTEM (304): the
    kernel's GPU state is lost (`lost`, counted as `gpu_state_lost`)."""

    def __init__(self, fits: Callable[[int], bool] = lambda _pid: True) -> None:
        self.states: dict[int, str] = {}
        self.fits = fits
        self.lost: set[int] = set()
        self.restored = 0  # restores that went through
        self.on_restore: Callable[[int], None] = lambda _pid: None

    def check(self) -> None:
        pass

    def state(self, pid: int) -> str:
        return self.states.get(pid, "running")

    def _move(self, pid: int, start: str, end: str, call: str) -> None:
        from fracspawner.serverext.checkpoint import CheckpointError

        if self.state(pid) != start:
            raise CheckpointError(call, "CUDA_ERROR_ILLEGAL_STATE")
        self.states[pid] = end

    def lock(self, pid: int, timeout_ms: int) -> None:
        self._move(pid, "running", "locked", "cuCheckpointProcessLock")

    def checkpoint(self, pid: int) -> None:
        self._move(pid, "locked", "checkpointed", "cuCheckpointProcessCheckpoint")

    def restore(self, pid: int) -> None:
        from fracspawner.serverext.checkpoint import CheckpointError

        call = "cuCheckpointProcessRestore"
        if self.state(pid) == "checkpointed" and pid in self.lost:
            raise CheckpointError(call, "CUDA_ERROR_OPERATING_SYSTEM")  # #44: for good
        if self.state(pid) == "checkpointed" and not self.fits(pid):
            self.lost.add(pid)  # stays CHECKPOINTED, and lost (#44)
            raise CheckpointError(call, "CUDA_ERROR_OUT_OF_MEMORY")
        self.on_restore(pid)
        self._move(pid, "checkpointed", "locked", call)
        self.restored += 1

    def unlock(self, pid: int) -> None:
        self._move(pid, "locked", "running", "cuCheckpointProcessUnlock")


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat().replace("+00:00", "Z")


def _dt(t: float) -> datetime:
    return datetime.fromtimestamp(t, timezone.utc)


def v(m: int) -> float:
    return T0 + m * 60.0


def jupyter_last_activity(settings: dict) -> datetime:
    """jupyter-server's `ServerWebApplication.last_activity()`: the start, the kernels' activity
    and every settings key ending in `_last_activity` (API requests, our GPU work and presence)
    and `last_activity_times`. What the single-user server posts to the hub, and what the
    hub's proxy poll sees move with every request (an open tab's polling included)."""
    times = [settings["started"], settings["kernel_manager"].last_kernel_activity]
    times += [val for key, val in settings.items() if key.endswith("_last_activity")]
    times += list(settings["last_activity_times"].values())
    return max(t for t in times if t is not None)


# --- a stand-in for the hub's REST API (the two calls cullers make) ---------------------------
class StandInHub:
    """JupyterHub's REST shapes for listing ready servers and stopping one; counts requests.

    `users()` gives the user models; `offset` shifts every time it serves (a culler reading the
    real clock sees virtual times as that far in its past); `on_delete(name)` stops a server."""

    def __init__(self, users, on_delete=lambda name: None):
        self.users, self.on_delete = users, on_delete
        self.requests = 0
        self.deleted: list[str] = []
        hub = self

        class Base(web.RequestHandler):
            def prepare(self) -> None:
                hub.requests += 1

        class Root(Base):
            def get(self) -> None:
                self.write({"version": "5.2.1"})

        class Users(Base):
            def get(self) -> None:
                users = hub.users()
                offset = int(self.get_argument("offset", "0"))
                limit = min(int(self.get_argument("limit", "50") or 50), MAX_PAGE)
                items = users[offset : offset + limit]
                nxt = None
                if offset + limit < len(users):
                    base = f"{self.request.protocol}://{self.request.host}/hub/api/users"
                    url = f"{base}?state=ready&offset={offset + limit}&limit={limit}"
                    nxt = {"offset": offset + limit, "limit": limit, "url": url}
                if "pagination" in self.request.headers.get("Accept", ""):
                    page = {"offset": offset, "limit": limit, "total": len(users), "next": nxt}
                    self.write({"items": items, "_pagination": page})
                else:
                    self.write(json.dumps(users))

        class Server(Base):
            def delete(self, user: str) -> None:
                hub.deleted.append(user)
                hub.on_delete(user)
                self.set_status(204)

        self.app = web.Application(
            [
                (r"/hub/api/", Root),
                (r"/hub/api/users", Users),
                (r"/hub/api/users/([^/]+)/server", Server),
            ]
        )


def server_model(name: str, started: float, last: float, options: dict) -> dict:
    server = {
        "name": "", "last_activity": _iso(last), "started": _iso(started), "pending": None,
        "ready": True, "stopped": False, "url": f"/user/{name}/", "user_options": options,
    }  # fmt: skip
    return {"kind": "user", "name": name, "admin": False, "last_activity": _iso(last),
            "servers": {"": server}}  # fmt: skip


# --- the simulated servers --------------------------------------------------------------------
class SimKernel:
    def __init__(self, now: datetime, pid: int):
        self.last_activity, self.execution_state = now, "idle"
        self.pid = pid  # the kernel process, for the checkpoint driver


class SimKernels:
    """The state jupyter-server's kernel manager holds, for the monitor to read and shut down."""

    def __init__(self, server: SimServer):
        self.server = server
        self.kernels: dict[str, SimKernel] = {}
        self.last_kernel_activity: datetime | None = None

    def list_kernel_ids(self) -> list[str]:
        return list(self.kernels)

    def get_kernel(self, kernel_id: str) -> SimKernel:
        return self.kernels[kernel_id]

    async def shutdown_kernel(self, kernel_id: str) -> None:
        s = self.server
        busy = s.busy2 if kernel_id == s.kernel2_id else s.busy  # the kernel shut down, working?
        del self.kernels[kernel_id]
        s.kernel_ended(kernel_id)
        s.on_shutdown(s, busy)  # counted as a kernel shut-down (Sim.kernel_culled)


@dataclass
class Cull:
    kind: str  # "server" | "kernel"
    user: str
    minute: int
    busy: bool  # the GPU was working for it at that minute
    present: bool  # its user was at the keyboard


class SimServer:
    def __init__(
        self,
        user: User,
        m: int,
        env: dict[str, str],
        gpu: int,
        host: Path,
        extension: bool,
        free_mib: Callable[[SimServer], float] = lambda _s: float(GPU_MIB),
        overcommit: int = 1,
        virtualised: bool = False,
        clock: Callable[[], datetime] | None = None,
    ):
        self.user, self.started, self.gpu = user, v(m), gpu
        # its slice (the hub's record, the pod's limit): the user's on the reserving pool, a
        # quarter replica on the time-sliced one (it offers only 1/replicas)
        self.slice = env.get("FRACSPAWNER_GPU_SLICE", user.slice)
        self.gpu_equivalent = slice_equivalent(self.slice)
        self.uuid = f"GPU-sim-{gpu:04d}"  # the physical GPU, as NVML names it
        self.virtualised = virtualised  # HAMi-core: its NVML shows its slice, not the GPU
        self.kernels = SimKernels(self)
        self.on_shutdown: Callable[[SimServer, bool], None] = lambda _s, _busy: None
        now = _dt(v(m))
        self.clock = clock or (lambda: now)
        self.settings: dict[str, Any] = {
            "kernel_manager": self.kernels, "started": now, "api_last_activity": now,
            "last_activity_times": {},
        }  # fmt: skip
        # a person back at a tab: the server reports at once (serverext/__init__.py wires
        # Presence.on_back -> GpuReporter.report_soon(0)); `Sim.report_back` sends it
        self.back_now = False
        if extension:  # the tab's presence reports reach the server extension
            presence = self.settings[PRESENCE_KEY] = Presence(settings=self.settings, log=QUIET)
            presence.on_back = self._report_at_once
        self.monitor = GpuMonitor(
            settings=self.settings, source_spec="none", log=QUIET, own_pid_namespace=True
        )  # a container: the pod has a PID namespace of its own (Kubernetes' default)
        self.monitor.reason, self.monitor.started = None, now  # readings come from here
        self.monitor.pod = PodInfo.from_environ(env)
        # hibernation through the fake checkpoint driver, in a pod with POD_HOST_MEMORY_GIB;
        # the driver restores only what the physical GPU has room for (#44 otherwise: lost)
        self.driver = SimCheckpointDriver(
            lambda pid: (
                free_mib(self) - self.on_gpu_mib(besides=self.kernel_of(pid))
                >= self.monitor.hibernator.memory_of(self.kernel_of(pid))
            )
        )
        hib = self.monitor.hibernator = Hibernator(
            driver=self.driver,
            log=QUIET,
            cpu_probe_seconds=0,  # no real kernel processes to watch (virtual time)
            retry_refused_after=0,  # a refused kernel is tried at each (virtual) reading
            cgroup_root=str(host),
            meminfo_path=str(host / "meminfo"),
            # virtual time: a waiting resume moves only when the culler's grant or a reading
            # with room wakes it (never at a real-clock timeout in the middle of a minute)
            retry_first=FOREVER,
            room_poll=FOREVER,
            wait_bound=FOREVER,
        )
        hib.now = self.clock  # type: ignore[method-assign]
        hib.offload = _inline  # type: ignore[method-assign]
        # the real swap agent (serverext/swap.py): the culler's orders and grants, the room
        # check before every restore (serverext/room.py), in the environment FracSpawner gives
        # the pod (FRACSPAWNER_GPU_OVERCOMMIT; HAMi-core's CUDA_DEVICE_MEMORY_LIMIT_0)
        self.report_now = False  # the agent wants a report at once (swap.py report_soon)
        pod_env = {ENV_OVERCOMMIT: str(overcommit)}
        if virtualised:
            pod_env["CUDA_DEVICE_MEMORY_LIMIT_0"] = f"{int(self.slice_mib())}m"
        with mock.patch.dict(os.environ, pod_env):
            for key in [k for k in os.environ if k.startswith(HAMI_ENV) and not virtualised]:
                os.environ.pop(key)
            self.swap = SwapAgent(self.monitor, self._report_soon, log=QUIET)
        self.swap.room_check = FOREVER  # its watch looks once; the replay looks each minute
        # it reports to the culler: it hibernates with room in its node's host budget only
        # (serverext/__init__.py sets this where the reporter is on; culler/hostroom.py)
        self.swap.ask_host_room = True
        self.kernel_id: str | None = None
        self.kernel_mib = self.first_mib()  # what its kernel holds once it uses the GPU
        self.holds_memory = self.run_alive = self.busy = False
        # the user's second notebook (culler_trace `second`): its own kernel, idle unless its
        # cells run, holding SECOND_SHARE of the main kernel's memory once it used the GPU
        self.kernel2_id: str | None = None
        self.kernel2_mib = 0.0
        self.holds2 = self.busy2 = False
        self.child_run = False  # the run works in a child process of the kernel
        self.pod = ""  # its pod's name (the culler's pod watch)
        self.hub_last = v(m)
        self.serial = 0
        self.tab_was_open = False
        self.tab_was_visible = False

    def slice_mib(self) -> float:
        return GPU_MIB * self.gpu_equivalent

    def first_mib(self) -> float:
        """What its kernel holds once it uses the GPU: under HAMi-core no more than the slice
        (its limit: an allocation beyond fails with CUDA out of memory; the user fits the
        batch to it)."""
        mib = float(self.user.memory_mib)
        return min(mib, self.slice_mib()) if self.virtualised else mib

    def _report_soon(self, _seconds: float) -> None:
        self.report_now = True

    def _report_at_once(self) -> None:
        self.back_now = True

    def kernel_ended(self, kernel_id: str | None = None) -> None:
        if kernel_id is not None and kernel_id == self.kernel2_id:
            self.kernel2_id, self.holds2, self.busy2 = None, False, False
            return
        self.kernel_id, self.holds_memory, self.run_alive = None, False, False

    def ensure_kernel2(self, now: datetime) -> SimKernel:
        """The second notebook's kernel (started by its first cell)."""
        if self.kernel2_id is None:
            self.serial += 1
            self.kernel2_id = f"{self.user.name}-{self.serial:04d}-0000-0000-000000000002"
            self.kernels.kernels[self.kernel2_id] = SimKernel(now, 1000 + self.serial)
            mib = float(self.user.memory_mib) * SECOND_SHARE
            self.kernel2_mib = min(mib, self.slice_mib()) if self.virtualised else mib
        return self.kernels.kernels[self.kernel2_id]

    def kernel_of(self, pid: int) -> str:
        """The kernel whose process `pid` is (the checkpoint driver names processes)."""
        return next((k for k, sk in self.kernels.kernels.items() if sk.pid == pid), "")

    def hibernated2(self) -> bool:
        return self.kernel2_id is not None and self.monitor.hibernator.suspended(self.kernel2_id)

    def ensure_kernel(self, now: datetime) -> SimKernel:
        if self.kernel_id is None:
            self.serial += 1
            self.kernel_id = f"{self.user.name}-{self.serial:04d}-0000-0000-000000000000"
            pid = 1000 + self.serial
            self.kernels.kernels[self.kernel_id] = SimKernel(now, pid)
            self.kernel_mib = self.first_mib()  # a new kernel starts at its size
        return self.kernels.kernels[self.kernel_id]

    def hibernated(self) -> bool:
        return self.kernel_id is not None and self.monitor.hibernator.suspended(self.kernel_id)

    def charged_mib(self) -> float:
        """What HAMi-core counts against the pod's limit, and shows the pod as the device's used
        memory: what its kernels allocated, a hibernated kernel's included. Its count moves only
        in its allocation and free hooks, and when a process exits (Project-HAMi/HAMi-core
        src/multiprocess/multiprocess_memory_limit.c `get_gpu_memory_usage`, src/nvml/hook.c);
        cuda-checkpoint frees a checkpointed process's device memory inside the driver, through
        none of them. So a hibernated kernel's memory is still its pod's to the limit: the
        pod's other kernel cannot take it."""
        first = self.kernel_mib if self.kernel_id is not None and self.holds_memory else 0.0
        second = self.kernel2_mib if self.kernel2_id is not None and self.holds2 else 0.0
        return first + second

    def over_limit(self, mib: float) -> bool:
        """Whether HAMi-core refuses an allocation of `mib` more: beyond the pod's limit by its
        count (`charged_mib`); never on the time-sliced pool, where nothing limits the pod."""
        return self.virtualised and self.charged_mib() + mib > self.slice_mib()

    def on_gpu_mib(self, besides: str | None = None) -> float:
        """GPU memory its kernels hold on the GPU itself (not hibernated), but `besides`."""
        first = second = 0.0
        if self.kernel_id is not None and self.holds_memory and not self.hibernated():
            first = self.kernel_mib if besides != self.kernel_id else 0.0
        if self.kernel2_id is not None and self.holds2 and not self.hibernated2():
            second = self.kernel2_mib if besides != self.kernel2_id else 0.0
        return first + second


# The replay's nodes (2 H100 80GB each: culler_trace.Cluster) are GCP a3-highgpu-2g machines
# (2 H100 80GB, 52 vCPUs, 468 GB of memory); a GKE node's allocatable memory is that less the
# kubelet's reservation (25 % of the first 4 GiB, 20 % of the next 4, 10 % of the next 8, 6 % of
# the next 112, 2 % above 128 GiB) and the 100 MiB eviction threshold (GKE's "plan node sizes"):
# 420.3 GiB, which the culler reads from each Node (Culler.host_memory_budget_fraction)
NODE_TYPE = "a3-highgpu-2g"
NODE_MEMORY = "430370Mi"


class PodWatch:
    """The culler's pod watch (serverpods.py) as the replay has the pods: each server's node,
    on HAMi the device its allocation names (`hami.io/vgpu-devices-allocated`), and its pool
    and slice's memory by FracSpawner's label and annotation; every pod from the moment it is
    made, before the culler's next hub listing (`placements`: culler/unlisted.py)."""

    def __init__(self, sim: Sim) -> None:
        self.sim = sim
        # and the node watch (nodememory.py): every node is a NODE_TYPE, the culler derives
        # each one's host memory budget from its allocatable memory, as in a cluster
        self.nodes = NodeMemory()
        count = -(-sim.cluster.gpus // sim.cluster.gpus_per_node)
        self.nodes.load(
            {"metadata": {"name": f"node-{i}"}, "status": {"allocatable": {"memory": NODE_MEMORY}}}
            for i in range(count)
        )

    def placement(self, name: str, namespace: str | None = None) -> Placement | None:
        s = self.sim.pods.get(name)
        if s is None:
            return None
        node = f"node-{self.sim.cluster.node_of(s.gpu)}"
        uuids = frozenset({s.uuid}) if s.virtualised else None
        return Placement(node, 1, uuids, pool=self.sim.pool, memory_mib=s.slice_mib(),
                         owner=(s.user.name, ""))  # fmt: skip

    def placements(self) -> list[tuple[str, Placement]]:
        made = [(name, p) for name in self.sim.pods if (p := self.placement(name)) is not None]
        # a user waiting for a slot: under admission "wait" FracSpawner makes the pod and it
        # stays Pending (no node) until a slot frees (hub/spawner.py `admission`)
        pending = [
            (pod_name(u.name, ""), Placement(None, 1, pool=self.sim.pool, owner=(u.name, ""),
                                              memory_mib=slice_annotation_mib(piece),
                                              created=self._made(u.name)))
            for u, piece in self.sim.slot_waiting.values()
        ]  # fmt: skip
        return made + pending

    def _made(self, user: str) -> float:
        """When a waiting user's pod was made: the minute they began to wait (its
        creationTimestamp, in the replay's clock)."""
        return v(self.sim.waiting.get(user, self.sim.minute))

    def known(self, address: str) -> bool:
        return False  # reports are handed over in process, not from pod addresses


class Sim:
    """One mix under one culler, on one backend family's pool, on a fixed cluster."""

    def __init__(
        self,
        users: list[User],
        kind: str,
        cluster: Cluster,
        family: str,
        catalog: dict,
        overcommit: int = 1,
    ):
        self.users, self.kind, self.cluster, self.family = users, kind, cluster, family
        self.pool = FAMILIES[family]
        # what a GPU seats, in GPU-equivalents: slots of a quarter, times over-commit
        self.gpu_capacity = cluster.slots_per_gpu * 0.25 * overcommit
        self.overcommit = overcommit
        # over-committed slots seat a server only where the hub's admission by presence finds
        # room for its slice (`room_for`); the users kept waiting for room while slots were free
        self.admission_waits = 0
        self.gpu_state_lost = 0  # kernels of stopped servers whose restore met #44
        # where kernels share the GPU's physical memory: a time-sliced GPU, or any pool that
        # commits more memory than the GPU has; a cell needing memory there may find no room
        self.shared_memory = family == "time_sliced" or overcommit > 1
        self.servers: dict[str, SimServer] = {}
        self.culls: list[Cull] = []
        self.minute = 0
        self.env = notebook_env_for(catalog, self.pool)
        self.extension = kind != "idle-culler"
        self.used = [0.0] * cluster.gpus  # GPU-equivalents taken per GPU (slices, replicas)
        self.waiting: dict[str, int] = {}  # user -> minute they began to wait
        # those waiting for a slot (not for room at admission): their pods are made, Pending
        self.slot_waiting: dict[str, tuple[User, str]] = {}
        self.waits: list[tuple[str, int, bool]] = []  # (user, minutes, turned away)
        # users who found no free slot, for whom the culler's early cycle released one within
        # the same minute (`early_cycle`): not wait episodes, counted apart
        self.quick_waits = 0
        self.last_input: dict[str, int] = {}
        self.runs_stalled: set[tuple[str, int]] = set()  # (user, first minute of the run)
        self.runs: set[tuple[str, int]] = set()
        # runs that ended with CUDA out of memory (run_failed): whether at their own slice's
        # limit (True) or for want of room beside co-tenants (False)
        self.runs_oom: dict[tuple[str, int], bool] = {}
        self.idle_gpu_memory = 0.0  # MiB-minutes held on the GPU by idle kernels, user away
        self.idle_slices = 0.0  # GPU-equivalent minutes held while away and GPU idle
        self.offset = 0.0  # real - virtual seconds, for jupyterhub-idle-culler
        self.host: Path = Path("/nonexistent")  # the pods' cgroup and meminfo files
        self.hibernations = 0
        self.resume_seconds: list[float] = []
        self.resume_failures = 0
        # of them, cells that met no room beside co-tenants (not their own slice's limit)
        self.oom_co_tenants = 0
        self.host_peak_node_mib = 0.0
        self.host_peak_total_mib = 0.0
        self.pods: dict[str, SimServer] = {}  # pod name -> server (the culler's pod watch)
        self.now_t = v(0)  # the virtual clock (seconds), for the servers' and culler's clocks
        self.virtualised = family == "reserving"  # HAMi-core's NVML: the pod's slice only
        self.memory_waits = 0  # minutes a cell waited for its kernel's room on the GPU
        # person-minutes at the keyboard with a cell queued behind its kernel's resume, waiting
        # for room (from the cell that woke it until the kernel is back): the person has a
        # server and cannot use that notebook; `wait_minutes` counts only those without one
        self.kernel_wait_minutes = 0
        self.restores = 0  # resumes the real restore path brought back
        self.swap_orders = self.grants = self.budget_orders = 0  # what the culler's answers said
        # the hub's admission by presence (room_for): its line, the culler's answer this
        # minute, and each waiting user's reason as the pending page says it
        self.culler: Culler | None = None
        self.room_line = RoomLine()
        self.room_answer: dict | None = None
        self.room_reasons: dict[str, str] = {}

    def hub_users(self) -> list[dict]:
        return [
            server_model(
                n,
                s.started + self.offset,
                s.hub_last + self.offset,
                {"gpu": s.slice, "pool": self.pool},
            )  # fmt: skip
            for n, s in sorted(self.servers.items())
        ]

    def stop(self, name: str) -> None:
        s = self.servers.pop(name, None)
        if s is not None:
            u = s.user
            self.pods.pop(s.pod, None)
            for kid in list(s.monitor.hibernator.kernels):
                s.monitor.hibernator.forget(kid)  # the pod is gone: its waits end with it
            self.used[s.gpu] -= s.gpu_equivalent
            self.room_line.release((name, ""))
            self.gpu_state_lost += len(s.driver.lost)
            busy = s.busy or s.busy2
            self.culls.append(Cull("server", name, self.minute, busy, u.present[self.minute]))

    # --- demand on the fixed cluster ----------------------------------------------------------
    def demand(self, u: User, m: int) -> SimServer | None:
        """A person at the keyboard without a server asks for one: a free slot, or a wait; a
        waiting person who leaves goes without (turned away)."""
        s = self.servers.get(u.name)
        self.slot_waiting.pop(u.name, None)
        if s is not None:
            return s
        if not u.present[m]:
            if u.name in self.waiting:
                self.waits.append((u.name, m - self.waiting.pop(u.name), True))
                self.room_line.leave(self.pool, (u.name, ""))
            return None
        # the least allocated GPU first, as kube-scheduler's default NodeResourcesFit scoring
        # (LeastAllocated) and HAMi's "spread" GPU policy place pods; the hub's admission by
        # presence (the product's) before it, where the pool over-commits
        piece = self.slice_for(u)
        eq = slice_equivalent(piece)
        slotted = [g for g, n in enumerate(self.used) if n + eq <= self.gpu_capacity + 1e-9]
        free = min(slotted, key=lambda g: (self.used[g], g)) if slotted else None
        if free is None:
            self.slot_waiting[u.name] = (u, piece)
        elif not self.room_for(u, eq):
            self.admission_waits += u.name not in self.waiting  # a slot, but no room behind it
            free = None
        if free is None:
            self.waiting.setdefault(u.name, m)
            return None
        if u.name in self.waiting:
            self.waits.append((u.name, m - self.waiting.pop(u.name), False))
        self.used[free] += eq
        s = self.servers[u.name] = SimServer(
            u,
            m,
            self.env | {"FRACSPAWNER_GPU_SLICE": piece},
            free,
            self.host,
            self.extension,
            lambda me: self.gpu_free_mib(me.gpu, me),
            overcommit=self.overcommit,
            virtualised=self.virtualised,
            clock=lambda: _dt(self.now_t),
        )
        s.on_shutdown = self.kernel_culled
        # the idle rung's hibernations, whether at a reading or once the culler gave the
        # node's host room (swap.py `_hibernate_due`)
        real_idle = s.monitor.hibernate_idle_kernels

        async def idle_hibernations(now: datetime | None = None) -> list[str]:
            done = await real_idle(now)
            self.hibernations += len(done)
            return done

        s.monitor.hibernate_idle_kernels = idle_hibernations  # type: ignore[method-assign]
        s.driver.on_restore = lambda pid: self.resume_seconds.append(
            copy_seconds(s.monitor.hibernator.memory_of(s.kernel_of(pid)))
        )
        s.pod = pod_name(u.name, "")
        self.pods[s.pod] = s
        return s

    def kernel_culled(self, s: SimServer, busy: bool) -> None:
        """A kernel shut down: by its server's kernel_gpu_idle, or by the culler's order for
        its node's host memory budget (swap.py); counted as a kernel shut-down. `busy`: that
        kernel was working (the server's other kernel working makes no false cull of it)."""
        u = s.user
        self.culls.append(Cull("kernel", u.name, self.minute, busy, u.present[self.minute]))

    def slice_for(self, u: User) -> str:
        """The slice a user's server gets: theirs on the reserving pool (HAMi offers 1/8 to
        whole GPUs), a quarter replica on the time-sliced pool (time-slicing offers only
        1/replicas: docs/catalog.md), where their kernel still holds what their work needs."""
        return u.slice if self.family == "reserving" else "1/4"

    def room_for(self, u: User, eq: float) -> bool:
        """The hub's admission by presence (issue 36 item 5; hub/room.py as FracSpawner's
        `_wait_for_room` runs it): on an over-committed pool a new server's pod is made only
        where the culler's room answer (`Culler.room_json`: present users' slices, busy
        kernels, unknown servers) leaves a GPU room for its slice beside the servers admitted
        since the culler's last count, first come first served with backfill (hub/room.py:
        those ahead that fit take theirs first); otherwise its user waits in
        line with the hub's reason (`room_reasons`). No answer (no culler, none listed yet):
        admitted by slots, as the product does."""
        if self.overcommit <= 1 or self.culler is None:
            return True
        line, key, need = self.room_line, (u.name, ""), GPU_MIB * eq
        if self.room_answer is None:  # one answer a minute (the hub caches it 5 s)
            self.room_answer = self.culler.room_json(self.now_t)
        line.join(self.pool, key, need, self.now_t)
        v = room_verdict(
            self.room_answer, self.pool, need, size_mib=float(GPU_MIB),
            gpus_in_pool=self.cluster.gpus,
            in_flight_mib=line.in_flight_mib(
                self.pool, counted_tags(self.room_answer), besides=key
            ),
            ahead=line.ahead(self.pool, key, self.now_t),
        )  # fmt: skip
        if not v.go:
            self.room_reasons[u.name] = v.reason
            return False
        line.leave(self.pool, key)
        line.admit(key, self.pool, server_tag(u.name, ""), need)
        self.room_reasons.pop(u.name, None)
        return True

    def gpu_free_mib(self, gpu: int, besides: SimServer | None) -> float:
        held = sum(
            s.on_gpu_mib() for s in self.servers.values() if s.gpu == gpu and s is not besides
        )
        return GPU_MIB - held

    async def step(self, m: int, culler: Culler | None, url: str) -> None:
        self.minute = m
        now_t = self.now_t = v(m)
        now = _dt(now_t)
        self.culler, self.room_answer = culler, None
        for u in self.users:
            s = self.demand(u, m)
            if s is None:
                if u.run[m]:  # a run with no server: never launched, or its server stopped
                    run = (u.name, first_minute_of_run(u, m))
                    self.runs.add(run)
                    if run not in self.runs_oom:  # one that failed on its own is counted there
                        self.runs_stalled.add(run)
                continue
            await self.user_minute(u, s, m, now)
        if self.extension and culler is not None:
            await self.report_back(culler)
            await self.early_cycle(culler, m, now)
        if self.extension:
            for s in list(self.servers.values()):
                await self.server_side(s, m, now)
            if culler is not None:
                await self.exchange(culler, m)
        if m % 5 == 0:  # CHP's activity poll and the servers' activity posts (300 s each)
            for s in self.servers.values():
                s.hub_last = max(s.hub_last, jupyter_last_activity(s.settings).timestamp())
        if self.extension and m % 5 == 0:
            await culler.cull_once(now=now_t)
        elif self.kind == "idle-culler" and m % 10 == 0:
            from jupyterhub_idle_culler import cull_idle

            self.offset = time.time() - now_t  # its clock is the real one
            await cull_idle(url, "token", 3600, QUIET, concurrency=10, api_page_size=MAX_PAGE)
        self.measure(m)

    async def user_minute(self, u: User, s: SimServer, m: int, now: datetime) -> None:
        """The minute of a user with a server: their tab, a resume their message starts,
        their cells and runs."""
        self.tab(u, s, m, now)
        # a cell, or a run, on a hibernated kernel: its message resumes it first
        # (resume.py), through the real restore path: the room check (room.py: the
        # culler's grant, or NVML of the device where that counts), then the #44 driver; a
        # resume that waits for room is reported (swap.waiting), and the cell waits
        cell = u.cell[m] and u.present[m]
        wake = []  # the second notebook's cells message its own kernel
        if s.hibernated() and (cell and not u.second[m] or u.run[m]):
            wake.append(s.kernel_id)
        if s.hibernated2() and cell and u.second[m]:
            wake.append(s.kernel2_id)
        for kid in wake:
            s.monitor.hibernator.resume(kid, "a message to the kernel")
            await settle()
            if s.monitor.hibernator.suspended(kid):
                self.memory_waits += 1  # this minute's cell waits for room
        self.act(u, s, m, now)

    async def early_cycle(self, culler: Culler, m: int, now: datetime) -> None:
        """The culler's cycle `cull_when_waiting` after a server pod began to wait for a node
        (app.Culler.until_next_cycle: the pod watch wakes it), where one did this minute: a
        slot it releases goes to the waiting pod within the minute (the scheduler places it
        as soon as the stopped server's pod is gone). Those served so have not waited for a
        slot beyond the spawn itself: counted apart (`slot_freed_within_a_minute`), not as
        wait episodes."""
        new = [n for n in self.slot_waiting if self.waiting.get(n) == m]
        if not new or not culler.cull_when_waiting:
            return
        if self.overcommit <= 1:  # the servers report every minute (the replay: every 5 here)
            for s in list(self.servers.values()):
                await self.report(s, culler)
                await settle()
        await culler.cull_once(now=v(m) + culler.cull_when_waiting)
        for name in new:
            u = next(x for x in self.users if x.name == name)
            if name not in self.slot_waiting:
                continue
            s = self.demand(u, m)
            if s is None:
                continue
            assert self.waits[-1] == (name, 0, False)
            self.waits.pop()
            self.quick_waits += 1
            await self.user_minute(u, s, m, now)
        await self.report_back(culler)

    async def report_back(self, culler: Culler) -> None:
        """The reports of the servers whose person came back at a tab this minute (a tab's
        report turned 'away' or unknown into 'present': Presence.on_back), sent at once as the
        product's reporter does (`report_soon(0)`), before the culler's next cycle. The
        person comes back at the start of the minute: the report carries the monitor's last
        reading (the product's is 5 s old, from before their cells), not one after them."""
        for s in [s for s in self.servers.values() if s.back_now]:
            s.back_now = False
            await self.report(s, culler)
            await settle()

    async def exchange(self, culler: Culler, m: int) -> None:
        """Each server's report and the culler's answer (reporter.py, swap.py, the culler's
        `answer_report`): once a minute, then again within the minute for the servers whose
        answer or swap agent asked for one (`report_in`, `report_soon`: a swap done, a resume
        that waits), up to ROUNDS rounds ROUND_SECONDS apart. The answer goes to the server's
        real SwapAgent (swap orders, grants, waits, the host budget's shut-downs) and its
        Presence (the user at another server of theirs). Without over-commit the culler has
        nothing to say to a report but where a resume waits, so there the replay builds the
        report before each culler cycle (every 5 min), and those a server asks for."""
        every = 1 if self.overcommit > 1 else 5  # see `report_every`
        due = [s for s in self.servers.values() if m % every == 0 or s.report_now]
        for r in range(ROUNDS):
            self.now_t = v(m) + r * ROUND_SECONDS
            for s in due:
                if self.servers.get(s.user.name) is s:
                    s.report_now = False
                    await self.report(s, culler)
                    await settle()
            due = [s for s in self.servers.values() if s.report_now]
            if not due:
                break
        self.now_t = v(m)

    async def report(self, s: SimServer, culler: Culler) -> None:
        now = _dt(self.now_t)
        if self.now_t != v(self.minute):  # a report within the minute: a fresh reading
            self.read(s, now)
        body = s.swap.extend(
            s.monitor.report(
                server_last_activity=server_activity(s.settings, now),
                user_last_activity=user_activity(s.settings, now),
                now=now,
            )
        )
        parsed = parse_report(json.loads(json.dumps(body)), received_at=self.now_t)
        who = Identity(s.user.name, "")
        culler.on_report(who, culler.reports.put(s.user.name, "", parsed))
        answer = culler.answer_report(who, now=self.now_t)
        if not answer:
            return
        swap = answer.get("swap") or {}
        self.swap_orders += len(swap.get("hibernate") or [])
        self.grants += len(swap.get("resume") or [])
        self.budget_orders += len(swap.get("shutdown") or [])
        s.swap.on_answer(answer)
        s.monitor.on_culler_answer(answer, now)
        presence = s.settings.get(PRESENCE_KEY)
        if presence is not None:
            presence.on_culler_answer(answer, now)

    def tab(self, u: User, s: SimServer, m: int, now: datetime) -> None:
        """The person's JupyterLab tab this minute: its polling, and its presence report."""
        # the meter counts opening the page (visible or in a hidden tab: the spawn's page
        # turns into JupyterLab behind the lecture's slides) and showing the tab as the
        # person's input (labextension/src/presence.ts `_lastInput`)
        opened = u.tab_hidden[m] and not s.tab_was_open
        shown = u.tab_open[m] and not s.tab_was_visible
        if u.input[m] or opened or shown:
            self.last_input[u.name] = m
        presence = s.settings.get(PRESENCE_KEY)
        if u.tab_open[m]:
            s.settings["api_last_activity"] = now  # polls every 10 s while visible
        # a hidden tab's meter still reports (about once a minute: browsers slow its timers)
        if presence is not None and (u.tab_open[m] or u.tab_hidden[m] or s.tab_was_open):
            idle = (m - self.last_input.get(u.name, m)) * 60.0
            body = {"client": "tab", "visible": u.tab_open[m],
                    "focused": u.present[m] and u.tab_open[m],
                    "idle_seconds": max(0.0, idle)}  # fmt: skip
            presence.record(*parse_client_report(body, now))  # closing reports it hidden
        s.tab_was_open = u.tab_open[m] or u.tab_hidden[m]
        s.tab_was_visible = u.tab_open[m]

    def act(self, u: User, s: SimServer, m: int, now: datetime) -> None:
        """The user's minute: run cells, launch or continue a run."""
        run_start = u.run[m] and (m == 0 or not u.run[m - 1])
        cell2 = u.present[m] and u.cell[m] and u.second[m]  # in the second notebook
        cell = u.present[m] and u.cell[m] and not cell2
        if run_start:
            self.runs.add((u.name, m))
        if cell or run_start:
            kernel = s.ensure_kernel(now)
            if cell:  # a cell's messages: kernel activity
                kernel.last_activity = s.kernels.last_kernel_activity = now
            if run_start:
                s.run_alive = True
                s.child_run = u.child_runs  # launched in a child process: the kernel is idle
        s.busy = False
        if s.kernel_id is not None:
            kernel = s.kernels.kernels[s.kernel_id]
            running = u.run[m] and s.run_alive and not s.hibernated()
            s.busy = running or (cell and u.gpu_cell[m] and not s.hibernated())
            if s.busy and not s.holds_memory:
                # its first allocation: on a shared GPU there must be room for it, under
                # HAMi-core within the pod's slice beside its second notebook's kernel (CUDA out
                # of memory otherwise; the cell fails and is run again)
                mine = s.on_gpu_mib()
                over_limit = s.over_limit(s.kernel_mib)
                no_room = self.shared_memory and (self.gpu_free_mib(s.gpu, s) - mine < s.kernel_mib)
                if over_limit or no_room:
                    self.cuda_oom(over_limit)
                    if running and not u.present[m]:  # a person there launches it again
                        self.run_failed(u, s, m, over_limit)
                    s.busy = running = False
            kernel.execution_state = "busy" if (running and not s.child_run or cell) else "idle"
            s.holds_memory = s.holds_memory or s.busy
            if s.busy and u.grows and s.kernel_mib < GROWS_TO * u.memory_mib:
                # a kernel that grows as it works (caches, bigger batches): 1 % of its size a
                # working minute; on a shared GPU only into room (CUDA out of memory otherwise)
                step = GROWS_BY * u.memory_mib
                mine = s.on_gpu_mib()
                over_limit = s.over_limit(step)  # both its kernels, a hibernated one too
                if over_limit or (self.shared_memory and self.gpu_free_mib(s.gpu, s) < mine + step):
                    self.cuda_oom(over_limit)
                    if running:  # the run's script ends with the error; a cell is run again
                        self.run_failed(u, s, m, over_limit)
                        s.busy = cell and u.gpu_cell[m] and s.holds_memory
                else:
                    s.kernel_mib = min(GROWS_TO * u.memory_mib, s.kernel_mib + step)
        if u.run[m] and not (s.run_alive and not s.hibernated()):
            run = (u.name, first_minute_of_run(u, m))
            if run not in self.runs_oom:
                self.runs_stalled.add(run)  # killed, suspended or never launched
        if not u.run[m]:
            s.run_alive = False
        self.second_notebook(u, s, m, now, cell2)

    def second_notebook(self, u: User, s: SimServer, m: int, now: datetime, cell: bool) -> None:
        """The user's second notebook this minute: its kernel starts with its first cell, runs
        its cells, and its first GPU cell allocates its memory: into room on a shared GPU,
        within the pod's slice under HAMi-core (CUDA out of memory otherwise)."""
        s.busy2 = False
        if cell:
            kernel = s.ensure_kernel2(now)
            kernel.last_activity = s.kernels.last_kernel_activity = now
            s.busy2 = u.gpu_cell[m] and not s.hibernated2()
            if s.busy2 and not s.holds2:
                mine = s.on_gpu_mib()
                over_limit = s.over_limit(s.kernel2_mib)
                no_room = self.shared_memory and self.gpu_free_mib(s.gpu, s) < (
                    mine + s.kernel2_mib
                )
                if over_limit or no_room:
                    self.cuda_oom(over_limit)
                    s.busy2 = False
            s.holds2 = s.holds2 or s.busy2
        if s.kernel2_id is not None:
            s.kernels.kernels[s.kernel2_id].execution_state = "busy" if cell else "idle"

    def measure(self, m: int) -> None:
        per_node: dict[int, float] = {}
        for s in self.servers.values():
            u = s.user
            node = self.cluster.node_of(s.gpu)
            hib = s.monitor.hibernator
            per_node[node] = per_node.get(node, 0.0) + hib.total_mib()
            if u.present[m] and any(k.waiting() for k in hib.kernels.values()):
                self.kernel_wait_minutes += 1
            if u.present[m] or s.busy or s.busy2:
                continue
            self.idle_slices += s.gpu_equivalent
            self.idle_gpu_memory += s.on_gpu_mib()
        self.host_peak_node_mib = max(self.host_peak_node_mib, *per_node.values(), 0.0)
        self.host_peak_total_mib = max(self.host_peak_total_mib, sum(per_node.values()))

    async def server_side(self, s: SimServer, m: int, now: datetime) -> None:
        """What the extension does in the server this minute: read the GPU, shut down and
        hibernate."""
        self.read(s, now)
        await s.monitor.cull_idle_kernels(now)  # each counted by SimKernels.shutdown_kernel
        await s.monitor.hibernate_idle_kernels(now)  # counted (demand: idle_hibernations)
        # where NVML of the device counts (swap.py `_watch_room`), a waiting resume is woken
        # as soon as a reading shows room for it: here, at each reading
        s.swap.wake_if_room()
        await settle()

    def read(self, s: SimServer, now: datetime) -> None:
        """The monitor's GPU reading now (NVML of the device; HAMi-core's virtualised view on
        the reserving pool). The product reads every few seconds: before each report too."""
        procs = []
        if s.on_gpu_mib(besides=s.kernel2_id):
            util = BUSY if s.busy else 0.0
            kernel = s.kernels.kernels[s.kernel_id or ""]
            # a run in a child process of the kernel (subprocess, `!python train.py &`): its
            # own pid, found to be the kernel's by the process tree (attribution.py)
            pid = kernel.pid + CHILD_PID if s.child_run and s.run_alive else kernel.pid
            procs = [GpuProcess("0", s.kernel_mib, util, pid=pid, kernel_id=s.kernel_id)]
        if s.on_gpu_mib(besides=s.kernel_id) and s.kernel2_id is not None:  # its second notebook
            k2 = s.kernels.kernels[s.kernel2_id]
            util = BUSY if s.busy2 else 0.0
            procs.append(GpuProcess("0", s.kernel2_mib, util, pid=k2.pid, kernel_id=s.kernel2_id))
        if s.virtualised:  # HAMi-core: the pod's limit and its own count, never the GPU's
            device = GpuDevice("0", GPU_NAME, s.uuid, s.slice_mib(), s.charged_mib(), None)
        else:  # NVML of the device: what every process on the GPU holds
            used = GPU_MIB - self.gpu_free_mib(s.gpu, None)
            device = GpuDevice("0", GPU_NAME, s.uuid, GPU_MIB, used, None)
        # the pod's environment (its slice: neighbours.py reads it) and a driver that lists a
        # container's processes by their PID in it (535.113.01 or later): on a shared device,
        # memory or work the server cannot place is a neighbour's, as in a real pod
        with mock.patch.dict(os.environ, {ENV_SLICE: s.slice}):
            s.monitor.apply(
                GpuSample("simulated", [device], procs, driver=DRIVER),
                [(p.kernel_id, p) for p in procs],
                set(s.kernels.list_kernel_ids()),
                now,
            )

    def run_failed(self, u: User, s: SimServer, m: int, own_slice: bool) -> None:
        """`u`'s silent run met CUDA out of memory: its script ends with the error (PyTorch
        raises `torch.OutOfMemoryError` once its caching allocator has freed its cached blocks
        and retried; a training loop does not catch it): the run is lost (`runs_oom`), its work
        with it, not retried each minute. (A run whose first allocation fails while its person
        is there is launched again the next minute: they see the error; `act`.) A run in a child
        process ends with its process, and the driver frees what it held; one in the kernel
        leaves its memory held (the traceback IPython keeps, `sys.last_traceback`, holds the
        frames and their tensors: PyTorch's FAQ, "My out of memory exception handler can't
        allocate memory"), the kernel idle."""
        self.runs_oom.setdefault((u.name, first_minute_of_run(u, m)), own_slice)
        s.run_alive = False
        if s.child_run:
            s.child_run = False
            s.holds_memory = False
            s.kernel_mib = s.first_mib()

    def cuda_oom(self, own_slice: bool) -> None:
        """A cell met CUDA out of memory: at its own slice's limit (HAMi-core), or for want of
        room beside its co-tenants on a shared GPU (what the culler's admission and grants
        answer for)."""
        self.resume_failures += 1
        self.oom_co_tenants += not own_slice

    def summary(self) -> dict:
        present = {u.name: u.present for u in self.users}
        disrupted = sum(
            1
            for c in self.culls
            if not c.present and any(present[c.user][c.minute + 1 : c.minute + 1 + CAME_BACK_MIN])
        )
        waits = [w for _, w, _ in self.waits] + [HORIZON - m for m in self.waiting.values()]
        return {
            "wait_episodes": len(self.waits) + len(self.waiting),
            "slot_freed_within_a_minute": self.quick_waits,
            "users_who_waited": len({n for n, _, _ in self.waits} | set(self.waiting)),
            "turned_away": sum(away for _, _, away in self.waits),
            "wait_p95_min": _percentile([float(w) for w in waits], 0.95),
            "wait_minutes": sum(waits),
            "idle_reserved_slice_hours": round(self.idle_slices / 60, 1),
            "idle_gpu_memory_gib_hours": round(self.idle_gpu_memory / 1024 / 60, 1),
            "false_culls": sum(c.busy for c in self.culls),
            "culls_while_present": sum(c.present for c in self.culls),
            "culls_returned_to_within_30_min": disrupted,
            "server_stops": sum(c.kind == "server" for c in self.culls),
            "kernel_shutdowns": sum(c.kind == "kernel" for c in self.culls),
            "hibernations": self.hibernations,
            "resumes": len(self.resume_seconds),
            "resume_failures": self.resume_failures,
            "cuda_oom_co_tenants": self.oom_co_tenants,
            "memory_waits": self.memory_waits,
            "kernel_wait_minutes": self.kernel_wait_minutes,
            "swap_orders": self.swap_orders,
            "grants": self.grants,
            "host_budget_orders": self.budget_orders,
            "admission_waits": self.admission_waits,
            "gpu_state_lost": self.gpu_state_lost
            + sum(len(s.driver.lost) for s in self.servers.values()),
            "runs": len(self.runs),
            "stalled_runs": len(self.runs_stalled),
            "runs_lost_to_cuda_oom": len(self.runs_oom),
            "runs_lost_to_cuda_oom_co_tenants": sum(not own for own in self.runs_oom.values()),
            "host_memory_peak_per_node_gib": round(self.host_peak_node_mib / 1024, 1),
            "host_memory_peak_gib": round(self.host_peak_total_mib / 1024, 1),
            "resume_p50_s": _percentile(self.resume_seconds, 0.5),
            "resume_max_s": max(self.resume_seconds, default=0.0),
        }


def first_minute_of_run(u: User, m: int) -> int:
    """The first minute of `u`'s run that works at minute `m` (a run's key with its user)."""
    while m > 0 and u.run[m - 1]:
        m -= 1
    return m


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def pod_host(tmp: Path) -> Path:
    """A pod's cgroup v2 memory files and the node's meminfo, for the headroom check."""
    host = tmp / "pod-host"
    host.mkdir(exist_ok=True)
    (host / "memory.max").write_text(str(POD_HOST_MEMORY_GIB * 2**30))
    (host / "memory.current").write_text(str(POD_HOST_USED_GIB * 2**30))
    (host / "meminfo").write_text(f"MemAvailable: {512 * 2**20} kB\n")  # a 512 GiB node
    return host


def slice_annotation_mib(piece: str) -> float:
    """The slice's memory as FracSpawner annotates its pod (`fracspawner.io/gpu-memory-mib`,
    whole MiB): what the culler's pod watch reads of a pod waiting for a node."""
    return float(int(GPU_MIB * slice_equivalent(piece)))


def slice_equivalent(piece: str) -> float:
    """A slice's fraction of a GPU ("1/8" -> 0.125, "1" -> 1.0)."""
    top, _, bottom = piece.partition("/")
    return float(top) / float(bottom or 1)


def notebook_env_for(catalog: dict, pool: str) -> dict[str, str]:
    """The environment FracSpawner gives a 1/4 server on this pool under this catalog (each
    server's own slice replaces the quarter: `Sim.demand`)."""
    from fracspawner.backends import load_catalog
    from fracspawner.choice.notebook_env import policy_env

    loaded = load_catalog(catalog)
    env = {"FRACSPAWNER_GPU_SLICE": "1/4", "FRACSPAWNER_GPU_POOL": pool}
    return env | policy_env(loaded.idle_for(pool))


def bench_catalog(idle: dict | None = None, overcommit: int = 1) -> dict:
    """The demo catalog (HAMi `h100`) with an H100 time-sliced four ways (`h100-ts`), without
    an `idle` section (the documented defaults, per backend) unless `idle` is given."""
    data = yaml.safe_load((REPO / "examples" / "catalogs" / "demo.yaml").read_text())
    data.pop("idle", None)
    data["pools"]["h100-ts"] = {
        "display_name": "H100 80GB (time-sliced)",
        "gpu": "H100-80GB",
        "backend": "timeslicing",
        "replicas": 4,
        "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-SHARED"},
        "offers": ["1/4"],
    }
    data["access"]["default"] = {"pools": "all", "max_gpu": 1}
    if overcommit > 1:
        for pool in FAMILIES.values():
            data["pools"][pool]["overcommit"] = overcommit
    if idle is not None:
        data["idle"] = idle
    return data


async def replay(
    users: list[User],
    kind: str,
    family: str,
    cluster: Cluster,
    tmp: Path,
    minutes: int = HORIZON,
    sims: list | None = None,
) -> dict:
    """One mix under one culler on one family's pool, for the first `minutes` of the trace;
    the replay's `Sim` goes into `sims` where given (tests read its state)."""
    idle = {
        HIBERNATE_ROW: HIBERNATE_IDLE,
        KERNEL_ON_ROW: {"kernel_gpu_idle": "30m"},
        OVERCOMMIT_KERNEL_OFF: {"kernel_gpu_idle": "off"},
    }.get(kind)
    overcommit = OVERCOMMIT if kind in (OVERCOMMIT_KIND, OVERCOMMIT_KERNEL_OFF) else 1
    catalog = bench_catalog(idle, overcommit)
    sim = Sim(users, kind, cluster, family, catalog, overcommit)
    sim.host = pod_host(tmp)
    if sims is not None:
        sims.append(sim)
    hub = StandInHub(sim.hub_users, on_delete=sim.stop)
    port = free_port()
    server = HTTPServer(hub.app)
    server.listen(port, "127.0.0.1")
    url = f"http://127.0.0.1:{port}/hub/api"
    culler = None
    if kind != "idle-culler":
        path = tmp / f"{kind}-{family}.yaml"
        path.write_text(yaml.safe_dump(catalog))
        culler = Culler(api_token="token", log_level=logging.ERROR)
        culler.initialize(
            [
                f"--url={url}",
                f"--catalog={path}",
                "--report-url=http://127.0.0.1:9",  # reports are handed over in process
                "--namespace=jhub",
                # servers on a GPU under pressure report again in 30 s (one more report within
                # the replay's minute), not 20
                f"--Culler.swap_report_in={ROUND_SECONDS}",
                # the replay's hub admits under "wait" (a user without a slot waits with a
                # Pending pod), so the culler may keep hibernated servers until one waits
                "--Culler.keep_hibernated_servers=True",
            ]
        )
        culler.server_pods = PodWatch(sim)  # where each pod is, as the pod watch knows it
        # a culler that has been running: it has listed the hub before the day starts (its
        # room answer counts nobody until it has: the hub then admits by slots alone)
        await culler.cull_once(now=v(0) - 60.0)
    started = time.perf_counter()
    # the pods' cgroup files are the same all along in the replay: read once, not per report
    headroom = functools.cache(hibernate_module.host_headroom)
    try:
        with mock.patch.object(hibernate_module, "host_headroom", headroom):
            for m in range(min(minutes, HORIZON)):
                await sim.step(m, culler, url)
    finally:
        server.stop()
    out = sim.summary()
    out["policy"] = {k: v for k, v in sim.env.items() if k.endswith("_SECONDS")}
    out["replay_seconds"] = round(time.perf_counter() - started, 1)
    if culler is not None:
        # the budget the culler used on the replay's nodes (all alike: NODE_TYPE)
        nodes = culler.server_pods.nodes
        out["host_memory_budget_gib"] = round(
            max(culler.host_budget(f"node-{i}") for i in range(max(1, len(nodes)))) / 1024, 1
        )
        samples = culler.metrics.failsafe.collect()[0].samples
        out["culler_failsafe_decisions"] = int(
            sum(s.value for s in samples if s.name.endswith("_total"))
        )
    return out


def pct(value: float, base: float) -> float | None:
    """value as a percentage of base; 0 where both are 0; None where only base is 0."""
    if not base:
        return 0.0 if not value else None
    return round(100.0 * value / base, 1)


def capacity(row: dict, base: dict, floor_figures: dict) -> dict:
    """The contract's keys (../shared/design.md) for one mix and family, and the goals; beside
    them the person-minutes waited and the floor of the cluster (benchmarks/culler_floor.py:
    what any culler keeping issue 36's rules must make people wait, from the trace)."""
    out = {
        "users_waiting_pct": pct(row["wait_episodes"], base["wait_episodes"]),
        "wait_p95_min": row["wait_p95_min"],
        "disruptions": row["culls_returned_to_within_30_min"],
        "baseline_disruptions": base["culls_returned_to_within_30_min"],
        "present_culls": row["culls_while_present"],
        "false_culls": row["false_culls"],
        "idle_reserved_slice_hours_pct": pct(
            row["idle_reserved_slice_hours"], base["idle_reserved_slice_hours"]
        ),
        "resume_failures": row["resume_failures"],
        "cuda_oom_co_tenants": row["cuda_oom_co_tenants"],
        "stalled_runs": row["stalled_runs"],
        "runs_lost_to_cuda_oom": row["runs_lost_to_cuda_oom"],
        "runs_lost_to_cuda_oom_co_tenants": row["runs_lost_to_cuda_oom_co_tenants"],
        "host_memory_peak_per_node_gib": row["host_memory_peak_per_node_gib"],
        "idle_gpu_memory_pct": pct(
            row["idle_gpu_memory_gib_hours"], base["idle_gpu_memory_gib_hours"]
        ),
        "baseline_wait_episodes": base["wait_episodes"],
        "wait_episodes": row["wait_episodes"],
        "baseline_wait_p95_min": base["wait_p95_min"],
        "baseline_stalled_runs": base["stalled_runs"],
        "baseline_runs_lost_to_cuda_oom": base["runs_lost_to_cuda_oom"],
        "wait_minutes": row["wait_minutes"],
        "baseline_wait_minutes": base["wait_minutes"],
        "kernel_wait_minutes": row["kernel_wait_minutes"],
        "baseline_kernel_wait_minutes": base["kernel_wait_minutes"],
        "floor": floor_figures,
    }
    waiting = out["users_waiting_pct"]
    out["goals"] = {
        "waiting_at_most_half": waiting is not None and waiting <= 50.0,
        "disruptions_at_most_baseline": out["disruptions"] <= out["baseline_disruptions"],
        "no_culls_of_a_present_user": out["present_culls"] == 0,
        "no_false_culls": out["false_culls"] == 0,
    }
    return out


def half_gpus(row: dict, base: dict, half: Cluster, full: Cluster, floor_figures: dict) -> dict:
    """The headline's keys (../shared/design.md): the trace on `half` the GPUs, over-committed,
    against jupyterhub-idle-culler on all of them (`full`), and the issue's goals; beside them
    the person-minutes waited (the row's, the baseline's) and the floor of `half`."""
    out = {
        "users_waiting_pct_of_full_baseline": pct(row["wait_episodes"], base["wait_episodes"]),
        "disruptions": row["culls_returned_to_within_30_min"],
        "baseline_disruptions": base["culls_returned_to_within_30_min"],
        "present_culls": row["culls_while_present"],
        "false_culls": row["false_culls"],
        "gpu_state_lost": row["gpu_state_lost"],
        "host_memory_peak_per_node_gib": row["host_memory_peak_per_node_gib"],
        "host_memory_budget_gib": row["host_memory_budget_gib"],
        "gpus": half.gpus,
        "baseline_gpus": full.gpus,
        "wait_episodes": row["wait_episodes"],
        "baseline_wait_episodes": base["wait_episodes"],
        "turned_away": row["turned_away"],
        "baseline_turned_away": base["turned_away"],
        "wait_p95_min": row["wait_p95_min"],
        "baseline_wait_p95_min": base["wait_p95_min"],
        "admission_waits": row["admission_waits"],
        "memory_waits": row["memory_waits"],
        "cuda_oom_in_cells": row["resume_failures"],
        "runs_lost_to_cuda_oom": row["runs_lost_to_cuda_oom"],
        "runs_lost_to_cuda_oom_co_tenants": row["runs_lost_to_cuda_oom_co_tenants"],
        "cuda_oom_co_tenants": row["cuda_oom_co_tenants"],
        "swap_orders": row["swap_orders"],
        "grants": row["grants"],
        "resumes": row["resumes"],
        "host_budget_orders": row["host_budget_orders"],
        "stalled_runs": row["stalled_runs"],
        "baseline_stalled_runs": base["stalled_runs"],
        "baseline_runs_lost_to_cuda_oom": base["runs_lost_to_cuda_oom"],
        "wait_minutes": row["wait_minutes"],
        "baseline_wait_minutes": base["wait_minutes"],
        "kernel_wait_minutes": row["kernel_wait_minutes"],
        "baseline_kernel_wait_minutes": base["kernel_wait_minutes"],
        "floor": floor_figures,
    }
    waiting = out["users_waiting_pct_of_full_baseline"]
    out["goals"] = {
        "waiting_at_most_baseline": waiting is not None and waiting <= 100.0,
        "disruptions_at_most_baseline": out["disruptions"] <= out["baseline_disruptions"],
        "no_culls_of_a_present_user": out["present_culls"] == 0,
        "no_false_culls": out["false_culls"] == 0,
        "no_gpu_state_lost": out["gpu_state_lost"] == 0,
        "host_memory_within_budget": out["host_memory_peak_per_node_gib"]
        <= out["host_memory_budget_gib"],
    }
    return out


# a partial run (`python -m benchmarks.bench_culler`): which mixes, which rows, how long
ENV_MIXES = "FRACSPAWNER_BENCH_CULLER_MIXES"  # comma-separated mix names (default: all)
ENV_ROWS = "FRACSPAWNER_BENCH_CULLER_ROWS"  # "all" (default) or "headline"
ENV_MINUTES = "FRACSPAWNER_BENCH_CULLER_MINUTES"  # the trace's first minutes (default: all)
# another draw of the same mixes (culler_trace.make_mix): whether a goal met or missed holds
# beyond the one trace the whole run replays, or is that trace's luck
ENV_SEED = "FRACSPAWNER_BENCH_CULLER_SEED"  # (default: culler_trace.SEED, the whole run's)
HEADLINE_ROWS = ("jupyterhub_idle_culler_z2jh", *(f"fracspawner_{f}_half_gpus" for f in FAMILIES))


@dataclass(frozen=True)
class Knobs:
    mixes: tuple[str, ...]
    headline: bool  # only the baseline and the half-the-GPUs rows
    minutes: int
    seed: int = SEED

    @property
    def partial(self) -> bool:
        return (
            self.mixes != tuple(MIXES)
            or self.headline
            or self.minutes < HORIZON
            or self.seed != SEED
        )


def knobs(env: dict[str, str] | None = None) -> Knobs:
    """The partial run's settings from the environment, each checked."""
    env = dict(os.environ) if env is None else env
    mixes = tuple(m.strip() for m in env.get(ENV_MIXES, "").split(",") if m.strip())
    unknown = [m for m in mixes if m not in MIXES]
    if unknown:
        raise ValueError(
            f"{ENV_MIXES}: unknown mix {', '.join(unknown)} (known: {', '.join(MIXES)})"
        )
    rows = env.get(ENV_ROWS, "all").strip() or "all"
    if rows not in ("all", "headline"):
        raise ValueError(f"{ENV_ROWS}: {rows!r} is neither 'all' nor 'headline'")
    text = env.get(ENV_MINUTES, "").strip() or str(HORIZON)
    if not text.isdigit() or not 1 <= int(text) <= HORIZON:
        raise ValueError(f"{ENV_MINUTES}: {text!r} is not a number of minutes from 1 to {HORIZON}")
    seed = env.get(ENV_SEED, "").strip() or str(SEED)
    if not seed.isdigit():
        raise ValueError(f"{ENV_SEED}: {seed!r} is not a whole number (the whole run's is {SEED})")
    return Knobs(mixes or tuple(MIXES), rows == "headline", int(text), int(seed))


async def bench_days(tmp: Path, knob: Knobs | None = None) -> tuple[dict, dict, dict]:
    knob = knob or Knobs(tuple(MIXES), False, HORIZON)
    runs: dict[str, dict] = {}
    out: dict[str, dict] = {}
    plain: dict[str, dict] = {}
    for name in knob.mixes:
        users, cluster = make_mix(name, knob.seed), CLUSTERS[name]
        rows: dict[str, dict] = {}

        async def row(kind: str, family: str, on: Cluster = cluster, who=users) -> dict:
            return await replay(who, kind, family, on, tmp, minutes=knob.minutes)

        # jupyterhub-idle-culler stops servers only: it does the same on either family
        rows["jupyterhub_idle_culler_z2jh"] = await row("idle-culler", "reserving")
        if not knob.headline:
            for family in FAMILIES:
                rows[f"fracspawner_{family}"] = await row("fracspawner", family)
                rows[f"fracspawner_{family}_overcommit"] = await row(OVERCOMMIT_KIND, family)
            rows[HIBERNATE_ROW] = await row(HIBERNATE_ROW, "time_sliced")
            rows[KERNEL_ON_ROW] = await row(KERNEL_ON_ROW, "reserving")
        # the headline (issue 36): the same trace on half the GPUs, over-committed
        half = replace(cluster, gpus=max(1, cluster.gpus // 2))
        for family in FAMILIES:
            rows[f"fracspawner_{family}_half_gpus"] = await row(OVERCOMMIT_KIND, family, half)
        for key, data in rows.items():
            print(f"   {name} / {key}: {data}", flush=True)
        base = rows["jupyterhub_idle_culler_z2jh"]
        runs[name] = {
            "users": len(users),
            "slots": cluster.slots,
            "nodes": -(-cluster.gpus // cluster.gpus_per_node),
            "hours_at_keyboard": round(sum(sum(u.present) for u in users) / 60, 1),
            "hours_of_tabs_left_open": round(
                sum(
                    sum(t and not p for t, p in zip(u.tab_open, u.present, strict=True))
                    for u in users
                )
                / 60,
                1,
            ),
            "hours_of_silent_runs": round(sum(sum(u.run) for u in users) / 60, 1),
            "slices": {
                p: sum(u.slice == p for u in users) for p in sorted({u.slice for u in users})
            },
            "users_with_a_second_notebook": sum(any(u.second) for u in users),
            **rows,
        }
        # what any culler keeping the rules must make people wait (the trace alone)
        floors = {on.gpus: floor(users, on.gpus, minutes=knob.minutes) for on in (cluster, half)}
        heads = {
            f: {
                "half_gpus": half_gpus(
                    rows[f"fracspawner_{f}_half_gpus"], base, half, cluster, floors[half.gpus]
                )
            }
            for f in FAMILIES
        }
        if knob.headline:
            out[name] = heads
            continue
        full_floor = floors[cluster.gpus]
        out[name] = {
            family: capacity(rows[f"fracspawner_{family}_overcommit"], base, full_floor)
            | heads[family]
            for family in FAMILIES
        }
        plain[name] = {
            family: capacity(rows[f"fracspawner_{family}"], base, full_floor) for family in FAMILIES
        }
    return runs, out, plain


# --- (b) one cycle over 5,000 servers ----------------------------------------------------------
def make_users(now: datetime) -> list[dict]:
    users = []
    for i in range(N_SERVERS):
        gpu = i % int(1 / GPU_SHARE) == 0
        idle = timedelta(minutes=(i * 37) % 900)  # 0 - 15 h, spread
        last = (now - idle).timestamp()
        options = {"gpu": "1/4", "pool": "h100"} if gpu else {}
        users.append(server_model(f"user{i:05d}", last - 3600, last, options))
    return users


async def bench_cycle() -> dict:
    from jupyterhub_idle_culler import cull_idle

    from tests.test_culler_support import DcgmExporter, Prometheus

    users = make_users(datetime.now(timezone.utc))
    port = free_port()
    hub = StandInHub(lambda: users)
    server = HTTPServer(hub.app)
    server.listen(port, "127.0.0.1")
    url = f"http://127.0.0.1:{port}/hub/api"
    gpu_servers = sum(1 for u in users if u["servers"][""]["user_options"])
    out: dict = {"servers": N_SERVERS, "gpu_servers": gpu_servers}
    exporter = DcgmExporter()
    for u in users:
        if u["servers"][""]["user_options"]:
            exporter.set(f"jupyter-{u['name']}", util=0, memory=10240)
    tmp = Path(tempfile.mkdtemp(prefix="bench-prom-"))
    prom = Prometheus(tmp, exporter.port)
    try:
        prom.wait_scraped(3)
        hub.requests, hub.deleted = 0, []
        t0 = time.perf_counter()
        await cull_idle(url, "token", 3600, QUIET, concurrency=10, api_page_size=MAX_PAGE)
        out["jupyterhub_idle_culler"] = {
            "cycle_seconds": round(time.perf_counter() - t0, 3),
            "http_requests": hub.requests,
            "stopped": len(hub.deleted),
        }
        for label, prometheus_url, timeouts in (
            # the same plain timeout as jupyterhub-idle-culler: the same servers are stopped
            ("fracspawner_culler_timeout_3600", "", {"server_idle": "3600"}),
            ("fracspawner_culler", "", {}),
            ("fracspawner_culler_with_prometheus", prom.url, {}),
        ):
            hub.requests, hub.deleted = 0, []
            c = Culler(
                url=url,
                api_token="token",
                concurrency=10,
                api_page_size=MAX_PAGE,
                prometheus_url=prometheus_url,
                log_level=logging.ERROR,
                **timeouts,
            )
            t0 = time.perf_counter()
            result = await c.cull_once()
            out[label] = {
                "cycle_seconds": round(time.perf_counter() - t0, 3),
                "http_requests": result.requests,
                "hub_requests": hub.requests,
                "stopped": len(hub.deleted),
            }
    finally:
        prom.stop()
        exporter.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        server.stop()
    out["note"] = (
        "stand-in hub API (JupyterHub's JSON and pagination, max page 200). Prometheus is real, "
        f"scraping {gpu_servers} GPU pods for seconds: no GPU window is covered, so no server "
        "is stopped on GPU grounds (fail-safe); the plain 8 h timeout stops idle servers, "
        "jupyterhub-idle-culler every server idle > 1 h. The culler makes no request to any "
        "user server."
    )
    return out


def hibernation(runs: dict) -> dict:
    """The hibernation row against the baseline, per mix: the keys outside checks read.
    `reclaimable_pct`: idle GPU memory left on the GPU, as % of the baseline's."""
    out = {}
    for mix, data in runs.items():
        row, base = data[HIBERNATE_ROW], data["jupyterhub_idle_culler_z2jh"]
        out[mix] = {
            "reclaimable_pct": pct(
                row["idle_gpu_memory_gib_hours"], base["idle_gpu_memory_gib_hours"]
            )
            or 0.0,
            "disruptions": row["culls_returned_to_within_30_min"],
            "baseline_disruptions": base["culls_returned_to_within_30_min"],
            "false_culls": row["false_culls"],
            "present_culls": row["culls_while_present"],
            "host_memory_peak_gib": row["host_memory_peak_gib"],
            "host_memory_peak_per_node_gib": row["host_memory_peak_per_node_gib"],
            "resume_p50_s": row["resume_p50_s"],
            "resume_max_s": row["resume_max_s"],
        }
    return out


# --- report -------------------------------------------------------------------------------------
COLUMNS = [
    ("wait_episodes", "waited or turned away"),
    ("turned_away", "turned away"),
    ("wait_p95_min", "wait p95 min"),
    ("idle_reserved_slice_hours", "idle reserved slice-h"),
    ("idle_gpu_memory_gib_hours", "idle GPU memory GiB·h"),
    ("culls_returned_to_within_30_min", "disruptions"),
    ("culls_while_present", "culls of a present user"),
    ("false_culls", "false culls"),
    ("server_stops", "server stops"),
    ("kernel_shutdowns", "kernel shut-downs"),
    ("hibernations", "hibernations"),
    ("resume_failures", "CUDA OOM in cells"),
    ("cuda_oom_co_tenants", "of them for co-tenants"),
    ("runs_lost_to_cuda_oom", "runs lost to CUDA OOM"),
    ("runs_lost_to_cuda_oom_co_tenants", "of them for co-tenants"),
    ("memory_waits", "cell-minutes waiting for room"),
    ("kernel_wait_minutes", "person-minutes at the keyboard, their kernel waiting for room"),
    ("swap_orders", "swap orders"),
    ("grants", "grants"),
    ("host_budget_orders", "host budget shut-downs"),
    ("admission_waits", "waits for memory at admission"),
    ("gpu_state_lost", "GPU state lost (#44)"),
    ("stalled_runs", "stalled runs"),
    ("host_memory_peak_per_node_gib", "host memory peak/node GiB"),
]
ROWS = [
    ("jupyterhub_idle_culler_z2jh", "jupyterhub-idle-culler, z2jh defaults (baseline)"),
    ("fracspawner_reserving", "fracspawner defaults, reserving (HAMi `h100`)"),
    ("fracspawner_time_sliced", "fracspawner defaults, time-sliced (`h100-ts`)"),
    (HIBERNATE_ROW, "fracspawner, hibernate 5m / kernel off / GPU server 2h (time-sliced)"),
    (KERNEL_ON_ROW, "fracspawner, reserving, kernel_gpu_idle 30m (set in the catalog)"),
    ("fracspawner_reserving_overcommit", "fracspawner, reserving, overcommit 2 (HAMi scaling)"),
    ("fracspawner_time_sliced_overcommit", "fracspawner, time-sliced, overcommit 2"),
    ("fracspawner_reserving_half_gpus", "fracspawner, reserving, overcommit 2, HALF the GPUs"),
    ("fracspawner_time_sliced_half_gpus", "fracspawner, time-sliced, overcommit 2, HALF the GPUs"),
]


def markdown(runs: dict, cap: dict) -> str:
    lines = []
    for mix, data in runs.items():
        lines += [
            f"### {mix}: {data['users']} users on {data['slots']} slots ({data['nodes']} nodes), "
            f"{data['hours_at_keyboard']} h at the keyboard, {data['hours_of_tabs_left_open']} h "
            f"of tabs left open, {data['hours_of_silent_runs']} h of silent runs",
            "",
            "| | " + " | ".join(label for _, label in COLUMNS) + " |",
            "|---|" + "---|" * len(COLUMNS),
        ]
        for key, label in ROWS:
            row = data[key]
            lines.append(f"| {label} | " + " | ".join(str(row[k]) for k, _ in COLUMNS) + " |")
        for family, figures in cap[mix].items():
            missed = [k for k, ok in figures["goals"].items() if not ok]
            lines.append(
                f"\n{family}: waiting {figures['users_waiting_pct']} % and idle reserved "
                f"slice-hours {figures['idle_reserved_slice_hours_pct']} % of the baseline; "
                + ("all goals met." if not missed else "missed: " + ", ".join(missed) + ".")
            )
        lines.append("")
    return "\n".join(lines)


def run(results_dir: Path) -> dict:
    if knobs().partial:  # culler.json holds the whole run: a partial one goes elsewhere
        raise RuntimeError(
            f"{ENV_MIXES}, {ENV_ROWS}, {ENV_MINUTES} or {ENV_SEED} is set: run the partial "
            "replay with `python -m benchmarks.bench_culler` (it writes "
            "results/culler_partial.json)"
        )
    tmp = Path(tempfile.mkdtemp(prefix="bench-culler-"))
    try:
        runs, cap, plain = asyncio.run(bench_days(tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    cycle = asyncio.run(bench_cycle())
    result = {
        "capacity": cap,
        "capacity_without_overcommit": plain,
        "hibernation": hibernation(runs),
        "runs": runs,
        "cycle_5000_servers": cycle,
    }
    (results_dir / "culler.md").write_text(
        "# Culler benchmarks\n\n"
        + (__doc__ or "")
        + "\n## (a) Capacity: days of notebook use on a fixed cluster\n\n"
        + markdown(runs, cap)
        + "\n## Raw figures\n\n```json\n"
        + json.dumps(result, indent=2)
        + "\n```\n"
    )
    return result


def run_partial(results_dir: Path) -> dict:
    """The replay of the mixes and rows the environment names (`knobs`), for the trace's first
    minutes it says: `capacity` and `runs` as the whole run has them for those; no cycle."""
    knob = knobs()
    tmp = Path(tempfile.mkdtemp(prefix="bench-culler-"))
    started = time.perf_counter()
    try:
        runs, cap, plain = asyncio.run(bench_days(tmp, knob))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result = {
        "partial": {"mixes": list(knob.mixes), "headline_only": knob.headline,
                    "minutes": knob.minutes, "seed": knob.seed},
        "capacity": cap,
        "capacity_without_overcommit": plain,
        "runs": runs,
        "wall_seconds": round(time.perf_counter() - started, 1),
    }  # fmt: skip
    (results_dir / "culler_partial.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":  # a partial run: FRACSPAWNER_BENCH_CULLER_MIXES, _ROWS, _MINUTES, _SEED
    results = REPO / "benchmarks" / "results"
    results.mkdir(exist_ok=True)
    print(json.dumps(run_partial(results)["capacity"], indent=2))
