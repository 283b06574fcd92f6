"""The cluster index: node and pod records, grouped by node, kept up to date one event at a time.

`ClusterIndex` is fed records (`fracspawner.k8s.records`) by the capacity watches (one call per
watch event) or from a list. Every change marks the node slots it touched; the capacity layer
takes those marks and recounts only those nodes, so a read never walks the whole cluster. An
event whose record equals the one held (a status-only change) touches nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from decimal import Decimal
from typing import Any

from .records import NodeRecord, PodRecord

__all__ = ["ASSIGNED_NODE_ANNOTATION", "ClusterIndex", "NodeSlot"]

#: HAMi's scheduler books a pod on a node before binding it (pkg/util/types.go
#: AssignedNodeAnnotations); until bound, the pod already holds devices there.
ASSIGNED_NODE_ANNOTATION = "hami.io/vgpu-node"


class NodeSlot:
    """One node name: its record (None until the node is seen) and the pods bound to it or
    booked on it, with what backends derive from them cached until the next change."""

    __slots__ = ("_derived", "assumed", "name", "node", "pods")

    def __init__(self, name: str) -> None:
        self.name = name
        self.node: NodeRecord | None = None
        self.pods: dict[str, PodRecord] = {}
        self.assumed: dict[str, PodRecord] = {}
        self._derived: dict[Any, Any] = {}

    def changed(self) -> None:
        self._derived.clear()

    def empty(self) -> bool:
        return self.node is None and not self.pods and not self.assumed

    def derived(self, key: Any, build: Callable[[], Any]) -> Any:
        """Something a backend derives from this node and its pods (`key` names it), built
        once per change of the node or its pods."""
        if key not in self._derived:
            self._derived[key] = build()
        return self._derived[key]

    def bound(self) -> list[PodRecord]:
        """Pods bound here, in a fixed order (by key): estimates that place pods one after
        another must not depend on the order events arrived in."""
        return self.derived("bound", lambda: [self.pods[k] for k in sorted(self.pods)])

    def booked(self) -> list[PodRecord]:
        """Pods booked on this node but not bound yet, by key."""
        return self.derived("booked", lambda: [self.assumed[k] for k in sorted(self.assumed)])

    def requested(self) -> dict[str, Decimal]:
        """Extended resources requested by the pods bound here (kube-scheduler's NodeInfo)."""

        def total() -> dict[str, Decimal]:
            out: dict[str, Decimal] = {}
            for pod in self.pods.values():
                for res, q in pod.requests.items():
                    out[res] = out.get(res, Decimal(0)) + q
            return out

        return self.derived("requested", total)


class ClusterIndex:
    """Node and pod records by name, pods grouped by node, with the slots changed since the
    last `take_changes()`."""

    def __init__(self) -> None:
        self.slots: dict[str, NodeSlot] = {}
        self.pods: dict[str, PodRecord] = {}
        #: pods neither bound to a node nor booked on one (Pending, waiting for the scheduler):
        #: they hold nothing the counts see, and admission reads them as claims (a few at most)
        self.unbound: dict[str, PodRecord] = {}
        self.node_count = 0
        self._touched: set[str] = set()  # slots whose node or pods changed
        self._relabelled: set[str] = set()  # slots whose node record changed (or went)

    # ------------------------------------------------------------------ nodes
    def _slot(self, name: str) -> NodeSlot:
        slot = self.slots.get(name)
        if slot is None:
            slot = self.slots[name] = NodeSlot(name)
        return slot

    def _release(self, slot: NodeSlot) -> None:
        if slot.empty():
            self.slots.pop(slot.name, None)

    def put_node(self, record: NodeRecord) -> bool:
        """Add or replace a node; False when nothing counting reads changed."""
        slot = self._slot(record.name)
        if slot.node == record:
            return False
        if slot.node is None:
            self.node_count += 1
        slot.node = record
        slot.changed()
        self._touched.add(record.name)
        self._relabelled.add(record.name)
        return True

    def drop_node(self, name: str) -> bool:
        slot = self.slots.get(name)
        if slot is None or slot.node is None:
            return False
        slot.node = None
        self.node_count -= 1
        slot.changed()
        self._touched.add(name)
        self._relabelled.add(name)
        self._release(slot)
        return True

    def node(self, name: str) -> NodeRecord | None:
        slot = self.slots.get(name)
        return slot.node if slot is not None else None

    def nodes(self) -> Iterator[NodeRecord]:
        return (s.node for s in self.slots.values() if s.node is not None)

    def node_names(self) -> list[str]:
        return [name for name, s in self.slots.items() if s.node is not None]

    # ------------------------------------------------------------------ pods
    def _place(self, pod: PodRecord, add: bool) -> None:
        if pod.node:
            slot, group = self._slot(pod.node), "pods"
        elif pod.assumed:
            slot, group = self._slot(pod.assumed), "assumed"
        else:
            return  # unbound: holds nothing on any node (kept for quotas only)
        members = getattr(slot, group)
        if add:
            members[pod.key] = pod
        else:
            members.pop(pod.key, None)
        slot.changed()
        self._touched.add(slot.name)
        if not add:
            self._release(slot)

    def put_pod(self, key: str, record: PodRecord | None) -> bool:
        """Add, replace or (record None) drop a pod; False when nothing counting reads changed."""
        old = self.pods.get(key)
        if old == record:
            return False
        if old is not None:
            self._place(old, add=False)
        if record is None:
            self.pods.pop(key, None)
        else:
            self.pods[key] = record
            self._place(record, add=True)
        if record is not None and not (record.node or record.assumed):
            self.unbound[key] = record
        else:
            self.unbound.pop(key, None)
        return True

    def pod(self, key: str) -> PodRecord | None:
        return self.pods.get(key)

    # ------------------------------------------------------------------ lists
    def replace_nodes(self, records: Iterable[NodeRecord]) -> None:
        """What a full list of nodes says: put each, drop the ones it no longer has."""
        seen = set()
        for record in records:
            seen.add(record.name)
            self.put_node(record)
        for name in [n for n in self.node_names() if n not in seen]:
            self.drop_node(name)

    def replace_pods(self, records: Iterable[tuple[str, PodRecord | None]]) -> list[str]:
        """What a full list of pods says; returns the keys of pods that went away."""
        seen = set()
        for key, record in records:
            seen.add(key)
            self.put_pod(key, record)
        gone = [k for k in self.pods if k not in seen]
        for key in gone:
            self.put_pod(key, None)
        return gone

    # ------------------------------------------------------------------ changes
    def take_changes(self) -> tuple[set[str], set[str]]:
        """(slots whose node or pods changed, slots whose node record changed) since the last
        call; the caller recounts those."""
        touched, relabelled = self._touched, self._relabelled
        self._touched, self._relabelled = set(), set()
        return touched, relabelled

    def touch(self, name: str) -> None:
        """Something counted outside this index changed for node `name` (its DRA devices or
        their claims): recount it on the next read."""
        slot = self.slots.get(name)
        if slot is not None:
            slot.changed()
            self._touched.add(name)

    def slot(self, name: str) -> NodeSlot | None:
        return self.slots.get(name)
