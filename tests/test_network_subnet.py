"""Two devclusters starting at once in `network: namespaces` get different pod subnets.

Each draws a random 10.x.0.0/16 that no interface uses, and adds its bridge with that address
only later (NamespaceNetwork.start): two drawing at once (xdist workers, each with a node agent)
could take the same one. Here the draw is forced to the same order in both, and the second
chooses (in another process) while the first holds its subnet without a bridge yet.
No bridge is made: the tests only choose.
"""

from __future__ import annotations

import ipaddress
import random
import subprocess
import sys
from pathlib import Path

import pytest

from devcluster import network
from devcluster.subnetclaim import claim_subnet

# the second devcluster: its own process, the same forced draw, the same machine-wide run dir
CHILD = """
import random, sys
from pathlib import Path
random.shuffle = lambda seq: None
from devcluster import network
from devcluster.subnetclaim import claim_subnet
network.RUN_DIR = Path(sys.argv[1])
network._interface_networks = lambda: []
print(network.NamespaceNetwork(Path(sys.argv[1]) / "state", lambda ns: []).subnet)
"""


def _other_process_subnet(run_dir: Path) -> ipaddress.IPv4Network:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(run_dir)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return ipaddress.IPv4Network(done.stdout.strip())


@pytest.fixture
def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(network, "RUN_DIR", tmp_path / "run")
    monkeypatch.setattr(random, "shuffle", lambda seq: None)  # every draw: the same order
    monkeypatch.setattr(network, "_interface_networks", lambda: [])  # any machine, `ip` or not
    return tmp_path / "run"


def test_two_devclusters_choosing_at_once_get_different_subnets(run_dir: Path, tmp_path: Path):
    first = network.NamespaceNetwork(tmp_path / "first", lambda ns: [])
    second = _other_process_subnet(run_dir)  # while `first` has no bridge yet
    assert not first.subnet.overlaps(second), (first.subnet, second)
    same_process = network.NamespaceNetwork(tmp_path / "third", lambda ns: [])
    assert not same_process.subnet.overlaps(first.subnet), (first.subnet, same_process.subnet)


def test_a_dead_devclusters_subnet_is_free_again(run_dir: Path, tmp_path: Path):
    gone = _other_process_subnet(run_dir)  # chose, then exited without stopping
    again = network.NamespaceNetwork(tmp_path / "again", lambda ns: [])
    assert again.subnet == gone


def test_a_released_subnet_is_free_again_and_an_interfaces_is_skipped(run_dir: Path):
    first = claim_subnet(run_dir, lambda: [])
    first.release()
    assert claim_subnet(run_dir, lambda: []).network == first.network
    in_use = [first.network]  # e.g. a dead devcluster's bridge, not yet swept
    assert claim_subnet(run_dir / "other", lambda: in_use).network != first.network


def test_the_sweep_of_dead_bridges_leaves_the_subnet_locks_alone(run_dir: Path, tmp_path: Path):
    held = network.NamespaceNetwork(tmp_path / "held", lambda ns: [])
    locks = sorted((run_dir / "subnets").iterdir())
    network._sweep_dead_bridges()  # no bridge notes: nothing to remove, the locks kept
    assert sorted((run_dir / "subnets").iterdir()) == locks
    assert _other_process_subnet(run_dir) != held.subnet
