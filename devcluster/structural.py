"""Structural OpenAPI v3 schemas of CRDs: is a schema structural, and a custom resource's
pruning, defaulting and validation against it, as apiextensions-apiserver does them.

- Structural (apiextensions-apiserver pkg/apiserver/schema/validation.go, ValidateStructural):
  every field and array item has a `type` (unless int-or-string or preserve-unknown-fields),
  the root is an object, arrays have `items`, `metadata` may restrict only name and
  generateName, value validations (allOf/anyOf/oneOf/not) carry no structure.
- Pruning (schema/pruning/algorithm.go): fields the schema does not specify are dropped, except
  under `x-kubernetes-preserve-unknown-fields: true`; `apiVersion`, `kind` and `metadata` are
  kept at the root and in `x-kubernetes-embedded-resource` objects.
- Defaulting (schema/defaulting/algorithm.go): `default` fills a missing field, and a null in a
  field that is not `nullable`.
- Validation (kube-openapi's validator, then validation.go kubeOpenAPIResultToFieldErrors):
  type errors read `spec.replicas: Invalid value: "string": spec.replicas in body must be of
  type integer: "string"`.
"""

from __future__ import annotations

import base64
import copy
import ipaddress
import json
import re
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from .fielderrors import FieldError, forbidden, invalid, not_supported, required

#: ObjectMeta's fields: what survives in a custom resource's metadata
OBJECT_META = frozenset(
    {
        "name", "generateName", "namespace", "selfLink", "uid", "resourceVersion",
        "generation", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
        "labels", "annotations", "ownerReferences", "finalizers", "managedFields",
    }
)  # fmt: skip
_VALUE_VALIDATIONS = ("allOf", "anyOf", "oneOf", "not")


# ---------------------------------------------------------------- is the schema structural
def _child(path: str, key: str) -> str:
    return f"{path}.{key}"


def structural_errors(schema: Any, path: str) -> list[FieldError]:
    """What makes `schema` (an openAPIV3Schema) not structural; [] when it is."""
    if not isinstance(schema, Mapping):
        return [required(path, "must not be empty")]
    errors = _invariants(schema, "root", path)
    return sorted(errors, key=str)


def _invariants(s: Mapping[str, Any], level: str, path: str) -> list[FieldError]:
    errors: list[FieldError] = []
    kind = s.get("type", "")
    if "$ref" in s:
        errors.append(forbidden(_child(path, "$ref"), "$ref is not supported"))
    if kind == "array" and "items" not in s:
        errors.append(required(_child(path, "items"), "must be specified"))
    items = s.get("items")
    if isinstance(items, Mapping):
        errors += _invariants(items, "item", _child(path, "items"))
    elif isinstance(items, list):
        errors.append(
            forbidden(_child(path, "items"), "items must be a schema object and not an array")
        )
    for name, prop in (s.get("properties") or {}).items():
        if isinstance(prop, Mapping):
            errors += _invariants(prop, "field", f"{path}.properties[{name}]")
    additional = s.get("additionalProperties")
    if additional is not None:
        if level == "root":
            errors.append(
                forbidden(_child(path, "additionalProperties"), "must not be used at the root")
            )
        if s.get("properties"):
            errors.append(
                forbidden(
                    _child(path, "additionalProperties"),
                    "additionalProperties and properties are mutual exclusive",
                )
            )
        if isinstance(additional, Mapping):
            errors += _invariants(additional, "field", _child(path, "additionalProperties"))
    if s.get("uniqueItems") is True:
        errors.append(
            forbidden(
                _child(path, "uniqueItems"),
                "uniqueItems cannot be set to true since the runtime complexity becomes quadratic",
            )
        )
    int_or_string = s.get("x-kubernetes-int-or-string") is True
    preserve = s.get("x-kubernetes-preserve-unknown-fields") is True
    embedded = s.get("x-kubernetes-embedded-resource") is True
    if int_or_string and preserve:
        errors.append(
            invalid(
                _child(path, "x-kubernetes-preserve-unknown-fields"),
                True,
                "must be false if x-kubernetes-int-or-string is true",
            )
        )
    if embedded and kind != "object":
        if kind:
            errors.append(
                invalid(
                    _child(path, "type"),
                    kind,
                    "must be object if x-kubernetes-embedded-resource is true",
                )
            )
        else:
            errors.append(
                required(
                    _child(path, "type"), "must be object if x-kubernetes-embedded-resource is true"
                )
            )
    elif not kind and not int_or_string and not preserve:
        errors.append(
            required(
                _child(path, "type"),
                {
                    "root": "must not be empty at the root",
                    "item": "must not be empty for specified array items",
                    "field": "must not be empty for specified object fields",
                }[level],
            )
        )
    if level == "root" and kind and kind != "object":
        errors.append(invalid(_child(path, "type"), kind, "must be object at the root"))
    if level == "root" and "metadata" in (s.get("properties") or {}):
        meta = s["properties"]["metadata"]
        extra = set(meta.get("properties") or {}) - {"name", "generateName"}
        other = set(meta) - {"type", "properties", "description"}
        if extra or other or meta.get("type", "object") != "object":
            errors.append(
                forbidden(
                    f"{path}.properties[metadata]",
                    "must not specify anything other than name and generateName, but metadata "
                    "is implicitly specified",
                )
            )
    pattern = s.get("pattern")
    if isinstance(pattern, str):
        try:
            re.compile(pattern)
        except re.error as exc:
            errors.append(
                invalid(
                    _child(path, "pattern"),
                    pattern,
                    f"must be a valid regular expression, but isn't: {exc}",
                )
            )
    skip_any_of = _is_int_or_string_any_of(s)
    for junctor in _VALUE_VALIDATIONS:
        nested = s.get(junctor)
        if nested is None:
            continue
        for i, sub in enumerate(nested if isinstance(nested, list) else [nested]):
            where = f"{path}.{junctor}[{i}]" if junctor != "not" else f"{path}.not"
            if junctor == "anyOf" and skip_any_of:
                continue
            errors += _nested(sub, where)
    return errors


