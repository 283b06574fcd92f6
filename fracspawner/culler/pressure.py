"""GPU memory pressure on over-committed pools, and which idle kernels swap out (pure).

A pool with `overcommit: 2` places twice as many slices on a GPU as its memory holds (catalog
`overcommit`, backends/base.py `plugin_replicas`). That works while most kernels are idle: the
culler keeps the memory actually on each physical GPU within its size by asking the servers of
the least recently used idle kernels on it to hibernate them (their CUDA state goes to host
memory through the checkpoint API, fracspawner/serverext/hibernate.py, and comes back on the
kernel's next message). The ask travels in the answer to the server's own report
(receiver.py): the culler never calls into a user server. Run:ai sells the same idea as "GPU
memory swap" (docs.run.ai, Researcher/scheduling/gpu-memory-swap).

The rule, per physical GPU (keyed by the node of the server's pod and the NVML UUID its report
gives; only GPUs its pod may hold count: swapdesk.bind, placement.py):

- resident = what its servers' processes hold on it, each server at most its slice's memory (a
  server's word is never worth more than its slice, on all its GPUs together: swapdesk.bind),
  and a server whose report is stale or unreadable, or who has not reported, counts its whole
  slice: unknown memory is never counted as free. A kernel its server reports hibernated holds
  nothing there, whatever the last reading of its process said (the reading may predate the
  suspend); one whose checkpoint is under way ("hibernating") holds what it held until the
  copy is done (a minute for 80 GiB: `CHECKPOINT_MIB_PER_S`), and counts as leaving. Where
  the smallest fresh reading of the device's used memory (NVML of the whole device) says
  more, it counts: a kernel above its slice, processes nobody reports. The smallest, since
  the servers read it at different moments (before and after a swap they disagree) and one
  server's inflated word must move nobody;
- demand = resident + what kernels waiting to resume on it need (a resume refused for want of
  room: serverext/swap.py reports it; one being restored, only what it does not hold yet);
- pressure: demand above size - margin. Then the least recently used idle kernels on the GPU
  are chosen until what they hold covers the excess. A kernel is a candidate only when its
  server's fresh report says it holds memory, executes nothing, its GPU reading is idle and
  known, and nobody is at the server (presence); a busy, unknown, present or already hibernated
  kernel is never chosen. Kernels already asked (and not yet seen hibernated) and those whose
  checkpoint is under way count as freeing what they hold, so one pressure asks once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from dateutil.parser import isoparse

#: idle kernels are asked again after this long if their server's report still shows them
#: resident (a refusal that may pass, a lost answer)
ASK_AGAIN_AFTER = 30.0
#: the extension's hibernation states of a kernel whose memory is off the GPU (hibernate.py)
SUSPENDED = frozenset({"hibernating", "hibernated", "resuming", "restore_failed"})
#: of those, the states in which its memory is not on the GPU. Not "hibernating": its memory is
#: on the GPU until the checkpoint's copy is done, and the copy takes a while (below); counted
#: off the GPU meanwhile, its room was granted to a restore that met CUDA out of memory
#: (NVIDIA/cuda-checkpoint#44: the kernel lost). Not "resuming": it is coming back
OFF_GPU = frozenset({"hibernated", "restore_failed"})
#: the slowest copies measured, on an H200 with driver 580.159.04 (docs/serverext.md "First
#: run on a GPU"): a checkpoint (GPU to host memory) at 1.4 GiB/s, a restore at 3.4 GiB/s, not
#: at PCIe speed: 80 GiB take about a minute to hibernate and 15-25 s to come back (MiB/s)
CHECKPOINT_MIB_PER_S = 1.4 * 1024
RESTORE_MIB_PER_S = 3.4 * 1024


def copy_seconds(mib: float, mib_per_s: float) -> float:
    """How long a copy of `mib` its server reports under way is waited for: twice its time at
    the slowest rate measured, and 5 s more (the driver's own start, the report's way)."""
    return 5.0 + 2.0 * max(mib, 0.0) / mib_per_s


@dataclass(frozen=True)
class KernelOnGpu:
    """One kernel of a server, as its latest report has it."""

    kernel_id: str
    resident_mib: float  # on the GPU now (0 while hibernated)
    idle: bool  # no cell executing, GPU reading idle and known
    last_used: float | None  # unix time of its last message or GPU work; None: unknown
    hibernated: bool = False
    # its server tried to hibernate it and was refused for a while (a subprocess holds GPU
    # memory, its CUDA work did not pause, ...: hibernate.py's `next_try`): not asked meanwhile
    refused: bool = False
    # what a hibernated kernel brings back on resume, or one whose checkpoint is under way
    # copies to host memory, by its server's word (hibernate.py's `hibernated_gpu_memory_mib`);
    # 0: not hibernated, or not said
    hibernated_mib: float = 0.0
    state: str = "running"  # its hibernation state by its server's word (hibernate.py)

    @property
    def copying_out(self) -> bool:
        """Its checkpoint is under way: its memory is on the GPU until the copy is done."""
        return self.state == "hibernating"

    @property
    def copying_in(self) -> bool:
        """Its restore is under way: what it holds on the GPU grows to what it asked."""
        return self.state == "resuming"


@dataclass(frozen=True)
class ServerOnGpu:
    """One server's use of one physical GPU (its latest report, bounded by its slice)."""

    user: str
    server: str
    cap_mib: float  # its slice's memory: the most its word counts for
    resident_mib: float | None  # None: no fresh readable report (counted as cap_mib)
    waiting_mib: float = 0.0  # kernels waiting to resume here for want of room
    present: bool = False  # a person is at a tab of the server
    kernels: tuple[KernelOnGpu, ...] = ()


