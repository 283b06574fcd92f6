"""The real-GPU suite: runs under `make test-gpu` (FRACSPAWNER_GPU_TESTS=1) on a machine with an
NVIDIA GPU and driver; everywhere else every test here is skipped with the reason (a plain
`pytest` / `make test` run included: CI keeps using the fakes in tests/fake_nvml).

Needs, besides the venv: `cupy-cuda12x` (allocations in real kernels) and
`cuda-python>=12.8,<13` (the checkpoint API, the 12.x line; driver 570+ for hibernation), which
`make test-gpu` installs. Each test records what it measured (`gpu_record`), printed as a table
at the end of the run.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess

import pytest

RESULTS: list[tuple[str, str, str]] = []  # (test, measurement, value)


def _why_not() -> str | None:
    if os.environ.get("FRACSPAWNER_GPU_TESTS") != "1":
        return "the real-GPU suite runs with `make test-gpu` (FRACSPAWNER_GPU_TESTS=1)"
    if not os.path.exists("/dev/nvidiactl") or shutil.which("nvidia-smi") is None:
        return "no NVIDIA GPU and driver here (/dev/nvidiactl, nvidia-smi)"
    try:
        subprocess.run(["nvidia-smi", "-L"], check=True, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"nvidia-smi fails: {exc}"
    for module, package in (("pynvml", "nvidia-ml-py"), ("cupy", "cupy-cuda12x")):
        if importlib.util.find_spec(module) is None:
            return f"{package} is not installed (make test-gpu installs it)"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _why_not()
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.gpu)
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def gpu_record(request):
    def record(what: str, value: object) -> None:
        RESULTS.append((request.node.name, what, str(value)))

    return record


def pytest_terminal_summary(terminalreporter):
    if not RESULTS and _why_not() is None:
        return
    tr = terminalreporter
    tr.section("real-GPU suite")
    if _why_not():
        tr.write_line(f"skipped: {_why_not()}")
        return
    width = max(len(t) for t, _, _ in RESULTS)
    what_width = max(len(w) for _, w, _ in RESULTS)
    for test, what, value in RESULTS:
        tr.write_line(f"{test:<{width}}  {what:<{what_width}}  {value}")
