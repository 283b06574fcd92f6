"""Admission that holds under concurrency: one check-and-reserve at a time, and what in-flight
spawns hold until the cluster shows it.

Two spawns that pass their checks before either pod exists would both be admitted: the pod
watch, and so the capacity counts and the per-user usage read from it, only learn of a pod
after it is created and bound. So every admission runs under one asyncio lock, and a spawn that
passes records a `Hold` before the lock is released:

- on the spawner (the hub's own state, persisted with the server's state), for the quota of
  the user's other servers: `user_usage` adds up what each server holds or is starting;
- in `Admissions` (process-wide), for capacity: an in-flight hold counts against its pool's
  offers (`ReservedCapacity`) until the watch shows its pod bound to a node, or the spawn
  fails or stops.

One lock in one process is enough because one JupyterHub process admits every spawn (the hub
is a single process; z2jh runs one hub replica). Nothing here does I/O.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar, TypeVar

from ..backends import LABEL_GPU, LABEL_POOL, plan_slice
from ..backends.fit import OfferCapacity
from ..capacity.snapshot import SERVERNAME_ANNOTATION, USERNAME_ANNOTATION
from ..k8s.index import ASSIGNED_NODE_ANNOTATION
from ..k8s.objects import annotations, bound_node, is_active, meta
from ..model.access import EPSILON
from ..model.catalog import AccessRule, Catalog, Pool
from ..model.errors import OptionsError, SliceError
from ..model.slices import parse_slice
from .options import offer_for

__all__ = [
    "ROOM_TAG_KEY_ENV",
    "Admissions",
    "Hold",
    "ReservedCapacity",
    "Usage",
    "check_usage_known",
    "claimed_capacity",
    "counted",
    "hold_for",
    "options_gpu_equivalent",
    "pod_gpu_equivalent",
    "server_holdings",
    "server_tag",
    "units_blocked",
    "unplaced_holds",
    "user_usage",
    "watch_usable",
]

#: the key under which a server's hold is kept in its JupyterHub state (Spawner.get_state)
STATE_KEY = "fracspawner_hold"
#: design.md CONTRACT: what a GPU pod counts for in quotas
GPU_EQUIVALENT_ANNOTATION = "fracspawner.io/gpu-equivalent"
#: the note of a pool's offers while a server pod there holds devices of an unknown size
UNKNOWN_CLAIM_NOTE = "a server's GPU claim is not known yet"


@dataclass(frozen=True)
class Hold:
    """What one server holds or is starting: its slice, in the terms quota and capacity use."""

    user: str
    server: str
    pool: str | None
    spec: str  # the offer, e.g. "0.25", "mig-1g.10gb"; "none" for CPU-only
    gpu_equivalent: float
    #: extended resources its plan asks for (offers sharing none use other devices)
    resources: frozenset[str] = frozenset()
    node_selector: tuple[tuple[str, str], ...] = ()
    #: (namespace, pod name) of the pod this spawn creates
    pod: tuple[str, str] | None = None
    #: uid of a pod of the same name already cached when the hold was made (an old one
    #: terminating): only a pod with another uid settles the hold
    stale_uid: str | None = None

    def to_state(self) -> dict[str, Any]:
        """The part worth persisting: what the server holds, for quotas after a hub restart."""
        return {"pool": self.pool, "gpu": self.spec, "gpu_equivalent": self.gpu_equivalent}

    @classmethod
    def from_state(cls, user: str, server: str, state: Any) -> Hold | None:
        """A hold from persisted state, or None when the state does not carry a valid one."""
        if not isinstance(state, Mapping):
            return None
        value = state.get("gpu_equivalent")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        if not math.isfinite(value) or value < 0:
            return None
        pool = state.get("pool") if isinstance(state.get("pool"), str) else None
        spec = state.get("gpu") if isinstance(state.get("gpu"), str) else "unknown"
        return cls(user, server, pool, spec, float(value))


def _plan_keys(plan: Any) -> tuple[frozenset[str], tuple[tuple[str, str], ...]]:
    resources = frozenset(k for k in plan.limits if "/" in k)
    selector = tuple(sorted((str(k), str(v)) for k, v in plan.node_selector.items()))
    return resources, selector


def hold_for(
    choice: Any,
    *,
    user: str,
    server: str,
    pod: tuple[str, str] | None = None,
    stale_uid: str | None = None,
) -> Hold:
    """The hold a validated `Choice` makes (CPU-only choices hold 0 GPU)."""
    return _plan_hold(
        choice.plan,
        pool=choice.pool.name if choice.pool is not None else None,
        spec=str(choice.offer or choice.slice),
        user=user,
        server=server,
        pod=pod,
        stale_uid=stale_uid,
    )


def _plan_hold(
    plan: Any,
    *,
    pool: str | None,
    spec: str,
    user: str,
    server: str,
    pod: tuple[str, str] | None = None,
    stale_uid: str | None = None,
) -> Hold:
    """What a pod of `plan` (backends.plan_slice) holds, for a server of `user`."""
    resources, selector = _plan_keys(plan)
    return Hold(
        user=user,
        server=server,
        pool=pool,
        spec=spec,
        gpu_equivalent=float(plan.gpu_equivalent),
        resources=resources,
        node_selector=selector,
        pod=pod,
        stale_uid=stale_uid,
    )


# --------------------------------------------------------------------------- quota
@dataclass(frozen=True)
class Usage:
    """GPU-equivalents a user's other servers hold; `unknown` names servers nobody can tell."""

    gpu: float
    unknown: tuple[str, ...] = ()

    @property
    def known(self) -> bool:
        return not self.unknown


