"""The hub's server pods, from a pod watch: which source addresses are real servers.

Any pod can reach the culler's report endpoint, and a token the hub has not vouched for yet
costs a hub request, so unknown tokens are rate-limited per address and overall
(identity.RateLimit). After a culler restart every server's token is unvouched: random tokens
from a few addresses would spend the overall budget and every real server's first report would
get 429. An address this watch knows as a server pod's (KubeSpawner's pods carry
`component=singleuser-server`: kubespawner/spawner.py `component_label`, and z2jh keeps it)
spends a budget of its own instead, which nobody else can spend.

The same watch says where each server pod is (its node, the GPUs its allocation names:
placement.py), which binds a server's reports to the GPUs it may be on (swapdesk.py). On DRA
pools (`dra=True`) the allocation is in the pods' ResourceClaims (this namespace's) and the
device UUIDs in the ResourceSlices (cluster-scoped): two more list+watch loops fill a
draclaims.DraClaims, read when a placement is asked for. With `nodes=True` (the culler's host
memory budget follows each node: Culler.host_memory_budget_fraction) one more watches the
Nodes (cluster-scoped) and keeps each one's allocatable memory (nodememory.NodeMemory); while
it is refused or lost a node's budget is the fixed fallback.

One list, then watches resumed from its resourceVersion (capacity/rawwatch.py watch_once, the
loop the other pod watches share); a lost watch relists after a backoff, a 410 at once. Until
the first list, and while the watch is lost, addresses stay as last known (a pod's IP is not
reused while it runs); a deleted or finished pod's address is forgotten.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Callable, Mapping
from typing import Any

from ..capacity.apiconfig import load_configuration
from ..k8s.forbidden import refused
from .draclaims import DraClaims
from .nodememory import NodeMemory
from .placement import Placement, placement_of

log = logging.getLogger(__name__)

SERVER_SELECTOR = "component=singleuser-server"  # KubeSpawner's component label


def pod_addresses(pod: Mapping[str, Any]) -> set[str]:
    """The IPs of a pod that is (or may soon be) running: none once it has finished or is
    being deleted, when the address may go to another pod."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    if meta.get("deletionTimestamp") or status.get("phase") in ("Succeeded", "Failed"):
        return set()
    ips = {entry.get("ip") for entry in status.get("podIPs") or [] if isinstance(entry, dict)}
    ips.add(status.get("podIP"))
    return {ip for ip in ips if isinstance(ip, str) and ip}


