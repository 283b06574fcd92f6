"""Workload mixes for the culler benchmark: when each person is at the keyboard, when they touch
it, when their JupyterLab tab is open, when their cells run, when the GPU works. Minute
resolution, from a fixed seed: every run sees the same days.

Presence is modelled from the person, as the product reads it (fracspawner/serverext/presence.py):
`present` is the ground truth (the person is there), `input` the minutes they press a key, click
or scroll, `tab_open` the minutes their JupyterLab tab is open and visible. An open tab polls the
REST API every 10 s whether anyone looks at it or not (JupyterLab's kernel, session and terminal
managers, `interval: 10 * 1000`, `standby: 'when-hidden'`), so `tab_open` is also when the
server sees API requests. Three ways to be present or away that the old "every present minute
is API activity" shortcut could not tell apart:
- work: at the keyboard, input most minutes, cells now and then;
- a lecture: present with the tab visible, a click every 5-20 min, the kernel holding the model
  loaded at the start (a person who must not lose it);
- leaving: the tab is closed or hidden (laptop shut, another window), or left open and visible
  on the desk until its person comes back (an abandoned tab: polling, nobody there).

Users as they behave (issue 36, item 6): a quarter of the students hide their notebook tab
behind the lecture's slides a few minutes in (`tab_hidden`: the meter still reports, hidden,
the polling stands by, no input reaches it); a quarter of research sessions hold a silence of
45-75 min at the keyboard, tab visible, no input and no cells; 30 % of researchers' and breaks
users' kernels grow as they work (1 % of their size a working minute, to 1.5 x); users ask
slices from 1/8 to a whole H100 (`SLICE_MIX`, per mix: students small, researchers up to whole
GPUs), their kernels' memory in proportion to their slice (the quarter's draw times slice / 1/4,
at most 95 % of the GPU); some open a second notebook (`SECOND_NOTEBOOK`, per mix) and work in
it a while now and then (`second`: the minutes their cells run there, its kernel holding half
their main kernel's memory once it uses the GPU, and left open afterwards). Each draw of these
has its own random stream, so the days (who is there when, cells, runs) are the same as
without them.

Each user owns one GPU server (an H100 slice). The horizon runs from 06:00 on day one to
18:00 on day two, so overnight runs and next-morning returns are in it.

- classroom: 30 students in two sections of 15 sharing the lab's cluster in turns (A at 09:00
  and 14:00, B at 10:45 and 15:45, 90 min each); each lab opens with a 30-45 min lecture part,
  then hands-on work with short GPU cells; 40 % do homework in the evening. 30 % of students
  leave their lab tab open (lab PCs, laptops left open).
- research: 12 researchers work in sessions with GPU cells, and most end a session by launching
  a silent training run (2-12 h: the cell executes, prints nothing, the GPU works); they come
  back hours later or the next morning. 40 % of sessions end with the tab left open (an office
  desktop).
- breaks: 20 users work all day and step away 2-4 times for 30-90 minutes (lunch, meetings, a
  seminar), leaving their kernels holding GPU memory; 60 % of breaks leave the tab open on the
  desk; they come back to the same notebook.
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


# the slices users ask, with their weights, per mix (HAMi's `h100` offers 1/8, 1/4, 1/2, 1)
SLICES = {"1/8": 0.125, "1/4": 0.25, "1/2": 0.5, "1": 1.0}
SLICE_MIX = {
    "classroom": {"1/8": 0.3, "1/4": 0.6, "1/2": 0.1},
    "research": {"1/8": 0.1, "1/4": 0.5, "1/2": 0.3, "1": 0.1},
    "breaks": {"1/8": 0.25, "1/4": 0.5, "1/2": 0.2, "1": 0.05},
}
GPU_MEMORY_MIB = 81559  # an H100 80GB HBM3 as NVML reports it
# the share of users who open a second notebook, per mix; what its kernel holds on the GPU, as a
# share of their main kernel's
SECOND_NOTEBOOK = {"classroom": 0.15, "research": 0.4, "breaks": 0.3}
SECOND_SHARE = 0.5


def open_second(u: User, share: float) -> None:
    """With chance `share`, `u` opens a second notebook: from time to time (at 5 % of their
    cell minutes) their cells go there for 10-40 minutes (its own random stream)."""
    rng = random.Random(f"{u.name}-second")
    if rng.random() >= share:
        return
    m = 0
    while m < HORIZON:
        if u.cell[m] and rng.random() < 0.05:
            for k in range(m, min(m + rng.randint(10, 40), HORIZON)):
                u.second[k] = True
            m += 40
        m += 1


def ask_slice(u: User, mix: str) -> None:
    """The slice `u` asks for (its own random stream: the mix's days stay as they were) and
    the memory its kernel needs, in proportion to it (at most 95 % of the GPU)."""
    weights = SLICE_MIX[mix]
    piece = random.Random(f"{u.name}-slice").choices(list(weights), list(weights.values()))[0]
    u.slice, u.gpu_equivalent = piece, SLICES[piece]
    scaled = u.memory_mib * u.gpu_equivalent / 0.25
    u.memory_mib = int(min(scaled, 0.95 * GPU_MEMORY_MIB))


def _flags() -> list[bool]:
    return [False] * HORIZON


@dataclass
class User:
    name: str
    memory_mib: int  # what the user's kernel allocates on the GPU once it uses it
    slice: str = "1/4"
    gpu_equivalent: float = 0.25
    leaves_tab_open: float = 0.0  # chance that leaving leaves the tab open and visible
    hides_tab: float = 0.0  # chance that a lecture's notebook tab is hidden behind the slides
    grows: bool = False  # the kernel's memory grows while it works (caches, bigger batches)
    # its silent runs work in a child process of the kernel (`subprocess.Popen`, `!python
    # train.py &`): the kernel is idle while the run holds the GPU
    child_runs: bool = False
    present: list[bool] = field(default_factory=_flags)  # the person is there
    input: list[bool] = field(default_factory=_flags)  # ... and touches keyboard or mouse
    tab_open: list[bool] = field(default_factory=_flags)  # a visible tab: polls the REST API
    # an open notebook tab that is hidden (another tab in front: the lecture's slides): its
    # meter still reports (hidden), its polling stands by, it sees no input
    tab_hidden: list[bool] = field(default_factory=_flags)
    cell: list[bool] = field(default_factory=_flags)  # a cell runs (messages)
    second: list[bool] = field(default_factory=_flags)  # ... in their second notebook
    gpu_cell: list[bool] = field(default_factory=_flags)  # ... on the GPU
    run: list[bool] = field(default_factory=_flags)  # silent training run
    abandoned: list[tuple[int, int]] = field(default_factory=list)  # (from, to) open tabs

    def _here(self, m: int, touched: bool) -> None:
        self.present[m] = self.tab_open[m] = True
        self.input[m] = self.input[m] or touched

    def work(self, rng: random.Random, start: int, end: int, cells: float, gpu: float) -> None:
        """At the keyboard from start to end, running a cell some minutes, some on the GPU;
        touching the keyboard or mouse in most minutes (reading a while without)."""
        m = max(0, start)
        while m < min(end, HORIZON):
            self._here(m, rng.random() < 0.8)
            if rng.random() < cells:
                length = rng.randint(1, 3) if rng.random() < gpu else 1
                for k in range(m, min(m + length, end, HORIZON)):
                    self._here(k, True)
                    self.cell[k] = True
                    self.gpu_cell[k] = length > 1 or self.gpu_cell[k]
                m += length
            else:
                m += 1

    def lecture(self, rng: random.Random, start: int, end: int) -> None:
        """Present with the tab visible for a lecture: one GPU cell at the start (a model
        loaded), then a click every 5-20 minutes."""
        start = max(0, start)
        for m in range(start, min(end, HORIZON)):
            self._here(m, False)
        for m in range(start, min(start + 2, end, HORIZON)):
            self.input[m] = self.cell[m] = self.gpu_cell[m] = True
        m = start + rng.randint(5, 20)
        while m < min(end, HORIZON):
            self.input[m] = True
            m += rng.randint(5, 20)
        if rng.random() < self.hides_tab:  # the slides in front from a few minutes in
            for k in range(min(start + rng.randint(3, 6), end), min(end, HORIZON)):
                self.tab_open[k] = self.input[k] = False
                self.tab_hidden[k] = True

    def silence(self, rng: random.Random, start: int, end: int) -> None:
        """At the keyboard with the tab visible and no input for 45-75 min (reading a paper,
        thinking, a call) somewhere in [start, end)."""
        length = rng.randint(45, 75)
        if end - start <= length + 10:
            return
        first = rng.randint(start + 5, end - length - 5)
        for k in range(first, min(first + length, HORIZON)):
            if self.present[k]:
                self.input[k] = self.cell[k] = self.gpu_cell[k] = False

    def leave(self, rng: random.Random, end: int) -> None:
        """The person leaves at `end`: the tab closes, or stays open until they are back."""
        if end >= HORIZON or rng.random() >= self.leaves_tab_open:
            return
        m = end
        while m < HORIZON and self.present[m]:  # the session's last minutes
            m += 1
        start = m
        while m < HORIZON and not self.present[m]:
            m += 1
        # an abandoned tab polls until its person is back (or the horizon ends)
        for k in range(start, m):
            self.tab_open[k] = True
        if m > start:
            self.abandoned.append((start, m))

    def train(self, start: int, hours: float) -> None:
        for m in range(max(0, start), min(start + int(hours * 60), HORIZON)):
            self.run[m] = True


def _sessions_left(u: User, rng: random.Random, ends: list[int]) -> None:
    """Tabs left open are decided once every session is known (they run to the next one)."""
    for end in sorted(ends):
        u.leave(rng, end)


def classroom(rng: random.Random, n: int = 30) -> list[User]:
    users = []
    for i in range(n):
        section_b = i >= n // 2
        u = User(
            f"cls-{i:02d}", rng.choice([4096, 8192, 10240]), leaves_tab_open=0.3, hides_tab=0.25
        )
        ends = []
        for day in (0, 1):
            for lab in (10.75, 15.75) if section_b else (9.0, 14.0):
                arrive = at(lab, day) + rng.randint(0, 10)
                talk = arrive + rng.randint(30, 45)
                end = at(lab + 1.5, day) + rng.randint(-5, 5)
                u.lecture(rng, arrive, talk)
                u.work(rng, talk, end, 0.35, 0.35)
                ends.append(end)
        if rng.random() < 0.4:
            evening = at(19.0) + rng.randint(0, 60)
            end = evening + rng.randint(30, 75)
            u.work(rng, evening, end, 0.3, 0.3)
            ends.append(end)
        _sessions_left(u, rng, ends)
        users.append(u)
    return users


def research(rng: random.Random, n: int = 12) -> list[User]:
    users = []
    for i in range(n):
        u = User(
            f"res-{i:02d}", rng.choice([10240, 16384, 20480]), leaves_tab_open=0.4,
            grows=rng.random() < 0.3,
        )  # fmt: skip
        # its own draw: the mix's other draws (and so the days) stay as they were
        u.child_runs = random.Random(f"{u.name}-child").random() < 0.3
        ends = []
        t = at(8.5) + rng.randint(0, 90)
        for day in (0, 1):
            if day:
                t = max(t, at(8.5, 1) + rng.randint(0, 90))
            while t < at(18.0, day):
                end = t + rng.randint(60, 180)
                u.work(rng, t, end, 0.3, 0.4)
                if rng.random() < 0.25:  # a long silence at the keyboard
                    u.silence(rng, t, end)
                ends.append(end)
                if rng.random() < 0.7:  # launch a silent run and leave it
                    hours = rng.uniform(2, 12)
                    u.train(end, hours)
                    if end < HORIZON:  # launched at the keyboard
                        u._here(end, True)
                    t = end + int(hours * 60) + rng.randint(-30, 240)
                else:
                    t = end + rng.randint(45, 150)
        _sessions_left(u, rng, ends)
        users.append(u)
    return users


def breaks(rng: random.Random, n: int = 20) -> list[User]:
    users = []
    for i in range(n):
        u = User(
            f"brk-{i:02d}", rng.choice([8192, 10240, 16384]), leaves_tab_open=0.6,
            grows=rng.random() < 0.3,
        )  # fmt: skip
        ends = []
        for day in (0, 1):
            t, end_of_day = at(8.5, day) + rng.randint(0, 45), at(17.5, day)
            pauses = sorted(rng.sample(range(t + 45, end_of_day - 60), rng.randint(2, 4)))
            for pause in pauses:
                if pause <= t:
                    continue
                u.work(rng, t, pause, 0.3, 0.3)
                ends.append(pause)
                t = pause + rng.randint(30, 90)  # away, the kernel keeps its memory
            u.work(rng, t, end_of_day, 0.3, 0.3)
            ends.append(end_of_day)
        _sessions_left(u, rng, ends)
        users.append(u)
    return users


MIXES = {"classroom": classroom, "research": research, "breaks": breaks}


@dataclass(frozen=True)
class Cluster:
    """The fixed cluster a mix's users share: whole H100s, on nodes. A GPU seats slices up to
    `slots_per_gpu` quarters (times over-commit): four 1/4, eight 1/8, one whole GPU."""

    gpus: int
    gpus_per_node: int = 2
    slots_per_gpu: int = 4  # in quarters: HAMi / DRA shares, or time-slicing replicas

    @property
    def slots(self) -> int:
        return self.gpus * self.slots_per_gpu

    def node_of(self, gpu: int) -> int:
        return gpu // self.gpus_per_node


# Fewer slots than accounts, the point of sharing. classroom: one section at a time (15
# students, 16 slots); research: 12 researchers on 2 GPUs (8 slots); breaks: 20 users on 4 GPUs
# (16 slots). At the busiest moments more people are at their keyboards than there are slots
# (research, breaks): some wait whatever the culler does; the culler decides how many more.
CLUSTERS = {"classroom": Cluster(4), "research": Cluster(2), "breaks": Cluster(4)}


SEED = 7  # the draw of the mixes the whole culler benchmark replays


def make_mix(name: str, seed: int = SEED) -> list[User]:
    users = MIXES[name](random.Random(f"{name}-{seed}"))
    for u in users:
        ask_slice(u, name)
        open_second(u, SECOND_NOTEBOOK[name])
    return users
