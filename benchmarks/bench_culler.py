"""Culler benchmarks: what users feel, against jupyterhub-idle-culler at z2jh's defaults.

(a) Days of notebook use (benchmarks/culler_trace.py: classroom, research with long silent
runs, users taking 30-90 minute breaks), replayed minute by minute on a virtual clock under no
culler, jupyterhub-idle-culler 2.0 with z2jh's defaults (timeout 3600 s, every 600 s; its own
`cull_idle` against a hub API whose times are shifted to its real clock), and fracspawner's
culler with the catalog's policy (the documented defaults, and a tighter one). Every decision
goes through the real code and sources:

- each server's GPU facts come from the server extension's own monitor (GpuMonitor: apply,
  the in-server kernel shut-down, report), fed with the minute's GPU reading, and reach the
  culler as the JSON report it would push (parsed by the culler's own reports.parse_report);
- Prometheus is Debian's real one, holding the trace's dcgm-exporter series (30 s samples,
  written with their own timestamps by promtool) and asked about each virtual moment;
- the culler runs its whole cycle (`Culler.cull_once(now=...)`) against a stand-in hub API that
  serves the simulated servers with JupyterHub's JSON and pagination, and stops them on DELETE;
- the policy is read from a catalog (the demo's pools), through the same env mapping
  FracSpawner uses for the servers (choice/notebook_env.py).

GPU hibernation (issue 22) runs through the real monitor and hibernator
(fracspawner/serverext/hibernate.py) with a fake checkpoint driver: a kernel idle for
kernel_gpu_hibernate is suspended (its GPU memory leaves the GPU, held in the pod's host memory;
each pod has a 64 GiB memory limit using 8 GiB), and the user's next cell resumes it first, in
0.3 s + memory / 25 GiB/s (PCIe 4.0 x16). The catalog defaults now include it (10 min); the
`fracspawner_hibernate` row gives memory back by hibernation alone (5 min; kernels never shut
down for GPU idleness; GPU server 2 h). Its figures per mix are under the top-level key
`hibernation` (reclaimable as % of the baseline, disruptions, host-memory peak summed over the
mix's pods, resume latency).

What users feel, per mix: GPU memory held by idle kernels while the user is away
(reclaimable, GiB-hours), slices held by idle servers while the user is away (idle
slice-hours, GPU-equivalent hours), false culls (a server or kernel ended while its GPU
worked), culls while the user is at the keyboard, and culls the user comes back to within
30 minutes (disruption). Goals: 0 false culls, 0 culls of a present user, reclaimable <= 20 %
and idle slice-hours <= 100 % of the baseline, disruption <= the baseline.

(b) One culling cycle over 5,000 ready servers (cycle time, HTTP requests) for both cullers
against the same stand-in hub API: 5,000 real single-user servers do not fit this machine.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import yaml
from tornado import web
from tornado.httpserver import HTTPServer

from benchmarks.culler_trace import HORIZON, MIXES, User, make_mix
from devcluster.localhub import free_port
from fracspawner.culler.app import Culler
from fracspawner.culler.identity import Identity
from fracspawner.culler.reports import parse_report
from fracspawner.serverext.activity import server_activity, user_activity
from fracspawner.serverext.hibernate import Hibernator
from fracspawner.serverext.monitor import GpuMonitor
from fracspawner.serverext.podinfo import PodInfo
from fracspawner.serverext.sources import GpuDevice, GpuProcess, GpuSample

REPO = Path(__file__).resolve().parent.parent
N_SERVERS = 5000
GPU_SHARE = 0.3
MAX_PAGE = 200  # JupyterHub's default api_page_max_limit
T0 = 1_700_006_400.0 - 1_700_006_400.0 % 86400 + 6 * 3600  # 06:00 UTC, the virtual day one
BUSY, SAMPLE = 90.0, 30  # a working GPU's utilisation; dcgm-exporter's default interval (s)
POOL = "h100"
QUIET = logging.getLogger("bench-culler")
QUIET.setLevel(logging.ERROR)

POLICIES = {
    # a catalog without `idle`: the documented defaults (hibernate 10m, kernel 30m, GPU server
    # 1h, 8h, 1d)
    "fracspawner_defaults": None,
    "fracspawner_tight": {"kernel_gpu_idle": "10m", "server_gpu_idle": "30m"},
    # GPU hibernation (issue 22) as the way to give memory back: suspend after 5 min, never shut
    # the kernel down for GPU idleness, stop a GPU-idle server after 2 h
    "fracspawner_hibernate": {
        "kernel_gpu_hibernate": "5m",
        "kernel_gpu_idle": "off",
        "server_gpu_idle": "2h",
    },
}
HIBERNATE_ROW = "fracspawner_hibernate"
# the fake checkpoint driver's copy model: a resume (or suspend) takes a fixed part (re-acquiring
# the GPU, restoring contexts and streams) plus the memory over a PCIe 4.0 x16 link's practical
# host<->device bandwidth
COPY_GIB_S = 25.0
COPY_FIXED_S = 0.3
POD_HOST_MEMORY_GIB, POD_HOST_USED_GIB = 64, 8  # each pod's memory limit and what it uses


def copy_seconds(memory_mib: float) -> float:
    return round(COPY_FIXED_S + memory_mib / 1024 / COPY_GIB_S, 3)


class SimCheckpointDriver:
    """The fake checkpoint driver for the replay: the documented states (running -> locked ->
    checkpointed -> locked -> running; tests/fake_nvml/cuda/bindings/driver.py cites them) by
    pid, in memory; copy time from `copy_seconds` (virtual: nothing sleeps)."""

    def __init__(self) -> None:
        self.states: dict[int, str] = {}

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
        self._move(pid, "checkpointed", "locked", "cuCheckpointProcessRestore")

    def unlock(self, pid: int) -> None:
        self._move(pid, "locked", "running", "cuCheckpointProcessUnlock")


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat().replace("+00:00", "Z")


def _dt(t: float) -> datetime:
    return datetime.fromtimestamp(t, timezone.utc)


def v(m: int) -> float:
    return T0 + m * 60.0


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
        del self.kernels[kernel_id]
        self.server.kernel_ended()


@dataclass
class Cull:
    kind: str  # "server" | "kernel"
    user: str
    minute: int
    busy: bool  # the GPU was working for it at that minute
    present: bool  # its user was at the keyboard


class SimServer:
    def __init__(self, user: User, m: int, env: dict[str, str], host: Path | None = None):
        self.user, self.started = user, v(m)
        self.kernels = SimKernels(self)
        now = _dt(v(m))
        self.settings: dict[str, Any] = {
            "kernel_manager": self.kernels, "started": now, "api_last_activity": now,
            "last_activity_times": {},
        }  # fmt: skip
        self.monitor = GpuMonitor(
            settings=self.settings, source_spec="none", log=QUIET, own_pid_namespace=False
        )
        self.monitor.reason, self.monitor.started = None, now  # readings come from here
        self.monitor.pod = PodInfo.from_environ(env)
        # hibernation through the fake checkpoint driver, in a pod with POD_HOST_MEMORY_GIB
        self.monitor.hibernator = Hibernator(
            driver=SimCheckpointDriver(),
            log=QUIET,
            cpu_probe_seconds=0,  # no real kernel processes to watch (virtual time)
            retry_refused_after=0,  # a refused kernel is tried at each (virtual) reading
            cgroup_root=str(host) if host else "/nonexistent",
            meminfo_path=str(host / "meminfo") if host else "/nonexistent",
        )
        self.kernel_id: str | None = None
        self.holds_memory = self.run_alive = self.busy = False
        self.hub_last = v(m)
        self.serial = 0

    def kernel_ended(self) -> None:
        self.kernel_id, self.holds_memory, self.run_alive = None, False, False

    def ensure_kernel(self, now: datetime) -> SimKernel:
        if self.kernel_id is None:
            self.serial += 1
            self.kernel_id = f"{self.user.name}-{self.serial:04d}-0000-0000-000000000000"
            pid = 1000 + self.serial
            self.kernels.kernels[self.kernel_id] = SimKernel(now, pid)
        return self.kernels.kernels[self.kernel_id]


class Sim:
    """One mix under one culler on a virtual clock."""

    def __init__(self, users: list[User], kind: str, catalog: dict | None = None):
        self.users, self.kind = users, kind
        self.servers: dict[str, SimServer] = {}
        self.culls: list[Cull] = []
        self.minute = 0
        self.env = notebook_env_for(catalog)
        self.reclaimable = 0.0  # MiB-minutes
        self.idle_slices = 0.0  # GPU-equivalent minutes
        self.offset = 0.0  # real - virtual seconds, for jupyterhub-idle-culler
        self.host: Path | None = None  # the pods' cgroup and meminfo files (hibernation)
        self.hibernations = 0
        self.resume_seconds: list[float] = []
        self.host_peak_mib = 0.0

    def hub_users(self) -> list[dict]:
        options = {"gpu": "1/4", "pool": POOL}
        return [
            server_model(n, s.started + self.offset, s.hub_last + self.offset, options)
            for n, s in sorted(self.servers.items())
        ]

    def stop(self, name: str) -> None:
        s = self.servers.pop(name, None)
        if s is not None:
            u = s.user
            self.culls.append(Cull("server", name, self.minute, s.busy, u.present[self.minute]))

    async def step(self, m: int, culler: Culler | None, url: str) -> None:
        self.minute = m
        now_t = v(m)
        now = _dt(now_t)
        for u in self.users:
            self.act(u, m, now)
            s = self.servers.get(u.name)
            # a cell, or a run, on a hibernated kernel: its message resumes it first (resume.py)
            if s is not None and s.kernel_id and (u.cell[m] and u.present[m] or u.run[m]):
                hib = s.monitor.hibernator
                memory = hib.memory_of(s.kernel_id)
                task = hib.resume(s.kernel_id, "a message to the kernel")
                if task is not None and await task:
                    self.resume_seconds.append(copy_seconds(memory))
        if self.kind.startswith("fracspawner"):
            for s in list(self.servers.values()):
                # reports go every minute in the product; the culler only reads the one before
                # each of its cycles, so the replay builds that one
                await self.server_side(s, m, now, culler, report=m % 5 == 0)
        if m % 5 == 0:  # CHP's activity poll and the servers' activity posts (300 s each)
            for s in self.servers.values():
                # with the extension, GPU work is part of what servers report as activity
                seen = server_activity if self.kind.startswith("fracspawner") else user_activity
                s.hub_last = max(s.hub_last, seen(s.settings).timestamp())
        if self.kind.startswith("fracspawner") and m % 5 == 0:
            await culler.cull_once(now=now_t)
        elif self.kind == "idle-culler" and m % 10 == 0:
            from jupyterhub_idle_culler import cull_idle

            self.offset = time.time() - now_t  # its clock is the real one
            await cull_idle(url, "token", 3600, QUIET, concurrency=10, api_page_size=MAX_PAGE)
        for u in self.users:
            s = self.servers.get(u.name)
            if s is None or u.present[m] or s.busy:
                continue
            self.idle_slices += u.gpu_equivalent
            hibernated = s.kernel_id is not None and s.monitor.hibernator.suspended(s.kernel_id)
            if s.kernel_id is not None and s.holds_memory and not hibernated:
                self.reclaimable += u.memory_mib
        host = sum(s.monitor.hibernator.total_mib() for s in self.servers.values())
        self.host_peak_mib = max(self.host_peak_mib, host)

    def act(self, u: User, m: int, now: datetime) -> None:
        """The user's minute: (re)start the server, run cells, launch or continue a run."""
        s = self.servers.get(u.name)
        if u.present[m] and s is None:
            s = self.servers[u.name] = SimServer(u, m, self.env, self.host)
        if s is None:
            return
        if u.present[m]:
            s.settings["api_last_activity"] = now  # the open JupyterLab polls the REST API
        run_start = u.run[m] and (m == 0 or not u.run[m - 1])
        cell = u.present[m] and u.cell[m]
        if cell or run_start:
            kernel = s.ensure_kernel(now)
            if cell:  # a cell's messages: kernel activity
                kernel.last_activity = s.kernels.last_kernel_activity = now
            if run_start:
                s.run_alive = True
        s.busy = False
        if s.kernel_id is not None:
            kernel = s.kernels.kernels[s.kernel_id]
            running = u.run[m] and s.run_alive  # the run's cell executes, silently
            s.busy = running or (u.present[m] and u.gpu_cell[m])
            kernel.execution_state = "busy" if (running or cell) else "idle"
            s.holds_memory = s.holds_memory or s.busy
        if not u.run[m]:
            s.run_alive = False

    async def server_side(
        self, s: SimServer, m: int, now: datetime, culler: Culler, report: bool
    ) -> None:
        """What the extension does in the server this minute: read, shut down, report."""
        u = s.user
        procs = []
        hibernated = s.kernel_id is not None and s.monitor.hibernator.suspended(s.kernel_id)
        if s.kernel_id is not None and s.holds_memory and not hibernated:
            util = BUSY if s.busy else 0.0
            procs = [GpuProcess("0", u.memory_mib, util, kernel_id=s.kernel_id)]
        used = sum(p.memory_mib for p in procs)
        device = GpuDevice("0", "NVIDIA H100 80GB HBM3", "GPU-sim", 81559, used, None)
        s.monitor.apply(
            GpuSample("simulated", [device], procs),
            [(s.kernel_id, p) for p in procs],
            set(s.kernels.list_kernel_ids()),
            now,
        )
        for _ in await s.monitor.cull_idle_kernels(now):
            self.culls.append(Cull("kernel", u.name, m, s.busy, u.present[m]))
        self.hibernations += len(await s.monitor.hibernate_idle_kernels(now))
        if not report:
            return
        body = s.monitor.report(
            server_last_activity=server_activity(s.settings),
            user_last_activity=user_activity(s.settings),
            now=now,
        )
        parsed = parse_report(json.loads(json.dumps(body)), received_at=v(m))
        culler.on_report(Identity(u.name, ""), culler.reports.put(u.name, "", parsed))

    def summary(self) -> dict:
        present = {u.name: u.present for u in self.users}
        disrupted = sum(
            1
            for c in self.culls
            if not c.present and any(present[c.user][c.minute + 1 : c.minute + 31])
        )
        return {
            "reclaimable_gib_hours": round(self.reclaimable / 1024 / 60, 1),
            "idle_slice_hours": round(self.idle_slices / 60, 1),
            "false_culls": sum(c.busy for c in self.culls),
            "culls_while_present": sum(c.present for c in self.culls),
            "culls_returned_to_within_30_min": disrupted,
            "server_stops": sum(c.kind == "server" for c in self.culls),
            "kernel_shutdowns": sum(c.kind == "kernel" for c in self.culls),
            "hibernations": self.hibernations,
            "resumes": len(self.resume_seconds),
            "host_memory_peak_gib": round(self.host_peak_mib / 1024, 1),
            "resume_p50_s": _percentile(self.resume_seconds, 0.5),
            "resume_max_s": max(self.resume_seconds, default=0.0),
        }


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