def user_usage(
    hub: Mapping[str, float | None],
    watch: Mapping[str, float] | None = None,
    watch_total: float = 0.0,
) -> Usage:
    """What a user's other servers hold, from the hub's own state first.

    `hub`: each other server of the user that is active or starting -> the GPU-equivalents its
    hold says (None: active, but nothing recorded). `watch`: when the pod watch is usable, each
    of those servers' pod -> its `fracspawner.io/gpu-equivalent`; `watch_total`: everything the
    watch sees of this user except the spawning server's own pod (pods of deleted servers count
    too: they still hold GPUs). A server counts the larger of both; what neither source knows
    is unknown, never zero.
    """
    total = 0.0
    unknown = []
    for server, held in sorted(hub.items()):
        seen = watch.get(server) if watch is not None else None
        if held is None and watch is None:
            unknown.append(server)
            continue
        total += max(held or 0.0, seen or 0.0)
    if watch is not None:
        attributed = sum(watch.get(s, 0.0) for s in hub)
        total += max(watch_total - attributed, 0.0)
    return Usage(total, tuple(unknown))


def options_gpu_equivalent(
    catalog: Catalog, options: Any, may_use: Iterable[Pool] | None = None
) -> float | None:
    """GPU-equivalents a server's `user_options` stand for under `catalog`, or None when they
    cannot tell: not a slice, a pool the catalog lacks or that does not offer it, or no pool
    ("any pool": one of `may_use`, the user's pools, else any) and pools that count the size
    differently (1/4 is 1/4 of an H100 but a MIG 2g.20gb on an A100)."""
    if not isinstance(options, Mapping):
        return None
    try:
        requested = parse_slice(options.get("gpu"), step=catalog.fraction_step)
    except SliceError:
        return None
    if requested.kind == "none":
        return 0.0
    name = options.get("pool")
    if name is not None and not isinstance(name, str):
        return None
    name = (name or "").strip()
    if name and name not in catalog.pools:
        return None
    if name:
        pools = [catalog.pools[name]]
    else:
        pools = list(catalog.pools.values() if may_use is None else may_use)
    amounts = set()
    for pool in pools:
        offer = offer_for(pool, requested)
        if offer is not None:
            amounts.add(round(plan_slice(offer, pool, None).gpu_equivalent, 9))
        elif name:
            return None
    return amounts.pop() if len(amounts) == 1 else None


def server_holdings(
    catalog: Catalog, servers: Mapping[str, Any], may_use: Iterable[Pool] | None = None
) -> dict[str, float | None]:
    """`user_usage`'s `hub` from the hub REST API's server models (a user model's `servers`):
    each server that is not stopped -> what its `user_options` stand for (None: unknown)."""
    may_use = None if may_use is None else list(may_use)
    out: dict[str, float | None] = {}
    for name, server in servers.items():
        if not isinstance(server, Mapping):
            out[str(name)] = None
        elif not server.get("stopped"):
            out[str(name)] = options_gpu_equivalent(catalog, server.get("user_options"), may_use)
    return out


def watch_usable(capacity: Any) -> bool:
    """Whether the pod watch can be believed about usage: it has listed the cluster (a
    watch that never started, or was forbidden, has seen no node) and is not marked stale."""
    return (
        capacity is not None
        and getattr(capacity, "nodes_seen", 0) > 0
        and not getattr(capacity, "stale", False)
    )


