"""FracSpawner: KubeSpawner plus a GPU-slice choice mapped onto the cluster's sharing technology.

Every spawn starts from a CLEAN baseline: the configured trait values are snapshotted when the
spawner object is built and restored when a spawn begins (JupyterHub's `clear_state()`, before
the authenticator, `auth_state_hook`, group overrides and `pre_spawn_hook` run) and when a
server stops, so nothing from an earlier spawn (a GPU limit, a node selector, a toleration)
leaks into the next one (kubespawner#546, #691, jupyterhub#3095) while what hooks set for THIS
spawn stays. Then the choice is admitted (quota and capacity, one at a time: see
`fracspawner.choice.admission`), kubespawner's `profile_list` overrides (if any) are applied,
then the GPU slice's PodPlan on top.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
import time
from collections.abc import Mapping
from functools import partial
from typing import Any

from jupyterhub.utils import exponential_backoff, maybe_future
from kubespawner import KubeSpawner
from tornado import web
from traitlets import Bool, Dict, Enum, Float, Integer, Unicode, default

from ..backends import is_reserved_env, load_catalog, safe_env, scheduler_for
from ..backends.nvidia import shared_resource
from ..backends.podspec import NO_DEVICES_ENV, container_name, hide_devices, is_privileged
from ..choice.admission import (
    ROOM_TAG_KEY_ENV,
    STATE_KEY,
    Admissions,
    Hold,
    ReservedCapacity,
    Usage,
    check_usage_known,
    hold_for,
    pod_gpu_equivalent,
    pod_uid,
    server_tag,
    unplaced_holds,
    user_usage,
    watch_usable,
)
from ..choice.notebook_env import notebook_env
from ..choice.offers import build_offer_model
from ..choice.options import (
    OPTION_KEYS,
    Choice,
    OptionsError,
    describe_offer,
    expect_name,
    resolve_choice,
)
from ..k8s.objects import created_at
from ..model.catalog import AccessRule, Catalog, CatalogError
from ..model.errors import echo
from ..model.slices import slice_memory_mib
from ..model.units import gpu_amount
from .form import render_form
from .progress import (
    gpus_unoffered,
    human_step,
    is_autoscaler_event,
    node_autoscaling,
    node_may_mend,
    pod_events,
    pod_failure,
    progress_event,
    scheduler_absent,
    scheduling_trouble,
    scheduling_wait,
)
from .reflectors import ResumingEventReflector, ResumingPodReflector
from .refusal import capacity_refusal, gave_up, install_log_filter, refused, start_failed
from .room import (
    OVERTAKE_SECONDS,
    POLL_SECONDS,
    RoomLine,
    counted_tags,
    fetch_room,
    gpus_in_pool,
    verdict,
)
from .waiting import WaitingSpawns, line_full_words, waiting_limit

#: a trait value traitlets has not stored (a dynamic default not computed yet)
_MISSING = object()
#: values copy.deepcopy would return as they are
_ATOMIC = frozenset({str, int, float, bool, type(None), bytes})

# Traits the baseline snapshot never restores: they are state, not configuration.
_NOT_BASELINE = frozenset(
    {"config", "parent", "log", "user_options", "options_form", "options_from_form"}
)
#: where get_state keeps the namespace this server's spawns start from
_BASELINE_NAMESPACE_KEY = "fracspawner_namespace"
#: user name -> (named server, when) of the last refused form spawn (`_refused_named_server`)
_FORM_REFUSALS: dict[str, tuple[str, float]] = {}
#: how long after a refusal the default server's form stands in for the refused server's
_REFUSAL_FORM_S = 15.0
#: how long a pod may wait for its scheduler's first look before the user is told it has none,
#: and for a node autoscaler's first word on a pod no node takes (it looks every 10 s:
#: cluster-autoscaler's --scan-interval) before the user is told none is added
SCHEDULER_GRACE_S = 60.0
#: how long after a node became Ready its GPUs may still be missing from Kubernetes: the GPU
#: driver installs and the device plugin registers then (GKE's driver installer, the GPU
#: Operator's driver container: minutes), before a pool none of whose nodes offers one is
#: said to stay so
NODE_GPU_GRACE_S = 600.0
#: backends whose offers are MIG profiles: a profile the GPUs' layout lacks is not offered
_MIG_BACKENDS = frozenset({"mig-mixed", "mig-single", "gke-mig"})
#: backends whose device plugin may publish its resource under another name (renameByDefault)
_RENAMING_BACKENDS = frozenset({"timeslicing", "mps"})
#: under admission "refuse": how much later than `_start`'s own start_timeout JupyterHub's
#: fires, so the spawn ends with fracspawner's words, not JupyterHub's bare "Timeout"
_TIMEOUT_MARGIN_S = 10

_catalog_cache: dict[Any, Catalog] = {}
#: per spawner class: its configurable traits, less those the baseline leaves out
_CONFIG_TRAITS: dict[type, tuple[tuple[str, Any], ...]] = {}
#: per spawner class: the plain class defaults of traits without a default generator
_STATIC_DEFAULTS: dict[type, dict[str, Any]] = {}


def _config_traits(cls: type) -> tuple[tuple[str, Any], ...]:
    """(name, trait) of the class's configurable traits (traitlets' `traits(config=True)`
    walks the whole class each time; the set is fixed per class)."""
    found = _CONFIG_TRAITS.get(cls)
    if found is None:
        found = tuple(
            (name, trait)
            for name, trait in cls.class_traits(config=True).items()
            if name not in _NOT_BASELINE
        )
        _CONFIG_TRAITS[cls] = found
    return found


def _is_plain(value: Any) -> bool:
    """An atomic value, or a dict/list of atomic values (what `_fresh_copy` copies flat)."""
    kind = type(value)
    if kind in _ATOMIC:
        return True
    if kind is dict:
        return all(type(k) in _ATOMIC and type(v) in _ATOMIC for k, v in value.items())
    if kind is list:
        return all(type(v) in _ATOMIC for v in value)
    return False


def _static_defaults(cls: type, unset: set[str], computed: Mapping[str, Any]) -> dict[str, Any]:
    """The class's defaults that need no spawner to compute: traits with no default generator
    (traitlets' @default, `_<name>_default`) whose plain default is what the first spawner,
    which left them unset, computed for them."""
    generators = getattr(cls, "_trait_default_generators", {})
    out = {}
    for name, trait in _config_traits(cls):
        if name not in unset or name not in computed or name in generators:
            continue
        if callable(getattr(cls, f"_{name}_default", None)):
            continue
        default = trait.default()
        if _is_plain(default) and type(default) is type(computed[name]):
            if default == computed[name]:
                out[name] = _fresh_copy(default)
    return out


def cached_catalog(source: Any) -> Catalog:
    """Load (and cache) a catalog from a path or a dict; CatalogError names what is wrong."""
    key = source if isinstance(source, str) else repr(source)
    if key not in _catalog_cache:
        _catalog_cache[key] = load_catalog(source)
    return _catalog_cache[key]


class FracSpawner(KubeSpawner):
    """A KubeSpawner whose users choose a GPU slice: a fraction, a memory size or a MIG profile."""

    catalog = Dict(
        config=True,
        help="""The fracspawner catalog (pools, offers, images, access, idle) as a dict.

        The same structure as the catalog YAML file; see the catalog reference in the docs.
        Takes precedence over `catalog_file`.
        """,
    )
    catalog_file = Unicode(
        "",
        config=True,
        help="""Path to the catalog YAML file (pools, offers, images, access, idle).

        Also read from the FRACSPAWNER_CATALOG environment variable when unset.
        """,
    )
    admission = Enum(
        ["refuse", "wait"],
        default_value="refuse",
        config=True,
        help="""What to do when the chosen slice has no free capacity right now.

        "refuse" answers at once with what is free instead; "wait" creates the pod and lets it
        stay Pending until capacity frees, with progress messages saying what it waits for.
        """,
    )
    queue_timeout = Integer(
        1800,
        min=1,
        config=True,
        help="""Under admission "wait": how long (seconds) a spawn may wait in line for a slot.

        Time in line does not count against `start_timeout`: JupyterHub's limit for the spawn
        becomes queue_timeout + start_timeout, and `start_timeout` still bounds the rest (the
        time before the pod is created and after it is scheduled). A spawn still in line after
        queue_timeout fails with "No <size> freed within <N> minutes; your place is given up."
        """,
    )
    max_waiting = Integer(
        None,
        allow_none=True,
        min=0,
        config=True,
        help="""Under admission "wait": how many spawns of this hub may wait in line at once
        (for a slot, or for room on an over-committed pool).

        JupyterHub counts a spawn in line as pending, and once `JupyterHub.concurrent_spawn_limit`
        spawns are pending it refuses every spawn, CPU-only ones too ("Too many users trying
        to log in right now"; z2jh: hub.concurrentSpawnLimit, 64). None (default): half the
        hub's concurrent_spawn_limit (no bound where that is 0), so the other half stays for
        spawns that start now. Beyond it, a spawn that would wait is refused at once with what
        is free now, as under admission "refuse". 0: nobody waits.
        """,
    )
    room_overtake_seconds = Float(
        OVERTAKE_SECONDS,
        min=0,
        config=True,
        help="""On an over-committed pool: how long (seconds) a spawn waiting in line for
        room that does not fit may be passed by later, smaller ones that do.

        The line is first come, first served with backfill (as Kueue's BestEffortFIFO): a
        half-GPU slice that does not fit holds up no eighth behind it that does, until it has
        waited this long; from then on nobody passes it, so it is not starved by small ones.
        0: strictly first come, first served.
        """,
    )
    admin_override = Bool(
        True,
        config=True,
        help="""Whether JupyterHub admins may take any pool and ignore quotas.""",
    )
    culler_url = Unicode(
        "",
        config=True,
        help="""The fracspawner culler's URL as GPU notebooks reach it.

        e.g. http://hub:10101/services/fracspawner-culler/ (a hub-managed culler service) or
        http://fracspawner-culler:10101/. Put in each GPU pod's FRACSPAWNER_CULLER_URL: the
        notebook extension pushes its GPU report there with the server's own token (the
        culler never calls into servers). Empty: servers report to no one.
        """,
    )
    room_tag_key = Unicode(
        config=True,
        help="""The key of the server tags in the culler's room answer: the culler's
        Culler.room_tag_key.

        Any server's token may read the answer (the hub asks with the spawning server's own),
        so with a key each server is tagged HMAC-SHA256(key, "user/server") and nobody can
        tell whose server a tag is; without one, a plain SHA-256 that anyone who can guess a
        username can compute. The hub finds the spawns it admitted in the answer by these
        tags: with a key other than the culler's it finds none and counts them on top of the
        culler's figures until they stop (spawns wait for room that is there; the log says
        so once). Default: $FRACSPAWNER_ROOM_TAG_KEY (the chart's Secret: docs/install.md).
        """,
    )
    culler_room_url = Unicode(
        "",
        config=True,
        help="""Where the hub asks the culler for room on over-committed pools.

        Empty: `culler_url` + "api/room". Before a new server's pod on a pool with
        `overcommit` > 1 is made, the hub asks what present users' kernels hold on its GPUs
        (with the spawning server's own token) and, where its slice does not fit beside them,
        the spawn waits in line under admission "wait" (refused under "refuse") with the
        reason. No culler, or no answer: admitted as before (the log says so).
        """,
    )
    live_capacity = Bool(
        True,
        config=True,
        help="""Watch nodes and pods to show free/total counts and refuse full pools.

        Needs cluster-scoped get/list/watch on nodes and pods for the hub's service account
        (and list/watch on resource.k8s.io resourceslices and resourceclaims with DRA pools).
        When False, counts show as unknown and no capacity check is made: a full pool's pod
        is created and stays Pending. Quotas still hold (they count the user's servers from
        the hub's own state).
        """,
    )

    # ---------------------------------------------------------------- set-up
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._baseline = self._snapshot_config()
        # refused spawns: one INFO line, not ERROR + traceback (hub/refusal.py)
        install_log_filter()
        if isinstance(self.log, logging.Logger):
            install_log_filter(self.log)
        self.choice: Choice | None = None
        #: what this server holds or is starting (made at admission, kept in JupyterHub's
        #: state); the quota of the user's other servers counts it
        self.hold: Hold | None = None
        #: this spawn's DRA claims (the GPU container's resources.claims) and the templates
        #: they name; emptied by clear_state like every trait (nothing leaks to the next spawn)
        self._container_claims: tuple[Mapping[str, Any], ...] = ()
        self._claim_templates: tuple[Mapping[str, Any], ...] = ()
        #: why this spawn waits for room on an over-committed GPU (hub/room.py); None: not
        self._room_reason: str | None = None
        self._room_checked = False  # this spawn's room check is done (its pod may be made)
        #: the env this spawn's plan and notebook put in `environment` (not templates)
        self._own_env: Mapping[str, str] = {}

    def _snapshot_config(self) -> dict[str, Any]:
        """The configured value of every configurable trait, as this spawner starts.

        A trait still unset here has its class's default. Where that default is a plain value
        (no default generator, atomic or a flat container: `_static_defaults`), it is not
        computed for each spawner: `_restore_baseline` compares against the class's copy.
        Computing the ~150 defaults and copying them was most of a spawner's creation cost,
        and a hub creates one per user (a storm of new users creates one per spawn).
        """
        cls = type(self)
        static = _STATIC_DEFAULTS.get(cls)
        store = self.__dict__.get("_trait_values") or {}
        unset = {name for name, _ in _config_traits(cls) if name not in store}
        values = {}
        for name, trait in _config_traits(cls):
            if name == "namespace" and self.enable_user_namespaces:
                continue
            if static is not None and name in static and name in unset:
                continue
            values[name] = _fresh_copy(trait.get(self))
        if static is None:  # the first spawner of its class: learn its plain defaults
            _STATIC_DEFAULTS[cls] = _static_defaults(cls, unset, values)
        return values

    def _restore_baseline(self) -> None:
        """Reset every configurable trait to its configured value (the kubespawner#546 fix).

        Every trait is compared on every spawn (an in-place change by a hook, which traitlets
        does not notify, is found too), but read from traitlets' value store: the ~120
        descriptor reads were most of this. Only traits that differ are set, to a copy. A
        trait never computed since the snapshot still holds its default: nothing to compare.
        """
        values = self.__dict__.get("_trait_values") or {}
        baseline = self._baseline
        for name, value in baseline.items():
            current = values.get(name, _MISSING)
            if current is _MISSING:  # not computed yet (or another traitlets): the descriptor
                current = getattr(self, name)
            if current is not value and current != value:
                setattr(self, name, _fresh_copy(value))
        for name, value in _STATIC_DEFAULTS.get(type(self), {}).items():
            if name in baseline:
                continue
            current = values.get(name, _MISSING)
            if current is _MISSING:
                continue  # never computed or set: still the class's default
            if current is not value and current != value:
                setattr(self, name, _fresh_copy(value))

    def clear_state(self) -> None:
        """Back to the configured baseline, holding nothing.

        JupyterHub calls this when a spawn begins, right after setting user_options and
        BEFORE the authenticator's pre_spawn_start, auth_state_hook, group overrides and
        pre_spawn_hook (jupyterhub/user.py `User.spawn`), and again when a server has stopped
        or failed to start (`User.stop`). So what those hooks set for this spawn reaches the
        pod, and nothing of an earlier spawn does. A namespace restored by `load_state` for a
        running server is kept until that server stops.
        """
        self._release_hold()
        self._restore_baseline()
        self._container_claims = self._claim_templates = ()
        self._own_env = {}
        super().clear_state()  # kubespawner re-derives pod_name/dns_name from the namespace

    def get_state(self) -> dict[str, Any]:
        state = super().get_state()
        if self.hold is not None:
            state[STATE_KEY] = self.hold.to_state()
        if "namespace" in self._baseline:
            # the namespace spawns go back to (kubespawner persists the current one, which a
            # profile may have overridden for a server still running)
            state[_BASELINE_NAMESPACE_KEY] = self._baseline["namespace"]
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        """kubespawner's state, and the slice a running server holds (quotas after a hub
        restart). A namespace from state stays, as kubespawner intends (the user's pods and
        PVCs live there, even after the configured namespace changed): it becomes the
        namespace later spawns of this server go back to."""
        super().load_state(state)
        state = state or {}
        held = Hold.from_state(self.user.name, self.name, state.get(STATE_KEY))
        if held is not None:
            self.hold = held
            if held.pool:  # the running server's pool, as the spawn wrote it back (above)
                self.user_options = {**(self.user_options or {}), "pool": held.pool}
        namespace = state.get(_BASELINE_NAMESPACE_KEY, state.get("namespace"))
        if "namespace" in self._baseline and isinstance(namespace, str) and namespace:
            self._baseline["namespace"] = namespace

    def _release_hold(self) -> None:
        self.hold = None
        self.choice = None
        Admissions.shared().release(self.user.name, self.name)
        RoomLine.shared().release((self.user.name, self.name))
        WaitingSpawns.shared().leave((self.user.name, self.name))

    def _waiting_limit(self) -> int | None:
        # the hub's own limit, from its tornado settings (jupyterhub/user.py User.settings)
        settings = getattr(self.user, "settings", None)
        hub = settings.get("concurrent_spawn_limit", 0) if isinstance(settings, Mapping) else 0
        return waiting_limit(self.max_waiting, int(hub or 0))

    def _take_place_in_line(self, choice: Choice, capacity: Any, usage: Usage) -> None:
        """Under admission "wait", a spawn for a size with no free slot takes a place in the
        hub's line (waiting.py), or is refused now, with what is free, when the line is full.
        Called under the admission lock, with no await between the count and the taking."""
        if self.admission != "wait" or choice.pool is None or capacity is None:
            return
        if getattr(capacity, "stale", False):
            return
        free = capacity.get(choice.pool.name, str(choice.offer or choice.slice)).free
        if free is None or free > 0:
            return
        waiting = WaitingSpawns.shared()
        if waiting.take((self.user.name, self.name), self._waiting_limit()):
            return
        full = line_full_words(len(waiting))
        try:  # the words of admission "refuse": what is taken, and what is free elsewhere
            self._resolve(capacity, usage, admission="refuse")
        except OptionsError as exc:
            raise OptionsError(f"{exc} Waiting is closed for now: {full}.") from None
        raise OptionsError(f"Waiting is closed for now: {full}.")

    def _line_full_now(self) -> str | None:
        """Under admission "wait": the words of a full line (max_waiting places taken, none by
        this server), for the form, whose full sizes would be refused at Start; else None."""
        if self.admission != "wait":
            return None
        waiting = WaitingSpawns.shared()
        limit = self._waiting_limit()
        if limit is None or len(waiting) < limit or (self.user.name, self.name) in waiting.keys:
            return None
        return line_full_words(len(waiting))

    @property
    def fracspawner_catalog(self) -> Catalog:
        source: Any = self.catalog or self.catalog_file or os.environ.get("FRACSPAWNER_CATALOG")
        if not source:
            raise CatalogError(
                "no catalog configured: set c.FracSpawner.catalog_file or c.FracSpawner.catalog"
            )
        # a spawn asks several times: the last answer while the source is unchanged (a dict
        # compared with a copy of itself, ~1 us, where cached_catalog's key repr()s it)
        memo = self.__dict__.get("_catalog_memo")
        if memo is not None and type(memo[0]) is type(source) and memo[0] == source:
            return memo[1]
        catalog = cached_catalog(source)
        self._catalog_memo = (copy.deepcopy(source), catalog)
        return catalog

    # ---------------------------------------------------------------- who may take what
    def _groups(self) -> list[str]:
        groups = getattr(self.user, "groups", None) or []
        try:
            return [getattr(g, "name", g) for g in groups]
        except TypeError:  # no list of groups (kubespawner's tests' Mock user): in none
            return []

    def _is_admin(self) -> bool:
        return bool(self.admin_override and getattr(self.user, "admin", False))

    def access_rule(self) -> AccessRule:
        return self.fracspawner_catalog.rule_for(self.user.name, self._groups())

    def _capacity_watcher(self) -> Any:
        if not self.live_capacity:
            return None
        from ..capacity.watch import CapacityWatcher

        return CapacityWatcher.shared(self.fracspawner_catalog)

    async def _capacity_and_usage(self) -> tuple[Any, Usage]:
        """Capacity (in-flight spawns taken off) and what this user's OTHER servers hold."""
        watcher = self._capacity_watcher()
        if watcher is not None:
            await watcher.start()
        return self._capacity_and_usage_now(watcher, Admissions.shared())

    def _capacity_and_usage_now(self, watcher: Any, admissions: Admissions) -> tuple[Any, Usage]:
        """The same from caches and the hub's own state only: no await, so it can sit inside
        the admission lock with the check and the reservation."""
        capacity = watcher.snapshot() if watcher is not None else None
        watch = self._watch_holdings(watcher, capacity)
        if watch is not None:
            admissions.settle(watcher.placement)
        usage = user_usage(self._hub_holdings(), *(watch or (None, 0.0)))
        if capacity is not None:
            own = (self.user.name, self.name)
            holds = admissions.in_flight(besides=own)
            capacity = ReservedCapacity(
                capacity,
                self.fracspawner_catalog,
                [*holds, *self._unplaced_holds(watcher, admissions)],
            )
        return capacity, usage

    def _unplaced_holds(self, watcher: Any, admissions: Admissions) -> list[Hold]:
        """The hub's server pods the watch shows Pending on no node, as claims on their slots
        where no in-flight hold of this process stands for them: after a hub restart,
        `Admissions` (memory) has forgotten the spawns whose pods are still Pending, and their
        slots would be given twice. Counted once: a pod an in-flight hold names is skipped,
        and so is this spawn's own (its old pod gives way to the new one). Capacity only:
        such a pod takes no place in the waiting line (only Unschedulable ones do, `_start`)."""
        besides = [h.pod for h in admissions.in_flight()]
        besides.append((self.namespace, self.pod_name))
        return unplaced_holds(self.fracspawner_catalog, watcher, besides=besides)

    def _user_servers(self) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
        """The user's spawner objects and server records by name (empty for the stand-in users
        of `fracspawner plan` and tests)."""
        spawners = getattr(self.user, "spawners", None)
        orm_spawners = getattr(getattr(self.user, "orm_user", None), "orm_spawners", None)
        return (
            spawners if isinstance(spawners, Mapping) else {},
            orm_spawners if isinstance(orm_spawners, Mapping) else {},
        )

    def _other_spawners(self) -> dict[str, Any]:
        """The user's other server names -> their spawner objects (None: not loaded)."""
        spawners, orm_spawners = self._user_servers()
        # dict.get: JupyterHub's spawner dict would otherwise build a spawner for the name
        get = dict.get if isinstance(spawners, dict) else type(spawners).get
        names = set(spawners) | set(orm_spawners)
        return {n: get(spawners, n) for n in names if n != self.name}

    def _hub_holdings(self) -> dict[str, float | None]:
        """What each of the user's other active servers holds or is starting, from the hub's
        own state: its spawner's hold (None: active, but nothing recorded)."""
        orm_spawners = self._user_servers()[1]
        out: dict[str, float | None] = {}
        for name, spawner in self._other_spawners().items():
            hold = getattr(spawner, "hold", None)
            # a hold counts while its server starts, runs or stops; not one a hub that died
            # mid-stop left in a stopped server's state
            active = spawner is not None and (spawner.active or spawner._start_pending)
            if hold is not None and active:
                out[name] = hold.gpu_equivalent
            elif spawner is not None:
                # a spawn not admitted yet waits for the admission lock and will count this one
                if spawner.active and spawner.pending != "spawn":
                    out[name] = None
            elif getattr(orm_spawners.get(name), "server", None) is not None:
                out[name] = None
        return out

    def _watch_holdings(self, watcher: Any, capacity: Any) -> tuple[dict[str, float], float] | None:
        """What the pod watch shows this user holding: per other server, and in all (minus
        this server's own old pod); None when there is no usable watch."""
        if watcher is None or not watch_usable(capacity):
            return None
        user = self.user.name
        by_server = {}
        for name, spawner in self._other_spawners().items():
            if spawner is None:
                continue
            pod = watcher.pod(spawner.namespace, spawner.pod_name)
            if pod is not None:
                by_server[name] = pod_gpu_equivalent(pod)
        total = watcher.usage_by_user().get(user, 0.0)
        own = watcher.pod(self.namespace, self.pod_name)
        if own is not None:  # this server's old pod does not count against its new spawn
            total -= pod_gpu_equivalent(own)
        return by_server, total

    def _own_keys(self) -> tuple[str, ...]:
        """The user_options keys FracSpawner reads: gpu, pool, and image when the catalog
        offers images (without, `image` is free for a profile option, as z2jh examples use)."""
        return OPTION_KEYS if self.fracspawner_catalog.images else ("gpu", "pool")

    def _profile_keys(self) -> tuple[str, ...]:
        """user_options keys kubespawner's profile_list accepts (when one is configured).

        A profile option named like one of FracSpawner's own keys would be silently read as
        the GPU choice (or the catalog image): that is a configuration error, said to the
        admin in the log and to the user as a 500, never guessed around."""
        if not self.profile_list or callable(self.profile_list):
            return ("profile",) if self.profile_list else ()
        keys = {"profile"}
        own = set(self._own_keys())
        for profile in self._sorted_dict_values(self.profile_list):
            for option in (profile.get("profile_options") or {}).keys():
                if option in own:
                    name = profile.get("slug") or profile.get("display_name", "?")
                    message = (
                        f"c.KubeSpawner.profile_list: profile {name!r} has an option named "
                        f"{option!r}, which is FracSpawner's own user_options key; rename the "
                        "option (e.g. 'notebook_image')"
                        + (" or drop the catalog's images" if option == "image" else "")
                    )
                    self.log.error(message)
                    raise web.HTTPError(500, message)
                keys.update({option, f"{option}--unlisted-choice"})
        return tuple(sorted(keys - own))

    # ---------------------------------------------------------------- the form
    @default("options_form")
    def _options_form_default(self) -> Any:
        return self._render_options_form_async

    async def _render_options_form_async(self, spawner: FracSpawner) -> str:
        """Render the GPU picker (and kubespawner's profile form above it, if configured)."""
        refused = self._refused_named_server()
        if refused is not None:
            return await refused._render_options_form_async(refused)
        capacity, usage = await self._capacity_and_usage()
        rule = self.access_rule()
        # unknown usage leaves no quota to offer (a GPU spawn would be refused)
        used = usage.gpu if usage.known or rule.max_gpu is None else rule.max_gpu
        model = build_offer_model(
            self.fracspawner_catalog,
            rule=rule,
            used_gpu=used,
            capacity=capacity,
            admin=self._is_admin(),
            full_waits=self.admission == "wait",
            line_known=True,
            line_full=self._line_full_now(),
            previous=self.orm_spawner.user_options if self.orm_spawner else None,
        )
        # which server this form is for (picker.js keeps Start off on a form posted to another
        # server), where to stop servers, and which of the user's servers hold the quota
        model["server"] = self.name
        model["home_url"] = self._hub_prefix() + "home"
        model["quota"]["holders"] = [
            {"server": name, "gpu_text": gpu_amount(held)}
            for name, held in sorted(self._holders().items())
        ]
        profile_html = ""
        if self.profile_list:
            self._profile_keys()  # a profile option named like ours: say so before a spawn
            profiles = self.profile_list
            if callable(profiles):
                profiles = await maybe_future(profiles(self))
            profile_html = self._render_options_form(self._sorted_dict_values(profiles))
        return render_form(model, profile_html=profile_html, service_url=self._picker_api_url())

    def _hub_prefix(self) -> str:
        return getattr(self.hub, "base_url", "/hub/") if self.hub else "/hub/"

    def _picker_api_url(self) -> str:
        """The fracspawner service's offers endpoint, for live counts in the picker."""
        base = self._hub_prefix()
        prefix = base[: -len("hub/")] if base.endswith("hub/") else "/"
        return f"{prefix}services/fracspawner/api/offers"

    def _holders(self) -> dict[str, float]:
        """The user's other servers holding GPU quota (name -> GPU-equivalents), from the hub's
        own state: named in a quota refusal and on the form, so the user knows what to stop."""
        return {n: g for n, g in self._hub_holdings().items() if g is not None and g > 0}

    def _note_form_refusal(self) -> None:
        """Remember that this named server's form spawn was refused (see below)."""
        request = getattr(getattr(self, "handler", None), "request", None)
        if self.name and request is not None and request.method == "POST":
            if "/api/" not in request.path:
                _FORM_REFUSALS[self.user.name] = (self.name, time.monotonic())

    def _refused_named_server(self) -> FracSpawner | None:
        """The named server whose form spawn was just refused, when JupyterHub asks the DEFAULT
        server for the form to show with the refusal.

        JupyterHub's SpawnHandler.post re-renders a refused spawn's form with
        `user.spawner.get_options_form()` (jupyterhub/handlers/pages.py), the default server's
        spawner, while the form posts to the named server: its choices and quota were shown,
        and a second Start started the named server with the default server's last choice
        (issue 21 #5). One-shot, and only seconds after the refusal."""
        if self.name:
            return None
        noted = _FORM_REFUSALS.pop(self.user.name, None)
        if noted is None or time.monotonic() - noted[1] > _REFUSAL_FORM_S:
            return None
        spawners = self._user_servers()[0]
        other = dict.get(spawners, noted[0]) if isinstance(spawners, dict) else None
        if isinstance(other, FracSpawner) and not other.active:
            return other
        return None

    @default("apply_user_options")
    def _apply_user_options_default(self) -> Any:
        # JupyterHub calls this before start(); FracSpawner validates and applies the options in
        # load_user_options (kubespawner's hook at the start of _start), so there is nothing to
        # do here, and saying so keeps JupyterHub from logging them as "unhandled".
        def handled_in_load_user_options(spawner: Any, user_options: dict) -> None:
            return None

        return handled_in_load_user_options

    @default("options_from_form")
    def _options_from_form_default(self) -> Any:
        return self._frac_options_from_form

    @default("room_tag_key")
    def _room_tag_key_default(self) -> str:
        # the culler reads the same variable (Culler.room_tag_key): one Secret for both
        return os.environ.get(ROOM_TAG_KEY_ENV, "")

    def _frac_options_from_form(self, formdata: Mapping[str, list[str]]) -> dict[str, Any]:
        """Form fields use the CONTRACT keys, so the form and REST produce the same options."""
        options: dict[str, Any] = {}
        if self.profile_list:
            options.update(self._options_from_form(dict(formdata)))
        for key in self._own_keys():
            values = formdata.get(key) or []
            value = values[0].strip() if values else ""
            if value:
                options[key] = value
        self._precheck(options)
        return options

    def _precheck(self, options: Mapping[str, Any]) -> None:
        """What needs no cluster and no lock (keys, sizes, pools, images, access rules) is
        refused here, in the form's own request: JupyterHub then shows the form again with
        the message. Checked only at spawn time, a refusal that came later than the hub's
        slow_spawn_timeout (a loaded machine) sent the browser to the "not running" page
        without the message on the form (issue 28 #13). Quota and capacity are checked, and
        everything again, when the spawn admits the choice (load_user_options)."""
        try:
            resolve_choice(
                self.fracspawner_catalog,
                options,
                rule=self.access_rule(),
                admin=self._is_admin(),
                admission=self.admission,
                extra_keys=self._profile_keys(),
            )
        except (OptionsError, CatalogError) as exc:
            self._note_form_refusal()
            raise refused(str(exc)) from None

    # ---------------------------------------------------------------- validation + applying
    def _resolve(self, capacity: Any, usage: Usage, admission: str | None = None) -> Choice:
        """Validate self.user_options against access, quota and capacity; raise OptionsError
        with a message for the user. `admission`: another rule than self.admission's (the
        line's refusal words are those of "refuse")."""
        rule = self.access_rule()
        admin = self._is_admin()
        choice = resolve_choice(
            self.fracspawner_catalog,
            self.user_options or {},
            rule=rule,
            used_gpu=usage.gpu,
            capacity=capacity,
            admin=admin,
            admission=admission or self.admission,
            extra_keys=self._profile_keys(),
            holders=self._holders(),
        )
        check_usage_known(choice, rule, usage, admin=admin)
        return choice

    async def resolve(self) -> Choice:
        """Validate self.user_options (nothing is reserved); raise OptionsError."""
        return self._resolve(*await self._capacity_and_usage())

    async def admit(self) -> Choice:
        """Check quota and capacity and reserve the slice, one spawn at a time.

        Under the process-wide admission lock, so two spawns (of one user's named servers, or
        for the last free slots of a pool) never both pass on counts that predate the other.
        The hold stays until the pod shows in the watch (capacity) and until the server stops
        (quota): `clear_state` releases it.
        """
        admissions = Admissions.shared()
        watcher = self._capacity_watcher()
        if watcher is not None:
            await watcher.start()  # the first list may take a while: not under the lock
        async with admissions.lock:
            capacity, usage = self._capacity_and_usage_now(watcher, admissions)
            choice = self._resolve(capacity, usage)
            self._take_place_in_line(choice, capacity, usage)
            old = watcher.pod(self.namespace, self.pod_name) if watcher is not None else None
            self.hold = hold_for(
                choice,
                user=self.user.name,
                server=self.name,
                pod=(self.namespace, self.pod_name),
                stale_uid=pod_uid(old),
            )
            admissions.reserve(self.hold)
        return choice

    async def load_user_options(self) -> None:
        """Admit the choice -> profile overrides -> GPU slice. Runs before any object exists.

        The configured baseline was restored by `clear_state` when this spawn began, before
        JupyterHub's hooks ran; nothing is reset here, so what they set stays.
        """
        self._release_hold()  # a re-run starts from no reservation
        self._room_checked = False
        try:
            choice = await self.admit()
        except (OptionsError, CatalogError) as exc:
            # 400: JupyterHub shows it on the form (in words, no "HTTP 400"), the API answers it
            self._note_form_refusal()
            raise refused(str(exc)) from None
        try:
            await self._load_profile_options()
            if choice.pool is not None:
                # the hub's server model (and so the culler's pool policy) shows the pool the
                # pod is on, never user text; the stored options keep "any pool" for the next
                # spawn. load_state puts it back after a hub restart.
                self.user_options = {**(self.user_options or {}), "pool": choice.pool.name}
            self.apply_choice(choice)
        except BaseException:
            self._release_hold()
            raise
        # a profile may have moved the pod to another namespace
        Admissions.shared().moved(self.user.name, self.name, (self.namespace, self.pod_name))

    async def _load_profile_options(self) -> None:
        """kubespawner's profile_list overrides, from the options that are not fracspawner's."""
        own = self._own_keys()
        kube_options = {k: v for k, v in (self.user_options or {}).items() if k not in own}
        if not kube_options and not self.profile_list:
            return  # kubespawner would validate nothing and apply nothing
        full_options = self.user_options
        try:
            self.user_options = kube_options
            await super().load_user_options()
        except (ValueError, KeyError) as exc:
            raise web.HTTPError(400, f"profile: {exc}") from None
        finally:
            self.user_options = full_options

    def _validate_user_options(self, profile_list: list) -> None:
        """kubespawner's check of profile options, also when `profile` is left out, and of
        their types.

        kubespawner validates an unlisted choice (enabled, its `validation_regex`) only when
        user_options name a profile, but `_load_profile` applies the DEFAULT profile's unlisted
        choice whether or not one was named: REST user_options without `profile` put any text
        past the admin's regex (an image, anything its kubespawner_override formats). So the
        options are checked as if the default profile had been named. A value that is not a
        string is a ValueError here: kubespawner's regex check raised TypeError, which its
        spawn form (pre-selecting a refused spawn's saved options) did not catch."""
        options = self.user_options or {}
        if not profile_list:
            return super()._validate_user_options(profile_list)
        slug = options.get("profile")
        expect_name("profile", slug)  # OptionsError is a ValueError, as kubespawner expects
        slugs = [p["slug"] for p in profile_list]
        if slug and slug not in slugs:  # kubespawner's words, the value cut as ours are
            raise ValueError(f"No such profile: {echo(slug)}. Options include: {', '.join(slugs)}")
        profile = self._get_profile(slug, profile_list)
        for name in profile.get("profile_options") or {}:
            for key in (name, f"{name}--unlisted-choice"):
                expect_name(key, options.get(key))
        self.user_options = {**options, "profile": profile["slug"]}
        try:
            super()._validate_user_options(profile_list)
        finally:
            self.user_options = options

    def apply_choice(self, choice: Choice) -> None:
        """Put a validated Choice's PodPlan onto the traits kubespawner builds the pod from."""
        plan = choice.plan
        self.choice = choice
        dropped = sorted(k for k in self.environment if is_reserved_env(k))
        if dropped:
            self.log.warning("Dropped reserved GPU env from config: %s", ", ".join(dropped))
        # the slice and the idle policy for the server's own kernel culling and the meter
        # the hub's start time too (set before Spawner.start, which runs this): max_age counts
        # from it, and the meter warns before a max_age stop
        orm = getattr(self, "orm_spawner", None)
        started = getattr(orm, "started", None)
        notebook = notebook_env(choice, self.fracspawner_catalog, self.culler_url, started)
        if choice.pool is None:
            # a CPU-only server on a CUDA image (ENV NVIDIA_VISIBLE_DEVICES=all) would see
            # every GPU of an untainted GPU node it lands on: its env says none
            notebook = {**notebook, **NO_DEVICES_ENV}
        self._own_env = {**plan.env, **notebook}
        self.environment = {**safe_env(self.environment, plan), **notebook}
        self.extra_container_config = _container_config(
            self.extra_container_config, {**plan.env, **notebook}
        )
        if plan.limits:
            self.extra_resource_limits = {**self.extra_resource_limits, **plan.limits}
        if plan.requests:
            self.extra_resource_guarantees = {**self.extra_resource_guarantees, **plan.requests}
        self.extra_labels = {**self.extra_labels, **plan.labels}
        self.extra_annotations = {**self.extra_annotations, **plan.annotations}
        self.node_selector = {**self.node_selector, **plan.node_selector}
        if plan.tolerations:
            self.tolerations = [*self.tolerations, *map(dict, plan.tolerations)]
        # whatever z2jh set (its user scheduler): this backend's scheduler books the GPU
        scheduler = scheduler_for(plan, choice.pool)
        if scheduler:
            self.scheduler_name = scheduler
        self._drop_privileged_init_containers(choice)
        # the containers an admin or z2jh adds beside the notebook hold no GPU: their images'
        # ENV must not show them the node's (copies: the configured lists stay as they are)
        self.init_containers = [hide_devices(c) for c in self.init_containers]
        self.extra_containers = [hide_devices(c) for c in self.extra_containers]
        if plan.image:
            self.image = plan.image
        elif choice.image is not None:
            self.image = choice.image.image
        # copies: the plan is shared by every spawn of this offer (plan_slice is memoized),
        # and a hook may change what it finds on the spawner in place
        if plan.extra_pod_config:
            self.extra_pod_config = {
                **self.extra_pod_config,
                **copy.deepcopy(dict(plan.extra_pod_config)),
            }
        if plan.extra_container_config:
            self.extra_container_config = {
                **self.extra_container_config,
                **copy.deepcopy(dict(plan.extra_container_config)),
            }
        self._container_claims = tuple(plan.container_claims)
        self._claim_templates = tuple(plan.claim_templates)

    # ---------------------------------------------------------------- DRA claims
    async def get_pod_manifest(self) -> Any:
        """kubespawner's pod, with this spawn's DRA claims on the notebook container
        (kubespawner has no trait for a container's `resources.claims`; the pod's
        `spec.resourceClaims` come through extra_pod_config)."""
        pod = await super().get_pod_manifest()
        if self._container_claims:
            from ..backends.podspec import merge_by_name

            container = pod.spec.containers[0]  # make_pod puts the notebook container first
            if container.resources is None:
                from kubernetes_asyncio.client import V1ResourceRequirements

                container.resources = V1ResourceRequirements()
            container.resources.claims = merge_by_name(
                [_camel(c) for c in container.resources.claims or []], self._container_claims
            )
        return pod

    def _expand_env(self, env: Mapping[str, Any]) -> dict[str, Any]:
        """kubespawner expands `{username}`-style templates in the admin's `environment`
        (KubeSpawner.get_env). The variables this spawn's plan and notebook put there are not
        templates: they carry catalog text (a pool's display name: "{" in it made
        str.format fail the spawn) and are kept verbatim, which also spares a template
        expansion per variable on every spawn. A value a hook replaced is the admin's again."""
        own = self._own_env
        ours = {k: v for k, v in env.items() if k in own and own[k] is v}
        expanded = super()._expand_env({k: v for k, v in env.items() if k not in ours})
        return {**expanded, **ours}

    def claim_templates(self) -> list[dict[str, Any]]:
        """The ResourceClaimTemplates this spawn's pod names, in the server's namespace."""
        return [
            {**t, "metadata": {**t["metadata"], "namespace": self.namespace}}
            for t in copy.deepcopy([dict(t) for t in self._claim_templates])
        ]

    async def _make_create_pod_request(self, pod: Any, request_timeout: float) -> Any:
        """Make the claim templates the pod names (after kubespawner made the namespace),
        then the pod. A template that cannot be made fails the spawn in words. On an
        over-committed pool the pod is made only once there is room (`_wait_for_room`).

        kubespawner retries this call (a request timed out; a 409, a pod of the same name still
        there, which it deletes first) only until k8s_api_request_retry_timeout after its FIRST
        call (kubespawner 7 `_start`), so a wait for room in here spent that budget: after a
        long wait one 409 ended the spawn ("Could not create pod"), the old pod deleted and
        none made. So the tries are made here, with the whole budget after the wait."""
        await self._wait_for_room()
        if self._claim_templates:
            from ..capacity.templates import ClaimTemplateError, ensure_claim_templates

            try:
                made = await ensure_claim_templates(
                    self.api.api_client, self.namespace, self._claim_templates
                )
            except ClaimTemplateError as exc:
                raise web.HTTPError(500, str(exc)) from None
            if made:
                self.log.info("Claim templates for %s: %s", self._log_name, ", ".join(made))
        return await exponential_backoff(
            partial(super()._make_create_pod_request, pod, request_timeout),
            f"Could not create pod {self.namespace}/{self.pod_name}",
            timeout=self.k8s_api_request_retry_timeout,
        )

    # ---------------------------------------------------------------- waiting in line
    def start(self) -> Any:
        """kubespawner's start; under admission "wait", JupyterHub's limit covers the line.

        JupyterHub reads `start_timeout` right after calling start() (jupyterhub/user.py
        `User.spawn`: `asyncio.wait_for(f, timeout=spawner.start_timeout)`), and kubespawner's
        own wait for the pod to run reads it too, so a spawn queued for a slot died of it,
        with no reason on the pending page. Here that limit becomes queue_timeout +
        start_timeout (clear_state restores the configured value for the next spawn) and
        `_start` enforces both parts itself: time in line against queue_timeout, the rest
        against start_timeout."""
        self._startup_timeout = self.start_timeout  # after hooks: what THIS spawn was given
        if self.admission == "wait":
            self.start_timeout = self._startup_timeout + self.queue_timeout
        else:
            self.start_timeout = self._startup_timeout + _TIMEOUT_MARGIN_S
        return super().start()

    async def _start(self) -> Any:
        """kubespawner's `_start`, watched each second: a pod that can never start by itself
        (`pod_failure`) ends the spawn at once, in words; start_timeout ends it with what the
        pod was stuck on; under admission "wait", time in line is kept apart (above)."""
        task = asyncio.ensure_future(super()._start())
        key = (self.user.name, self.name)
        loop = asyncio.get_running_loop()
        last = began = loop.time()
        queued = 0.0
        try:
            while not task.done():
                await asyncio.wait([task], timeout=1)
                if task.done():
                    break
                now = loop.time()
                failure = self._pod_failure()
                if failure is not None:
                    raise start_failed(failure)
                if self.admission == "wait" and self._in_line():
                    # a spawn admitted on unknown or stale counts, or whose pod waits although
                    # a slot looked free, takes its place here once the scheduler found no
                    # node for it (none was taken at admission); a pod only about to be bound
                    # takes none, so a full line never refuses a spawn that has its slot
                    if self._unschedulable() and not WaitingSpawns.shared().take(
                        key, self._waiting_limit()
                    ):
                        raise capacity_refusal(self._line_full_message())
                    queued += now - last
                    if queued > self.queue_timeout:
                        raise gave_up(self._gave_up_message())
                elif now - began - queued > self._startup_timeout:
                    # JupyterHub words a TimeoutError as its own start_timeout failure, with
                    # the value it then reads: this spawn's own, not the one stretched above
                    self.start_timeout = self._startup_timeout
                    besides = (
                        f" (besides {int(queued)} s waiting for a slot)"
                        if self.admission == "wait"
                        else ""
                    )
                    stuck = self._stuck_words() or self._placement()[0]
                    raise asyncio.TimeoutError(
                        f"{self._log_name} did not start in {self._startup_timeout} seconds"
                        f"{besides}{self._name_taken_words()}" + (f". {stuck}" if stuck else "")
                    )
                last = now
        finally:
            WaitingSpawns.shared().leave(key)
            if not task.done():
                task.cancel()  # JupyterHub's stop() then deletes the pod
        return task.result()

    def _own_pod(self) -> Mapping[str, Any] | None:
        """The pod of this spawn's name in the pod watch, if any."""
        reflector = getattr(self, "pod_reflector", None)
        pod = reflector.pods.get(f"{self.namespace}/{self.pod_name}") if reflector else None
        return pod if isinstance(pod, Mapping) else None

    def _name_taken_words(self) -> str:
        """Why the pod is not made, where kubespawner waits for a pod of its name to go (it
        deletes one that answers its create with 409, then waits to see it gone); or ""."""
        pod = self._own_pod()
        if pod is None or not (pod.get("metadata") or {}).get("deletionTimestamp"):
            return ""
        return (
            f": a pod of the same name ({self.pod_name}, of an earlier start) is still being "
            "deleted. Start again once it is gone, or ask an administrator if it stays"
        )

    def _queued_pod(self) -> Mapping[str, Any] | None:
        """This spawn's pod while it waits for a node (Pending, not bound); None otherwise. A
        pod of its name being deleted is an earlier start's (kubespawner deletes one that
        answers its create with 409): it waits for nothing, and takes no place in line."""
        pod = self._own_pod()
        if pod is None or (pod.get("metadata") or {}).get("deletionTimestamp"):
            return None
        phase = (pod.get("status") or {}).get("phase")
        if phase == "Pending" and not (pod.get("spec") or {}).get("nodeName"):
            return pod
        return None

    def _unschedulable(self) -> bool:
        """This spawn's pod waits and the scheduler has found no node for it (its PodScheduled
        condition False, reason Unschedulable), as against one just made and about to be
        bound."""
        pod = self._queued_pod()
        conditions = ((pod or {}).get("status") or {}).get("conditions") or []
        return any(
            isinstance(c, Mapping)
            and c.get("type") == "PodScheduled"
            and c.get("status") == "False"
            and c.get("reason") == "Unschedulable"
            for c in conditions
        )

    def _in_line(self) -> bool:
        """Waiting for a GPU: for room, or a pod no node takes, for no reason but the GPU
        that the scheduler says (`_stuck_words`: CPU short, a taint, no scheduler at all are
        not a place in line, and count against start_timeout)."""
        if self._room_reason is not None:
            return True
        return self._queued_pod() is not None and self._stuck_words() is None

    def _pod_failure(self) -> str | None:
        """Why this spawn's pod can never start by itself, in words (hub/progress.py)."""
        choice = self.choice
        image = choice.image.display_name if choice is not None and choice.image else ""
        return pod_failure(self._own_pod(), image=image)

    def _stuck_words(self) -> str | None:
        """Why this spawn's waiting pod does not start, where it is not the GPU: the scheduler
        finds no node for another reason, or no scheduler has looked at it (its schedulerName
        names one that is not running: Kubernetes then says nothing at all); else None."""
        pod = self._queued_pod()
        if pod is None:
            return None
        looked, message = _pod_scheduled(pod)
        if message is not None:
            wait, trouble = self._placement(message)
            if wait is not None:
                return None  # a node is being added, or may be: a wait
            since = self._gpus_unoffered() if trouble is None else None
            if since is not None:
                return self._unoffered_words(pod, since)  # None within the grace
            return trouble
        if looked:
            return None
        age = _pod_age(pod)
        if age is None or age < SCHEDULER_GRACE_S:
            return None
        scheduler = (pod.get("spec") or {}).get("schedulerName") or "default-scheduler"
        return scheduler_absent(scheduler, _duration(age))

    def _placement(self, message: str | None = None) -> tuple[str | None, str | None]:
        """What the scheduler's `message` (a FailedScheduling event's, else this spawn's waiting
        pod's PodScheduled condition's) means, as (wait, trouble). `wait`: where its reasons are
        ones a new node mends (the pool has no node: an autoscaled pool at zero; CPU or memory
        short), the words of a wait while a node autoscaler adds a node for the pod (its
        TriggeredScaleUp or Nominated event), or while none has spoken yet within
        SCHEDULER_GRACE_S of the pod's creation (hub/progress.py `scheduling_wait`). Else
        `trouble`: the words of a pod no node takes for a reason other than the GPU, with the
        autoscaler's word (`scheduling_trouble`); (None, None): a GPU wait. The pod's events
        are read once, and only where a new node could mend the reasons."""
        pod = self._queued_pod()
        if message is None:
            message = _pod_scheduled(pod)[1] if pod is not None else None
            if message is None:
                return None, None
        mends = node_may_mend(message)
        autoscaling = node_autoscaling(self.events) if mends else None
        if pod is not None and mends:
            age = _pod_age(pod)
            wait = scheduling_wait(
                message,
                autoscaling,
                early=age is None or age < SCHEDULER_GRACE_S,  # unknown is never read as none
                kept=_duration(self.queue_timeout) if self.admission == "wait" else None,
            )
            if wait is not None:
                return wait, None
        return None, scheduling_trouble(message, autoscaling)

    def _gpus_unoffered(self) -> float | None:
        """The pod watch, live and listed, says ready nodes serve the chosen pool and none
        offers a unit of this offer to Kubernetes: its total is 0 (the kubelet keeps a device
        plugin's resource at 0 once the plugin is gone), or none publishes what it is counted
        from (a plugin that never registered), and no node of the pool is on its way
        (`OfferCapacity.unoffered_since`, returned: when the newest of them became Ready).
        None where no node serves the pool (an autoscaled pool at zero: the pending pod makes
        the autoscaler add one) or the counts cannot tell (no watch, a stale one): unknown is
        never read as none."""
        choice = self.choice
        if choice is None or choice.pool is None:
            return None
        try:
            watcher = self._capacity_watcher()
            capacity = watcher.snapshot() if watcher is not None else None
        except Exception:  # counts are a nicety; never break progress over them
            return None
        if not watch_usable(capacity):
            return None
        counts = capacity.get(choice.pool.name, str(choice.offer or choice.slice))
        return counts.unoffered_since

    def _unoffered_words(self, pod: Mapping[str, Any] | None, since: float) -> str | None:
        """`gpus_unoffered`'s words once the pod has waited SCHEDULER_GRACE_S and the pool's
        newest node has been Ready NODE_GPU_GRACE_S (`since`: when it became so; its GPUs
        register minutes after); None before."""
        choice = self.choice
        assert choice is not None and choice.pool is not None
        age = _pod_age(pod) if pod is not None else None
        if age is None or age < SCHEDULER_GRACE_S or time.time() - since < NODE_GPU_GRACE_S:
            return None
        return self._unoffered_text(waited=_duration(age))

    def _unoffered_text(self, waited: str | None) -> str:
        """`gpus_unoffered` for this spawn's offer, in its backend's terms."""
        choice = self.choice
        assert choice is not None and choice.pool is not None
        offer = choice.offer or choice.slice
        backend = choice.pool.backend
        return gpus_unoffered(
            describe_offer(offer),
            choice.pool.display_name,
            dra=backend == "dra",
            mig_profile=offer.profile if backend in _MIG_BACKENDS and offer.profile else None,
            resource=shared_resource(choice.pool) if backend in _RENAMING_BACKENDS else None,
            waited=waited,
        )

    # ---------------------------------------------------------------- room (issue 36, item 5)
    async def _room_answer(self) -> dict | None:
        """The culler's room answer (hub/room.py), asked with this server's own token."""
        url = self.culler_room_url or (
            self.culler_url.rstrip("/") + "/api/room" if self.culler_url else ""
        )
        if not url or not self.api_token:
            return None
        return await fetch_room(url, self.api_token)

    def _pool_gpus(self, choice: Choice, need_mib: float) -> int | None:
        """The pool's physical GPUs by the capacity counts (None: not known)."""
        watcher = self._capacity_watcher()
        capacity = watcher.snapshot() if watcher is not None else None
        if capacity is None or not watch_usable(capacity):
            return None
        pool = choice.pool
        assert pool is not None
        counts = capacity.get(pool.name, str(choice.offer or choice.slice))
        size = float(pool.gpu.device_memory_mib)
        return gpus_in_pool(counts.total, need_mib, size, pool.overcommit)

    async def _wait_for_room(self) -> None:
        """On an over-committed pool: make the pod only when a GPU of the pool has room for
        this slice beside what present users' kernels hold (the culler's answer), in line
        behind the spawns that asked first; under admission "refuse", refuse instead."""
        choice = self.choice
        if self._room_checked or choice is None or choice.pool is None:
            return
        pool = choice.pool
        if pool.overcommit <= 1:
            self._room_checked = True
            return
        need = float(slice_memory_mib(choice.offer or choice.slice, pool.gpu))
        gpus = self._pool_gpus(choice, need)
        line = RoomLine.shared()
        key = (self.user.name, self.name)
        loop = asyncio.get_running_loop()
        line.join(pool.name, key, need, loop.time())
        try:
            while True:
                answer = await line.answer(self._room_answer, loop.time())
                counted = counted_tags(answer)
                in_flight = line.in_flight_mib(pool.name, counted, besides=key, now=loop.time())
                if unfound := line.unfound(counted, loop.time()):
                    self.log.warning(
                        "%d server(s) this hub admitted on over-committed pools were never "
                        "found in the culler's room answer: FracSpawner.room_tag_key is likely "
                        "not the culler's Culler.room_tag_key (both default to $%s). They "
                        "count on top of the culler's figures, so spawns wait for room that "
                        "is there", unfound, ROOM_TAG_KEY_ENV,
                    )  # fmt: skip
                v = verdict(
                    answer, pool.name, need, size_mib=float(pool.gpu.device_memory_mib),
                    gpus_in_pool=gpus,
                    in_flight_mib=in_flight,
                    ahead=line.ahead(pool.name, key, loop.time()),
                    overtake_s=self.room_overtake_seconds,
                )  # fmt: skip
                if v.go:
                    if not v.known:
                        self.log.warning(
                            "%s: no answer from the culler about room on over-committed pool "
                            "%r; admitted by slot counts alone", self._log_name, pool.name,
                        )  # fmt: skip
                    tag = server_tag(*key, self.room_tag_key)
                    line.admit(key, pool.name, tag, need, at=loop.time())
                    break
                if self.admission != "wait":
                    raise refused(f"{v.reason}. Try again later, or choose another pool.")
                waiting = WaitingSpawns.shared()
                if not waiting.take(key, self._waiting_limit()):
                    full = line_full_words(len(waiting))
                    raise capacity_refusal(
                        f"{v.reason}, and {full}. Try again in a few minutes, or choose "
                        "another pool."
                    )
                if v.reason != self._room_reason:
                    self.log.info("%s waits for room: %s", self._log_name, v.reason)
                self._room_reason = v.reason
                await asyncio.sleep(POLL_SECONDS)
        finally:
            line.leave(pool.name, key)
            self._room_reason = None
        self._room_checked = True

    def _room_words(self, reason: str) -> str:
        return (
            f"{reason}. Your server starts by itself as soon as one of them leaves or their "
            f"notebooks go idle (your place is kept for {_duration(self.queue_timeout)})."
        )

    def _line_full_message(self) -> str:
        full = line_full_words(len(WaitingSpawns.shared()))
        return (
            f"Your server would wait for {self._offer_words() or 'a slot'}, and {full}. Try "
            "again in a few minutes, or choose another size."
        )

    def _offer_words(self) -> str | None:
        """What this spawn asks for, in words ("1/4 GPU on T4 16GB (time-sliced)")."""
        choice = self.choice
        if choice is None or choice.pool is None:
            return None
        return f"{describe_offer(choice.offer or choice.slice)} on {choice.pool.display_name}"

    def _gave_up_message(self) -> str:
        if self._room_reason is not None:  # in line for room on an over-committed GPU
            return (
                f"{self._room_reason}, and no room freed within {_duration(self.queue_timeout)};"
                " your place is given up. Start again to wait again, or choose another pool."
            )
        what = self._offer_words() or "slot"
        return (
            f"No {what} freed within {_duration(self.queue_timeout)}; your place is given up. "
            "Start again to wait again, or choose another size."
        )

    def _drop_privileged_init_containers(self, choice: Choice) -> None:
        """Leave privileged init containers out of the pods of a backend that refuses them.

        HAMi's webhook denies a GPU pod with any privileged container; z2jh adds one to every
        user pod by default (`block-cloud-metadata`, singleuser.cloudMetadata.blockWithIptables),
        so no HAMi server could start. The metadata IP stays blocked by z2jh's singleuser
        NetworkPolicy (egressAllowRules.cloudMetadataServer: false); examples/z2jh turns the
        iptables block off. Other pods keep it (the baseline is restored on every spawn)."""
        if choice.pool is None:
            return
        from ..backends import get_backend

        if not getattr(get_backend(choice.pool.backend), "denies_privileged", False):
            return
        dropped = [container_name(c) for c in self.init_containers if is_privileged(c)]
        if dropped:
            self.log.warning(
                "Left privileged init container(s) %s out of %s's pod: the %s backend refuses "
                "privileged containers (z2jh: set singleuser.cloudMetadata.blockWithIptables: "
                "false; its NetworkPolicy blocks the metadata IP)",
                ", ".join(dropped), self._log_name, choice.pool.backend,
            )  # fmt: skip
            self.init_containers = [c for c in self.init_containers if not is_privileged(c)]

    # ---------------------------------------------------------------- reflectors
    async def _start_watching_pods(self, replace: bool = False) -> Any:
        """kubespawner's pod reflector, resumed from its last resourceVersion instead of
        re-listing every pod each time a watch ends (hub/reflectors.py; same arguments as
        KubeSpawner._start_watching_pods, including its legacy `component` label)."""
        return await self._start_reflector(
            kind="pods",
            reflector_class=ResumingPodReflector,
            labels={"component": self.component_label},
            omit_namespace=self.enable_user_namespaces,
            replace=replace,
        )

    async def _start_watching_events(self, replace: bool = False) -> Any:
        """kubespawner's event reflector, resumed likewise."""
        return await self._start_reflector(
            kind="events",
            reflector_class=ResumingEventReflector,
            fields={"involvedObject.kind": "Pod"},
            omit_namespace=self.enable_user_namespaces,
            replace=replace,
        )

    # ---------------------------------------------------------------- progress
    @property
    def events(self) -> list[Any]:
        """kubespawner's `events` (this pod's events since `_last_event`, oldest first),
        without sorting the events of every pod of the namespace on each read (hub/progress.py
        `pod_events`): a storm's spawns each read it at start, and every pending page once a
        second, while the events of the namespace's other pods pile up."""
        reflector = self.event_reflector
        if not reflector:
            return []
        return pod_events(reflector.resources.values(), self.pod_name, self._last_event)

    async def progress(self):
        """kubespawner's progress in the user's words: each pod event becomes a sentence about
        their slice and image (hub/progress.py), the scheduler's FailedScheduling says what the
        pod waits for; Kubernetes' own text stays in the pending page's event log."""
        choice = self.choice
        where = ""
        if choice is not None and choice.pool is not None:
            where = f"{describe_offer(choice.offer or choice.slice)} on {choice.pool.display_name}"
        image = choice.image.display_name if choice is not None and choice.image else ""
        waiting: Mapping[str, Any] | None = None  # the scheduler's last word while in line
        async for event in self._with_room_words(super().progress()):
            raw = event.get("raw_event")
            if not isinstance(raw, Mapping) and self._room_reason is not None:
                # waiting for room on an over-committed GPU: the reason, not "taking long"
                yield {"message": self._room_words(self._room_reason)}
                continue
            if not isinstance(raw, Mapping):
                # kubespawner's patience message ("taking longer than expected") would replace
                # the promise under the bar while the pod waits in line: the waiting line
                # stays, with how long it has waited; other slow steps keep kubespawner's words
                stuck = self._stuck_words() if "progress" not in event else None
                wait = self._placement()[0] if "progress" not in event and stuck is None else None
                if stuck is not None:  # not the GPU: what it is, not "taking longer"
                    yield {"message": stuck}
                elif wait is not None:  # a node is being added for it, or may be
                    yield {"message": wait}
                elif waiting is not None and self._in_line() and "progress" not in event:
                    yield {"message": await self._waiting_message(waiting, patience=True)}
                else:
                    yield event
                continue
            trouble = wait = None
            if raw.get("reason") == "FailedScheduling" and not is_autoscaler_event(raw):
                wait, trouble = self._placement(str(raw.get("message") or ""))
            elif is_autoscaler_event(raw):  # read with the scheduler's latest word on the pod
                wait = self._placement()[0]
                trouble = self._stuck_words() if wait is None else None
            if wait is not None:  # a node is being added for it, or may be: a wait
                waiting = None
                sentence = wait
            elif trouble is not None:  # CPU short, a taint, a selector: not "waiting for a GPU"
                waiting = None
                sentence = trouble
            elif is_autoscaler_event(raw) and waiting is not None:
                sentence = await self._waiting_message(waiting)  # a GPU wait goes on
            elif raw.get("reason") == "FailedScheduling" and where:
                waiting = raw
                sentence = await self._waiting_message(raw)
            else:
                if raw.get("reason") == "Scheduled":
                    waiting = None
                sentence = human_step(raw, slice_words=where, image=image)
            yield progress_event(event, sentence)

    async def _with_room_words(self, events: Any) -> Any:
        """`events`, and a plain event each time this spawn's room reason changes (looked at
        every second): kubespawner's progress yields nothing before the pod exists."""
        source = events.__aiter__()
        pending: asyncio.Future | None = None
        last = None
        try:
            while True:
                if pending is None:
                    pending = asyncio.ensure_future(source.__anext__())
                done, _ = await asyncio.wait([pending], timeout=1)
                reason = self._room_reason
                if reason is not None and reason != last:
                    yield {"message": self._room_words(reason)}
                last = reason
                if not done:
                    continue
                try:
                    event = pending.result()
                except StopAsyncIteration:
                    return
                pending = None
                yield event
        finally:
            if pending is not None and not pending.done():
                pending.cancel()
                # the source runs until the cancellation lands: aclose() before that fails
                await asyncio.gather(pending, return_exceptions=True)
            aclose = getattr(source, "aclose", None)
            if aclose is not None:
                await aclose()

    async def _waiting_message(self, raw: Mapping[str, Any], *, patience: bool = False) -> str:
        choice = self.choice
        assert choice is not None and choice.pool is not None
        offer = choice.offer or choice.slice
        since = self._gpus_unoffered()
        if since is not None:  # not a GPU that is taken: none is offered at all
            pod = self._queued_pod()
            return self._unoffered_words(pod, since) or self._unoffered_text(waited=None)
        words = f"Waiting for a free {describe_offer(offer)} on {choice.pool.display_name}"
        try:
            capacity, _ = await self._capacity_and_usage()
            counts = capacity.get(choice.pool.name, str(offer)) if capacity else None
            stale = bool(getattr(capacity, "stale", False))
        except Exception:  # counts are a nicety; never break progress over them
            counts, stale = None, False
        if counts is not None and counts.total is not None:
            # a snapshot from a watch that lost the API server is the last known, not now
            words += f": {counts.free} of {counts.total} free" + (" (last known)" if stale else "")
        # what the scheduler lacks ("Insufficient nvidia.com/gpu") stays in the event log
        words += "; it starts by itself as soon as one frees"
        if self.admission == "wait":
            words += f" (your place is kept for {_duration(self.queue_timeout)}"
            pod = self._queued_pod() if patience else None
            created = _pod_age(pod) if pod is not None else None
            if created is not None:
                words += f"; waiting for {_duration(created)}"
            words += ")"
        return words + "."


def _pod_scheduled(pod: Mapping[str, Any]) -> tuple[bool, str | None]:
    """(whether the pod has its PodScheduled condition: a scheduler has looked at it, the
    scheduler's message where that condition says it found no node: False, Unschedulable)."""
    for c in (pod.get("status") or {}).get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == "PodScheduled":
            unschedulable = c.get("status") == "False" and c.get("reason") == "Unschedulable"
            return True, str(c.get("message") or "") if unschedulable else None
    return False, None


def _duration(seconds: float) -> str:
    """'45 seconds', '1 minute', '30 minutes', '2 h 30 min' (whole units, rounded down)."""
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds} second" + ("" if seconds == 1 else "s")
    minutes = seconds // 60
    if minutes < 120:
        return f"{minutes} minute" + ("" if minutes == 1 else "s")
    hours, rest = divmod(minutes, 60)
    return f"{hours} h" + (f" {rest} min" if rest else "")


def _pod_age(pod: Mapping[str, Any]) -> float | None:
    """Seconds since the pod was created (its creationTimestamp), None when not readable."""
    created = created_at(pod)
    return None if created is None else max(0.0, time.time() - created)


def _camel(claim: Any) -> dict[str, Any]:
    """A container claim as a camelCase dict (a kubernetes_asyncio model or a dict)."""
    if isinstance(claim, Mapping):
        return dict(claim)
    out = {"name": claim.name}
    if getattr(claim, "request", None):
        out["request"] = claim.request
    return out


def _fresh_copy(value: Any) -> Any:
    """copy.deepcopy(value), without its machinery for what most traits hold: an atomic value,
    or a dict or list of atomic values (env, labels, selectors)."""
    kind = type(value)
    if kind in _ATOMIC:
        return value
    if kind is dict and all(type(k) in _ATOMIC and type(v) in _ATOMIC for k, v in value.items()):
        return dict(value)
    if kind is list and all(type(v) in _ATOMIC for v in value):
        return list(value)
    return copy.deepcopy(value)


def _container_config(config: Mapping[str, Any], plan_env: Mapping[str, str]) -> dict[str, Any]:
    """extra_container_config without reserved env, keeping the plan's env in force.

    kubespawner lets `extra_container_config["env"]` REPLACE the container's whole env list,
    so when an admin sets it, the plan's entries are appended (they win) and an emptied list is
    dropped rather than wiping the JUPYTERHUB_* variables.
    """
    config = dict(config)
    if not isinstance(config.get("env"), list):
        return config
    env = [
        e
        for e in config["env"]
        if not is_reserved_env(str(e.get("name", ""))) and e.get("name") not in plan_env
    ]
    if env:
        config["env"] = env + [{"name": k, "value": v} for k, v in plan_env.items()]
    else:
        del config["env"]
    return config
