"""Free/total per pool and offer, kept up to date one watch event at a time.

`LiveCapacity` holds, for one catalog, the cluster index (slim node and pod records grouped by
node), which offers each node serves, each node's contribution to each offer it serves, and
per offer the sums of those contributions. An event updates the index and marks the node it
touched; a read (`snapshot`) recounts only the marked nodes, O(pods on them) per offer serving
them, and sums nothing: the per-offer totals are kept. An event that changes nothing counting
reads (a status-only update) marks nothing. Per-user GPU-equivalents (quotas) are kept the
same way, per pod.

Pure: no I/O. The watches (`watch.py`) feed it; `compute_capacity` feeds it one list.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from types import MappingProxyType
from typing import Any

from ..backends import ANNOTATION_EQUIVALENT, LABEL_GPU, LABEL_POOL, get_backend, plan_slice
from ..backends.fit import (
    UNREADABLE,
    CountedOffer,
    NodeCount,
    OfferCapacity,
    OfferCounter,
    Tally,
)
from ..k8s.index import ASSIGNED_NODE_ANNOTATION, ClusterIndex, NodeSlot
from ..k8s.objects import normalise_toleration, selector_matches, tolerates_all
from ..k8s.records import PodRecord, RecordKeys, node_record, pod_key, pod_record
from .dra import DraIndex
from .snapshot import (
    GPU_EQUIVALENT_ANNOTATION,
    SERVERNAME_ANNOTATION,
    USERNAME_ANNOTATION,
    Capacity,
    parse_gpu_equivalent,
)

__all__ = ["LiveCapacity", "record_keys", "uses_dra"]

log = logging.getLogger(__name__)


def record_keys(catalog: Any) -> RecordKeys:
    """What the records keep for this catalog: what its pools' backends count from, plus the
    CONTRACT labels and annotations (pool, slice, GPU-equivalent, the user's name)."""
    pod_labels = {"fracspawner.io/*", LABEL_POOL, LABEL_GPU}
    pod_annotations = {
        "fracspawner.io/*",
        ANNOTATION_EQUIVALENT,
        USERNAME_ANNOTATION,
        SERVERNAME_ANNOTATION,
    }
    node_annotations: set[str] = set()
    for pool in catalog.pools.values():
        try:
            backend = get_backend(pool.backend)
        except ValueError:
            continue
        pod_labels.update(backend.count_pod_labels)
        pod_annotations.update(backend.count_pod_annotations)
        node_annotations.update(backend.count_node_annotations)
    return RecordKeys(
        pod_labels=tuple(sorted(pod_labels)),
        pod_annotations=tuple(sorted(pod_annotations)),
        node_annotations=tuple(sorted(node_annotations)),
        assumed_node_annotation=ASSIGNED_NODE_ANNOTATION,
        # a user's name alone (a CPU-only notebook) holds nothing to count
        context_annotations=frozenset({USERNAME_ANNOTATION, SERVERNAME_ANNOTATION}),
    )


def _gpu_equivalent(raw: Any) -> Decimal | None:
    """parse_gpu_equivalent, one Decimal shared by the pods of each value (a few values,
    "0.125", "0.25", recur on thousands of pods)."""
    if not isinstance(raw, str):
        return parse_gpu_equivalent(raw)
    if raw not in _EQUIVALENTS:
        if len(_EQUIVALENTS) >= 1024:
            _EQUIVALENTS.clear()
        _EQUIVALENTS[raw] = parse_gpu_equivalent(raw)
    return _EQUIVALENTS[raw]


_EQUIVALENTS: dict[str, Decimal | None] = {}


def uses_dra(catalog: Any) -> bool:
    """Whether a pool of the catalog counts from DRA objects (ResourceSlices, claims)."""
    for pool in catalog.pools.values():
        try:
            if getattr(get_backend(pool.backend), "uses_dra", False):
                return True
        except ValueError:
            continue
    return False


@dataclass
class _Offer:
    pool: str
    spec: str
    selector: dict[str, Any]
    tolerations: list[dict[str, Any]]
    counter: OfferCounter | None
    fixed: OfferCapacity | None = None  # the offer cannot be planned: this, always


def _prepare(catalog: Any) -> list[_Offer]:
    offers: list[_Offer] = []
    for pool in catalog.pools.values():
        seen: set[str] = set()
        pool_selector = dict(getattr(pool, "node_selector", None) or {})
        pool_tolerations = [normalise_toleration(t) for t in getattr(pool, "tolerations", ()) or ()]
        for offer in pool.offers:
            spec = str(offer)
            if spec in seen:
                continue
            seen.add(spec)
            try:
                plan = plan_slice(offer, pool, None)
                counter = get_backend(pool.backend).counter(
                    CountedOffer(pool=pool, spec=spec, plan=plan)
                )
            except Exception as exc:  # a broken offer shows as unknown, never breaks the form
                log.warning("Cannot plan %s on pool %s for capacity: %s", spec, pool.name, exc)
                fixed = OfferCapacity(None, None, "cannot plan this offer")
                offers.append(_Offer(pool.name, spec, {}, [], None, fixed))
                continue
            offers.append(
                _Offer(
                    pool=pool.name,
                    spec=spec,
                    selector={**pool_selector, **dict(plan.node_selector or {})},
                    tolerations=[
                        *pool_tolerations,
                        *(normalise_toleration(t) for t in plan.tolerations or ()),
                    ],
                    counter=counter,
                )
            )
    return offers


class _UsageView(Mapping[str, float]):
    """GPU-equivalents per user, read live from LiveCapacity (read-only; O(1) per user)."""

    def __init__(self, totals: dict[str, Decimal]) -> None:
        self._totals = totals

    def __getitem__(self, user: str) -> float:
        return float(self._totals[user])

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._totals))

    def __len__(self) -> int:
        return len(self._totals)


