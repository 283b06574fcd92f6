"""The capacity benchmark's own model (benchmarks/bench_culler.py): what it counts must come
from the replayed GPUs, not from its configuration (issue 36, "what to build" item 6)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from benchmarks.bench_culler import (
    OVERCOMMIT,
    OVERCOMMIT_KIND,
    Sim,
    SimServer,
    bench_catalog,
    pod_host,
    v,
)
from benchmarks.culler_trace import Cluster, User, make_mix


def _lab(n: int, memory_mib: int) -> list[User]:
    """n people at the keyboard the whole time, each running GPU cells every minute."""
    users = []
    for i in range(n):
        u = User(f"lab-{i:02d}", memory_mib)
        for m in range(10):
            u.present[m] = u.input[m] = u.tab_open[m] = u.cell[m] = u.gpu_cell[m] = True
        users.append(u)
    return users


def _hibernated(tmp_path: Path, family: str, users: list[User]) -> tuple[Sim, list, int]:
    """An over-committed Sim on one GPU of `family` with `users` given servers at minute 0, the
    first one's kernel hibernated (holding its memory_mib, the culler's host room given);
    returns the sim, the servers and that kernel's pid."""
    import asyncio

    sim = Sim(users, OVERCOMMIT_KIND, Cluster(1), family, bench_catalog(None, OVERCOMMIT),
              OVERCOMMIT)  # fmt: skip
    sim.host = pod_host(tmp_path)
    now = datetime.fromtimestamp(v(0), timezone.utc)
    servers = [sim.demand(u, 0) for u in users]
    a = servers[0]
    assert all(s is not None for s in servers)
    kernel = a.ensure_kernel(now)
    a.holds_memory = True
    a.swap.host_room[a.kernel_id] = now + timedelta(hours=1)  # the culler's room, given before
    mib = float(users[0].memory_mib)
    hib = a.monitor.hibernator
    state = asyncio.run(hib.hibernate(a.kernel_id, [kernel.pid], mib, kernel_pid=kernel.pid))
    assert state == "hibernated" and a.on_gpu_mib() == 0
    return sim, servers, kernel.pid


def test_a_restore_into_a_full_gpu_loses_the_kernel_as_nvidia_cuda_checkpoint_44(tmp_path: Path):
    # the replay's checkpoint driver follows NVIDIA/cuda-checkpoint#44: a restore the physical
    # GPU has no room for fails with OUT_OF_MEMORY, every later one with 304, and the kernel
    # counts in gpu_state_lost (never a counted retry that restores later)
    import pytest

    from fracspawner.serverext.checkpoint import CheckpointError

    sim, (a, b), pid = _hibernated(tmp_path, "time_sliced", _lab(2, 20000))
    b.ensure_kernel(datetime.fromtimestamp(v(0), timezone.utc))
    b.holds_memory, b.kernel_mib = True, 70000.0  # a co-tenant filled the GPU meanwhile
    with pytest.raises(CheckpointError, match="OUT_OF_MEMORY"):
        a.driver.restore(pid)
    b.kernel_mib = 1000.0  # room again: too late on #44 drivers
    with pytest.raises(CheckpointError, match="CUDA_ERROR_OPERATING_SYSTEM"):
        a.driver.restore(pid)
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


def _culler(sim: Sim, budget_mib: float = 65536.0):
    """The real culler as the replay runs it: the bench catalog, the pod watch's placements, the
    hub's record of each server (what a culler cycle would list)."""
    from benchmarks.bench_culler import FAMILIES, PodWatch
    from fracspawner.backends import load_catalog
    from fracspawner.culler.app import Culler
    from fracspawner.culler.decide import ServerFacts

    culler = Culler(host_memory_budget_mib=budget_mib)
    culler._catalog = load_catalog(bench_catalog(None, OVERCOMMIT))
    culler.server_pods = PodWatch(sim)
    for name in sim.servers:
        options = {"gpu": "1/4", "pool": FAMILIES[sim.family]}
        culler.known[(name, "")] = ServerFacts(name, user_options=options)
    return culler


def _hibernate(s, now) -> None:
    import asyncio

    k = s.ensure_kernel(now)
    s.holds_memory = True
    hib = s.monitor.hibernator
    s.swap.host_room[s.kernel_id] = now + timedelta(hours=1)  # the culler's room, given before
    state = asyncio.run(hib.hibernate(s.kernel_id, [k.pid], s.kernel_mib, kernel_pid=k.pid))
    assert state == "hibernated"


