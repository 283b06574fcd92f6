"""A resume that waits behind present users says so (issue 36, item 5: "a new server (or a
resume) that would exceed the physical memory held by present users' kernels waits ... with a
reason"). The culler's answer to a waiting resume names who holds the GPU and the place in
line, as the hub's pending page does for a new server (hub/room.py), and the cell says it: not
that another notebook's idle kernel is being swapped out, which present users' kernels never
are (culler/pressure.py)."""

from __future__ import annotations

from types import SimpleNamespace

from fracspawner.culler.swapdesk import SwapDesk
from fracspawner.serverext.hibernate import GPU_FULL
from tests.test_overcommit_pressure import QUARTER, SIZE, kernel, report, seat


def waiting(kid: str, since: str) -> dict:
    return report([], waiting=[{"kernel_id": kid, "gpu_memory_mib": QUARTER, "since": since}],
                  used=SIZE)  # fmt: skip


def lab(present: bool) -> list:
    """Four users' quarters fill the GPU (present or not); u5 and then u6 wait to resume."""
    seats = [seat(f"u{i}", report([kernel(f"k{i}", QUARTER, f"2026-01-01T1{i}:00:00Z")],
                                  used=SIZE), present=present)
             for i in range(1, 5)]  # fmt: skip
    return seats + [
        seat("u5", waiting("k5", "2026-01-01T12:00:00Z"), present=True),
        seat("u6", waiting("k6", "2026-01-01T12:00:01Z"), present=True),
    ]


def reasons(seats: list) -> dict[str, str]:
    desk = SwapDesk(report_in=10)
    out = {}
    for user, kid in (("u5", "k5"), ("u6", "k6")):
        (wait,) = desk.answer(user, "", seats, now=100.0)["swap"]["wait"]
        assert wait["kernel_id"] == kid
        out[user] = wait["reason"]
    return out


def test_a_resume_behind_present_users_is_told_who_holds_the_gpu_and_its_place():
    assert reasons(lab(present=True)) == {
        "u5": "the GPU is in use by 4 people now; you are next",
        "u6": "the GPU is in use by 4 people now; 1 person is ahead of you",
    }
    # absent users' idle kernels are swapped out for it: the GPU is full meanwhile
    assert reasons(lab(present=False)) == {
        "u5": "the GPU is full",
        "u6": "the GPU is full; 1 person is ahead of you",
    }


def test_the_cell_says_the_culler_s_reason():
    from fracspawner.serverext.swap import SwapAgent

    told: list[tuple[str, str]] = []
    hib = SimpleNamespace(
        swap_managed=False, room=None, on_waiting=[],
        tell_waiting=lambda kid, text=GPU_FULL: told.append((kid, text)),
    )  # fmt: skip
    monitor = SimpleNamespace(hibernator=hib, _kernel_ids=lambda: {"k5", "k6"})
    agent = SwapAgent(monitor, lambda _s: None)
    agent.on_answer({"swap": {"wait": [
        {"kernel_id": "k5", "reason": "the GPU is in use by 4 people now; you are next"},
        {"kernel_id": "k6", "reason": "the GPU is full"},
        {"kernel_id": "k7", "reason": "not this server's"},
    ]}})  # fmt: skip
    (k5, text), (k6, full) = told
    assert (k5, k6, full) == ("k5", "k6", GPU_FULL)
    assert text.startswith("fracspawner: the GPU is in use by 4 people now; you are next.")
    assert "swapped out" not in text and "never restored into a full GPU" in text
