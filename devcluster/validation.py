"""Strict validation of every object against the official Kubernetes OpenAPI schemas.

The schemas are kubernetes-validate's (its per-version "-local-strict" JSON Schemas, where an
unknown field is an error). `kubernetes_validate.validate()` re-reads the 1.4 MB definitions
file and rebuilds the validator on every call: about 8 ms per object on the development
machine, against 0.25 ms with the validator built once per kind and kept (measured in
docs/devcluster.md). The devcluster validates every create and patch, so it keeps them.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from importlib import resources
from typing import Any

import jsonschema
from referencing import Registry, Resource

from .store import ApiError

#: Kubernetes version whose OpenAPI schemas validate every object (kubernetes-validate ships
#: schemas for 1.25 to 1.37; 1.33 is what /version reports and kubectl's skew policy likes).
K8S_VERSION = "1.33.0"
#: group versions first served after K8S_VERSION, validated with the schemas of the release
#: that made them GA: resource.k8s.io/v1 (Dynamic Resource Allocation) is 1.34's
SCHEMA_VERSIONS = {"resource.k8s.io/v1": "1.34.0"}


def schema_version(api_version: str) -> str:
    """The Kubernetes release whose schemas validate objects of `api_version`."""
    return SCHEMA_VERSIONS.get(api_version, K8S_VERSION)


@functools.lru_cache(maxsize=4)
def _schema_dir(version: str) -> Any:
    """The strict schemas for `version`, else (an older kubernetes-validate) the newest it
    ships that is not newer, as kubernetes-validate itself picks."""
    root = resources.files("kubernetes_validate") / "kubernetes-json-schema"
    wanted = _minor(version)
    shipped = sorted(
        (_minor(d.name[1:].split("-")[0]), d.name)
        for d in root.iterdir()
        if d.name.startswith("v") and d.name.endswith("-local-strict")
    )
    fitting = [name for minor, name in shipped if minor <= wanted] or [shipped[0][1]]
    return root / fitting[-1]


def _minor(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


@functools.lru_cache(maxsize=4)
def _definitions(version: str) -> Resource:
    return Resource.from_contents(
        json.loads((_schema_dir(version) / "_definitions.json").read_text())
    )


@functools.lru_cache(maxsize=64)
def validator_for(kind: str, api_version: str = "v1", version: str | None = None) -> Any:
    """The (cached) strict validator for one kind, built as kubernetes-validate builds it."""
    version = version or schema_version(api_version)
    # "rbac.authorization.k8s.io/v1" -> "rbac-v1", as kubernetes-validate names its files
    group, _, ver = api_version.rpartition("/")
    name = f"{kind.lower()}-{group.split('.')[0]}-{ver}" if group else f"{kind.lower()}-{ver}"
    path = _schema_dir(version) / f"{name}.json"
    if not path.is_file():
        raise ApiError(
            400, "BadRequest", f"no schema for kind {kind} in {api_version} (Kubernetes {version})"
        )
    schema = json.loads(path.read_text())
    registry = _definitions(version) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.Draft202012Validator(schema, registry=registry)


@functools.lru_cache(maxsize=64)
def kind_schema(
    kind: str, api_version: str = "v1", version: str | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One kind's schema and the shared definitions it refers to (`$defs`), for what the
    schemas say beyond types: strategic merge patch keys and strategies."""
    version = version or schema_version(api_version)
    group, _, ver = api_version.rpartition("/")
    name = f"{kind.lower()}-{group.split('.')[0]}-{ver}" if group else f"{kind.lower()}-{ver}"
    path = _schema_dir(version) / f"{name}.json"
    if not path.is_file():
        raise ApiError(
            400, "BadRequest", f"no schema for kind {kind} in {api_version} (Kubernetes {version})"
        )
    definitions = _definitions(version).contents
    return json.loads(path.read_text()), dict(definitions.get("$defs") or {})


def field_path(path: Any) -> str:
    """jsonschema's deque of keys and indexes -> `spec.containers[0].ports[0].containerPort`."""
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")


def validate(obj: Mapping[str, Any], *, required: bool = True) -> None:
    """422 Invalid naming the field, like the apiserver, for anything the schema refuses.
    `required=False` leaves missing fields to the kind's own checks, which word them as the
    apiserver does (`webhooks[0].sideEffects: Required value: ...`)."""
    data = dict(obj)
    validator = validator_for(str(data.get("kind", "")), str(data.get("apiVersion", "v1")))
    errors = validator.iter_errors(data)
    if not required:
        errors = (e for e in errors if e.validator != "required")
    error = jsonschema.exceptions.best_match(errors)
    if error is None:
        return
    path = field_path(error.absolute_path)
    kind = data.get("kind", "object")
    group = str(data.get("apiVersion", "v1")).rpartition("/")[0]
    qualified = f"{kind}.{group}" if group else kind
    name = (data.get("metadata") or {}).get("name", "")
    raise ApiError(
        422,
        "Invalid",
        f'{qualified} "{name}" is invalid: {path or "<root>"}: {error.message}',
        {"name": name, "kind": kind, "causes": [{"field": path, "message": error.message}]},
    )