def test_the_culler_s_answer_keeps_each_node_within_its_host_budget(tmp_path: Path):
    # the culler's host memory budget per node (culler/hostbudget.py) through the real answer:
    # the replay's reports go to Culler.answer_report, whose `swap.shutdown` orders the servers'
    # SwapAgents carry out (counted as kernel shut-downs); a user in session is spared
    import asyncio

    from benchmarks.bench_culler import _dt

    users = _lab(3, 20000)
    sim = Sim(users, OVERCOMMIT_KIND, Cluster(1), "time_sliced", bench_catalog(None, OVERCOMMIT),
              OVERCOMMIT)  # fmt: skip
    sim.host = pod_host(tmp_path)
    now = _dt(v(0))
    for u in users:
        _hibernate(sim.demand(u, 0), now)
    sim.tab(users[0], sim.servers["lab-00"], 0, now)  # lab-00's person is at a visible tab
    culler = _culler(sim, budget_mib=30000.0)

    async def minute() -> None:
        for s in list(sim.servers.values()):
            sim.read(s, now)
        await sim.exchange(culler, 0)

    asyncio.run(minute())  # 60,000 MiB hibernated on the node: two must go
    assert sim.budget_orders == 2
    assert sim.servers["lab-00"].kernel_id is not None  # its user is present: kept
    assert sim.servers["lab-01"].kernel_id is None and sim.servers["lab-02"].kernel_id is None
    assert [c.kind for c in sim.culls] == ["kernel", "kernel"]


def _full_gpu(tmp_path: Path, users: list[User]) -> tuple[Sim, SimServer, SimServer, Any]:
    """Two servers on one over-committed time-sliced GPU: the first one's kernel hibernated,
    the second one's run filling the GPU (70,000 MiB); the culler that answers their reports."""
    from benchmarks.bench_culler import _dt

    sim = Sim(users, OVERCOMMIT_KIND, Cluster(1), "time_sliced", bench_catalog(None, OVERCOMMIT),
              OVERCOMMIT)  # fmt: skip
    sim.host = pod_host(tmp_path)
    now = _dt(v(0))
    a, b = (sim.demand(u, 0) for u in users)
    _hibernate(a, now)
    b.ensure_kernel(now)
    b.holds_memory, b.busy, b.kernel_mib = True, True, 70000.0  # a co-tenant's run fills it
    return sim, a, b, _culler(sim)


def test_a_resume_on_a_full_gpu_waits_for_the_culler_s_grant_and_loses_nothing(tmp_path: Path):
    # the restore path of the product (issue 36 item 1) in the replay: a cell on a hibernated
    # kernel whose GPU a co-tenant filled waits (the room check: only the culler's grant counts
    # on an over-committed pool), is reported as waiting, and is restored once the culler
    # grants room; the #44 driver never sees a restore into a full GPU
    import asyncio

    from benchmarks.bench_culler import _dt

    sim, a, b, culler = _full_gpu(tmp_path, _lab(2, 20000))

    async def minute(m: int) -> None:
        sim.minute, sim.now_t = m, v(m)
        a.monitor.hibernator.resume(a.kernel_id, "a cell")
        for s in (a, b):
            sim.read(s, _dt(v(m)))
        await sim.exchange(culler, m)

    async def day() -> None:
        await minute(1)
        assert a.hibernated() and a.monitor.hibernator.kernels[a.kernel_id].waiting()
        b.kernel_mib = 20000.0  # the run ends: its memory goes
        await minute(2)

    asyncio.run(day())
    assert not a.hibernated() and a.on_gpu_mib() == 20000.0
    assert sim.grants == 1 and a.driver.restored == 1
    assert sim.summary()["gpu_state_lost"] == 0


def test_a_person_whose_kernel_waits_for_room_is_counted_waiting_though_they_have_a_server(
    tmp_path: Path,
):
    # `wait_minutes` counts people without a server; a person at the keyboard whose cell waits
    # behind their kernel's resume cannot use that notebook either (kernel_wait_minutes: the
    # baseline never hibernates, so only the over-committed rows could hide waiting there)
    import asyncio

    from benchmarks.bench_culler import _dt

    users = _lab(2, 20000)
    for m in range(3, 10):  # a's person leaves at minute 3
        users[0].present[m] = users[0].tab_open[m] = users[0].cell[m] = False
    sim, a, b, culler = _full_gpu(tmp_path, users)

    async def minute(m: int) -> None:
        sim.minute, sim.now_t = m, v(m)
        if m == 1:
            a.monitor.hibernator.resume(a.kernel_id, "a cell")
        for s in (a, b):
            sim.read(s, _dt(v(m)))
        await sim.exchange(culler, m)
        sim.measure(m)

    async def day() -> None:
        for m in (1, 2):  # at the keyboard, the cell queued behind the resume
            await minute(m)
        assert a.monitor.hibernator.kernels[a.kernel_id].waiting()
        assert sim.kernel_wait_minutes == 2
        await minute(3)  # gone: the resume still waits, nobody waits on it
        assert a.monitor.hibernator.kernels[a.kernel_id].waiting()
        assert sim.kernel_wait_minutes == 2

    asyncio.run(day())
    assert sim.summary()["kernel_wait_minutes"] == 2
    assert sim.summary()["wait_minutes"] == 0  # both have servers


