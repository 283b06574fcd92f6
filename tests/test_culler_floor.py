"""The culler benchmark's floor (benchmarks/culler_floor.py): what any culler that keeps issue
36's rules must make people wait, from the trace alone, on small hand-made days."""

from __future__ import annotations

import pytest

from benchmarks.culler_floor import floor
from benchmarks.culler_trace import User

GPU = 100  # MiB: a toy GPU, so that the figures are read at a glance


def user(name: str, mib: int, present=(), gpu_cell=(), run=(), share: float = 1.0) -> User:
    """A user holding `mib` on the GPU once they use it (slice `share` of a GPU), present,
    running GPU cells and silent runs in the minutes given."""
    u = User(name, mib, gpu_equivalent=share)
    for flags, minutes in ((u.present, present), (u.gpu_cell, gpu_cell), (u.run, run)):
        for m in minutes:
            flags[m] = True
    return u


def test_silent_runs_alone_over_the_gpus_are_counted():
    # two runs of 60 on one GPU of 100 for three minutes: no culler that kills no working run
    # seats them both; nobody is present, so nobody is counted waiting
    users = [user("a", 60, run=range(3)), user("b", 60, run=range(1, 5))]
    out = floor(users, gpus=1, gpu_mib=GPU, minutes=6)
    assert out["runs_over_gpu_minutes"] == 2  # minutes 1 and 2
    assert out["forced_wait_person_minutes"] == 0
    assert out["forced_wait_person_minutes_without_runs"] == 0
    assert floor(users, gpus=2, gpu_mib=GPU, minutes=6)["runs_over_gpu_minutes"] == 0


def test_a_present_user_s_own_run_counts_among_the_runs():
    # a's run works while a is at the keyboard: it is a run all the same (60 + 60 > 100)
    users = [
        user("a", 60, present=range(3), gpu_cell=[0], run=range(3)),
        user("b", 60, run=range(3)),
    ]
    assert floor(users, gpus=1, gpu_mib=GPU, minutes=3)["runs_over_gpu_minutes"] == 3


def test_present_users_are_dropped_largest_first():
    # 50 + 30 + 30 on 70: without the 50 the rest fits (one person waits); without the two
    # 30s first it would take two
    users = [
        user("big", 50, present=range(2), gpu_cell=[0]),
        user("s1", 30, present=range(2), gpu_cell=[0]),
        user("s2", 30, present=range(2), gpu_cell=[0]),
    ]
    out = floor(users, gpus=1, gpu_mib=70, minutes=2)
    assert out["forced_wait_person_minutes"] == 2  # one person, two minutes
    assert out["forced_wait_minutes"] == 2
    assert out["most_forced_at_once"] == 1


def test_a_present_user_holds_nothing_before_their_first_gpu_cell():
    # a is there from minute 0 but first uses the GPU at minute 2; b holds 50 throughout: a
    # waits only from minute 2 on (80 + 50 > 100)
    users = [
        user("a", 80, present=range(4), gpu_cell=[2]),
        user("b", 50, present=range(4), gpu_cell=[0]),
    ]
    out = floor(users, gpus=1, gpu_mib=GPU, minutes=4)
    assert out["forced_wait_person_minutes"] == 2
    assert out["forced_wait_minutes"] == 2


def test_leaving_ends_what_a_present_user_holds():
    # a used the GPU, left at minute 2, is back at minute 3 without a GPU cell yet: a new
    # present stretch, nothing held; b holds 50
    users = [
        user("a", 80, present=[0, 1, 3], gpu_cell=[0]),
        user("b", 50, present=range(4), gpu_cell=[0]),
    ]
    assert floor(users, gpus=1, gpu_mib=GPU, minutes=4)["forced_wait_person_minutes"] == 2


def test_a_present_user_with_their_own_run_counts_once_and_is_never_dropped():
    # a is present with a run of 60 (it works: it stays), b and c hold 25 each, on 70: the run
    # is counted once (60, not 120) and both b and c must wait (dropping a frees nothing)
    users = [
        user("a", 60, present=range(2), gpu_cell=[0], run=range(2)),
        user("b", 25, present=range(2), gpu_cell=[0]),
        user("c", 25, present=range(2), gpu_cell=[0]),
    ]
    out = floor(users, gpus=1, gpu_mib=70, minutes=2)
    assert out["forced_wait_person_minutes"] == 4  # two people, two minutes
    assert out["runs_over_gpu_minutes"] == 0
    # on 90 the run and one of them fit: a counted twice (120) would make everyone wait
    assert floor(users, gpus=1, gpu_mib=90, minutes=2)["forced_wait_person_minutes"] == 2
    # with the run given up, a is a present user like the others: a alone waits (50 fits 70)
    assert out["forced_wait_person_minutes_without_runs"] == 2