@dataclass(frozen=True)
class Swap:
    """Ask `server` of `user` to hibernate `kernel_id` (which holds `mib` on the GPU)."""

    user: str
    server: str
    kernel_id: str
    mib: float
    reason: str


@dataclass(frozen=True)
class Pressure:
    """One GPU's figures (MiB) and what to swap out."""

    uuid: str
    size_mib: float
    margin_mib: float
    resident_mib: float
    waiting_mib: float
    freeing_mib: float  # kernels asked before, or being copied out, not yet seen hibernated
    swaps: tuple[Swap, ...] = ()
    short_mib: float = 0.0  # what no idle kernel could cover (busy or present ones hold it)

    @property
    def excess_mib(self) -> float:
        """What must leave the GPU: demand over size - margin, less what is leaving."""
        limit = self.size_mib - self.margin_mib
        return max(0.0, self.resident_mib + self.waiting_mib - self.freeing_mib - limit)

    @property
    def under_pressure(self) -> bool:
        return self.excess_mib > 0


def resident_of(servers: Iterable[ServerOnGpu]) -> float:
    """Memory on the GPU: each server's reported resident memory within its slice, its whole
    slice where unknown."""
    return sum(
        s.cap_mib if s.resident_mib is None else min(max(s.resident_mib, 0.0), s.cap_mib)
        for s in servers
    )


