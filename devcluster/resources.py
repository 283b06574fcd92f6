"""The resources the devcluster serves: the built-in kinds and those CRDs add at run time.

A resource is stored under one key: its plural for the core group (`pods`), `plural.group`
otherwise (`notebooks.kubeflow.org`), as kubectl writes a fully qualified resource name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Resource:
    group: str  # "" for the core group
    plural: str
    kind: str
    namespaced: bool
    versions: tuple[str, ...]  # served versions, the preferred one first
    storage: str  # the version objects are stored in
    singular: str = ""
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    #: for custom resources: the CRD's `spec` (schemas, printer columns, subresources)
    crd_spec: Mapping[str, Any] | None = field(default=None, compare=False, hash=False)
    #: a built-in kind with a `status` subresource (resourceclaims)
    status: bool = False

    @property
    def key(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def api_version(self, version: str | None = None) -> str:
        version = version or self.storage
        return f"{self.group}/{version}" if self.group else version

    @property
    def custom(self) -> bool:
        return self.crd_spec is not None

    def version_spec(self, version: str) -> Mapping[str, Any]:
        """The CRD's entry for one version (empty for built-ins)."""
        for entry in (self.crd_spec or {}).get("versions") or []:
            if entry.get("name") == version:
                return entry
        return {}

    def has_status(self, version: str | None = None) -> bool:
        if self.status:
            return True
        subresources = self.version_spec(version or self.storage).get("subresources") or {}
        return "status" in subresources


def _core(plural: str, kind: str, namespaced: bool, *short: str) -> Resource:
    return Resource("", plural, kind, namespaced, ("v1",), "v1", kind.lower(), short)


def _grouped(group: str, plural: str, kind: str, *short: str) -> Resource:
    return Resource(group, plural, kind, False, ("v1",), "v1", kind.lower(), short)


#: what every devcluster serves; kubectl learns the short names from discovery (`kubectl get ns`)
BUILTIN: tuple[Resource, ...] = (
    _core("pods", "Pod", True, "po"),
    _core("events", "Event", True, "ev"),
    _core("nodes", "Node", False, "no"),
    _core("persistentvolumeclaims", "PersistentVolumeClaim", True, "pvc"),
    _core("services", "Service", True, "svc"),
    _core("secrets", "Secret", True),
    _core("configmaps", "ConfigMap", True, "cm"),
    _core("serviceaccounts", "ServiceAccount", True, "sa"),
    _core("namespaces", "Namespace", False, "ns"),
    _grouped("apiextensions.k8s.io", "customresourcedefinitions", "CustomResourceDefinition",
             "crd", "crds"),
    _grouped("admissionregistration.k8s.io", "mutatingwebhookconfigurations",
             "MutatingWebhookConfiguration"),
    _grouped("admissionregistration.k8s.io", "validatingwebhookconfigurations",
             "ValidatingWebhookConfiguration"),
    # Dynamic Resource Allocation (devcluster/dra): GA in Kubernetes 1.34
    Resource("resource.k8s.io", "deviceclasses", "DeviceClass", False, ("v1",), "v1",
             "deviceclass"),
    Resource("resource.k8s.io", "resourceslices", "ResourceSlice", False, ("v1",), "v1",
             "resourceslice"),
    Resource("resource.k8s.io", "resourceclaims", "ResourceClaim", True, ("v1",), "v1",
             "resourceclaim", status=True),
    Resource("resource.k8s.io", "resourceclaimtemplates", "ResourceClaimTemplate", True,
             ("v1",), "v1", "resourceclaimtemplate"),
)  # fmt: skip

CRDS = "customresourcedefinitions.apiextensions.k8s.io"
MUTATING = "mutatingwebhookconfigurations.admissionregistration.k8s.io"
VALIDATING = "validatingwebhookconfigurations.admissionregistration.k8s.io"

_VERSION = re.compile(r"^v(\d+)(?:(alpha|beta)(\d+))?$")


def version_priority(version: str) -> tuple:
    """Sort key putting versions in Kubernetes' order: GA before beta before alpha, higher
    numbers first, anything else last by name (apimachinery version/helpers.go,
    CompareKubeAwareVersionStrings)."""
    m = _VERSION.match(version)
    if not m:
        return (3, 0, 0, version)
    major, stage, minor = int(m.group(1)), m.group(2), int(m.group(3) or 0)
    return ({None: 0, "beta": 1, "alpha": 2}[stage], -major, -minor, "")


class Registry:
    """The served resources by key, and by (group, version, plural) for request routing."""

    def __init__(self, resources: Iterable[Resource] = BUILTIN) -> None:
        self._by_key: dict[str, Resource] = {}
        for resource in resources:
            self.add(resource)

    def add(self, resource: Resource) -> None:
        self._by_key[resource.key] = resource

    def remove(self, key: str) -> None:
        self._by_key.pop(key, None)

    def __getitem__(self, key: str) -> Resource:
        return self._by_key[key]

    def __contains__(self, key: object) -> bool:
        return key in self._by_key

    def __iter__(self) -> Iterator[Resource]:
        return iter(list(self._by_key.values()))

    def get(self, key: str) -> Resource | None:
        return self._by_key.get(key)

    def lookup(self, group: str, version: str, plural: str) -> Resource | None:
        resource = self._by_key.get(f"{plural}.{group}" if group else plural)
        return resource if resource and version in resource.versions else None

    def groups(self) -> dict[str, list[str]]:
        """Named groups (not core) -> their served versions, the preferred first."""
        found: dict[str, set[str]] = {}
        for resource in self._by_key.values():
            if resource.group:
                found.setdefault(resource.group, set()).update(resource.versions)
        return {g: sorted(v, key=version_priority) for g, v in sorted(found.items())}
