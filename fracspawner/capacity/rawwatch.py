"""One watch request fed into a cache: the loop both pod watches share (the capacity watch,
a kubespawner reflector, and the Kubeflow webhook's, which may not import kubespawner)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kubernetes_asyncio import watch

Feed = Callable[[dict[str, Any]], None]


class _NoModels:
    """Where kubernetes_asyncio's Watch keeps the ApiClient it builds model objects with."""

    def deserialize(self, response: Any, response_type: str) -> Any:  # never: no return type
        raise TypeError("RawWatch builds no model objects")

    async def close(self) -> None:
        return None


class RawWatch(watch.Watch):
    """kubernetes_asyncio's Watch without building objects: events keep the raw dicts (its
    "object" return type still round-trips each event through json.dumps/json.loads).

    Nor does it make the ApiClient `Watch.__init__` makes for that: the request goes through
    the API object's own client, and a new ApiClient builds an SSL context (the system's CA
    bundle loaded: ~20 ms of CPU) for every watch, which ends every `timeout_seconds`, per
    kind, in the hub, the culler and the webhook alike."""

    def __init__(self) -> None:  # Watch.__init__'s attributes, but no ApiClient
        self._raw_return_type = None
        self._stop = False
        self._api_client = _NoModels()
        self.resource_version = None
        self.resp = None

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
