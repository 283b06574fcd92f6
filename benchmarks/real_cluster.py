"""The scale benchmark's cluster on the real control plane (issue 35, issue 37's "Measure").

`ScaleCluster.start(dir, topology)` starts the control plane (devcluster/controlplane: etcd,
kube-apiserver, kube-scheduler, kube-controller-manager), then writes the 1,000 background nodes
and their 20,000 pods straight through the API with the admin's certificate, as kwok does: each
pod is created bound (`spec.nodeName`) and given a Running status; nothing runs and no agent
thread watches them (the node agent keeps one thread and one watch per node: fine for a few
nodes, not for 1,000). A lease keeper renews the background nodes' Leases so the node-lifecycle
controller keeps them Ready, and the background pods tolerate an unreachable node anyway, so a
late renewal never evicts them. The background nodes are cordoned: the storm's pods go to the
STORM_NODES T4 nodes of a node agent in "run" mode, which runs each as a local process (the
storm's hubs need an answering server), exactly as the Python devcluster did.
"""

from __future__ import annotations

import base64
import http.client
import json
import ssl
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from devcluster.controlplane import ControlPlane
from devcluster.nodeagent import NodeAgent, podstatus
from devcluster.nodeagent.nodeobject import LEASE_NAMESPACE, lease, now, registration, status
from devcluster.topology import load_topology, normalise_node

#: run-mode T4 nodes the storms' pods land on (8 GPUs x 4 time-slicing replicas each: 224
#: quarter-GPU pods, for 200 storm spawns and a warm-up)
STORM_NODES = 7
#: the node-lifecycle controller's grace period is 50 s (1.32+): renew well inside it
LEASE_RENEW_SECONDS = 20.0
WORKERS = 8
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases"
#: a background pod stays bound to its node whatever the node-lifecycle controller decides
FOREVER = [
    {"key": key, "operator": "Exists", "effect": "NoExecute"}
    for key in ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")
]


class Api:
    """Keep-alive HTTPS to the apiserver with the admin's client certificate, one connection per
    thread (the many writes of a 20,000-pod cluster: urllib's connection per request is slow)."""

    def __init__(self, server: str, ca: str, cert: str, key: str) -> None:
        parts = urllib.parse.urlsplit(server)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 443
        self.tls = ssl.create_default_context(cafile=ca)
        self.tls.load_cert_chain(cert, key)
        self._local = threading.local()

    def _connection(self) -> http.client.HTTPSConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = http.client.HTTPSConnection(self.host, self.port, context=self.tls, timeout=60)
            self._local.conn = conn
        return conn

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = content_type
        for attempt in range(3):
            conn = self._connection()
            try:
                conn.request(method, path, body=data, headers=headers)
                response = conn.getresponse()
                text = response.read()
                break
            except (OSError, http.client.HTTPException):
                conn.close()
                self._local.conn = None
                if attempt == 2:
                    raise
                time.sleep(0.5)
        return response.status, json.loads(text) if text else None

    def ok(self, method: str, path: str, body: Any = None, *, allow: Iterable[int] = ()) -> Any:
        code, answer = self.request(method, path, body)
        if code >= 300 and code not in allow:
            raise RuntimeError(f"{method} {path}: {code} {str(answer)[:300]}")
        return answer

    def merge_patch(self, path: str, body: Any) -> Any:
        code, answer = self.request("PATCH", path, body, "application/merge-patch+json")
        if code >= 300:
            raise RuntimeError(f"PATCH {path}: {code} {str(answer)[:300]}")
        return answer


def _pod_manifest(pod: dict[str, Any]) -> dict[str, Any]:
    """generate_large's pod as a bound pod of the cluster (kubespawner's labels, FracSpawner's
    annotations, its node), tolerating its node's loss forever."""
    resources: dict[str, Any] = {"requests": dict(pod["requests"])}
    if pod["limits"]:
        resources["limits"] = dict(pod["limits"])
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod["name"],
            "namespace": pod["namespace"],
            "labels": dict(pod["labels"]),
            "annotations": dict(pod["annotations"]),
        },
        "spec": {
            "nodeName": pod["node"],
            "containers": [
                {
                    "name": "notebook",
                    "image": "quay.io/jupyter/base-notebook:latest",
                    "ports": [{"name": "notebook-port", "containerPort": 8888}],
                    "resources": resources,
                }
            ],
            "tolerations": FOREVER,
        },
    }


