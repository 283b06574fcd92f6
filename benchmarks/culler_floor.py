"""The culler benchmark's floor: what ANY culler that keeps issue 36's rules must make people
wait on a cluster, from the trace alone (benchmarks/culler_trace.py), with no replay.

The benchmark's goals (issue 36: waiting on half the GPUs <= jupyterhub-idle-culler's on all of
them; without over-commit <= 50 % of it) are missed in some rows; the issue asks what limits
them "with the figure". This is that figure: a lower bound on the waiting no culler can avoid.

The rules kept (issue 36):
- 0 false culls: a silent run (`User.run`) is never killed, suspended or swapped out while it
  works (swap never takes a kernel that executes), so every run of the minute is on a GPU;
- admission by presence (item 5): a present user's kernel holds its memory on the GPU, counted
  from their first GPU cell in the current present stretch (a stretch of minutes with
  `User.present`) on, nothing before; a user who leaves starts a new stretch holding nothing.

At minute m what must be on the GPUs is then every silent run's memory plus every present
user's who holds; a present user with a run of their own counts once, among the runs (it works:
making them wait frees nothing). Where that exceeds `gpus * gpu_mib`, some present users must
be without room (waiting for admission, or for their kernel's restore): k(m), the fewest of them
whose memory, taken off, makes the rest fit. Taking the largest first gives the fewest (any k
users free at most what the k largest free). Where the runs alone exceed the GPUs, every
present holder is without room and some run does not fit (`runs_over_gpu_minutes`: a culler
with 0 false culls cannot seat them all; those minutes are not people at the keyboard, so they
are counted apart, not in k).

Every assumption makes the figure smaller than what a real culler could reach, so it is a floor:
- whatever is not a run or a present user's kernel (idle kernels of absent users, hibernated
  ones) is off the GPU at no cost, swapped out and back instantly: a real swap takes time and
  host memory, and a resume waits for room (`memory_waits`);
- the GPUs are one pool of `gpus * gpu_mib` MiB, perfectly packed: no per-GPU fragmentation (a
  kernel lives on one GPU), no slot limit (slots per GPU times over-commit), no margin before a
  restore, no host memory budget; each of these can only add waiting;
- a kernel holds its user's `memory_mib`, at most its slice's share of the GPU (HAMi-core's
  limit on the reserving pool; the time-sliced pool's kernels hold all of `memory_mib`): the
  smaller of the two families' figures, so it bounds both; no growth (30 % of researchers' and
  breaks users' kernels grow to 1.5 x), no second notebook's kernel, no memory held after a run
  until the next GPU cell: each leaves out memory that is really held;
- each minute stands alone: the k(m) users who wait at m may be any users, as if one who waited
  could be seated again the next minute at no cost, and a user who has not used the GPU yet in
  their stretch never waits (in the replay a user without a server waits from their first
  minute at the keyboard: `wait_minutes` counts those).

`forced_wait_person_minutes` (the sum of k(m)) compares with the replay's `wait_minutes` (the
person-minutes its users waited for a server) on the same cluster; `forced_wait_minutes` is
the minutes with k(m) >= 1, `most_forced_at_once` the largest k(m).

It holds for a culler that runs every silent run of the trace (the issue's "0 stalled background
runs" besides 0 false culls). A replay whose users wait for a server when they would launch a
run never starts that run (`stalled_runs`), and the hours of GPU it would have held seat others:
such a row can wait less than this floor. `forced_wait_person_minutes_without_runs` is the floor
where every run is given up (only present users' kernels on the GPUs): no culler that keeps
admission by presence goes below it, whatever it stalls. A pool without that admission (time-
slicing without over-commit) seats users whose cells then meet CUDA out of memory instead of
waiting: its `wait_minutes` may be below both.
"""

from __future__ import annotations

from collections.abc import Sequence

from benchmarks.culler_trace import GPU_MEMORY_MIB, HORIZON, User


def kernel_mib(u: User, gpu_mib: int) -> float:
    """What `u`'s kernel holds on the GPU once it uses it: its `memory_mib`, at most its
    slice's share of the GPU (HAMi-core's limit; the smaller figure of the two families)."""
    return min(float(u.memory_mib), u.gpu_equivalent * gpu_mib)


def forced_out(runs_mib: float, holders_mib: Sequence[float], capacity_mib: float) -> int:
    """The fewest present holders without room so that the runs and the others fit in
    `capacity_mib`: the largest first (any k of them free at most what the k largest free);
    all of them where the runs alone do not fit."""
    total = runs_mib + sum(holders_mib)
    k = 0
    for mib in sorted(holders_mib, reverse=True):
        if total <= capacity_mib:
            break
        total -= mib
        k += 1
    return k


def floor(
    users: Sequence[User], gpus: int, gpu_mib: int = GPU_MEMORY_MIB, minutes: int = HORIZON
) -> dict:
    """The floor of the trace's first `minutes` on `gpus` GPUs of `gpu_mib` each (the module's
    docstring says why each assumption keeps it a lower bound)."""
    if gpus < 1:
        raise ValueError(f"gpus must be at least 1, not {gpus}")
    if gpu_mib <= 0:
        raise ValueError(f"gpu_mib must be positive, not {gpu_mib}")
    if not 0 <= minutes <= HORIZON:
        raise ValueError(f"minutes must be from 0 to {HORIZON}, not {minutes}")
    capacity = float(gpus * gpu_mib)
    holds = {u.name: False for u in users}  # a GPU cell in the current present stretch
    runs_over = person_minutes = wait_minutes = most = without_runs = 0
    for m in range(minutes):
        runs_mib, holders, everyone = 0.0, [], []
        for u in users:
            if not u.present[m]:
                holds[u.name] = False
            elif u.gpu_cell[m]:
                holds[u.name] = True
            mib = kernel_mib(u, gpu_mib)
            if u.present[m] and holds[u.name]:
                everyone.append(mib)
            if u.run[m]:  # it works: it stays, whether its user is there or not
                runs_mib += mib
            elif u.present[m] and holds[u.name]:
                holders.append(mib)
        runs_over += runs_mib > capacity
        k = forced_out(runs_mib, holders, capacity)
        person_minutes += k
        wait_minutes += k > 0
        most = max(most, k)
        without_runs += forced_out(0.0, everyone, capacity)
    return {
        "gpus": gpus,
        "minutes": minutes,
        "runs_over_gpu_minutes": runs_over,
        "forced_wait_person_minutes": person_minutes,
        "forced_wait_minutes": wait_minutes,
        "most_forced_at_once": most,
        "forced_wait_person_minutes_without_runs": without_runs,
    }
