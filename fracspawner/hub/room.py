"""Admission knows who is present (issue 36, item 5): on an over-committed pool a new server
waits in line while present users' kernels hold the GPU's physical memory.

The slot counts let `overcommit` times as many slices onto a GPU as its memory holds; that is
safe while the culler can swap idle kernels out, not where everyone is present (bug 4: "8
present users on one over-committed GPU: 28 CUDA out-of-memory errors in the cells of users 5-8
over 40 min, and no word about why"). So before a new server's pod is made, the hub asks the
culler's room view (`GET {culler}/api/room`, culler/room.py): per GPU, what present users'
kernels physically hold (their whole slice before their first allocation), busy kernels and
unknown servers hold. The spawn goes on when a GPU
of its pool has room for its slice beside that and beside the servers this hub admitted that the
culler does not count yet, after the spawns ahead of it in line that fit take theirs; otherwise
it waits in line and the pending page says why ("The GPU is in use by 4 people now; you are
next."). The line is first come, first served with backfill, as Kueue's `BestEffortFIFO`
queueing strategy admits workloads: a spawn ahead that does not fit now does not hold up a
smaller one behind it that does (replayed, a half-GPU slice at the head kept five 1/8 slices
waiting 64-98 min beside 17-20 GiB of room: benchmarks/bench_culler.py), until it has waited
`OVERTAKE_SECONDS`; from then on nobody overtakes it, so a large slice is not passed over for
ever by small ones.

When the culler cannot answer (none configured, unreachable, not listed the hub's servers yet,
a bad answer), the spawn is admitted as before this check, and the log says so: the slot counts
still bound the GPU and the culler's swap still makes room for idle kernels, while holding every
spawn of the pool for as long as the culler is down would turn its outage into the hub's. The
unknowns *within* an answer are never room (a stale or silent server counts its slice).

Pure apart from `fetch_room` (one HTTP GET) and `RoomLine`'s process-wide state.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from tornado.httpclient import AsyncHTTPClient, HTTPRequest

from ..choice.admission import loop_shared, server_tag

log = logging.getLogger("JupyterHub")

#: how long one answer of the culler serves every waiting spawn (s)
CACHE_SECONDS = 5.0
#: how long the hub waits for the culler's answer (s)
TIMEOUT_SECONDS = 5.0
#: how often a waiting spawn looks again (s)
POLL_SECONDS = 2.0
#: how long a spawn in line that does not fit may be overtaken by later, smaller ones that do
#: (s); past it the line keeps its order behind it (a large slice is not starved)
OVERTAKE_SECONDS = 600.0
#: how long (s) a server the hub admitted may go unfound in answers that list servers, none
#: found since, before the hub says its tag key is likely not the culler's: the culler counts
#: a new server within its pod watch or its next list of the hub (cull_every, 300 s default)
UNFOUND_SECONDS = 900.0
_EPSILON = 1e-6


@dataclass(frozen=True)
class InLine:
    """A spawn waiting ahead in the line: the memory of its slice and how long it has waited."""

    need_mib: float
    waited_s: float


@dataclass(frozen=True)
class Verdict:
    """Whether a spawn may make its pod now; `reason`: the user's words while it waits;
    `known`: False where the culler gave no usable answer (admitted as before the check)."""

    go: bool
    reason: str = ""
    known: bool = True


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _rooms(answer: Mapping[str, Any], pool: str) -> list[tuple[float, int, frozenset[str]]]:
    """(free MiB, people present, server tags) of each GPU of `pool` in the culler's answer."""
    out = []
    for gpu in answer.get("gpus") or []:
        if not isinstance(gpu, Mapping) or gpu.get("pool") != pool:
            continue
        free, present = _number(gpu.get("free_mib")), _number(gpu.get("present"))
        if free is None:
            continue
        tags = frozenset(str(t) for t in gpu.get("servers") or [] if isinstance(t, str))
        out.append((max(free, 0.0), int(present or 0), tags))
    return out


def counted_tags(answer: Mapping[str, Any] | None) -> frozenset[str]:
    """The servers the culler's answer counts on some GPU (by `server_tag`)."""
    if not isinstance(answer, Mapping):
        return frozenset()
    return frozenset(
        str(t)
        for gpu in answer.get("gpus") or []
        if isinstance(gpu, Mapping)
        for t in gpu.get("servers") or []
        if isinstance(t, str)
    )


