"""Running the `fracspawner` command line as an admin does, for tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml


def check_catalog(tmp_path: Path, catalog: dict) -> subprocess.CompletedProcess[str]:
    """`fracspawner check` on `catalog`, written as YAML under `tmp_path`."""
    path = tmp_path / "catalog.yaml"
    path.write_text(yaml.safe_dump(catalog))
    return subprocess.run(
        [sys.executable, "-m", "fracspawner", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
