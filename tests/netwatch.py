"""A browser test that fails with `net::ERR_NETWORK_CHANGED` names the machine's link changes.

Chromium aborts a page's requests with that error when a link or an address of its network
namespace changes (its NetworkChangeNotifier on Linux watches netlink's link and address
groups; jupyterhub/jupyterhub#1495): a bridge or veth another xdist worker's test adds is
enough (issue 34 item 12; tests/netns.py keeps the suite's own out of the machine's namespace).
This plugin (registered by tests/conftest.py) starts `ip -o monitor link address` at the first
browser test of a worker (tests/test_browser_*.py, tests/test_lab_*.py), in the network
namespace pytest started in, and adds to the report of a browser test whose failure says
ERR_NETWORK_CHANGED the links and addresses added or removed since then and the events seen,
timed from the test's setup: the next culprit names itself.
"""

from __future__ import annotations

import collections
import ctypes
import os
import shutil
import signal
import subprocess
import threading
import time
from typing import Any

import pytest

IP = shutil.which("ip") or "ip"
WATCHED = ("test_browser_", "test_lab_")
ERROR = "ERR_NETWORK_CHANGED"
SECTION = f"the machine's link and address changes ({ERROR})"
CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1

NETNS = pytest.StashKey[int | None]()
WATCH = pytest.StashKey["LinkWatch | str"]()
BEGAN = pytest.StashKey[float]()
_libc = ctypes.CDLL(None, use_errno=True)


def snapshot(netns: int | None) -> set[str]:
    """The namespace's links (`link NAME`) and addresses (`addr NAME ADDRESS`)."""
    lines = _ip(netns, "-o", "addr", "show") + _ip(netns, "-o", "link", "show")
    found = set()
    for line in lines:
        words = line.split()
        name = words[1].rstrip(":").split("@", 1)[0]
        if len(words) > 3 and words[2] in ("inet", "inet6"):
            found.add(f"addr {name} {words[3]}")
        else:
            found.add(f"link {name}")
    return found


def _enter(netns: int | None) -> Any:
    """A preexec_fn: the child in `netns` (None: the forking thread's), ended with its parent."""

    def enter() -> None:
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # a killed pytest leaves no monitor behind
        if netns is not None and _libc.setns(netns, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns")

    return enter


def _ip(netns: int | None, *args: str) -> list[str]:
    done = subprocess.run(
        [IP, *args], capture_output=True, text=True, check=True, timeout=30,
        preexec_fn=_enter(netns), pass_fds=() if netns is None else (netns,),
    )  # fmt: skip
    return done.stdout.splitlines()


class LinkWatch:
    """`ip -o monitor link address` in `netns` (None: this thread's), each line timed, and the
    namespace's links and addresses when it began."""

    def __init__(self, netns: int | None) -> None:
        self.netns = netns
        self.first = snapshot(netns)
        self.began = time.monotonic()
        self.events: collections.deque[tuple[float, str]] = collections.deque(maxlen=2000)
        self.process = subprocess.Popen(
            [IP, "-o", "monitor", "link", "address"], stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
            preexec_fn=_enter(netns), pass_fds=() if netns is None else (netns,),
        )  # fmt: skip
        threading.Thread(target=self._read, name="netwatch", daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.events.append((time.monotonic(), line.rstrip()[:240]))

    def report(self, since: float) -> str:
        """What changed from the watch's start to now, and the events, timed from `since`."""
        time.sleep(0.5)  # events the kernel sent just before the failure: read them too
        now = snapshot(self.netns)
        age = time.monotonic() - self.began
        out = [f"since this worker's first browser test ({age:.0f} s ago), in its namespace:"]
        out += [f"  added   {item}" for item in sorted(now - self.first)]
        out += [f"  removed {item}" for item in sorted(self.first - now)]
        if now == self.first:
            out.append("  the same links and addresses as then")
        events = list(self.events)
        out.append(f"ip monitor link address: {len(events)} event(s), the last 60 (s from setup):")
        out += [f"  {at - since:+8.2f}s {line}" for at, line in events[-60:]]
        return "\n".join(out)

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


def _watch(config: pytest.Config) -> LinkWatch | str:
    """This session's watch, started at the first call; a sentence where it cannot be had."""
    if WATCH not in config.stash:
        try:
            config.stash[WATCH] = LinkWatch(config.stash.get(NETNS, None))
        except (OSError, subprocess.SubprocessError) as exc:
            config.stash[WATCH] = f"no watch of the machine's links here: {exc}"
    return config.stash[WATCH]


def pytest_configure(config: pytest.Config) -> None:
    # the namespace the process started in (the machine's): a module in tests/netns.py's
    # own_network returns the main thread to it, but the watch must not depend on that
    try:
        config.stash[NETNS] = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        config.stash[NETNS] = None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.path.name.startswith(WATCHED):
        _watch(item.config)
        item.stash[BEGAN] = time.monotonic()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    report = yield
    if report.failed and BEGAN in item.stash and ERROR in report.longreprtext:
        watch = _watch(item.config)
        text = watch if isinstance(watch, str) else watch.report(item.stash[BEGAN])
        report.sections.append((SECTION, text))
    return report


def pytest_unconfigure(config: pytest.Config) -> None:
    watch = config.stash.get(WATCH, None)
    if isinstance(watch, LinkWatch):
        watch.stop()
    netns = config.stash.get(NETNS, None)
    if netns is not None:
        os.close(netns)
