"""The object store: resourceVersions, a bounded event history and watch fan-out.

Each stored object keeps its JSON bytes, so a list of 20,000 pods is a join of cached bytes,
not 20,000 serialisations.
"""

from __future__ import annotations

import asyncio
import copy
import json
import random
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from .resources import BUILTIN, Registry, Resource

# plural -> (kind, namespaced), for the core kinds (what the scheduler and kubelet use)
KINDS: dict[str, tuple[str, bool]] = {
    r.plural: (r.kind, r.namespaced) for r in BUILTIN if not r.group
}
#: the apiserver's short names, which kubectl learns from discovery (`kubectl get ns`)
SHORT_NAMES: dict[str, list[str]] = {r.key: list(r.short_names) for r in BUILTIN if r.short_names}
HISTORY = 100_000  # events kept for watches resuming from a resourceVersion


def now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class ApiError(Exception):
    """An error the apiserver would answer with a Status object."""

    def __init__(self, code: int, reason: str, message: str, details: dict | None = None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details or {}

    def status(self) -> dict[str, Any]:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "details": self.details,
            "code": self.code,
        }


def not_found(plural: str, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{plural} "{name}" not found', {"name": name, "kind": plural})


def event_line(
    kind: str,
    raw: bytes,
    obj: Mapping[str, Any],
    prev: Mapping[str, Any] | None,
    matches: Callable[[Mapping[str, Any]], bool],
) -> bytes | None:
    """The watch event one watcher sees for a change, judged on the object before and after it,
    as the apiserver's cacheWatcher does (k8s.io/apiserver cache_watcher.go, convertToWatchEvent):
    an object that starts matching a watch's selectors arrives ADDED, one that stops matching
    leaves DELETED (its previous content at the new resourceVersion), so a watch with
    `status.phase!=Succeeded` sees a pod that finishes go away."""
    now = kind != "DELETED" and matches(obj)
    before = prev is not None and matches(prev)
    if not now and not before:
        return None
    if now:
        event = "MODIFIED" if before else "ADDED"
        return b'{"type":"' + event.encode() + b'","object":' + raw + b"}\n"
    if kind != "DELETED":
        gone = copy.deepcopy(dict(prev or {}))
        gone["metadata"]["resourceVersion"] = obj["metadata"]["resourceVersion"]
        raw = json.dumps(gone, separators=(",", ":")).encode()
    return b'{"type":"DELETED","object":' + raw + b"}\n"


@dataclass
class Entry:
    obj: dict[str, Any]
    raw: bytes


@dataclass(eq=False)  # compared and hashed by identity: one per watch request
class Watch:
    plural: str
    namespace: str | None
    matches: Callable[[Mapping[str, Any]], bool]
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    #: the apiVersion the watcher asked for, where it is not the storage version (a CRD
    #: serving several versions without conversion: only apiVersion differs)
    api_version: str | None = None


def as_version(raw: bytes, obj: Mapping[str, Any], api_version: str | None) -> bytes:
    """The stored JSON, or a copy at another apiVersion (conversion strategy None)."""
    if not api_version or obj.get("apiVersion") == api_version:
        return raw
    return json.dumps({**obj, "apiVersion": api_version}, separators=(",", ":")).encode()


class Store:
    def __init__(self) -> None:
        self.rv = 0
        #: the oldest resourceVersion a watch may resume from: the apiserver's watch cache
        #: starts empty at the revision it finds when it (re)starts, and answers an older
        #: one "410 too old resource version" (k8s.io/apiserver storage/cacher
        #: watch_cache.go, getAllEventsSinceLocked; KEP-1904 on resumption after a reboot)
        self.floor = 0
        self.resources = Registry()
        # resource key -> (namespace, name) -> entry
        self.objects: dict[str, dict[tuple[str, str], Entry]] = {r.key: {} for r in self.resources}
        # (resourceVersion, plural, event type, object JSON, object, previous object or None)
        self.history: deque[tuple[int, str, str, bytes, dict, dict | None]] = deque(maxlen=HISTORY)
        self.watches: set[Watch] = set()
        self.listeners: list[Callable[[str, str, dict[str, Any]], None]] = []

    # ---------------------------------------------------------------- writes
    def _next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    def _emit(
        self, plural: str, kind: str, obj: dict[str, Any], raw: bytes, prev: dict[str, Any] | None
    ) -> None:
        self.history.append((self.rv, plural, kind, raw, obj, prev))
        for w in list(self.watches):
            if w.plural != plural:
                continue
            if w.namespace and obj["metadata"].get("namespace") != w.namespace:
                continue
            line = event_line(kind, as_version(raw, obj, w.api_version), obj, prev, w.matches)
            if line is not None:
                w.queue.put_nowait(line)
        for listener in list(self.listeners):
            listener(plural, kind, obj)

    def _store(self, plural: str, obj: dict[str, Any], event: str | None) -> dict[str, Any]:
        meta = obj["metadata"]
        meta["resourceVersion"] = self._next_rv()
        raw = json.dumps(obj, separators=(",", ":")).encode()
        key = (meta.get("namespace", ""), meta["name"])
        prev = self.objects[plural].get(key)
        self.objects[plural][key] = Entry(obj, raw)
        if event:
            self._emit(plural, event, obj, raw, prev.obj if prev and event != "ADDED" else None)
        return obj

    def serve(self, resource: Resource) -> None:
        """Serve a resource (a CRD was created or changed); its objects stay as they are."""
        self.resources.add(resource)
        self.objects.setdefault(resource.key, {})

    def unserve(self, key: str) -> None:
        """Stop serving a resource: its objects are deleted (watchers see DELETED), as the
        apiserver's CRD finalizer deletes every custom resource, then watches end."""
        for ns, name in list(self.objects.get(key, {})):
            self.remove(key, ns or None, name)
        self.objects.pop(key, None)
        self.resources.remove(key)
        for w in list(self.watches):
            if w.plural == key:
                w.queue.put_nowait(None)

    def create(self, plural: str, namespace: str | None, obj: dict[str, Any]) -> dict[str, Any]:
        return self._store(plural, self.new_object(plural, namespace, obj), "ADDED")

    def new_object(self, plural: str, namespace: str | None, obj: dict[str, Any]) -> dict[str, Any]:
        """What a create would store (name, namespace, uid, timestamps), checked against what
        exists, without storing it (also the answer to a dry-run create)."""
        resource = self.resources[plural]
        kind, namespaced = resource.kind, resource.namespaced
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            # five characters from the apiserver's alphabet (no vowels, no 0/1/3: no words)
            suffix = "".join(random.choices("bcdfghjklmnpqrstvwxz2456789", k=5))
            meta["name"] = meta["generateName"] + suffix
        if not meta.get("name"):
            raise ApiError(422, "Invalid", f"{kind} is invalid: metadata.name: Required value")
        if namespaced:
            ns = namespace or meta.get("namespace") or "default"
            if meta.get("namespace") and namespace and meta["namespace"] != namespace:
                raise ApiError(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does not match the namespace sent "
                    "on the request",
                )
            if ("", ns) not in self.objects["namespaces"] and plural != "namespaces":
                raise ApiError(
                    404,
                    "NotFound",
                    f'namespaces "{ns}" not found',
                    {"name": ns, "kind": "namespaces"},
                )
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        key = (meta.get("namespace", ""), meta["name"])
        if key in self.objects[plural]:
            raise ApiError(
                409,
                "AlreadyExists",
                f'{plural} "{meta["name"]}" already exists',
                {"name": meta["name"], "kind": plural},
            )
        obj["kind"], obj["apiVersion"] = kind, resource.api_version()
        # server-set fields: what a client sends there is ignored (kubectl sends
        # "creationTimestamp": null), as the apiserver's BeforeCreate does
        for server_set in ("deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"):
            meta.pop(server_set, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_iso()
        meta.pop("resourceVersion", None)
        return obj

    def update(self, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Replace a stored object (the caller mutated a copy) and tell the watchers."""
        return self._store(plural, obj, "MODIFIED")

    def remove(self, plural: str, namespace: str | None, name: str) -> dict[str, Any]:
        entry = self.objects[plural].pop((namespace or "", name), None)
        if entry is None:
            raise not_found(plural, name)
        obj = entry.obj
        obj["metadata"]["resourceVersion"] = self._next_rv()
        raw = json.dumps(obj, separators=(",", ":")).encode()
        self._emit(plural, "DELETED", obj, raw, obj)
        return obj

    def load(self, plural: str, obj: dict[str, Any]) -> None:
        """Put an object in place without validation or events (topology set-up)."""
        resource = self.resources[plural]
        kind, namespaced = resource.kind, resource.namespaced
        meta = obj.setdefault("metadata", {})
        obj["kind"], obj["apiVersion"] = kind, resource.api_version()
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", now_iso())
        if namespaced:
            meta.setdefault("namespace", "default")
        self._store(plural, obj, None)

    # ---------------------------------------------------------------- reads
    def get(self, plural: str, namespace: str | None, name: str) -> dict[str, Any]:
        entry = self.objects[plural].get((namespace or "", name))
        if entry is None:
            raise not_found(plural, name)
        return entry.obj

    def entries(self, plural: str, namespace: str | None) -> Iterable[Entry]:
        items = self.objects[plural]
        if namespace:
            return (e for (ns, _), e in items.items() if ns == namespace)
        return items.values()

    def list_raw(
        self,
        plural: str,
        namespace: str | None,
        matches: Callable[[Mapping[str, Any]], bool],
        version: str | None = None,
    ) -> bytes:
        resource = self.resources[plural]
        api_version = resource.api_version(version)
        items = b",".join(
            as_version(e.raw, e.obj, api_version)
            for e in self.entries(plural, namespace)
            if matches(e.obj)
        )
        return (
            b'{"kind":"'
            + resource.kind.encode()
            + b'List","apiVersion":"'
            + api_version.encode()
            + b'","metadata":{"resourceVersion":"'
            + str(self.rv).encode()
            + b'"},"items":['
            + items
            + b"]}"
        )

    def watch(
        self,
        plural: str,
        namespace: str | None,
        matches: Callable[[Mapping[str, Any]], bool],
        resource_version: str | None,
        api_version: str | None = None,
    ) -> Watch:
        w = Watch(plural, namespace, matches, api_version=api_version)
        if resource_version in (None, "", "0"):
            # "start at most recent": synthetic ADDED events for what exists now
            for entry in self.entries(plural, namespace):
                if matches(entry.obj):
                    raw = as_version(entry.raw, entry.obj, api_version)
                    w.queue.put_nowait(b'{"type":"ADDED","object":' + raw + b"}\n")
        else:
            try:
                since = int(resource_version)
            except ValueError:
                raise ApiError(
                    400, "BadRequest", f"invalid resource version {resource_version!r}"
                ) from None
            # events older than the history window were compacted away, like etcd's
            full = len(self.history) == self.history.maxlen
            oldest = max(self.history[0][0] - 1 if full else 0, self.floor)
            if since < oldest:
                raise ApiError(410, "Expired", f"too old resource version: {since} ({oldest})")
            if since > self.rv:  # a version this store never issued (the cacher waits 3 s first)
                raise ApiError(
                    504, "Timeout", f"Too large resource version: {since}, current: {self.rv}"
                )
            for rv, hplural, kind, raw, obj, prev in self.history:
                if rv <= since or hplural != plural:
                    continue
                if namespace and obj["metadata"].get("namespace") != namespace:
                    continue
                line = event_line(kind, as_version(raw, obj, api_version), obj, prev, matches)
                if line is not None:
                    w.queue.put_nowait(line)
        self.watches.add(w)
        return w