def plan_swaps(
    uuid: str,
    size_mib: float,
    servers: Iterable[ServerOnGpu],
    margin_mib: float = 0.0,
    asked: Mapping[tuple[str, str, str], float] | None = None,
    reading_mib: float | None = None,
) -> Pressure:
    """The pressure on one GPU and the idle kernels to swap out, least recently used first.

    `asked`: kernels asked before (user, server, kernel id) -> MiB they held, still resident by
    their server's report; they are not chosen again and count as freeing what they hold.
    `reading_mib`: the smallest fresh reading of the device's used memory, which bounds what is
    resident from below (kernels above their slice, processes nobody reports)."""
    servers = list(servers)
    asked = asked or {}
    resident = max(resident_of(servers), max(reading_mib or 0.0, 0.0))
    waiting = sum(min(max(s.waiting_mib, 0.0), s.cap_mib) for s in servers)
    # what is on its way out: kernels asked before, and those whose checkpoint is under way
    # (asked or not: hibernated for idleness too), whose memory is on the GPU until it is done
    freeing = sum(
        asked.get(
            (s.user, s.server, k.kernel_id),
            min(max(k.resident_mib, 0.0), s.cap_mib) if k.copying_out else 0.0,
        )
        for s in servers
        if s.resident_mib is not None
        for k in s.kernels
    )
    pressure = Pressure(uuid, size_mib, margin_mib, resident, waiting, freeing)
    excess = pressure.excess_mib
    if excess <= 0:
        return pressure
    candidates = [
        (k.last_used, s.user, s.server, k.kernel_id, min(k.resident_mib, s.cap_mib))
        for s in servers
        if s.resident_mib is not None and not s.present
        for k in s.kernels
        if k.idle
        and not k.hibernated
        and not k.refused
        and k.resident_mib > 0
        and k.last_used is not None
        and (s.user, s.server, k.kernel_id) not in asked
    ]
    candidates.sort(key=lambda c: (c[0], c[1], c[2], c[3]))
    swaps = []
    for _used, user, server, kernel_id, mib in candidates:
        if excess <= 0:
            break
        swaps.append(Swap(user, server, kernel_id, mib, _reason(uuid, size_mib)))
        excess -= mib
    return Pressure(
        uuid, size_mib, margin_mib, resident, waiting, freeing, tuple(swaps), max(0.0, excess)
    )


def _reason(uuid: str, size_mib: float) -> str:
    return (
        f"swapped out: the GPU it shares with other notebooks ({math.floor(size_mib / 1024)} GiB) "
        "was full and it was the least recently used idle kernel"
    )


# --- the facts from a report (the extension's JSON, already checked by reports.REPORT) ---------
@dataclass(frozen=True)
class WaitingKernel:
    """A kernel whose resume waits for room on a GPU (serverext/swap.py `swap.waiting`)."""

    kernel_id: str
    mib: float
    since: float  # unix time it started waiting (clamped to the report's arrival)


@dataclass(frozen=True)
class ReportedGpu:
    """What one report says about one of its devices."""

    uuid: str
    total_mib: float
    used_mib: float | None
    resident_mib: float  # the server's own processes on it
    kernels: tuple[KernelOnGpu, ...] = ()
    # what its waiting kernels still bring to it: each one's ask, less what a restore under
    # way holds there already (in resident_mib)
    waiting_mib: float = 0.0
    waiting: tuple[WaitingKernel, ...] = ()

    def back(self) -> list[KernelOnGpu]:
        """Its kernels whose memory is on the GPU now (not hibernated; a checkpoint under way
        still holds it)."""
        return [
            k for k in self.kernels if k.resident_mib > 0 and (not k.hibernated or k.copying_out)
        ]

    def asleep(self) -> list[KernelOnGpu]:
        """Its hibernated kernels whose resume does not wait (a waiting one counts in
        `waiting_mib`): what they would bring back to the GPU is each one's `hibernated_mib`.
        Not one whose checkpoint is under way: its memory is on the GPU still (`back`), and its
        `hibernated_mib` says what it copies to host memory, not more to bring back."""
        waits = {w.kernel_id for w in self.waiting}
        return [
            k
            for k in self.kernels
            if k.hibernated and not k.copying_out and k.kernel_id not in waits
        ]


@dataclass(frozen=True)
class SwapFacts:
    """The devices a server's report names and its use of each."""

    gpus: tuple[ReportedGpu, ...] = field(default_factory=tuple)


def _time(value: object, ceiling: float) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return min(isoparse(value).timestamp(), ceiling)
    except (ValueError, OverflowError):
        return None


