"""Strategic merge patch (`application/strategic-merge-patch+json`), the patch kubectl sends
for built-in kinds (`kubectl apply` a second time, `kubectl label`, `kubectl edit`).

Like a JSON merge patch, except for lists the schema declares `x-kubernetes-patch-strategy:
merge`: those are merged element by element on their `x-kubernetes-patch-merge-key`
(containers and env by `name`, webhooks by `name`), or as a set for lists of scalars
(finalizers). Directives: `$patch: replace|delete` (on a map or a list element),
`$retainKeys`, `$deleteFromPrimitiveList/<field>`, `$setElementOrder/<field>`
(k8s.io/apimachinery/pkg/util/strategicpatch). The merge keys and strategies come from the
official OpenAPI schemas kubernetes-validate ships, the same that validate every object.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

_DELETE = object()


class PatchError(ValueError):
    pass


def _resolve(node: Any, defs: Mapping[str, Any]) -> Mapping[str, Any] | None:
    if not isinstance(node, Mapping):
        return None
    ref = node.get("$ref")
    if isinstance(ref, str) and "#/$defs/" in ref:
        return defs.get(ref.rsplit("/", 1)[-1])
    return node


def _child(node: Mapping[str, Any] | None, key: str, defs: Mapping[str, Any]) -> Any:
    """The schema of `key` inside an object schema (a property, or the map's values)."""
    node = _resolve(node, defs)
    if node is None:
        return None
    props = node.get("properties") or {}
    if key in props:
        return props[key]  # unresolved: the list's patch strategy sits on the property
    extra = node.get("additionalProperties")
    return extra if isinstance(extra, Mapping) else None


def _strip(value: Any) -> Any:
    """A patch value as it is stored: directives removed."""
    if isinstance(value, Mapping):
        return {k: _strip(v) for k, v in value.items() if not k.startswith("$")}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def apply(original: Any, patch: Any, schema: Mapping[str, Any], defs: Mapping[str, Any]) -> Any:
    """`patch` applied to a copy of `original` (a whole object) per `schema`."""
    if not isinstance(patch, Mapping):
        raise PatchError("a strategic merge patch must be a JSON object")
    merged = _merge_map(copy.deepcopy(original), patch, schema, defs)
    if merged is _DELETE:
        raise PatchError("a strategic merge patch may not delete the whole object")
    return merged


def _merge_map(original: Any, patch: Mapping[str, Any], schema: Any, defs: Mapping) -> Any:
    directive = patch.get("$patch")
    if directive == "delete":
        return _DELETE
    if directive == "replace":
        return _strip(patch)
    if directive is not None:
        raise PatchError(f"Unknown patch type: {directive!r} in map: {dict(patch)!r}")
    result = dict(original) if isinstance(original, Mapping) else {}
    orders: dict[str, list[Any]] = {}
    for key, value in patch.items():
        if key.startswith("$setElementOrder/"):
            orders[key.split("/", 1)[1]] = value
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            result[field] = [x for x in result.get(field) or [] if x not in (value or [])]
            continue
        if key.startswith("$"):
            continue
        if value is None:
            result.pop(key, None)
            continue
        sub = _child(schema, key, defs)
        strategy = str((sub or {}).get("x-kubernetes-patch-strategy") or "")
        if isinstance(value, list) and "merge" in strategy.split(","):
            result[key] = _merge_list(result.get(key) or [], value, sub, defs)
        elif isinstance(value, Mapping):
            merged = _merge_map(result.get(key), value, sub, defs)
            if merged is _DELETE:
                result.pop(key, None)
            else:
                result[key] = merged
        else:
            result[key] = _strip(value)
    for field, order in orders.items():
        if isinstance(result.get(field), list):
            sub = _resolve(_child(schema, field, defs), defs) or {}
            result[field] = _ordered(result[field], order, sub.get("x-kubernetes-patch-merge-key"))
    retain = patch.get("$retainKeys")
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    return result


def _merge_list(original: list[Any], patch: list[Any], schema: Any, defs: Mapping) -> list[Any]:
    schema = _resolve(schema, defs) or {}
    key = schema.get("x-kubernetes-patch-merge-key")
    items = schema.get("items")
    if any(isinstance(e, Mapping) and e.get("$patch") == "replace" for e in patch):
        return [_strip(e) for e in patch if not (isinstance(e, Mapping) and "$patch" in e)]
    if not key:  # a set of scalars (finalizers): union, in order
        return list(original) + [v for v in patch if v not in original]
    result = list(original)
    for element in patch:
        if not isinstance(element, Mapping) or key not in element:
            raise PatchError(f"map: {element!r} does not contain declared merge key: {key}")
        at = next(
            (
                i
                for i, e in enumerate(result)
                if isinstance(e, Mapping) and e.get(key) == element[key]
            ),
            None,
        )
        if element.get("$patch") == "delete":
            if at is not None:
                del result[at]
            continue
        if at is None:
            result.append(_strip(element))
        else:
            merged = _merge_map(result[at], element, items, defs)
            if merged is _DELETE:
                del result[at]
            else:
                result[at] = merged
    return result


def _ordered(values: list[Any], order: list[Any], key: str | None) -> list[Any]:
    """`$setElementOrder`: the listed elements in the patch's order, then the others."""

    def ident(value: Any) -> Any:
        return value.get(key) if key and isinstance(value, Mapping) else value

    wanted = [ident(o) for o in order]
    listed = sorted((v for v in values if ident(v) in wanted), key=lambda v: wanted.index(ident(v)))
    return listed + [v for v in values if ident(v) not in wanted]
