"""FracSpawner: KubeSpawner plus a GPU-slice choice mapped onto the cluster's sharing technology.

Every spawn starts from a CLEAN baseline: the configured trait values are snapshotted when the
spawner object is built and restored before options are applied, so nothing from an earlier
spawn (a GPU limit, a node selector, a toleration) leaks into the next one (kubespawner#546,
#691, jupyterhub#3095). Then kubespawner's `profile_list` overrides (if any) are applied, then
the GPU slice's PodPlan on top.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Mapping
from typing import Any

from jupyterhub.utils import maybe_future
from kubespawner import KubeSpawner
from tornado import web
from traitlets import Bool, Dict, Enum, Unicode, default

from ..backends import is_reserved_env, load_catalog, safe_env
from ..capacity.count import gpu_usage_by_user
from ..choice.offers import build_offer_model
from ..choice.options import OPTION_KEYS, Choice, OptionsError, describe_offer, resolve_choice
from ..model.catalog import AccessRule, Catalog, CatalogError
from .form import render_form

# Traits the baseline snapshot never restores: they are state, not configuration.
_NOT_BASELINE = frozenset(
    {"config", "parent", "log", "user_options", "options_form", "options_from_form"}
)
_INSUFFICIENT = re.compile(r"Insufficient ([\w./-]+)")

_catalog_cache: dict[Any, Catalog] = {}


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
    admin_override = Bool(
        True,
        config=True,
        help="""Whether JupyterHub admins may take any pool and ignore quotas.""",
    )
    live_capacity = Bool(
        True,
        config=True,
        help="""Watch nodes and pods to show free/total counts and refuse full pools.

        Needs cluster-scoped get/list/watch on nodes and pods for the hub's service account.
        When False, counts show as unknown and no capacity check is made.
        """,
    )

    # ---------------------------------------------------------------- set-up
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._baseline = self._snapshot_config()
        self.choice: Choice | None = None

    def _snapshot_config(self) -> dict[str, Any]:
        values = {}
        for name, trait in self.traits(config=True).items():
            if name in _NOT_BASELINE or not self.has_trait(name):
                continue
            if name == "namespace" and self.enable_user_namespaces:
                continue
            values[name] = copy.deepcopy(trait.get(self))
        return values

    def _restore_baseline(self) -> None:
        """Reset every configurable trait to its configured value (the kubespawner#546 fix)."""
        for name, value in self._baseline.items():
            current = getattr(self, name)
            if current is not value and current != value:
                setattr(self, name, copy.deepcopy(value))

    @property
    def fracspawner_catalog(self) -> Catalog:
        source: Any = self.catalog or self.catalog_file or os.environ.get("FRACSPAWNER_CATALOG")
        if not source:
            raise CatalogError(
                "no catalog configured: set c.FracSpawner.catalog_file or c.FracSpawner.catalog"
            )
        return cached_catalog(source)

    # ---------------------------------------------------------------- who may take what
    def _groups(self) -> list[str]:
        groups = getattr(self.user, "groups", None) or []
        return [getattr(g, "name", g) for g in groups]

    def _is_admin(self) -> bool:
        return bool(self.admin_override and getattr(self.user, "admin", False))

    def access_rule(self) -> AccessRule:
        return self.fracspawner_catalog.rule_for(self.user.name, self._groups())

    def _capacity_watcher(self) -> Any:
        if not self.live_capacity:
            return None
        from ..capacity.watch import CapacityWatcher

        return CapacityWatcher.shared(self.fracspawner_catalog)

    async def _capacity_and_usage(self) -> tuple[Any, float]:
        """A capacity snapshot and what this user's OTHER servers hold, from caches only."""
        watcher = self._capacity_watcher()
        if watcher is None:
            return None, 0.0
        await watcher.start()
        usage = watcher.usage_by_user().get(self.user.name, 0.0)
        own = watcher.pod(self.namespace, self.pod_name)
        if own is not None:  # this server's old pod does not count against its new spawn
            usage -= gpu_usage_by_user([own]).get(self.user.name, 0.0)
        return watcher.snapshot(), usage

    def _profile_keys(self) -> tuple[str, ...]:
        """user_options keys kubespawner's profile_list accepts (when one is configured)."""
        if not self.profile_list or callable(self.profile_list):
            return ("profile",) if self.profile_list else ()
        keys = {"profile"}
        for profile in self._sorted_dict_values(self.profile_list):
            for option in (profile.get("profile_options") or {}).keys():
                keys.update({option, f"{option}--unlisted-choice"})
        return tuple(sorted(keys - set(OPTION_KEYS)))

    # ---------------------------------------------------------------- the form
    @default("options_form")
    def _options_form_default(self) -> Any:
        return self._render_options_form_async

    async def _render_options_form_async(self, spawner: FracSpawner) -> str:
        """Render the GPU picker (and kubespawner's profile form above it, if configured)."""
        capacity, used = await self._capacity_and_usage()
        model = build_offer_model(
            self.fracspawner_catalog,
            rule=self.access_rule(),
            used_gpu=used,
            capacity=capacity,
            admin=self._is_admin(),
            previous=self.orm_spawner.user_options if self.orm_spawner else None,
        )
        profile_html = ""
        if self.profile_list:
            profiles = self.profile_list
            if callable(profiles):
                profiles = await maybe_future(profiles(self))
            profile_html = self._render_options_form(self._sorted_dict_values(profiles))
        return render_form(model, profile_html=profile_html, service_url=self._picker_api_url())

    def _picker_api_url(self) -> str:
        """The fracspawner service's offers endpoint, for live counts in the picker."""
        base = getattr(self.hub, "base_url", "/hub/") if self.hub else "/hub/"
        prefix = base[: -len("hub/")] if base.endswith("hub/") else "/"
        return f"{prefix}services/fracspawner/api/offers"

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

    def _frac_options_from_form(self, formdata: Mapping[str, list[str]]) -> dict[str, Any]:
        """Form fields use the CONTRACT keys, so the form and REST produce the same options."""
        options: dict[str, Any] = {}
        if self.profile_list:
            options.update(self._options_from_form(dict(formdata)))
        for key in OPTION_KEYS:
            values = formdata.get(key) or []
            value = values[0].strip() if values else ""
            if value:
                options[key] = value
        return options

    # ---------------------------------------------------------------- validation + applying
    async def resolve(self) -> Choice:
        """Validate self.user_options; raise OptionsError with a message for the user."""
        capacity, used = await self._capacity_and_usage()
        return resolve_choice(
            self.fracspawner_catalog,
            self.user_options or {},
            rule=self.access_rule(),
            used_gpu=used,
            capacity=capacity,
            admin=self._is_admin(),
            admission=self.admission,
            extra_keys=self._profile_keys(),
        )

    async def load_user_options(self) -> None:
        """Clean baseline -> profile overrides -> GPU slice. Runs before any object is created."""
        self._restore_baseline()
        self.choice = None
        try:
            choice = await self.resolve()
        except (OptionsError, CatalogError) as exc:
            # 400: JupyterHub shows it on the form, and the REST API answers with it
            raise web.HTTPError(400, str(exc)) from None
        kube_options = {k: v for k, v in (self.user_options or {}).items() if k not in OPTION_KEYS}
        full_options = self.user_options
        try:
            self.user_options = kube_options
            await super().load_user_options()
        except (ValueError, KeyError) as exc:
            raise web.HTTPError(400, f"profile: {exc}") from None
        finally:
            self.user_options = full_options
        if choice.pool is not None and "pool" not in (self.user_options or {}):
            # the hub's server model (and so the culler) then shows the pool picked; the
            # stored options keep "any pool" for the next spawn
            self.user_options = {**self.user_options, "pool": choice.pool.name}
        self.apply_choice(choice)

    def apply_choice(self, choice: Choice) -> None:
        """Put a validated Choice's PodPlan onto the traits kubespawner builds the pod from."""
        plan = choice.plan
        self.choice = choice
        dropped = sorted(k for k in self.environment if is_reserved_env(k))
        if dropped:
            self.log.warning("Dropped reserved GPU env from config: %s", ", ".join(dropped))
        self.environment = safe_env(self.environment, plan)
        self.extra_container_config = _container_config(self.extra_container_config, plan.env)
        if plan.limits:
            self.extra_resource_limits = {**self.extra_resource_limits, **plan.limits}
        if plan.requests:
            self.extra_resource_guarantees = {**self.extra_resource_guarantees, **plan.requests}
        self.extra_labels = {**self.extra_labels, **plan.labels}
        self.extra_annotations = {**self.extra_annotations, **plan.annotations}
        self.node_selector = {**self.node_selector, **plan.node_selector}
        if plan.tolerations:
            self.tolerations = [*self.tolerations, *map(dict, plan.tolerations)]
        if plan.scheduler_name:
            self.scheduler_name = plan.scheduler_name
        if plan.image:
            self.image = plan.image
        elif choice.image is not None:
            self.image = choice.image.image
        if plan.extra_pod_config:
            self.extra_pod_config = {**self.extra_pod_config, **plan.extra_pod_config}
        if plan.extra_container_config:
            self.extra_container_config = {
                **self.extra_container_config,
                **plan.extra_container_config,
            }

    # ---------------------------------------------------------------- progress
    async def progress(self):
        """kubespawner's progress, with scheduler events translated into the user's terms."""
        async for event in super().progress():
            raw = event.get("raw_event") or {}
            if raw.get("reason") == "FailedScheduling" and self.choice and self.choice.pool:
                event = {**event, "message": await self._waiting_message(raw)}
            yield event

    async def _waiting_message(self, raw: Mapping[str, Any]) -> str:
        choice = self.choice
        assert choice is not None and choice.pool is not None
        offer = choice.offer or choice.slice
        words = f"Waiting for a free {describe_offer(offer)} in pool {choice.pool.name}"
        try:
            capacity, _ = await self._capacity_and_usage()
            counts = capacity.get(choice.pool.name, str(offer)) if capacity else None
        except Exception:  # counts are a nicety; never break progress over them
            counts = None
        if counts is not None and counts.total is not None:
            words += f": {counts.free} of {counts.total} free"
        missing = _INSUFFICIENT.findall(raw.get("message", ""))
        if missing:
            words += f" (the scheduler reports insufficient {', '.join(sorted(set(missing)))})"
        return words + "."


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
