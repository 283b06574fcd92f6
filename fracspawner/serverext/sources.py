"""Where GPU readings come from: NVML on a real GPU, or a JSON file for demos and tests.

A source returns one `GpuSample` per call: devices and the compute processes on them. Mapping
processes to kernels and keeping activity over time is the monitor's job, not the source's.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

MIB = 1024 * 1024


class GpuUnavailable(Exception):
    """No GPU can be read here (no NVML, no driver, no device); the message says why."""


@dataclass(frozen=True)
class GpuDevice:
    index: str  # "0", or "0:3" for MIG instance 3 of GPU 0
    name: str
    uuid: str
    memory_total_mib: float
    memory_used_mib: float
    utilization: float | None  # percent; None where the device cannot report it (MIG)


@dataclass(frozen=True)
class GpuProcess:
    device: str
    memory_mib: float
    # percent of the device's SMs this process used since the last sample; None = unknown
    utilization: float | None
    pid: int | None = None
    kernel_id: str | None = None  # set directly by the simulated source; else found from the pid
    # False: `utilization` is the whole device's (an upper bound: the process may be idle while
    # a neighbour works), where per-process readings are unsupported or carry PIDs of another
    # namespace
    exact: bool = True


@dataclass(frozen=True)
class GpuSample:
    source: str  # "nvml" | "simulated"
    devices: list[GpuDevice] = field(default_factory=list)
    processes: list[GpuProcess] = field(default_factory=list)
    driver: str | None = None  # the display driver's version ("575.57.08"), where NVML says


class GpuSource(Protocol):
    name: str

    def sample(self) -> GpuSample:
        """Read the GPU now; raise GpuUnavailable when it cannot be read at all."""

    def close(self) -> None: ...


class SimulatedSource:
    """Reads GPU usage from a JSON file the demo or a test writes; re-read on every sample.

    File format (all keys optional)::

        {"devices": [{"index": "0", "name": "...", "uuid": "...", "memory_total_mib": 81920,
                      "utilization": 50}],
         "kernels": {"<kernel-id>": {"memory_mib": 2048, "utilization": 90, "device": "0"}},
         "pids": {"<pid>": {"memory_mib": 512, "utilization": 0}},
         "unavailable": "reason"}      # makes the source behave like a machine without a GPU
    """

    name = "simulated"

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)

    def sample(self) -> GpuSample:
        try:
            data = json.loads(self.path.read_text() or "{}")
        except FileNotFoundError:
            data = {}
        except (OSError, ValueError) as exc:
            raise GpuUnavailable(f"simulated GPU file {self.path}: {exc}") from exc
        if data.get("unavailable"):
            raise GpuUnavailable(str(data["unavailable"]))
        processes = [
            _sim_process(spec, kernel_id=kid) for kid, spec in (data.get("kernels") or {}).items()
        ]
        processes += [
            _sim_process(spec, pid=int(pid)) for pid, spec in (data.get("pids") or {}).items()
        ]
        devices_data = data.get("devices") or [{}]
        devices = []
        for i, dev in enumerate(devices_data):
            index = str(dev.get("index", i))
            used = sum(p.memory_mib for p in processes if p.device == index)
            devices.append(
                GpuDevice(
                    index=index,
                    name=dev.get("name", "Simulated GPU"),
                    uuid=dev.get("uuid", f"GPU-simulated-{index}"),
                    memory_total_mib=float(dev.get("memory_total_mib", 81920)),
                    memory_used_mib=float(dev.get("memory_used_mib", used)),
                    utilization=dev.get("utilization"),
                )
            )
        return GpuSample(source=self.name, devices=devices, processes=processes)

    def close(self) -> None:
        pass


def _sim_process(spec: dict, *, kernel_id: str | None = None, pid: int | None = None) -> GpuProcess:
    util = spec.get("utilization", 0)
    return GpuProcess(
        device=str(spec.get("device", "0")),
        memory_mib=float(spec.get("memory_mib", 0)),
        utilization=None if util is None else float(util),
        pid=pid,
        kernel_id=kernel_id,
        exact=bool(spec.get("exact", True)),
    )


class NvmlSource:
    """Reads devices and compute processes through NVML (nvidia-ml-py, import name pynvml).

    Per-process utilisation comes from nvmlDeviceGetProcessUtilization, which lists only
    processes with non-zero utilisation since the timestamp passed in. Where a device cannot
    report per-process utilisation (some drivers), or its samples carry PIDs that match none of
    the running processes (drivers 535.113.01 to 575.57.08 translate the running-process PIDs
    into the container's namespace but not the utilisation samples' ones: Project-HAMi/HAMi-core
    #112 shows 324 vs 645400 on 560.35.03), each process gets the device's utilisation, marked
    inexact: a busy device then never makes a process look idle. Where neither is known (MIG
    instances: NVML's docs say utilisation queries are not supported there) it is None, and
    nothing is ever culled on the grounds of such a reading.
    """

    name = "nvml"

    def __init__(self) -> None:
        self._nvml = None
        self._last_seen: dict[str, int] = {}  # device index -> newest utilisation sample (us)

    def _init(self):
        if self._nvml is not None:
            return self._nvml
        try:
            import pynvml
        except ImportError as exc:
            raise GpuUnavailable("nvidia-ml-py (pynvml) is not installed") from exc
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise GpuUnavailable(f"NVML could not start: {exc}") from exc
        self._nvml = pynvml
        return pynvml

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError:
                pass
            self._nvml = None

    def _handles(self, nv) -> list[tuple[str, object]]:
        """(index, handle) for every device we may run on: MIG instances where MIG is on."""
        out = []
        for i in range(nv.nvmlDeviceGetCount()):
            handle = nv.nvmlDeviceGetHandleByIndex(i)
            try:
                mig_current, _pending = nv.nvmlDeviceGetMigMode(handle)
            except nv.NVMLError:  # not MIG-capable
                mig_current = 0
            if mig_current != nv.NVML_DEVICE_MIG_ENABLE:
                out.append((str(i), handle))
                continue
            for j in range(nv.nvmlDeviceGetMaxMigDeviceCount(handle)):
                try:
                    out.append((f"{i}:{j}", nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, j)))
                except nv.NVMLError:  # no instance in this slot, or not visible to this container
                    continue
        return out

    def _running(self, nv, handle) -> list:
        try:
            return nv.nvmlDeviceGetComputeRunningProcesses(handle)
        except (nv.NVMLError_FunctionNotFound, nv.NVMLError_ArgumentVersionMismatch):
            return nv.nvmlDeviceGetComputeRunningProcesses_v2(handle)  # older drivers

    def _process_utilization(self, nv, index: str, handle) -> dict[int, float] | None:
        """pid -> SM utilisation since the last call; {} = all idle; None = not supported."""
        try:
            samples = nv.nvmlDeviceGetProcessUtilization(handle, self._last_seen.get(index, 0))
        except nv.NVMLError as exc:
            # NOT_FOUND: no process ran since the timestamp. pynvml also raises with SUCCESS when
            # the first sizing call reports zero samples. Both mean "nobody was busy".
            if exc.value in (nv.NVML_ERROR_NOT_FOUND, nv.NVML_SUCCESS):
                return {}
            return None
        util: dict[int, float] = {}
        for s in samples:
            util[s.pid] = max(util.get(s.pid, 0.0), float(s.smUtil))
            self._last_seen[index] = max(self._last_seen.get(index, 0), int(s.timeStamp))
        return util

    def sample(self) -> GpuSample:
        nv = self._init()
        devices: list[GpuDevice] = []
        processes: list[GpuProcess] = []
        try:
            handles = self._handles(nv)
        except nv.NVMLError as exc:
            raise GpuUnavailable(f"NVML: {exc}") from exc
        for index, handle in handles:
            mem = nv.nvmlDeviceGetMemoryInfo(handle)
            try:
                device_util: float | None = float(nv.nvmlDeviceGetUtilizationRates(handle).gpu)
            except nv.NVMLError:  # NOT_SUPPORTED on MIG instances
                device_util = None
            devices.append(
                GpuDevice(
                    index=index,
                    name=nv.nvmlDeviceGetName(handle),
                    uuid=nv.nvmlDeviceGetUUID(handle),
                    memory_total_mib=mem.total / MIB,
                    memory_used_mib=mem.used / MIB,
                    utilization=device_util,
                )
            )
            per_process = self._process_utilization(nv, index, handle)
            running = self._running(nv, handle)
            pids = {int(p.pid) for p in running}
            if per_process and running and not pids.intersection(per_process):
                per_process = None  # samples from another PID namespace: unusable per process
            for proc in running:
                used = proc.usedGpuMemory  # None where the driver hides it (e.g. no permission)
                if per_process is None:
                    util, exact = device_util, False
                else:
                    util, exact = per_process.get(proc.pid, 0.0), True
                processes.append(
                    GpuProcess(
                        device=index,
                        memory_mib=(used or 0) / MIB,
                        utilization=util,
                        pid=int(proc.pid),
                        exact=exact,
                    )
                )
        try:
            driver = nv.nvmlSystemGetDriverVersion()
        except nv.NVMLError:
            driver = None
        if isinstance(driver, bytes):
            driver = driver.decode()
        return GpuSample(self.name, devices, processes, driver=driver)


ENV_DEMO_GPU = "FRACSPAWNER_SIMULATED_GPU"
DEMO_SPEC = "simulated-demo"


class DemoSimulatedSource:
    """The demo's SIMULATED GPU (`make demo` has no GPU): each of this server's kernels holds
    `kernel_memory_mib` of a made-up device, and its CPU work stands for GPU work (a cell that
    computes reads busy, an idle kernel idle), so the meter, its warnings and the culler can be
    seen. It is used only where `$FRACSPAWNER_SIMULATED_GPU` describes the device, which only the
    devcluster's kubelet sets (`DEVCLUSTER_SIMULATED_GPU=1`, by `make demo`); FracSpawner
    reserves the name, so no pod it spawns on a real cluster carries it. Reports say
    `"source": "simulated"`."""

    name = "simulated"

    def __init__(self, spec: str, server_pid: int | None = None, proc: Path = Path("/proc")):
        data = json.loads(spec)
        # a MIG instance cannot report utilisation (NVML answers NOT_SUPPORTED): None, "n/a";
        # it is named as NvmlSource names MIG instances ("<gpu>:<instance>"), so what reads the
        # name (the hibernator's and the doctor's MIG check, checkpoint_env.mig_problem) sees it
        self.mig = bool(data.get("mig"))
        self.device = GpuDevice(
            index="0:0" if self.mig else "0",
            name=str(data.get("name") or "Simulated GPU"),
            uuid="GPU-simulated-demo",
            memory_total_mib=float(data.get("memory_total_mib") or 81920),
            memory_used_mib=0.0,
            utilization=0.0,
        )
        self.kernel_memory_mib = float(data.get("kernel_memory_mib") or 1536)
        self.server_pid = server_pid or os.getpid()
        self.proc = proc
        self._cpu: dict[int, tuple[float, float]] = {}  # pid -> (cpu seconds, when)
        # the demo's simulated checkpoint driver: a checkpointed kernel holds no GPU memory, a
        # restore needs room on this device, and a MIG instance checkpoints nothing, as on a
        # real one (simcheckpoint.py)
        from .simcheckpoint import SimulatedCheckpointDriver

        self.checkpoint_driver = SimulatedCheckpointDriver(
            self.device.memory_total_mib, self.gpu_processes, proc, mig=self.mig
        )

    def _cpu_seconds(self, pid: int) -> float | None:
        try:
            stat = (self.proc / str(pid) / "stat").read_text()
        except OSError:
            return None
        fields = stat[stat.rfind(")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime

    def _kernel_pids(self) -> Iterator[int]:
        """This server's kernels: the processes on its simulated GPU."""
        from .procmap import kernel_id_of, owner_of

        for entry in self.proc.iterdir():
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            if kernel_id_of(pid, self.proc) is None:
                continue
            if self.server_pid not in owner_of(pid, self.proc).ancestors:
                continue  # another server's kernel (servers share this machine in the demo)
            yield pid

    def gpu_processes(self) -> dict[int, float]:
        """pid -> MiB each kernel holds on the simulated GPU while not checkpointed."""
        return {pid: self.kernel_memory_mib for pid in self._kernel_pids()}

    def sample(self) -> GpuSample:
        now = time.monotonic()
        processes = []
        away = self.checkpoint_driver.checkpointed()
        for pid in self._kernel_pids():
            cpu = self._cpu_seconds(pid)
            if cpu is None:
                continue
            before = self._cpu.get(pid)
            self._cpu[pid] = (cpu, now)
            busy = 0.0
            if before is not None and now > before[1]:
                busy = min(100.0, 100.0 * (cpu - before[0]) / (now - before[1]))
            if pid in away:  # checkpointed: its memory is in host memory, off the GPU
                continue
            util = None if self.mig else round(busy, 1)
            processes.append(GpuProcess(self.device.index, self.kernel_memory_mib, util, pid=pid))
        used = sum(p.memory_mib for p in processes)
        util = None if self.mig else max((p.utilization or 0.0 for p in processes), default=0.0)
        device = GpuDevice(**{**self.device.__dict__, "memory_used_mib": used, "utilization": util})
        return GpuSample(source=self.name, devices=[device], processes=processes)

    def close(self) -> None:
        pass


def make_source(spec: str | None) -> GpuSource | None:
    """`nvml` (default), `sim:/path/file.json`, `simulated-demo` (the demo's, only with
    $FRACSPAWNER_SIMULATED_GPU), or `none` (no GPU reading at all)."""
    spec = (spec or "nvml").strip()
    if spec == "none":
        return None
    if spec == "nvml":
        return NvmlSource()
    if spec.startswith("sim:"):
        return SimulatedSource(spec[4:])
    if spec == DEMO_SPEC:
        described = os.environ.get(ENV_DEMO_GPU, "").strip()
        if not described:
            raise ValueError(
                f"the demo's simulated GPU source needs ${ENV_DEMO_GPU}, which only the "
                "devcluster's kubelet sets (make demo); not used anywhere else"
            )
        try:
            return DemoSimulatedSource(described)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"${ENV_DEMO_GPU} is not a device description: {exc}") from None
    raise ValueError(
        f"unknown GPU source {spec!r}: use 'nvml', 'sim:/path/file.json', '{DEMO_SPEC}' or 'none'"
    )
