"""The node agent: stands in for the kubelet of every node of a topology against the real
control plane. Per node, with the node's own credentials (credentials.py), one thread
registers the Node and its status, creates its Lease, publishes its ResourceSlices (slices.py)
and then watches the pods bound to it: each gets a Running status without anything being run
("pods do not run", as kwok does), and a pod with a deletionTimestamp is removed with grace 0,
as a kubelet does once its containers stopped. Between watch requests the Lease is renewed
every RENEW_SECONDS."""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from devcluster.controlplane.pki import KeyPair
from devcluster.dra.nvidia import DRIVER

from . import nodeobject, podstatus
from .client import ApiError, Client
from .credentials import node_kubeconfig
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
    ) -> None:
        self.node = node
        self.name = node["metadata"]["name"]
        self.dra = dra
        self.client = client
        self.index = index
        self._say = say
        self._ips: dict[str, str] = {}  # pod uid -> IP
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
                body = {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}}
                self.client.delete(path, body)
                self._ips.pop(meta["uid"], None)
            elif not podstatus.reported(pod):
                status = podstatus.running(
                    pod, self._ip(meta["uid"]), "127.0.0.1", nodeobject.now()
                )
                self.client.merge_patch(f"{path}/status", {"status": status})
        except ApiError as err:
            if err.status not in (404, 409):  # gone, or replaced by a pod of the same name
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

    def __init__(self, runners: list[NodeRunner], say: Callable[[str], None]) -> None:
        self.runners = runners
        self._say = say
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
        say: Callable[[str], None] = lambda _msg: None,
    ) -> NodeAgent:
        dra = topology.get("dra") or {}
        runners = []
        for index, node in enumerate(topology["nodes"]):
            name = node["metadata"]["name"]
            client = Client(node_kubeconfig(ca, server, name, Path(state_dir)))
            runners.append(NodeRunner(node, dra.get(name), client, index, say))
        agent = cls(runners, say)
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
            except (ApiError, OSError, ValueError) as err:  # the apiserver went or answered badly
                runner.error = err
                self._say(f"node {runner.name}: {err}; retrying")
                self._stop.wait(1.0)

    def errors(self) -> dict[str, BaseException]:
        return {r.name: r.error for r in self.runners if r.error is not None}

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=WATCH_SECONDS + 35)

    def __enter__(self) -> NodeAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
