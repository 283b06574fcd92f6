"""On HAMi a pod's NVML reading is HAMi-core's own bookkeeping, which keeps counting a hibernated
kernel's memory: it is never a floor for what the GPU holds (issue 36, items 1 and 4).

HAMi-core (Project-HAMi/HAMi-core at 8f3a89c) answers `nvmlDeviceGetMemoryInfo` in the pod
with its limit as the total and, as used, the sum of what the container's processes allocated
through its hooks (src/nvml/hook.c `_nvmlDeviceGetMemoryInfo`, src/multiprocess/
multiprocess_memory_limit.c `get_gpu_memory_usage`). That sum changes only in its allocation and
free hooks and when a process's slot is cleared (it exited). cuda-checkpoint frees a checkpointed
process's device memory inside the driver, through no hook (HAMi-core hooks no cuCheckpoint
call), so a hibernated kernel still counts as used in its pod's reading, while the GPU holds
none of it. Taken as a floor of what the GPU holds, that reading made a half-GPU kernel alone on
its GPU wait "the GPU is full" for ever, and the hub's admission saw its memory held.
"""

from __future__ import annotations

from dataclasses import replace

from fracspawner.culler.room import gpu_rooms
from fracspawner.culler.swapdesk import SwapDesk
from tests.test_overcommit_pressure import QUARTER, SIZE, kernel, report, seat

HALF = 2 * QUARTER


def _hami_view(body: dict, charged: float, limit: float) -> dict:
    """`body` with its device read as HAMi-core shows it in the pod: total the pod's limit,
    used what its processes allocated (a hibernated kernel's memory included)."""
    (device,) = body["devices"]
    device.update(memory_total_mib=limit, memory_used_mib=charged)
    return body


def _asleep(user: str, kid: str, mib: float, waits: bool, present: bool = False):
    """A HAMi server whose kernel `kid` (`mib`) is hibernated, waiting to resume or not."""
    wait = [{"kernel_id": kid, "gpu_memory_mib": mib, "since": "2026-01-01T12:00:00Z"}]
    asleep = kernel(kid, 0, "2026-01-01T09:00:00Z", state="hibernated")
    body = report([asleep], waiting=wait if waits else (), present=present)
    s = seat(user, _hami_view(body, charged=mib, limit=HALF), present=present)
    return replace(s, cap_mib=HALF, enforced=True)


def test_a_half_gpu_kernel_alone_on_its_gpu_comes_back():
    """Ann's half-GPU kernel is hibernated and she runs a cell: nobody else is on the GPU. Her
    pod's reading still shows the kernel's memory used (HAMi-core's count); the culler grants
    the restore. Before, that reading counted as held on the GPU: 'the GPU is full', for ever."""
    ann = _asleep("ann", "a1", HALF, waits=True)
    swap = SwapDesk(report_in=10, grant_margin_mib=1024.0).answer("ann", "", [ann], 100.0)
    assert swap["swap"].get("resume") == [{"kernel_id": "a1", "gpu_memory_mib": HALF}], swap
    assert "wait" not in swap["swap"], swap


def test_the_hubs_room_does_not_count_a_hibernated_kernel_by_its_pods_reading():
    """The same GPU as the hub's admission sees it (culler/room.py): Ann's kernel is
    hibernated, her pod's reading still counts it; a newcomer's half slice fits beside her.
    Before, the answer showed half the GPU held, and the newcomer waited for room that was
    there."""
    ann = _asleep("ann", "a1", HALF, waits=False)
    (room,) = gpu_rooms([("t4", ann)])
    assert room.free_mib == SIZE, room


def test_a_full_gpu_by_the_reports_still_waits():
    """The readings are dropped, not the reports: a present person's kernels hold three
    quarters, and the hibernated half-GPU kernel waits, with the reason."""
    bob = replace(
        seat("bob", report([kernel("b1", 3 * QUARTER, "2026-01-01T11:00:00Z")], present=True),
             present=True),
        cap_mib=3 * QUARTER, enforced=True,
    )  # fmt: skip
    ann = _asleep("ann", "a1", HALF, waits=True)
    swap = SwapDesk(report_in=10).answer("ann", "", [bob, ann], 100.0)["swap"]
    assert "resume" not in swap, swap
    assert swap.get("wait") == [
        {"kernel_id": "a1", "reason": "the GPU is in use by 1 person now; you are next"}
    ], swap


def test_the_answer_tells_a_hami_server_what_its_gpu_has_free():
    """HAMi-core shows each pod its own slice, never the GPU's room, so a pod cannot see that
    over-committed co-tenants left its GPU less free than its slice has left (an allocation
    then fails at the GPU: HAMi#1128). The culler, which counts the whole GPU, says it in the
    answer to each report, for the meter: u1 and u2 hold three quarters of a T4 between them,
    and each is told one quarter is free. A time-sliced pod reads the device itself: no word."""
    import time

    from fracspawner.backends import load_catalog
    from fracspawner.culler.app import Culler
    from fracspawner.culler.decide import ServerFacts
    from fracspawner.culler.identity import Identity
    from fracspawner.culler.placement import Placement
    from fracspawner.culler.reports import parse_report
    from tests.test_overcommit_admission_physical import HAMI

    def culler_with(catalog: dict, held: dict[str, float]) -> tuple[Culler, float]:
        culler = Culler()
        culler._catalog = load_catalog(catalog)
        culler.placement_of = lambda user, server: Placement("node-1")  # type: ignore[method-assign]
        now = time.time()
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
        for i, (user, mib) in enumerate(held.items()):
            k = kernel(f"k{i}", mib, "2026-01-01T10:00:00Z", execution_state="busy")
            body = {**report([k], used=sum(held.values())), "sampled_at": at}
            culler.known[(user, "")] = ServerFacts(user, user_options={"gpu": "1/2", "pool": "t4"})
            culler.reports.put(user, "", parse_report(body, received_at=now))
        return culler, now

    hami = {"pools": {"t4": {**HAMI["pools"]["t4"], "offers": ["1/2"]}}}
    culler, now = culler_with(hami, {"u1": HALF, "u2": QUARTER})
    for user in ("u1", "u2"):
        answer = culler.answer_report(Identity(user, ""), now) or {}
        assert answer.get("gpu") == {"free_mib": QUARTER}, (user, answer)
    sliced = {"pools": {"t4": {**hami["pools"]["t4"], "backend": "timeslicing", "replicas": 2}}}
    culler, now = culler_with(sliced, {"u1": HALF, "u2": QUARTER})
    assert "gpu" not in (culler.answer_report(Identity("u1", ""), now) or {})
