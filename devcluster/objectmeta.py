"""ObjectMeta validation every object gets: names, label keys and values, annotation keys and
size, worded as k8s.io/apimachinery's validation (util/validation/validation.go,
api/validation/objectmeta.go). kubernetes-validate's schemas only check types, so without this
a 100-character label value would be stored where a real apiserver refuses it."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .fielderrors import FieldError, invalid, required

_QUALIFIED = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_LABEL_VALUE = rf"({_QUALIFIED})?"
_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = rf"{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*"
_DNS1035_LABEL = r"[a-z]([-a-z0-9]*[a-z0-9])?"
ANNOTATIONS_LIMIT = 256 * 1024  # TotalAnnotationSizeLimitB


def _regex_error(message: str, pattern: str, *examples: str) -> str:
    # apimachinery's RegexError: examples joined with ",  or " (two spaces), then the regex
    shown = ",  or ".join(f"'{e}'" for e in examples)
    return f"{message} (e.g. {shown}, regex used for validation is '{pattern}')"


def _full(pattern: str, value: str) -> bool:
    return re.fullmatch(pattern, value) is not None


def _checked(value: str, limit: int, pattern: str, message: str, *examples: str) -> list[str]:
    """apimachinery's usual pair: MaxLenError past `limit`, then RegexError (both may apply)."""
    errors = []
    if len(value) > limit:
        errors.append(f"must be no more than {limit} characters")
    if not _full(pattern, value):
        errors.append(_regex_error(message, pattern, *examples))
    return errors


def dns1123_subdomain(value: str) -> list[str]:
    return _checked(
        value,
        253,
        _DNS1123_SUBDOMAIN,
        "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
        "characters, '-' or '.', and must start and end with an alphanumeric character",
        "example.com",
    )


def dns1123_label(value: str) -> list[str]:
    return _checked(
        value,
        63,
        _DNS1123_LABEL,
        "a lowercase RFC 1123 label must consist of lower case alphanumeric characters "
        "or '-', and must start and end with an alphanumeric character",
        "my-name",
        "123-abc",
    )


def dns1035_label(value: str) -> list[str]:
    return _checked(
        value,
        63,
        _DNS1035_LABEL,
        "a DNS-1035 label must consist of lower case alphanumeric characters or '-', "
        "start with an alphabetic character, and end with an alphanumeric character",
        "my-name",
        "abc-123",
    )


# IsQualifiedName's wording for the name part, also part of its message for a malformed key
_QUALIFIED_ERROR = _regex_error(
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character",
    _QUALIFIED,
    "MyName",
    "my.name",
    "123-abc",
)


def qualified_name(value: str) -> list[str]:
    """A label or annotation key: `[prefix/]name` (IsQualifiedName)."""
    errors = []
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            errors.append("prefix part must be non-empty")
        else:
            errors += ["prefix part " + m for m in dns1123_subdomain(prefix)]
    else:
        return [
            "a qualified name "
            + _QUALIFIED_ERROR
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    if not name:
        errors.append("name part must be non-empty")
    elif len(name) > 63:
        errors.append("name part must be no more than 63 characters")
    if not _full(_QUALIFIED, name):
        errors.append("name part " + _QUALIFIED_ERROR)
    return errors


def label_value(value: str) -> list[str]:
    return _checked(
        value,
        63,
        _LABEL_VALUE,
        "a valid label must be an empty string or consist of alphanumeric characters, "
        "'-', '_' or '.', and must start and end with an alphanumeric character",
        "MyValue",
        "my_value",
        "12345",
    )


#: how each kind's name is checked (ValidatePodName, ValidateNamespaceName, ...)
NAME_RULES = {"namespaces": dns1123_label, "services": dns1035_label}


def validate_metadata(plural: str, meta: Mapping[str, Any]) -> list[FieldError]:
    """The ObjectMeta errors of one object (empty when it is fine)."""
    errors: list[FieldError] = []
    name = meta.get("name")
    if not name and not meta.get("generateName"):
        errors.append(required("metadata.name", "name or generateName is required"))
    if isinstance(name, str) and name:
        rule = NAME_RULES.get(plural, dns1123_subdomain)
        errors += [invalid("metadata.name", name, m) for m in rule(name)]
    labels = meta.get("labels") or {}
    if isinstance(labels, Mapping):
        for key, value in labels.items():
            errors += [invalid("metadata.labels", key, m) for m in qualified_name(str(key))]
            if isinstance(value, str):
                errors += [invalid("metadata.labels", value, m) for m in label_value(value)]
    annotations = meta.get("annotations") or {}
    if isinstance(annotations, Mapping):
        size = 0
        for key, value in annotations.items():
            errors += [
                invalid("metadata.annotations", key, m) for m in qualified_name(str(key).lower())
            ]
            size += len(str(key)) + len(str(value))
        if size > ANNOTATIONS_LIMIT:
            errors.append(
                FieldError(
                    "TooLong",
                    "metadata.annotations",
                    "",
                    f"must have at most {ANNOTATIONS_LIMIT} bytes",
                )
            )
    return errors
