"""A FAKE of nvidia-ml-py's `pynvml`, for tests only: put this directory first on PYTHONPATH of
the server under test and it is imported instead of the real one. It is not NVML.

It answers the calls fracspawner.serverext.sources.NvmlSource makes from a JSON file
(`$FAKE_NVML_STATE`, re-read on every call) describing what really runs on each GPU, and turns
that truth into what a given driver tells a process inside a container, reproducing each
documented behaviour:

- PID namespaces (`host_pid_offset` > 0: the pod has its own PID namespace and process N in it
  is N + offset on the host; 0 is `hostPID: true`):
  - drivers before 535.113.01 report HOST PIDs for running processes and utilisation samples
    (NVIDIA/nvidia-docker#179, #1483: "the driver is not aware of the PID namespace");
  - 535.113.01 up to 575.57.08 translate running-process PIDs into the caller's namespace but
    not the utilisation samples' (Project-HAMi/HAMi-core#112: process 324 in the container,
    samples for 645400, driver 560.35.03; shared/reference/gpu-activity.md);
  - from 575.57.08 both are translated.
- MIG: with MIG mode on, the GPU's instances are reached through MIG device handles; on them
  nvmlDeviceGetUtilizationRates and nvmlDeviceGetProcessUtilization fail with NOT_SUPPORTED
  (NVML API reference: "On MIG-enabled GPUs, querying ... utilization is not currently
  supported"; dask/distributed#8739, NordicHPC/sonar#247).
- No PIDs (`list_processes: false`): the running-process list comes back empty while the device
  works and holds memory, as nvidia-smi shows inside some containers
  (NVIDIA/gpu-operator#664 on 525.60.13, NVIDIA/nvidia-docker#759).
- A process whose CUDA state the fake checkpoint driver (cuda/bindings/driver.py) checkpointed
  holds no GPU memory and is not listed (NVIDIA/cuda-checkpoint README: after the suspend
  "nvidia-smi ... confirm that counter is no longer running on a GPU").
- nvmlDeviceGetProcessUtilization lists only processes with non-zero utilisation since the
  timestamp passed; with none it raises NOT_FOUND (NVML API reference).

State file: {"driver": "560.35.03", "host_pid_offset": 0, "gpus": [{"name": ...,
"memory_total_mib": 81559, "utilization": 80, "list_processes": true,
"processes": [{"pid": 1234, "memory_mib": 4096, "sm": 80}], "mig": [{"name": ...,
"memory_total_mib": 19968, "processes": [...]}]}]}. Process PIDs are as seen in the pod.
"""

from __future__ import annotations

import json
import os
import time
from types import SimpleNamespace

NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1

_NAMES = {
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH: "Argument Version Mismatch",
}


class NVMLError(Exception):
    def __init__(self, value: int):
        super().__init__(_NAMES.get(value, f"NVML error {value}"))
        self.value = value


class NVMLError_NotSupported(NVMLError):  # noqa: N801 (pynvml's names)
    def __init__(self, value: int = NVML_ERROR_NOT_SUPPORTED):
        super().__init__(value)


class NVMLError_NotFound(NVMLError):  # noqa: N801
    def __init__(self, value: int = NVML_ERROR_NOT_FOUND):
        super().__init__(value)


class NVMLError_FunctionNotFound(NVMLError):  # noqa: N801
    def __init__(self, value: int = NVML_ERROR_FUNCTION_NOT_FOUND):
        super().__init__(value)


class NVMLError_ArgumentVersionMismatch(NVMLError):  # noqa: N801
    def __init__(self, value: int = NVML_ERROR_ARGUMENT_VERSION_MISMATCH):
        super().__init__(value)


def _state() -> dict:
    with open(os.environ["FAKE_NVML_STATE"]) as f:
        return json.load(f)


def _driver() -> tuple[int, ...]:
    return tuple(int(x) for x in str(_state().get("driver", "575.57.08")).split("."))


def _translate(pid: int, *, sample: bool) -> int:
    """The PID this driver reports to a process in the pod for pod PID `pid`."""
    offset = int(_state().get("host_pid_offset", 0))
    if not offset:
        return pid  # hostPID: true, one namespace
    driver = _driver()
    if driver < (535, 113, 1):
        return pid + offset  # host PIDs everywhere
    if driver < (575, 57, 8) and sample:
        return pid + offset  # running processes translated, utilisation samples not
    return pid


