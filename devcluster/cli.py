"""`fracspawner devcluster --topology FILE [--kubeconfig PATH] [--state-dir DIR]`: the real
control plane with the node agent, in the foreground."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

import yaml

from .cluster import DevCluster
from .topology import load_topology


async def _serve(args: argparse.Namespace) -> None:
    cluster = DevCluster(
        args.topology,
        host=args.host,
        port=args.port,
        state_dir=args.state_dir,
        kubeconfig=args.kubeconfig,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await cluster.start()
    try:
        print(f"devcluster ready: {cluster.url} kubeconfig={cluster.kubeconfig_path}", flush=True)
        await stop.wait()
    finally:
        await cluster.stop()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="fracspawner devcluster",
        description="A local Kubernetes stand-in with simulated GPU nodes (for demos and tests).",
    )
    parser.add_argument("--topology", required=True, type=Path, help="topology YAML file")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=0, help="port (0: pick a free one)")
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        default=Path(".devcluster/kubeconfig"),
        help="where to write the kubeconfig",
    )
    parser.add_argument(
        "--state-dir", type=Path, default=Path(".devcluster"), help="pod home directories and logs"
    )
    parser.add_argument(
        "--control-plane",
        choices=("python", "real"),
        default="real",
        help="real: kube-apiserver, etcd, kube-scheduler and kube-controller-manager (make "
        "controlplane) with the node agent running the pods; python: the Python API server "
        "(going, issue 35 item 4)",
    )
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    if not args.topology.is_file():
        print(f"fracspawner devcluster: topology not found: {args.topology}", file=sys.stderr)
        return 2
    try:  # a bad topology is one line and exit 2, before anything starts
        load_topology(args.topology)
    except (ValueError, KeyError, TypeError, yaml.YAMLError) as exc:
        why = f"an entry has no {exc} key" if isinstance(exc, KeyError) else str(exc)
        why = " ".join(why.split())  # a YAML error's lines, on one
        print(f"fracspawner devcluster: {args.topology}: {why}", file=sys.stderr)
        return 2
    if args.control_plane == "real":
        from .realcluster import run

        return run(args.topology, args.state_dir, args.kubeconfig)
    try:
        asyncio.run(_serve(args))
    except (ValueError, OSError) as exc:
        print(f"fracspawner devcluster: {exc}", file=sys.stderr)
        return 2
    return 0
