"""JSON Schemas of the Kubeflow objects the export writes (schemas/*.schema.json), written
from the CRD types cited in each schema's description; strict: an unknown field fails."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

SCHEMAS = Path(__file__).with_name("schemas")
#: (apiVersion, kind) or a name -> schema file
BY_KIND = {
    ("kubeflow.org/v1alpha1", "PodDefault"): "poddefault.schema.json",
    ("kubeflow.org/v1beta1", "WorkspaceKind"): "workspacekind-patch.schema.json",
    ("security.istio.io/v1", "AuthorizationPolicy"): "authorizationpolicy.schema.json",
    "spawner_ui_config": "spawner-ui-config.schema.json",
}


@cache
def _validator(filename: str) -> Any:
    import jsonschema
    from referencing import Registry, Resource

    resources = []
    for path in SCHEMAS.glob("*.schema.json"):
        schema = json.loads(path.read_text(encoding="utf-8"))
        resources.append((path.name, Resource.from_contents(schema)))
        resources.append((schema["$id"], Resource.from_contents(schema)))
    registry = Registry().with_resources(resources)
    schema = json.loads((SCHEMAS / filename).read_text(encoding="utf-8"))
    return jsonschema.Draft202012Validator(schema, registry=registry)


def errors(obj: Any, kind: str | None = None) -> list[str]:
    """Problems of one exported object ('path: message'), [] when it is valid. `kind` names a
    schema for objects without apiVersion/kind (the spawner_ui_config fragment)."""
    key: Any = kind or (obj.get("apiVersion"), obj.get("kind"))
    if key not in BY_KIND:
        raise KeyError(f"no schema for {key}")
    found = _validator(BY_KIND[key]).iter_errors(obj)
    return [
        f"{'.'.join(str(p) for p in e.absolute_path) or '(object)'}: {e.message}" for e in found
    ]
