"""Catalog loading: the demo catalog, every error naming its path, access rules, idle policy."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

import fracspawner
from fracspawner.backends import load_catalog
from fracspawner.model.catalog import (
    SCHEMA_PATH,
    AccessRule,
    CatalogError,
    IdlePolicy,
    parse_duration,
)
from fracspawner.model.slices import parse_slice

DEMO = Path(__file__).resolve().parent.parent / "examples" / "catalogs" / "demo.yaml"

BASE: dict[str, Any] = {
    "pools": {
        "a100-mig": {
            "gpu": "A100-80GB",
            "backend": "mig-mixed",
            "offers": ["mig-1g.10gb", "mig-2g.20gb"],
        },
        "h100": {"gpu": "H100-80GB", "backend": "hami", "offers": ["1/8", "1/4", "10GiB", "1"]},
        "t4": {"gpu": "T4", "backend": "timeslicing", "replicas": 4, "offers": ["1/4"]},
    },
    "images": {
        "pytorch": {"image": "quay.io/jupyter/pytorch-notebook:cuda12-latest", "default": True},
        "scipy": {"image": "quay.io/jupyter/scipy-notebook:latest"},
    },
    "access": {
        "default": {"pools": ["h100"], "max_gpu": 0.25},
        "groups": {
            "ml-research": {"pools": "all", "max_gpu": 2},
            "vision": {"pools": ["t4"], "max_gpu": 0.5},
            "audio": {"pools": ["a100-mig"], "max_gpu": 1},
        },
        "users": {"boss": {"pools": ["t4"]}},
    },
    "idle": {"kernel_gpu_idle": "30m", "server_gpu_idle": "2h", "server_idle": "8h"},
}


def with_change(path: str, value: Any) -> dict[str, Any]:
    """BASE with the dotted `path` set to `value` (a '-' value deletes it)."""
    data = copy.deepcopy(BASE)
    *parents, last = path.split(".")
    node = data
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if value == "-":
        del node[last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return data


def test_demo_catalog_loads():
    catalog = load_catalog(DEMO)
    assert list(catalog.pools) == ["a100-mig", "h100", "t4"]  # catalog order kept
    h100 = catalog.pools["h100"]
    assert h100.backend == "hami" and h100.gpu.name == "H100-80GB"
    assert [str(o) for o in h100.offers] == ["1/8", "1/4", "1/2", "10GiB", "20GiB", "1"]
    assert dict(h100.node_selector) == {"gpu": "on"}
    assert catalog.pools["t4"].replicas == 4
    assert catalog.default_image(None).image == "quay.io/jupyter/pytorch-notebook:cuda12-latest"
    assert catalog.fraction_step == 8
    # hibernation is decided per pool by its backend (idle_defaults.py): none catalog-wide
    assert catalog.idle == IdlePolicy(1800, 3600, 28800, None, 86400, None)


def test_dict_and_yaml_give_the_same_catalog(tmp_path):
    import yaml

    path = tmp_path / "catalog.yaml"
    path.write_text(yaml.safe_dump(BASE))
    assert load_catalog(path) == load_catalog(BASE) == load_catalog(str(path))


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("pools.h100.offers.1", "0.3", 'pools.h100.offers[1]: "0.3" is not a multiple of 1/8'),
        ("pools.h100.offers.0", "mig-1g.10gb", "pools.h100.offers[0]: mig-1g.10gb: the hami"),
        ("pools.h100.offers.2", "quarter", 'pools.h100.offers[2]: "quarter" is not a GPU slice'),
        ("pools.h100.offers.1", "1/8", "pools.h100.offers[1]: duplicate offer 1/8"),
        ("pools.h100.offers.1", "none", "pools.h100.offers[1]: 'none' is not a GPU offer"),
        ("pools.h100.offers", [], "pools.h100.offers: [] should be non-empty"),
        ("pools.a100-mig.offers.0", "mig-1g.5gb", "A100-80GB has no MIG profile 1g.5gb"),
        ("pools.t4.offers.0", "1/2", "pools.t4.offers[0]: 1/2: a timeslicing pool with"),
        ("pools.t4.replicas", "-", "pools.t4: replicas: set it"),
        ("pools.h100.gpu", "V100", "pools.h100.gpu: unknown GPU model 'V100'"),
        ("pools.h100.backend", "magic", "pools.h100.backend: unknown backend 'magic'"),
        ("pools.h100.colour", "red", "pools.h100: unknown key(s) ('colour' was unexpected)"),
        ("pools.h100.backend", "-", "pools.h100: 'backend' is a required property"),
        ("pools.h100.replicas", 0, "pools.h100.replicas: 0 is less than the minimum of 1"),
        ("pools.h100.node_selector", {"gpu": True}, "pools.h100.node_selector.gpu: True is not"),
        ("pools.h100.default_image", "tensorflow", "pools.h100.default_image: unknown image"),
        ("pools.h100.idle", {"server_idle": "soon"}, "pools.h100.idle.server_idle: 'soon' is not"),
        ("images.scipy.default", True, "images.scipy.default: only one image may be the default"),
        ("images.scipy.image", "-", "images.scipy: 'image' is a required property"),
        ("access.default.pools", ["a100"], "access.default.pools[0]: unknown pool 'a100'"),
        ("access.groups.vision.pools", "some", "access.groups.vision.pools: 'some' is not valid"),
        ("access.users.boss.max_gpu", -1, "access.users.boss.max_gpu: -1 is less than"),
        ("idle.kernel_gpu_idle", "30 minutes", "idle.kernel_gpu_idle: '30 minutes' is not"),
        ("fraction_step", 3, "fraction_step: 3 is not one of [2, 4, 8, 16]"),
        ("extra", 1, "(catalog): unknown key(s) ('extra' was unexpected)"),
    ],
)
def test_errors_name_the_path(path, value, message):
    with pytest.raises(CatalogError) as info:
        load_catalog(with_change(path, value))
    assert message in str(info.value)


def test_pool_names_must_be_label_values():
    data = copy.deepcopy(BASE)
    data["pools"]["bad name!"] = data["pools"].pop("t4")
    with pytest.raises(CatalogError, match="'bad name!' is not a valid name"):
        load_catalog(data)


def test_fraction_step_16_allows_sixteenths():
    assert (
        parse_slice("1/16", step=16)
        in load_catalog({**with_change("pools.h100.offers.0", "1/16"), "fraction_step": 16})
        .pools["h100"]
        .offers
    )


def test_duplicate_yaml_keys_are_refused(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text(
        "pools:\n"
        "  h100: {gpu: H100-80GB, backend: hami, offers: ['1/4']}\n"
        "  h100: {gpu: T4, backend: whole, offers: ['1']}\n"
        "images: {i: {image: busybox}}\n"
    )
    with pytest.raises(CatalogError, match="duplicate key 'h100' \\(line 3\\)"):
        load_catalog(path)


def test_bad_yaml_and_missing_file_are_catalog_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("pools: [\n")
    with pytest.raises(CatalogError, match="not valid YAML"):
        load_catalog(bad)
    with pytest.raises(CatalogError, match="cannot read"):
        load_catalog(tmp_path / "missing.yaml")
    with pytest.raises(CatalogError, match="\\(catalog\\): \\[1\\] is not of type 'object'"):
        load_catalog([1])  # type: ignore[arg-type]


def test_custom_gpu_model_with_mig_profiles():
    data = with_change(
        "pools.h100.gpu",
        {
            "name": "B200-180GB",
            "memory_mib": 184320,
            "mig_profiles": {
                "1g.23gb": {"memory_mib": 23552, "max_instances": 7},
                "7g.180gb": {"memory_mib": 184320},
            },
        },
    )
    data["pools"]["h100"]["backend"] = "mig-mixed"
    data["pools"]["h100"]["offers"] = ["mig-1g.23gb", "mig-7g.180gb"]
    pool = load_catalog(data).pools["h100"]
    assert pool.gpu.name == "B200-180GB"
    assert pool.gpu.mig_profiles["1g.23gb"].compute_slices == 1
    assert pool.gpu.mig_profiles["7g.180gb"].max_instances == 1

    data["pools"]["h100"]["gpu"]["mig_profiles"]["1g.23gb"]["compute_slices"] = 2
    with pytest.raises(CatalogError, match="mig_profiles.1g.23gb.compute_slices: 2 contradicts"):
        load_catalog(data)


# ------------------------------------------------------------------------------ access
@pytest.mark.parametrize(
    ("user", "groups", "pools", "max_gpu"),
    [
        ("alice", [], ("h100",), 0.25),  # default
        ("alice", ["unknown-group"], ("h100",), 0.25),
        ("mira", ["ml-research"], None, 2.0),  # pools: all
        ("vic", ["vision", "audio"], ("a100-mig", "t4"), 1.0),  # union of pools, max of quota
        ("mix", ["vision", "ml-research"], None, 2.0),
        ("boss", ["ml-research"], ("t4",), None),  # a users entry wins over groups
    ],
)
def test_rule_for(user, groups, pools, max_gpu):
    assert load_catalog(BASE).rule_for(user, groups) == AccessRule(pools=pools, max_gpu=max_gpu)


def test_access_defaults():
    no_access = {k: v for k, v in BASE.items() if k != "access"}
    assert load_catalog(no_access).rule_for("x", []) == AccessRule(None, None)
    # an access section without a default gives others nothing, not everything
    only_groups = with_change("access.default", "-")
    assert load_catalog(only_groups).rule_for("x", []) == AccessRule((), 0.0)


# ------------------------------------------------------------------------------ images, idle
def test_default_image_pool_override_and_first_image_fallback():
    catalog = load_catalog(with_change("pools.t4.default_image", "scipy"))
    assert catalog.default_image(catalog.pools["t4"]).name == "scipy"
    assert catalog.default_image(catalog.pools["h100"]).name == "pytorch"
    no_default = load_catalog(with_change("images.pytorch.default", False))
    assert no_default.default_image(None).name == "pytorch"


@pytest.mark.parametrize("images", ["-", {}])
def test_images_are_optional(images):
    # without images fracspawner sets none: the spawner's configured image stays in force
    catalog = load_catalog(with_change("images", images))
    assert not catalog.images
    assert catalog.default_image(None) is None
    assert catalog.default_image(catalog.pools["h100"]) is None
    with pytest.raises(CatalogError, match="pools.h100.default_image: unknown image 'pytorch'"):
        load_catalog(with_change("pools.h100.default_image", "pytorch") | {"images": {}})


def test_idle_for_merges_pool_overrides():
    catalog = load_catalog(with_change("pools.t4.idle", {"server_gpu_idle": "20m", "max_age": 0}))
    assert catalog.idle_for("t4") == IdlePolicy(1800, 1200, 28800, None, 86400, 600)
    assert catalog.idle_for("h100") == catalog.idle
    assert catalog.idle_for(None) == catalog.idle
    assert catalog.idle_for("no-such-pool") == catalog.idle


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90),
        ("30m", 1800),
        ("2h", 7200),
        ("1d", 86400),
        ("1.5h", 5400),
        ("1w", 604800),
        ("45", 45),
        (120, 120),
        (0.5, 0.5),
        ("0", None),
        (0, None),
        ("off", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["soon", "-5m", "5 parsecs", "1h30m", True, float("nan"), -1])
def test_parse_duration_refuses_garbage(text):
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


# ------------------------------------------------------------------------------ schema
def test_schema_ships_inside_the_package_and_is_valid():
    assert SCHEMA_PATH.parent == Path(fracspawner.__file__).parent / "model"
    schema = json.loads(SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(BASE, schema)
