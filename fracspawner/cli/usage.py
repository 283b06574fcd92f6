"""`fracspawner usage`: per-pool and per-server GPU holdings from the current kube context.

One list of nodes and one of pods (no hub needed): per pool the slices held (placed on a node)
and waiting, their GPU-equivalents and what is still free; per server the user, server name,
pool, slice, GPU memory it is entitled to, its node and since when its pod exists. GPU activity
and the culler's plans are on the admin page (`/services/fracspawner/admin`), which asks the
culler.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from ..capacity.live import LiveCapacity
from ..capacity.snapshot import SERVERNAME_ANNOTATION, USERNAME_ANNOTATION
from ..capacity.usage import (
    Holder,
    PoolUsage,
    holders_from_pods,
    memory_words,
    pool_usage,
    slice_words,
)
from ..k8s.objects import created_at
from ..model.units import gpu_share, utc_minute
from .capacity import cluster_parser, read_cluster, read_dra, table

PROG = "fracspawner usage"


def usage_of(
    catalog: Any,
    nodes: list[dict],
    pods: list[dict],
    slices: list[dict] | tuple = (),
    claims: list[dict] | tuple = (),
) -> tuple[list[PoolUsage], list[Holder]]:
    """(per pool, per server) from raw API lists (pure); ResourceSlices and ResourceClaims
    count the DRA pools, as for `fracspawner capacity` and the admin page (issue 38 #3)."""
    live = LiveCapacity(catalog)
    live.replace_nodes(nodes)
    live.replace_pods(pods)
    live.replace_slices(slices)
    live.replace_claims(claims)
    started = {}
    for pod in pods:
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        key = (
            annotations.get(USERNAME_ANNOTATION) or "",
            annotations.get(SERVERNAME_ANNOTATION) or "",
        )
        created = created_at(pod)
        if created is not None:
            started[key] = created
    holders = holders_from_pods(live.index.pods.values(), started)
    return pool_usage(catalog, live.snapshot(), holders), holders


def _num(value: float | None) -> str:
    """GPU amounts in the picker's words ("1/7", "6/7", "1 1/2"), never "0.142857"."""
    return "unknown" if value is None else gpu_share(value)


def render_table(pools: list[PoolUsage], holders: list[Holder]) -> str:
    rows = [("POOL", "HELD", "WAITING", "HELD GPU", "FREE GPU", "FREE BY SIZE")]
    for p in pools:
        sizes = ", ".join(
            f"{o.label or o.spec} {'?' if o.free is None else o.free}/"
            f"{'?' if o.total is None else o.total}"
            for o in p.offers
        )
        rows.append(
            (p.name, str(p.held), str(p.waiting), _num(p.held_gpu), _num(p.free_gpu), sizes)
        )
    lines = table(rows)
    means: dict[str, list[str]] = {}
    for p in pools:
        if p.free_means:
            means.setdefault(p.free_means, []).append(p.name)
    for text, names in means.items():
        lines.append(f"FREE GPU of {', '.join(names)}: {text}")
    lines.append("")
    # the slice in the picker's words and the memory as the admin page says it (issue 38 #3)
    servers = [("USER", "SERVER", "POOL", "SLICE", "GPU", "MEMORY", "NODE", "SINCE")]
    for h in holders:
        servers.append(
            (
                h.user or "?", h.server or "(default)", h.pool, slice_words(h.gpu),
                _num(h.gpu_equivalent),
                "unknown" if h.memory_limit_mib is None else memory_words(h.memory_limit_mib),
                h.node or "(waiting)", utc_minute(h.since),
            )
        )  # fmt: skip
    lines += table(servers) if holders else ["No pod holds a GPU slice."]
    return "\n".join(lines)


def render_json(pools: list[PoolUsage], holders: list[Holder]) -> str:
    from dataclasses import asdict

    return json.dumps(
        {"pools": [asdict(p) for p in pools], "servers": [asdict(h) for h in holders]}, indent=2
    )


def main(argv: list[str] | None = None) -> int:
    args = cluster_parser(PROG, __doc__.splitlines()[0]).parse_args(argv)
    read = read_cluster(PROG, args)
    if isinstance(read, int):
        return read
    catalog, nodes, pods = read
    slices, claims = read_dra(PROG, catalog, args.kubeconfig)
    pools, holders = usage_of(catalog, nodes, pods, slices, claims)
    render = render_json if args.output == "json" else render_table
    print(render(pools, holders))
    return 0


if __name__ == "__main__":
    sys.exit(main())
