"""Say why a cell met GPU out-of-memory, under the error (issue 36 item 4: "no word about why").

Where memory is shared (time-slicing, MPS, an over-committed pool) a cell can meet CUDA out of
memory while its server holds well under its slice, and the traceback names only the framework's
allocator. When a kernel publishes an `error` on iopub whose name or text is a GPU out-of-memory
error of the common frameworks, the server adds a stderr note under the same cell from its own
latest GPU reading (`GpuMonitor.report`, what the GPU meter shows): how much this server holds
of its slice and, where the pod sees the whole GPU, how much the GPU's other servers hold. It
never names another user; a server without a GPU slice says nothing, one whose reading is
missing says so.

The errors recognised (name or text):
- PyTorch `torch.OutOfMemoryError` ("CUDA out of memory. Tried to allocate ..."), older
  releases' `RuntimeError: CUDA error: out of memory`; CuPy's `OutOfMemoryError`;
- JAX's `XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory ...`; TensorFlow's
  `ResourceExhaustedError` ("OOM when allocating tensor ...");
- the CUDA driver's `CUDA_ERROR_OUT_OF_MEMORY` and the runtime's `cudaErrorMemoryAllocation`
  (cuda-python, Numba).
Python's own `MemoryError` (host memory) is not one of them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .podinfo import gib
from .wsnotice import send_stderr

GPU_OOM = re.compile(
    r"OutOfMemoryError|CUDA out of memory|CUDA error: out of memory|CUDA_ERROR_OUT_OF_MEMORY"
    r"|cudaErrorMemoryAllocation|RESOURCE_EXHAUSTED: Out of memory|OOM when allocating"
)
# what frees memory in a notebook; PyTorch's caching allocator keeps freed blocks reserved
# (NVML counts them) until empty_cache
FREE_IT = (
    "To free memory, delete the tensors you no longer need and call torch.cuda.empty_cache(), "
    "use a smaller batch, or shut down a kernel you no longer use."
)
LARGER = "A larger slice holds more: ask for one when you next start your server."
# of the slice, held by this server, at or above which the slice itself is what ran out
NEAR_LIMIT = 0.9


def is_gpu_oom(ename: str, evalue: str) -> bool:
    """Whether a kernel's error (its `ename` and `evalue`) is a GPU out-of-memory error."""
    return bool(GPU_OOM.search(f"{ename}: {evalue}"))


@dataclass(frozen=True)
class OomView:
    """What the server's latest GPU reading says, for the note (`view_of`)."""

    slice_label: str | None  # '1/4 H100 · 20 GiB'
    slice_mib: float | None  # the memory the slice entitles this server to
    virtualised: bool  # HAMi-core: the pod's NVML shows its slice and its own use only
    shares_device: bool  # the pod reads a whole GPU other servers use too (time-slicing, MPS)
    total_mib: float | None  # the device(s) as the pod reads them
    used_mib: float | None
    own_mib: float | None  # this server's processes
    free_by_culler_mib: float | None  # the GPU's free memory by the culler's fresh count
    unavailable: str | None  # why there is no reading


def view_of(report: dict[str, Any]) -> OomView:
    """The note's view of a `GpuMonitor.report()`."""
    sl = report.get("slice") or {}
    devices = report.get("devices") or []
    total = sum(d["memory_total_mib"] for d in devices) if devices else None
    used = sum(d["memory_used_mib"] for d in devices) if devices else None
    by_culler = report.get("device_free_by") == "culler"
    return OomView(
        slice_label=sl.get("label"),
        slice_mib=sl.get("memory_mib"),
        virtualised=bool(sl.get("counts_hibernated")),
        shares_device=bool(sl.get("shares_device")),
        total_mib=total,
        used_mib=used,
        own_mib=report.get("gpu_memory_mib"),
        free_by_culler_mib=report.get("device_free_mib") if by_culler else None,
        unavailable=None if report.get("available") else (report.get("reason") or "no reading"),
    )


def _slice(v: OomView) -> str:
    """'Your server's slice is 1/4 H100 · 20 GiB.' (or what is known of it)."""
    if v.slice_label:
        return f"Your server's slice is {v.slice_label}."
    if v.slice_mib:
        return f"Your server's slice entitles it to {gib(v.slice_mib)}."
    return ""


