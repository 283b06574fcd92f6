"""`fracspawner devcluster --topology FILE [--kubeconfig PATH] [--state-dir DIR]`: the real
control plane with the node agent running the topology's pods, in the foreground
(devcluster/realcluster.py)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import yaml

from .topology import load_topology


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="fracspawner devcluster",
        description="A local Kubernetes with simulated GPU nodes, for demos and tests: "
        "kube-apiserver, etcd, kube-scheduler and kube-controller-manager (make controlplane) "
        "with the node agent running the pods as local processes.",
    )
    parser.add_argument("--topology", required=True, type=Path, help="topology YAML file")
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        default=Path(".devcluster/kubeconfig"),
        help="where to write the admin kubeconfig",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=Path(".devcluster"),
        help="the cluster's certificates, etcd data, logs and pods' home directories",
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
    from .realcluster import run

    return run(args.topology, args.state_dir, args.kubeconfig)
