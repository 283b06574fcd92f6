"""Whether a hibernated kernel's GPU state may be restored now: never without room on the
PHYSICAL GPU (pure, apart from reading the environment in `virtualised_nvml`).

On current drivers a restore refused for want of room loses the kernel's GPU state for good:
NVIDIA/cuda-checkpoint#44 (driver 580.95.05, CUDA 13.0) - after cuCheckpointProcessRestore
fails with CUDA_ERROR_OUT_OF_MEMORY, every later restore fails with
CUDA_ERROR_OPERATING_SYSTEM (304), unlock with CUDA_ERROR_ILLEGAL_STATE, and only killing the
process helps. So a restore is tried only when a reading that sees the whole GPU says its
memory is free, with a margin:

- a grant from the culler, which sees every server on the GPU (culler/swapdesk.py): the one
  source on an over-committed pool, where several servers wait for the same room and NVML,
  read by each at its own moment, would let two restores into room for one; and under
  HAMi-core, whose NVML is virtualised (the pod's own limit and usage, not the GPU's). Where
  NVML is not virtualised, a grant goes only once the pod's own reading shows the room too
  (the swap that made it has landed; a culler misled by a report is not enough);
- elsewhere, NVML of the device, when the pod sees exactly one device: its total minus its used
  memory, less `margin_mib`, must cover what the kernel held.

No reading (none yet, several devices, an unreadable GPU): no room. The kernel waits; it is
never restored on a guess.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .podinfo import gib

#: HAMi-core's environment in a container it limits (Project-HAMi/HAMi-core: the device plugin
#: sets CUDA_DEVICE_MEMORY_LIMIT_<i>; libvgpu.so is preloaded)
HAMI_ENV = "CUDA_DEVICE_MEMORY_LIMIT"
HAMI_LIBRARY = "libvgpu"


@dataclass(frozen=True)
class Room:
    """`ok`: the restore may go now; `why`: the reading that says so, or why it waits."""

    ok: bool
    why: str


def virtualised_nvml(
    environ: Mapping[str, str], preload: str | Path = "/etc/ld.so.preload"
) -> str | None:
    """Why this pod's NVML readings are its own slice's and not the GPU's (HAMi-core), or None."""
    if any(k == HAMI_ENV or k.startswith(HAMI_ENV + "_") for k in environ):
        return f"HAMi-core limits this pod's GPU memory ({HAMI_ENV}*): its NVML is virtualised"
    if HAMI_LIBRARY in environ.get("LD_PRELOAD", ""):
        return "HAMi-core (libvgpu.so) is preloaded: this pod's NVML is virtualised"
    try:
        text = Path(preload).read_text()
    except OSError:
        return None
    if HAMI_LIBRARY in text:
        return f"HAMi-core (libvgpu.so in {preload}) is preloaded: this pod's NVML is virtualised"
    return None


def room_for(
    need_mib: float,
    *,
    granted_mib: float | None,
    devices: list[tuple[float, float]] | None,
    grant_only: str | None,
    margin_mib: float,
    virtualised: bool = False,
    restoring_mib: float = 0.0,
) -> Room:
    """May `need_mib` be restored now?

    `granted_mib`: what the culler granted this kernel (None: no grant in force); `devices`:
    (total, used) MiB of each device by the pod's latest NVML reading (None: no reading);
    `grant_only`: why only a grant counts here (over-commit, virtualised NVML), or None;
    `virtualised`: the readings are the pod's own (HAMi-core), not the GPU's;
    `restoring_mib`: what this server's other kernels being restored now bring back, or
    brought back after the reading was taken. A restore fills the GPU at 3.4-5.5 GiB/s
    (measured on an H200: 7-12 s for 40 GiB), and a reading shows it only as far as it had
    come when it was taken: its room is held from the reading's free memory."""
    restoring = max(restoring_mib, 0.0)
    if granted_mib is not None and granted_mib >= need_mib:
        granted = f"the culler granted {gib(granted_mib)} on the GPU"
        if virtualised or not devices or len(devices) != 1:
            return Room(True, granted)
        total, used = devices[0]
        if total - used - restoring >= need_mib:
            return Room(True, f"{granted} and {gib(total - used)} is free")
        return Room(False, f"{granted}; it waits until the GPU shows it free")
    if grant_only is not None:
        return Room(False, f"it waits for the culler to make room on the GPU ({grant_only})")
    if not devices:
        return Room(False, "the GPU's free memory cannot be read now")
    if len(devices) != 1:
        return Room(False, "the pod sees several GPUs: which one the kernel is on is not known")
    total, used = devices[0]
    free = total - used
    if free - margin_mib - restoring >= need_mib:
        return Room(True, f"{gib(free)} of {gib(total)} is free on the GPU")
    besides = (
        f", beside {gib(restoring)} this server's other kernels are bringing back, or brought "
        "back since the GPU was read"
        if restoring > 0
        else ""
    )
    return Room(
        False,
        f"{gib(max(free, 0.0))} of the GPU's {gib(total)} is free and it needs {gib(need_mib)} "
        f"plus a margin of {gib(margin_mib)}{besides}",
    )


def environ_grant_only(overcommit: float, environ: Mapping[str, str] | None = None) -> str | None:
    """Why only the culler's grant counts for this pod, or None (NVML of the device counts)."""
    virtual = virtualised_nvml(os.environ if environ is None else environ)
    if virtual is not None:
        return virtual
    if overcommit > 1:
        return (
            "the pool is over-committed: other notebooks wait for the same room, and the culler "
            "gives it to one at a time"
        )
    return None