def notebook_env_for(catalog: dict | None) -> dict[str, str]:
    """The environment FracSpawner gives a 1/4 h100 server under this catalog."""
    from fracspawner.backends import load_catalog
    from fracspawner.choice.notebook_env import policy_env

    loaded = load_catalog(catalog or bench_catalog(None))
    env = {"FRACSPAWNER_GPU_SLICE": "1/4", "FRACSPAWNER_GPU_POOL": POOL}
    return env | policy_env(loaded.idle_for(POOL))


def bench_catalog(idle: dict | None) -> dict:
    data = yaml.safe_load((REPO / "examples" / "catalogs" / "demo.yaml").read_text())
    data.pop("idle", None)  # no idle section: the documented defaults
    data["access"]["default"] = {"pools": "all", "max_gpu": 1}
    if idle is not None:
        data["idle"] = idle
    return data


# --- the ground truth Prometheus holds -------------------------------------------------------
def dcgm_series(mixes: dict[str, list[User]]) -> list[tuple[dict, list[tuple[float, float]]]]:
    """Each pod's dcgm-exporter series as the trace's GPU work makes them, every 30 s."""
    series = []
    for users in mixes.values():
        for u in users:
            pod = {"pod": f"jupyter-{u.name}", "namespace": "jhub", "container": "notebook"}
            pod["job"] = "dcgm-exporter"  # the scrape job the culler reads (Culler.dcgm_job)
            util, mem, holds = [], [], False
            for m in range(HORIZON):
                busy = u.run[m] or (u.present[m] and u.gpu_cell[m])
                holds = holds or busy
                for k in range(0, 60, SAMPLE):
                    util.append((v(m) + k, BUSY if busy else 0.0))
                    mem.append((v(m) + k, float(u.memory_mib if holds else 0)))
            series.append(({"__name__": "DCGM_FI_DEV_GPU_UTIL", **pod}, util))
            series.append(({"__name__": "DCGM_FI_DEV_FB_USED", **pod}, mem))
    return series


