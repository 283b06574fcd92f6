"""A pod network's 10.x.0.0/16, held machine-wide from its choice until its devcluster is gone.

`network: namespaces` picks a random subnet no interface uses and adds its bridge's address
later (devcluster/network.py NamespaceNetwork.start): two devclusters choosing at once (test
workers, each with a node agent) could both see the same one free. A choice is therefore an
exclusive flock(2) on a file per subnet in a directory all devclusters of the machine share:
another chooser skips a subnet whose file is locked. The kernel drops the lock when the holder
closes it (`release`, after the bridge is deleted) or dies, so a crashed devcluster leaks no
subnet; its bridge, if left, still holds the address, which the check after the lock sees
(and a later start's sweep removes). The lock files stay (one empty file per subnet ever used):
unlinking one while another process waits to lock it would let two hold the "same" file.
"""

from __future__ import annotations

import fcntl
import ipaddress
import random
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO

Networks = list[ipaddress.IPv4Network]


class SubnetClaim:
    """A chosen subnet and the open, locked file that reserves it."""

    def __init__(self, network: ipaddress.IPv4Network, lock: IO[bytes]) -> None:
        self.network = network
        self._lock: IO[bytes] | None = lock

    def release(self) -> None:
        """Let other devclusters take the subnet (after this one's bridge is gone)."""
        if self._lock is not None:
            self._lock.close()  # closing the last fd drops the flock
            self._lock = None


def claim_subnet(
    lock_dir: Path, taken: Callable[[], Networks], seconds: Iterable[int] = range(100, 250)
) -> SubnetClaim:
    """A 10.x.0.0/16 (x a random one of `seconds`) that no other claim holds and no network of
    `taken()` (the machine's interfaces, read after the lock) overlaps."""
    lock_dir.mkdir(parents=True, exist_ok=True)
    choices = list(seconds)
    random.shuffle(choices)
    for second in choices:
        net = ipaddress.IPv4Network(f"10.{second}.0.0/16")
        lock = (lock_dir / f"10.{second}.0.0-16").open("ab")  # close-on-exec: pods don't hold it
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another devcluster's
            lock.close()
            continue
        if any(net.overlaps(t) for t in taken()):  # a bridge of a dead one, or not ours at all
            lock.close()
            continue
        return SubnetClaim(net, lock)
    raise RuntimeError(
        f"no free 10.x.0.0/16 for the pod network: all of 10.{min(choices, default=0)}-"
        f"{max(choices, default=0)} are in use or held by other devclusters ({lock_dir})"
    )