def _present_lab(n: int, memory_mib: int, minutes: int) -> list[User]:
    """n people at a visible tab the whole time, touching it and running GPU cells every
    minute; their kernels grow as they work (1 % a minute, to 1.5 x)."""
    users = _lab(n, memory_mib)
    for u in users:
        u.grows = True
        for m in range(minutes):
            u.present[m] = u.input[m] = u.tab_open[m] = u.cell[m] = u.gpu_cell[m] = True
    return users


def test_the_everyone_present_lab_waits_with_the_hub_s_reason_and_meets_no_oom(tmp_path: Path):
    # issue 36 items 5 and 6: the replay admits through the product's room check (the culler's
    # `room_json`, the hub's `verdict` and line), not its own reading of the GPU's memory. 8
    # present users on one H100 over-committed twice (8 quarter slots): kernels of 10 GiB that
    # grow to 15 GiB. Four present users hold the GPU; the 5th..8th wait with the hub's reason,
    # and nobody admitted meets CUDA out of memory in a cell.
    import asyncio

    from benchmarks.bench_culler import replay

    users = _present_lab(8, 10240, 40)
    sims: list[Sim] = []
    row = asyncio.run(
        replay(users, OVERCOMMIT_KIND, "time_sliced", Cluster(1), tmp_path, minutes=40, sims=sims)
    )
    (sim,) = sims
    assert sorted(sim.servers) == [u.name for u in users[:4]], sorted(sim.servers)
    assert list(sim.waiting) == [u.name for u in users[4:]]
    assert sim.room_reasons["lab-04"] == "The GPU is in use by 4 people now; you are next"
    assert sim.room_reasons["lab-05"] == (
        "The GPU is in use by 4 people now; 1 person is ahead of you"
    )
    assert sim.room_reasons["lab-07"] == (
        "The GPU is in use by 4 people now; 3 people are ahead of you"
    )
    assert row["admission_waits"] == 4
    assert row["resume_failures"] == 0, row  # no CUDA out of memory in anyone's cell


def test_slices_from_an_eighth_to_a_whole_gpu_take_their_share_of_the_gpu(tmp_path: Path):
    # issue 36 item 6: users ask 1/8 to whole GPUs. On the reserving pool (HAMi offers 1/8,
    # 1/4, 1/2, 1) a GPU seats slices up to its size (times over-commit), the hub's record and
    # the pod's limit are the user's slice; on the time-sliced pool (replicas 4: it offers only
    # 1/4, docs/catalog.md) every server is a quarter replica, its kernel holding what its
    # work needs
    from benchmarks.culler_trace import make_mix

    def user(name: str, piece: str, eq: float) -> User:
        u = _lab(1, 8192)[0]
        u.name, u.slice, u.gpu_equivalent = name, piece, eq
        return u

    users = [user("half", "1/2", 0.5), user("q1", "1/4", 0.25), user("q2", "1/4", 0.25),
             user("eighth", "1/8", 0.125)]  # fmt: skip
    sim = Sim(users, "fracspawner", Cluster(1), "reserving", bench_catalog(None))
    sim.host = pod_host(tmp_path)
    seated = [u.name for u in users if sim.demand(u, 0) is not None]
    assert seated == ["half", "q1", "q2"] and list(sim.waiting) == ["eighth"]
    assert {m["name"]: m["servers"][""]["user_options"]["gpu"] for m in sim.hub_users()} == {
        "half": "1/2",
        "q1": "1/4",
        "q2": "1/4",
    }
    assert sim.servers["half"].slice_mib() == 81559 / 2
    sim.stop("q1")  # a quarter frees: the eighth fits
    assert sim.demand(users[3], 1) is not None and sim.servers["eighth"].slice_mib() == 81559 / 8
    ts = Sim(users, "fracspawner", Cluster(1), "time_sliced", bench_catalog(None))
    ts.host = pod_host(tmp_path)
    assert all(ts.demand(u, 0) is not None for u in users)  # four quarter replicas
    assert {m["servers"][""]["user_options"]["gpu"] for m in ts.hub_users()} == {"1/4"}
    # the traces ask slices other than 1/4 (research up to a whole GPU)
    slices = {u.slice for mix in ("classroom", "research", "breaks") for u in make_mix(mix)}
    assert {"1/8", "1/4", "1/2", "1"} <= slices


