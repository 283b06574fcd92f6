"""The hub's pods as kubespawner reads them, a few hundred bytes each (issue 37: watch memory).

kubespawner's pod reflector keeps every single-user pod whole, as parsed JSON: several kB a pod
(tens of kB from a real API server: managedFields, env, volumes, default fields). What
kubespawner 7.1 reads of `pod_reflector.pods[key]` is little (kubespawner/spawner.py):

- `is_pod_running`: status.phase, status.podIP, "deletionTimestamp" in metadata,
  status.containerStatuses[].ready;
- `poll`: status.phase, containerStatuses[].name and .state ("terminated" in it, its exitCode);
- `_get_pod_port` / `_get_pod_url`: spec.containers[].ports[] (name, containerPort),
  metadata.name, status.podIP;
- `_start` / `pod_has_uid`: metadata.uid;

and FracSpawner's queue reads status.phase, spec.nodeName and metadata.creationTimestamp, and,
while the pod waits for a node, its PodScheduled condition (status, reason, message: what the
scheduler says, hub/spawner.py `_stuck_words`, `_unschedulable`) and spec.schedulerName where it
is not the default one (a scheduler that is not running says nothing at all). FracSpawner's
`_pod_failure` (hub/progress.py `pod_failure`, which ends a spawn at once for an image its
registry does not have or refuses, or a server that exits at each restart) reads, of each of
status.initContainerStatuses and .containerStatuses: name, state.waiting.reason and .message
(the kubelet's "... not found", "401 Unauthorized"), image, and lastState.terminated (exitCode,
reason such as OOMKilled, message). Those are kept only while the container waits (not for a
running or ended one), each text cut to `_TEXT_KEPT` characters, and init containers' statuses
only while one of them waits: a running pod is kept as it was without them.

A `PodCache` keeps only those: per pod one small record (uid, pod IP and creation time as
integers where they round-trip exactly, and a shared "shape": phase, node, deletion time,
containers' ports, container statuses, which thousands of pods have in common). A read builds
a fresh dict in the API's shape with just those fields, so a reader can neither see nor change
another's copy. Labels, annotations, resourceVersion and the rest are not kept.
"""

from __future__ import annotations

import calendar
import functools
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

__all__ = ["PodCache", "pod_cache_key"]

_TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
#: the most distinct shapes shared at once; when full the table starts over (records keep theirs)
_SHAPES_LIMIT = 16384
_DEFAULT_SCHEDULER = "default-scheduler"
_STATE_KEPT = ("exitCode", "reason")  # of a container state: what poll (and a person) reads
#: of a waiting container: its waiting message, image and last termination (pod_failure)
_WAITING_KEPT = ("exitCode", "reason", "message")
#: the most characters kept of a waiting message or a termination's message (a kubelet's are a
#: few hundred; a container's termination message may be up to 4 kB): bounded per pod
_TEXT_KEPT = 1000


def pod_cache_key(pod: Mapping[str, Any]) -> str:
    """kubespawner's reflector key: "namespace/name"."""
    metadata = pod.get("metadata") or {}
    return f"{metadata.get('namespace')}/{metadata.get('name')}"


# ------------------------------------------------------------------ compact values
# Each packing is kept only where it reads back exactly the text it came from.
def _pack_uid(uid: Any) -> Any:
    """A canonical (lower-case) UUID as its integer: 44 bytes instead of 85."""
    if isinstance(uid, str) and len(uid) == 36 and uid.count("-") == 4:
        try:
            packed = int(uid.replace("-", ""), 16)
        except ValueError:
            return uid
        if _unpack_uid(packed) == uid:
            return packed
    return uid


def _unpack_uid(uid: Any) -> Any:
    if not isinstance(uid, int):
        return uid
    h = f"{uid:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _pack_ip(ip: Any) -> Any:
    """A dotted IPv4 address as its integer; IPv6 and anything else as it is."""
    if isinstance(ip, str):
        parts = ip.split(".")
        if len(parts) == 4 and all(p.isdigit() and len(p) <= 3 for p in parts):
            a, b, c, d = (int(p) for p in parts)
            if max(a, b, c, d) <= 255:
                packed = a << 24 | b << 16 | c << 8 | d
                if _unpack_ip(packed) == ip:  # no leading zeros
                    return packed
    return ip