def swap_facts(report: Mapping, received_at: float) -> SwapFacts:
    """Per device: its UUID, size, the server's resident memory on it, its kernels (idle, last
    used) and what waits to resume there. Pure; times clamped to `received_at`. A report with
    no devices (unavailable, no GPU) says nothing."""
    if not report.get("available"):
        return SwapFacts()
    devices = [d for d in report.get("devices") or [] if isinstance(d, dict) and d.get("uuid")]
    if not devices:
        return SwapFacts()
    by_index = {str(d.get("index")): d["uuid"] for d in devices}
    first = devices[0]["uuid"]
    # kernels off the GPU by their server's word: their processes' last reading may predate it
    suspended = {
        k["id"]
        for k in report.get("kernels") or []
        if isinstance(k, dict)
        and k.get("id")
        and ((k.get("hibernation") or {}).get("state") or "running") in OFF_GPU
    }
    # a kernel's device: where its processes hold memory; a one-device server has one
    resident: dict[str, float] = {}
    kernel_device: dict[str, str] = {}
    held: dict[tuple[str, str], float] = {}  # (device, kernel id) -> what it holds there
    for p in report.get("processes") or []:
        if not isinstance(p, dict) or not p.get("matched"):
            continue
        if p.get("kernel_id") in suspended:
            kernel_device.setdefault(p["kernel_id"], by_index.get(str(p.get("device")), first))
            continue
        uuid = by_index.get(str(p.get("device")), first)
        mib = float(p.get("gpu_memory_mib") or 0)
        resident[uuid] = resident.get(uuid, 0.0) + mib
        if p.get("kernel_id"):
            kernel_device.setdefault(p["kernel_id"], uuid)
            key = (uuid, str(p["kernel_id"]))
            held[key] = held.get(key, 0.0) + mib
    kernels: dict[str, list[KernelOnGpu]] = {}
    for k in report.get("kernels") or []:
        if not isinstance(k, dict) or not k.get("id"):
            continue
        hibernation = k.get("hibernation") or {}
        # running (may be asked), cannot_hibernate / failed (never asked: it would not go),
        # or one of the suspended states (not on the GPU)
        state = hibernation.get("state") or "running"
        busy_reading = (
            not k.get("gpu_activity_known", False)
            or k.get("gpu_utilization") is None
            or float(k.get("gpu_utilization") or 0) >= 1.0
        )
        last = [
            t
            for t in (
                _time(k.get("last_activity"), received_at),
                _time(k.get("last_gpu_activity"), received_at),
            )
            if t is not None
        ]
        kernels.setdefault(kernel_device.get(k["id"], first), []).append(
            KernelOnGpu(
                kernel_id=k["id"],
                resident_mib=0.0 if k["id"] in suspended else float(k.get("gpu_memory_mib") or 0),
                idle=k.get("execution_state") == "idle" and not busy_reading and state == "running",
                last_used=max(last) if last else None,
                hibernated=state in SUSPENDED,
                refused=(_time(hibernation.get("next_try"), float("inf")) or 0) > received_at,
                hibernated_mib=float(hibernation.get("hibernated_gpu_memory_mib") or 0)
                if state in SUSPENDED
                else 0.0,
                state=str(state),
            )
        )
    waiting: dict[str, float] = {}
    waiting_kernels: dict[str, list[WaitingKernel]] = {}
    for w in (report.get("swap") or {}).get("waiting") or []:
        if isinstance(w, dict):
            uuid = w.get("device") if w.get("device") in by_index.values() else first
            mib = float(w.get("gpu_memory_mib") or 0)
            # a restore under way: what it holds already is resident, the rest still to come
            # (a whole H200's restore takes 26-42 s: counted twice, it was a pressure)
            coming = max(0.0, mib - held.get((uuid, str(w.get("kernel_id"))), 0.0))
            waiting[uuid] = waiting.get(uuid, 0.0) + coming
            since = _time(w.get("since"), received_at)
            waiting_kernels.setdefault(uuid, []).append(
                WaitingKernel(str(w["kernel_id"]), mib, received_at if since is None else since)
            )
    return SwapFacts(
        tuple(
            ReportedGpu(
                uuid=d["uuid"],
                total_mib=float(d.get("memory_total_mib") or 0),
                used_mib=None if d.get("memory_used_mib") is None else float(d["memory_used_mib"]),
                resident_mib=resident.get(d["uuid"], 0.0),
                kernels=tuple(kernels.get(d["uuid"], ())),
                waiting_mib=waiting.get(d["uuid"], 0.0),
                waiting=tuple(waiting_kernels.get(d["uuid"], ())),
            )
            for d in devices
        )
    )
