"""RFC 6902 JSON Patch, with the error wording of evanphx/json-patch (what the apiserver uses
for `application/json-patch+json` PATCH requests and for mutating webhooks' patches)."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any


class PatchError(ValueError):
    """A patch that cannot be decoded or does not apply to the document."""


def _pointer(path: Any) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise PatchError(f'JSON pointer must be empty or start with a "/": {path!r}')
    return [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]] if path else []


def _index(container: list, token: str, path: str, *, insert: bool = False) -> int:
    if insert and token == "-":
        return len(container)
    if not token.isdigit() or (len(token) > 1 and token.startswith("0")):
        raise PatchError(f"doc is missing path: {path!r}: invalid index {token!r}")
    index = int(token)
    if index > len(container) or (index == len(container) and not insert):
        raise PatchError(f'doc is missing path: "{path}": missing value')
    return index


def _parent(doc: Any, parts: list[str], path: str, op: str) -> tuple[Any, str]:
    node = doc
    for token in parts[:-1]:
        if isinstance(node, list):
            if not token.isdigit() or int(token) >= len(node):
                raise PatchError(
                    f'{op} operation does not apply: doc is missing path: "{path}": missing value'
                )
            node = node[int(token)]
        elif isinstance(node, dict) and token in node:
            node = node[token]
        else:
            raise PatchError(
                f'{op} operation does not apply: doc is missing path: "{path}": missing value'
            )
    if not isinstance(node, (dict, list)):
        raise PatchError(
            f'{op} operation does not apply: doc is missing path: "{path}": missing value'
        )
    return node, parts[-1]


def _get(doc: Any, path: str, op: str) -> Any:
    node = doc
    for token in _pointer(path):
        if isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        elif isinstance(node, dict) and token in node:
            node = node[token]
        else:
            raise PatchError(
                f'{op} operation does not apply: doc is missing path: "{path}": missing value'
            )
    return node


def _add(doc: Any, path: str, value: Any) -> Any:
    parts = _pointer(path)
    if not parts:
        return copy.deepcopy(value)
    parent, key = _parent(doc, parts, path, "add")
    if isinstance(parent, list):
        try:
            parent.insert(_index(parent, key, path, insert=True), copy.deepcopy(value))
        except PatchError as exc:
            raise PatchError(f"add operation does not apply: {exc}") from None
    else:
        parent[key] = copy.deepcopy(value)
    return doc


def _remove(doc: Any, path: str, op: str = "remove") -> tuple[Any, Any]:
    parts = _pointer(path)
    if not parts:
        raise PatchError(f"{op} operation does not apply: cannot remove the whole document")
    parent, key = _parent(doc, parts, path, op)
    if isinstance(parent, list):
        try:
            index = _index(parent, key, path)
        except PatchError as exc:
            raise PatchError(f"{op} operation does not apply: {exc}") from None
        return doc, parent.pop(index)
    if key not in parent:
        raise PatchError(
            f'{op} operation does not apply: doc is missing path: "{path}": missing value'
        )
    return doc, parent.pop(key)


def decode(patch: Any) -> list[Mapping[str, Any]]:
    """The operations of a patch, or PatchError as evanphx's DecodePatch words it."""
    if not isinstance(patch, Sequence) or isinstance(patch, (str, bytes)):
        kind = type(patch).__name__ if patch is not None else "null"
        raise PatchError(f"json: cannot unmarshal {kind} into Go value of type jsonpatch.Patch")
    for op in patch:
        if not isinstance(op, Mapping):
            raise PatchError(
                "json: cannot unmarshal non-object into Go value of type jsonpatch.Operation"
            )
    return list(patch)


def apply(doc: Any, patch: Any) -> Any:
    """The patched copy of `doc`; `doc` itself is left alone."""
    doc = copy.deepcopy(doc)
    for op in decode(patch):
        kind = op.get("op")
        path = op.get("path")
        if path is None:
            raise PatchError(f"{kind} operation failed to decode path")
        if kind == "add":
            if "value" not in op:
                raise PatchError("add operation does not apply: missing value")
            doc = _add(doc, path, op["value"])
        elif kind == "remove":
            doc, _ = _remove(doc, path)
        elif kind == "replace":
            if "value" not in op:
                raise PatchError("replace operation does not apply: missing value")
            if not _pointer(path):
                doc = copy.deepcopy(op["value"])
                continue
            parent, key = _parent(doc, _pointer(path), path, "replace")
            if isinstance(parent, list):
                try:
                    parent[_index(parent, key, path)] = copy.deepcopy(op["value"])
                except PatchError:
                    raise PatchError(
                        f"replace operation does not apply: doc is missing key: "
                        f"{path}: missing value"
                    ) from None
            elif key in parent:
                parent[key] = copy.deepcopy(op["value"])
            else:
                raise PatchError(
                    f"replace operation does not apply: doc is missing key: {path}: missing value"
                )
        elif kind in ("move", "copy"):
            source = op.get("from")
            if source is None:
                raise PatchError(f"{kind} operation failed to decode from")
            if kind == "move":
                if path.startswith(source + "/"):
                    raise PatchError(
                        f"move operation does not apply: cannot move {source!r} "
                        f"into its own child {path!r}"
                    )
                doc, value = _remove(doc, source, "move")
            else:
                value = _get(doc, source, "copy")
            doc = _add(doc, path, value)
        elif kind == "test":
            if _get(doc, path, "test") != op.get("value"):
                raise PatchError(f"testing value {path} failed: test failed")
        else:
            raise PatchError(f"Unexpected kind: {kind}")
    return doc