def _is_int_or_string_any_of(s: Mapping[str, Any]) -> bool:
    return s.get("anyOf") == [{"type": "integer"}, {"type": "string"}]


def _nested(s: Any, path: str) -> list[FieldError]:
    """Inside allOf/anyOf/oneOf/not: value validations only, no structure."""
    if not isinstance(s, Mapping):
        return []
    errors: list[FieldError] = []
    for key, detail in (
        ("type", "must be empty to be structural"),
        ("additionalProperties", "must be undefined to be structural"),
        ("default", "must be undefined to be structural"),
        ("title", "must be empty to be structural"),
        ("description", "must be empty to be structural"),
        ("x-kubernetes-list-map-keys", "must be empty to be structural"),
        ("x-kubernetes-list-type", "must be undefined to be structural"),
    ):
        if key in s:
            errors.append(forbidden(_child(path, key), detail))
    for key in (
        "nullable",
        "x-kubernetes-preserve-unknown-fields",
        "x-kubernetes-embedded-resource",
        "x-kubernetes-int-or-string",
    ):
        if s.get(key):
            errors.append(forbidden(_child(path, key), "must be false to be structural"))
    if "metadata" in (s.get("properties") or {}):
        errors.append(
            forbidden(f"{path}.properties[metadata]", "must not be specified in a nested context")
        )
    for name, prop in (s.get("properties") or {}).items():
        errors += _nested(prop, f"{path}.properties[{name}]")
    if isinstance(s.get("items"), Mapping):
        errors += _nested(s["items"], _child(path, "items"))
    return errors


# ---------------------------------------------------------------- pruning
def prune(obj: dict[str, Any], schema: Mapping[str, Any]) -> list[str]:
    """Drop what `schema` does not specify (in place); the dropped fields' paths, in order."""
    dropped: list[str] = []
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        for key in [k for k in meta if k not in OBJECT_META]:
            del meta[key]
            dropped.append(f"metadata.{key}")
    _prune(obj, schema, "", True, dropped)
    return dropped


def _prune(
    value: Any, s: Mapping[str, Any] | None, path: str, resource: bool, dropped: list
) -> None:
    if s is None:
        return
    preserve = s.get("x-kubernetes-preserve-unknown-fields") is True
    if isinstance(value, dict):
        props = s.get("properties") or {}
        additional = s.get("additionalProperties")
        for key in list(value):
            where = f"{path}.{key}" if path else key
            if resource and key in ("apiVersion", "kind", "metadata"):
                continue
            if key in props:
                sub = props[key]
                _prune(
                    value[key],
                    sub,
                    where,
                    sub.get("x-kubernetes-embedded-resource") is True,
                    dropped,
                )
            elif isinstance(additional, Mapping):
                _prune(
                    value[key],
                    additional,
                    where,
                    additional.get("x-kubernetes-embedded-resource") is True,
                    dropped,
                )
            elif additional is True or preserve:
                continue
            else:
                del value[key]
                dropped.append(where)
    elif isinstance(value, list):
        items = s.get("items")
        if isinstance(items, Mapping):
            for i, item in enumerate(value):
                _prune(
                    item,
                    items,
                    f"{path}[{i}]",
                    items.get("x-kubernetes-embedded-resource") is True,
                    dropped,
                )