def _people(n: int) -> str:
    return "1 person" if n == 1 else f"{n} people"


def verdict(
    answer: Mapping[str, Any] | None,
    pool: str,
    need_mib: float,
    *,
    size_mib: float,
    gpus_in_pool: int | None,
    in_flight_mib: float = 0.0,
    ahead: Sequence[InLine] = (),
    overtake_s: float = OVERTAKE_SECONDS,
) -> Verdict:
    """May a new server of `need_mib` on `pool` (GPUs of `size_mib`) make its pod now?

    `gpus_in_pool`: the pool's physical GPUs by the hub's capacity counts (None: not known;
    then the GPUs the culler sees are the pool's, or one where it sees none); a GPU the culler
    sees no server on is free. `in_flight_mib`: servers this hub admitted on the pool that the
    answer does not count yet (on which GPU is not known: taken off the pool's total).
    `ahead`: spawns in line before this one, in order. Each that fits now takes its slice
    first (off the pool's total and the roomiest GPU: the most it can take from this one);
    one that does not fit is overtaken, unless it has waited `overtake_s` (then this one
    waits behind it). It goes when the pool's room less what is in flight and what those
    ahead take holds its slice and one GPU has room for it."""
    if not isinstance(answer, Mapping) or not answer.get("listed"):
        return Verdict(True, known=False)
    rooms = _rooms(answer, pool)
    unseen = (gpus_in_pool - len(rooms)) if gpus_in_pool is not None else (0 if rooms else 1)
    frees = [free for free, _, _ in rooms] + [max(size_mib, 0.0)] * max(unseen, 0)
    if not frees:
        return Verdict(True)  # no GPU at all: the slot counts keep the pod in line
    total = sum(frees) - max(in_flight_mib, 0.0)

    def fits(mib: float) -> bool:
        return total >= mib - _EPSILON and max(frees) >= mib - _EPSILON

    held_up = False
    for other in ahead:
        if fits(other.need_mib):
            total -= other.need_mib
            roomiest = max(range(len(frees)), key=frees.__getitem__)
            frees[roomiest] -= other.need_mib
        elif other.waited_s >= overtake_s:
            held_up = True
            break
    if not held_up and fits(need_mib):
        return Verdict(True)
    present = sum(people for _, people, _ in rooms)
    where = "The GPU" if len(frees) == 1 else f"The pool's {len(frees)} GPUs"
    if present:
        words = f"{where} {'is' if len(frees) == 1 else 'are'} in use by {_people(present)} now"
    else:
        words = f"{where}' memory is held by notebooks that are running now"
        if len(frees) == 1:
            words = "The GPU's memory is held by notebooks that are running now"
    if ahead:
        n = len(ahead)
        words += f"; {_people(n)} {'is' if n == 1 else 'are'} ahead of you"
    else:
        words += "; you are next"
    return Verdict(False, words)


def gpus_in_pool(total_slots: int | None, slice_mib: float, size_mib: float, overcommit: float):
    """Physical GPUs of a pool from its slot count for one offer: slots x slice / (GPU size x
    over-commit). None when any is unknown."""
    if total_slots is None or slice_mib <= 0 or size_mib <= 0 or overcommit <= 0:
        return None
    return max(0, round(total_slots * slice_mib / (size_mib * overcommit)))


async def fetch_room(url: str, token: str, timeout: float = TIMEOUT_SECONDS) -> dict | None:
    """The culler's room answer, or None when it gives none (any failure: see the module)."""
    try:
        response = await AsyncHTTPClient().fetch(
            HTTPRequest(
                url,
                headers={"Authorization": f"token {token}"},
                request_timeout=timeout,
                connect_timeout=timeout,
            )
        )
        body = json.loads(response.body)
    except Exception as exc:  # the spawner says what it does without an answer; this, why
        log.warning("the culler gave no room answer at %s: %s", url, _why(exc))
        return None
    return body if isinstance(body, dict) else None


def _why(exc: Exception) -> str:
    """An HTTP error with the culler's own message (its JSON `message`), else the error."""
    body = getattr(getattr(exc, "response", None), "body", None)
    if body:
        try:
            return f"{exc} ({json.loads(body).get('message')})"
        except (ValueError, AttributeError):
            pass
    return str(exc) or type(exc).__name__


