"""Per-namespace GPU quota for concurrent admissions, across webhook replicas.

What a namespace holds comes from a pod watch (`PodIndex`, fed by cluster.PodWatch), never from
a list per review: one review costs memory reads, plus two API calls (read, conditional write of
the namespace's reservation record) for a slice pod in a namespace that has a quota, and a
reinvocation of a generateName pod's review one more (a list of the pods labelled with its
reservation key: webhook.Webhook._key_in_use).

The API server creates a pod only after every webhook answered, so two CREATEs of one namespace
arriving together would each miss the other's pod and both fit under the quota. An admitted
pod's GPU-equivalents are therefore reserved until this replica's watch has seen the pod, or
for at most `window` seconds (the API server gave up on it: a later webhook refused it, a name
taken, or a review nobody meant to create). With several replicas (the chart runs two) the
reservations live in one ConfigMap per namespace (`SharedLedger`), written with the
resourceVersion read as a precondition: the API server answers 409 Conflict to a write based
on an older version (optimistic concurrency, "Concurrency Control and Consistency" in
kubernetes/community contributors/devel/sig-architecture/api-conventions.md), and the loser
counts again with the winner's reservation in view. `LocalLedger` keeps them in memory for one
replica. A reservation is dropped only when its window ended, not when the writer's watch saw
the pod: another replica's watch may not have it yet.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

GPU_EQUIVALENT_ANNOTATION = "fracspawner.io/gpu-equivalent"
#: the reservation key the webhook writes on a pod created by generateName (a Job's, a
#: ReplicaSet's, a Katib trial's): such a pod has neither its name nor its uid at mutating
#: admission (k8s.io/apiserver pkg/endpoints/handlers/create.go runs mutating admission before
#: the store's create, and pkg/registry/generic/registry/store.go create sets metadata.uid by
#: rest.FillObjectMetaSystemFields and the name from generateName only then), so the watch
#: matches the pod to its reservation by this annotation
RESERVATION_ANNOTATION = "fracspawner.io/reservation"
#: the label the webhook writes (value "true") on a pod that is no notebook whose GPU it counted
#: against the namespace's quota (and checked against its pools) at CREATE, and on a pod
#: without a slice (notebook or not) that asks no GPU but names KAI's or Run:ai's scheduler
#: (recognise.sized_when_scheduled: they read the ask from its annotations when they place it;
#: counted as 0): the guard's second webhook selects it, so what the count and the check read
#: from the pod (its backend ask fields, its tolerations) and the label itself cannot change
#: afterwards (admission.guard_update). A slice pod is guarded by fracspawner.io/pool instead
COUNTED_LABEL = "fracspawner.io/counted"


def reservation_key(namespace: str, request: Mapping[str, Any]) -> str:
    """A reservation key for an object created by generateName, derived from the admission
    call (its uid, unique per call, and the requesting user: both set by the API server), so
    no tenant can choose it or share one between objects."""
    user = str(((request.get("userInfo") or {}).get("username")) or "")
    seed = f"{namespace}\0{user}\0{request.get('uid') or ''}"
    return "r-" + hashlib.sha256(seed.encode()).hexdigest()[:32]


#: a pod that left the watch is remembered this long (a reservation for it must not come back)
_GONE_MEMORY = 600.0
#: how far another replica's clock may be behind this one's (NTP keeps them closer)
_CLOCK_SLACK = 2.0


# --------------------------------------------------------------------------- what a pod holds
def pod_gpu(pod: Mapping[str, Any]) -> float:
    """GPU-equivalents a pod's fracspawner.io/gpu-equivalent annotation says (set by the
    webhook, guarded against later changes). The webhook counts with recognise.pod_gpu_held
    instead (any pod's GPU resources, the annotation where it says more)."""
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(GPU_EQUIVALENT_ANNOTATION)
    try:
        value = float(raw) if raw is not None else 0.0
    except (TypeError, ValueError):
        return 0.0
    # nan, inf and negatives count as nothing (never as credit)
    return value if math.isfinite(value) and 0.0 < value < 1e6 else 0.0


def still_holds(pod: Mapping[str, Any]) -> bool:
    """Whether a pod still holds its GPU: until it is gone from the API server, or every
    container of it has stopped. A deleted pod keeps running through its grace period
    (terminationGracePeriodSeconds, a preStop hook, a process ignoring SIGTERM): the API server
    only sets deletionTimestamp (pkg/registry/core/pod/strategy.go CheckGracefulDelete), and the
    kubelet removes the object once the containers are dead (pkg/kubelet/status/status_manager.go
    canBeDeleted). Succeeded and Failed pods hold nothing."""
    status = pod.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return False
    if not (pod.get("metadata") or {}).get("deletionTimestamp"):
        return True
    containers = status.get("containerStatuses") or []
    return not containers or any("terminated" not in (c.get("state") or {}) for c in containers)


class PodObserver(Protocol):
    """Something else kept from the same pod watch (callers.PodAddresses)."""

    def load(self, pods: Iterable[Mapping[str, Any]]) -> None: ...
    def put(self, pod: Mapping[str, Any]) -> None: ...
    def drop(self, pod: Mapping[str, Any]) -> None: ...


class PodIndex:
    """What each namespace's pods hold, kept per watch event (cluster.PodWatch feeds it), and
    passed on to `observers`."""

    def __init__(
        self,
        amount: Callable[[Mapping[str, Any]], float] = pod_gpu,
        clock: Callable[[], float] = time.time,
        observers: Iterable[PodObserver] = (),
    ) -> None:
        self.amount = amount  # GPU-equivalents one pod holds while it holds anything
        self.clock = clock
        self.observers = list(observers)
        self._pods: dict[str, dict[str, float]] = {}  # namespace -> pod name -> GPU held
        self._gone: dict[tuple[str, str], float] = {}  # (namespace, key) -> when it left
        # (namespace, reservation annotation) -> the pod name carrying it
        self._keys: dict[tuple[str, str], str] = {}
        # (namespace, name or reservation annotation) -> when the watch first had it
        self._first: dict[tuple[str, str], float] = {}
        self.synced = False

    @staticmethod
    def _where(pod: Mapping[str, Any]) -> tuple[str, str]:
        meta = pod.get("metadata") or {}
        return str(meta.get("namespace") or ""), str(meta.get("name") or "")

    @staticmethod
    def _key(pod: Mapping[str, Any]) -> str:
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        return str(annotations.get(RESERVATION_ANNOTATION) or "")

    def load(self, pods: Iterable[Mapping[str, Any]]) -> None:
        """A fresh list: pods missing from it are gone."""
        pods = list(pods)
        for observer in self.observers:
            observer.load(pods)
        before = {(ns, name) for ns, names in self._pods.items() for name in names}
        keys = dict(self._keys)
        self._pods, self._keys = {}, {}
        for pod in pods:
            self._put(pod)
        now = self.clock()
        for key in before - {(ns, name) for ns, names in self._pods.items() for name in names}:
            self._gone[key] = now
        for marked in keys.keys() - self._keys.keys():
            self._gone[marked] = now
        self.synced = True

    def put(self, pod: Mapping[str, Any]) -> None:
        for observer in self.observers:
            observer.put(pod)
        self._put(pod)

    def _put(self, pod: Mapping[str, Any]) -> None:
        ns, name = self._where(pod)
        self._pods.setdefault(ns, {})[name] = self.amount(pod) if still_holds(pod) else 0.0
        self._gone.pop((ns, name), None)
        now = self.clock()
        self._first.setdefault((ns, name), now)
        key = self._key(pod)
        if key:
            self._keys[(ns, key)] = name
            self._gone.pop((ns, key), None)
            self._first.setdefault((ns, key), now)

    def drop(self, pod: Mapping[str, Any]) -> None:
        for observer in self.observers:
            observer.drop(pod)
        ns, name = self._where(pod)
        names = self._pods.get(ns, {})
        names.pop(name, None)
        if not names:
            self._pods.pop(ns, None)
        now = self.clock()
        self._gone[(ns, name)] = now
        key = self._key(pod)
        if key and self._keys.pop((ns, key), None) is not None:
            self._gone[(ns, key)] = now
        for key in [k for k, at in self._gone.items() if at < now - _GONE_MEMORY]:
            del self._gone[key]
            self._first.pop(key, None)

    def held(self, namespace: str, exclude: str | None = None) -> float:
        """GPU-equivalents the namespace's pods hold, but pod `exclude` (a retried create of a
        pod that exists is not counted twice)."""
        return sum(v for k, v in self._pods.get(namespace, {}).items() if k != exclude)

    def seen_since(self, namespace: str, key: str, since: float) -> bool:
        """Whether the pod named `key`, or carrying reservation annotation `key`, is in the
        watch, or left it after `since`."""
        if key in self._pods.get(namespace, {}) or (namespace, key) in self._keys:
            return True
        gone = self._gone.get((namespace, key))
        return gone is not None and gone >= since

    def appeared_since(self, namespace: str, key: str, since: float) -> bool:
        """Whether the pod named `key` (or carrying annotation `key`) entered the watch at or
        after `since`: it was created for a reservation made then, not there already."""
        first = self._first.get((namespace, key))
        return first is not None and first >= since and self.seen_since(namespace, key, since)


# --------------------------------------------------------------------------- reservations
@dataclass(frozen=True)
class Reservation:
    pod: str  # the pod's name, or its reservation annotation (a generateName pod)
    gpu: float
    at: float  # wall-clock time it was made (replicas compare it; clocks are NTP-close)
    source: str = ""  # the unverified caller's address; "" for the verified API server
    user: str = ""  # who asked (AdmissionRequest.userInfo.username, set by the API server)
    #: a reinvocation already took this key over (it may be taken over once: the API server
    #: reinvokes a webhook at most once per request)
    again: bool = False
    #: claims still to come from the pod's ResourceClaimTemplates: each takes its part of
    #: this reservation over (claims.DraGate); while some are due it counts, pod seen or not
    claims: int = 0


class Busy(Exception):
    """Other admissions of the namespace kept winning the write; the pod is refused."""


class LedgerUnavailable(Exception):
    """The reservation record could not be read or written."""


def encode(reservations: Mapping[str, Reservation]) -> str:
    def one(r: Reservation) -> dict[str, Any]:
        out: dict[str, Any] = {"pod": r.pod, "gpu": r.gpu, "at": round(r.at, 3)}
        if r.source:
            out["src"] = r.source
        if r.user:
            out["by"] = r.user
        if r.again:
            out["again"] = True
        if r.claims:
            out["claims"] = r.claims
        return out

    return json.dumps(
        {k: one(r) for k, r in reservations.items()}, sort_keys=True, separators=(",", ":")
    )


def decode(text: str | None) -> dict[str, Reservation]:
    """The reservations of a record; entries that are not reservations are left out."""
    try:
        raw = json.loads(text or "{}")
    except ValueError:
        return {}
    out = {}
    for key, value in raw.items() if isinstance(raw, dict) else ():
        try:
            reservation = Reservation(
                str(value["pod"]),
                float(value["gpu"]),
                float(value["at"]),
                str(value.get("src") or ""),
                str(value.get("by") or ""),
                bool(value.get("again")),
                max(int(value.get("claims") or 0), 0),
            )
        except (TypeError, KeyError, ValueError):
            continue
        if math.isfinite(reservation.gpu) and math.isfinite(reservation.at):
            out[str(key)] = reservation
    return out


class Ledger:
    """Reservations of one namespace at a time: read, decide, write if nobody wrote between.
    Subclasses say where the record lives (`_read`, `_write`)."""

    def __init__(
        self,
        pods: PodIndex,
        window: float = 10.0,
        clock: Callable[[], float] = time.time,
        standings: Any = None,
    ) -> None:
        self.pods = pods
        self.window = window
        self.clock = clock
        #: callers.SourceStandings: reservations of a suspect source count against it only
        self.standings = standings
        self.attempts = 8
        self.conflicts = 0  # writes another replica's write came before (for the metrics)
        self._locks: dict[str, asyncio.Lock] = {}
        self._last: dict[str, dict[str, Reservation]] = {}

    async def _read(self, namespace: str) -> tuple[dict[str, Reservation], Any]:
        raise NotImplementedError

    async def _write(
        self, namespace: str, reservations: dict[str, Reservation], version: Any
    ) -> bool:
        """Store `reservations` if the record is still at `version`; False when it was not."""
        raise NotImplementedError

    def _live(self, namespace: str, held: Mapping[str, Reservation]) -> dict[str, Reservation]:
        now = self.clock()
        # a little ahead of this clock is another replica's clock; far ahead is not believed
        return {k: r for k, r in held.items() if now - self.window < r.at <= now + self.window}

    def _counted(self, namespace: str, reservation: Reservation) -> bool:
        """Not yet counted from the watch: the pod was not seen since the reservation (or its
        claims are still due); and not made by a suspect source (callers.SourceStandings)."""
        if self.standings is not None and self.standings.suspect(reservation.source):
            return False
        if reservation.claims > 0:
            return True
        return not (
            reservation.pod and self.pods.seen_since(namespace, reservation.pod, reservation.at)
        )

    def _confirmed(self, namespace: str, r: Reservation) -> bool:
        """Whether the object a reservation was made for appeared after it: a review naming an
        object the watch already had (a forger's cover) confirms nothing."""
        if not r.pod:
            return False
        appeared = getattr(self.pods, "appeared_since", None)
        if appeared is None:
            return self.pods.seen_since(namespace, r.pod, r.at)
        return bool(appeared(namespace, r.pod, r.at - _CLOCK_SLACK))

    def _judge_ended(self, namespace: str, stored: Mapping[str, Reservation]) -> None:
        """Tell the standings how the reservations whose window is over ended (every one made
        by an unverified caller)."""
        if self.standings is None:
            return
        cutoff = self.clock() - self.window
        for key, r in stored.items():
            if r.source and r.at <= cutoff:
                confirmed = self._confirmed(namespace, r)
                self.standings.ended(r.source, f"{namespace}/{key}", r.at, confirmed)

    def _takes_over(
        self, namespace: str, live: Mapping[str, Reservation], reuse: str, user: str, source: str
    ) -> bool:
        """Whether a reinvocation may take reservation `reuse` over: one this webhook made for
        the same requester and caller, live, whose object is not in the watch, not taken over
        before. Anything else carrying that key (a copy of the annotation) is a new object."""
        r = live.get(reuse)
        return (
            r is not None
            and not r.again
            and r.user == user
            and r.source == source
            and not self.pods.seen_since(namespace, r.pod or reuse, r.at)
        )

    async def admit(
        self,
        namespace: str,
        key: str,
        pod: str,
        decide: Callable[[float], float],
        *,
        dry_run: bool = False,
        source: str = "",
        **more: Any,
    ) -> float:
        """`decide(pending)` with the GPU-equivalents admitted but not yet in the watch (other
        than reservation `key`'s: a retried create replaces its own), and reserve what it
        returns; a Refusal it raises goes through and nothing is reserved. A dry run reserves
        nothing (AdmissionReview request.dryRun: the object is not persisted). `source`: the
        caller's address where it is not verified (callers.SourceStandings); `more`: see
        `admit_keyed`."""
        amount, _ = await self.admit_keyed(
            namespace, key, pod, decide, dry_run=dry_run, source=source, **more
        )
        return amount

    async def admit_keyed(
        self,
        namespace: str,
        key: str,
        pod: str,
        decide: Callable[[float], float],
        *,
        dry_run: bool = False,
        source: str = "",
        user: str = "",
        reuse: str | None = None,
        claims: int | Callable[[], int] = 0,
        take_over: tuple[str, float] | None = None,
    ) -> tuple[float, str]:
        """`admit`, answering (amount, the key reserved under). `reuse`: the key an earlier
        call of this admission wrote (a reinvocation), taken over where `_takes_over` allows,
        else `key`. `claims`: claims from templates still to come for this pod (a callable is
        asked after `decide`). `take_over` (pod key, amount): a claim made for that pod takes
        its part of the pod's reservation over while the pod has claims due."""
        lock = self._locks.setdefault(namespace, asyncio.Lock())
        async with lock:  # this replica's admissions of a namespace do not race each other
            for _ in range(self.attempts):
                stored, version = await self._read(namespace)
                self._judge_ended(namespace, stored)
                live = self._live(namespace, stored)
                self._last[namespace] = live
                chosen = key
                if reuse and self._takes_over(namespace, live, reuse, user, source):
                    chosen = pod = reuse
                if take_over is not None:
                    owner_key, part = take_over
                    owner = live.get(owner_key)
                    if owner is not None and owner.claims > 0 and owner_key != chosen:
                        live[owner_key] = replace(
                            owner, gpu=max(owner.gpu - part, 0.0), claims=owner.claims - 1
                        )
                pending = sum(
                    r.gpu for k, r in live.items() if k != chosen and self._counted(namespace, r)
                )
                amount = decide(pending)
                if dry_run:
                    return amount, chosen
                # a retried review of the same pod replaces its reservation but keeps its
                # window: re-sending a review never holds the quota past it
                previous = live.get(chosen)
                at = previous.at if previous is not None else self.clock()
                again = chosen == reuse and previous is not None
                due = claims() if callable(claims) else claims
                live[chosen] = Reservation(pod, amount, at, source, user, again, due)
                if await self._write(namespace, live, version):
                    self._last[namespace] = live
                    return amount, chosen
                self.conflicts += 1
            raise Busy(f"{self.attempts} writes of the quota record of {namespace} lost a race")

    def total(self) -> float:
        """GPU-equivalents reserved, as last read (for the metrics)."""
        return sum(
            r.gpu
            for ns, held in self._last.items()
            for r in self._live(ns, held).values()
            if self._counted(ns, r)
        )


class LocalLedger(Ledger):
    """The reservations in this process: enough for one replica."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._held: dict[str, dict[str, Reservation]] = {}

    async def _read(self, namespace: str) -> tuple[dict[str, Reservation], Any]:
        return dict(self._held.get(namespace, {})), None

    async def _write(
        self, namespace: str, reservations: dict[str, Reservation], version: Any
    ) -> bool:
        self._held[namespace] = dict(reservations)
        return True


class Records(Protocol):
    """A key-value record per namespace with conditional writes (cluster.ConfigMapRecords)."""

    async def read(self, namespace: str) -> tuple[str | None, str | None]:
        """(text, resourceVersion); (None, None) when there is none yet."""
        ...

    async def write(self, namespace: str, text: str, version: str | None) -> bool:
        """Create (version None) or update at `version`; False on 409 Conflict."""
        ...


class SharedLedger(Ledger):
    """The reservations in an API object per namespace, shared by every replica."""

    def __init__(self, records: Records, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.records = records

    async def _read(self, namespace: str) -> tuple[dict[str, Reservation], Any]:
        text, version = await self.records.read(namespace)
        return decode(text), version

    async def _write(
        self, namespace: str, reservations: dict[str, Reservation], version: Any
    ) -> bool:
        return await self.records.write(namespace, encode(reservations), version)
