"""CustomResourceDefinitions (apiextensions.k8s.io/v1): checked, defaulted and turned into a
served resource, as apiextensions-apiserver does (pkg/apis/apiextensions/validation,
v1/defaults.go, the establishing controller).

A CRD is checked beyond its OpenAPI schema: the name is `<plural>.<group>`, exactly one
storage version, a structural schema for every version, printer columns of known types.
Its status is set at once (NamesAccepted and Established True): there is no delay to wait
for, but `kubectl wait --for condition=established` works as on a real cluster.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any

from . import objectmeta
from .fielderrors import FieldError, duplicate, invalid, not_supported, required
from .resources import Resource, version_priority
from .store import now_iso
from .structural import structural_errors

_KIND = re.compile(r"[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?")
PRINTER_TYPES = ["boolean", "date", "integer", "number", "string"]
APPROVAL = "api-approved.kubernetes.io"


def set_defaults(crd: dict[str, Any]) -> dict[str, Any]:
    """apiextensions v1 defaulting: singular and listKind from the kind, conversion None."""
    spec = crd.setdefault("spec", {})
    names = spec.setdefault("names", {})
    kind = names.get("kind") or ""
    names.setdefault("singular", kind.lower())
    names.setdefault("listKind", f"{kind}List")
    spec.setdefault("conversion", {"strategy": "None"})
    for version in spec.get("versions") or []:
        if isinstance(version, dict):
            for column in version.get("additionalPrinterColumns") or []:
                if isinstance(column, dict):
                    column.setdefault("priority", 0)  # not defaulted upstream; kubectl reads 0
    return crd


def errors(crd: Mapping[str, Any]) -> list[FieldError]:
    """What the apiserver refuses in a CRD beyond its OpenAPI schema."""
    found: list[FieldError] = []
    meta = crd.get("metadata") or {}
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    group = spec.get("group") or ""
    plural = names.get("plural") or ""
    if meta.get("name") != f"{plural}.{group}":
        found.append(
            invalid(
                "metadata.name", meta.get("name", ""), 'must be spec.names.plural+"."+spec.group'
            )
        )
    if not group:
        found.append(required("spec.group"))
    elif "." not in group:
        found.append(invalid("spec.group", group, "should be a domain with at least one dot"))
    else:
        found += [invalid("spec.group", group, m) for m in objectmeta.dns1123_subdomain(group)]
        protected = group in ("k8s.io", "kubernetes.io") or group.endswith(
            (".k8s.io", ".kubernetes.io")
        )
        if protected and APPROVAL not in (meta.get("annotations") or {}):
            found.append(
                required(
                    f"metadata.annotations[{APPROVAL}]",
                    f'protected groups must have approval annotation "{APPROVAL}", see '
                    "https://github.com/kubernetes/enhancements/pull/1111",
                )
            )
    for key in ("plural", "singular"):
        value = names.get(key) or ""
        if not value and key == "plural":
            found.append(required("spec.names.plural"))
        elif value:
            found += [
                invalid(f"spec.names.{key}", value, m) for m in objectmeta.dns1035_label(value)
            ]
    for key in ("kind", "listKind"):
        value = names.get(key) or ""
        if not value:
            found.append(required(f"spec.names.{key}"))
        elif not _KIND.fullmatch(value):
            found.append(
                invalid(
                    f"spec.names.{key}",
                    value,
                    "may have mixed case, but should otherwise match: [a-z]([-a-z0-9]*[a-z0-9])?",
                )
            )
    for i, short in enumerate(names.get("shortNames") or []):
        found += [
            invalid(f"spec.names.shortNames[{i}]", short, m)
            for m in objectmeta.dns1035_label(short)
        ]
    if spec.get("scope") not in ("Cluster", "Namespaced"):
        found.append(not_supported("spec.scope", spec.get("scope", ""), ["Cluster", "Namespaced"]))
    if (spec.get("conversion") or {}).get("strategy", "None") != "None":
        found.append(
            not_supported("spec.conversion.strategy", spec["conversion"]["strategy"], ["None"])
        )
    found += _version_errors(spec.get("versions") or [])
    return found


def _version_errors(versions: list[Any]) -> list[FieldError]:
    found: list[FieldError] = []
    if not versions:
        return [
            required("spec.versions", "must have exactly one version marked as storage version")
        ]
    seen: set[str] = set()
    storage = [v.get("name") for v in versions if v.get("storage")]
    if len(storage) != 1:
        found.append(
            invalid(
                "spec.versions",
                [v.get("name") for v in versions],
                "must have exactly one version marked as storage version",
            )
        )
    if not any(v.get("served") for v in versions):
        found.append(
            invalid(
                "spec.versions",
                [v.get("name") for v in versions],
                "must have at least one version marked as served",
            )
        )
    for i, version in enumerate(versions):
        where = f"spec.versions[{i}]"
        name = version.get("name") or ""
        if name in seen:
            found.append(duplicate(f"{where}.name", name))
        seen.add(name)
        found += [invalid(f"{where}.name", name, m) for m in objectmeta.dns1035_label(name)]
        schema = (version.get("schema") or {}).get("openAPIV3Schema")
        if schema is None:
            found.append(required(f"{where}.schema.openAPIV3Schema", "schemas are required"))
        else:
            found += structural_errors(schema, f"{where}.schema.openAPIV3Schema")
        for j, column in enumerate(version.get("additionalPrinterColumns") or []):
            col = f"{where}.additionalPrinterColumns[{j}]"
            if not column.get("name"):
                found.append(required(f"{col}.name"))
            if column.get("type") not in PRINTER_TYPES:
                found.append(not_supported(f"{col}.type", column.get("type", ""), PRINTER_TYPES))
            if not column.get("jsonPath"):
                found.append(required(f"{col}.JSONPath"))
        status = (version.get("subresources") or {}).get("status")
        if status not in (None, {}):
            found.append(invalid(f"{where}.subresources.status", status, "must be empty"))
    return found


def _has_key(node: Any, key: str) -> bool:
    if isinstance(node, Mapping):
        return key in node or any(_has_key(v, key) for v in node.values())
    if isinstance(node, list):
        return any(_has_key(v, key) for v in node)
    return False


def unsupported(crd: Mapping[str, Any]) -> list[str]:
    """What the devcluster stores but does not act on: said as warnings on the CRD's write."""
    found = []
    for version in (crd.get("spec") or {}).get("versions") or []:
        name = version.get("name")
        if _has_key(version.get("schema"), "x-kubernetes-validations"):
            found.append(
                f"devcluster: {name}: x-kubernetes-validations (CEL) rules are not evaluated"
            )
        if (version.get("subresources") or {}).get("scale") is not None:
            found.append(f"devcluster: {name}: the scale subresource is not served")
        if version.get("selectableFields"):
            found.append(
                f"devcluster: {name}: selectableFields are not supported in field selectors"
            )
    return found


