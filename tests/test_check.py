"""`fracspawner check CATALOG` and the hub's start-up: every mistake of a catalog at once,
each with its path and a did-you-mean for typos (issue 21 item 7; design.md's commands)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import fracspawner
from fracspawner.model.check import catalog_problems, did_you_mean

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "examples" / "catalogs" / "demo.yaml"

# three independent mistakes (a typo'd key, an offer off the 1/8 grid, a typo'd pool name),
# plus a typo'd GPU model and backend in a second pool
BAD = """\
pools:
  h100:
    gpu: H100-80GB
    backend: hami
    ofers: ["1/4"]
  t4:
    gpu: T4
    backend: timeslicing
    replicas: 4
    offers: ["0.3", "1/4"]
  l4:
    gpu: A100-80G
    backend: timeslicng
    offers: ["1/2"]
access:
  default: {pools: [h10], max_gpu: 0.25}
"""
EXPECTED = [
    "pools.h100.ofers: unknown key 'ofers' (did you mean 'offers'?)",
    'pools.t4.offers[0]: "0.3" is not a multiple of 1/8',
    "access.default.pools[0]: unknown pool 'h10' (did you mean 'h100'?)",
    "pools.l4.gpu: unknown GPU model 'A100-80G' (did you mean 'A100-80GB'?)",
    "pools.l4.backend: unknown backend 'timeslicng' (did you mean 'timeslicing'?)",
]


def _check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fracspawner", "check", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_check_lists_every_mistake_with_its_path_and_exits_non_zero(tmp_path):
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(BAD)
    result = _check(str(catalog))
    assert result.returncode == 1, result
    assert result.stderr.startswith(f"{catalog}: ")
    for line in EXPECTED:
        assert line in result.stderr, result.stderr


def test_check_of_a_clean_catalog_exits_zero():
    result = _check(str(DEMO))
    assert result.returncode == 0, result
    assert result.stdout.strip() == f"{DEMO}: the catalog is fine."


def test_check_of_a_missing_file_or_bad_yaml_is_one_problem(tmp_path):
    result = _check(str(tmp_path / "nope.yaml"))
    assert result.returncode == 1 and "cannot read the catalog" in result.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("pools: [\n")
    result = _check(str(bad))
    assert result.returncode == 1 and "not valid YAML" in result.stderr


def test_problems_of_a_dict_catalog(catalog_dict):
    assert catalog_problems(catalog_dict) == []
    catalog_dict["images"]["pytorch"]["defualt"] = True
    catalog_dict["pools"]["h100"]["default_image"] = "pytorh"
    problems = catalog_problems(catalog_dict)
    assert any(p.startswith("images.pytorch.defualt: unknown key 'defualt'") for p in problems)
    assert any("unknown image 'pytorh' (did you mean 'pytorch'?)" in p for p in problems)


def test_did_you_mean_only_for_close_words():
    assert did_you_mean("h10", ["h100", "t4"]) == " (did you mean 'h100'?)"
    assert did_you_mean("zzz", ["h100", "t4"]) == ""


def test_configure_prints_every_problem_naming_the_file(tmp_path, capsys):
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(BAD)
    with pytest.raises(SystemExit) as stopped:
        fracspawner.configure(object(), catalog_file=str(catalog))
    assert stopped.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith(f"fracspawner: {catalog}: 6 problems in the catalog:")
    for line in EXPECTED:
        assert line in err


def test_hub_start_up_prints_the_report_not_a_traceback(tmp_path):
    """A real `jupyterhub` with a bad catalog: it stops while loading its config, printing the
    same report as `fracspawner check` (the file's name, every problem), no traceback."""
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(BAD)
    config = tmp_path / "jupyterhub_config.py"
    config.write_text(
        f"import fracspawner\nfracspawner.configure(c, catalog_file={str(catalog)!r})\n"
    )
    hub = Path(sys.executable).with_name("jupyterhub")
    result = subprocess.run(
        [str(hub), "-f", str(config)], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1, result
    assert f"fracspawner: {catalog}: 6 problems in the catalog:" in result.stderr
    for line in EXPECTED:
        assert line in result.stderr
    assert "Traceback" not in result.stderr
