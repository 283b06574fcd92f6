"""Server-side printing: the `Table` kubectl asks for (`Accept: application/json;as=Table;...`).

kubectl prints what the apiserver's table convertors return; a plain object list only gets
NAME and AGE. These columns follow the apiserver's printers for pods, nodes and events
(kubernetes pkg/printers/internalversion/printers.go): priority 0 columns always, priority 1
with `-o wide`. Other kinds get Name and Age.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from .columns import _column, human_age

__all__ = ["human_age", "table", "wants_table"]

NONE = "<none>"


def wants_table(accept: str | None) -> bool:
    return bool(accept) and "as=Table" in accept


def _pod_status(pod: Mapping[str, Any]) -> str:
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return "Terminating"
    status = pod.get("status") or {}
    for container in status.get("containerStatuses") or []:
        state = container.get("state") or {}
        for key in ("waiting", "terminated"):
            if (state.get(key) or {}).get("reason"):
                return state[key]["reason"]
    return status.get("reason") or status.get("phase") or "Pending"


def _pod_row(pod: Mapping[str, Any]) -> list[Any]:
    status = pod.get("status") or {}
    containers = (pod.get("spec") or {}).get("containers") or []
    statuses = status.get("containerStatuses") or []
    ready = sum(1 for c in statuses if c.get("ready"))
    restarts = sum(int(c.get("restartCount") or 0) for c in statuses)
    return [
        pod["metadata"]["name"],
        f"{ready}/{len(containers)}",
        _pod_status(pod),
        restarts,
        human_age(pod["metadata"].get("creationTimestamp")),
        status.get("podIP") or NONE,
        (pod.get("spec") or {}).get("nodeName") or NONE,
        status.get("nominatedNodeName") or NONE,
        NONE,
    ]


def _node_row(node: Mapping[str, Any]) -> list[Any]:
    status = node.get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    state = "Ready" if ready else "NotReady"
    if (node.get("spec") or {}).get("unschedulable"):
        state += ",SchedulingDisabled"
    labels = (node.get("metadata") or {}).get("labels") or {}
    prefix = "node-role.kubernetes.io/"
    roles = sorted(k[len(prefix) :] for k in labels if k.startswith(prefix))
    addresses = {a.get("type"): a.get("address") for a in status.get("addresses") or []}
    info = status.get("nodeInfo") or {}
    return [
        node["metadata"]["name"],
        state,
        ",".join(roles) or NONE,
        human_age(node["metadata"].get("creationTimestamp")),
        info.get("kubeletVersion", ""),
        addresses.get("InternalIP") or NONE,
        addresses.get("ExternalIP") or NONE,
        info.get("osImage") or "<unknown>",
        info.get("kernelVersion") or "<unknown>",
        info.get("containerRuntimeVersion") or "<unknown>",
    ]


def _event_row(event: Mapping[str, Any]) -> list[Any]:
    involved = event.get("involvedObject") or {}
    source = event.get("source") or {}
    return [
        human_age(event.get("lastTimestamp") or event["metadata"].get("creationTimestamp")),
        event.get("type", ""),
        event.get("reason", ""),
        f"{str(involved.get('kind', '')).lower()}/{involved.get('name', '')}",
        involved.get("fieldPath", ""),
        source.get("component", ""),
        event.get("message", ""),
        human_age(event.get("firstTimestamp")),
        event.get("count", 1),
        event["metadata"]["name"],
    ]


def _default_row(obj: Mapping[str, Any]) -> list[Any]:
    return [obj["metadata"]["name"], human_age(obj["metadata"].get("creationTimestamp"))]


COLUMNS: dict[str, list[dict[str, Any]]] = {
    "pods": [
        _column("Name", fmt="name"),
        _column("Ready"),
        _column("Status"),
        _column("Restarts", "string"),
        _column("Age"),
        _column("IP", priority=1),
        _column("Node", priority=1),
        _column("Nominated Node", priority=1),
        _column("Readiness Gates", priority=1),
    ],
    "nodes": [
        _column("Name", fmt="name"),
        _column("Status"),
        _column("Roles"),
        _column("Age"),
        _column("Version"),
        _column("Internal-IP", priority=1),
        _column("External-IP", priority=1),
        _column("OS-Image", priority=1),
        _column("Kernel-Version", priority=1),
        _column("Container-Runtime", priority=1),
    ],
    "events": [
        _column("Last Seen"),
        _column("Type"),
        _column("Reason"),
        _column("Object"),
        _column("Subobject", priority=1),
        _column("Source", priority=1),
        _column("Message"),
        _column("First Seen", priority=1),
        _column("Count", "integer", priority=1),
        _column("Name", fmt="name", priority=1),
    ],
}
ROWS = {"pods": _pod_row, "nodes": _node_row, "events": _event_row}
DEFAULT_COLUMNS = [_column("Name", fmt="name"), _column("Age")]


def json_path(obj: Any, path: str) -> Any:
    """A printer column's simple JSONPath (`.status.readyReplicas`,
    `.spec.containers[0].image`, `.metadata.labels.app\\.kubernetes\\.io/name`); None when
    absent."""
    path = path.strip()
    if path.startswith("{") and path.endswith("}"):
        path = path[1:-1]
    parts = re.findall(r"\.((?:\\\.|[^.\[])+)|\[(\d+)\]|\['([^']*)'\]", path)
    value = obj
    for name, index, quoted in parts:
        if index:
            if not isinstance(value, list) or int(index) >= len(value):
                return None
            value = value[int(index)]
            continue
        key = quoted or name.replace("\\.", ".")
        if not isinstance(value, Mapping) or key not in value:
            return None
        value = value[key]
    return value


def _custom_cell(kind: str, value: Any) -> Any:
    """cellForJSONValue of apiextensions' table convertor: a date reads as an age."""
    if value is None:
        return None
    if kind == "date" and isinstance(value, str):
        return human_age(value)
    if kind in ("integer", "number") and isinstance(value, (int, float)):
        return value
    if kind == "boolean" and isinstance(value, bool):
        return value
    return value if isinstance(value, str) else json.dumps(value)


