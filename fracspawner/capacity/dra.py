"""ResourceSlices and ResourceClaims, kept per node for the DRA pools' counting.

`DraIndex` holds slim records (backends.dra_devices) of every ResourceSlice (devices and
counter sets) and of every ResourceClaim's allocation results, and answers, for a node, its
devices, what claims hold of each and its counter sets (`node_devices`), cached until an event
touches the node. Each put/drop returns the nodes it touched, which `LiveCapacity` recounts on
the next read, so a form render still makes no API call and recounts only what changed.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..backends.dra_devices import (
    ClaimRecord,
    CounterKey,
    Device,
    DeviceKey,
    NodeDevices,
    SliceRecord,
    claim_record,
    slice_record,
)


class DraIndex:
    def __init__(self) -> None:
        self.slices: dict[str, SliceRecord] = {}
        self.claims: dict[str, ClaimRecord] = {}
        self._device_node: dict[DeviceKey, str] = {}
        self._node_slices: dict[str, set[str]] = {}
        #: (driver, pool) -> newest generation seen: older slices of a pool do not count
        self._generation: dict[tuple[str, str], int] = {}
        #: device -> claim key -> what each of its results consumes there
        self._held: dict[DeviceKey, dict[str, list[Mapping[str, Any] | None]]] = {}
        self._pool_nodes: dict[tuple[str, str], set[str]] = {}
        #: (driver, pool) -> its slices that publish counter sets
        self._pool_counters: dict[tuple[str, str], set[str]] = {}
        self._cache: dict[str, NodeDevices] = {}
        #: pod "namespace/name" -> its claims (made for it by the resourceclaim controller)
        self._owned: dict[str, set[str]] = {}
        #: pods whose claims changed since `take_owners` (whether `pod_allocated` changed)
        self._owners_touched: set[str] = set()

    # ------------------------------------------------------------------ slices
    def put_slice(self, raw: Mapping[str, Any]) -> set[str]:
        name = str((raw.get("metadata") or {}).get("name"))
        record = slice_record(raw)
        return self._set_slice(name, record)

    def drop_slice(self, name: str) -> set[str]:
        return self._set_slice(name, None)

    def replace_slices(self, raws: Iterable[Mapping[str, Any]]) -> set[str]:
        touched: set[str] = set()
        seen = set()
        for raw in raws:
            seen.add(str((raw.get("metadata") or {}).get("name")))
            touched |= self.put_slice(raw)
        for name in [n for n in self.slices if n not in seen]:
            touched |= self.drop_slice(name)
        return touched

    def _set_slice(self, name: str, record: SliceRecord | None) -> set[str]:
        old = self.slices.get(name)
        if old == record and old is not None:
            return set()
        touched: set[str] = set()
        if old is not None:
            touched |= self._pool_nodes.get((old.driver, old.pool), set())
            for device in old.devices:
                self._device_node.pop(device.key, None)
            for node in old.nodes():
                self._node_slices.get(node, set()).discard(name)
            self._pool_counters.get((old.driver, old.pool), set()).discard(name)
            del self.slices[name]
        if record is not None:
            self.slices[name] = record
            pool = (record.driver, record.pool)
            self._generation[pool] = max(self._generation.get(pool, 0), record.generation)
            for device in record.devices:
                if device.node:
                    self._device_node[device.key] = device.node
            nodes = record.nodes()
            for node in nodes:
                self._node_slices.setdefault(node, set()).add(name)
            self._pool_nodes.setdefault(pool, set()).update(nodes)
            if record.counters:
                self._pool_counters.setdefault(pool, set()).add(name)
            # a counter set (possibly in a slice of its own) counts for the pool's nodes
            touched |= self._pool_nodes[pool]
        for node in touched:
            self._cache.pop(node, None)
        return touched

    # ------------------------------------------------------------------ claims
    def put_claim(self, raw: Mapping[str, Any]) -> set[str]:
        record = claim_record(raw)
        return self._set_claim(record.key, record)

    def drop_claim(self, key: str) -> set[str]:
        return self._set_claim(key, None)

    def replace_claims(self, raws: Iterable[Mapping[str, Any]]) -> set[str]:
        touched: set[str] = set()
        seen = set()
        for raw in raws:
            record = claim_record(raw)
            seen.add(record.key)
            touched |= self._set_claim(record.key, record)
        for key in [k for k in self.claims if k not in seen]:
            touched |= self.drop_claim(key)
        return touched

    def _set_claim(self, key: str, record: ClaimRecord | None) -> set[str]:
        old = self.claims.get(key)
        if old == record:
            return set()
        touched: set[str] = set()
        for claim in (old, record):
            for allocation in claim.allocations if claim else ():
                node = self._device_node.get(allocation.device)
                if node:
                    touched.add(node)
        self._owners_touched.update(c.owner for c in (old, record) if c is not None and c.owner)
        if old is not None and old.owner:
            owned = self._owned.get(old.owner)
            if owned is not None:
                owned.discard(key)
                if not owned:
                    del self._owned[old.owner]
        if record is not None and record.owner:
            self._owned.setdefault(record.owner, set()).add(key)
        if old is not None:
            for allocation in old.allocations:
                holders = self._held.get(allocation.device)
                if holders is not None:
                    holders.pop(key, None)
                    if not holders:
                        del self._held[allocation.device]
            del self.claims[key]
        if record is not None:
            self.claims[key] = record
            for allocation in record.allocations:
                self._held.setdefault(allocation.device, {}).setdefault(key, []).append(
                    allocation.consumed
                )
        for node in touched:
            self._cache.pop(node, None)
        return touched

    # ------------------------------------------------------------------ reads
    def node_devices(self, node: str) -> NodeDevices | None:
        """The node's devices (newest pool generations), their holdings and its counter
        sets; None when no slice names the node."""
        cached = self._cache.get(node)
        if cached is not None:
            return cached
        names = self._node_slices.get(node)
        if not names:
            return None
        devices: list[Device] = []
        pools: set[tuple[str, str]] = set()
        for name in sorted(names):
            record = self.slices[name]
            pool = (record.driver, record.pool)
            if record.generation < self._generation.get(pool, 0):
                continue
            pools.add(pool)
            devices += [d for d in record.devices if d.node == node]
        counters: dict[CounterKey, Mapping[str, Any]] = {}
        for pool in pools:
            for name in sorted(self._pool_counters.get(pool, ())):
                record = self.slices[name]
                if record.generation >= self._generation.get(pool, 0):
                    counters.update(record.counters)
        held = {
            d.key: [c for per_claim in self._held[d.key].values() for c in per_claim]
            for d in devices
            if d.key in self._held
        }
        result = NodeDevices(devices=devices, held=held, counters=counters)
        self._cache[node] = result
        return result

    def pod_allocated(self, pod: str) -> bool:
        """Whether a claim made for pod "namespace/name" is allocated in this index: only
        then do the counts include what the pod holds (the pod watch may see the pod bound
        before the claim watch sees its allocation)."""
        return any(self.claims[k].allocations for k in self._owned.get(pod, ()))

    def take_owners(self) -> set[str]:
        """The pods ("namespace/name") whose claims changed since the last call."""
        owners, self._owners_touched = self._owners_touched, set()
        return owners

    def claims_labelled(self, label: str, value: str) -> list[ClaimRecord]:
        return [c for c in self.claims.values() if c.labels.get(label) == value]
