"""Kubeflow profile namespaces -> catalog access groups: the catalog's `kubeflow:` section.

A Kubeflow profile owns one namespace; its notebooks are pods there. The section says which of
the catalog's access groups a namespace belongs to, by what Kubeflow puts on the namespace:
its name (= the profile name), its labels (the profile controller's namespace-labels ConfigMap,
or labels an admin sets), or its profile owner (the namespace annotation `owner` the profile
controller writes, kubeflow/dashboard components/profile-controller/controllers/
profile_controller.go). The rule of a namespace is then computed like a user's in those groups
(`fracspawner.model.access.namespace_rule`); its `max_gpu` caps the whole namespace.

Pure: no I/O. The catalog calls `parse_kubeflow` while it is built, with the path-naming
CatalogError messages of the rest of the catalog.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .errors import CatalogError

#: the namespace annotation the Kubeflow profile controller sets to the profile owner
OWNER_ANNOTATION = "owner"


@dataclass(frozen=True)
class NamespaceMatch:
    """One `kubeflow.namespaces[i]` entry: every given condition must hold."""

    groups: tuple[str, ...]
    name: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)
    owner: str | None = None
    #: whether the entry can be decided from labels alone (Notebooks 2.0 filterRules)
    by_labels_only: bool = False

    def matches(self, name: str, labels: Mapping[str, str], annotations: Mapping[str, str]) -> bool:
        if self.name is not None and name != self.name:
            return False
        if any(labels.get(k) != v for k, v in self.labels.items()):
            return False
        return self.owner is None or annotations.get(OWNER_ANNOTATION) == self.owner


@dataclass(frozen=True)
class KubeflowAccess:
    """The `kubeflow:` section. Without one, every namespace has the catalog's default rule."""

    namespaces: tuple[NamespaceMatch, ...] = ()
    pools: tuple[str, ...] | None = None  # the pools Kubeflow sees; None: all

    def groups_for(
        self, name: str, labels: Mapping[str, str], annotations: Mapping[str, str]
    ) -> list[str]:
        """The access groups of a namespace: those of every entry it matches, in order."""
        out: list[str] = []
        for entry in self.namespaces:
            if entry.matches(name, labels, annotations):
                out += [g for g in entry.groups if g not in out]
        return out


def parse_kubeflow(
    raw: Mapping[str, Any] | None, groups: Mapping[str, Any], pools: Mapping[str, Any]
) -> KubeflowAccess:
    """The section, checked against the catalog's access groups and pools (the JSON Schema
    has already checked its shape); CatalogError names the path of the first problem."""
    if raw is None:
        return KubeflowAccess()
    entries = []
    for i, entry in enumerate(raw.get("namespaces") or ()):
        where = f"kubeflow.namespaces[{i}]"
        for j, group in enumerate(entry["groups"]):
            if group not in groups:
                known = ", ".join(groups) or "none (add them under access.groups)"
                raise CatalogError(f"{where}.groups[{j}]: unknown group {group!r}; groups: {known}")
        name = entry.get("name")
        owner = entry.get("owner")
        entries.append(
            NamespaceMatch(
                groups=tuple(entry["groups"]),
                name=name,
                labels=MappingProxyType(dict(entry.get("labels") or {})),
                owner=owner,
                by_labels_only=owner is None,
            )
        )
    chosen = raw.get("pools", "all")
    if chosen == "all":
        visible = None
    else:
        for i, pool in enumerate(chosen):
            if pool not in pools:
                known = ", ".join(pools) or "none"
                raise CatalogError(f"kubeflow.pools[{i}]: unknown pool {pool!r}; pools: {known}")
        visible = tuple(chosen)
    return KubeflowAccess(namespaces=tuple(entries), pools=visible)