def _unpack_ip(ip: Any) -> Any:
    if not isinstance(ip, int):
        return ip
    return f"{ip >> 24}.{ip >> 16 & 255}.{ip >> 8 & 255}.{ip & 255}"


@functools.lru_cache(maxsize=1024)
def _pack_time(stamp: Any) -> Any:
    """An RFC 3339 UTC time in whole seconds (what the API server writes) as epoch seconds
    (pods created together share a few stamps: cached)."""
    if isinstance(stamp, str) and len(stamp) == 20:
        try:
            packed = calendar.timegm(time.strptime(stamp, _TIME_FORMAT))
        except ValueError:
            return stamp
        if _unpack_time(packed) == stamp:
            return packed
    return stamp


@functools.lru_cache(maxsize=1024)
def _unpack_time(stamp: Any) -> Any:
    return time.strftime(_TIME_FORMAT, time.gmtime(stamp)) if isinstance(stamp, int) else stamp


def _flat(items: Any) -> tuple:
    """A list of flat dicts (ports, a container's state details) as tuples of items."""
    return tuple(tuple(d.items()) if isinstance(d, dict) else d for d in items or ())


def _containers(spec: Mapping[str, Any]) -> tuple:
    return tuple((c.get("name"), _flat(c.get("ports"))) for c in spec.get("containers") or [])


def _details(detail: Any, keys: tuple[str, ...]) -> tuple:
    """Of a container state's details, `keys`, a text cut to _TEXT_KEPT characters."""
    if not isinstance(detail, Mapping):
        return ()
    kept = []
    for k in keys:
        if k in detail:
            value = detail[k]
            kept.append((k, value[:_TEXT_KEPT] if isinstance(value, str) else value))
    return tuple(kept)


def _status(c: Mapping[str, Any]) -> tuple:
    """One container's status: (name, ready, restartCount, state), and while it waits also
    its image and last termination (what pod_failure reads of a pull or a crash loop)."""
    state_of = c.get("state") or {}
    state = tuple(
        (kind, _details(detail, _WAITING_KEPT if kind == "waiting" else _STATE_KEPT))
        for kind, detail in state_of.items()
    )
    kept = (c.get("name"), c.get("ready"), c.get("restartCount"), state)
    if "waiting" not in state_of:
        return kept
    ended = (c.get("lastState") or {}).get("terminated")
    last = _details(ended, _WAITING_KEPT) if isinstance(ended, Mapping) else None
    return (*kept, c.get("image"), last)


def _statuses(status: Mapping[str, Any]) -> tuple | None:
    if "containerStatuses" not in status:
        return None
    return tuple(_status(c) for c in status.get("containerStatuses") or [])


def _init_statuses(status: Mapping[str, Any]) -> tuple | None:
    """The init containers' statuses while one of them waits (a pull, a crash loop); None
    once they all ran (or there are none): a running pod keeps none of them."""
    found = status.get("initContainerStatuses") or []
    if not any(isinstance(c, Mapping) and "waiting" in (c.get("state") or {}) for c in found):
        return None
    return tuple(_status(c) for c in found if isinstance(c, Mapping))


def _scheduled(status: Mapping[str, Any]) -> tuple | None:
    """The PodScheduled condition while it is not True (status, reason, message): what the
    scheduler says of a pod it found no node for. Once True the pod has its node."""
    for c in status.get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == "PodScheduled" and c.get("status") != "True":
            return (c.get("status"), c.get("reason"), c.get("message"))
    return None


def _container_status(
    name: Any, ready: Any, restarts: Any, state: Any, *waiting: Any
) -> dict[str, Any]:
    read = {"name": name, "ready": ready, "state": {k: dict(v) for k, v in state}}
    if restarts is not None:
        read["restartCount"] = restarts
    if waiting:  # a waiting container's image and last termination
        image, last = waiting
        if image is not None:
            read["image"] = image
        if last is not None:
            read["lastState"] = {"terminated": dict(last)}
    return read


