"""The websocket benchmark's own checks (benchmarks/bench_kernel_ws.py): both arms are what
they claim (the extension loaded in one only) and every line of the cell arrives in each."""

from __future__ import annotations

from benchmarks.bench_kernel_ws import hook_cost, measure


async def test_both_arms_run_the_cell_through_a_real_server():
    result = await measure(lines=300, rounds=1)
    for arm in ("baseline", "fracspawner"):
        rounds = result["rounds"][arm]
        assert len(rounds) == 2  # each arm twice a round: A B B A
        # every line is a stream message of its own, plus the status and input messages
        assert all(r["iopub_messages"] >= 300 for r in rounds), rounds


def test_the_hook_alone_is_timed_on_both_kinds_of_message():
    figures = hook_cost(n=2000)
    assert set(figures) == {"hook_us_per_stream_message", "hook_us_per_gpu_oom_error_message"}
    assert all(v > 0 for v in figures.values())