Key = tuple[str, str]  # (user, server name)


class RoomLine:
    """The hub's line for room on over-committed pools: who waits, in order, per pool; whom it
    admitted that the culler does not count yet; the culler's latest answer (cached)."""

    _shared: ClassVar[dict[Any, RoomLine]] = {}

    def __init__(self) -> None:
        # per pool, who waits in the order they came: key -> (MiB of its slice, joined at)
        self.waiting: dict[str, dict[Key, tuple[float, float]]] = {}
        self.admitted: dict[Key, tuple[str, str, float]] = {}  # key -> (pool, tag, MiB)
        self._answer: tuple[float, dict | None] | None = None
        # for `unfound`: when each was admitted, when an answer last counted one of them
        self._admitted_at: dict[Key, float] = {}
        self._found_at: float | None = None
        self._said_unfound = False

    @classmethod
    def shared(cls) -> RoomLine:
        """The one line of the running event loop (as choice.admission.Admissions)."""
        return loop_shared(cls._shared, cls)

    async def answer(self, fetch: Any, now: float) -> dict | None:
        """The culler's answer, asked at most once per CACHE_SECONDS for every spawn. Only an
        answer that counts (`listed`) is shared: none, or one from before the culler listed the
        hub, is asked again by the next spawn (shared, it admitted spawns right after the
        culler's first list by slot counts alone)."""
        if self._answer is None or now - self._answer[0] > CACHE_SECONDS:
            got = await fetch()
            counts = isinstance(got, Mapping) and bool(got.get("listed"))
            self._answer = (now, got) if counts else None
            return got
        return self._answer[1]

    def join(self, pool: str, key: Key, need_mib: float, now: float) -> None:
        """`key` asks room for `need_mib` at `now` (its place is kept while it stays)."""
        self.waiting.setdefault(pool, {}).setdefault(key, (need_mib, now))

    def leave(self, pool: str, key: Key) -> None:
        self.waiting.get(pool, {}).pop(key, None)

    def ahead(self, pool: str, key: Key, now: float) -> list[InLine]:
        """The spawns in line before `key` on `pool`, in order (all of them if it is not in)."""
        out = []
        for other, (need, since) in self.waiting.get(pool, {}).items():
            if other == key:
                break
            out.append(InLine(need, now - since))
        return out

    def admit(self, key: Key, pool: str, tag: str, mib: float, at: float | None = None) -> None:
        self.admitted[key] = (pool, tag, mib)
        if at is not None:
            self._admitted_at[key] = at

    def release(self, key: Key) -> None:
        self.admitted.pop(key, None)
        self._admitted_at.pop(key, None)

    def in_flight_mib(
        self, pool: str, counted: Iterable[str], besides: Key, now: float | None = None
    ) -> float:
        """What this hub admitted on `pool` that the culler's answer does not count yet; those
        it counts now are forgotten (the culler's figures hold them). One the answer never
        names (a tag key other than the culler's) stays counted until its server stops: the
        pool shows less room, never more."""
        counted = set(counted)
        total = 0.0
        for key, (where, tag, mib) in list(self.admitted.items()):
            if tag in counted:  # the answer's tags are its reader's: no timing to hide
                del self.admitted[key]
                self._admitted_at.pop(key, None)
                self._found_at = now if now is not None else self._found_at
            elif where == pool and key != besides:
                total += mib
        return total

    def unfound(self, counted: Iterable[str], now: float) -> int:
        """Once per line: how many servers this hub admitted have gone unfound for
        UNFOUND_SECONDS in answers that list servers, with none found since they were
        admitted; the hub's tag key is then likely not the culler's (each counts twice, so
        spawns wait for room that is there). 0 otherwise, and after it was said."""
        if self._said_unfound or not set(counted):
            return 0
        old = [
            at
            for at in self._admitted_at.values()
            if now - at >= UNFOUND_SECONDS and (self._found_at is None or self._found_at < at)
        ]
        if old:
            self._said_unfound = True
        return len(old)


__all__ = [
    "OVERTAKE_SECONDS",
    "UNFOUND_SECONDS",
    "InLine",
    "Verdict",
    "RoomLine",
    "counted_tags",
    "fetch_room",
    "gpus_in_pool",
    "server_tag",
    "verdict",
]
