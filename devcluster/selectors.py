"""Kubernetes label and field selectors, parsed once and matched against plain dicts."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

Matcher = Callable[[Mapping[str, Any]], bool]

_SET_EXPR = re.compile(r"^\s*(!?)\s*([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")
_EQ_EXPR = re.compile(r"^\s*([\w./-]+)\s*(==|=|!=)\s*([\w./-]*)\s*$")
_EXISTS = re.compile(r"^\s*(!?)\s*([\w./-]+)\s*$")


class SelectorError(ValueError):
    pass


def _split(selector: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    parts, depth, current = [], 0, ""
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    if current.strip():
        parts.append(current)
    return [p for p in parts if p.strip()]


def parse_label_selector(selector: str | None) -> Matcher:
    """`a=b,c!=d,e in (x,y),f notin (z),g,!h` -> a predicate on a labels dict."""
    if not selector:
        return lambda labels: True
    tests: list[Matcher] = []
    for part in _split(selector):
        if m := _SET_EXPR.match(part):
            _, key, op, values = m.groups()
            allowed = {v.strip() for v in values.split(",") if v.strip()}
            if op == "in":
                tests.append(lambda lb, k=key, a=allowed: lb.get(k) in a)
            else:
                tests.append(lambda lb, k=key, a=allowed: lb.get(k) not in a)
        elif m := _EQ_EXPR.match(part):
            key, op, value = m.groups()
            if op == "!=":
                tests.append(lambda lb, k=key, v=value: lb.get(k) != v)
            else:
                tests.append(lambda lb, k=key, v=value: lb.get(k) == v)
        elif m := _EXISTS.match(part):
            negate, key = m.groups()
            if negate:
                tests.append(lambda lb, k=key: k not in lb)
            else:
                tests.append(lambda lb, k=key: k in lb)
        else:
            raise SelectorError(f"unable to parse requirement: {part.strip()!r}")
    return lambda labels: all(t(labels) for t in tests)


def _field(obj: Mapping[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        if not isinstance(value, Mapping):
            return ""
        value = value.get(part)
    return "" if value is None else str(value)


# Fields the apiserver supports per kind (a subset; unknown fields are a 400 there too).
SUPPORTED_FIELDS = {
    "pods": {
        "metadata.name",
        "metadata.namespace",
        "status.phase",
        "spec.nodeName",
        "spec.schedulerName",
        "status.podIP",
    },
    "events": {
        "metadata.name",
        "metadata.namespace",
        "involvedObject.kind",
        "involvedObject.name",
        "involvedObject.namespace",
        "involvedObject.uid",
        "reason",
        "reportingComponent",
        "type",
        "source",
    },
}
# field labels that are not the object's path (kubernetes pkg/registry/core/event/strategy.go)
FIELD_PATHS = {"source": "source.component"}
_DEFAULT_FIELDS = {"metadata.name", "metadata.namespace"}


def parse_field_selector(selector: str | None, kind: str) -> Matcher:
    """`metadata.name=x,status.phase!=Failed` -> a predicate on the whole object."""
    if not selector:
        return lambda obj: True
    supported = SUPPORTED_FIELDS.get(kind, _DEFAULT_FIELDS)
    tests: list[Matcher] = []
    for part in _split(selector):
        m = _EQ_EXPR.match(part)
        if not m:
            raise SelectorError(f"invalid field selector: {part.strip()!r}")
        key, op, value = m.groups()
        if key not in supported:
            raise SelectorError(f"field label not supported: {key}")
        path = FIELD_PATHS.get(key, key)
        if op == "!=":
            tests.append(lambda o, k=path, v=value: _field(o, k) != v)
        else:
            tests.append(lambda o, k=path, v=value: _field(o, k) == v)
    return lambda obj: all(t(obj) for t in tests)


def match_label_selector(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector (`matchLabels` and `matchExpressions`) against a labels dict; an
    empty selector matches everything (webhooks' namespaceSelector and objectSelector)."""
    if not selector:
        return True
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True
