"""devcluster.filelock: an exclusive, non-blocking flock on a named file in a shared directory,
the reservation the pod-network subnets (devcluster/subnetclaim.py) and the control plane's
ports (devcluster/controlplane/ports.py) are held by."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from devcluster import filelock

REPO = Path(__file__).resolve().parent.parent


def _claimed_elsewhere(directory: Path, name: str) -> bool:
    """Whether another process can claim `name` now."""
    code = (
        "import sys; from pathlib import Path; from devcluster import filelock; "
        "print(filelock.claim(Path(sys.argv[1]), sys.argv[2]) is not None)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(directory), name],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    )
    return result.stdout.strip() == "True"


def test_a_second_claim_of_a_held_name_gets_none_until_the_first_is_released(tmp_path):
    first = filelock.claim(tmp_path, "10.100.0.0-16")
    assert first is not None
    assert filelock.claim(tmp_path, "10.100.0.0-16") is None
    other = filelock.claim(tmp_path, "10.101.0.0-16")
    assert other is not None, "another name is another lock"
    first.close()
    again = filelock.claim(tmp_path, "10.100.0.0-16")
    assert again is not None
    again.close()
    other.close()


def test_another_process_cannot_claim_a_held_name(tmp_path):
    held = filelock.claim(tmp_path, "40000")
    assert held is not None
    with held:
        assert not _claimed_elsewhere(tmp_path, "40000")
    assert _claimed_elsewhere(tmp_path, "40000")


def test_release_is_idempotent_and_leaves_the_lock_file(tmp_path):
    """The file stays: unlinking it while another process waits on it would let two hold the
    "same" name (devcluster/subnetclaim.py)."""
    held = filelock.claim(tmp_path, "40001")
    assert held is not None and held.path == tmp_path / "40001"
    held.close()
    held.close()
    assert (tmp_path / "40001").exists()