class ServerPods:
    """Addresses of the server pods in `namespace` ("" for every namespace)."""

    def __init__(
        self,
        namespace: str,
        *,
        selector: str = SERVER_SELECTOR,
        kubeconfig: str | None = None,
        max_backoff: float = 30.0,
        dra: bool = False,
        nodes: bool = False,
    ) -> None:
        self.namespace, self.selector, self.kubeconfig = namespace, selector, kubeconfig
        self.max_backoff = max_backoff
        #: the pods' claims and the devices' UUIDs (DRA pools); None: not watched
        self.dra: DraClaims | None = DraClaims() if dra else None
        #: each node's allocatable memory (the host memory budget per node); None: not watched
        self.nodes: NodeMemory | None = NodeMemory() if nodes else None
        self._by_pod: dict[str, set[str]] = {}  # namespace/name -> its addresses
        self._addresses: dict[str, str] = {}  # address -> namespace/name
        self._placements: dict[str, Placement] = {}  # namespace/name -> node and GPUs
        self._tasks: list[asyncio.Task] = []
        self.listed = asyncio.Event()
        self.failures = 0
        self._failures: dict[str, int] = {}  # per watched kind
        #: called when a server pod waits for a node (made, not scheduled): the culler may
        #: then free a slot for it sooner than its next cycle (Culler.cull_when_waiting)
        self.on_waiting: Callable[[], None] | None = None

    def known(self, address: str) -> bool:
        return address in self._addresses

    def __len__(self) -> int:
        return len(self._by_pod)

    def placement(self, name: str, namespace: str | None = None) -> Placement | None:
        """The node and GPUs of the server pod `name` (in `namespace`, or this watch's), or
        None when the watch does not know it."""
        ns = namespace if namespace is not None else self.namespace
        if ns:
            found = self._placements.get(f"{ns}/{name}")
        else:
            named = [p for key, p in self._placements.items() if key.split("/", 1)[1] == name]
            found = named[0] if len(named) == 1 else None  # in two namespaces: unsure
        if found is None or self.dra is None or not found.claims:
            return found
        return found.with_claims(self.dra.devices(found.claims))

    def placements(self) -> list[tuple[str, Placement]]:
        """Every server pod the watch knows (in this watch's namespace, or all) by name, with
        its placement: the servers the hub has not listed yet are among them (unlisted.py)."""
        out = []
        for key in list(self._placements):
            namespace, name = key.split("/", 1)
            if not self.namespace or namespace == self.namespace:
                found = self.placement(name, namespace)
                if found is not None:
                    out.append((name, found))
        return out

    # -- the index
    @staticmethod
    def _key(pod: Mapping[str, Any]) -> str:
        meta = pod.get("metadata") or {}
        return f"{meta.get('namespace', '')}/{meta.get('name', '')}"

    def put(self, pod: dict[str, Any]) -> None:
        self.drop(pod)
        if not (pod.get("metadata") or {}).get("deletionTimestamp"):
            where = self._placements[self._key(pod)] = placement_of(pod)
            if where.node is None and self.on_waiting is not None:
                self.on_waiting()
        addresses = pod_addresses(pod)
        if addresses:
            key = self._key(pod)
            self._by_pod[key] = addresses
            self._addresses.update(dict.fromkeys(addresses, key))

    def drop(self, pod: dict[str, Any]) -> None:
        key = self._key(pod)
        self._placements.pop(key, None)
        for address in self._by_pod.pop(key, set()):
            if self._addresses.get(address) == key:
                del self._addresses[address]

    def load(self, pods: list[dict[str, Any]]) -> None:
        self._by_pod.clear()
        self._addresses.clear()
        self._placements.clear()
        for pod in pods:
            self.put(pod)

    # -- the watches
    def start(self) -> None:
        if not self._tasks:
            self._tasks = [asyncio.ensure_future(self._run())]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)
        self._tasks = []

    def _watches(self, api: Any) -> list[tuple[str, Any, dict[str, Any], Any, Any, Any]]:
        """(what, list call, its arguments, load, put, drop) per watched kind."""
        from kubernetes_asyncio import client

        v1 = client.CoreV1Api(api)
        if self.namespace:
            pods = v1.list_namespaced_pod, {"namespace": self.namespace}
        else:
            pods = v1.list_pod_for_all_namespaces, {}
        out = [
            ("server pods", *pods, self._loaded, self.put, self.drop),
        ]
        if self.dra is not None:
            resource = client.ResourceV1Api(api)
            if self.namespace:
                claims = resource.list_namespaced_resource_claim, {"namespace": self.namespace}
            else:
                claims = resource.list_resource_claim_for_all_namespaces, {}
            out += [
                ("resource claims", *claims, self.dra.load_claims, self.dra.put_claim,
                 self.dra.drop_claim),
                ("resource slices", resource.list_resource_slice, {}, self.dra.load_slices,
                 self.dra.put_slice, self.dra.drop_slice),
            ]  # fmt: skip
        if self.nodes is not None:
            out.append(
                ("nodes", v1.list_node, {}, self.nodes.load, self.nodes.put, self.nodes.drop)
            )
        return out

    def _loaded(self, pods: list[dict[str, Any]]) -> None:
        self.load(pods)
        self.listed.set()

    async def _list(self, call: Any, args: dict[str, Any], load: Any) -> str:
        from kubernetes_asyncio import client

        response = await call(**args, _preload_content=False, _request_timeout=60)
        body = await response.read()
        if response.status != 200:
            refused = client.ApiException(status=response.status, reason=response.reason)
            refused.body = body  # the apiserver's Status: a 403 names what RBAC refused
            raise refused
        listing = json.loads(body)
        load(listing.get("items") or [])
        return str((listing.get("metadata") or {}).get("resourceVersion") or "0")

    async def _run(self) -> None:
        from kubernetes_asyncio import client

        configuration = await load_configuration(self.kubeconfig)
        async with client.ApiClient(configuration) as api:
            loops = [self._follow(*watch) for watch in self._watches(api)]
            await asyncio.gather(*loops)

    async def _follow(
        self, what: str, call: Any, args: dict[str, Any], load: Any, put: Any, drop: Any
    ) -> None:
        """List, then watch from the list's resourceVersion, for ever (capacity/rawwatch.py)."""
        from kubernetes_asyncio import client

        from ..capacity.rawwatch import watch_once  # kubernetes_asyncio: only when watching

        if what == "server pods":
            args = {**args, "label_selector": self.selector}
        version: str | None = None
        while True:
            try:
                if version is None:
                    version = await self._list(call, args, load)
                version = await watch_once(
                    call,
                    version,
                    put=put,
                    drop=drop,
                    delivered=lambda: self._back(what),
                    timeout_seconds=300,
                    allow_watch_bookmarks=True,
                    _request_timeout=330,  # silent much longer than the server's timeout: dead
                    **args,
                )
                self._back(what)
            except asyncio.CancelledError:
                raise
            except client.ApiException as exc:
                version = None
                if exc.status == 410:  # too old to resume from: relist now
                    continue
                await self._lost(what, exc)
            except Exception as exc:  # connection lost, a bad answer: relist after a backoff
                version = None
                await self._lost(what, exc)

    def _back(self, what: str) -> None:
        if self._failures.get(what):
            log.warning("watching %s again", what)
            self._failures[what] = 0
            self.failures = sum(self._failures.values())

    def _why(self, what: str, exc: BaseException) -> str:
        """What went wrong, in words: for a 403 the apiserver's message and what in the chart
        grants the watch (rbac.yaml: the culler's Role, and with DRA its ClusterRole)."""
        where = f"in namespace {self.namespace}" if self.namespace else "in every namespace"
        cluster_scoped = what in ("resource slices", "nodes")
        resource = {"server pods": "pods"}.get(what, what)

        def grant(account: str | None) -> str:
            role = (
                f"the chart's culler ClusterRole{' (dra.enabled)' if what != 'nodes' else ''}"
                if cluster_scoped
                else f"the chart's Role {account or '<release>-culler'}"
            )
            off = (
                "set Culler.host_memory_budget_mib (a fixed budget: no node watch)"
                if what == "nodes"
                else "turn the watch off (culler.watchServerPods=false)"
            )
            return (
                f"{role} grants list and watch on {resource}: check that rbac.create is true and "
                f"that the chart's Roles and bindings are installed as it renders them, or {off}"
            )

        words = refused(
            exc,
            component="the culler",
            needs=f"list and watch {resource} " + ("(cluster-scoped)" if cluster_scoped else where),
            grant=grant,
        )
        return words or str(exc).strip()

    async def _lost(self, what: str, exc: BaseException) -> None:
        failures = self._failures[what] = self._failures.get(what, 0) + 1
        self.failures = sum(self._failures.values())
        delay = min(self.max_backoff, 0.8 * 2 ** (failures - 1))
        if failures == 1 or failures % 10 == 0:
            log.warning(
                "cannot watch %s (%s); retrying in %.1f s (%s)",
                what,
                self._why(what, exc),
                delay,
                {
                    "server pods": "until then a server's first report shares the budget of "
                    "unknown senders",
                    "nodes": "until then a node whose memory is not known has the fixed host "
                    "memory budget (nodememory.FALLBACK_BUDGET_MIB)",
                }.get(what, "until then a DRA server's report is bound by its node and GPU count"),
            )
        await asyncio.sleep(delay * (1 + random.random() * 0.2))