def test_a_second_notebook_is_a_second_kernel_on_the_gpu(tmp_path: Path):
    # issue 36 item 6: a user's second notebook runs its own kernel in the same server. Its
    # first GPU cell allocates half the main kernel's memory; the server's report and the
    # GPU's reading hold both kernels; under HAMi-core both count against the pod's slice
    import asyncio

    from benchmarks.bench_culler import replay
    from benchmarks.culler_trace import make_mix

    u = _present_lab(1, 16384, 20)[0]
    u.grows = False
    for m in range(5):
        u.second[m] = True  # the first five minutes' cells run in the second notebook
    sims: list[Sim] = []
    asyncio.run(replay([u], OVERCOMMIT_KIND, "time_sliced", Cluster(1), tmp_path, 20, sims))
    s = sims[0].servers[u.name]
    assert s.kernel_id is not None and s.kernel2_id is not None and s.kernel_id != s.kernel2_id
    assert s.on_gpu_mib() == 16384 + 8192
    assert sims[0].gpu_free_mib(0, None) == 81559 - 16384 - 8192
    ids = {k["id"]: k for k in s.monitor.report(now=datetime.fromtimestamp(v(20), timezone.utc))[
        "kernels"]}  # fmt: skip
    assert {s.kernel_id, s.kernel2_id} <= set(ids)
    # HAMi: a quarter's limit (20,389 MiB) holds the main kernel's 16 GiB, not 8 GiB more
    sims = []
    asyncio.run(replay([u], OVERCOMMIT_KIND, "reserving", Cluster(1), tmp_path, 20, sims))
    s = sims[0].servers[u.name]
    assert s.on_gpu_mib() == 8192 and sims[0].resume_failures > 0  # the main kernel's cells
    # ... at its own slice's limit, alone on the GPU: none of them for want of co-tenants' room
    assert sims[0].summary()["cuda_oom_co_tenants"] == 0
    assert any(any(u.second) for u in make_mix("research"))


def test_under_hami_core_a_hibernated_kernel_still_counts_against_its_pods_slice(tmp_path: Path):
    # HAMi-core counts what a pod's processes allocated through its hooks and nothing else
    # (Project-HAMi/HAMi-core src/multiprocess/multiprocess_memory_limit.c
    # `get_gpu_memory_usage`); cuda-checkpoint frees a hibernated kernel's device memory through
    # none of them. So the pod's NVML still shows that memory used, and its second kernel cannot
    # take it: its first allocation fails at the pod's own limit (a quarter: 20,389 MiB)
    (u,) = users = _lab(1, 16384)
    sim, (a,), _pid = _hibernated(tmp_path, "reserving", users)
    assert a.virtualised
    now = datetime.fromtimestamp(v(0), timezone.utc)
    sim.read(a, now)
    (device,) = a.monitor.report(now=now)["devices"]
    limit = round(a.slice_mib(), 1)
    assert (device["memory_total_mib"], device["memory_used_mib"]) == (limit, 16384)
    sim.second_notebook(u, a, 0, now, cell=True)  # its first GPU cell: 8,192 MiB
    assert not a.holds2 and a.on_gpu_mib() == 0
    assert (sim.resume_failures, sim.oom_co_tenants) == (1, 0)  # at its own slice's limit


def _growing_run(name: str, memory_mib: int, child: bool) -> User:
    """A researcher who launches a run at minute 0 and leaves: it works 60 minutes, its
    kernel growing (1 % a minute, to 1.5 x)."""
    u = _lab(1, memory_mib)[0]
    u.name, u.grows, u.child_runs = name, True, child
    for m in range(60):
        u.run[m] = True
        u.present[m] = u.input[m] = u.tab_open[m] = u.cell[m] = u.gpu_cell[m] = m == 0
    return u


