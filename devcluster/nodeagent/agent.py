"""The node agent: stands in for the kubelet of every node of a topology against the real
control plane. Per node, with the node's own credentials (credentials.py), one thread
registers the Node and its status, creates its Lease, publishes its ResourceSlices (slices.py)
and then watches the pods bound to it: each gets a Running status without anything being run
("pods do not run", as kwok does) or, in "run" mode, its first container runs as a local process
(runtime.py) and is reported Running, then Succeeded or Failed when it exits. A pod with a
deletionTimestamp is removed with grace 0, as a kubelet does once its containers stopped.
Between watch requests the Lease is renewed every RENEW_SECONDS."""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from http.client import HTTPException
from pathlib import Path
from typing import Any

from devcluster.controlplane.pki import KeyPair
from devcluster.dra.nvidia import DRIVER
from devcluster.kubelet import ConfigError

from . import nodeobject, podstatus
from .client import ApiError, Client
from .credentials import node_kubeconfig
from .runtime import START_ERRORS, ProcessRuntime
from .slices import node_slices

RENEW_SECONDS = 10.0  # the kubelet renews at a quarter of the lease's 40 s
WATCH_SECONDS = 3  # each watch request ends this often, so renewals and stop() are timely
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


class NodeRunner:
    """One node: its identity, registration, heartbeat and pods."""

    def __init__(
        self,
        node: Mapping[str, Any],
        dra: Mapping[str, Any] | None,
        client: Client,
        index: int,
        say: Callable[[str], None],
        runtime: ProcessRuntime | None = None,
    ) -> None:
        self.node = node
        self.name = node["metadata"]["name"]
        self.dra = dra
        self.client = client
        self.index = index
        self._say = say
        self._ips: dict[str, str] = {}  # pod uid -> IP
        self.runtime = runtime
        self._started: dict[str, dict[str, Any]] = {}  # run mode: pod uid -> the pod
        self._settled: set[str] = set()  # run mode: uids whose start failed or that exited
        #: where in-cluster clients find the apiserver; the kubelet also sets every other
        #: Service's {SVC}_SERVICE_HOST/PORT variables, which the agent does not (yet)
        self.service_env: dict[str, str] = {}
        self.uid = ""
        self.renewed = 0.0
        self.error: BaseException | None = None

    # --- registration ----------------------------------------------------------------------
    def register(self, version: str) -> None:
        path = f"/api/v1/nodes/{self.name}"
        try:
            created = self.client.create("/api/v1/nodes", nodeobject.registration(self.node))
        except ApiError as err:
            if err.status != 409:
                raise
            meta = nodeobject.registration(self.node)["metadata"]
            patch = {"metadata": {"labels": meta["labels"], "annotations": meta["annotations"]}}
            created = self.client.merge_patch(path, patch)
        self.uid = created["metadata"]["uid"]
        self.client.merge_patch(f"{path}/status", {"status": nodeobject.status(self.node, version)})
        self._renew()
        if self.dra:
            self._publish_slices()

    def _publish_slices(self) -> None:
        selector = f"spec.nodeName={self.name},spec.driver={DRIVER}"
        for old in self.client.get(SLICES, fieldSelector=selector)["items"]:
            self.client.delete(f"{SLICES}/{old['metadata']['name']}")
        owner = {"apiVersion": "v1", "kind": "Node", "name": self.name, "uid": self.uid}
        for piece in node_slices(self.name, self.dra or {}):
            piece["metadata"]["ownerReferences"] = [owner]
            self.client.create(SLICES, piece)

    def _renew(self) -> None:
        ns = nodeobject.LEASE_NAMESPACE
        lease = nodeobject.lease(self.name, self.uid)
        try:
            self.client.merge_patch(
                f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{self.name}",
                {"spec": {"renewTime": lease["spec"]["renewTime"]}},
            )
        except ApiError as err:
            if err.status != 404:
                raise
            self.client.create(f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases", lease)
        self.renewed = time.monotonic()

    # --- pods ------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        pods = "/api/v1/pods"
        selector = f"spec.nodeName={self.name}"
        while not stop.is_set():
            listed = self.client.get(pods, fieldSelector=selector)
            for pod in listed["items"]:
                self._reconcile(pod)
            version = listed["metadata"]["resourceVersion"]
            while not stop.is_set():
                if time.monotonic() - self.renewed >= RENEW_SECONDS:
                    self._renew()
                self._report_exits()
                try:
                    for event in self.client.watch(
                        pods, WATCH_SECONDS, fieldSelector=selector, resourceVersion=version
                    ):
                        if event["type"] == "ERROR":
                            raise ApiError(event["object"].get("code", 500), "WATCH", pods,
                                           json.dumps(event["object"]))  # fmt: skip
                        version = event["object"]["metadata"]["resourceVersion"]
                        if event["type"] in ("ADDED", "MODIFIED"):
                            self._reconcile(event["object"])
                        elif event["type"] == "DELETED":
                            self._ips.pop(event["object"]["metadata"]["uid"], None)
                except ApiError as err:
                    if err.status == 410:  # resourceVersion too old: list again
                        break
                    raise

    def _reconcile(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{urllib.parse.quote(meta['name'])}"
        try:
            if meta.get("deletionTimestamp"):
                if self.runtime is not None and self._started.pop(meta["uid"], None):
                    grace = min(int(meta.get("deletionGracePeriodSeconds") or 30), 30)
                    self.runtime.stop(meta["namespace"], meta["name"], grace)
                body = {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}}
                self.client.delete(path, body)
                self._ips.pop(meta["uid"], None)
            elif self.runtime is not None:
                self._run(pod, path)
            elif not podstatus.reported(pod):
                status = podstatus.running(
                    pod, self._ip(meta["uid"]), "127.0.0.1", nodeobject.now()
                )
                self.client.merge_patch(f"{path}/status", {"status": status})
        except ApiError as err:
            if err.status not in (404, 409):  # gone, or replaced by a pod of the same name
                raise

    def _run(self, pod: dict[str, Any], path: str) -> None:
        """Run mode: start a new pod's container and report it Running, or why it did not."""
        meta = pod["metadata"]
        uid = meta["uid"]
        if uid in self._started or uid in self._settled:
            return
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            self._settled.add(uid)
            return
        assert self.runtime is not None
        try:
            ip = self.runtime.start(pod, self._lookup, self.service_env)
        except START_ERRORS as err:
            self._settled.add(uid)
            config = isinstance(err, ConfigError)
            reason = "CreateContainerConfigError" if config else "CreateContainerError"
            status = podstatus.waiting(pod, reason, str(err), nodeobject.now())
        else:
            self._started[uid] = pod
            status = podstatus.running(pod, ip, "127.0.0.1", nodeobject.now())
        self.client.merge_patch(f"{path}/status", {"status": status})

    def _report_exits(self) -> None:
        """Run mode: a container that exited makes its pod Succeeded or Failed."""
        if self.runtime is None:
            return
        for uid, pod in list(self._started.items()):
            meta = pod["metadata"]
            code = self.runtime.exit_code(meta["namespace"], meta["name"])
            if code is None:
                continue
            del self._started[uid]
            self._settled.add(uid)
            path = f"/api/v1/namespaces/{meta['namespace']}/pods/{urllib.parse.quote(meta['name'])}"
            status = podstatus.finished(pod, code, nodeobject.now())
            try:
                self.client.merge_patch(f"{path}/status", {"status": status})
            except ApiError as err:
                if err.status != 404:
                    raise

    def _lookup(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        """A secret or config map the pod's env names, read with the node's credentials (the
        Node authorizer lets a node read those its pods reference)."""
        try:
            return self.client.get(f"/api/v1/namespaces/{namespace}/{plural}/{name}")
        except ApiError as err:
            if err.status in (403, 404):
                return None
            raise

    def _ip(self, uid: str) -> str:
        """A pod IP from the node's own /24 (10.244.<index>.0/24, as a podCIDR would give)."""
        if uid not in self._ips:
            used = set(self._ips.values())
            host = next(h for h in range(2, 255) if f"10.244.{self.index}.{h}" not in used)
            self._ips[uid] = f"10.244.{self.index}.{host}"
        return self._ips[uid]


class NodeAgent:
    """The node agent for a topology. `NodeAgent.start(...)` returns once every node is
    registered (Node, Lease, ResourceSlices); `stop()` ends the threads. The Node objects stay,
    as a stopped kubelet's do (the node-lifecycle controller then marks them NotReady)."""

    def __init__(
        self,
        runners: list[NodeRunner],
        say: Callable[[str], None],
        runtime: ProcessRuntime | None = None,
    ) -> None:
        self.runners = runners
        self._say = say
        self.runtime = runtime
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    @classmethod
    def start(
        cls,
        topology: Mapping[str, Any],
        server: str,
        ca: KeyPair,
        state_dir: Path,
        *,
        mode: str = "no-run",
        images: Mapping[str, list[str]] | None = None,
        say: Callable[[str], None] = lambda _msg: None,
    ) -> NodeAgent:
        """`mode`: "no-run" (pods reported Running, nothing runs) or "run" (each pod's first
        container runs as a local process); `images`: run mode's command for an image whose
        container names none (devcluster.kubelet.DEFAULT_COMMAND otherwise)."""
        if mode not in ("no-run", "run"):
            raise ValueError(f"node agent: mode must be 'no-run' or 'run', not {mode!r}")
        runtime = ProcessRuntime(Path(state_dir) / "pods", images) if mode == "run" else None
        port = urllib.parse.urlsplit(server).port or 443
        service_env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(port)}
        dra = topology.get("dra") or {}
        runners = []
        for index, node in enumerate(topology["nodes"]):
            name = node["metadata"]["name"]
            client = Client(node_kubeconfig(ca, server, name, Path(state_dir)))
            runner = NodeRunner(node, dra.get(name), client, index, say, runtime)
            runner.service_env = service_env
            runners.append(runner)
        agent = cls(runners, say, runtime)
        version = runners[0].client.get("/version")["gitVersion"] if runners else ""
        for runner in runners:
            runner.register(version)
            say(f"node {runner.name} registered")
        for runner in runners:
            thread = threading.Thread(
                target=agent._loop, args=(runner,), name=f"nodeagent-{runner.name}", daemon=True
            )
            agent._threads.append(thread)
            thread.start()
        return agent

    def _loop(self, runner: NodeRunner) -> None:
        while not self._stop.is_set():
            try:
                runner.run(self._stop)
            except (ApiError, OSError, ValueError, HTTPException) as err:  # the apiserver went,
                # or answered badly (a watch cut mid-line, an etcd timeout): list again
                runner.error = err
                self._say(f"node {runner.name}: {err}; retrying")
                self._stop.wait(1.0)

    def errors(self) -> dict[str, BaseException]:
        return {r.name: r.error for r in self.runners if r.error is not None}

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=WATCH_SECONDS + 35)
        if self.runtime is not None:
            self.runtime.close()

    def __enter__(self) -> NodeAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
