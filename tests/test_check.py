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
    # a missing file is bad usage, not "1 problem in the catalog" (issue 27 #8)
    result = _check(str(tmp_path / "nope.yaml"))
    assert result.returncode == 2, result
    assert result.stderr.strip() == f"fracspawner check: no such file: {tmp_path / 'nope.yaml'}"
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


def test_a_typod_blocks_own_mistakes_show_in_the_same_run(tmp_path):
    """A block under a typo'd key was not checked, so its mistakes came one run later; now it
    is read as the key it most likely means, and says so (issue 27 #8)."""
    catalog = tmp_path / "typo.yaml"
    catalog.write_text(
        "pools:\n  h100: {gpu: H100-80GB, backend: hami, offers: ['1/4']}\n"
        "acess:\n  default: {pools: [h100], max_gpu: '0.25'}\n"
    )
    result = _check(str(catalog))
    assert result.returncode == 1
    lines = [line.strip() for line in result.stderr.splitlines()[1:]]
    assert lines[0].startswith("acess: unknown key 'acess' (did you mean 'access'?)")
    assert lines[1] == (
        "acess.default.max_gpu: must be a number (or left empty), not a string ('0.25') "
        "(read as 'access')"
    )


def test_type_mistakes_are_said_in_words_not_json_schema_terms(catalog_dict):
    catalog_dict["access"]["default"]["max_gpu"] = "0.25"
    problems = catalog_problems(catalog_dict)
    assert "access.default.max_gpu: must be a number (or left empty), not a string ('0.25')" in (
        problems
    ), problems
    assert not any("is not of type" in p for p in problems)


def test_the_command_without_a_command_or_with_a_typo_says_so_and_exits_2():
    """`fracspawner` alone exited 0 with the usage; `fracspawner chek` had no did-you-mean."""
    alone = subprocess.run([sys.executable, "-m", "fracspawner"], capture_output=True, text=True)
    assert alone.returncode == 2 and "a command is needed" in alone.stderr
    typo = subprocess.run(
        [sys.executable, "-m", "fracspawner", "chek", "x.yaml"], capture_output=True, text=True
    )
    assert typo.returncode == 2
    assert "unknown command 'chek'; did you mean 'check'?" in typo.stderr


def test_usage_without_a_kube_context_says_so_in_one_line(tmp_path):
    """The client's raw "Invalid kube-config file. Expected key current-context" (and its
    "Config not found" print) became: no kube context, pass --kubeconfig (issue 27 #8)."""
    import os
    import subprocess
    import sys

    env = {
        k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")
    }
    env["HOME"] = str(tmp_path)
    catalog = Path(__file__).resolve().parent.parent / "examples" / "catalogs" / "demo.yaml"
    run = subprocess.run(
        [sys.executable, "-m", "fracspawner", "usage", "--catalog", str(catalog)],
        capture_output=True, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 2
    assert run.stderr.strip() == (
        "fracspawner usage: no kube context: pass --kubeconfig FILE, or set KUBECONFIG "
        f"(none at {tmp_path}/.kube/config)"
    ), run.stderr
    (tmp_path / ".kube").mkdir()
    (tmp_path / ".kube" / "config").write_text("apiVersion: v1\nkind: Config\nclusters: []\n")
    run = subprocess.run(
        [sys.executable, "-m", "fracspawner", "usage", "--catalog", str(catalog)],
        capture_output=True, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 2 and "names no current-context" in run.stderr, run.stderr