def test_a_run_that_meets_cuda_out_of_memory_is_lost_once_not_retried_each_minute(
    tmp_path: Path,
):
    # Measure what the person gets: a training run whose allocation fails ends with the error,
    # and nobody launches it again while its person is away. Under HAMi-core a quarter
    # (20,389 MiB) holds a 16 GiB run until it has grown by a quarter (minute ~25): from then
    # on the replay counted one CUDA out of memory a minute for a run that "kept working"
    # (and was not stalled). Now it is one error and one run lost, at its own slice's limit.
    import asyncio

    from benchmarks.bench_culler import replay

    for child in (False, True):
        u = _growing_run("res", 16384, child)
        sims: list[Sim] = []
        row = asyncio.run(replay([u], OVERCOMMIT_KIND, "reserving", Cluster(1), tmp_path, 60, sims))
        assert (row["runs"], row["resume_failures"]) == (1, 1), row
        assert (row["runs_lost_to_cuda_oom"], row["runs_lost_to_cuda_oom_co_tenants"]) == (1, 0)
        assert row["stalled_runs"] == 0  # the culler stopped nothing: counted apart
        s = sims[0].servers["res"]
        assert not s.run_alive
        # a run in the kernel leaves its memory held (the traceback keeps its tensors); one in
        # a child process ends with it, and the driver frees what it held
        assert s.on_gpu_mib() == (0 if child else s.kernel_mib) and s.kernel_mib > 20000 * (
            not child
        )


def test_a_run_without_room_beside_co_tenants_is_lost_to_them(tmp_path: Path):
    # time-slicing: nothing holds a kernel to its slice. A present user's 60 GiB kernel fills
    # most of the GPU; the researcher's run, launched beside it, grows into what is left and
    # then meets no room: one run lost to co-tenants, once
    import asyncio

    from benchmarks.bench_culler import replay

    run = _growing_run("res", 16384, False)
    lab = _present_lab(1, 61440, 60)[0]
    lab.grows = False
    sims: list[Sim] = []
    row = asyncio.run(
        replay([run, lab], OVERCOMMIT_KIND, "time_sliced", Cluster(1), tmp_path, 60, sims)
    )
    assert (row["runs_lost_to_cuda_oom"], row["runs_lost_to_cuda_oom_co_tenants"]) == (1, 1)
    assert row["cuda_oom_co_tenants"] == 1 and row["stalled_runs"] == 0, row


def test_a_partial_run_is_chosen_by_the_environment_and_checked():
    # one trace of the culler benchmark (the whole run takes ~36 min): mixes, rows, minutes
    import pytest

    from benchmarks.bench_culler import HORIZON, knobs, run

    k = knobs({"FRACSPAWNER_BENCH_CULLER_MIXES": "research", "FRACSPAWNER_BENCH_CULLER_ROWS":
               "headline", "FRACSPAWNER_BENCH_CULLER_MINUTES": "600"})  # fmt: skip
    assert (k.mixes, k.headline, k.minutes, k.partial) == (("research",), True, 600, True)
    assert not knobs({}).partial and knobs({}).minutes == HORIZON
    with pytest.raises(ValueError, match="unknown mix lab"):
        knobs({"FRACSPAWNER_BENCH_CULLER_MIXES": "lab"})
    with pytest.raises(ValueError, match="neither 'all' nor 'headline'"):
        knobs({"FRACSPAWNER_BENCH_CULLER_ROWS": "half"})
    with pytest.raises(ValueError, match="not a number of minutes"):
        knobs({"FRACSPAWNER_BENCH_CULLER_MINUTES": "0"})
    # another draw of the mixes: partial, and its own days (the whole run's trace is seed 7)
    other = knobs({"FRACSPAWNER_BENCH_CULLER_SEED": "9"})
    assert (other.seed, other.partial, knobs({}).seed) == (9, True, 7)
    assert [u.memory_mib for u in make_mix("classroom", other.seed)] != [
        u.memory_mib for u in make_mix("classroom", knobs({}).seed)
    ]
    with pytest.raises(ValueError, match="not a whole number"):
        knobs({"FRACSPAWNER_BENCH_CULLER_SEED": "-1"})
    with pytest.MonkeyPatch.context() as mp:  # the whole run's culler.json is never partial
        mp.setenv("FRACSPAWNER_BENCH_CULLER_MIXES", "research")
        with pytest.raises(RuntimeError, match="python -m benchmarks.bench_culler"):
            run(Path("/nonexistent"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FRACSPAWNER_BENCH_CULLER_SEED", "8")
        with pytest.raises(RuntimeError, match="SEED is set"):
            run(Path("/nonexistent"))