def test_a_kernel_holds_at_most_its_slice():
    # a quarter slice of a 100 MiB GPU holds at most 25 (HAMi-core's limit): 90 asked, 25 held
    users = [
        user("a", 90, present=range(2), gpu_cell=[0], share=0.25),
        user("b", 70, present=range(2), gpu_cell=[0]),
    ]
    assert floor(users, gpus=1, gpu_mib=GPU, minutes=2)["forced_wait_person_minutes"] == 0


def test_all_that_fits_makes_nobody_wait():
    users = [
        user("a", 40, present=range(3), gpu_cell=[0]),
        user("b", 30, run=range(3)),
        user("c", 30, present=range(3), gpu_cell=[1]),
    ]
    out = floor(users, gpus=1, gpu_mib=GPU, minutes=3)
    assert out == out | {
        "runs_over_gpu_minutes": 0,
        "forced_wait_person_minutes": 0,
        "forced_wait_minutes": 0,
        "most_forced_at_once": 0,
        "forced_wait_person_minutes_without_runs": 0,
    }
    assert out["gpus"] == 1 and out["minutes"] == 3


def test_only_the_first_minutes_are_counted():
    users = [user("a", 60, run=range(10)), user("b", 60, run=range(10))]
    assert floor(users, gpus=1, gpu_mib=GPU, minutes=4)["runs_over_gpu_minutes"] == 4
    assert floor(users, gpus=1, gpu_mib=GPU)["runs_over_gpu_minutes"] == 10  # the whole horizon


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"gpus": 0}, "gpus must be at least 1, not 0"),
        ({"gpus": 1, "gpu_mib": 0}, "gpu_mib must be positive, not 0"),
        ({"gpus": 1, "minutes": -1}, "minutes must be from 0 to"),
    ],
)
def test_bad_input_is_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        floor([user("a", 10)], **kwargs)


def test_the_benchmark_s_rows_carry_the_floor_beside_their_waiting():
    # capacity.<mix>.<family>(.half_gpus): the floor of the cluster the row ran on, and the
    # person-minutes waited by the row and by the baseline, so that the three compare
    from benchmarks.bench_culler import capacity, half_gpus
    from benchmarks.culler_trace import Cluster

    keys = ("wait_episodes", "wait_p95_min", "culls_returned_to_within_30_min",
            "culls_while_present", "false_culls", "idle_reserved_slice_hours", "resume_failures",
            "stalled_runs", "host_memory_peak_per_node_gib", "idle_gpu_memory_gib_hours",
            "gpu_state_lost", "turned_away", "admission_waits", "memory_waits", "swap_orders",
            "grants", "resumes", "host_budget_orders", "cuda_oom_co_tenants",
            "runs_lost_to_cuda_oom", "runs_lost_to_cuda_oom_co_tenants",
            "kernel_wait_minutes")  # fmt: skip
    # each replay's row carries the host budget its culler used (a5cb9e2: from the node)
    row = dict.fromkeys(keys, 0) | {"wait_minutes": 120, "host_memory_budget_gib": 105.1}
    base = dict.fromkeys(keys, 0) | {"wait_minutes": 300}
    users = [user("a", 60, run=range(3)), user("b", 60, run=range(3))]
    small = floor(users, gpus=1, gpu_mib=GPU, minutes=3)
    head = half_gpus(row, base, Cluster(1), Cluster(2), small)
    assert head["floor"] == small and head["floor"]["runs_over_gpu_minutes"] == 3
    assert (head["wait_minutes"], head["baseline_wait_minutes"]) == (120, 300)
    assert head["host_memory_budget_gib"] == 105.1
    full = capacity(row, base, floor(users, gpus=2, gpu_mib=GPU, minutes=3))
    assert full["floor"]["gpus"] == 2 and full["floor"]["runs_over_gpu_minutes"] == 0
    assert (full["wait_minutes"], full["baseline_wait_minutes"]) == (120, 300)
