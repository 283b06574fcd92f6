"""The node agent: stands in for the kubelet of every node of a topology against the real
control plane. Per node, with the node's own credentials (credentials.py), one thread
registers the Node and its status, creates its Lease, publishes its ResourceSlices (slices.py)
and then watches the pods bound to it: each gets a Running status without anything being run
("pods do not run", as kwok does) or, in "run" mode, its containers run as local processes
and lives as a kubelet's pod worker says (runtime.py, podworker.py: probes, restarts, status,
conditions and the kubelet's events). A pod with a deletionTimestamp is removed with grace 0, as
a kubelet does once its containers stopped (in run mode, once its grace period let it stop).
A second thread per node renews its Lease every RENEW_SECONDS, as the kubelet's lease controller
does on a goroutine of its own (k8s.io/component-helpers apimachinery/lease), so a slow watch or
reconcile cannot let kube-controller-manager's node-monitor-grace-period (50 s) pass: the node
would go Unknown and be tainted node.kubernetes.io/unreachable, its pods evicted after 300 s.
NodeAgent.start returns once kube-scheduler can place a pod on every node (wait_schedulable)."""

from __future__ import annotations

import json
import threading
import time
import traceback
import urllib.parse
from collections.abc import Callable, Mapping
from http.client import HTTPException
from pathlib import Path
from typing import Any

from devcluster.controlplane.pki import KeyPair
from devcluster.controlplane.processes import ComponentDied
from devcluster.dra.nvidia import DRIVER
from devcluster.probes import DEFAULT_BACKOFF

from . import claimenv, nodeobject, podstatus, services
from .client import ApiError, Client
from .credentials import node_kubeconfig
from .kubeletapi import KubeletAPI
from .podworker import SYNC_SECONDS
from .runtime import ProcessRuntime
from .serviceenv import kubernetes_service, pod_service_env
from .slices import node_slices

RENEW_SECONDS = 10.0  # the kubelet renews at a quarter of the lease's 40 s
WATCH_SECONDS = 3  # each watch request ends this often, so stop() is timely
#: how long NodeAgent.start waits for every node to be Ready and rid of the not-ready taint the
#: apiserver puts on a new Node (a bound: kube-controller-manager takes ~1 s, more when loaded)
READY_TIMEOUT = 120.0
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
RESOURCE = "/apis/resource.k8s.io/v1"