async def replay(users: list[User], kind: str, prom_url: str, tmp: Path) -> dict:
    sim_catalog = None
    culler = None
    if kind in POLICIES:
        sim_catalog = bench_catalog(POLICIES[kind])
    sim = Sim(users, kind, sim_catalog)
    sim.host = pod_host(tmp)
    hub = StandInHub(sim.hub_users, on_delete=sim.stop)
    port = free_port()
    server = HTTPServer(hub.app)
    server.listen(port, "127.0.0.1")
    url = f"http://127.0.0.1:{port}/hub/api"
    if kind in POLICIES:
        path = tmp / f"{kind}.yaml"
        path.write_text(yaml.safe_dump(sim_catalog))
        culler = Culler(api_token="token", log_level=logging.ERROR)
        culler.initialize(
            [
                f"--url={url}",
                f"--catalog={path}",
                f"--prometheus-url={prom_url}",
                "--report-url=http://127.0.0.1:9",  # reports are handed over in process
                "--namespace=jhub",
            ]
        )
    started = time.perf_counter()
    try:
        for m in range(HORIZON):
            await sim.step(m, culler, url)
    finally:
        server.stop()
    out = sim.summary()
    out["replay_seconds"] = round(time.perf_counter() - started, 1)
    if culler is not None:
        samples = culler.metrics.failsafe.collect()[0].samples
        out["culler_failsafe_decisions"] = int(
            sum(s.value for s in samples if s.name.endswith("_total"))
        )
    return out


