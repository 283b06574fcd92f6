"""Whether GPU work this server cannot place is a neighbour's: on a shared device (a fraction of
a GPU by time-slicing or over-commit), work of another pod is not this server's activity
(pure, apart from reading the environment in `from_environ`).

A busy device that lists none of this server's processes, or lists processes this server cannot
find, reads as unknown (never idle) in general: the work may be its own, hidden by the driver
(drivers before 535.113.01 report host PIDs inside a container: NVIDIA/nvidia-docker#1483;
MPS runs a pod's work in the MPS server's process, outside the pod). On a time-sliced device
shared with other pods that would keep an emptied server's idle clock at zero while its
neighbours work, so it kept its slot longest exactly where co-tenants need it. So the work is
taken as a neighbour's where all of these hold:

- the pod's slice is a fraction of a GPU (`FRACSPAWNER_GPU_SLICE` "1/4", "0.25", "10GiB"): its
  device is shared with other pods;
- not MPS (no `CUDA_MPS_PIPE_DIRECTORY` / `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` in the
  environment): there the pod's own work is the MPS server's;
- the server runs in a PID namespace of its own (a container), where every process of the pod
  is in its /proc;
- the driver translates PIDs into the container (535.113.01 or later): the pod's own processes
  are listed with PIDs it can find, so one it cannot find, or none listed, is another pod's.
"""

from __future__ import annotations

from collections.abc import Mapping

from .podinfo import ENV_SLICE

#: the first driver that reports a container's processes by their PID in the container
#: (NVIDIA/nvidia-docker#1483; the attribution module's note)
TRANSLATES_PIDS = (535, 113, 1)
MPS_ENV = ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")


def _version(text: str | None) -> tuple[int, ...] | None:
    try:
        return tuple(int(x) for x in str(text).split("."))
    except ValueError:
        return None


def shared_slice(spec: str) -> bool:
    """Whether a slice spec is less than a whole GPU (a fraction or an amount of memory)."""
    spec = spec.strip().lower()
    if not spec or spec in ("none", "0", "no") or spec.startswith("mig-"):
        return False
    if "/" in spec:
        num, _, den = spec.partition("/")
        try:
            return float(num) < float(den)
        except ValueError:
            return False
    try:
        return float(spec) < 1
    except ValueError:
        return spec.endswith(("gib", "gi", "g", "mib", "mi", "m"))


def neighbours_work(
    environ: Mapping[str, str], driver: str | None, own_namespace: bool
) -> str | None:
    """Why unplaced work on the device is a neighbour's here (see the module), or None."""
    if not shared_slice(environ.get(ENV_SLICE, "")):
        return None
    if any(environ.get(k) for k in MPS_ENV):
        return None
    version = _version(driver)
    if not own_namespace or version is None or version < TRANSLATES_PIDS:
        return None
    return (
        "the device is shared with other pods (a fraction of a GPU), and work this server "
        "cannot place is theirs: the driver lists this pod's own processes by their PID here"
    )