def _server_words(names: Iterable[str]) -> str:
    return ", ".join("your default server" if not n else f"server {n[:40]!r}" for n in names)


def check_usage_known(choice: Any, rule: AccessRule, usage: Usage, *, admin: bool) -> None:
    """Refuse a GPU spawn whose quota cannot be checked: unknown usage is never unlimited."""
    if admin or rule.max_gpu is None or usage.known or choice.plan.gpu_equivalent <= 0:
        return
    raise OptionsError(
        "Quota: fracspawner cannot tell what GPU "
        f"{_server_words(usage.unknown)} holds right now (started without a record of its "
        "slice, and the cluster's pod watch is unavailable), so your GPU quota cannot be "
        "checked. Stop that server, start this one without a GPU, or try again later."
    )


#: where the hub (FracSpawner.room_tag_key) and the culler (Culler.room_tag_key) read the
#: shared key of the room answer's server tags by default (the chart's Secret sets it)
ROOM_TAG_KEY_ENV = "FRACSPAWNER_ROOM_TAG_KEY"


def server_tag(user: str, server: str, key: str = "") -> str:
    """A server's id in the culler's room answer (culler/room.py, hub/room.py): the hub finds
    its own spawns by it. Any server's token may read the answer, so with a `key` (shared by
    hub and culler) the tag is HMAC-SHA256(key, "user/server"): without the key nobody can
    tell whose server a tag is. Without one it is a plain SHA-256, which anyone who can guess
    a username can compute (the culler warns at start)."""
    text = f"{user}/{server}".encode()
    if key:
        return hmac.new(key.encode(), text, hashlib.sha256).hexdigest()[:16]
    return hashlib.sha256(text).hexdigest()[:16]


# --------------------------------------------------------------------------- capacity
def units_blocked(
    hold: Hold,
    spec: str,
    resources: frozenset[str],
    selector: Mapping[str, str],
    gpu_equivalent: float,
) -> int:
    """How many units of one offer (of the hold's pool) an in-flight hold may take.

    The same offer: one. Another offer drawing on the same devices (a shared extended
    resource, or a scheduler that books by annotation: no countable resource on either side)
    on nodes both may use: its GPU-equivalents in units of the other offer, rounded up (a 1/4
    in flight may take a whole GPU's last free quarter). Offers on other resources (MIG
    profiles of the mixed strategy) or on other nodes: none.
    """
    if spec == hold.spec:
        return 1
    if hold.resources and resources and not hold.resources & resources:
        return 0
    if any(selector.get(k, v) != v for k, v in hold.node_selector):
        return 0
    if gpu_equivalent <= 0:
        return 0
    return max(math.ceil(hold.gpu_equivalent / gpu_equivalent - EPSILON), 0)


class ReservedCapacity:
    """A capacity snapshot with in-flight holds taken off the free counts.

    Reads like `fracspawner.capacity.Capacity` (`get(pool, spec)`); other attributes pass
    through to the snapshot.
    """

    def __init__(self, capacity: Any, catalog: Catalog, holds: Iterable[Hold]) -> None:
        self._capacity = capacity
        self._catalog = catalog
        self._holds: dict[str, list[Hold]] = {}
        #: pools with a hold of unknown size (`unplaced_holds`): none of their offers is free
        self._unknown: set[str] = set()
        for hold in holds:
            if hold.pool is not None and math.isinf(hold.gpu_equivalent):
                self._unknown.add(hold.pool)
            elif hold.pool is not None and hold.gpu_equivalent > 0:
                self._holds.setdefault(hold.pool, []).append(hold)
        self._offers: dict[tuple[str, str], tuple[Any, ...] | None] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._capacity, name)

    def _offer(self, pool_name: str, spec: str) -> tuple[Any, ...] | None:
        key = (pool_name, spec)
        if key not in self._offers:
            found = None
            pool = self._catalog.pools.get(pool_name)
            for offer in getattr(pool, "offers", ()):
                if str(offer) == spec:
                    try:
                        plan = plan_slice(offer, pool, None)
                    except Exception:  # an offer that cannot plan has unknown counts anyway
                        break
                    resources, selector = _plan_keys(plan)
                    found = (resources, dict(selector), plan.gpu_equivalent)
                    break
            self._offers[key] = found
        return self._offers[key]

    def in_flight(self, pool: str, spec: str) -> int:
        """Units of this offer that spawns admitted but not yet counted may take."""
        holds = self._holds.get(pool)
        offer = self._offer(pool, spec) if holds else None
        if not holds or offer is None:
            return 0
        return sum(units_blocked(h, spec, *offer) for h in holds)

    def get(self, pool: str, spec: str) -> OfferCapacity:
        counts = self._capacity.get(pool, spec)
        if counts.free is None:
            return counts
        held = getattr(counts, "held", None)
        if pool in self._unknown:  # unknown is never free: refused, or waits in line
            return OfferCapacity(0, counts.total, UNKNOWN_CLAIM_NOTE, held)
        taken = self.in_flight(pool, spec)
        if not taken:
            return counts
        note = f"{taken} being started" if not counts.note else f"{counts.note}; {taken} starting"
        return OfferCapacity(max(counts.free - taken, 0), counts.total, note, held)


