"""HAMi's scheduler on the real control plane: kube-scheduler with a `hami-scheduler` profile and
an HTTP scheduler extender, as HAMi's chart deploys it (charts/hami/templates/scheduler/
configmapnew.yaml: a KubeSchedulerConfiguration whose extender has `filterVerb: filter` and
manages nvidia.com/gpumem, gpumem-percentage and gpucores with `ignoredByScheduler: true`).

kube-scheduler does everything else (selectors, taints, cpu, `nvidia.com/gpu` from the node's
allocatable); the extender's filter fits the pod's containers onto single devices of the node
from HAMi's registration annotation, charged with the allocations already written onto pods, as
HAMi's Filter does (pkg/scheduler/scheduler.go): it picks one node, writes
`hami.io/vgpu-devices-allocated` and `hami.io/vgpu-node` onto the pod before answering, and
returns that node alone. The arithmetic is devcluster/hami.py's (HAMi's Fit). A pod that names
another scheduler and asks none of HAMi's own resources passes through untouched.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from devcluster import hami
from devcluster.nodeagent.client import ApiError, Client
from fracspawner.backends import hami_devices as hd

SCHEDULER_NAME = "hami-scheduler"
#: HAMi's resources no node advertises: kube-scheduler leaves them to the extender
IGNORED = (hd.RESOURCE_MEM, hd.RESOURCE_MEM_PERCENT, hd.RESOURCE_CORES)
FINISHED = ("Succeeded", "Failed")


def scheduler_profile() -> dict[str, Any]:
    """kube-scheduler's `hami-scheduler` profile, without the DynamicResources plugin: with
    DRAExtendedResource on and a DeviceClass naming an extended resource (gpu.nvidia.com's
    nvidia.com/gpu), that plugin refuses any extended resource a node neither advertises nor
    serves by DRA ("cannot fit resource", pkg/scheduler/framework/plugins/dynamicresources/
    dynamicresources.go, filterExtendedResources), which is what HAMi's gpumem and gpucores
    are. HAMi's pods claim no DRA devices."""
    return {
        "schedulerName": SCHEDULER_NAME,
        "plugins": {"multiPoint": {"disabled": [{"name": "DynamicResources"}]}},
    }


def extender_config(url: str) -> dict[str, Any]:
    """The `extenders` entry of a KubeSchedulerConfiguration for an extender at `url`."""
    return {
        "urlPrefix": url,
        "filterVerb": "filter",
        "nodeCacheCapable": False,
        "enableHTTPS": False,
        "httpTimeout": "30s",
        "managedResources": [
            {"name": hd.RESOURCE_COUNT, "ignoredByScheduler": False},
            *({"name": name, "ignoredByScheduler": True} for name in IGNORED),
        ],
    }


def is_hami_pod(pod: dict[str, Any]) -> bool:
    spec = pod.get("spec") or {}
    asks_own = any(
        name in IGNORED
        for c in spec.get("containers") or []
        for part in ("requests", "limits")
        for name in ((c.get("resources") or {}).get(part) or {})
    )
    return spec.get("schedulerName") == SCHEDULER_NAME or asks_own


def filter_nodes(
    pod: dict[str, Any],
    nodes: list[dict[str, Any]],
    pods_on: Callable[[str], list[dict[str, Any]]],
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """(the one node HAMi picks, or none; why each other node failed). Writes the allocation
    onto `pod` when one is found. `pods_on(node)`: the pods HAMi charged to that node."""
    failed: dict[str, str] = {}
    fitting = []
    for node in nodes:
        name = node["metadata"]["name"]
        if hami.node_devices(node) is None:
            failed[name] = "no HAMi device registration on the node"
            continue
        use: dict[str, Decimal] = {}
        for other in pods_on(name):
            if other["metadata"].get("uid") != pod["metadata"].get("uid"):
                hami.book_allocations(other, use)
        allocation, reason = hami.allocate(pod, node, use)
        if allocation is None:
            failed[name] = reason
        else:
            fitting.append((sum(use.values(), Decimal(0)), name, node, allocation, use))
    if not fitting:
        return [], failed
    _, name, node, allocation, use = min(fitting, key=lambda f: (f[0], f[1]))  # least used
    hami.assign(pod, name, allocation, use)
    for _, other, *_rest in fitting:
        if other != name:
            failed[other] = "HAMi placed the pod on another node"
    return [node], failed


class HamiExtender:
    """The extender's HTTP server on loopback, with an admin client for the pods' annotations."""

    def __init__(self) -> None:
        #: set by connect() once the cluster's admin kubeconfig exists (the extender's URL is
        #: needed first, for kube-scheduler's configuration)
        self.client: Client | None = None
        self._lock = threading.Lock()  # one placement at a time: each sees the last one's pods
        extender = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                if self.path.rstrip("/").endswith("/filter"):
                    answer = extender.filter(body)
                else:
                    answer = {"Error": f"unknown verb {self.path}"}
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hami"
        self._thread = threading.Thread(
            target=self.server.serve_forever, name="hami-extender", daemon=True
        )
        self._thread.start()

    def connect(self, kubeconfig: Path) -> None:
        self.client = Client(kubeconfig)

    def _charged(self) -> dict[str, list[dict[str, Any]]]:
        """Unfinished pods HAMi placed, by the node its annotation names."""
        by_node: dict[str, list[dict[str, Any]]] = {}
        if self.client is None:
            raise ValueError("not connected to the apiserver yet")
        for p in self.client.get("/api/v1/pods")["items"]:
            node = (p["metadata"].get("annotations") or {}).get(hd.ASSIGNED_NODE_ANNOTATION)
            if node and (p.get("status") or {}).get("phase") not in FINISHED:
                by_node.setdefault(node, []).append(p)
        return by_node

    def filter(self, args: dict[str, Any]) -> dict[str, Any]:
        """ExtenderArgs in, ExtenderFilterResult out (k8s.io/kube-scheduler/extender/v1: its
        fields have no json tags, so kube-scheduler sends `Pod`, `Nodes`, `NodeNames`)."""
        pod = args.get("Pod") or {}
        nodes = (args.get("Nodes") or {}).get("items") or []
        if not is_hami_pod(pod):
            return {"Nodes": {"items": nodes}, "FailedNodes": {}}
        meta = pod["metadata"]
        try:
            with self._lock:
                charged = self._charged()
                chosen, failed = filter_nodes(pod, nodes, lambda n: charged.get(n, []))
                if chosen:
                    annotations = pod["metadata"]["annotations"]
                    patch = {
                        "metadata": {
                            "annotations": {
                                k: annotations[k]
                                for k in (hd.ALLOCATED_ANNOTATION, hd.ASSIGNED_NODE_ANNOTATION)
                            }
                        }
                    }
                    path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
                    assert self.client is not None
                    self.client.merge_patch(path, patch)
        except (ApiError, OSError, ValueError) as err:
            return {"Error": f"HAMi extender: {err}"}
        return {"Nodes": {"items": chosen}, "FailedNodes": failed}

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
