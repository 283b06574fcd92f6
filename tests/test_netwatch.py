"""A browser test that fails with net::ERR_NETWORK_CHANGED names the link changes of the
machine meanwhile (tests/netwatch.py). Run in a network namespace of the test's own
(tests/netns.py), where a bridge stands for another worker's bridge: the machine's links
do not change."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from devcluster.network import network_namespaces
from tests.netns import links, own_network
from tests.netwatch import SECTION

pytestmark = pytest.mark.skipif(
    not network_namespaces(), reason="a namespace of its own: root, unshare, iproute2"
)
REPO = Path(__file__).resolve().parent.parent

BROWSER_TEST = """
import subprocess

def test_the_page_loads():
    subprocess.run(["ip", "link", "add", "nwfake0", "type", "bridge"], check=True)
    errors = ["console.error: Failed to load resource: net::ERR_NETWORK_CHANGED"]
    assert errors == []

def test_another_failure():
    assert "console.error: 404" == ""
"""


def _run(tmp_path: Path, name: str) -> str:
    """pytest with the plugin on `name` (BROWSER_TEST), in this thread's network namespace."""
    (tmp_path / name).write_text(BROWSER_TEST)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.netwatch", "-p", "no:cacheprovider",
         "-p", "no:randomly", "-c", str(tmp_path / "pytest.ini"), str(tmp_path / name)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert "2 failed" in done.stdout, done.stdout + done.stderr
    return done.stdout


def test_a_browser_test_failing_with_err_network_changed_lists_the_links_changed(tmp_path):
    with own_network() as own:
        out = _run(tmp_path, "test_browser_fake.py")
        assert "nwfake0" in links()
        assert "nwfake0" not in own.outside_links()
    section, rest = out.split(f" {SECTION} ", 1)[1].split("\n", 1)
    assert "added   link nwfake0" in rest, out
    # the timed events are best effort: `ip monitor` says nothing when its netlink subscription
    # is made, so a link added just after it started may come before it listens (seen in a
    # fresh-clone run: "0 event(s)"); the before/after comparison above always has it
    assert "ip monitor link address:" in rest, out
    # the other failure says nothing of links; a module that is no browser test is not watched
    assert out.count(SECTION) == 1, out


def test_a_test_that_is_no_browser_test_is_not_watched(tmp_path):
    with own_network():
        out = _run(tmp_path, "test_other.py")
    assert SECTION not in out, out