class _Pod:
    """One kept pod: what is its own, and a shape shared with pods like it."""

    __slots__ = ("uid", "ip", "created", "shape")

    def __init__(self, uid: Any, ip: Any, created: Any, shape: tuple) -> None:
        self.uid, self.ip, self.created, self.shape = uid, ip, created, shape


class PodCache(Mapping[str, dict[str, Any]]):
    """Pods keyed "namespace/name", kept compact, read as fresh dicts (see the module)."""

    def __init__(self, pods: Iterable[Mapping[str, Any]] = ()) -> None:
        self._pods: dict[str, _Pod] = {}
        self._shapes: dict[tuple, tuple] = {}
        for pod in pods:
            self.put(pod)

    # ------------------------------------------------------------------ feeding
    def put(self, pod: Mapping[str, Any]) -> None:
        """Keep (or update) a listed or watched pod."""
        metadata = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        status = pod.get("status") or {}
        shape = (
            status.get("phase"),
            spec.get("nodeName"),
            metadata.get("deletionTimestamp"),
            _containers(spec),
            _statuses(status),
            spec.get("schedulerName") if spec.get("schedulerName") != _DEFAULT_SCHEDULER else None,
            _scheduled(status),
        )
        inits = _init_statuses(status)
        if inits is not None:  # appended only then: a running pod's shape is what it was
            shape = (*shape, inits)
        try:
            shared = self._shapes.get(shape)
        except TypeError:  # an odd, unhashable value: kept, not shared
            shared = shape
        if shared is None:
            if len(self._shapes) >= _SHAPES_LIMIT:
                self._shapes.clear()
            shared = self._shapes[shape] = shape
        self._pods[pod_cache_key(pod)] = _Pod(
            _pack_uid(metadata.get("uid")),
            _pack_ip(status.get("podIP")),
            _pack_time(metadata.get("creationTimestamp")),
            shared,
        )

    def drop(self, pod: Mapping[str, Any]) -> None:
        """Forget a deleted pod (no error when it is not kept)."""
        self._pods.pop(pod_cache_key(pod), None)

    # ------------------------------------------------------------------ reading
    def __getitem__(self, key: str) -> dict[str, Any]:
        kept = self._pods[key]
        namespace, _, name = key.partition("/")
        phase, node, deleting, containers, statuses, scheduler, scheduled, *inits = kept.shape
        metadata: dict[str, Any] = {"name": name, "namespace": namespace}
        if kept.uid is not None:
            metadata["uid"] = _unpack_uid(kept.uid)
        if kept.created is not None:
            metadata["creationTimestamp"] = _unpack_time(kept.created)
        if deleting is not None:
            metadata["deletionTimestamp"] = deleting
        spec: dict[str, Any] = {
            "containers": [
                {"name": c, "ports": [dict(p) for p in ports]} for c, ports in containers
            ]
        }
        if node is not None:
            spec["nodeName"] = node
        if scheduler is not None:
            spec["schedulerName"] = scheduler
        status: dict[str, Any] = {"phase": phase, "podIP": _unpack_ip(kept.ip)}
        if statuses is not None:
            status["containerStatuses"] = [_container_status(*kept) for kept in statuses]
        if inits:
            status["initContainerStatuses"] = [_container_status(*kept) for kept in inits[0]]
        if scheduled is not None:
            said = dict(zip(("status", "reason", "message"), scheduled, strict=True))
            status["conditions"] = [{"type": "PodScheduled", **said}]
        return {"metadata": metadata, "spec": spec, "status": status}

    # equal only to itself: traitlets compares a reflector's old and new `resources` on each
    # list, and a Mapping's equality would build every kept pod to do it
    def __eq__(self, other: object) -> bool:
        return self is other

    __hash__ = object.__hash__

    def __contains__(self, key: object) -> bool:
        return key in self._pods

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._pods))

    def __len__(self) -> int:
        return len(self._pods)