def custom_columns(resource: Any, version: str) -> tuple[list[dict[str, Any]], Any]:
    """A CRD version's additionalPrinterColumns after Name (else Name and Age)."""
    columns = resource.version_spec(version).get("additionalPrinterColumns") or []
    if not columns:
        return DEFAULT_COLUMNS, _default_row
    definitions = [_column("Name", fmt="name")] + [
        {
            "name": c["name"],
            "type": c.get("type", "string"),
            "format": c.get("format", ""),
            "description": c.get("description", ""),
            "priority": int(c.get("priority") or 0),
        }
        for c in columns
    ]

    def row(obj: Mapping[str, Any]) -> list[Any]:
        return [obj["metadata"]["name"]] + [
            _custom_cell(c.get("type", "string"), json_path(obj, c["jsonPath"])) for c in columns
        ]

    return definitions, row


def table(
    plural: str,
    objects: Iterable[Mapping[str, Any]],
    resource_version: str,
    resource: Any = None,
    version: str = "",
) -> dict:
    """A meta.k8s.io/v1 Table of `objects`, each row carrying the object's metadata."""
    if resource is not None and resource.custom:
        columns, row = custom_columns(resource, version or resource.storage)
    else:
        from .dra import printers  # the DRA kinds' columns (printers.go)

        columns = {**printers.COLUMNS, **COLUMNS}.get(plural, DEFAULT_COLUMNS)
        row = {**printers.ROWS, **ROWS}.get(plural, _default_row)
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": columns,
        "rows": [
            {
                "cells": row(obj),
                "object": {
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": obj.get("metadata") or {},
                },
            }
            for obj in objects
        ],
    }
