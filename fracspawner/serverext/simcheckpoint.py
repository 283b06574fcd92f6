"""The demo's SIMULATED checkpoint driver: `make demo` has no GPU, so its simulated GPU
(sources.DemoSimulatedSource) gets a driver that moves a kernel through the states the CUDA
checkpoint API documents (RUNNING -> LOCKED -> CHECKPOINTED -> LOCKED -> RUNNING, CUDA Driver
API "Checkpointing"), so the whole hibernate-and-resume path (the hibernator, the meter, the
culler's report, the admin page) can be watched in a few minutes (issue 27 #4). Nothing is
copied anywhere: a checkpointed kernel's simulated GPU memory reads 0 in the demo's source.

It refuses what the real driver refuses, so the demo shows what a user would see on a GPU.
Sources, as in the tests' fake driver (tests/fake_nvml/cuda/bindings/driver.py):

[API]  CUDA Driver API reference, "CUDA Checkpointing" (group__CUDA__CHECKPOINT);
       https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__CHECKPOINT.html
[#42]  NVIDIA/cuda-checkpoint#42, "Fails with 'out of memory' on MIG-enabled GPUs"
       (https://github.com/NVIDIA/cuda-checkpoint/issues/42, open): on a MIG instance
       `cuda-checkpoint --action lock` goes through and `--action checkpoint` answers "out of
       memory"; the maintainer: "MIG isn't supported right now".
[#44]  NVIDIA/cuda-checkpoint#44, "Restore permanently fails after initial OOM - process stuck
       in CHECKPOINTED state" (driver 580.95.05, CUDA 13.0; open, no fixed driver named).
[GPU]  Measured on driver 580.159.04 (CUDA 13.0), one H200, by
       tests/gpu/test_real_checkpoint_driver.py (docs/serverext.md, "First run on a GPU").

- A call from another state than its own: CUDA_ERROR_ILLEGAL_STATE ([API]; [GPU]: 10 cases).
- Checkpoint on a MIG instance (the demo's MIG slices: devcluster/kubelet.py): refused with
  CUDA_ERROR_OUT_OF_MEMORY, the process left LOCKED, as the lock went through ([#42]; the
  tests' fake driver models it so). Before, the demo's driver checkpointed a MIG slice's
  kernel, which no GPU does.
- A pid that is no process (it exited): every call, GetState included, returns
  CUDA_ERROR_OPERATING_SYSTEM ([GPU]: GetState, Lock and Restore).
- Restore: "The GPU to restore onto needs to have enough memory" ([API]). When the simulated
  GPU's free memory (its total minus what its kernels not checkpointed hold) is below what the
  process held when it was checkpointed, the restore returns CUDA_ERROR_OUT_OF_MEMORY and the
  process stays CHECKPOINTED ([GPU]: refused with 1 MiB less free than NVML listed for the
  process, restored with 63 MiB more). The process is then lost for good: every later restore
  returns CUDA_ERROR_OPERATING_SYSTEM, room or not, GetState still answers CHECKPOINTED and
  unlock CUDA_ERROR_ILLEGAL_STATE ([#44]; [GPU]: the same with 140 GiB free again).

The hibernator restores only with room seen (room.py), so in the demo a restore is refused only
if that ever failed. Used only with the demo's source, which only the devcluster's kubelet
selects (`make demo`); every report that comes from it says "simulated".
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from pathlib import Path

from .checkpoint import CheckpointError

#: what the demo's driver says of itself (r575, CUDA 12.9: a driver with the checkpoint API)
SIMULATED_CUDA_VERSION = 12090

_NEXT = {
    "lock": ("running", "locked"),
    "checkpoint": ("locked", "checkpointed"),
    "restore": ("checkpointed", "locked"),
    "unlock": ("locked", "running"),
}


class SimulatedCheckpointDriver:
    """CheckpointDriver's calls on a table of simulated process states, as the API orders them,
    refused as the real driver refuses them (the module's docstring).

    `memory_total_mib`: the simulated GPU's memory; `processes()`: the live processes that use
    it, each with the MiB it holds there when not checkpointed (read under this driver's lock:
    it must not call back into the driver); `proc`: where a pid that exited is missing; `mig`:
    the simulated GPU is a MIG instance, where no checkpoint goes through ([#42])."""

    simulated = True

    def __init__(
        self,
        memory_total_mib: float,
        processes: Callable[[], Mapping[int, float]],
        proc: Path = Path("/proc"),
        mig: bool = False,
    ) -> None:
        self.memory_total_mib = float(memory_total_mib)
        self.mig = mig
        self._processes = processes
        self.proc = proc
        self._states: dict[int, str] = {}
        self._host: dict[int, float] = {}  # pid -> MiB "copied to host memory" at its checkpoint
        self._lost: set[int] = set()  # refused a restore for want of room: lost (#44)
        self._lock = threading.Lock()  # the hibernator calls from worker threads

    def check(self) -> None:
        return None

    def cuda_version(self) -> int:
        return SIMULATED_CUDA_VERSION

    def _alive(self, call: str, pid: int) -> None:
        """Under the lock: an exited pid answers OPERATING_SYSTEM, and is forgotten (a pid
        used again later is a new process)."""
        if not (self.proc / str(pid)).exists():
            self._forget(pid)
            raise CheckpointError(call, "CUDA_ERROR_OPERATING_SYSTEM")

    def _forget(self, pid: int) -> None:
        self._states.pop(pid, None)
        self._host.pop(pid, None)
        self._lost.discard(pid)

    def state(self, pid: int) -> str:
        with self._lock:
            self._alive("cuCheckpointProcessGetState", pid)
            return self._states.get(pid, "running")

    def checkpointed(self) -> set[int]:
        """The pids whose simulated GPU memory is 'in host memory' now."""
        with self._lock:
            for pid in [p for p in self._states if not (self.proc / str(p)).exists()]:
                self._forget(pid)
            return {pid for pid, state in self._states.items() if state == "checkpointed"}

    def _move(self, call: str, pid: int) -> None:
        before, after = _NEXT[call]
        name = f"cuCheckpointProcess{call.title()}"
        with self._lock:
            self._alive(name, pid)
            if self._states.get(pid, "running") != before:
                raise CheckpointError(name, "CUDA_ERROR_ILLEGAL_STATE")
            if call == "checkpoint" and self.mig:  # #42: "out of memory", left LOCKED
                raise CheckpointError(name, "CUDA_ERROR_OUT_OF_MEMORY")
            if call == "checkpoint":  # what it holds now is what a restore needs back
                self._host[pid] = float(self._processes().get(pid, 0.0))
            elif call == "restore":
                if pid in self._lost:  # #44: lost since a restore ran out of memory
                    raise CheckpointError(name, "CUDA_ERROR_OPERATING_SYSTEM")
                if self._free_mib() < self._host.get(pid, 0.0):
                    self._lost.add(pid)  # stays CHECKPOINTED, and lost (#44, [GPU])
                    raise CheckpointError(name, "CUDA_ERROR_OUT_OF_MEMORY")
                self._host.pop(pid, None)
            self._states[pid] = after

    def _free_mib(self) -> float:
        """Under the lock: the simulated GPU's total less what its resident processes hold."""
        held = sum(
            mib
            for pid, mib in self._processes().items()
            if self._states.get(pid, "running") != "checkpointed"
        )
        return self.memory_total_mib - held

    def lock(self, pid: int, timeout_ms: int) -> None:
        self._move("lock", pid)

    def checkpoint(self, pid: int) -> None:
        self._move("checkpoint", pid)

    def restore(self, pid: int) -> None:
        self._move("restore", pid)

    def unlock(self, pid: int) -> None:
        self._move("unlock", pid)
