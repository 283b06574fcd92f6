"""Where the CUDA checkpoint API cannot work, from what a notebook pod can see: the driver, MIG,
NCCL, and whether a kernel's process is working on the CPU. Plain checks, used by the
hibernator (hibernate.py) and by `fracspawner doctor`; each names the NVIDIA issue it follows.

- Drivers before 575.57.08 (r570 up to 575.51) fail to checkpoint or restore a process in a
  container that sees only some of the node's GPUs (NVIDIA/cuda-checkpoint #24:
  "CHECKPOINT_DEVICES failed ... operation not permitted" with partial device passthrough,
  reported fixed in 575.57.08 by a comment there pointing at that driver's release notes; #12:
  the restore fails). A notebook pod with a GPU slice on a node with several GPUs is exactly
  that container; `all_gpus_visible` says the pod sees every GPU of its node.
- MIG instances cannot be checkpointed (#42: 'Could not checkpoint ...: "out of memory"'; the
  maintainer: "MIG isn't supported right now").
- A process in an NCCL communicator with peers: locking one rank makes every checkpoint call on
  the others hang until it is unlocked (#30, "a known limitation - checkpointing applications
  that use NCCL is not supported yet"; #45 for torch.distributed). NCCL maps its shared-memory
  segments from /dev/shm/nccl-XXXXXX (NCCL's shmutils/proxy: mkstemp on that template), which
  is what `nccl_peers` looks for in /proc/<pid>/maps: an assumption that holds for ranks on one
  node, the case a notebook pod has.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

MIN_CUDA_VERSION = 12080  # cuDriverGetVersion of the r570 driver: the checkpoint API's first
PARTIAL_PASSTHROUGH_FIXED = (575, 57, 8)


def parse_driver(version: str | None) -> tuple[int, ...] | None:
    """'575.57.08' -> (575, 57, 8); None where it is not a version."""
    if not version:
        return None
    try:
        return tuple(int(part) for part in version.strip().split("."))
    except ValueError:
        return None


def driver_problem(driver: str | None, in_container: bool, all_gpus_visible: bool) -> str | None:
    """Why checkpointing cannot work with this display driver here; None where it can."""
    parsed = parse_driver(driver)
    if parsed is None or not in_container or all_gpus_visible:
        return None
    if parsed < PARTIAL_PASSTHROUGH_FIXED:
        return (
            f"driver {driver} cannot checkpoint in a container that sees only some of the node's "
            "GPUs (NVIDIA/cuda-checkpoint #12, #24; reported fixed in driver 575.57.08): upgrade "
            "the driver, or set Hibernator.all_gpus_visible where pods see every GPU of their node"
        )
    return None


def mig_problem(device_indices: Iterable[str]) -> str | None:
    """MIG instances are named "<gpu>:<instance>" by the GPU source (sources.py)."""
    if any(":" in str(index) for index in device_indices):
        return (
            "the GPU is a MIG instance, which the CUDA checkpoint API does not support "
            "(NVIDIA/cuda-checkpoint #42)"
        )
    return None


def nccl_peers(pid: int, proc: Path = Path("/proc")) -> bool:
    """Whether the process maps NCCL shared memory (a communicator with peers on this node)."""
    try:
        maps = (proc / str(pid) / "maps").read_text(errors="replace")
    except OSError:
        return False
    return "/dev/shm/nccl-" in maps


def cpu_seconds(pid: int, proc: Path = Path("/proc")) -> float | None:
    """CPU time (user + system, seconds) the process has used; None when it is gone."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()  # comm may hold spaces: after the last ')'
    try:
        ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    except (IndexError, ValueError):
        return None
    return ticks / os.sysconf("SC_CLK_TCK")


def nvml_driver_version() -> str | None:
    """The display driver's version from NVML ("575.57.08"), None where NVML cannot say."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVML, no driver: unknown, which refuses nothing by itself
        return None
    return version.decode() if isinstance(version, bytes) else str(version)
