"""`fracspawner usage`: per-pool and per-server GPU holdings from the current kube context.

One list of nodes and one of pods (no hub needed): per pool the slices held (placed on a node)
and waiting, their GPU-equivalents and what is still free; per server the user, server name,
pool, slice, GPU memory it is entitled to, its node and since when its pod exists. GPU activity
and the culler's plans are on the admin page (`/services/fracspawner/admin`), which asks the
culler.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from datetime import UTC, datetime
from typing import Any

from ..capacity.live import LiveCapacity
from ..capacity.snapshot import SERVERNAME_ANNOTATION, USERNAME_ANNOTATION
from ..capacity.usage import Holder, PoolUsage, holders_from_pods, pool_usage

PROG = "fracspawner usage"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument(
        "--catalog", help="catalog YAML (default: $FRACSPAWNER_CATALOG)", metavar="FILE"
    )
    parser.add_argument(
        "--kubeconfig",
        metavar="PATH",
        help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or in-cluster config)",
    )
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table")
    return parser


def _created(pod: dict[str, Any]) -> float | None:
    raw = (pod.get("metadata") or {}).get("creationTimestamp")
    try:
        return datetime.fromisoformat(str(raw).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def usage_of(
    catalog: Any, nodes: list[dict], pods: list[dict]
) -> tuple[list[PoolUsage], list[Holder]]:
    """(per pool, per server) from raw API lists (pure)."""
    live = LiveCapacity(catalog)
    live.replace_nodes(nodes)
    live.replace_pods(pods)
    started = {}
    for pod in pods:
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        key = (
            annotations.get(USERNAME_ANNOTATION) or "",
            annotations.get(SERVERNAME_ANNOTATION) or "",
        )
        created = _created(pod)
        if created is not None:
            started[key] = created
    holders = holders_from_pods(live.index.pods.values(), started)
    return pool_usage(catalog, live.snapshot(), holders), holders


def _num(value: float | None) -> str:
    return "unknown" if value is None else f"{value:g}"


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def _since(ts: float | None) -> str:
    return "" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")


def render_table(pools: list[PoolUsage], holders: list[Holder]) -> str:
    rows = [("POOL", "HELD", "WAITING", "HELD GPU", "FREE GPU", "FREE BY SIZE")]
    for p in pools:
        sizes = ", ".join(
            f"{o.spec} {'?' if o.free is None else o.free}/{'?' if o.total is None else o.total}"
            for o in p.offers
        )
        rows.append(
            (p.name, str(p.held), str(p.waiting), _num(p.held_gpu), _num(p.free_gpu), sizes)
        )
    lines = _table(rows)
    lines.append("")
    servers = [("USER", "SERVER", "POOL", "SLICE", "GPU", "MEMORY MIB", "NODE", "SINCE")]
    for h in holders:
        servers.append(
            (
                h.user or "?", h.server or "(default)", h.pool, h.gpu, _num(h.gpu_equivalent),
                "unknown" if h.memory_limit_mib is None else str(h.memory_limit_mib),
                h.node or "(waiting)", _since(h.since),
            )
        )  # fmt: skip
    lines += _table(servers) if holders else ["No pod holds a GPU slice."]
    return "\n".join(lines)


def render_json(pools: list[PoolUsage], holders: list[Holder]) -> str:
    from dataclasses import asdict

    return json.dumps(
        {"pools": [asdict(p) for p in pools], "servers": [asdict(h) for h in holders]}, indent=2
    )


def main(argv: list[str] | None = None) -> int:
    from .capacity import _one_line, list_cluster

    args = _parser().parse_args(argv)
    path = args.catalog or os.environ.get("FRACSPAWNER_CATALOG")
    if not path:
        print(
            f"{PROG}: no catalog: pass --catalog FILE or set FRACSPAWNER_CATALOG", file=sys.stderr
        )
        return 2
    try:
        from ..backends import load_catalog

        catalog = load_catalog(path)
    except Exception as exc:  # any catalog problem: one line, no traceback
        print(f"{PROG}: bad catalog {path}: {_one_line(exc)}", file=sys.stderr)
        return 2
    if args.kubeconfig and not os.path.isfile(args.kubeconfig):
        print(f"{PROG}: no such kubeconfig: {args.kubeconfig}", file=sys.stderr)
        return 2
    try:
        nodes, pods = asyncio.run(list_cluster(args.kubeconfig))
    except Exception as exc:
        print(f"{PROG}: cannot read nodes and pods: {_one_line(exc)}", file=sys.stderr)
        return 1
    pools, holders = usage_of(catalog, nodes, pods)
    render = render_json if args.output == "json" else render_table
    print(render(pools, holders))
    return 0


if __name__ == "__main__":
    sys.exit(main())
