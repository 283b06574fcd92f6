"""`python -m devcluster.nodeagent --kubeconfig STATE/admin.kubeconfig --topology FILE`: register
the topology's nodes with a running control plane (python -m devcluster.controlplane) and keep
them Ready until Ctrl-C or SIGTERM. Node certificates are signed with the launcher's cluster
CA (STATE/pki/ca.crt and ca.key, beside the kubeconfig, unless --pki says otherwise)."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

import yaml

from devcluster.controlplane.pki import KeyPair
from devcluster.topology import load_topology

from .agent import NodeAgent
from .client import ApiError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devcluster.nodeagent", description=__doc__)
    parser.add_argument(
        "--kubeconfig", type=Path, required=True, help="the launcher's admin kubeconfig"
    )
    parser.add_argument("--topology", type=Path, required=True, help="a topology YAML file")
    parser.add_argument(
        "--pki",
        type=Path,
        default=None,
        help="the cluster CA's directory (default: KUBECONFIG's pki/)",
    )
    parser.add_argument(
        "--mode",
        choices=("no-run", "run"),
        default="no-run",
        help="no-run: pods are reported Running and nothing runs (as kwok); "
        "run: each pod's containers (init, sidecar, app) run as local processes",
    )
    parser.add_argument(
        "--network",
        choices=("host", "namespaces"),
        default="host",
        help="run mode's pod network: host (a loopback address per pod) or namespaces (a "
        "network namespace per pod, Services proxied and named by a cluster DNS; needs root)",
    )
    args = parser.parse_args(argv)

    def say(msg: str) -> None:
        print(f"nodeagent: {msg}", file=sys.stderr, flush=True)

    def stop_on(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop_on)
    try:
        config = yaml.safe_load(args.kubeconfig.read_text())
        server = config["clusters"][0]["cluster"]["server"]
        topology = load_topology(args.topology)
    except (OSError, KeyError, IndexError, TypeError, ValueError, yaml.YAMLError) as err:
        say(f"cannot read the kubeconfig or topology: {err}")
        return 2
    pki = args.pki or args.kubeconfig.resolve().parent / "pki"
    state = args.kubeconfig.resolve().parent / "nodeagent"
    agent = None
    try:  # a stop request (SIGTERM, Ctrl-C) at any point, registration included, ends cleanly
        agent = NodeAgent.start(
            topology,
            server,
            KeyPair(pki / "ca.crt", pki / "ca.key"),
            state,
            mode=args.mode,
            network=args.network,
            say=say,
        )
        what = "run as local processes" if args.mode == "run" else "reported Running, not run"
        say(f"{len(agent.runners)} nodes Ready; pods bound to them are {what} (Ctrl-C stops)")
        signal.pause()
    except KeyboardInterrupt:
        say("stopping")
    except (ApiError, OSError, ValueError) as err:
        say(f"registration failed: {err}")
        return 1
    finally:
        if agent is not None:
            agent.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
