"""On a GPU shared with other pods, DCGM's reading is the device's, not the server's (pure).

dcgm-exporter reads devices. On a GPU shared by time-slicing, HAMi, DRA shares or MPS it gives
every pod on the device the device's utilisation (NVIDIA/dcgm-exporter#587: with
--kubernetes-virtual-gpus all sharing pods get identical device-level values; without it one
of them does, #307). Combined as "busy from any source wins" (decide.combine), a neighbour's
work would keep an emptied server for as long as it lasts. The server's own report tells its
processes from a neighbour's (serverext/neighbours.py), so on a slice less than a whole GPU:

- where the server's report knows its GPU activity, DCGM's activity is not counted (its
  reading becomes "cannot tell", which defers to the one that knows; its memory, the
  device's, is not the server's either);
- where the report cannot tell (MPS, an old driver) or is missing, DCGM's reading stays: a busy
  device keeps the server (unknown is never idle; `server_unattended` bounds it) and an idle
  device is an idle server.

A whole GPU or a MIG instance is the pod's own: DCGM's reading is its.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from ..model.slices import SliceError, parse_slice
from .decide import GpuFacts

DEVICE_LEVEL = (
    "DCGM reads the whole GPU this server shares with other pods (a neighbour's work is not "
    "this server's: NVIDIA/dcgm-exporter#587); its own report decides"
)


def shares_device(gpu_slice: str | None) -> bool:
    """Whether a server's slice is less than a whole GPU (a fraction or an amount of memory)."""
    if not gpu_slice:
        return False
    try:
        s = parse_slice(gpu_slice)
    except SliceError:
        return False
    return s.kind == "memory" or (
        s.kind == "fraction" and s.fraction is not None and s.fraction < 1
    )


def own_share(
    sources: Mapping[str, GpuFacts | None], gpu_slice: str | None
) -> dict[str, GpuFacts | None]:
    """`sources` with DCGM's ("prometheus") activity left out where the device is shared and
    the server's own report ("extension") knows its activity (see the module)."""
    out = dict(sources)
    dcgm, own = out.get("prometheus"), out.get("extension")
    if dcgm is not None and own is not None and own.known and shares_device(gpu_slice):
        out["prometheus"] = replace(
            dcgm, memory_mib=0.0, idle_for=None, covered_for=None, note=DEVICE_LEVEL
        )
    return out
