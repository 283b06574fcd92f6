"""`fracspawner capacity`: free/total per pool and offer from the current kube context.

One list of nodes and one of pods, then the same pure counting the spawn form uses.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from ..capacity.apiconfig import load_configuration
from ..capacity.count import Capacity, OfferCapacity, compute_capacity
from ..capacity.live import uses_dra

PROG = "fracspawner capacity"


def cluster_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """The arguments of the commands that read a kube context (capacity, usage)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
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


async def list_cluster(kubeconfig: str | None) -> tuple[list[dict], list[dict]]:
    """All nodes and all pods, as raw API dicts (one list call each)."""
    from kubernetes_asyncio import client

    api_client = client.ApiClient(await load_configuration(kubeconfig))
    async with api_client:
        v1 = client.CoreV1Api(api_client)
        nodes = await v1.list_node(_preload_content=False)
        pods = await v1.list_pod_for_all_namespaces(_preload_content=False)
        out = []
        for response in (nodes, pods):
            body = await response.read()
            if not response.ok:
                raise client.ApiException(status=response.status, reason=response.reason)
            out.append(json.loads(body).get("items") or [])
    return out[0], out[1]


async def list_dra(kubeconfig: str | None) -> tuple[list[dict], list[dict]]:
    """All ResourceSlices and ResourceClaims (resource.k8s.io/v1), for DRA pools."""
    from kubernetes_asyncio import client

    api_client = client.ApiClient(await load_configuration(kubeconfig))
    async with api_client:
        api = client.ResourceV1Api(api_client)
        out = []
        for call in (api.list_resource_slice, api.list_resource_claim_for_all_namespaces):
            response = await call(_preload_content=False)
            body = await response.read()
            if not response.ok:
                raise client.ApiException(status=response.status, reason=response.reason)
            out.append(json.loads(body).get("items") or [])
    return out[0], out[1]


def table(rows: list[tuple[str, ...]]) -> list[str]:
    """Columns padded to their widest cell, two spaces apart, no trailing blanks."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def _counts(c: OfferCapacity) -> str:
    if c.free is None or c.total is None:
        return "unknown"
    return f"{c.free}/{c.total}"


def render_table(catalog: Any, capacity: Capacity) -> str:
    rows = [("POOL", "OFFER", "FREE/TOTAL", "NOTE")]
    for name, pool in catalog.pools.items():
        for offer in pool.offers:
            c = capacity.get(name, str(offer))
            rows.append((name, str(offer), _counts(c), c.note))
    lines = table(rows)
    lines.append(f"({capacity.nodes_seen} nodes seen)")
    return "\n".join(lines)


def render_json(catalog: Any, capacity: Capacity) -> str:
    pools = {
        name: {
            str(o): {
                "free": capacity.get(name, str(o)).free,
                "total": capacity.get(name, str(o)).total,
                "note": capacity.get(name, str(o)).note,
            }
            for o in pool.offers
        }
        for name, pool in catalog.pools.items()
    }
    return json.dumps({"nodes_seen": capacity.nodes_seen, "pools": pools}, indent=2)


def _one_line(exc: BaseException) -> str:
    status = getattr(exc, "status", None)
    if status:
        text = f"HTTP {status} {getattr(exc, 'reason', '') or ''}".strip()
    else:
        text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def no_kube_context(kubeconfig: str | None) -> str:
    """Why there is no kube context to use, in words, or '' when there is one. Mirrors how the
    client finds one (in-cluster inside a pod, else $KUBECONFIG, else ~/.kube/config; the
    kubeconfig's current-context), so the user reads this and not the client's raw error."""
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        return ""
    paths = [kubeconfig] if kubeconfig else None
    if paths is None:
        env = os.environ.get("KUBECONFIG", "")
        paths = [p for p in env.split(os.pathsep) if p] or [os.path.expanduser("~/.kube/config")]
    found = [p for p in paths if os.path.isfile(p)]
    if not found:
        return "no kube context: pass --kubeconfig FILE, or set KUBECONFIG (none at " + (
            ", ".join(paths) + ")"
        )
    import yaml

    for path in found:
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            return f"cannot read the kubeconfig {path}: {_one_line(exc)}"
        if isinstance(data, dict) and data.get("current-context"):
            return ""
    return (
        f"no kube context: {', '.join(found)} names no current-context; "
        "run `kubectl config use-context NAME` or pass --kubeconfig FILE"
    )


def read_dra(prog: str, catalog: Any, kubeconfig: str | None) -> tuple[list[dict], list[dict]]:
    """The ResourceSlices and ResourceClaims when the catalog has a DRA pool; on an error
    (said on stderr) none, so DRA pools show as unknown and the others as counted."""
    if not uses_dra(catalog):
        return [], []
    try:
        return asyncio.run(list_dra(kubeconfig))
    except Exception as exc:
        print(f"{prog}: cannot read ResourceSlices/Claims: {_one_line(exc)}", file=sys.stderr)
        return [], []


def read_cluster(prog: str, args: argparse.Namespace) -> tuple[Any, list[dict], list[dict]] | int:
    """(catalog, nodes, pods) for `cluster_parser`'s arguments, or the exit code after one line
    on stderr saying what is missing or wrong (no traceback)."""
    path = args.catalog or os.environ.get("FRACSPAWNER_CATALOG")
    if not path:
        print(
            f"{prog}: no catalog: pass --catalog FILE or set FRACSPAWNER_CATALOG", file=sys.stderr
        )
        return 2
    try:
        from ..backends import load_catalog

        catalog = load_catalog(path)
    except Exception as exc:  # any catalog problem: one line, no traceback
        print(f"{prog}: bad catalog {path}: {_one_line(exc)}", file=sys.stderr)
        return 2
    try:  # imported lazily below: say which extra it comes with instead of a traceback
        import kubernetes_asyncio  # noqa: F401
    except ImportError as exc:
        print(
            f"{prog}: needs the Python package {exc.name or 'kubernetes_asyncio'!r}, which is "
            "not installed; install fracspawner[hub] (in a checkout: pip install -e '.[hub]')",
            file=sys.stderr,
        )
        return 2
    if args.kubeconfig and not os.path.isfile(args.kubeconfig):
        print(f"{prog}: no such kubeconfig: {args.kubeconfig}", file=sys.stderr)
        return 2
    if missing := no_kube_context(args.kubeconfig):
        print(f"{prog}: {missing}", file=sys.stderr)
        return 2
    try:
        nodes, pods = asyncio.run(list_cluster(args.kubeconfig))
    except Exception as exc:
        from .unreachable import unreachable_line

        said = (
            unreachable_line(exc, args.kubeconfig)
            or f"cannot read nodes and pods: {_one_line(exc)}"
        )
        print(f"{prog}: {said}", file=sys.stderr)
        return 1
    return catalog, nodes, pods


def main(argv: list[str] | None = None) -> int:
    args = cluster_parser(PROG, __doc__.splitlines()[0]).parse_args(argv)
    read = read_cluster(PROG, args)
    if isinstance(read, int):
        return read
    catalog, nodes, pods = read
    slices, claims = read_dra(PROG, catalog, args.kubeconfig)
    capacity = compute_capacity(catalog, nodes, pods, slices, claims)
    render = render_json if args.output == "json" else render_table
    print(render(catalog, capacity))
    return 0


if __name__ == "__main__":
    sys.exit(main())
