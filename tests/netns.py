"""A network namespace of a test's own, for tests that change the network (issue 34 item 12).

The devcluster's `network: namespaces` mode adds a bridge, veth pairs and addresses: made in the
machine's own network namespace they are link changes every process there sees, and a browser
test in another worker failed with Chromium's `net::ERR_NETWORK_CHANGED`. `own_network()` moves
the calling thread into a new network namespace with only `lo` (up) for as long as it is
entered: the devcluster it then starts (in this process, or a child process), the hub, and the
test's own connections (sockets made by this thread, threads it starts and processes it forks)
are all in there, and the kernel removes what is left in it when the last of them is gone. A
network namespace is a property of each thread (unshare(2) CLONE_NEWNET): other threads, other
workers and the machine keep theirs. Needs root (CAP_SYS_ADMIN), as `network: namespaces` does.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess
from collections.abc import Iterable, Iterator
from typing import Any

import pytest

from devcluster.network import network_namespaces

CLONE_NEWNET = 0x40000000
IP = shutil.which("ip") or "ip"
_libc = ctypes.CDLL(None, use_errno=True)


def _call(name: str, *args: int) -> None:
    if getattr(_libc, name)(*args) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{name}: {os.strerror(errno)}")


def _current() -> int:
    """An fd of the calling thread's network namespace."""
    return os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)


def links(netns: int | None = None) -> list[str]:
    """The names `ip -o link` lists, in the namespace of the fd `netns` (default: the calling
    thread's)."""
    enter = None if netns is None else (lambda: _call("setns", netns, CLONE_NEWNET))
    done = subprocess.run(
        [IP, "-o", "link", "show"], capture_output=True, text=True, check=True, timeout=30,
        preexec_fn=enter, pass_fds=() if netns is None else (netns,),
    )  # fmt: skip
    return [line.split(": ", 2)[1].split("@", 1)[0] for line in done.stdout.splitlines()]


class OwnNetwork:
    """What `own_network()` yields: the namespace the thread came from, to look at."""

    def __init__(self, outside: int) -> None:
        self.outside = outside

    def outside_links(self) -> list[str]:
        """The link names of the namespace the thread was in before (the machine's)."""
        return links(self.outside)


@contextlib.contextmanager
def own_network() -> Iterator[OwnNetwork]:
    """The calling thread in a new network namespace (only `lo`, up) until the block ends."""
    outside = _current()
    try:
        _call("unshare", CLONE_NEWNET)
        try:
            subprocess.run([IP, "link", "set", "lo", "up"], check=True, timeout=30)
            yield OwnNetwork(outside)
        finally:
            _call("setns", outside, CLONE_NEWNET)
    finally:
        os.close(outside)


def own_network_fixture() -> Any:
    """A module-scoped autouse fixture `own_module_network`: the module's tests, and the control
    plane and node agent its fixtures start, in a network namespace of their own for the whole
    module (the agent's `network: namespaces` bridge and veths must reach the apiserver, and the
    test's kubectl both). An autouse fixture of module scope is set up before the module's other
    module-scoped fixtures (`cp`, `agent`) and torn down after them, in the main thread, which
    then returns to the machine's namespace. Yields None where pods get no network namespaces
    (not root): then nothing changes a link. Assign it to the name `own_module_network`."""

    @pytest.fixture(scope="module", autouse=True)
    def own_module_network() -> Iterator[OwnNetwork | None]:
        if not network_namespaces():
            yield None
            return
        with own_network() as own:
            yield own

    return own_module_network


def bridge_links(bridge: str, names: Iterable[str]) -> list[str]:
    """Of the link `names`, the devcluster bridge `bridge` (`dc<id>`) and its pods' veths
    (`v<id><n>`, devcluster/network.py NamespaceNetwork)."""
    return [name for name in names if name == bridge or name.startswith(f"v{bridge[2:]}")]
