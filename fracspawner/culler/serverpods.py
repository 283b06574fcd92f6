"""The hub's server pods, from a pod watch: which source addresses are real servers.

Any pod can reach the culler's report endpoint, and a token the hub has not vouched for yet
costs a hub request, so unknown tokens are rate-limited per address and overall
(identity.RateLimit). After a culler restart every server's token is unvouched: random tokens
from a few addresses would spend the overall budget and every real server's first report would
get 429. An address this watch knows as a server pod's (KubeSpawner's pods carry
`component=singleuser-server`: kubespawner/spawner.py `component_label`, and z2jh keeps it)
spends a budget of its own instead, which nobody else can spend.

The same watch says where each server pod is (its node, the GPUs its allocation names:
placement.py), which binds a server's reports to the GPUs it may be on (swapdesk.py).

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
from collections.abc import Mapping
from typing import Any

from ..capacity.apiconfig import load_configuration
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
    ) -> None:
        self.namespace, self.selector, self.kubeconfig = namespace, selector, kubeconfig
        self.max_backoff = max_backoff
        self._by_pod: dict[str, set[str]] = {}  # namespace/name -> its addresses
        self._addresses: dict[str, str] = {}  # address -> namespace/name
        self._placements: dict[str, Placement] = {}  # namespace/name -> node and GPUs
        self._task: asyncio.Task | None = None
        self.listed = asyncio.Event()
        self.failures = 0

    def known(self, address: str) -> bool:
        return address in self._addresses

    def __len__(self) -> int:
        return len(self._by_pod)

    def placement(self, name: str, namespace: str | None = None) -> Placement | None:
        """The node and GPUs of the server pod `name` (in `namespace`, or this watch's), or
        None when the watch does not know it."""
        ns = namespace if namespace is not None else self.namespace
        if ns:
            return self._placements.get(f"{ns}/{name}")
        found = [p for key, p in self._placements.items() if key.split("/", 1)[1] == name]
        return found[0] if len(found) == 1 else None  # the same name in two namespaces: unsure

    # -- the index
    @staticmethod
    def _key(pod: Mapping[str, Any]) -> str:
        meta = pod.get("metadata") or {}
        return f"{meta.get('namespace', '')}/{meta.get('name', '')}"

    def put(self, pod: dict[str, Any]) -> None:
        self.drop(pod)
        if not (pod.get("metadata") or {}).get("deletionTimestamp"):
            self._placements[self._key(pod)] = placement_of(pod)
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

    # -- the watch
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task], timeout=5)
            self._task = None

    def _call(self, v1: Any) -> tuple[Any, dict[str, Any]]:
        if self.namespace:
            return v1.list_namespaced_pod, {"namespace": self.namespace}
        return v1.list_pod_for_all_namespaces, {}

    async def _list(self, v1: Any) -> str:
        from kubernetes_asyncio import client

        call, args = self._call(v1)
        response = await call(
            **args, label_selector=self.selector, _preload_content=False, _request_timeout=60
        )
        body = await response.read()
        if response.status != 200:
            raise client.ApiException(status=response.status, reason=response.reason)
        listing = json.loads(body)
        self.load(listing.get("items") or [])
        self.listed.set()
        return str((listing.get("metadata") or {}).get("resourceVersion") or "0")

    async def _watch(self, v1: Any, version: str) -> str:
        from ..capacity.rawwatch import watch_once  # kubernetes_asyncio: only when watching

        call, args = self._call(v1)
        return await watch_once(
            call,
            version,
            put=self.put,
            drop=self.drop,
            delivered=self._back,
            label_selector=self.selector,
            timeout_seconds=300,
            allow_watch_bookmarks=True,
            _request_timeout=330,  # silent much longer than the server's timeout: dead
            **args,
        )

    async def _run(self) -> None:
        from kubernetes_asyncio import client

        configuration = await load_configuration(self.kubeconfig)
        async with client.ApiClient(configuration) as api:
            v1 = client.CoreV1Api(api)
            version: str | None = None
            while True:
                try:
                    if version is None:
                        version = await self._list(v1)
                    version = await self._watch(v1, version)
                    self._back()
                except asyncio.CancelledError:
                    raise
                except client.ApiException as exc:
                    version = None
                    if exc.status == 410:  # too old to resume from: relist now
                        continue
                    await self._lost(exc)
                except Exception as exc:  # connection lost, a bad answer: relist after a backoff
                    version = None
                    await self._lost(exc)

    def _back(self) -> None:
        if self.failures:
            log.warning("watching server pods again")
            self.failures = 0

    async def _lost(self, exc: BaseException) -> None:
        self.failures += 1
        delay = min(self.max_backoff, 0.8 * 2 ** (self.failures - 1))
        if self.failures == 1 or self.failures % 10 == 0:
            log.warning(
                "cannot watch server pods (%s); retrying in %.1f s (until then a server's "
                "first report shares the budget of unknown senders)",
                exc,
                delay,
            )
        await asyncio.sleep(delay * (1 + random.random() * 0.2))
