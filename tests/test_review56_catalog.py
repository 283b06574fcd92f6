"""Review s56: the catalog loader and the admin commands fed bad input. Each test failed
before its fix: a traceback, a silently accepted value, or a message that did not say what
was wrong."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest

from fracspawner.backends import backend_names, check_pool, load_catalog
from fracspawner.model.check import catalog_problems
from fracspawner.model.errors import CatalogError

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "examples" / "catalogs" / "demo.yaml"

BASE = {
    "pools": {
        "h100": {"gpu": "H100-80GB", "backend": "hami", "offers": ["1/4", "10GiB", "1"]},
        "t4": {"gpu": "T4", "backend": "timeslicing", "replicas": 4, "offers": ["1/4"]},
    },
    "access": {"default": {"pools": ["h100"], "max_gpu": 0.25}},
}


def fracspawner(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fracspawner", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def with_(path: tuple, value: object) -> dict:
    data = copy.deepcopy(BASE)
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return data


def refused(data: object, says: str) -> None:
    """Both the loader and `check` refuse `data` with a message containing `says`."""
    with pytest.raises(CatalogError) as err:
        load_catalog(data)
    assert says in str(err.value)
    problems = catalog_problems(data, check_pool, backend_names())
    assert any(says in p for p in problems), problems


# --------------------------------------------------------------------------- non-UTF-8 files
LATIN1 = b'pools:\n  h100:\n    gpu: H100\n    backend: hami\n    offers: ["1/4"]\n' + (
    b'    display_name: "caf\xe9"\n'
)


def test_a_catalog_that_is_not_utf8_is_one_clear_problem_not_a_traceback(tmp_path):
    path = tmp_path / "catalog.yaml"
    path.write_bytes(LATIN1)
    with pytest.raises(CatalogError, match=r"not UTF-8 text \(byte 0xe9 on line 6\)"):
        load_catalog(path)
    out = fracspawner("check", str(path))
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    assert "not UTF-8 text (byte 0xe9 on line 6); save the file as UTF-8" in out.stderr
    out = fracspawner("kubeflow", "export", "--catalog", str(DEMO), "--namespaces-file",
                      str(path), "-o", str(tmp_path / "out"))  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr and "not UTF-8 text" in out.stderr


# --------------------------------------------------------------------------- YAML keys
def test_a_list_as_a_yaml_key_is_a_problem_with_its_line_not_a_traceback(tmp_path):
    path = tmp_path / "catalog.yaml"
    path.write_text(
        'pools:\n  h100:\n    gpu: H100\n    backend: hami\n    offers: ["1/4"]\n'
        "  ? [a, b]\n  : 1\n"
    )
    with pytest.raises(CatalogError, match=r"a key is a list, not a name \(line 6\)"):
        load_catalog(path)
    out = fracspawner("check", str(path))
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert "a key is a list, not a name (line 6)" in out.stderr


MERGED = """\
pools:
  h100: &pool
    gpu: H100-80GB
    backend: hami
    offers: ["1/4", "1/2"]
  h200:
    <<: *pool
    gpu: H200-141GB
