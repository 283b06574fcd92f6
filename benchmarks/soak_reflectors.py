"""Soak: kubespawner's own PodReflector and EventReflector against the real control plane
(`fracspawner devcluster`: kube-apiserver, etcd, kube-scheduler and kube-controller-manager
v1.36.3, the node agent running each pod as a local process; docs/controlplane.md), under a
create/ready/delete loop, for N minutes (default 10). Not part of `make bench` (it takes
minutes); run `python -m benchmarks.soak_reflectors --minutes 10`.

Reports loops completed, reflector errors logged, watch restarts (full re-lists) and whether
the watch tasks are still alive; writes benchmarks/results/soak_reflectors.json (`--print-only`
for a short trial that leaves the committed results alone).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import socket
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"

TOPOLOGY = {
    "nodes": [
        {
            "name": "gpu-1",
            "labels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
            "capacity": {"cpu": "64", "memory": "256Gi", "nvidia.com/mig-1g.10gb": "7"},
        }
    ]
}


class Counter(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(self.format(record))


def _pod(name: str, port: int) -> dict:
    server = (
        "import http.server, os;"
        "http.server.ThreadingHTTPServer((os.environ['IP'], int(os.environ['PORT'])),"
        " http.server.SimpleHTTPRequestHandler).serve_forever()"
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"component": "singleuser-server", "soak": "yes"}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "notebook",
                    "image": "python",
                    "command": [sys.executable, "-c", server],
                    "env": [
                        {"name": "IP", "value": "0.0.0.0"},
                        {"name": "PORT", "value": str(port)},
                    ],
                    "ports": [{"containerPort": port}],
                    "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}},
                }
            ],
        },
    }


async def soak(kubeconfig: Path, minutes: float) -> dict:
    from kubernetes_asyncio.client import CoreV1Api
    from kubespawner.clients import load_config, shared_client
    from kubespawner.spawner import EventReflector, PodReflector

    from fracspawner.cli.plan import use_kubeconfig

    with use_kubeconfig(kubeconfig):
        load_config()
    counter = Counter()
    logging.getLogger().addHandler(counter)
    pods = PodReflector(parent=None, namespace="default", labels={"component": "singleuser-server"})
    events = EventReflector(parent=None, namespace="default", fields={"involvedObject.kind": "Pod"})
    relists = {"n": 0}
    for reflector in (pods, events):
        original = reflector._list_and_update

        async def counting(*args, _original=original, **kwargs):
            relists["n"] += 1
            return await _original(*args, **kwargs)

        reflector._list_and_update = counting
    await asyncio.gather(pods.start(), events.start())
    api: CoreV1Api = shared_client("CoreV1Api")
    deadline = time.monotonic() + minutes * 60
    loops = 0
    failures: list[str] = []
    while time.monotonic() < deadline:
        name = f"soak-{loops}"
        await api.create_namespaced_pod("default", _pod(name, 8888))
        key = f"default/{name}"
        started = time.monotonic()
        while not (
            key in pods.pods
            and any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in pods.pods[key]["status"].get("conditions") or []
            )
        ):
            if time.monotonic() - started > 60:
                failures.append(f"{name}: not ready in 60 s")
                break
            await asyncio.sleep(0.05)
        else:
            ip = pods.pods[key]["status"]["podIP"]
            with socket.create_connection((ip, 8888), timeout=5):
                pass
        await api.delete_namespaced_pod(name, "default", grace_period_seconds=1)
        while key in pods.pods:
            await asyncio.sleep(0.05)
        loops += 1
    alive = not pods.watch_task.done() and not events.watch_task.done()
    problems = list(counter.records)  # before stop(), which logs "watcher finished" itself
    await asyncio.gather(pods.stop(), events.stop())
    return {
        "minutes": minutes,
        "spawn_stop_loops": loops,
        "failures": failures,
        "reflector_warnings_or_errors": problems[:20],
        "reflector_warning_or_error_count": len(problems),
        "full_lists_incl_timeouts": relists["n"],
        "watch_tasks_alive_at_end": alive,
        "events_seen": len(events.events),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument(
        "--print-only", action="store_true", help="print the result, write no results file"
    )
    args = parser.parse_args(argv)
    from devcluster.testing import devcluster_process

    with (
        tempfile.TemporaryDirectory() as tmp,
        devcluster_process(TOPOLOGY, Path(tmp)) as cluster,
    ):
        result = asyncio.run(soak(cluster.kubeconfig, args.minutes))
    result["cluster"] = "real control plane (kube-apiserver v1.36.3) with the node agent"
    if not args.print_only:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "soak_reflectors.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0 if not result["failures"] and result["watch_tasks_alive_at_end"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
