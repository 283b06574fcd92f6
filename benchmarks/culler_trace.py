"""A synthetic day of notebook activity on a small GPU pool, and a minute-by-minute replay of it
under three cullers. The trace is generated from a fixed seed, so every run sees the same day.

Each notebook's user works in sessions (a message every few minutes, short GPU bursts while
cells run); after some sessions they start a training run: the GPU is busy for hours with no
kernel message at all. The model stays in GPU memory until the kernel or server ends.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

MIN = 60
DAY = 24 * 60  # minutes


@dataclass
class Notebook:
    user: str
    memory_mib: int
    message: list[bool] = field(default_factory=lambda: [False] * DAY)  # a kernel message
    gpu_busy: list[bool] = field(default_factory=lambda: [False] * DAY)
    gpu_start: list[bool] = field(default_factory=lambda: [False] * DAY)  # first GPU use
    session: list[bool] = field(default_factory=lambda: [False] * DAY)  # the user is there


def make_trace(n: int = 24, seed: int = 7) -> list[Notebook]:
    rng = random.Random(seed)
    notebooks = []
    for i in range(n):
        nb = Notebook(f"user{i:02d}", rng.choice([10240, 20480, 40960]))
        t = rng.randint(7 * 60, 11 * 60)
        for _ in range(rng.randint(1, 3)):
            length = rng.randint(30, 120)
            end = min(t + length, DAY - 1)
            for m in range(t, end):
                nb.session[m] = True
                if rng.random() < 0.35:
                    nb.message[m] = True
                if rng.random() < 0.15:  # a cell running on the GPU
                    nb.gpu_busy[m] = True
            nb.gpu_start[t + 5 if t + 5 < DAY else t] = True
            if rng.random() < 0.5:  # a silent training run after the session
                run = rng.randint(60, 240)
                for m in range(end, min(end + run, DAY)):
                    nb.gpu_busy[m] = True
            t = end + rng.randint(60, 180)
            if t >= 20 * 60:
                break
        notebooks.append(nb)
    return notebooks
