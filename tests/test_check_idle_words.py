"""`fracspawner check` on the idle blocks and in plain words; `usage`/`capacity` against an API
that does not answer (issue 38 #5)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from devcluster.localhub import free_port
from fracspawner.model.check import catalog_problems

POOL = {"gpu": "H100-80GB", "backend": "hami", "offers": ["1/8"]}


def problems(**extra) -> list[str]:
    return catalog_problems({"pools": {"h100": dict(POOL)}, **extra})


def test_every_bad_idle_value_is_reported_in_one_run():
    found = problems(idle={"server_idle": "forever", "max_age": "-1", "kernel_gpu_hibernate": "5x"})
    assert [p.split(":")[0] for p in found] == [
        "idle.server_idle",
        "idle.max_age",
        "idle.kernel_gpu_hibernate",
    ], found
    assert "'5x' is not a duration" in found[2], found


def test_a_typod_idle_key_does_not_hide_its_siblings():
    found = problems(idle={"server_idel": "10m", "max_age": "-1", "kernel_gpu_hibernate": "5x"})
    paths = [p.split(":")[0] for p in found]
    assert paths == ["idle.server_idel", "idle.max_age", "idle.kernel_gpu_hibernate"], found
    assert "did you mean 'server_idle'?" in found[0], found


def test_a_pools_idle_block_reports_every_bad_value_too():
    pool = {**POOL, "idle": {"server_idle": "forever", "max_age": "soon"}}
    found = catalog_problems({"pools": {"h100": pool}})
    assert [p.split(":")[0] for p in found] == [
        "pools.h100.idle.server_idle",
        "pools.h100.idle.max_age",
    ], found


def test_a_typod_key_read_as_the_idle_key_it_means_is_checked_too():
    found = problems(idle={"server_idel": "5x"})
    assert any("'5x' is not a duration" in p and "read as 'server_idle'" in p for p in found), found


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (
            {"access": {"default": {"pools": ["h100"], "max_gpu": -1}}},
            "access.default.max_gpu: must be 0 or more, not -1",
        ),
        (
            {"pools": {"h100": {**POOL, "backend": "timeslicing", "replicas": 0}}},
            "pools.h100.replicas: must be 1 or more, not 0",
        ),
        (
            {"pools": {"h100": {**POOL, "backend": "timeslicing", "replicas": 99}}},
            "pools.h100.replicas: must be at most 48, not 99",
        ),
        ({"fraction_step": 3}, "fraction_step: 3 is not allowed; use one of 2, 4, 8, 16"),
        ({"pools": {"h100": {"gpu": "H100-80GB", "offers": ["1/8"]}}}, "pools.h100: missing"),
    ],
    ids=["minimum-0", "minimum-1", "maximum", "enum", "required"],
)
def test_schema_words_are_plain(extra, said):
    data = {"pools": {"h100": dict(POOL)}, **extra}
    found = catalog_problems(data)
    assert any(p.startswith(said) for p in found), found
    schema_words = ("is less than the minimum", "is greater than the maximum", "is not one of")
    assert not [p for p in found if any(w in p for w in schema_words)], found
    assert not [p for p in found if "is a required property" in p], found


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fracspawner", *args], capture_output=True, text=True, timeout=120
    )


def test_check_on_a_directory_says_it_is_a_directory(tmp_path):
    result = _run("check", str(tmp_path))
    assert result.returncode == 2, result
    assert result.stderr.strip() == (
        f"fracspawner check: {tmp_path} is a directory; give the catalog file (a YAML file)"
    ), result.stderr


@pytest.mark.parametrize("command", ["usage", "capacity"])
def test_an_unreachable_api_is_one_plain_line(tmp_path: Path, command: str):
    port = free_port()  # nothing listens there
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "lab", "cluster": {"server": f"https://127.0.0.1:{port}"}}],
                "users": [{"name": "me", "user": {"token": "t"}}],
                "contexts": [{"name": "lab-admin", "context": {"cluster": "lab", "user": "me"}}],
                "current-context": "lab-admin",
            }
        )
    )
    catalog = Path(__file__).resolve().parent.parent / "examples" / "catalogs" / "demo.yaml"
    result = _run(command, "--catalog", str(catalog), "--kubeconfig", str(kubeconfig))
    assert result.returncode == 1, result
    lines = result.stderr.strip().splitlines()
    assert lines == [
        f"fracspawner {command}: cannot connect to the Kubernetes API at "
        f"https://127.0.0.1:{port} (kube context 'lab-admin' of {kubeconfig}): "
        "connection refused; check the kube context (kubectl config current-context) "
        "and that the cluster is up"
    ], result.stderr
