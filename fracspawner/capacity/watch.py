"""Live GPU capacity: node and pod watches feeding `LiveCapacity`, which never give up.

JupyterHub makes one spawner per server, so one `CapacityWatcher` per catalog and event loop
is shared by all of them (`CapacityWatcher.shared`), like kubespawner's own reflectors. Reads
(`snapshot`, `usage_of`, `pod`) come from memory and never call the Kubernetes API: a snapshot
recounts only the nodes that changed since the last read (fracspawner.capacity.live).

The watches keep slim records (fracspawner.k8s.records), not whole objects. kubespawner's
ResourceReflector gives up after its backoff passes 30 s (and the hub's own pod reflector then
stops the hub); these instead retry forever with capped backoff, as client-go's Reflector does
(tools/cache/reflector.go: backoff from 800 ms up to 30 s, never giving up), and relist when
back. While a watch is down the snapshot says so (`stale`, `age_seconds`): the counts are shown
as possibly out of date and are never used to refuse or admit a spawn.

The Kubernetes client configuration must be loaded first (`kubespawner.clients.load_config`);
KubeSpawner's constructor does that in the hub, the service and the CLI do it themselves.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any, ClassVar

from kubernetes_asyncio import client
from kubespawner.reflector import ResourceReflector
from traitlets import Bool, Float, Unicode

from ..k8s.forbidden import refused
from ..k8s.index import ASSIGNED_NODE_ANNOTATION
from ..k8s.records import NodeRecord, PodRecord
from .live import LiveCapacity
from .rawwatch import watch_once
from .snapshot import Capacity, OfferCapacity

__all__ = [
    "Capacity",
    "CapacityWatcher",
    "NodeReflector",
    "OfferCapacity",
    "PodReflector",
]

#: Pods in these phases hold nothing; the apiserver drops them from the watch for us.
_ACTIVE_PODS_SELECTOR = "status.phase!=Succeeded,status.phase!=Failed"
#: a failing watch logs at warning level again after this many quiet retries
_LOG_EVERY = 10


class _SlimReflector(ResourceReflector):
    """A list+watch of one kind that feeds a `LiveCapacity` instead of keeping objects.

    kubespawner's traits (request_timeout, timeout_seconds, restart_seconds), its shared API
    client and its `first_load_future` are kept; the loop is this class's: a watch that ends
    resumes from its last resourceVersion (no relist), an error relists after a backoff, and
    nothing ever stops it but `stop()`. `synced` says whether what was fed is the API's now.
    """

    initial_backoff = Float(
        0.8,
        config=True,
        help="Seconds before the first retry after the watch or list failed (doubles up to "
        "max_backoff).",
    )
    max_backoff = Float(
        30.0,
        config=True,
        help="Most seconds between retries while the API server is unreachable (client-go "
        "uses 30 s). Counts stay marked stale until a retry succeeds.",
    )

    live: LiveCapacity | None = None
    synced: bool = False
    lost_at: float = 0.0  # monotonic time the cache stopped being current (or was created)
    failures: int = 0  # since a watch last delivered (a list alone does not reset it)
    down_since: float = 0.0  # monotonic time of the first of these failures

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lost_at = time.monotonic()

    def _key(self, obj: Mapping[str, Any]) -> str:
        metadata = obj.get("metadata") or {}
        namespace = metadata.get("namespace")
        return f"{namespace}/{metadata.get('name')}" if namespace else str(metadata.get("name"))

    def _selectors(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "label_selector": self.label_selector,
            "field_selector": self.field_selector,
        }
        if not self.omit_namespace:
            kwargs["namespace"] = self.namespace
        return kwargs

    # ------------------------------------------------------------------ what a kind feeds
    def _load(self, items: list[dict[str, Any]]) -> None:
        raise NotImplementedError

    def _put(self, obj: dict[str, Any]) -> None:
        raise NotImplementedError

    def _drop(self, obj: dict[str, Any]) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ the loop
    async def _list(self) -> str:
        kwargs = self._selectors()
        kwargs.update(_request_timeout=self.request_timeout, _preload_content=False)
        response = await getattr(self.api, self.list_method_name)(**kwargs)
        body = await response.read()
        if not response.ok:
            refused = client.ApiException(status=response.status, reason=response.reason)
            refused.body = body  # the apiserver's Status: a 403 names what RBAC refused
            raise refused
        listing = json.loads(body)
        self._load(listing.get("items") or [])
        return (listing.get("metadata") or {}).get("resourceVersion") or "0"

    async def _watch(self, resource_version: str) -> str:
        """One watch request; returns the resourceVersion to resume from."""
        started = time.monotonic()
        kwargs = self._selectors()
        if self.timeout_seconds:
            kwargs["timeout_seconds"] = self.timeout_seconds
        if self.request_timeout or self.timeout_seconds:
            # the server ends a watch after timeout_seconds; one silent much longer is dead
            # (a partition without a reset), not quiet. The margin keeps a slow, loaded API
            # server from being taken for a lost one (each loss relists everything).
            kwargs["_request_timeout"] = max(self.request_timeout, self.timeout_seconds + 30)
        return await watch_once(
            getattr(self.api, self.list_method_name),
            resource_version,
            put=self._put,
            drop=self._drop,
            delivered=self._back,
            until=lambda: self._stopping or time.monotonic() - started >= self.restart_seconds,
            **kwargs,
        )

    async def run(self) -> None:
        """List, then watch, forever: errors relist after a backoff; only stop() ends it."""
        resource_version: str | None = None
        while not self._stopping:
            try:
                if resource_version is None:
                    resource_version = await self._list()
                    self._listed()
                resource_version = await self._watch(resource_version)
                self._back()  # ended by the server's timeout: a healthy watch
            except asyncio.CancelledError:
                raise
            except client.ApiException as exc:
                resource_version = None
                if exc.status == 410:  # our resourceVersion is too old: relist now
                    continue
                await self._lost(exc)
            except Exception as exc:
                resource_version = None
                await self._lost(exc)
        self.log.info("%s watch stopped", self.kind)

    def _listed(self) -> None:
        """The cache holds what the API server has now; the backoff goes on (see `_back`)."""
        self.synced = True
        if not self.first_load_future.done():
            self.first_load_future.set_result(None)

    def _back(self) -> None:
        """The watch delivers again: the backoff starts over. Not on a list alone: a watch
        refused after every list (a role without `watch`) would relist every pod of the
        cluster every `initial_backoff` seconds, forever."""
        if self.failures:
            self.log.warning(
                "Watching %s again after %.0f s; capacity counts are current",
                self.kind,
                time.monotonic() - self.down_since,
            )
            self.failures = 0

    def _why(self, exc: BaseException) -> str:
        """What went wrong, in words: for a 403 the apiserver's message and the chart's
        capacity ClusterRole, which grants these watches to z2jh's hub and the service."""
        dra = " (resourceslices and resourceclaims with dra.enabled)"
        words = refused(
            exc,
            component="the capacity watch",
            needs=f"list and watch {self.kind} in every namespace",
            grant=lambda account: (
                f"the chart's capacity ClusterRole grants list and watch on nodes and pods{dra} "
                "to z2jh's hub ServiceAccount (jupyterhub.hubServiceAccount) and to the "
                "live-offers service's: check that rbac.create is true and that it and its "
                "ClusterRoleBinding are installed as the chart renders them"
            ),
        )
        return words or f"{type(exc).__name__}: {str(exc).strip()}"

    async def _lost(self, exc: BaseException) -> None:
        if self.synced:  # current until now (never listed: stale since created)
            self.lost_at = time.monotonic()
        self.synced = False
        if not self.failures:
            self.down_since = time.monotonic()
        self.failures += 1
        delay = min(self.max_backoff, self.initial_backoff * 2 ** (self.failures - 1))
        delay *= 1 + random.random() * 0.2  # spread the retries of many hubs
        if self.failures == 1 or self.failures % _LOG_EVERY == 0:
            self.log.warning(
                "Cannot watch %s (%s); capacity counts are stale, retrying in %.1f s",
                self.kind,
                self._why(exc),
                delay,
            )
        else:
            self.log.debug(
                "Watching %s failed again (%s); retrying in %.1f s", self.kind, exc, delay
            )
        await asyncio.sleep(delay)

    async def stop(self) -> None:
        """Cancel the watch and wait for it."""
        self._stopping = True
        task, self.watch_task = self.watch_task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task], timeout=5)


