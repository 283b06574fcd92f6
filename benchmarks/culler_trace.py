"""Workload mixes for the culler benchmark: when each user is at the keyboard, when their cells
run, when the GPU works. Minute resolution, from a fixed seed: every run sees the same days.

Each user owns one GPU server (a quarter of an H100 through HAMi). The horizon runs from 06:00
on day one to 18:00 on day two, so overnight runs and next-morning returns are in it.

- classroom: 30 students, two 90-minute labs a day with short GPU cells; they leave when the
  lab ends (the tab closed, the server left running); 40 % do homework in the evening.
- research: 12 researchers work in sessions with GPU cells, and most end a session by
  launching a silent training run (2-12 h: the cell executes, prints nothing, the GPU works);
  they come back hours later or the next morning.
- breaks: 20 users work all day and step away 2-4 times for 30-90 minutes (lunch, meetings,
  a seminar), leaving their kernels holding GPU memory; they come back to the same notebook.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

MIN = 60
START_HOUR = 6
HORIZON = 36 * 60  # minutes: 06:00 day one to 18:00 day two


def at(hour: float, day: int = 0) -> int:
    """Minutes since the start for a wall-clock hour (9.5 = 09:30) on day 0 or 1."""
    return int(round((day * 24 + hour - START_HOUR) * 60))


@dataclass
class User:
    name: str
    memory_mib: int  # what the user's kernel allocates on the GPU once it uses it
    slice: str = "1/4"
    gpu_equivalent: float = 0.25
    present: list[bool] = field(default_factory=lambda: [False] * HORIZON)  # at the keyboard
    cell: list[bool] = field(default_factory=lambda: [False] * HORIZON)  # a cell runs (messages)
    gpu_cell: list[bool] = field(default_factory=lambda: [False] * HORIZON)  # ... on the GPU
    run: list[bool] = field(default_factory=lambda: [False] * HORIZON)  # silent training run

    def work(self, rng: random.Random, start: int, end: int, cells: float, gpu: float) -> None:
        """At the keyboard from start to end, running a cell some minutes, some on the GPU."""
        m = max(0, start)
        while m < min(end, HORIZON):
            self.present[m] = True
            if rng.random() < cells:
                length = rng.randint(1, 3) if rng.random() < gpu else 1
                for k in range(m, min(m + length, end, HORIZON)):
                    self.present[k] = True
                    self.cell[k] = True
                    self.gpu_cell[k] = length > 1 or self.gpu_cell[k]
                m += length
            else:
                m += 1

    def train(self, start: int, hours: float) -> None:
        for m in range(max(0, start), min(start + int(hours * 60), HORIZON)):
            self.run[m] = True


def classroom(rng: random.Random, n: int = 30) -> list[User]:
    users = []
    for i in range(n):
        u = User(f"cls-{i:02d}", rng.choice([4096, 8192, 10240]))
        for day in (0, 1):
            for lab in (9.0, 14.0):
                arrive = at(lab, day) + rng.randint(0, 10)
                u.work(rng, arrive, at(lab + 1.5, day) + rng.randint(-5, 5), 0.35, 0.35)
        if rng.random() < 0.4:
            evening = at(19.0) + rng.randint(0, 60)
            u.work(rng, evening, evening + rng.randint(30, 75), 0.3, 0.3)
        users.append(u)
    return users


def research(rng: random.Random, n: int = 12) -> list[User]:
    users = []
    for i in range(n):
        u = User(f"res-{i:02d}", rng.choice([10240, 16384, 20480]))
        t = at(8.5) + rng.randint(0, 90)
        for day in (0, 1):
            if day:
                t = max(t, at(8.5, 1) + rng.randint(0, 90))
            while t < at(18.0, day):
                end = t + rng.randint(60, 180)
                u.work(rng, t, end, 0.3, 0.4)
                if rng.random() < 0.7:  # launch a silent run and leave it
                    hours = rng.uniform(2, 12)
                    u.train(end, hours)
                    u.present[min(end, HORIZON - 1)] = True  # launched at the keyboard
                    t = end + int(hours * 60) + rng.randint(-30, 240)
                else:
                    t = end + rng.randint(45, 150)
        users.append(u)
    return users


def breaks(rng: random.Random, n: int = 20) -> list[User]:
    users = []
    for i in range(n):
        u = User(f"brk-{i:02d}", rng.choice([8192, 10240, 16384]))
        for day in (0, 1):
            t, end_of_day = at(8.5, day) + rng.randint(0, 45), at(17.5, day)
            pauses = sorted(rng.sample(range(t + 45, end_of_day - 60), rng.randint(2, 4)))
            for pause in pauses:
                if pause <= t:
                    continue
                u.work(rng, t, pause, 0.3, 0.3)
                t = pause + rng.randint(30, 90)  # away, the kernel keeps its memory
            u.work(rng, t, end_of_day, 0.3, 0.3)
        users.append(u)
    return users


MIXES = {"classroom": classroom, "research": research, "breaks": breaks}


def make_mix(name: str, seed: int = 7) -> list[User]:
    return MIXES[name](random.Random(f"{name}-{seed}"))
