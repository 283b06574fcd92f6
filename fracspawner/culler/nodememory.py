"""Each node's memory, and the host memory budget per node that follows it (issue 36, item 2).

The hibernated kernels of a node's servers keep their GPU state in host memory, on that node
(hostbudget.py). A fixed budget for every node is wrong both ways: on a GPU node with hundreds
of GiB of memory it shuts kernels down that the node could keep (each one a user's lost kernel),
and on a small node it may be more than the node can give. So by default the budget is a share
of the node's allocatable memory (`status.allocatable.memory` of its Node object: capacity less
what the kubelet reserves for the system and its eviction threshold), `Culler.
host_memory_budget_fraction`; an explicit `Culler.host_memory_budget_mib` overrides it.

A node whose memory is not known (no Node object seen, the node watch refused or not running,
a quantity that does not parse) gets the fixed fallback budget, never an unlimited one.

`NodeMemory` keeps, from the culler's node watch (serverpods.py), only that: each node's
allocatable memory in MiB. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..k8s.objects import meta, quantity

#: the budget of a node whose memory is not known (and the budget before this module: 64 GiB)
FALLBACK_BUDGET_MIB = 65536.0
MIB = 1024 * 1024


def allocatable_mib(node: Mapping[str, Any]) -> float | None:
    """A Node object's allocatable memory in MiB; None when absent, malformed or not positive."""
    status = node.get("status") or {}
    allocatable = status.get("allocatable") if isinstance(status, Mapping) else None
    if not isinstance(allocatable, Mapping):
        return None
    q = quantity(allocatable.get("memory"))
    if q is None or q <= 0:
        return None
    return float(q) / MIB


def node_budget_mib(
    explicit_mib: float | None,
    fraction: float,
    node_mib: float | None,
    fallback_mib: float = FALLBACK_BUDGET_MIB,
) -> float:
    """The host memory budget of one node: `explicit_mib` where the admin set one (0: none),
    else `fraction` of the node's allocatable memory `node_mib`, else (the node's memory not
    known) `fallback_mib`. Unknown memory never means unlimited."""
    if explicit_mib is not None:
        return max(0.0, float(explicit_mib))
    if node_mib is None or not node_mib > 0:
        return fallback_mib
    return fraction * node_mib


def _name(node: Mapping[str, Any]) -> str:
    return str(meta(node).get("name") or "")


class NodeMemory:
    """Allocatable memory (MiB) of the nodes the watch has seen, by node name."""

    def __init__(self) -> None:
        self._mib: dict[str, float] = {}

    def mib(self, node: str) -> float | None:
        """The node's allocatable memory in MiB, or None when not known."""
        return self._mib.get(node)

    def put(self, node: Mapping[str, Any]) -> None:
        name = _name(node)
        if not name:
            return
        mib = allocatable_mib(node)
        if mib is None:
            self._mib.pop(name, None)  # no longer known: the fallback, not the old figure
        else:
            self._mib[name] = mib

    def drop(self, node: Mapping[str, Any]) -> None:
        self._mib.pop(_name(node), None)

    def load(self, nodes: Iterable[Mapping[str, Any]]) -> None:
        self._mib.clear()
        for node in nodes:
            self.put(node)

    def __len__(self) -> int:
        return len(self._mib)