class NodeReflector(_SlimReflector):
    """All nodes of the cluster (cluster-scoped list+watch: ClusterRole on nodes)."""

    kind = Unicode("nodes")
    list_method_name = Unicode("list_node")
    omit_namespace = Bool(True)

    def _load(self, items: list[dict[str, Any]]) -> None:
        assert self.live is not None
        self.live.replace_nodes(items)

    def _put(self, obj: dict[str, Any]) -> None:
        assert self.live is not None
        self.live.put_node(obj)

    def _drop(self, obj: dict[str, Any]) -> None:
        assert self.live is not None
        self.live.drop_node(self._key(obj))


class PodReflector(_SlimReflector):
    """All pods holding resources, across namespaces (other tenants' GPU pods count too)."""

    kind = Unicode("pods")
    list_method_name = Unicode("list_pod_for_all_namespaces")
    omit_namespace = Bool(True)
    exclude_terminated = Bool(
        True,
        config=True,
        help="Ask the API server to leave out Succeeded/Failed pods (a status.phase field "
        "selector); they hold no resources. Turn off for API servers without that selector.",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.exclude_terminated:
            extra = [self.field_selector] if self.field_selector else []
            self.field_selector = ",".join([*extra, _ACTIVE_PODS_SELECTOR])

    def _load(self, items: list[dict[str, Any]]) -> None:
        assert self.live is not None
        self.live.replace_pods(items)

    def _put(self, obj: dict[str, Any]) -> None:
        assert self.live is not None
        self.live.put_pod(obj)

    def _drop(self, obj: dict[str, Any]) -> None:
        assert self.live is not None
        self.live.drop_pod(self._key(obj))


class ResourceSliceReflector(_SlimReflector):
    """All ResourceSlices (resource.k8s.io/v1, cluster-scoped): the DRA devices, their
    capacity and counters. Only watched for catalogs with a DRA pool."""

    kind = Unicode("resourceslices")
    api_group_name = Unicode("ResourceV1Api")
    list_method_name = Unicode("list_resource_slice")
    omit_namespace = Bool(True)

    def _load(self, items: list[dict[str, Any]]) -> None:
        assert self.live is not None
        self.live.replace_slices(items)

    def _put(self, obj: dict[str, Any]) -> None:
        assert self.live is not None
        self.live.put_slice(obj)

    def _drop(self, obj: dict[str, Any]) -> None:
        assert self.live is not None
        self.live.drop_slice(self._key(obj))


class ResourceClaimReflector(_SlimReflector):
    """All ResourceClaims, across namespaces: what each allocation holds of which device."""

    kind = Unicode("resourceclaims")
    api_group_name = Unicode("ResourceV1Api")
    list_method_name = Unicode("list_resource_claim_for_all_namespaces")
    omit_namespace = Bool(True)

    def _load(self, items: list[dict[str, Any]]) -> None:
        assert self.live is not None
        self.live.replace_claims(items)

    def _put(self, obj: dict[str, Any]) -> None:
        assert self.live is not None
        self.live.put_claim(obj)

    def _drop(self, obj: dict[str, Any]) -> None:
        assert self.live is not None
        self.live.drop_claim(self._key(obj))


def _pod_dict(record: PodRecord) -> dict[str, Any]:
    """A kept pod in the API's shape (only the fields the watch keeps)."""
    annotations = dict(record.annotations)
    if record.assumed:
        annotations[ASSIGNED_NODE_ANNOTATION] = record.assumed
    return {
        "metadata": {
            "name": record.name,
            "namespace": record.namespace,
            "uid": record.uid,
            "labels": dict(record.labels),
            "annotations": annotations,
        },
        "spec": {"nodeName": record.node} if record.node else {},
        "status": {},
    }


class CapacityWatcher:
    """Capacity and per-user GPU usage for one catalog, from a node and a pod watch."""

    _shared: ClassVar[dict[tuple[int, Any], CapacityWatcher]] = {}

    def __init__(
        self,
        catalog: Any,
        *,
        log: logging.Logger | None = None,
        first_load_timeout: float = 10.0,
        config: Any = None,
    ) -> None:
        """`first_load_timeout`: the most the first `start()` calls wait for the first lists
        (later calls never wait); `config`: traitlets config for the reflectors."""
        self.catalog = catalog
        self.log = log or logging.getLogger(__name__)
        self.live = LiveCapacity(catalog)
        self.first_load_timeout = first_load_timeout
        self.config = config
        self._reflectors: list[_SlimReflector] = []
        self._deadline: float | None = None
        self._stopping = False

    @classmethod
    def shared(cls, catalog: Any, *, log: logging.Logger | None = None) -> CapacityWatcher:
        """The one watcher for this catalog object on the running event loop."""
        try:
            loop: Any = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        key = (id(catalog), loop)
        watcher = cls._shared.get(key)
        if watcher is None or watcher.catalog is not catalog:
            watcher = cls._shared[key] = cls(catalog, log=log)
        return watcher

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Start both watches in the background (once). Safe to call on every form render:
        only the first calls wait, for at most `first_load_timeout` seconds, for the first
        lists; after that a call returns at once, whether the API answers or not."""
        loop = asyncio.get_running_loop()
        if not self._reflectors:
            self._stopping = False
            self._deadline = loop.time() + self.first_load_timeout
            try:
                kwargs = {"parent": None, "config": self.config} if self.config else {}
                self._reflectors = [NodeReflector(**kwargs), PodReflector(**kwargs)]
                if self.live.dra is not None:  # a DRA pool: its devices and claims too
                    self._reflectors += [
                        ResourceSliceReflector(**kwargs),
                        ResourceClaimReflector(**kwargs),
                    ]
            except Exception as exc:  # no client configuration: counts stay unknown
                self.log.error("Cannot watch nodes and pods (%s); GPU capacity is unknown", exc)
                self._reflectors = []
                return
            for reflector in self._reflectors:
                reflector.live = self.live
                self._run(reflector)
        pending = [r.first_load_future for r in self._reflectors if not r.first_load_future.done()]
        left = (self._deadline or 0) - loop.time()
        if pending and left > 0:
            await asyncio.wait(pending, timeout=left)

    def _run(self, reflector: _SlimReflector) -> None:
        reflector._stopping = False
        reflector.watch_task = asyncio.ensure_future(reflector.run())
        reflector.watch_task.add_done_callback(lambda task: self._ended(reflector, task))

    def _ended(self, reflector: _SlimReflector, task: asyncio.Future[None]) -> None:
        """A watch loop only ends when stopped; should it end otherwise (a bug), start it
        again after the longest backoff."""
        if self._stopping or reflector._stopping or task.cancelled():
            return
        exc = task.exception()
        self.log.error("The %s watch ended (%r); restarting it", reflector.kind, exc)
        reflector.synced = False
        reflector.lost_at = time.monotonic()
        asyncio.get_running_loop().call_later(
            reflector.max_backoff,
            lambda: None if self._stopping else self._run(reflector),
        )

    async def stop(self) -> None:
        self._stopping = True
        for reflector in self._reflectors:
            await reflector.stop()
        self._reflectors = []
        for key, watcher in list(self._shared.items()):
            if watcher is self:
                del self._shared[key]

    # ------------------------------------------------------------------ reads (no API calls)
    def freshness(self) -> tuple[bool, float]:
        """(stale, seconds since the counts were last known current)."""
        if not self._reflectors:
            return True, 0.0
        lost = [r.lost_at for r in self._reflectors if not r.synced]
        if not lost:
            return False, 0.0
        return True, max(time.monotonic() - min(lost), 0.0)

    def snapshot(self) -> Capacity:
        """Free/total per pool and offer, with freshness; O(nodes changed since last read)."""
        counts = self.live.snapshot()
        stale, age = self.freshness()
        if stale:
            return replace(counts, stale=True, age_seconds=round(age, 1))
        return counts

    def usage_by_user(self) -> Mapping[str, float]:
        """GPU-equivalents each user's active pods hold: a live read-only view, O(1) a user."""
        return self.live.usage_by_user()

    def usage_of(self, user: str) -> float:
        return self.live.usage_of(user)

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """One kept pod, in the API's shape with only the fields the watch keeps (name,
        namespace, uid, node, the counted labels and annotations), or None: no such pod, or
        one holding nothing GPU-related."""
        key = f"{namespace}/{name}"
        record = self.live.pod(key)
        if record is None:
            return None
        pod = _pod_dict(record)
        if self.live.awaits_claim(record):
            # a DRA pod is in the counts once its claim's allocation is: until the claim
            # watch shows it, the pod reads as not placed (its spawn stays in flight)
            pod["spec"] = {}
            pod["metadata"]["annotations"].pop(ASSIGNED_NODE_ANNOTATION, None)
        return pod

    def placement(self, namespace: str, name: str) -> PodRecord | None:
        """One kept pod's record as `pod` reads it (a DRA pod awaiting its claim not placed),
        without building the dict: admission settles every in-flight spawn with it."""
        key = f"{namespace}/{name}"
        record = self.live.pod(key)
        if record is not None and self.live.awaits_claim(record):
            return replace(record, node=None, assumed=None)
        return record

    def unbound_pods(self) -> list[PodRecord]:
        """The kept pods the counts do not include yet: those no node holds (Pending, not
        bound nor booked), and DRA pods on a node whose claim the claim watch has not shown
        allocated (`LiveCapacity.awaits_claim`; a hub restart forgot their in-flight holds).
        What admission counts as claims on their pool's slots when no in-flight hold stands
        for them (`fracspawner.choice.admission.unplaced_holds`)."""
        return self.live.unbound_pods()

    def nodes(self) -> Iterator[NodeRecord]:
        return self.live.index.nodes()

    def pods(self) -> Iterator[PodRecord]:
        return iter(list(self.live.index.pods.values()))
