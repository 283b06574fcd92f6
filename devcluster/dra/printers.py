"""`kubectl get` columns of the DRA kinds, as kubernetes pkg/printers/internalversion/printers.go
prints them (AddHandlers: resourceClaimColumnDefinitions, resourceSliceColumnDefinitions):
claims NAME, STATE (resourceClaimState: "deleted", "pending" or "allocated", plus "reserved"
while a consumer holds it, joined with commas), AGE; slices NAME, NODE, DRIVER, POOL, AGE."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..columns import _column, human_age
from .kinds import RESOURCECLAIMS, RESOURCESLICES


def claim_state(claim: Mapping[str, Any]) -> str:
    status = claim.get("status") or {}
    deleted = bool(claim["metadata"].get("deletionTimestamp"))
    states = ["deleted"] if deleted else []
    if not status.get("allocation"):
        if not deleted:
            states.append("pending")
    else:
        states.append("allocated")
        if status.get("reservedFor"):
            states.append("reserved")
    return ",".join(states)


def _claim_row(claim: Mapping[str, Any]) -> list[Any]:
    meta = claim["metadata"]
    return [meta["name"], claim_state(claim), human_age(meta.get("creationTimestamp"))]


def _slice_row(s: Mapping[str, Any]) -> list[Any]:
    spec = s.get("spec") or {}
    return [
        s["metadata"]["name"],
        spec.get("nodeName", ""),
        spec.get("driver", ""),
        (spec.get("pool") or {}).get("name", ""),
        human_age(s["metadata"].get("creationTimestamp")),
    ]


COLUMNS = {
    RESOURCECLAIMS: [_column("Name", fmt="name"), _column("State"), _column("Age")],
    RESOURCESLICES: [
        _column("Name", fmt="name"),
        _column("Node"),
        _column("Driver"),
        _column("Pool"),
        _column("Age"),
    ],
}
ROWS = {RESOURCECLAIMS: _claim_row, RESOURCESLICES: _slice_row}