# ---------------------------------------------------------------- defaulting
def apply_defaults(value: Any, s: Mapping[str, Any] | None) -> Any:
    """Fill `default`s in place: missing fields, and nulls in fields that are not nullable."""
    if s is None:
        return value
    if isinstance(value, dict):
        props = s.get("properties") or {}
        for key, sub in props.items():
            if not isinstance(sub, Mapping) or "default" not in sub:
                continue
            if key not in value or (value[key] is None and not sub.get("nullable")):
                value[key] = copy.deepcopy(sub["default"])
        for key, item in value.items():
            if key in props:
                apply_defaults(item, props[key])
            elif isinstance(s.get("additionalProperties"), Mapping):
                apply_defaults(item, s["additionalProperties"])
    elif isinstance(value, list) and isinstance(s.get("items"), Mapping):
        for item in value:
            apply_defaults(item, s["items"])
    return value


# ---------------------------------------------------------------- validation
def type_name(value: Any) -> str:
    """The JSON type of a decoded value, as kube-openapi's validator names it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return "integer"  # the apiserver's JSON decoding makes whole numbers int64
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _type_ok(value: Any, s: Mapping[str, Any]) -> bool:
    actual = type_name(value)
    if actual == "null":
        return bool(s.get("nullable"))
    if s.get("x-kubernetes-int-or-string"):
        return actual in ("integer", "string")
    wanted = s.get("type")
    if not wanted:
        return True
    return actual == wanted or (wanted == "number" and actual == "integer")


_FORMATS = {
    "date-time": lambda v: _parses(lambda: datetime.fromisoformat(v.replace("Z", "+00:00"))),
    "datetime": lambda v: _parses(lambda: datetime.fromisoformat(v.replace("Z", "+00:00"))),
    "date": lambda v: _parses(lambda: datetime.strptime(v, "%Y-%m-%d")),
    "uuid": lambda v: _parses(lambda: uuid.UUID(v)),
    "byte": lambda v: _parses(lambda: base64.b64decode(v, validate=True)),
    "ipv4": lambda v: _parses(lambda: ipaddress.IPv4Address(v)),
    "ipv6": lambda v: _parses(lambda: ipaddress.IPv6Address(v)),
    "cidr": lambda v: _parses(lambda: ipaddress.ip_network(v, strict=False)),
}


def _parses(fn: Any) -> bool:
    try:
        fn()
    except (ValueError, TypeError):
        return False
    return True


def validate(value: Any, s: Mapping[str, Any], path: str = "") -> list[FieldError]:
    """Every error of `value` against schema `s` (the object below the root: pass path="")."""
    errors: list[FieldError] = []
    _validate(value, s, path, errors)
    return errors


def _body(path: str) -> str:
    return path or "."


def _validate(value: Any, s: Mapping[str, Any], path: str, errors: list[FieldError]) -> None:
    if not isinstance(s, Mapping):
        return
    if not _type_ok(value, s):
        actual = type_name(value)
        wanted = "integer,string" if s.get("x-kubernetes-int-or-string") else s.get("type", "")
        errors.append(
            FieldError(
                "TypeInvalid",
                path,
                actual,
                f"{_body(path)} in body must be of type {wanted}: {json.dumps(actual)}",
            )
        )
        return
    if value is None:
        return
    if "enum" in s and value not in s["enum"]:
        allowed = [e if isinstance(e, str) else json.dumps(e) for e in s["enum"]]
        errors.append(not_supported(path, value, allowed))
    kind = type_name(value)
    if kind in ("integer", "number"):
        _numbers(value, s, path, errors)
    elif kind == "string":
        _strings(value, s, path, errors)
    elif kind == "array":
        _arrays(value, s, path, errors)
    elif kind == "object":
        _objects(value, s, path, errors)
    _junctors(value, s, path, errors)


def _numbers(value: float, s: Mapping[str, Any], path: str, errors: list[FieldError]) -> None:
    where = _body(path)
    low, high = s.get("minimum"), s.get("maximum")
    if low is not None:
        if s.get("exclusiveMinimum") and not value > low:
            errors.append(invalid(path, value, f"{where} in body should be greater than {low}"))
        elif not s.get("exclusiveMinimum") and value < low:
            errors.append(
                invalid(path, value, f"{where} in body should be greater than or equal to {low}")
            )
    if high is not None:
        if s.get("exclusiveMaximum") and not value < high:
            errors.append(invalid(path, value, f"{where} in body should be less than {high}"))
        elif not s.get("exclusiveMaximum") and value > high:
            errors.append(
                invalid(path, value, f"{where} in body should be less than or equal to {high}")
            )
    step = s.get("multipleOf")
    if step and (value / step) != int(value / step):
        errors.append(invalid(path, value, f"{where} in body should be a multiple of {step}"))


def _strings(value: str, s: Mapping[str, Any], path: str, errors: list[FieldError]) -> None:
    where = _body(path)
    if s.get("maxLength") is not None and len(value) > s["maxLength"]:
        errors.append(
            FieldError("TooLong", path, value, f"may not be longer than {s['maxLength']}")
        )
    if s.get("minLength") is not None and len(value) < s["minLength"]:
        errors.append(
            invalid(path, value, f"{where} in body should be at least {s['minLength']} chars long")
        )
    if s.get("pattern") and re.search(s["pattern"], value) is None:
        errors.append(invalid(path, value, f"{where} in body should match '{s['pattern']}'"))
    check = _FORMATS.get(s.get("format", ""))
    if check and not s.get("x-kubernetes-int-or-string") and not check(value):
        errors.append(
            FieldError(
                "TypeInvalid",
                path,
                value,
                f"{where} in body must be of type {s['format']}: {json.dumps(value)}",
            )
        )


def _arrays(value: list, s: Mapping[str, Any], path: str, errors: list[FieldError]) -> None:
    where = _body(path)
    if s.get("maxItems") is not None and len(value) > s["maxItems"]:
        errors.append(
            FieldError("TooMany", path, len(value), f"must have at most {s['maxItems']} items")
        )
    if s.get("minItems") is not None and len(value) < s["minItems"]:
        errors.append(
            invalid(path, value, f"{where} in body should have at least {s['minItems']} items")
        )
    if s.get("x-kubernetes-list-type") in ("set", "map"):
        keys = s.get("x-kubernetes-list-map-keys") or []
        seen: list[Any] = []
        for i, item in enumerate(value):
            ident = tuple(item.get(k) for k in keys) if keys and isinstance(item, Mapping) else item
            if ident in seen:
                shown = (
                    {k: item.get(k) for k in keys} if keys and isinstance(item, Mapping) else item
                )
                errors.append(FieldError("Duplicate", f"{path}[{i}]", shown))
            seen.append(ident)
    items = s.get("items")
    if isinstance(items, Mapping):
        for i, item in enumerate(value):
            _validate(item, items, f"{path}[{i}]", errors)


def _objects(value: dict, s: Mapping[str, Any], path: str, errors: list[FieldError]) -> None:
    where = _body(path)
    for name in s.get("required") or []:
        if name not in value:
            errors.append(required(f"{path}.{name}" if path else name))
    if s.get("maxProperties") is not None and len(value) > s["maxProperties"]:
        errors.append(
            FieldError("TooMany", path, len(value), f"must have at most {s['maxProperties']} items")
        )
    if s.get("minProperties") is not None and len(value) < s["minProperties"]:
        errors.append(
            invalid(
                path, value, f"{where} in body should have at least {s['minProperties']} properties"
            )
        )
    props = s.get("properties") or {}
    additional = s.get("additionalProperties")
    for key, item in value.items():
        where_key = f"{path}.{key}" if path else key
        if key in props:
            if path == "" and key == "metadata":
                continue  # ObjectMeta is validated as ObjectMeta, not by the CRD's schema
            _validate(item, props[key], where_key, errors)
        elif isinstance(additional, Mapping):
            _validate(item, additional, where_key, errors)


def _matches(value: Any, s: Mapping[str, Any], path: str) -> bool:
    found: list[FieldError] = []
    _validate(value, s, path, found)
    return not found


def _junctors(value: Any, s: Mapping[str, Any], path: str, errors: list[FieldError]) -> None:
    where = json.dumps(_body(path))
    for sub in s.get("allOf") or []:
        _validate(value, sub, path, errors)
    if s.get("anyOf") and not _is_int_or_string_any_of(s):
        if not any(_matches(value, sub, path) for sub in s["anyOf"]):
            errors.append(
                invalid(path, value, f"{where} must validate at least one schema (anyOf)")
            )
    if s.get("oneOf"):
        count = sum(1 for sub in s["oneOf"] if _matches(value, sub, path))
        if count != 1:
            errors.append(
                invalid(path, value, f"{where} must validate one and only one schema (oneOf)")
            )
    if isinstance(s.get("not"), Mapping) and _matches(value, s["not"], path):
        errors.append(invalid(path, value, f"{where} must not validate the schema (not)"))