"""


def test_a_key_beside_a_yaml_merge_key_overrides_it_and_is_no_duplicate(tmp_path):
    path = tmp_path / "catalog.yaml"
    path.write_text(MERGED)
    catalog = load_catalog(path)  # was: "duplicate key 'gpu' (line 8)"
    assert catalog.pools["h200"].gpu.name == "H200-141GB"
    assert catalog.pools["h200"].backend == "hami"
    assert catalog.pools["h100"].gpu.name == "H100-80GB"
    assert fracspawner("check", str(path)).returncode == 0
    # a key written twice is still a duplicate, merge key or not
    path.write_text(MERGED + "    gpu: L4\n")
    with pytest.raises(CatalogError, match=r"duplicate key 'gpu' \(line 9\)"):
        load_catalog(path)


# --------------------------------------------------------------------------- numbers
@pytest.mark.parametrize(
    ("path", "value", "says"),
    [
        # a quota of .nan let every spawn through the Kubeflow webhook (used + asked > nan is
        # never true) and refused every one in the hub; .inf was "unlimited" where the catalog
        # says null, and JSON (the chart, the export) cannot write either
        (("access", "default", "max_gpu"), float("nan"), "(or left empty), not nan"),
        (("access", "default", "max_gpu"), float("inf"), "(or left empty), not inf"),
        (("access", "default", "max_gpu"), 10**400, "not a number of 401 digits"),
        (("pools", "h100", "overcommit"), float("nan"), "must be a number, not nan"),
        (("pools", "h100", "offers"), [float("nan")], "must be a string or a number, not nan"),
        # whole numbers written 4.0: a TypeError from Fraction (a traceback) before
        (("pools", "t4", "replicas"), 4.0, "must be a whole number, not 4.0 (write 4)"),
        (("pools", "h100", "gpu"), {"memory_mib": 81920, "nvml_memory_mib": 81559.0},
         "nvml_memory_mib: must be a whole number, not 81559.0"),
    ],
)  # fmt: skip
def test_numbers_that_are_no_numbers_or_not_whole_are_refused_with_the_key(path, value, says):
    data = with_(path, value)
    with pytest.raises(CatalogError) as err:
        load_catalog(data)
    assert str(err.value).startswith(".".join(path[:3]))
    problems = catalog_problems(data, check_pool, backend_names())
    assert len(problems) == 1 and says in problems[0], problems


def test_a_nan_quota_does_not_admit_past_it(tmp_path):
    path = tmp_path / "catalog.yaml"
    path.write_text(
        'pools: {h100: {gpu: H100, backend: hami, offers: ["1/4"]}}\n'
        "access: {default: {pools: all, max_gpu: .nan}}\n"
    )
    out = fracspawner("check", str(path))
    assert out.returncode == 1, out.stdout
    assert "access.default.max_gpu: must be a number (or left empty), not nan" in out.stderr


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("2024-13-45", "line 6: '2024-13-45' is a date to YAML, but none"),  # ValueError before
        ("9" * 5000, "line 6: a number of 5000 characters, too long to read"),
    ],
)
def test_a_scalar_yaml_cannot_construct_is_a_problem_with_its_line(tmp_path, value, says):
    path = tmp_path / "catalog.yaml"
    path.write_text(
        f'pools:\n  h100:\n    gpu: H100\n    backend: hami\n    offers: ["1/4"]\n'
        f"    description: {value}\n"
    )
    with pytest.raises(CatalogError, match=says):
        load_catalog(path)
    out = fracspawner("check", str(path))
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert says in out.stderr


# --------------------------------------------------------------------------- pool options
@pytest.mark.parametrize(
    ("pool", "options", "says"),
    [
        # typos were ignored: the pods went to the default scheduler, got proportional cores
        ("h100", {"schedular_name": "hami-scheduler"},
         "pools.h100.options.schedular_name: unknown option 'schedular_name' "
         "(did you mean 'scheduler_name'?); the hami backend's options: scheduler_name,"),
        ("h100", {"gpucore": 50}, "unknown option 'gpucore' (did you mean 'gpucores'?)"),
        # another backend's option is not this one's
        ("h100", {"enforced": True}, "pools.h100.options.enforced: unknown option 'enforced'"),
        # "no" was read as true: the pods asked nvidia.com/gpu.shared
        ("t4", {"rename_by_default": "no"},
         "pools.t4.options.rename_by_default: must be true or false, not 'no'"),
        ("h100", {"scheduler_name": ""}, "options.scheduler_name: must be a non-empty string"),
    ],
)  # fmt: skip
def test_pool_options_a_backend_does_not_read_or_cannot_take_are_refused(pool, options, says):
    refused(with_(("pools", pool, "options"), options), says)


def test_kai_enforced_no_is_refused_not_read_as_enforced():
    """`enforced: "no"` on a kai pool made its memory 'enforced' (no soft caps, the form's
    'memory enforced'), the opposite of what was written."""
    pool = {"gpu": "H100", "backend": "kai", "offers": ["1/4"], "options": {"enforced": "no"}}
    refused(with_(("pools", "kai"), pool), "pools.kai.options.enforced: must be true or false")
    pool["options"] = {"enforced": False, "queue": "team-a"}
    assert load_catalog(with_(("pools", "kai"), pool)).pools["kai"].options["enforced"] is False


# --------------------------------------------------------------------------- kubeflow export
@pytest.mark.parametrize(
    ("args", "says"),
    [
        # written as poddefaults/../../escaped.yaml, outside -o, and objects no API server takes
        (["--namespace", "../../escaped"], "--namespace '../../escaped': not a namespace name"),
        (["--namespace", "Team_A"], "--namespace 'Team_A': not a namespace name"),
        # a MutatingWebhookConfiguration the API server refuses (port must be 1-65535)
        (["--webhook-port", "0"], "--webhook-port 0: use a port, 1-65535"),
        (["--webhook-port", "99999"], "--webhook-port 99999: use a port, 1-65535"),
    ],
)
def test_export_refuses_what_no_cluster_would_take_and_writes_nothing(tmp_path, args, says):
    out_dir = tmp_path / "a" / "b" / "out"
    out = fracspawner("kubeflow", "export", "--catalog", str(DEMO), *args, "-o", str(out_dir))
    assert out.returncode == 2, out.stdout + out.stderr
    assert says in out.stderr and "Traceback" not in out.stderr
    assert not out_dir.exists() and not (tmp_path / "a" / "b" / "escaped.yaml").exists()


@pytest.mark.parametrize(
    ("catalog", "said"),
    [
        (
            {"access": {"default": {"pools": "ALL"}}},
            "access.default.pools: must be 'all' or a list of names, not 'ALL' (did you mean "
            "'all'?)",
        ),
        (
            {"kubeflow": {"pools": "al"}},
            "kubeflow.pools: must be 'all' or a list of names, not 'al' (did you mean 'all'?)",
        ),
        (
            {"kubeflow": {"namespaces": [{"groups": ["a"]}]}},
            "kubeflow.namespaces[0]: needs at least one of the keys 'name', 'labels', 'owner'",
        ),
        (
            {"pools": {"h100": {"gpu": None, "backend": "hami", "offers": ["1/4"]}}},
            "pools.h100.gpu: must be a name or a mapping describing a gpu model, not left empty",
        ),
    ],
)
def test_a_key_of_several_forms_says_which_forms_it_takes(catalog, said):
    # JSON Schema's own words were "... is not valid under any of the given schemas"
    data = {"pools": {"h100": {"gpu": "H100-80GB", "backend": "hami", "offers": ["1/4"]}}}
    data.update({k: v for k, v in catalog.items() if k != "pools"})
    if "pools" in catalog:
        data["pools"] = catalog["pools"]
    assert said in catalog_problems(data)
