"""Field errors worded like apimachinery's `field.Error`, and the 422 Invalid they add up to.

`spec.replicas: Invalid value: "string": spec.replicas in body must be of type integer:
"string"` is `<field>: <type>: <value>: <detail>` (k8s.io/apimachinery/pkg/util/validation/
field/errors.go, ErrorBody); `apierrors.NewInvalid` joins several as `[a, b]`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .store import ApiError

#: error type -> (how it reads, the StatusCause type)
TYPES = {
    "Required": ("Required value", "FieldValueRequired"),
    "Invalid": ("Invalid value", "FieldValueInvalid"),
    "TypeInvalid": ("Invalid value", "FieldValueTypeInvalid"),
    "NotSupported": ("Unsupported value", "FieldValueNotSupported"),
    "Duplicate": ("Duplicate value", "FieldValueDuplicate"),
    "Forbidden": ("Forbidden", "FieldValueForbidden"),
    "TooLong": ("Too long", "FieldValueTooLong"),
    "TooMany": ("Too many", "FieldValueTooMany"),
    "NotFound": ("Not found", "FieldValueNotFound"),
}
#: types whose message leaves the value out
_NO_VALUE = {"Required", "Forbidden", "TooLong"}
_OMIT = object()


def go_value(value: Any) -> str:
    """A value as Go's %v / %q print it in a field error."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


@dataclass(frozen=True)
class FieldError:
    type: str  # a key of TYPES
    field: str
    value: Any = _OMIT
    detail: str = ""

    def body(self) -> str:
        text = TYPES[self.type][0]
        if self.type not in _NO_VALUE and self.value is not _OMIT:
            text += f": {go_value(self.value)}"
        if self.detail:
            text += f": {self.detail}"
        return text

    def __str__(self) -> str:
        return f"{self.field}: {self.body()}" if self.field else self.body()


def required(field: str, detail: str = "") -> FieldError:
    return FieldError("Required", field, detail=detail)


def invalid(field: str, value: Any, detail: str) -> FieldError:
    return FieldError("Invalid", field, value, detail)


def forbidden(field: str, detail: str) -> FieldError:
    return FieldError("Forbidden", field, detail=detail)


def not_supported(field: str, value: Any, allowed: list[str]) -> FieldError:
    return FieldError(
        "NotSupported",
        field,
        value,
        "supported values: " + ", ".join(json.dumps(a) for a in allowed),
    )


def duplicate(field: str, value: Any) -> FieldError:
    return FieldError("Duplicate", field, value)


def invalid_error(kind: str, group: str, name: str, errors: list[FieldError]) -> ApiError:
    """422 Invalid as apierrors.NewInvalid builds it: `Kind.group "name" is invalid: ...`."""
    qualified = f"{kind}.{group}" if group else kind
    aggregate = str(errors[0]) if len(errors) == 1 else "[" + ", ".join(map(str, errors)) + "]"
    details: dict[str, Any] = {
        "name": name,
        "kind": kind,
        "causes": [
            {"reason": TYPES[e.type][1], "message": e.body(), "field": e.field} for e in errors
        ],
    }
    if group:
        details["group"] = group
    return ApiError(422, "Invalid", f'{qualified} "{name}" is invalid: {aggregate}', details)
