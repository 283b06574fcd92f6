"""Servers the hub has not listed yet hold GPU memory too (issue 36 item 1). Pure.

The culler learns each server's pool and slice from the hub's listing, once a cycle
(`cull_every`); `swapdesk.seats_from` counts only the servers listed. A server started since
holds memory on its GPU before the next listing: its first cell may take its slice while the
culler grants a waiting resume the room it thinks free. The restore then meets CUDA out of
memory and, on current drivers, the kernel's GPU state is lost for good
(NVIDIA/cuda-checkpoint#44). The capacity benchmark lost a kernel so (research trace, HAMi,
half the GPUs: a server seated in the minute of the grant; tests/test_culler_unlisted.py).

The pod watch (serverpods.py) knows a server's pod from the moment it is made: FracSpawner's
label and annotation on it say its pool and its slice's memory, KubeSpawner's its user and server
(placement.py). Each such pod on a node, in an over-committed pool (or `also_pool`), that no
listed server owns (by its owner, else by its name) takes a seat, in its owner's name (the hub's
admission finds its own spawns by it: hub/room.py):

- with a report: the report bound to its pod (`swapdesk.bind`): its resident memory within its
  slice, its device readings, its waiting kernels; a report from before its pod was made is a
  previous incarnation's (a restarted server), and counts as none (`reports.this_incarnation`);
- without one: its whole slice on each GPU its pod may be on (unknown memory is never free);
- it is ordered nothing (its kernels are no swap candidates: an order goes only in the answer to
  a listed server's report) until the hub lists it;
- it carries its pool's `Seat.enforced` (the backend limits its kernels to its slice, as the
  listed ones'), so a rule that reads it treats it as it will once listed (room.held_by: a
  present user's server on HAMi counts what it holds and half again, not its whole slice).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from .placement import Placement
from .pressure import SwapFacts
from .reports import this_incarnation
from .swapdesk import Seat, bind, default_margin_mib, largest_slice_mib, pool_enforced

if TYPE_CHECKING:
    from ..model.catalog import Catalog
    from .reports import ServerReport

#: the user name of a seat for a pod whose owner is not annotated (it has no report either)
UNLISTED = "unlisted/"


def unlisted_seats(
    pods: Iterable[tuple[str, Placement]],
    listed: Collection[tuple[str, str]],
    listed_pods: Collection[str],
    reports: Mapping[tuple[str, str], ServerReport],
    catalog: Catalog,
    now: float,
    max_staleness: float,
    margin_mib: float | None = None,
    also_pool: str | None = None,
) -> list[Seat]:
    """Seats for the server pods (`pods`: name and placement, from the pod watch) that are not
    the `listed` servers' (user, server), nor named as one of their pods (`listed_pods`).
    `reports`: the latest report of each server, by (user, server). `margin_mib` None: each
    pool's default (swapdesk.default_margin_mib)."""
    seats = []
    for name, where in pods:
        if where.owner in listed or name in listed_pods:
            continue
        if where.node is None or where.pool not in catalog.pools:
            continue  # not placed yet, or not a FracSpawner GPU pod of a known pool
        pool = catalog.pools[where.pool]
        if pool.overcommit <= 1 and where.pool != also_pool:
            continue
        size = float(pool.gpu.device_memory_mib)
        largest = largest_slice_mib(pool)
        cap = where.memory_mib or largest  # a slice it does not state counts as the largest
        if size > 0:
            cap = min(cap, size * where.gpus)
        margin = default_margin_mib(pool) if margin_mib is None else margin_mib
        user, server = where.owner or (UNLISTED + name, "")
        report = reports.get((user, server)) if where.owner else None
        report = this_incarnation(report, where.created)  # a previous pod's is none
        facts = SwapFacts()
        if report is not None:
            gpus = max(1, math.ceil(cap / size)) if size > 0 else 1
            bound = bind(report.swap, where, cap, gpus)
            facts = SwapFacts(tuple(replace(g, kernels=()) for g in bound.gpus))
        seats.append(
            Seat(
                user=user,
                server=server,
                facts=facts,
                fresh=report is not None and now - report.received_at <= max_staleness,
                cap_mib=cap,
                size_mib=size,
                margin_mib=min(margin, size) if size > 0 else margin,
                present=bool(report and report.present),
                swaps=False,
                placement=where,
                enforced=pool_enforced(pool),
                pool=where.pool,
            )
        )
    return seats
