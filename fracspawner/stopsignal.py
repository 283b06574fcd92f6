"""SIGINT stops a managed service, whatever its parent left it.

JupyterHub stops a managed service (the picker service, the culler) with SIGINT first, then
SIGTERM after `interrupt_timeout` (10 s; jupyterhub/spawner.py LocalProcessSpawner.stop). A
process started from a background job inherits SIGINT ignored (a non-interactive shell's `&`,
POSIX), and Python then installs no KeyboardInterrupt handler: every hub shutdown waited the
whole 10 s for each such service before SIGTERM ended it."""

from __future__ import annotations

import signal


def honour_sigint() -> None:
    """SIGINT raises KeyboardInterrupt again in this process (Python's own handler)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
