"""kubespawner's pod and event reflectors, resumed instead of re-listed.

kubespawner's `ResourceReflector._watch_and_update` lists every watched object again each time
its watch ends, and the API server ends one every `timeout_seconds` (10 s by default): with
20,000 single-user pods that is a 17.8 MB list parsed every ten seconds, most of a big hub's
idle CPU and a steady load on the API server (issue 37). client-go's Reflector lists once and
then follows watches from the last resourceVersion, with bookmarks keeping that version fresh
while nothing changes; it lists again only when the API server says the version is gone
(410 Gone: "too old resource version") or the stream breaks (tools/cache/reflector.go,
ListAndWatch / watchHandler). These reflectors do the same.

What kubespawner reads stays as it is: `pods` / `events` / `resources` keyed "namespace/name",
`first_load_future`, `start()` / `stop()`. The pods are a `PodCache` (fracspawner.k8s.podcache):
a read-only mapping keeping per pod only the fields kubespawner and FracSpawner read
(is_pod_running, poll, _get_pod_port/_get_pod_url, the queue check), a few hundred bytes a pod,
each read a fresh dict in the API's shape; unless the admin configured a `get_pod_url` hook,
which may read any field: then whole pods are kept, less `metadata.managedFields`, which
nothing reads. Events drop managedFields.

Unlike kubespawner's, the loop never gives up: errors are retried with capped, jittered
backoff as client-go does (800 ms doubling to 30 s). kubespawner calls `on_failure` after about
a minute of failures, which halts a hub watching all namespaces and, in one namespace, leaves a
reflector that never updates again while the hub goes on reading it.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Any

from kubernetes_asyncio import client
from kubespawner.reflector import ResourceReflector
from kubespawner.spawner import EventReflector, PodReflector
from traitlets import Any as AnyTrait
from traitlets import Float, Int

from ..capacity.rawwatch import watch_once
from ..k8s.podcache import PodCache

#: a failing watch logs at warning level again after this many quiet retries
_LOG_EVERY = 10


def slim(obj: dict[str, Any]) -> dict[str, Any]:
    """The object as kept: without managedFields (field ownership for server-side apply,
    never read by kubespawner or fracspawner)."""
    metadata = obj.get("metadata")
    if isinstance(metadata, dict) and "managedFields" in metadata:
        metadata.pop("managedFields")
    return obj


def _key(obj: dict[str, Any]) -> str:
    metadata = obj.get("metadata") or {}
    return f"{metadata.get('namespace')}/{metadata.get('name')}"


class ResumingReflector(ResourceReflector):
    """A ResourceReflector that lists once and then resumes its watch from the last
    resourceVersion (see the module's docstring)."""

    initial_backoff = Float(
        0.8,
        config=True,
        help="Seconds before the first retry after a watch or list failed; doubles on each "
        "failure up to max_backoff (client-go's Reflector: 800 ms).",
    )
    max_backoff = Float(
        30.0,
        config=True,
        help="Most seconds between retries while the API server cannot be watched (client-go "
        "uses 30 s). The reflector never gives up.",
    )
    lists = Int(0, help="How many full lists this reflector made (start's included).")
    watches = Int(0, help="How many watch requests ended normally (server timeout or restart).")

    _listed_version: str | None = None

    def _fresh(self, items: list[dict[str, Any]]) -> Any:
        """A new store holding a listing's objects (what `resources` is)."""
        return {_key(item): slim(item) for item in items}

    async def _list_and_update(self, resource_version: str | None = None) -> str:
        """kubespawner's list, with what is kept slimmed; remembers the version so the watch
        loop that `start()` launches resumes from it instead of listing again."""
        kwargs: dict[str, Any] = dict(
            label_selector=self.label_selector,
            field_selector=self.field_selector,
            _request_timeout=self.request_timeout,
            _preload_content=False,
        )
        if resource_version is not None:
            kwargs.update(resource_version=resource_version, resource_version_match="NotOlderThan")
        if not self.omit_namespace:
            kwargs["namespace"] = self.namespace
        response = await getattr(self.api, self.list_method_name)(**kwargs)
        body = await response.read()
        if not response.ok:
            raise client.ApiException(status=response.status, reason=response.reason)
        listing = json.loads(body)
        # one assignment: readers never see a half-built dictionary
        self.resources = self._fresh(listing.get("items") or [])
        self.lists += 1
        if not self.first_load_future.done():
            self.first_load_future.set_result(None)
        version = (listing.get("metadata") or {}).get("resourceVersion") or "0"
        self._listed_version = version
        return version

    def _put(self, obj: dict[str, Any]) -> None:
        self.resources[_key(obj)] = slim(obj)

    def _drop(self, obj: dict[str, Any]) -> None:
        self.resources.pop(_key(obj), None)

    async def _watch(self, version: str) -> str:
        started = time.monotonic()
        kwargs: dict[str, Any] = {
            "label_selector": self.label_selector,
            "field_selector": self.field_selector,
            "allow_watch_bookmarks": True,
        }
        if not self.omit_namespace:
            kwargs["namespace"] = self.namespace
        if self.timeout_seconds:
            kwargs["timeout_seconds"] = self.timeout_seconds
        # a watch silent well past its server-side timeout is a dead connection, not a quiet one
        kwargs["_request_timeout"] = max(self.request_timeout, self.timeout_seconds + 30)
        return await watch_once(
            getattr(self.api, self.list_method_name),
            version,
            put=self._put,
            drop=self._drop,
            delivered=lambda: None,
            until=lambda: self._stopping or time.monotonic() - started >= self.restart_seconds,
            **kwargs,
        )

    async def _watch_and_update(self) -> None:
        """List (only when there is no version to resume from), then watch, forever."""
        self.log.info("watching %s (resuming from each watch's last resourceVersion)", self.kind)
        try:
            await self._follow()
        except asyncio.CancelledError:
            if not self._stopping:
                raise
        # stop() cancels us: end quietly, as kubespawner's loop does
        self.log.info("%s watcher stopped", self.kind)

    async def _follow(self) -> None:
        version, self._listed_version = self._listed_version, None
        failures = 0
        while not self._stopping:
            try:
                if version is None:
                    version = await self._list_and_update()
                version = await self._watch(version)
                self.watches += 1
                failures = 0
            except client.ApiException as exc:
                version = None
                if exc.status == 410:  # compacted past our version: list now, then resume
                    self.log.info("%s watch: %s; listing again", self.kind, exc.reason)
                    continue
                failures += 1
                await self._back_off(exc, failures)
            except Exception as exc:  # a broken stream, a timeout, a refused connection
                version = None
                failures += 1
                await self._back_off(exc, failures)

    async def _back_off(self, exc: BaseException, failures: int) -> None:
        delay = min(self.max_backoff, self.initial_backoff * 2 ** (failures - 1))
        delay *= 1 + random.random() * 0.2  # spread the retries of many hubs
        log = self.log.warning if failures == 1 or failures % _LOG_EVERY == 0 else self.log.debug
        log(
            "Cannot watch %s (%s: %s); listing again in %.1f s",
            self.kind, type(exc).__name__, exc, delay,
        )  # fmt: skip
        await asyncio.sleep(delay)


class ResumingPodReflector(ResumingReflector, PodReflector):
    """kubespawner's PodReflector (`pods`), resumed instead of re-listed, keeping what
    kubespawner reads of each pod (a `PodCache`)."""

    resources = AnyTrait(
        help="The pods, keyed namespace/name: a read-only PodCache, or a dict of whole pods "
        "where an admin's get_pod_url hook may read any field."
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # an admin's get_pod_url hook may read any field of the pod: keep pods whole then
        self._whole = bool(getattr(self.parent, "get_pod_url", None))
        self.resources = {} if self._whole else PodCache()

    def _fresh(self, items: list[dict[str, Any]]) -> Any:
        return super()._fresh(items) if self._whole else PodCache(items)

    def _put(self, obj: dict[str, Any]) -> None:
        if self._whole:
            super()._put(obj)
        else:
            self.resources.put(obj)

    def _drop(self, obj: dict[str, Any]) -> None:
        if self._whole:
            super()._drop(obj)
        else:
            self.resources.drop(obj)


class ResumingEventReflector(ResumingReflector, EventReflector):
    """kubespawner's EventReflector (`events`), resumed instead of re-listed."""
