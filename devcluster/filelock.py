"""A name held machine-wide: an exclusive, non-blocking flock(2) on a file of that name in a
directory all holders share. The pod-network subnets (devcluster/subnetclaim.py) and the
control plane's ports (devcluster/controlplane/ports.py) are reserved so.

The kernel drops the lock when the holder closes the file or dies, so a crashed holder leaks
nothing. The file stays after the release: unlinking it while another process waits to lock it
would let two hold the "same" name. The descriptor is close-on-exec (Python's default), so the
processes a holder starts do not keep the lock."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from types import TracebackType


class HeldLock:
    """A claimed name, held until close() (or the holder's exit)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    def close(self) -> None:
        """Release the name (closing the last descriptor drops the flock); again: nothing."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def __enter__(self) -> HeldLock:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def claim(directory: Path, name: str) -> HeldLock | None:
    """Hold `name` in `directory` (which must exist); None while another holder has it.

    OSError where the file cannot be opened or locked for another reason."""
    path = directory / name
    fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return HeldLock(path, fd)