def explain(v: OomView) -> str:
    """The note under the cell. Pure: the figures are the reading's, a few seconds old."""
    head = "fracspawner: this cell ran out of GPU memory."
    if v.unavailable or v.total_mib is None or v.used_mib is None:
        why = f" ({v.unavailable})" if v.unavailable else ""
        return " ".join(
            s
            for s in (
                head,
                _slice(v),
                f"This server has no GPU reading{why}, so it cannot say whose memory filled the "
                f"GPU. {FREE_IT}",
            )
            if s
        )
    total, used = v.total_mib, v.used_mib
    if v.virtualised:  # HAMi-core: total is the slice's limit, used this pod's own count
        if used >= NEAR_LIMIT * total:
            return (
                f"{head} It is your slice's limit: this server holds {gib(used)} of its "
                f"{gib(total)} (HAMi limits each server to its slice; a hibernated kernel's "
                f"memory still counts). {FREE_IT} {LARGER}"
            )
        shared = ""
        if v.free_by_culler_mib is not None:
            shared = (
                f" The GPU is lent to more servers than it holds at once and had "
                f"{gib(v.free_by_culler_mib)} free by the culler's last count."
            )
        return (
            f"{head} This server holds {gib(used)} of its slice's {gib(total)}: the allocation "
            f"asked for more than the {gib(total - used)} left in it, or the GPU itself had no "
            f"room.{shared} {FREE_IT}"
        )
    own = used if v.own_mib is None else v.own_mib
    free = max(0.0, total - used)
    if v.shares_device:
        others = max(0.0, used - own)
        over = ""
        if v.slice_mib and own > v.slice_mib:
            over = f" This server holds more than its slice's {gib(v.slice_mib)}."
        return " ".join(
            s
            for s in (
                f"{head} The GPU is shared and its memory is not reserved per server: "
                f"{gib(free)} of its {gib(total)} was free at the last reading; this server's "
                f"processes held {gib(own)}, other servers' {gib(others)}.",
                _slice(v) + over,
                f"{FREE_IT} Or run the cell again once others have freed memory.",
            )
            if s
        )
    return (
        f"{head} This server's processes hold {gib(own)} of the GPU's {gib(total)} "
        f"({gib(free)} free at the last reading). {FREE_IT} {LARGER}"
    )


def explaining_connection_class(base: type) -> type:
    """A subclass of `base` (a ZMQChannelsWebsocketConnection) that follows a kernel's GPU
    out-of-memory error with the note, once per cell (the error's parent request)."""

    class ExplainingConnection(base):  # type: ignore[misc,valid-type]
        _noted: list[str] | None = None

        def handle_outgoing_message(self, stream: Any, outgoing_msg: list[Any]) -> None:
            parent = None
            try:
                parent = self._gpu_oom_parent(stream, outgoing_msg)
            except Exception:  # never in the way of the kernel's own messages
                self.log.debug("fracspawner: unreadable iopub message", exc_info=True)
            super().handle_outgoing_message(stream, outgoing_msg)
            if parent is not None:
                self._note(parent)

        def _gpu_oom_parent(self, stream: Any, outgoing_msg: list[Any]) -> dict | None:
            """The request whose cell met a GPU out-of-memory error in this message, if any."""
            channel = stream if isinstance(stream, str) else getattr(stream, "channel", None)
            if channel != "iopub":
                return None
            _idents, fed = self.session.feed_identities(outgoing_msg)
            parts = fed[1:]  # header, parent header, metadata, content, buffers
            raw_header = parts[0] if isinstance(parts[0], bytes) else bytes(parts[0])
            if b'"error"' not in raw_header:  # cheap: most iopub messages are not errors
                return None
            if self.session.unpack(raw_header).get("msg_type") != "error":
                return None
            content = self.session.unpack(parts[3])
            if not is_gpu_oom(str(content.get("ename", "")), str(content.get("evalue", ""))):
                return None
            parent = self.session.unpack(parts[1])
            msg_id = parent.get("msg_id")
            noted = self._noted if self._noted is not None else []
            if not msg_id or msg_id in noted:
                return None
            self._noted = (noted + [msg_id])[-32:]
            return parent

        def _note(self, parent: dict) -> None:
            monitor = self.websocket_handler.settings.get("fracspawner_gpu_monitor")
            if monitor is None:
                return
            try:
                report = monitor.report()
                if not report.get("available") and not (report.get("slice") or {}).get("spec"):
                    return  # a server without a GPU: not a GPU's memory
                text = explain(view_of(report))
            except Exception:
                self.log.warning(
                    "fracspawner: could not explain a GPU out-of-memory error", exc_info=True
                )
                return
            send_stderr(self, parent, text)

    ExplainingConnection.__name__ = f"Explaining{base.__name__}"
    return ExplainingConnection