def _device(handle: tuple) -> dict:
    gpu = _state()["gpus"][handle[1]]
    dev = gpu["mig"][handle[2]] if handle[0] == "mig" else gpu
    # checkpointed processes have released their device handles: not on the GPU at all
    processes = [p for p in dev.get("processes", []) if p.get("cuda_state") != "checkpointed"]
    return {**dev, "processes": processes, "is_mig": handle[0] == "mig"}


def nvmlInit() -> None:  # noqa: N802
    _state()


def nvmlShutdown() -> None:  # noqa: N802
    pass


def nvmlSystemGetDriverVersion() -> str:  # noqa: N802
    """The state's "driver" (NVML API reference: "the version of the system's graphics
    driver", e.g. "575.57.08")."""
    return str(_state().get("driver", "575.57.08"))


def nvmlDeviceGetCount() -> int:  # noqa: N802
    return len(_state()["gpus"])


def nvmlDeviceGetHandleByIndex(i: int) -> tuple:  # noqa: N802
    return ("gpu", i)


def nvmlDeviceGetMigMode(handle: tuple) -> tuple[int, int]:  # noqa: N802
    mode = NVML_DEVICE_MIG_ENABLE if _device(handle).get("mig") else NVML_DEVICE_MIG_DISABLE
    return mode, mode


def nvmlDeviceGetMaxMigDeviceCount(handle: tuple) -> int:  # noqa: N802
    return 7


def nvmlDeviceGetMigDeviceHandleByIndex(handle: tuple, j: int) -> tuple:  # noqa: N802
    if j >= len(_device(handle).get("mig") or []):
        raise NVMLError_NotFound()
    return ("mig", handle[1], j)


def nvmlDeviceGetName(handle: tuple) -> str:  # noqa: N802
    return _device(handle).get("name", "NVIDIA H100 80GB HBM3")


def nvmlDeviceGetUUID(handle: tuple) -> str:  # noqa: N802
    prefix = "MIG" if handle[0] == "mig" else "GPU"
    return f"{prefix}-fake-{'-'.join(map(str, handle[1:]))}"


def nvmlDeviceGetMemoryInfo(handle: tuple) -> SimpleNamespace:  # noqa: N802
    dev = _device(handle)
    used = sum(p.get("memory_mib", 0) for p in dev.get("processes", [])) * 2**20
    total = dev.get("memory_total_mib", 81559) * 2**20
    return SimpleNamespace(total=total, used=used, free=total - used)


def nvmlDeviceGetUtilizationRates(handle: tuple) -> SimpleNamespace:  # noqa: N802
    dev = _device(handle)
    if dev["is_mig"] or dev.get("mig"):
        raise NVMLError_NotSupported()
    return SimpleNamespace(gpu=int(dev.get("utilization", 0)), memory=0)


def nvmlDeviceGetComputeRunningProcesses(handle: tuple) -> list:  # noqa: N802
    dev = _device(handle)
    if not _state()["gpus"][handle[1]].get("list_processes", True):
        return []
    return [
        SimpleNamespace(
            pid=_translate(p["pid"], sample=False),
            usedGpuMemory=p.get("memory_mib", 0) * 2**20,
            gpuInstanceId=0xFFFFFFFF,
            computeInstanceId=0xFFFFFFFF,
        )
        for p in dev.get("processes", [])
    ]


nvmlDeviceGetComputeRunningProcesses_v2 = nvmlDeviceGetComputeRunningProcesses


def nvmlDeviceGetProcessUtilization(handle: tuple, last_seen: int) -> list:  # noqa: N802
    dev = _device(handle)
    if dev["is_mig"]:
        raise NVMLError_NotSupported()
    now = int(time.time() * 1e6)
    samples = [
        SimpleNamespace(
            pid=_translate(p["pid"], sample=True),
            timeStamp=now,
            smUtil=int(p["sm"]),
            memUtil=0,
            encUtil=0,
            decUtil=0,
        )
        for p in dev.get("processes", [])
        if p.get("sm", 0) > 0
    ]
    if not samples:
        raise NVMLError_NotFound()
    return samples