def goals(result: dict, baseline: dict) -> dict:
    def ratio(key: str) -> float | None:
        return None if not baseline[key] else round(result[key] / baseline[key], 2)

    def within(key: str, share: float) -> bool:
        if not baseline[key]:
            return not result[key]
        return result[key] <= share * baseline[key]

    return {
        "no_false_culls": result["false_culls"] == 0,
        "no_culls_of_a_present_user": result["culls_while_present"] == 0,
        "reclaimable_vs_baseline": ratio("reclaimable_gib_hours"),
        "reclaimable_at_most_20_percent": within("reclaimable_gib_hours", 0.2),
        "idle_slice_hours_vs_baseline": ratio("idle_slice_hours"),
        "idle_slice_hours_at_most_baseline": within("idle_slice_hours", 1.0),
        "disruption_at_most_baseline": result["culls_returned_to_within_30_min"]
        <= baseline["culls_returned_to_within_30_min"],
    }


async def bench_days(tmp: Path) -> dict:
    from tests.test_culler_support import BackfilledPrometheus

    mixes = {name: make_mix(name) for name in MIXES}
    prom = BackfilledPrometheus(tmp / "prometheus", dcgm_series(mixes))
    try:
        out: dict[str, Any] = {}
        for name, users in mixes.items():
            runs = {}
            for kind in ("no_culler", "idle-culler", *POLICIES):
                runs[kind] = await replay(users, kind, prom.url, tmp)
                print(f"   {name} / {kind}: {runs[kind]}", flush=True)
            baseline = runs["idle-culler"]
            out[name] = {
                "users": len(users),
                "hours_at_keyboard": round(sum(sum(u.present) for u in users) / 60, 1),
                "hours_of_silent_runs": round(sum(sum(u.run) for u in users) / 60, 1),
                "no_culler": runs["no_culler"],
                "jupyterhub_idle_culler_z2jh": baseline,
                **{kind: {**runs[kind], "goals": goals(runs[kind], baseline)} for kind in POLICIES},
            }
        return out
    finally:
        prom.stop()


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