def immutable_errors(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[FieldError]:
    if (old.get("spec") or {}).get("scope") != (new.get("spec") or {}).get("scope"):
        return [invalid("spec.scope", (new.get("spec") or {}).get("scope"), "field is immutable")]
    return []


def with_status(crd: dict[str, Any], previous: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The status the establishing controller writes: names accepted, established."""
    crd = copy.deepcopy(crd)
    spec = crd["spec"]
    storage = next(v["name"] for v in spec["versions"] if v.get("storage"))
    stored = list(((previous or {}).get("status") or {}).get("storedVersions") or [])
    if storage not in stored:
        stored.append(storage)
    now = now_iso()
    crd["status"] = {
        "acceptedNames": copy.deepcopy(spec["names"]),
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
             "message": "no conflicts found", "lastTransitionTime": now},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
             "message": "the initial names have been accepted", "lastTransitionTime": now},
        ],
        "storedVersions": stored,
    }  # fmt: skip
    return crd


def resource_of(crd: Mapping[str, Any]) -> Resource:
    spec = crd["spec"]
    names = spec["names"]
    served = sorted((v["name"] for v in spec["versions"] if v.get("served")), key=version_priority)
    return Resource(
        group=spec["group"],
        plural=names["plural"],
        kind=names["kind"],
        namespaced=spec["scope"] == "Namespaced",
        versions=tuple(served),
        storage=next(v["name"] for v in spec["versions"] if v.get("storage")),
        singular=names.get("singular") or names["kind"].lower(),
        short_names=tuple(names.get("shortNames") or ()),
        categories=tuple(names.get("categories") or ()),
        crd_spec=copy.deepcopy(spec),
    )
