"""A watch that ends at once and empty is a failure, not a healthy end (both watch loops)."""

from __future__ import annotations

import time


class ShortWatch(Exception):
    """A watch the server ended within a second and without a single event."""


def short_watch(started: float) -> None:
    """Raise ShortWatch for a watch that began at `started` (monotonic) and delivered nothing:
    a proxy or server closing every watch at once would otherwise be re-watched in a tight
    loop. client-go's Reflector treats it as an error, so it backs off and relists
    (tools/cache/reflector.go, watchHandler: "very short watch")."""
    if time.monotonic() - started < 1.0:
        raise ShortWatch("the watch ended within a second and without any event")