def hibernation(days: dict) -> dict:
    """The hibernation row against the baseline, per mix: the keys outside checks read."""
    out = {}
    for mix, data in days.items():
        row, base = data[HIBERNATE_ROW], data["jupyterhub_idle_culler_z2jh"]
        pct = 100.0 * row["reclaimable_gib_hours"] / base["reclaimable_gib_hours"]
        out[mix] = {
            "reclaimable_pct": round(pct, 1) if base["reclaimable_gib_hours"] else 0.0,
            "disruptions": row["culls_returned_to_within_30_min"],
            "baseline_disruptions": base["culls_returned_to_within_30_min"],
            "false_culls": row["false_culls"],
            "present_culls": row["culls_while_present"],
            "host_memory_peak_gib": row["host_memory_peak_gib"],
            "resume_p50_s": row["resume_p50_s"],
            "resume_max_s": row["resume_max_s"],
        }
    return out


# --- report -------------------------------------------------------------------------------------
COLUMNS = [
    ("reclaimable_gib_hours", "reclaimable GiB·h"),
    ("idle_slice_hours", "idle slice-hours"),
    ("false_culls", "false culls"),
    ("culls_while_present", "culls of a present user"),
    ("culls_returned_to_within_30_min", "returned to within 30 min"),
    ("server_stops", "server stops"),
    ("kernel_shutdowns", "kernel shut-downs"),
]
ROWS = [
    ("no_culler", "no culler"),
    ("jupyterhub_idle_culler_z2jh", "jupyterhub-idle-culler, z2jh defaults (baseline)"),
    ("fracspawner_defaults", "fracspawner, catalog without `idle` (defaults)"),
    ("fracspawner_tight", "fracspawner, kernel 10m / GPU server 30m"),
    (HIBERNATE_ROW, "fracspawner, hibernate 5m / kernel off / GPU server 2h"),
]
HIBERNATION_COLUMNS = [
    ("hibernations", "hibernations"),
    ("resumes", "resumes"),
    ("host_memory_peak_gib", "host memory peak GiB"),
    ("resume_p50_s", "resume p50 s"),
    ("resume_max_s", "resume max s"),
]