def _pod_facts(pod: Any) -> tuple[str, bool, Mapping[str, Any]]:
    """(uid, placed on a node, annotations) of a cached pod: an API dict, or a slim record
    of the capacity watch (attributes uid, node, assumed, annotations; active pods only)."""
    if isinstance(pod, Mapping):
        placed = is_active(pod) and bool(
            bound_node(pod) or annotations(pod).get(ASSIGNED_NODE_ANNOTATION)
        )
        return str(meta(pod).get("uid") or ""), placed, annotations(pod)
    placed = bool(getattr(pod, "node", None) or getattr(pod, "assumed", None))
    return str(getattr(pod, "uid", "") or ""), placed, getattr(pod, "annotations", None) or {}


def counted(pod: Any, stale_uid: str | None = None) -> bool:
    """Whether the capacity counts already include this pod: bound to a node (or booked on
    one by HAMi's scheduler before binding), not finished, and not the old pod of that name."""
    if not pod:
        return False
    uid, placed, _ = _pod_facts(pod)
    return placed and not (stale_uid is not None and uid == stale_uid)


def pod_uid(pod: Any) -> str | None:
    return _pod_facts(pod)[0] or None if pod else None


def pod_gpu_equivalent(pod: Any) -> float:
    """The `fracspawner.io/gpu-equivalent` a cached pod carries (0 when absent or malformed:
    the watch's own usage totals decide about those)."""
    if not pod:
        return 0.0
    raw = _pod_facts(pod)[2].get(GPU_EQUIVALENT_ANNOTATION)
    try:
        value = float(raw)
    except (TypeError, ValueError):
        return 0.0
    return value if math.isfinite(value) and value > 0 else 0.0


T = TypeVar("T")


def loop_shared(registry: dict[Any, T], make: Callable[[], T]) -> T:
    """The one `make()` of the running event loop, kept in `registry` (asyncio locks and
    queues belong to one loop); entries of closed loops are dropped (tests run many)."""
    try:
        loop: Any = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    if loop not in registry:
        for old in [k for k in registry if k is not None and k.is_closed()]:
            del registry[old]
        registry[loop] = make()
    return registry[loop]


#: per catalog: (pool label, gpu label) -> what a pod planned for that offer holds
_LABELLED: dict[int, tuple[Catalog, dict[tuple[str, str], Hold]]] = {}


def _labelled_offers(catalog: Catalog) -> dict[tuple[str, str], Hold]:
    """(pool label, gpu label) of each offer's pods (plan_slice sets them: the pool's name,
    the offer's label) -> what such a pod holds, for no user yet."""
    cached = _LABELLED.get(id(catalog))
    if cached is not None and cached[0] is catalog:
        return cached[1]
    table: dict[tuple[str, str], Hold] = {}
    for pool in catalog.pools.values():
        for offer in pool.offers:
            try:
                plan = plan_slice(offer, pool, None)
            except Exception:  # an offer that cannot plan has unknown counts anyway
                continue
            key = (pool.name, offer.label)
            hold = _plan_hold(plan, pool=pool.name, spec=str(offer), user="", server="")
            table.setdefault(key, hold)
    if len(_LABELLED) > 64:  # catalogs of tests and reloads: start over
        _LABELLED.clear()
    _LABELLED[id(catalog)] = (catalog, table)
    return table