class ScaleCluster:
    """The control plane, its background nodes and pods, the lease keeper and the storm nodes'
    run-mode agent; `stop()` ends all of it."""

    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        self.kubeconfig = cp.kubeconfig
        self.api = Api(
            cp.server, str(cp.pki.ca.cert), str(cp.pki.admin.cert), str(cp.pki.admin.key)
        )
        self.agent: NodeAgent | None = None
        self.background: list[str] = []
        self.populate_seconds: dict[str, float] = {}
        self.lease_renewals = 0
        self._stop = threading.Event()
        self._keeper: threading.Thread | None = None

    @classmethod
    def start(
        cls,
        state_dir: Path,
        topology: dict[str, Any],
        say: Callable[[str], None] = print,
        *,
        storm_nodes: bool = True,
    ) -> ScaleCluster:
        """Must be called from a thread that lives as long as the cluster (the components die
        with the thread that started them: PR_SET_PDEATHSIG). `storm_nodes`: start the node
        agent's run-mode nodes for spawns (a benchmark that spawns nothing leaves them out)."""
        cp = ControlPlane.start(Path(state_dir) / "controlplane", timeout=600, progress=say)
        cluster = cls(cp)
        try:
            cluster._populate(topology, say)
            if storm_nodes:
                cluster._start_agent(topology, Path(state_dir) / "agent", say)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    # --- population -------------------------------------------------------------------------
    def _populate(self, topology: dict[str, Any], say: Callable[[str], None]) -> None:
        version = self.api.ok("GET", "/version")["gitVersion"]
        nodes = [normalise_node(n) for n in topology["nodes"]]
        for node in nodes:  # the storm's pods go to the agent's nodes only
            node.setdefault("spec", {})["unschedulable"] = True
        self.background = [n["metadata"]["name"] for n in nodes]
        started = time.monotonic()

        def add_node(node: dict[str, Any]) -> None:
            name = node["metadata"]["name"]
            created = self.api.ok("POST", "/api/v1/nodes", registration(node))
            self.api.merge_patch(f"/api/v1/nodes/{name}/status", {"status": status(node, version)})
            self.api.ok("POST", LEASES, lease(name, created["metadata"]["uid"]))

        with ThreadPoolExecutor(WORKERS) as pool:
            list(pool.map(add_node, nodes))
        self.populate_seconds["nodes"] = round(time.monotonic() - started, 1)
        say(f"{len(nodes)} nodes in {self.populate_seconds['nodes']} s")
        self._keeper = threading.Thread(target=self._keep_leases, daemon=True, name="leases")
        self._keeper.start()

        started = time.monotonic()
        t = now()

        def add_pod(pod: dict[str, Any]) -> None:
            path = f"/api/v1/namespaces/{pod['namespace']}/pods"
            created = self.api.ok("POST", path, _pod_manifest(pod))
            pod_status = podstatus.running(created, pod["podIP"], "127.0.0.1", t)
            self.api.merge_patch(f"{path}/{pod['name']}/status", {"status": pod_status})

        with ThreadPoolExecutor(WORKERS) as pool:
            for i, _ in enumerate(pool.map(add_pod, topology["pods"]), 1):
                if i % 5000 == 0:
                    say(f"{i} pods ({time.monotonic() - started:.0f} s)")
        self.populate_seconds["pods"] = round(time.monotonic() - started, 1)
        say(f"{len(topology['pods'])} pods in {self.populate_seconds['pods']} s")

    def _keep_leases(self) -> None:
        """Renew every background node's Lease each LEASE_RENEW_SECONDS, as its kubelet would."""

        def renew(name: str) -> None:
            body = {"spec": {"renewTime": now(micro=True)}}
            try:
                self.api.merge_patch(f"{LEASES}/{name}", body)
                self.lease_renewals += 1
            except (RuntimeError, OSError, http.client.HTTPException):
                pass  # the apiserver restarting: the next round renews it

        with ThreadPoolExecutor(2) as pool:
            while not self._stop.wait(LEASE_RENEW_SECONDS):
                try:
                    list(pool.map(renew, self.background))
                except Exception as err:  # never let the keeper die: the nodes would go NotReady
                    print(f"lease keeper: {err!r}", flush=True)

    def _start_agent(self, topology: dict[str, Any], state_dir: Path, say: Callable) -> None:
        """STORM_NODES T4 nodes like the topology's, run by the node agent in run mode."""
        t4 = next(n for n in topology["nodes"] if n["name"].startswith("t4"))
        storm = [{**t4, "name": f"t4-storm-{i}"} for i in range(STORM_NODES)]
        self.agent = NodeAgent.start(
            load_topology({"nodes": storm}),
            self.cp.server,
            self.cp.pki.ca,
            state_dir,
            mode="run",
        )
        say(f"node agent (run mode) for {STORM_NODES} storm nodes")
        # a new node carries node.kubernetes.io/not-ready until the node-lifecycle controller
        # sees it Ready: FracSpawner counts no slot there meanwhile (a loaded run refused)
        deadline = time.monotonic() + 300
        names = {f"t4-storm-{i}" for i in range(STORM_NODES)}
        while True:
            nodes = self.api.ok("GET", "/api/v1/nodes?labelSelector=nvidia.com%2Fgpu.product")
            ready = {
                n["metadata"]["name"]
                for n in nodes["items"]
                if n["metadata"]["name"] in names and not (n.get("spec") or {}).get("taints")
            }
            if ready == names:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"storm nodes still tainted after 300 s: {names - ready}")
            time.sleep(1)
        say("storm nodes ready and untainted")

    # --- what the benchmark does to it ---------------------------------------------------------
    def pod_names(self, namespace: str = "default", selector: str = "") -> list[str]:
        query = f"?labelSelector={urllib.parse.quote(selector)}" if selector else ""
        listing = self.api.ok("GET", f"/api/v1/namespaces/{namespace}/pods{query}")
        return [p["metadata"]["name"] for p in listing["items"]]

    def delete_pods(self, prefixes: tuple[str, ...], timeout: float = 300) -> None:
        """Delete the pods whose names start so and wait until they are gone."""

        def left() -> list[str]:
            return [n for n in self.pod_names() if n.startswith(prefixes)]

        for name in left():
            self.api.ok("DELETE", f"/api/v1/namespaces/default/pods/{name}", allow=(404,))
        deadline = time.monotonic() + timeout
        while remaining := left():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(remaining)} pods left after {timeout} s: {remaining[:5]}")
            time.sleep(1)

    def restart_apiserver(self, extra: Iterable[str] = (), timeout: float = 180) -> float:
        return restart_apiserver(self.cp, extra, timeout)

    def compact_etcd(self) -> int:
        return compact_etcd(self.cp)

    def stop(self) -> None:
        self._stop.set()
        if self.agent is not None:
            self.agent.stop()
        if self._keeper is not None:
            self._keeper.join(timeout=60)
        self.cp.stop()