def markdown(days: dict) -> str:
    lines = []
    for mix, data in days.items():
        lines += [
            f"### {mix}: {data['users']} users, {data['hours_at_keyboard']} h at the keyboard, "
            f"{data['hours_of_silent_runs']} h of silent runs",
            "",
            "| | " + " | ".join(label for _, label in COLUMNS) + " |",
            "|---|" + "---|" * len(COLUMNS),
        ]
        for key, label in ROWS:
            row = data[key]
            lines.append(f"| {label} | " + " | ".join(str(row[k]) for k, _ in COLUMNS) + " |")
        for key, label in ROWS[2:]:
            g = data[key]["goals"]
            missed = [k for k, ok in g.items() if ok is False]
            lines.append(
                f"\n{label}: reclaimable {g['reclaimable_vs_baseline']} and idle slice-hours "
                f"{g['idle_slice_hours_vs_baseline']} of the baseline; "
                + ("all goals met." if not missed else "missed: " + ", ".join(missed) + ".")
            )
        lines += [
            "",
            "Hibernation (fake checkpoint driver: "
            f"{COPY_FIXED_S} s + memory / {COPY_GIB_S:g} GiB/s, PCIe 4.0 x16):",
            "",
            "| | " + " | ".join(label for _, label in HIBERNATION_COLUMNS) + " |",
            "|---|" + "---|" * len(HIBERNATION_COLUMNS),
        ]
        for key, label in ROWS[2:]:
            row = data[key]
            cells = " | ".join(str(row.get(k, "")) for k, _ in HIBERNATION_COLUMNS)
            lines.append(f"| {label} | {cells} |")
        lines.append("")
    return "\n".join(lines)


def run(results_dir: Path) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="bench-culler-"))
    try:
        days = asyncio.run(bench_days(tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    cycle = asyncio.run(bench_cycle())
    result = {"days": days, "hibernation": hibernation(days), "cycle_5000_servers": cycle}
    (results_dir / "culler.md").write_text(
        "# Culler benchmarks\n\n"
        + (__doc__ or "")
        + "\n## (a) Days of notebook use\n\n"
        + markdown(days)
        + "\n## Raw figures\n\n```json\n"
        + json.dumps(result, indent=2)
        + "\n```\n"
    )
    return result
