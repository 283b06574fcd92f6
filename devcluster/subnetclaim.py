"""A pod network's 10.x.0.0/16, held machine-wide from its choice until its devcluster is gone.

`network: namespaces` picks a random subnet no interface uses and adds its bridge's address
later (devcluster/network.py NamespaceNetwork.start): two devclusters choosing at once (test
workers, each with a node agent) could both see the same one free. A choice is therefore an
exclusive flock(2) on a file per subnet in a directory all devclusters of the machine share
(devcluster/filelock.py): another chooser skips a subnet whose file is locked. The kernel drops
the lock when the holder closes it (`release`, after the bridge is deleted) or dies, so a
crashed devcluster leaks no subnet; its bridge, if left, still holds the address, which the
check after the lock sees (and a later start's sweep removes). The lock files stay (one empty
file per subnet ever used): unlinking one while another process waits to lock it would let two
hold the "same" file.
"""

from __future__ import annotations

import ipaddress
import random
from collections.abc import Callable, Iterable
from pathlib import Path

from devcluster import filelock

Networks = list[ipaddress.IPv4Network]


class SubnetClaim:
    """A chosen subnet and the open, locked file that reserves it."""

    def __init__(self, network: ipaddress.IPv4Network, lock: filelock.HeldLock) -> None:
        self.network = network
        self._lock: filelock.HeldLock | None = lock

    def release(self) -> None:
        """Let other devclusters take the subnet (after this one's bridge is gone)."""
        if self._lock is not None:
            self._lock.close()
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
        lock = filelock.claim(lock_dir, f"10.{second}.0.0-16")
        if lock is None:  # another devcluster's
            continue
        if any(net.overlaps(t) for t in taken()):  # a bridge of a dead one, or not ours at all
            lock.close()
            continue
        return SubnetClaim(net, lock)
    raise RuntimeError(
        f"no free 10.x.0.0/16 for the pod network: all of 10.{min(choices, default=0)}-"
        f"{max(choices, default=0)} are in use or held by other devclusters ({lock_dir})"
    )
