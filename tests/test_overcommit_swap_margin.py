"""The default swap margin on an over-committed pool that offers whole GPUs (issue 36 item 2).

The margin kept free on each GPU defaults to the pool's largest slice. The demo's HAMi `h100`
offers 1/8 to a whole GPU, so with over-commit the margin was the whole H100: every GPU holding
anything was "full", every idle kernel of a user away was swapped out at once, and once the
node's host budget was spent the culler shut the oldest hibernated kernels down to make room
(the culler benchmark's classroom/reserving row: 20 students' kernels shut down, and then their
servers stopped, 5-21 min before they came back, on GPUs 55-63 GiB free). The default is now
capped at half the GPU.
"""

from __future__ import annotations

from fracspawner.backends import load_catalog
from fracspawner.culler.decide import ServerFacts
from fracspawner.culler.placement import Placement
from fracspawner.culler.reports import parse_report
from fracspawner.culler.swapdesk import SwapDesk, seats_from
from fracspawner.culler.unlisted import unlisted_seats

H100 = 81559.0  # an H100 80GB HBM3 as NVML reports it
UUID = "GPU-h100-0"
CATALOG = {
    "pools": {
        "h100": {"gpu": "H100-80GB", "backend": "hami", "overcommit": 2,
                 "offers": ["1/8", "1/4", "1/2", "10GiB", "20GiB", "1"]},
        "quarters": {"gpu": "H100-80GB", "backend": "timeslicing", "replicas": 4,
                     "overcommit": 2, "offers": ["1/4"]},
    }
}  # fmt: skip


def report(mib: float) -> dict:
    """A HAMi pod's report: one idle kernel holding `mib`, its user away (HAMi-core's NVML
    shows the pod's slice and its own use)."""
    return {
        "available": True, "source": "nvml", "sampled_at": "2001-09-09T01:46:00Z",
        "devices": [{"index": "0", "uuid": UUID, "memory_total_mib": H100 / 4,
                     "memory_used_mib": mib}],
        "processes": [{"pid": 10, "kernel_id": "k", "device": "0", "gpu_memory_mib": mib,
                       "matched": True}],
        "kernels": [{"id": "k", "execution_state": "idle",
                     "last_activity": "2001-09-09T00:00:00Z", "last_gpu_activity": None,
                     "gpu_memory_mib": mib, "gpu_utilization": 0, "gpu_activity_known": True,
                     "hibernation": {"state": "running"}}],
        "presence": {"known": True, "present": False},
    }  # fmt: skip


def test_an_idle_kernel_on_a_nearly_empty_gpu_is_not_swapped_out():
    catalog = load_catalog(CATALOG)
    now = 1e9
    reports = [("ann", "", parse_report(report(8192.0), received_at=now))]
    known = {("ann", ""): ServerFacts("ann", user_options={"gpu": "1/4", "pool": "h100"})}
    where = Placement("node-0", 1, frozenset({UUID}), pool="h100", memory_mib=H100 / 4)
    seats = seats_from(reports, known, catalog, now, 30, placement=lambda _u, _s: where)
    # 8 GiB on an 80 GiB GPU is no pressure: nobody needs the memory, so it stays on the GPU
    answer = SwapDesk().answer("ann", "", seats, now)
    assert answer is None, f"swapped out on a GPU holding 8 of 80 GiB: {answer}"
    assert seats[0].margin_mib == H100 / 2


def test_the_default_margin_is_the_largest_slice_at_most_half_the_gpu():
    from fracspawner.culler.swapdesk import default_margin_mib

    pools = load_catalog(CATALOG).pools
    assert default_margin_mib(pools["h100"]) == H100 / 2
    assert default_margin_mib(pools["quarters"]) == H100 // 4  # its largest slice, a quarter
    # the same default for a pod the hub has not listed yet (unlisted.py)
    where = Placement("node-0", 1, None, pool="h100", memory_mib=H100, owner=("bob", ""))
    (seat,) = unlisted_seats([("jupyter-bob", where)], (), (), {}, load_catalog(CATALOG), 0, 30)
    assert seat.margin_mib == H100 / 2
