"""The demo's SIMULATED checkpoint driver: `make demo` has no GPU, so its simulated GPU
(sources.DemoSimulatedSource) gets a driver that moves a kernel through the states the CUDA
checkpoint API documents (RUNNING -> LOCKED -> CHECKPOINTED -> LOCKED -> RUNNING, CUDA Driver
API "Checkpointing"), so the whole hibernate-and-resume path (the hibernator, the meter, the
culler's report, the admin page) can be watched in a few minutes (issue 27 #4). Nothing is
copied anywhere: a checkpointed kernel's simulated GPU memory reads 0 in the demo's source.

Used only with the demo's source, which only the devcluster's kubelet selects (`make demo`);
every report that comes from it says "simulated".
"""

from __future__ import annotations

import threading

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
    """CheckpointDriver's calls on a table of simulated process states, as the API orders them:
    a call from the wrong state is refused with CUDA_ERROR_ILLEGAL_STATE, as the real one is."""

    simulated = True

    def __init__(self) -> None:
        self._states: dict[int, str] = {}
        self._lock = threading.Lock()  # the hibernator calls from worker threads

    def check(self) -> None:
        return None

    def cuda_version(self) -> int:
        return SIMULATED_CUDA_VERSION

    def state(self, pid: int) -> str:
        with self._lock:
            return self._states.get(pid, "running")

    def checkpointed(self) -> set[int]:
        """The pids whose simulated GPU memory is 'in host memory' now."""
        with self._lock:
            return {pid for pid, state in self._states.items() if state == "checkpointed"}

    def _move(self, call: str, pid: int) -> None:
        before, after = _NEXT[call]
        with self._lock:
            if self._states.get(pid, "running") != before:
                name = f"cuCheckpointProcess{call.title()}"
                raise CheckpointError(name, "CUDA_ERROR_ILLEGAL_STATE")
            self._states[pid] = after

    def lock(self, pid: int, timeout_ms: int) -> None:
        self._move("lock", pid)

    def checkpoint(self, pid: int) -> None:
        self._move("checkpoint", pid)

    def restore(self, pid: int) -> None:
        self._move("restore", pid)

    def unlock(self, pid: int) -> None:
        self._move("unlock", pid)