class LiveCapacity:
    """Capacity of one catalog's pools, updated per node and pod event."""

    def __init__(self, catalog: Any) -> None:
        self.catalog = catalog
        self.keys = record_keys(catalog)
        self.index = ClusterIndex()
        self.offers = _prepare(catalog)
        # DRA pools count from ResourceSlices and ResourceClaims (capacity/dra.py)
        self.dra: DraIndex | None = DraIndex() if uses_dra(catalog) else None
        for offer in self.offers:
            if self.dra is not None and hasattr(offer.counter, "devices_of"):
                offer.counter.devices_of = self.dra.node_devices  # type: ignore[union-attr]
        self._tally = [Tally() for _ in self.offers]
        self._serving: dict[str, tuple[int, ...]] = {}
        self._contrib: dict[str, dict[int, NodeCount | None]] = {}
        self._snapshot: Capacity | None = None
        # quotas: user -> GPU-equivalents of their active pods, and each pod's part
        self._usage: dict[str, Decimal] = {}
        self._usage_pods: dict[str, int] = {}
        self._usage_of_pod: dict[str, tuple[str, Decimal]] = {}
        #: pods `awaits_claim`: on a node, but not in the counts until their claim's
        #: allocation shows (a few at most, while the claim watch lags the pod watch)
        self._awaiting_claim: dict[str, PodRecord] = {}
        #: events that changed something counting or quotas read (the rest cost nothing)
        self.changes = 0
        #: nodes recounted by reads so far (each costs O(pods on it) per offer it serves)
        self.recounted = 0

    # ------------------------------------------------------------------ feeding
    def put_node(self, raw: Mapping[str, Any]) -> bool:
        changed = self.index.put_node(node_record(raw, self.keys))
        self.changes += changed
        return changed

    def drop_node(self, name: str) -> bool:
        changed = self.index.drop_node(name)
        self.changes += changed
        return changed

    def put_pod(self, raw: Mapping[str, Any]) -> bool:
        """Add or update a pod (a terminated pod, or one holding nothing countable, goes)."""
        record = pod_record(raw, self.keys)
        return self._put(record.key if record is not None else pod_key(raw), record)

    def drop_pod(self, key: str) -> bool:
        return self._put(key, None)

    def replace_nodes(self, raws: Iterable[Mapping[str, Any]]) -> None:
        """A full list of nodes: what is not in it is gone."""
        seen = set()
        for raw in raws:
            record = node_record(raw, self.keys)
            seen.add(record.name)
            self.changes += self.index.put_node(record)
        for name in [n for n in self.index.node_names() if n not in seen]:
            self.drop_node(name)

    def replace_pods(self, raws: Iterable[Mapping[str, Any]]) -> None:
        """A full list of pods: what is not in it is gone."""
        seen = set()
        for raw in raws:
            record = pod_record(raw, self.keys)
            # the record's own key string: one copy a pod, not two equal ones
            key = record.key if record is not None else pod_key(raw)
            seen.add(key)
            self._put(key, record)
        for key in [k for k in self.index.pods if k not in seen]:
            self._put(key, None)

    # DRA objects: each touches the nodes whose devices it names
    def _dra(self, touched: set[str]) -> bool:
        for name in touched:
            self.index.touch(name)
        for pod in self.dra.take_owners() if self.dra is not None else ():
            self._check_claim(pod)
        self.changes += bool(touched)
        return bool(touched)

    def put_slice(self, raw: Mapping[str, Any]) -> bool:
        return self.dra is not None and self._dra(self.dra.put_slice(raw))

    def drop_slice(self, name: str) -> bool:
        return self.dra is not None and self._dra(self.dra.drop_slice(name))

    def replace_slices(self, raws: Iterable[Mapping[str, Any]]) -> None:
        if self.dra is not None:
            self._dra(self.dra.replace_slices(raws))

    def put_claim(self, raw: Mapping[str, Any]) -> bool:
        return self.dra is not None and self._dra(self.dra.put_claim(raw))

    def drop_claim(self, key: str) -> bool:
        return self.dra is not None and self._dra(self.dra.drop_claim(key))

    def replace_claims(self, raws: Iterable[Mapping[str, Any]]) -> None:
        if self.dra is not None:
            self._dra(self.dra.replace_claims(raws))

    def _put(self, key: str, record: PodRecord | None) -> bool:
        old = self.index.pod(key)
        if not self.index.put_pod(key, record):
            return False
        self.changes += 1
        if old is not None:
            self._usage_drop(key)
        if record is not None:
            self._usage_add(key, record)
        self._check_claim(key)
        return True

    def awaits_claim(self, record: PodRecord) -> bool:
        """Whether a pod of a DRA pool is on a node (bound, or booked) while no claim made
        for it shows allocated: DRA counts are made from claims, so they do not include it
        yet (the pod watch may see the pod bound before the claim watch sees the allocation
        the scheduler wrote before binding it, and after a hub restart both list again)."""
        if self.dra is None or not (record.node or record.assumed):
            return False
        pool = self.catalog.pools.get(record.labels.get(LABEL_POOL, ""))
        return pool is not None and pool.backend == "dra" and not self.dra.pod_allocated(record.key)

    def _check_claim(self, key: str) -> None:
        record = self.index.pod(key)
        if record is not None and self.awaits_claim(record):
            self._awaiting_claim[key] = record
        else:
            self._awaiting_claim.pop(key, None)

    def _usage_add(self, key: str, record: PodRecord) -> None:
        user = record.annotations.get(USERNAME_ANNOTATION)
        raw = record.annotations.get(GPU_EQUIVALENT_ANNOTATION)
        if not user or raw is None:
            return
        value = _gpu_equivalent(raw)
        if value is None:
            log.warning("Pod %s: ignoring malformed %s=%r", key, GPU_EQUIVALENT_ANNOTATION, raw)
            value = Decimal(0)
        self._usage_of_pod[key] = (user, value)
        self._usage[user] = self._usage.get(user, Decimal(0)) + value
        self._usage_pods[user] = self._usage_pods.get(user, 0) + 1

    def _usage_drop(self, key: str) -> None:
        held = self._usage_of_pod.pop(key, None)
        if held is None:
            return
        user, value = held
        self._usage_pods[user] -= 1
        if self._usage_pods[user] <= 0:
            del self._usage_pods[user]
            del self._usage[user]
        else:
            self._usage[user] -= value

    # ------------------------------------------------------------------ reads
    def snapshot(self) -> Capacity:
        """Free/total per pool and offer; recounts only the nodes changed since the last read."""
        touched, relabelled = self.index.take_changes()
        if touched or relabelled or self._snapshot is None:
            for name in relabelled:
                self._serving_for(name)
            for name in touched | relabelled:
                self._recount(name)
            self._snapshot = self._build()
        return self._snapshot

    def usage_of(self, user: str) -> float:
        """GPU-equivalents `user`'s active pods hold."""
        return float(self._usage.get(user, Decimal(0)))

    def usage_by_user(self) -> Mapping[str, float]:
        """GPU-equivalents per user with active GPU pods: a live, read-only view."""
        return _UsageView(self._usage)

    def pod(self, key: str) -> PodRecord | None:
        return self.index.pod(key)

    def unbound_pods(self) -> list[PodRecord]:
        """The active pods the counts do not include yet: not bound to a node nor booked on
        one (Pending, not scheduled), or on one but `awaits_claim`."""
        return [*self.index.unbound.values(), *self._awaiting_claim.values()]

    # ------------------------------------------------------------------ counting
    def _serving_for(self, name: str) -> None:
        node = self.index.node(name)
        if node is None or not node.ready:
            self._serving.pop(name, None)
            return
        self._serving[name] = tuple(
            i
            for i, offer in enumerate(self.offers)
            if offer.counter is not None
            and selector_matches(node.labels, offer.selector)
            and tolerates_all(node.taints, offer.tolerations)
        )

    def _recount(self, name: str) -> None:
        """Replace one node's contributions to the offers it serves."""
        for i, count in (self._contrib.pop(name, None) or {}).items():
            self._tally[i].add(count, -1)
        slot = self.index.slot(name)
        serving = self._serving.get(name) if slot is not None and slot.node else None
        if not serving:
            return
        self.recounted += 1
        new: dict[int, NodeCount | None] = {}
        for i in serving:
            count = self._count(self.offers[i], slot)
            self._tally[i].add(count)
            new[i] = count
        self._contrib[name] = new

    def _count(self, offer: _Offer, slot: NodeSlot) -> NodeCount | None:
        assert offer.counter is not None
        try:
            return offer.counter.count_node(slot)
        except Exception:  # one odd node must not break every form: it counts as silent
            log.exception(
                "Counting %s of pool %s on node %s failed", offer.spec, offer.pool, slot.name
            )
            return UNREADABLE  # not "publishes nothing": what it offers is unknown

    def _unoffered(self, offer: _Offer, result: OfferCapacity) -> OfferCapacity:
        """`result`, its `unoffered_since` set unless a node of the pool is not Ready (one
        the autoscaler has just added, or one restarting: it may come with GPUs; its taints
        are not read, as a node not Ready is tainted so). Scans the nodes, but only for an
        offer none of whose ready nodes offers a unit."""
        newest = 0.0
        for node in self.index.nodes():
            if not selector_matches(node.labels, offer.selector):
                continue
            if not node.ready:
                return result
            if tolerates_all(node.taints, offer.tolerations):
                newest = max(newest, node.ready_since or 0.0)
        return dataclasses.replace(result, unoffered_since=newest)

    def _build(self) -> Capacity:
        pools: dict[str, dict[str, OfferCapacity]] = {name: {} for name in self.catalog.pools}
        nodes = self.index.node_count
        for offer, tally in zip(self.offers, self._tally, strict=True):
            if not nodes:
                result = OfferCapacity(None, None, "no nodes visible")
            elif offer.fixed is not None:
                result = offer.fixed
            elif tally.serving <= 0:
                result = OfferCapacity(0, 0, "no ready node matches this pool")
            else:
                assert offer.counter is not None
                result = offer.counter.result(tally)
                # a node whose count could not be read may offer some: unknown is not none
                if (result.total == 0 or result.unpublished) and not tally.unreadable:
                    result = self._unoffered(offer, result)
            pools[offer.pool][offer.spec] = result
        return Capacity(
            pools=MappingProxyType({k: MappingProxyType(v) for k, v in pools.items()}),
            nodes_seen=nodes,
        )
