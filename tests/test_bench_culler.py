"""The capacity benchmark's own model (benchmarks/bench_culler.py): what it counts must come
from the replayed GPUs, not from its configuration (issue 36, "what to build" item 6)."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from benchmarks.bench_culler import OVERCOMMIT, OVERCOMMIT_KIND, Sim, bench_catalog, pod_host, v
from benchmarks.culler_trace import Cluster, User


def _lab(n: int, memory_mib: int) -> list[User]:
    """n people at the keyboard the whole time, each running GPU cells every minute."""
    users = []
    for i in range(n):
        u = User(f"lab-{i:02d}", memory_mib)
        for m in range(10):
            u.present[m] = u.input[m] = u.tab_open[m] = u.cell[m] = u.gpu_cell[m] = True
        users.append(u)
    return users


def test_over_committed_slots_do_not_seat_users_the_gpu_memory_cannot_hold(tmp_path: Path):
    # one H100 in quarters, over-committed twice: 8 slots for 8 people whose kernels hold
    # 20,000 MiB each while they work. Only 4 fit in the GPU's 81,559 MiB: the others must
    # wait for memory (a server admitted anyway meets CUDA out-of-memory in its first cell).
    users = _lab(8, 20000)
    sim = Sim(users, OVERCOMMIT_KIND, Cluster(1), "time_sliced", bench_catalog(None, OVERCOMMIT),
              OVERCOMMIT)  # fmt: skip
    sim.host = pod_host(tmp_path)
    for m in range(3):
        now = datetime.fromtimestamp(v(m), timezone.utc)
        for u in users:
            s = sim.demand(u, m)
            if s is not None:
                sim.act(u, s, m, now)
    assert len(sim.servers) == 4, sorted(sim.servers)
    assert sorted(sim.waiting) == ["lab-04", "lab-05", "lab-06", "lab-07"]
    assert sim.admission_waits == 4
    assert sim.resume_failures == 0  # nobody admitted met a full GPU in a cell


def test_a_restore_into_a_full_gpu_loses_the_kernel_as_nvidia_cuda_checkpoint_44(tmp_path: Path):
    # the replay's checkpoint driver follows NVIDIA/cuda-checkpoint#44: a restore the physical
    # GPU has no room for fails with OUT_OF_MEMORY, every later one with 304, and the kernel
    # counts in gpu_state_lost (never a counted retry that restores later)
    import asyncio

    import pytest

    from fracspawner.serverext.checkpoint import CheckpointError

    users = _lab(2, 20000)
    sim = Sim(users, OVERCOMMIT_KIND, Cluster(1), "time_sliced", bench_catalog(None, OVERCOMMIT),
              OVERCOMMIT)  # fmt: skip
    sim.host = pod_host(tmp_path)
    now = datetime.fromtimestamp(v(0), timezone.utc)
    a, b = (sim.demand(u, 0) for u in users)
    assert a is not None and b is not None
    kernel = a.ensure_kernel(now)
    a.holds_memory = True
    hib = a.monitor.hibernator
    state = asyncio.run(hib.hibernate(a.kernel_id, [kernel.pid], 20000.0, kernel_pid=kernel.pid))
    assert state == "hibernated" and a.on_gpu_mib() == 0
    b.ensure_kernel(now)
    b.holds_memory, b.kernel_mib = True, 70000.0  # a co-tenant filled the GPU meanwhile
    with pytest.raises(CheckpointError, match="OUT_OF_MEMORY"):
        a.driver.restore(kernel.pid)
    b.kernel_mib = 1000.0  # room again: too late on #44 drivers
    with pytest.raises(CheckpointError, match="CUDA_ERROR_OPERATING_SYSTEM"):
        a.driver.restore(kernel.pid)
    assert sim.summary()["gpu_state_lost"] == 1


def test_the_traces_hold_users_as_they_behave():
    # issue 36 item 6: hidden notebook tabs in lectures (present, the meter reporting hidden),
    # silences of 45+ min at a visible tab, and kernels that grow
    from benchmarks.culler_trace import make_mix

    classroom, research = make_mix("classroom"), make_mix("research")
    hidden = [u for u in classroom if any(u.tab_hidden)]
    assert hidden and all(
        u.present[m] and not u.tab_open[m] and not u.input[m]
        for u in hidden
        for m, h in enumerate(u.tab_hidden)
        if h
    )

    def longest_silence(u: User) -> int:
        best = run = 0
        for m, here in enumerate(u.present):
            run = run + 1 if here and u.tab_open[m] and not u.input[m] else 0
            best = max(best, run)
        return best

    assert any(longest_silence(u) >= 45 for u in research)
    assert any(u.grows for u in research)


def test_the_replay_keeps_each_node_s_hibernated_kernels_within_the_culler_s_budget(
    tmp_path: Path,
):
    # the culler's host memory budget per node (culler/hostbudget.py) is enforced in the
    # replay: beyond it the oldest hibernated kernel is shut down, a present user's never
    import asyncio
    from types import SimpleNamespace

    from fracspawner.culler.hostbudget import HibernatedKernel

    users = _lab(3, 20000)
    sim = Sim(users, OVERCOMMIT_KIND, Cluster(1), "time_sliced", bench_catalog(None, OVERCOMMIT),
              OVERCOMMIT)  # fmt: skip
    sim.host = pod_host(tmp_path)
    now = datetime.fromtimestamp(v(0), timezone.utc)
    reports = []
    for i, u in enumerate(users):
        s = sim.demand(u, 0)
        assert s is not None
        k = s.ensure_kernel(now)
        s.holds_memory = True
        hib = s.monitor.hibernator
        assert asyncio.run(hib.hibernate(s.kernel_id, [k.pid], 20000.0, kernel_pid=k.pid)) == (
            "hibernated"
        )
        kernel = HibernatedKernel(s.kernel_id, 20000.0, since=float(i))
        reports.append((u.name, "", SimpleNamespace(hibernated_kernels=(kernel,),
                                                    present=i == 0)))  # fmt: skip
    culler = SimpleNamespace(
        host_memory_budget_mib=30000.0, reports=SimpleNamespace(latest=lambda: reports)
    )
    asyncio.run(sim.host_budget(culler, 0))  # 60,000 MiB on the node: two must go
    assert sim.budget_shutdowns == 2
    assert sim.servers["lab-00"].kernel_id is not None  # its user is present: kept
    assert sim.servers["lab-01"].kernel_id is None and sim.servers["lab-02"].kernel_id is None