class NodesNotSchedulable(TimeoutError):
    """A node was not Ready, or kept a taint it did not register with, within READY_TIMEOUT of
    its registration: the message names each node, its conditions and its taints."""


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
        #: where the apiserver finds this node's kubelet API (daemonEndpoints)
        self.kubelet_port = nodeobject.KUBELET_PORT
        #: the `kubernetes` Service as pods reach the apiserver (its env variables)
        self.apiserver = kubernetes_service("127.0.0.1", 443)
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
        status = nodeobject.status(self.node, version, self.kubelet_port)
        self.client.merge_patch(f"{path}/status", {"status": status})
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

    def heartbeat(self, stop: threading.Event) -> None:
        """Renew the Lease every RENEW_SECONDS until `stop`, on a thread of its own; a failed
        renewal is said and tried again a second later (the lease controller retries too)."""
        while not stop.wait(max(0.0, self.renewed + RENEW_SECONDS - time.monotonic())):
            try:
                self._renew()
            except (ApiError, OSError, ValueError, HTTPException) as err:
                self.error = err
                self._say(f"node {self.name}: renewing its Lease: {err}; retrying")
                stop.wait(min(1.0, RENEW_SECONDS))

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
                            if self.runtime is not None:
                                self.runtime.forget(event["object"]["metadata"]["uid"])
                except ApiError as err:
                    if err.status == 410:  # resourceVersion too old: list again
                        break
                    raise

    def _reconcile(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{urllib.parse.quote(meta['name'])}"
        if self.runtime is not None:  # run mode: the pod's worker does the rest
            self.runtime.sync(pod, self)
            return
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

    # --- run mode: what pod workers ask of their node (podworker.NodeApi) ----------------
    @staticmethod
    def _path(pod: Mapping[str, Any]) -> str:
        meta = pod["metadata"]
        return f"/api/v1/namespaces/{meta['namespace']}/pods/{urllib.parse.quote(meta['name'])}"

    def patch_status(self, pod: Mapping[str, Any], status: dict[str, Any]) -> bool:
        """Write the pod's status; False where the pod is gone."""
        try:
            self.client.merge_patch(f"{self._path(pod)}/status", {"status": status})
        except ApiError as err:
            if err.status in (404, 409):
                return False
            raise
        return True

    def event(
        self, pod: Mapping[str, Any], kind: str, reason: str, message: str,
        container: str | None = None,
    ) -> None:  # fmt: skip
        """A core/v1 Event about the pod from this node's kubelet, as its event recorder
        writes them (client-go tools/record; the Node authorizer's system:node role may)."""
        meta = pod["metadata"]
        t = nodeobject.now()
        involved = {"kind": "Pod", "apiVersion": "v1", "namespace": meta["namespace"],
                    "name": meta["name"], "uid": meta["uid"]}  # fmt: skip
        if container:
            involved["fieldPath"] = f"spec.containers{{{container}}}"
        event = {
            "metadata": {
                "name": f"{meta['name']}.{time.time_ns():x}",
                "namespace": meta["namespace"],
            },
            "involvedObject": involved,
            "reason": reason,
            "message": message,
            "type": kind,
            "source": {"component": "kubelet", "host": self.name},
            "firstTimestamp": t,
            "lastTimestamp": t,
            "count": 1,
            "reportingComponent": "kubelet",
            "reportingInstance": self.name,
        }
        self.client.create(f"/api/v1/namespaces/{meta['namespace']}/events", event)

    def remove(self, pod: Mapping[str, Any]) -> None:
        """Delete the pod with grace 0 once its container stopped."""
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": pod["metadata"]["uid"]}}
        try:
            self.client.delete(self._path(pod), body)
        except ApiError as err:
            if err.status not in (404, 409):
                raise
        self._ips.pop(pod["metadata"]["uid"], None)

    def service_env(self, pod: Mapping[str, Any]) -> dict[str, str]:
        """The Service variables the kubelet sets for the pod (serviceenv.py)."""
        ns = pod["metadata"]["namespace"]
        services = self.client.get(f"/api/v1/namespaces/{ns}/services")["items"]
        return pod_service_env(pod, services, self.apiserver)

    def claim_env(self, pod: Mapping[str, Any], container: str) -> dict[str, str]:
        """What the DRA claims `container` references give it (claimenv.py): the claims read
        with the node's credentials (the Node authorizer lets a node read its pods' claims),
        the devices' UUIDs from the slices this node publishes. ClaimNotReady until allocated."""
        refs = claimenv.container_claims(pod, container)
        if not refs:
            return {}
        ns = pod["metadata"]["namespace"]
        claims = {name: self._get(f"{RESOURCE}/namespaces/{ns}/resourceclaims/{name}")
                  for name, _ in refs}  # fmt: skip
        return claimenv.device_env(refs, claims, node_slices(self.name, self.dra or {}))

    def _get(self, path: str) -> dict[str, Any] | None:
        try:
            return self.client.get(path)
        except ApiError as err:
            if err.status in (403, 404):
                return None
            raise

    def lookup(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self._lookup(plural, namespace, name)

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
    registered (Node, Lease, ResourceSlices) and kube-scheduler can place pods on it (Ready, no
    `node.kubernetes.io/` taint it did not register with); `stop()` ends the threads. The Node
    objects stay, as a stopped kubelet's do (the node-lifecycle controller then marks them
    NotReady)."""

    def __init__(
        self,
        runners: list[NodeRunner],
        say: Callable[[str], None],
        runtime: ProcessRuntime | None = None,
    ) -> None:
        self.runners = runners
        self._say = say
        self.runtime = runtime
        self.kubelet_api: KubeletAPI | None = None  # set by start()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        #: thread name -> the last lines of the exception that ended it
        self._ended: dict[str, str] = {}

    def _thread(self, target: Callable[..., None], args: tuple, name: str) -> None:
        """A daemon thread of the agent; an exception that ends it is kept for check()."""

        def guarded() -> None:
            try:
                target(*args)
            except BaseException:
                self._ended[name] = "\n".join(traceback.format_exc().splitlines()[-6:])
                raise

        thread = threading.Thread(target=guarded, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def check(self) -> None:
        """ComponentDied if a part of the agent ended while it should run, as
        ControlPlane.check() for the control plane's components: the kubelet-api process
        (its exit status and log's last lines), a node's or the Services' thread or the
        runtime's event loop (with the error that ended it). Without it, pods bound to the
        nodes would never start and nothing would say why."""
        if self._stop.is_set():
            return
        if self.kubelet_api is not None:
            self.kubelet_api.check()
        for thread in self._threads:
            if not thread.is_alive():
                why = self._ended.get(thread.name, "(no error recorded)")
                raise ComponentDied(f"node agent thread {thread.name} ended:\n{why}")
        if self.runtime is not None and not self.runtime.alive():
            raise ComponentDied("node agent: the pods' event loop (nodeagent-runtime) ended")

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
        restart_backoff: tuple[float, float] = DEFAULT_BACKOFF,
        kubelet_api: bool = True,
        network: str = "host",
        ready_timeout: float = READY_TIMEOUT,
        sync_seconds: float = SYNC_SECONDS,
    ) -> NodeAgent:
        """`mode`: "no-run" (pods reported Running, nothing runs) or "run" (each pod's
        containers run as local processes); `images`: run mode's command for an image whose
        container names none (devcluster.kubelet.DEFAULT_COMMAND otherwise);
        `restart_backoff`: run mode's crash-loop back-off, (initial, maximum) seconds;
        `kubelet_api`: serve the kubelet API (exec, logs, port-forward: kubeletapi.py);
        `network`: run mode's pod network, "host" (a loopback address each) or "namespaces"
        (a network namespace each, Services proxied and named: services.py);
        `ready_timeout`: how long every node may take to be schedulable (NodesNotSchedulable);
        `sync_seconds`: run mode's sync period of a pod (the kubelet's syncFrequency): its
        volumes of files are written again from their sources that often."""
        if mode not in ("no-run", "run"):
            raise ValueError(f"node agent: mode must be 'no-run' or 'run', not {mode!r}")
        api = KubeletAPI.start(ca, Path(state_dir) / "kubelet-api") if kubelet_api else None
        runtime = None
        try:
            if mode == "run":
                published = api.pods_dir if api else None
                runtime = ProcessRuntime(
                    Path(state_dir) / "pods",
                    images,
                    restart_backoff,
                    published,
                    network,
                    sync_seconds,
                )
            return cls._start(topology, server, ca, state_dir, say, runtime, api, ready_timeout)
        except BaseException:
            if runtime is not None:
                runtime.close()
            if api is not None:
                api.stop()
            raise

    @classmethod
    def _start(
        cls,
        topology: Mapping[str, Any],
        server: str,
        ca: KeyPair,
        state_dir: Path,
        say: Callable[[str], None],
        runtime: ProcessRuntime | None,
        api: KubeletAPI | None,
        ready_timeout: float = READY_TIMEOUT,
    ) -> NodeAgent:
        port = urllib.parse.urlsplit(server).port or 443
        dra = topology.get("dra") or {}
        runners = []
        for index, node in enumerate(topology["nodes"]):
            name = node["metadata"]["name"]
            client = Client(node_kubeconfig(ca, server, name, Path(state_dir)))
            runner = NodeRunner(node, dra.get(name), client, index, say, runtime)
            runner.apiserver = kubernetes_service("127.0.0.1", port)
            if api is not None:
                runner.kubelet_port = api.port
            runners.append(runner)
        agent = cls(runners, say, runtime)
        agent.kubelet_api = api
        version = runners[0].client.get("/version")["gitVersion"] if runners else ""
        for runner in runners:
            runner.register(version)
            say(f"node {runner.name} registered")
        if runtime is not None and runtime.kubelet.network.mode == "namespaces":
            agent._follow_services(port)
        for runner in runners:
            agent._thread(runner.heartbeat, (agent._stop,), f"nodeagent-{runner.name}-lease")
            agent._thread(agent._loop, (runner,), f"nodeagent-{runner.name}")
        try:
            agent.wait_schedulable(ready_timeout)
        except BaseException:
            agent._halt()  # the caller closes the runtime and the kubelet API
            raise
        return agent

    def wait_schedulable(self, timeout: float) -> None:
        """Until kube-scheduler can place a pod on every node: Ready, and rid of the
        `node.kubernetes.io/not-ready` taint the apiserver's TaintNodesByCondition admission
        plugin puts on a new Node (or `unreachable`, on a Node an earlier agent left), which
        kube-controller-manager's node lifecycle controller removes once it sees the node Ready.
        Before, a pod made at once could be refused ('had untolerated taint(s)').
        NodesNotSchedulable after `timeout`, naming each node, its conditions and taints."""
        deadline = time.monotonic() + timeout
        waiting = {runner.name: runner for runner in self.runners}
        last: dict[str, tuple[list[str], dict[str, Any]]] = {}
        while waiting:
            for name, runner in list(waiting.items()):
                current = runner.client.get(f"/api/v1/nodes/{name}")
                why = nodeobject.scheduling_blockers(runner.node, current)
                if why:
                    last[name] = (why, current)
                else:
                    del waiting[name]
                    self._say(f"node {name} schedulable")
            if not waiting:
                return
            self.check()
            if time.monotonic() > deadline:
                nodes = "\n".join(
                    f"  {name}: {', '.join(last[name][0])} ({nodeobject.describe(last[name][1])})"
                    for name in waiting
                )
                raise NodesNotSchedulable(
                    f"node agent: kube-scheduler cannot place pods on {len(waiting)} node(s) "
                    f"{timeout:.0f} s after their registration:\n{nodes}\n"
                    "kube-controller-manager's node lifecycle controller removes "
                    "node.kubernetes.io/not-ready once it sees a node Ready (its log says why not)"
                )
            self._stop.wait(0.25)

    def _follow_services(self, apiserver_port: int) -> None:
        """Pods in network namespaces: every Service proxied and named (services.py), the
        `kubernetes` one to the apiserver; pods are told its ClusterIP."""
        runtime = self.runtime
        assert runtime is not None
        client = self.runners[0].client
        kubernetes = client.get("/api/v1/namespaces/default/services/kubernetes")
        for runner in self.runners:
            runner.apiserver = kubernetes
        runtime.endpoints.append(services.apiserver_endpoint())

        def hand(kind: str, service: dict[str, Any]) -> None:
            runtime.service(kind, services.proxied(service, apiserver_port))

        self._thread(services.follow, (client, hand, self._stop, self._say), "nodeagent-services")

    def _loop(self, runner: NodeRunner) -> None:
        while not self._stop.is_set():
            try:
                runner.run(self._stop)
            except (ApiError, OSError, ValueError, HTTPException) as err:  # the apiserver went,
                # or answered badly (a watch cut mid-line, an etcd timeout): list again
                runner.error = err
                self._say(f"node {runner.name}: {err}; retrying")
                self._stop.wait(1.0)

    def describe(self, namespace: str, name: str) -> str:
        """What the agent knows of a pod, for a test whose wait for it failed: its worker in
        run mode (runtime.describe), a node thread's last error, a part of the agent that died."""
        lines = []
        if self.runtime is not None:
            lines.append(self.runtime.describe(namespace, name))
        lines += [f"node {node}: last error {err!r}" for node, err in self.errors().items()]
        try:
            self.check()
        except ComponentDied as died:
            lines.append(str(died))
        return "\n".join(lines) or "node agent: nothing to say (no-run mode, no errors)"

    def errors(self) -> dict[str, BaseException]:
        return {r.name: r.error for r in self.runners if r.error is not None}

    def _halt(self) -> None:
        """End the agent's threads."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=WATCH_SECONDS + 35)

    def stop(self) -> None:
        self._halt()
        if self.runtime is not None:
            self.runtime.close()
        if self.kubelet_api is not None:
            self.kubelet_api.stop()

    def __enter__(self) -> NodeAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
