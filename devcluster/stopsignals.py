"""The signals that stop the demo: the first one interrupts, every later one is ignored.

A closed terminal window delivers SIGHUP twice, a moment apart: the interactive shell sends it
to its jobs, then the kernel sends it to the terminal's foreground process group as the shell
(the session leader) exits (issue 38 #2). An impatient second Ctrl-C or a SIGTERM after a
SIGHUP is the same. The demo used to set SIG_IGN in its clean-up's `finally`, but
`signal.signal()` first runs the Python handlers of signals already received, so a second SIGHUP
that arrived just before raised KeyboardInterrupt there and the clean-up never ran: the hub,
proxy, devcluster and servers were left running. Here the handler marks the stop before it
raises, and a marked stop makes every later signal a no-op, so nothing can interrupt the
clean-up wherever a later signal lands.
"""

from __future__ import annotations

import signal
from types import FrameType

#: SIGINT (Ctrl-C), SIGTERM (`kill`, make forwarding), SIGHUP (a closed terminal)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class StopSignals:
    """Install with `install()`; the first stop signal raises KeyboardInterrupt, once."""

    def __init__(self) -> None:
        self.stopping = False
        self.received: list[int] = []

    def install(self) -> None:
        # explicitly for SIGINT too: started in the background by a script (`make demo &`,
        # nohup) it is inherited ignored, and Python then installs no KeyboardInterrupt for it
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handle)

    def stop(self) -> None:
        """From now on every stop signal is ignored: the clean-up runs to its end. Call it first
        thing in the clean-up (also when it runs because the hub or devcluster ended)."""
        self.stopping = True

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received.append(signum)
        if self.stopping:
            return  # the clean-up is under way: nothing may interrupt it
        self.stopping = True  # before raising: a signal handled from here on is ignored
        raise KeyboardInterrupt
