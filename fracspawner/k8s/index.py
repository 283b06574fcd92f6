"""The cluster index: nodes and the pods holding resources on them, with per-node tallies.

Built from raw API dicts (what the reflectors store); read by each backend's counting.
Tallies are computed once per node per index and cached.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from .objects import (
    annotations,
    bound_node,
    extended_requests,
    is_active,
    is_ready,
    labels,
    meta,
    selector_matches,
    taints_tolerated,
)

#: HAMi's scheduler books a pod on a node before binding it (pkg/util/types.go
#: AssignedNodeAnnotations); until bound, the pod already holds devices there.
ASSIGNED_NODE_ANNOTATION = "hami.io/vgpu-node"


@dataclass
class ClusterIndex:
    """Nodes and the pods holding resources on them, with per-node tallies computed once."""

    nodes: list[dict[str, Any]]
    pods_by_node: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: pods a scheduler extender assigned to a node before binding (ASSIGNED_NODE_ANNOTATION)
    assumed_by_node: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    _ready: list[dict[str, Any]] | None = None
    _serving: dict[Any, list[dict[str, Any]]] = field(default_factory=dict)
    _requests: dict[str, dict[str, Decimal]] = field(default_factory=dict)
    _family: dict[tuple[str, str], Any] = field(default_factory=dict)

    @classmethod
    def build(cls, nodes: Iterable[dict[str, Any]], pods: Iterable[dict[str, Any]]) -> ClusterIndex:
        index = cls(nodes=list(nodes))
        for pod in pods:
            if not is_active(pod):
                continue
            name = bound_node(pod)
            if name:
                index.pods_by_node.setdefault(name, []).append(pod)
            else:
                assumed = annotations(pod).get(ASSIGNED_NODE_ANNOTATION)
                if assumed:
                    index.assumed_by_node.setdefault(assumed, []).append(pod)
        return index

    def pods_on(self, node: Mapping[str, Any]) -> list[dict[str, Any]]:
        return self.pods_by_node.get(meta(node).get("name", ""), [])

    def assumed_on(self, node: Mapping[str, Any]) -> list[dict[str, Any]]:
        return self.assumed_by_node.get(meta(node).get("name", ""), [])

    def ready(self) -> list[dict[str, Any]]:
        if self._ready is None:
            self._ready = [n for n in self.nodes if is_ready(n)]
        return self._ready

    def serving(
        self, selector: Mapping[str, Any], tolerations: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """Ready nodes whose labels match `selector` and whose taints `tolerations` tolerate."""
        key = (tuple(sorted(selector.items())), repr(tolerations))
        if key not in self._serving:
            self._serving[key] = [
                n
                for n in self.ready()
                if selector_matches(labels(n), selector) and taints_tolerated(n, tolerations)
            ]
        return self._serving[key]

    def requests_on(self, node: Mapping[str, Any]) -> dict[str, Decimal]:
        """Extended resources requested by the pods bound to `node`."""
        name = meta(node).get("name", "")
        if name not in self._requests:
            total: dict[str, Decimal] = {}
            for pod in self.pods_on(node):
                for res, q in extended_requests(pod).items():
                    total[res] = total.get(res, Decimal(0)) + q
            self._requests[name] = total
        return self._requests[name]

    def per_node(self, family: str, node: Mapping[str, Any], build: Callable[[], Any]) -> Any:
        """A backend's own per-node state (`family` names the backend), built once."""
        key = (family, meta(node).get("name", ""))
        if key not in self._family:
            self._family[key] = build()
        return self._family[key]
