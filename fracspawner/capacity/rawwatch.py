"""One watch request fed into a cache: the loop both pod watches share (the capacity watch,
a kubespawner reflector, and the Kubeflow webhook's, which may not import kubespawner)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kubernetes_asyncio import watch

Feed = Callable[[dict[str, Any]], None]


class RawWatch(watch.Watch):
    """kubernetes_asyncio's Watch without building objects: events keep the raw dicts (its
    "object" return type still round-trips each event through json.dumps/json.loads)."""

    def get_return_type(self, func: object) -> str:
        return ""


class ShortWatch(Exception):
    """A watch the server ended within a second and without a single event."""


async def watch_once(
    call: Any,
    version: str,
    *,
    put: Feed,
    drop: Feed,
    delivered: Callable[[], None],
    until: Callable[[], bool] = lambda: False,
    **kwargs: Any,
) -> str:
    """Watch `call` from `version`, feeding ADDED/MODIFIED objects to `put` and DELETED ones
    to `drop` (`delivered()` on every event, bookmarks too), until the server ends the watch
    or `until()` holds after an event; returns the resourceVersion to resume from.

    A watch that ends within a second with no event raises ShortWatch: a server or proxy
    closing every watch at once would otherwise be re-watched in a tight loop. client-go's
    Reflector treats it as an error, so it backs off and relists (tools/cache/reflector.go,
    watchHandler: "very short watch")."""
    w = RawWatch()
    started, events_seen = time.monotonic(), 0
    try:
        async with w.stream(call, resource_version=version, **kwargs) as events:
            async for event in events:
                delivered()
                events_seen += 1
                obj = event.get("raw_object") or {}
                kind = event.get("type")
                if kind == "DELETED":
                    drop(obj)
                elif kind in ("ADDED", "MODIFIED"):
                    put(obj)
                version = (obj.get("metadata") or {}).get("resourceVersion") or version
                if until():
                    break
    finally:
        w.stop()
        await w.close()
    if not events_seen and not until() and time.monotonic() - started < 1.0:
        raise ShortWatch("the watch ended within a second and without any event")
    return version