def unplaced_holds(
    catalog: Catalog, watcher: Any, *, besides: Iterable[tuple[str, str] | None] = ()
) -> list[Hold]:
    """Holds for a hub's server pods the capacity watch shows made but not in its counts
    yet (`watcher.unbound_pods()`: Pending, not bound nor booked, or a DRA pod on a node whose
    claim's allocation the claim watch has not shown; none from a watcher without it), other
    than the pods of `besides` (those an in-flight hold already stands for, and the spawning
    server's own).

    Such a pod claims its slot as an in-flight spawn does: the scheduler gives it the next one
    that frees. `Admissions` lives in the hub's memory, so after a hub restart these holds are
    how a spawn admitted before it, whose pod is still Pending, keeps its claim. A pod counts
    by its labels (the catalog offer its plan was made for) and only with kubespawner's user
    annotation: other pods (Kubeflow's, a job's) are never counted by the hub's admissions.
    """
    pods = getattr(watcher, "unbound_pods", None)
    if pods is None:
        return []
    skip = {p for p in besides if p is not None}
    table: dict[tuple[str, str], Hold] | None = None
    out = []
    for record in pods():
        pod = (record.namespace, record.name)
        user = record.annotations.get(USERNAME_ANNOTATION)
        if not user or pod in skip:
            continue
        labels = record.labels
        if LABEL_POOL not in labels:
            continue
        table = _labelled_offers(catalog) if table is None else table
        found = table.get((labels[LABEL_POOL], labels.get(LABEL_GPU, "")))
        if found is None and (record.node or record.assumed):
            # a DRA pod on a node holds what its claim was allocated, of a size no offer
            # names (one taken out of the catalog): unknown (ReservedCapacity), never none
            found = Hold("", "", labels[LABEL_POOL], "", math.inf)
        if found is None:
            continue
        server = record.annotations.get(SERVERNAME_ANNOTATION) or ""
        out.append(replace(found, user=user, server=server, pod=pod))
    return out


def claimed_capacity(catalog: Catalog, watcher: Any, capacity: Any) -> Any:
    """`capacity` with the slots of the hub's server pods that are Pending on no node taken
    off (`unplaced_holds`, kubespawner's username annotation and a catalog offer's labels):
    the claims the hub's admission and form count (`FracSpawner._unplaced_holds`), for the
    processes without the hub's in-flight admissions: the fracspawner service's live offers
    (hub/service.py) and its admin page and gauges (hub/admin.py). A pod once bound or booked
    on a node is in the counts themselves and leaves the watch's unbound pods; other pods (no
    username annotation) are never claims. The hub also leaves out the spawning server's own
    old pod, which the service cannot tell apart (it is not told which server the picker is
    for): it may read one fewer free for that server alone."""
    if capacity is None:
        return capacity
    holds = unplaced_holds(catalog, watcher)
    return ReservedCapacity(capacity, catalog, holds) if holds else capacity


class Admissions:
    """Spawns this hub process has admitted whose pods the capacity counts do not show yet."""

    _shared: ClassVar[dict[Any, Admissions]] = {}

    def __init__(self) -> None:
        #: held around check + reserve; one hub process admits every spawn
        self.lock = asyncio.Lock()
        self._in_flight: dict[tuple[str, str], Hold] = {}

    @classmethod
    def shared(cls) -> Admissions:
        """The one registry of the running event loop (an asyncio.Lock belongs to one loop)."""
        return loop_shared(cls._shared, cls)

    def reserve(self, hold: Hold) -> None:
        """Record (or replace) the in-flight hold of one server; CPU-only holds are not kept."""
        key = (hold.user, hold.server)
        if hold.gpu_equivalent > 0 and hold.pool is not None:
            self._in_flight[key] = hold
        else:
            self._in_flight.pop(key, None)

    def release(self, user: str, server: str) -> None:
        self._in_flight.pop((user, server), None)

    def settle(self, pod_of: Callable[[str, str], Any]) -> None:
        """Drop holds whose pod the capacity counts now include (`pod_of(namespace, name)`
        reads the watch's cache)."""
        for key, hold in list(self._in_flight.items()):
            if hold.pod is not None and counted(pod_of(*hold.pod), hold.stale_uid):
                del self._in_flight[key]

    def in_flight(self, *, besides: tuple[str, str] | None = None) -> list[Hold]:
        return [h for k, h in self._in_flight.items() if k != besides]

    def held_by(self, user: str, server: str) -> Hold | None:
        return self._in_flight.get((user, server))

    def moved(self, user: str, server: str, pod: tuple[str, str]) -> None:
        """The spawn's pod key changed after admission (a profile override of the namespace)."""
        hold = self._in_flight.get((user, server))
        if hold is not None and hold.pod != pod:
            self._in_flight[(user, server)] = replace(hold, pod=pod, stale_uid=None)
