"""Slim records of nodes and pods: only the fields capacity counting reads.

The capacity watches keep these instead of whole API objects. A pod record holds where the
pod is (bound node, or a node a scheduler extender booked it on), what it requests (extended
resources, as kube-scheduler charges them) and the labels and annotations a backend counts
from; a node record its labels, the annotations a backend reads, extended allocatable, the
taints that keep pods off and whether it is ready. Status updates that change none of these
(heartbeats, conditions, container statuses) give an equal record, so they cost no recount.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from .objects import (
    BLOCKING_EFFECTS,
    allocatable,
    annotations,
    bound_node,
    extended_requests,
    is_active,
    is_ready,
    labels,
    meta,
    quantity,
    ready_since,
)

__all__ = ["NodeRecord", "PodRecord", "RecordKeys", "node_record", "pod_key", "pod_record"]


Matcher = tuple[frozenset[str], tuple[str, ...]]


def _matcher(keys: Iterable[str]) -> Matcher:
    """Exact keys and prefixes (an entry ending in '*' is a prefix)."""
    keys = list(keys)
    return (
        frozenset(k for k in keys if not k.endswith("*")),
        tuple(k[:-1] for k in keys if k.endswith("*")),
    )


@dataclass(frozen=True)
class RecordKeys:
    """Which labels and annotations the records keep (from the backends that count)."""

    pod_labels: Iterable[str] = ()
    pod_annotations: Iterable[str] = ()
    node_annotations: Iterable[str] = ()
    #: a pod annotation naming the node a scheduler booked the pod on before binding it
    assumed_node_annotation: str | None = None
    #: annotations kept only next to something else that counts (e.g. the user name)
    context_annotations: frozenset[str] = frozenset()
    # (exact keys, prefixes) of each list above, for _keep
    pod_label_match: Matcher = field(init=False, repr=False)
    pod_annotation_match: Matcher = field(init=False, repr=False)
    node_annotation_match: Matcher = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "pod_label_match", _matcher(self.pod_labels))
        object.__setattr__(self, "pod_annotation_match", _matcher(self.pod_annotations))
        object.__setattr__(self, "node_annotation_match", _matcher(self.node_annotations))


def _keep(source: Mapping[str, Any], match: Matcher, *, share: bool = True) -> dict:
    """The entries of `source` that `match` keeps; `share`: one dict for equal sets (labels
    recur on thousands of pods; annotations naming a user or a node's devices do not)."""
    exact, prefixes = match
    if not source:
        return _EMPTY
    kept = {k: v for k, v in source.items() if k in exact or k.startswith(prefixes)}
    if not kept:
        return _EMPTY
    return _intern(kept) if share else kept


#: one shared empty dict, and a bounded table of repeated small dicts (the same few label,
#: request and allocatable sets recur on thousands of pods and nodes). Only what a record
#: keeps is entered, never a pod's unique annotations; when full the table starts over (the
#: records keep their dicts), so new sets are shared again instead of never.
_EMPTY: dict = {}
_INTERNED: dict[tuple, dict] = {}
_INTERN_LIMIT = 8192


def _intern(d: dict) -> dict:
    try:
        key = tuple(sorted(d.items()))
        found = _INTERNED.get(key)
    except TypeError:  # unorderable or unhashable values: keep the dict as it is
        return d
    if found is not None:
        return found
    if len(_INTERNED) >= _INTERN_LIMIT:
        _INTERNED.clear()
    _INTERNED[key] = d
    return d


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """What counting reads of a node. Mappings are shared: never mutate them."""

    name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    #: extended resources ("vendor/name"); None where the quantity is malformed
    allocatable: Mapping[str, Decimal | None]
    #: NoSchedule/NoExecute taints as {key, value, effect}
    taints: tuple[Mapping[str, str], ...]
    ready: bool
    #: Unix seconds of its last Ready transition (else its creation; None: unknown)
    ready_since: float | None = None


@dataclass(frozen=True, slots=True)
class PodRecord:
    """What counting reads of an active pod. Mappings are shared: never mutate them."""

    key: str  # namespace/name
    uid: str
    node: str | None  # spec.nodeName
    assumed: str | None  # booked on this node before binding (keys.assumed_node_annotation)
    requests: Mapping[str, Decimal]  # extended resources, as kube-scheduler charges them
    labels: Mapping[str, str]
    annotations: Mapping[str, str]

    @property
    def namespace(self) -> str:
        return self.key.partition("/")[0] if "/" in self.key else ""

    @property
    def name(self) -> str:
        return self.key.rpartition("/")[2]


def pod_key(pod: Mapping[str, Any]) -> str:
    """The cache key: namespace/name, or name for an object without a namespace."""
    m = meta(pod)
    namespace = m.get("namespace")
    return f"{namespace}/{m.get('name')}" if namespace else str(m.get("name"))


def node_record(node: Mapping[str, Any], keys: RecordKeys) -> NodeRecord:
    alloc = {name: quantity(value) for name, value in allocatable(node).items() if "/" in str(name)}
    taints = tuple(
        _intern(
            {
                "key": t.get("key") or "",
                "value": t.get("value") or "",
                "effect": t.get("effect") or "",
            }
        )
        for t in (node.get("spec") or {}).get("taints") or []
        if t.get("effect") in BLOCKING_EFFECTS
    )
    return NodeRecord(
        name=str(meta(node).get("name", "")),
        labels=dict(labels(node)),
        annotations=_keep(annotations(node), keys.node_annotation_match, share=False),
        allocatable=_intern(alloc) if alloc else _EMPTY,
        taints=taints,
        ready=is_ready(node),
        ready_since=ready_since(node),
    )


def pod_record(pod: Mapping[str, Any], keys: RecordKeys) -> PodRecord | None:
    """The pod's record, or None when it holds nothing counting or quotas could see
    (terminated, or no extended request and no label or annotation a backend reads)."""
    if not is_active(pod):
        return None
    requests = extended_requests(pod)
    kept_labels = _keep(labels(pod), keys.pod_label_match, share=False)
    kept_annotations = _keep(annotations(pod), keys.pod_annotation_match, share=False)
    if (
        not requests
        and not kept_labels
        and not (kept_annotations.keys() - keys.context_annotations)
    ):
        return None  # nothing entered in the shared table for a pod that is not kept
    node = bound_node(pod)
    assumed = None
    if not node and keys.assumed_node_annotation:
        assumed = annotations(pod).get(keys.assumed_node_annotation) or None
    return PodRecord(
        key=pod_key(pod),
        uid=str(meta(pod).get("uid") or ""),
        node=node,
        assumed=assumed,
        requests=_intern(requests) if requests else _EMPTY,
        labels=_intern(kept_labels) if kept_labels else _EMPTY,
        annotations=kept_annotations,
    )
