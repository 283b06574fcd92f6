"""Helpers for tests/test_chart.py: rendering the Helm chart with Helm's own Go code
(helm-python-sdk), finding the lint tools, and keeping the chart's values schema in step with
the product's catalog schema.

`python -m tests.chart_support --write-schema` re-embeds fracspawner's catalog JSON Schema into
charts/fracspawner/values.schema.json after the catalog schema changed.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "charts" / "fracspawner"
VALUES_SCHEMA = CHART / "values.schema.json"
RELEASE = "fracspawner"
NAMESPACE = "jhub"
#: the Kubernetes version the chart is linted and its objects validated against
#: (the devcluster's, devcluster/validation.py K8S_VERSION)
KUBE_VERSION = "1.33.0"


def _catalog_schema_path() -> Path:
    import fracspawner

    found = sorted(Path(fracspawner.__file__).parent.rglob("catalog.schema.json"))
    assert found, "fracspawner ships no catalog.schema.json"
    return found[0]


CATALOG_SCHEMA = _catalog_schema_path()


def _rewrite_refs(node: Any, prefix: str) -> Any:
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str) and value.startswith("#/$defs/"):
                out[key] = "#/$defs/" + prefix + value[len("#/$defs/") :]
            else:
                out[key] = _rewrite_refs(value, prefix)
        return out
    if isinstance(node, list):
        return [_rewrite_refs(v, prefix) for v in node]
    return node


def embed_catalog_schema(values_schema: Mapping[str, Any], catalog: Mapping[str, Any]) -> dict:
    """The chart's values schema with `catalog` validated by the product's catalog schema:
    the catalog's $defs become `catalog_*` $defs of the values schema, its body the schema of
    a non-empty `catalog` (Helm validates values with JSON Schema 2020-12, local refs)."""
    schema = copy.deepcopy(dict(values_schema))
    body = {k: v for k, v in catalog.items() if k not in ("$schema", "$id", "$defs", "title")}
    body = _rewrite_refs(body, "catalog_")
    defs = {k: v for k, v in schema.get("$defs", {}).items() if not k.startswith("catalog_")}
    for name, sub in catalog.get("$defs", {}).items():
        defs["catalog_" + name] = _rewrite_refs(sub, "catalog_")
    schema["$defs"] = defs
    schema["properties"] = dict(schema["properties"])
    # {} (the default) means the chart's files/default-catalog.yaml; anything else is a catalog
    schema["properties"]["catalog"] = {
        "description": "The fracspawner catalog; {} for the chart's default catalog.",
        "type": "object",
        "if": {"minProperties": 1},
        "then": body,
    }
    return schema


def expected_values_schema() -> dict:
    current = json.loads(VALUES_SCHEMA.read_text())
    return embed_catalog_schema(current, json.loads(CATALOG_SCHEMA.read_text()))


def render(values: Mapping[str, Any] | None = None, **opts: Any) -> dict[str, str]:
    """template path -> rendered text, as `helm template` (an install, no cluster)."""
    import helm_python as helm

    with helm.Chart.load(str(CHART)) as chart:
        return chart.render(
            dict(values or {}),
            name=opts.get("name", RELEASE),
            namespace=opts.get("namespace", NAMESPACE),
            is_install=True,
        )


def objects(rendered: Mapping[str, str]) -> list[dict]:
    """Every Kubernetes object of a render (NOTES.txt and empty documents left out)."""
    out = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                out.append(doc)
    return out


def by_kind(objs: list[dict], kind: str) -> list[dict]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: list[dict], kind: str, component: str) -> dict:
    found = [
        o
        for o in objs
        if o["kind"] == kind
        and o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component
    ]
    assert len(found) == 1, (kind, component, [o["metadata"]["name"] for o in found])
    return found[0]


def pod_specs(objs: list[dict]) -> Iterator[tuple[dict, dict]]:
    """(workload, pod spec) of every Deployment."""
    for o in by_kind(objs, "Deployment"):
        yield o, o["spec"]["template"]["spec"]


def tool(name: str, *venvs: str) -> str | None:
    """A console script from this environment, one of the named venvs, or PATH."""
    candidates = [Path(sys.executable).parent / name]
    candidates += [REPO / venv / "bin" / name for venv in venvs]
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    return shutil.which(name)


def main(argv: list[str]) -> int:
    if argv != ["--write-schema"]:
        print("usage: python -m tests.chart_support --write-schema", file=sys.stderr)
        return 2
    VALUES_SCHEMA.write_text(json.dumps(expected_values_schema(), indent=2) + "\n")
    print(f"wrote {VALUES_SCHEMA.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
