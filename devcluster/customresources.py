"""Writes of custom resources: decoded (pruned, defaulted), validated against their CRD's
schema, with the status subresource and metadata.generation kept as the apiserver keeps them
(apiextensions-apiserver pkg/registry/customresource/strategy.go)."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

from . import objectmeta
from .fielderrors import FieldError, invalid_error
from .resources import Resource
from .store import ApiError
from .structural import apply_defaults, prune, validate


def schema_of(resource: Resource, version: str) -> Mapping[str, Any]:
    return (resource.version_spec(version).get("schema") or {}).get("openAPIV3Schema") or {}


def decode(
    resource: Resource, version: str, body: Any, field_validation: str, warnings: list[str]
) -> dict[str, Any]:
    """The request body as the apiserver's decoder leaves it: apiVersion and kind checked,
    unknown fields dropped (fieldValidation=Strict: 400 instead; Warn: a warning each),
    defaults filled."""
    if not isinstance(body, dict):
        raise ApiError(400, "BadRequest", "the body of the request was not a JSON object")
    shown = json.dumps(body, separators=(",", ":"))[:200]
    if not body.get("kind"):
        raise ApiError(400, "BadRequest", f"Object 'Kind' is missing in '{shown}'")
    if not body.get("apiVersion"):
        raise ApiError(400, "BadRequest", f"Object 'apiVersion' is missing in '{shown}'")
    expected = resource.api_version(version)
    if body["apiVersion"] != expected:
        raise ApiError(
            400,
            "BadRequest",
            f"the API version in the data ({body['apiVersion']}) does not match the expected "
            f"API version ({expected})",
        )
    if body["kind"] != resource.kind:
        raise ApiError(
            400,
            "BadRequest",
            f"the kind in the data ({body['kind']}) does not match the expected kind "
            f"({resource.kind})",
        )
    obj = copy.deepcopy(body)
    dropped = prune(obj, schema_of(resource, version))
    if dropped and field_validation == "Strict":
        unknown = ", ".join(f'unknown field "{p}"' for p in dropped)
        raise ApiError(
            400,
            "BadRequest",
            f'{resource.kind} in version "{version}" cannot be handled as a {resource.kind}: '
            f"strict decoding error: {unknown}",
        )
    if field_validation == "Warn":
        warnings.extend(f'unknown field "{p}"' for p in dropped)
    return coerce(resource, version, obj)


def coerce(resource: Resource, version: str, obj: dict[str, Any]) -> dict[str, Any]:
    """Pruned and defaulted again, quietly (after a mutating webhook changed the object)."""
    schema = schema_of(resource, version)
    prune(obj, schema)
    apply_defaults(obj, schema)
    return obj


def check(resource: Resource, version: str, obj: Mapping[str, Any]) -> None:
    """422 Invalid with every field error, as the apiserver validates a custom resource."""
    name = (obj.get("metadata") or {}).get("name", "")
    errors: list[FieldError] = objectmeta.validate_metadata(resource.key, obj.get("metadata") or {})
    body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}
    errors += validate(body, schema_of(resource, version))
    if errors:
        raise invalid_error(resource.kind, resource.group, name, errors)


def _spec_part(obj: Mapping[str, Any], keep_status: bool) -> dict[str, Any]:
    skip = {"metadata", "apiVersion", "kind"} | ({"status"} if keep_status else set())
    return {k: v for k, v in obj.items() if k not in skip}


def for_create(resource: Resource, obj: dict[str, Any]) -> dict[str, Any]:
    """With a status subresource, a create cannot set status; generation starts at 1."""
    if resource.has_status():
        obj.pop("status", None)
    obj.setdefault("metadata", {})["generation"] = 1
    return obj


def for_update(
    resource: Resource, current: Mapping[str, Any], updated: dict[str, Any], subresource: str
) -> dict[str, Any]:
    """The main resource cannot change status (with a status subresource), `/status` changes
    nothing but status; generation grows when anything but metadata (and status) changed."""
    status = resource.has_status()
    if subresource == "status":
        result = copy.deepcopy(dict(current))
        if "status" in updated:
            result["status"] = updated["status"]
        else:
            result.pop("status", None)
        result["metadata"] = copy.deepcopy(dict(current["metadata"]))
        return result
    if status:
        if "status" in current:
            updated["status"] = copy.deepcopy(current["status"])
        else:
            updated.pop("status", None)
    generation = int(current.get("metadata", {}).get("generation") or 1)
    if _spec_part(current, status) != _spec_part(updated, status):
        generation += 1
    updated.setdefault("metadata", {})["generation"] = generation
    return updated
