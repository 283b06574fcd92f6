"""`make test` hands the slowest modules to the xdist workers first (tests/xdist_order.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.xdist_order import EXPECTED_SECONDS, expected_seconds, slowest_first

REPO = Path(__file__).resolve().parent.parent
CONFTEST = REPO / "tests" / "conftest.py"


def test_every_module_named_exists():
    stale = [name for name in EXPECTED_SECONDS if not (REPO / "tests" / name).is_file()]
    assert not stale, f"tests/xdist_order.py names modules that are gone: {stale}"


def test_slowest_first_and_equals_keep_their_order():
    scopes = ["tests/test_backends.py", "tests/test_slices.py", "tests/test_demo_lab.py",
              "tests/test_e2e_wait.py", "tests/test_demo.py", "tests/test_dra_e2e.py"]  # fmt: skip
    assert slowest_first(scopes) == [
        "tests/test_demo.py",
        "tests/test_demo_lab.py",
        "tests/test_dra_e2e.py",
        "tests/test_e2e_wait.py",
        "tests/test_backends.py",
        "tests/test_slices.py",
    ]
    demo_lab = EXPECTED_SECONDS["test_demo_lab.py"]
    assert expected_seconds("tests/test_demo_lab.py::test_x") == demo_lab
    assert expected_seconds("tests/test_not_named.py") == 0


def test_a_worker_runs_the_slow_one_test_module_before_a_module_of_many_tests(tmp_path):
    """xdist alone (most tests first) ran test_demo_lab.py's one test last; `make test`'s
    options with this repository's conftest run it first."""
    suite = tmp_path / "suite"
    suite.mkdir()
    # the repository's conftest, loaded under another name beside modules of the test's own
    (suite / "conftest.py").write_text(
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('repo_conftest', {str(CONFTEST)!r})\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "pytest_xdist_make_scheduler = module.pytest_xdist_make_scheduler\n"
    )
    record = tmp_path / "order.txt"
    body = "def test_{i}():\n    open({record!r}, 'a').write(__name__ + '\\n')\n"
    (suite / "test_demo_lab.py").write_text(body.format(i=0, record=str(record)))
    (suite / "test_many.py").write_text(
        "".join(body.format(i=i, record=str(record)) for i in range(5))
    )
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "1", "--dist", "loadfile", "-p",
         "no:cacheprovider", "--rootdir", str(tmp_path), "-c", os.devnull, "suite"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert record.read_text().split() == ["test_demo_lab"] + ["test_many"] * 5