def restart_apiserver(cp: ControlPlane, extra: Iterable[str] = (), timeout: float = 180) -> float:
    """Stop kube-apiserver alone and start it again (with `extra` flags); the seconds until it
    is ready again. etcd, the scheduler and the controller manager stay up."""
    component = next(c for c in cp.components if c.name == "kube-apiserver")
    base = [a for a in component.argv if not a.startswith("--watch-cache-sizes")]
    started = time.monotonic()
    component.stop()
    component.argv = [*base, *extra]
    component.start()
    while True:
        try:
            if cp.client.request("GET", "/readyz", timeout=5)[0] == 200:
                break
        except OSError:
            pass
        component.check()
        if time.monotonic() - started > timeout:
            raise RuntimeError(f"kube-apiserver not ready {timeout} s after its restart")
        time.sleep(0.1)
    return time.monotonic() - started


def compact_etcd(cp: ControlPlane) -> int:
    """Compact etcd at its current revision (etcd's gRPC gateway, on by default in
    embed.NewConfig); the revision compacted at. A watch asked from an older version then
    gets 410 Gone wherever the apiserver reads etcd for it."""
    url = f"http://127.0.0.1:{cp.ports.etcd_client}/v3"
    key = base64.b64encode(b"/registry").decode()
    revision = int(_post(f"{url}/kv/range", {"key": key, "limit": 1})["header"]["revision"])
    _post(f"{url}/kv/compaction", {"revision": revision, "physical": True})
    return revision


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())
