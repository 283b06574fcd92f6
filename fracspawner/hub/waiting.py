"""How many spawns of the hub may wait in line at once (admission "wait").

JupyterHub counts a spawn as pending from its request until its server answers, and once
`JupyterHub.concurrent_spawn_limit` spawns are pending it refuses every new one, of any user,
for any pool, CPU-only too: "Too many users trying to log in right now" (429,
jupyterhub/handlers/base.py `spawn_single_user`; z2jh sets the limit from
hub.concurrentSpawnLimit, 64; JupyterHub's own default is 100). A spawn waiting in FracSpawner's
line, for a slot or for room, is pending all the while, up to `queue_timeout` (30 min). So a
lecture's worth of students waiting for a full GPU pool would shut everyone else out of the
hub, including people asking for a pool with free slots or for no GPU at all.

The line is therefore bounded (`FracSpawner.max_waiting`): by default half the hub's
concurrent_spawn_limit, so the other half stays for spawns that start now. A spawn that would
wait beyond it is refused at once, with what is free now, as under admission "refuse".
Places are taken synchronously (under the admission lock, or with no await between the count
and the taking), so a class arriving together cannot pass the bound all at once. A spawn
admitted on counts that could not tell (a stale watch, none) takes its place once the scheduler
finds no node for its pod, or is refused then.
"""

from __future__ import annotations

from typing import ClassVar

from ..choice.admission import loop_shared

Key = tuple[str, str]  # (user, server name)


def waiting_limit(configured: int | None, concurrent_spawn_limit: int) -> int | None:
    """The most spawns that may wait in line; None: no bound (the hub has no spawn limit)."""
    if configured is not None:
        return configured
    if concurrent_spawn_limit <= 0:
        return None
    return max(1, concurrent_spawn_limit // 2)


class WaitingSpawns:
    """The spawns of this hub that wait in line, or were admitted to wait, per event loop."""

    _shared: ClassVar[dict[object, WaitingSpawns]] = {}

    def __init__(self) -> None:
        self.keys: set[Key] = set()

    @classmethod
    def shared(cls) -> WaitingSpawns:
        return loop_shared(cls._shared, cls)

    def take(self, key: Key, limit: int | None) -> bool:
        """A place in line for `key` (kept if it has one), unless `limit` are taken."""
        if key in self.keys:
            return True
        if limit is not None and len(self.keys) >= limit:
            return False
        self.keys.add(key)
        return True

    def leave(self, key: Key) -> None:
        self.keys.discard(key)

    def __len__(self) -> int:
        return len(self.keys)


def line_full_words(count: int) -> str:
    return (
        f"{count} server{'s' if count != 1 else ''} already wait{'' if count != 1 else 's'} "
        "in line on this hub, the most it keeps waiting at once, so that others can still "
        "start"
    )


__all__ = ["WaitingSpawns", "line_full_words", "waiting_limit"]
