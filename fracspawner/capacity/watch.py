"""Live GPU capacity: node and pod reflectors feeding `compute_capacity`.

JupyterHub makes one spawner per server, so one `CapacityWatcher` per catalog and event loop
is shared by all of them (`CapacityWatcher.shared`), like kubespawner's own reflectors.
Rendering the form reads the reflectors' caches only; it never calls the Kubernetes API.

The Kubernetes client configuration must be loaded first (`kubespawner.clients.load_config`);
KubeSpawner's constructor does that in the hub, the service and the CLI do it themselves.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterable
from typing import Any, ClassVar

from kubernetes_asyncio import client, watch
from kubespawner.reflector import ResourceReflector
from traitlets import Bool, Unicode

from .count import (
    Capacity,
    OfferCapacity,
    compute_capacity,
    gpu_usage_by_user,
)

__all__ = [
    "Capacity",
    "CapacityWatcher",
    "NodeReflector",
    "OfferCapacity",
    "PodReflector",
    "compute_capacity",
    "gpu_usage_by_user",
]

#: Pods in these phases hold nothing; the apiserver drops them from the watch for us.
_ACTIVE_PODS_SELECTOR = "status.phase!=Succeeded,status.phase!=Failed"
#: After a failed start, form renders within this many seconds do not retry (no API stall
#: on every page view while the cluster is unreachable).
_RETRY_AFTER_S = 10.0


class _CountingReflector(ResourceReflector):
    """A kubespawner ResourceReflector whose cache keys work for cluster-scoped kinds and
    whose every change bumps `generation`, so readers can cache what they derive from it.

    kubespawner's `_list_and_update`/`_watch_and_update` key objects by
    "namespace/name" and fail on nodes (no metadata.namespace), so both are replaced; start,
    stop, the traits and the shared API client are kubespawner's. Unlike kubespawner, a watch
    that times out resumes from its last resourceVersion instead of listing everything
    again (client-go informers do the same); a full list happens at start and after errors.
    """

    generation: int = 0
    _listed_version: str | None = None  # from the list start() made; the watch resumes there

    def _key(self, obj: dict[str, Any]) -> str:
        metadata = obj.get("metadata") or {}
        namespace = metadata.get("namespace")
        return f"{namespace}/{metadata.get('name')}" if namespace else str(metadata.get("name"))

    def _changed(self) -> None:
        self.generation += 1

    def _selectors(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "label_selector": self.label_selector,
            "field_selector": self.field_selector,
        }
        if not self.omit_namespace:
            kwargs["namespace"] = self.namespace
        return kwargs

    async def _list_and_update(self, resource_version: str | None = None) -> str:
        kwargs = self._selectors()
        kwargs.update(_request_timeout=self.request_timeout, _preload_content=False)
        if resource_version is not None:
            kwargs.update(resource_version=resource_version, resource_version_match="NotOlderThan")
        response = await getattr(self.api, self.list_method_name)(**kwargs)
        body = await response.read()
        if not response.ok:
            raise client.ApiException(status=response.status, reason=response.reason)
        listing = json.loads(body)
        self.resources = {self._key(obj): obj for obj in listing.get("items") or []}
        self._changed()
        if not self.first_load_future.done():
            self.first_load_future.set_result(None)
        self._listed_version = (listing.get("metadata") or {}).get("resourceVersion") or "0"
        return self._listed_version

    def _apply(self, event: dict[str, Any]) -> str | None:
        """Fold one watch event into the cache; returns its resourceVersion."""
        obj = event.get("raw_object") or {}
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if event.get("type") == "DELETED":
            self.resources.pop(self._key(obj), None)
        elif event.get("type") in ("ADDED", "MODIFIED"):
            self.resources[self._key(obj)] = obj
        else:  # BOOKMARK: only moves the resourceVersion on
            return version
        self._changed()
        return version

    async def _watch_and_update(self) -> None:
        resource_version = self._listed_version
        delay = 0.1
        while not self._stopping:
            w = watch.Watch(return_type="object")  # keep raw dicts, skip model building
            started = time.monotonic()
            try:
                if resource_version is None:
                    resource_version = await self._list_and_update("0")
                kwargs = self._selectors()
                kwargs.update(resource_version=resource_version)
                if self.request_timeout:
                    kwargs["_request_timeout"] = self.request_timeout
                if self.timeout_seconds:
                    kwargs["timeout_seconds"] = self.timeout_seconds
                async with w.stream(getattr(self.api, self.list_method_name), **kwargs) as events:
                    async for event in events:
                        resource_version = self._apply(event) or resource_version
                        delay = 0.1
                        if self._stopping or time.monotonic() - started >= self.restart_seconds:
                            break
            except asyncio.CancelledError:
                raise
            except Exception:
                resource_version = None  # relist: our view may have missed events (410 Gone)
                delay *= 2
                if delay > 30:
                    self.log.exception("Watching %s never recovered, giving up", self.kind)
                    if self.on_failure:
                        self.on_failure()
                    return
                self.log.exception("Error watching %s, retrying in %.1fs", self.kind, delay)
                await asyncio.sleep(delay)
            finally:
                w.stop()
                await w.close()
        self.log.info("%s watcher stopped", self.kind)

    async def stop(self) -> None:
        """Cancel the watch and wait for it (kubespawner's stop re-raises the task's
        CancelledError into the caller)."""
        self._stopping = True
        task, self.watch_task = self.watch_task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task], timeout=5)


class NodeReflector(_CountingReflector):
    """All nodes of the cluster (cluster-scoped list+watch: ClusterRole on nodes)."""

    kind = Unicode("nodes")
    list_method_name = Unicode("list_node")
    omit_namespace = Bool(True)


class PodReflector(_CountingReflector):
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


class CapacityWatcher:
    """Capacity snapshots for one catalog from a node and a pod reflector."""

    _shared: ClassVar[dict[tuple[int, Any], CapacityWatcher]] = {}

    def __init__(self, catalog: Any, *, log: logging.Logger | None = None) -> None:
        self.catalog = catalog
        self.log = log or logging.getLogger(__name__)
        self._nodes: NodeReflector | None = None
        self._pods: PodReflector | None = None
        self._starting: asyncio.Future[None] | None = None
        self._failed_at: float | None = None
        self._snapshot_key: tuple[Any, ...] | None = None
        self._snapshot: Capacity | None = None
        self._usage_key: tuple[Any, ...] | None = None
        self._usage: dict[str, float] = {}

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
        """Start both reflectors and wait for their first list. Safe to call on every
        form render: later calls return at once. When the API is unreachable this logs,
        leaves the counts unknown and tries again on a call at least 10 s later."""
        if self._nodes is not None and self._pods is not None:
            return
        if self._starting is None:
            if self._failed_at is not None and time.monotonic() - self._failed_at < _RETRY_AFTER_S:
                return
            self._starting = asyncio.ensure_future(self._start())
        starting = self._starting
        try:
            await asyncio.shield(starting)
        except asyncio.CancelledError:
            raise
        except Exception:
            pass  # logged once by _start; counts stay unknown

    async def _start(self) -> None:
        nodes = pods = None
        try:
            nodes, pods = NodeReflector(parent=None), PodReflector(parent=None)
            results = await asyncio.gather(nodes.start(), pods.start(), return_exceptions=True)
            for result in results:
                if isinstance(result, BaseException):
                    raise result
            self._nodes, self._pods = nodes, pods
            self._failed_at = None
        except Exception as exc:
            # kubespawner's start() already logged the traceback
            self.log.error("Cannot watch nodes and pods (%s); GPU capacity shows as unknown", exc)
            self._failed_at = time.monotonic()
            for reflector in (nodes, pods):
                if reflector is not None:
                    if reflector.first_load_future.done():
                        reflector.first_load_future.exception()  # retrieved: no asyncio warning
                    await reflector.stop()
            raise
        finally:
            self._starting = None

    async def stop(self) -> None:
        for reflector in (self._nodes, self._pods):
            if reflector is not None:
                await reflector.stop()
        self._nodes = self._pods = None
        for key, watcher in list(self._shared.items()):
            if watcher is self:
                del self._shared[key]

    # ------------------------------------------------------------------ reads (no API calls)
    def _version(self, *reflectors: _CountingReflector | None) -> tuple[Any, ...]:
        return tuple(
            (id(r), r.generation, id(r.resources)) if r is not None else None for r in reflectors
        )

    def nodes(self) -> Iterable[dict[str, Any]]:
        return list(self._nodes.resources.values()) if self._nodes is not None else []

    def pods(self) -> Iterable[dict[str, Any]]:
        return list(self._pods.resources.values()) if self._pods is not None else []

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """One cached pod, or None."""
        return self._pods.resources.get(f"{namespace}/{name}") if self._pods is not None else None

    def snapshot(self) -> Capacity:
        """Free/total per pool and offer from the caches; recomputed only after a change."""
        key = self._version(self._nodes, self._pods)
        if self._snapshot is None or key != self._snapshot_key:
            self._snapshot = compute_capacity(self.catalog, self.nodes(), self.pods())
            self._snapshot_key = key
        return self._snapshot

    def usage_by_user(self) -> dict[str, float]:
        """GPU-equivalents each user's active pods hold, from the pod cache."""
        key = self._version(self._pods)
        if key != self._usage_key:
            self._usage = gpu_usage_by_user(self.pods())
            self._usage_key = key
        return dict(self._usage)
