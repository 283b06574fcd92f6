"""fracspawner: a KubeSpawner for GPU slices (fractions, memory sizes, MIG profiles)."""

from __future__ import annotations

import copy
import sys
from typing import Any

from ._version import __version__

__all__ = [
    "FracSpawner",
    "__version__",
    "add_roles",
    "add_service_roles",
    "add_user_scopes",
    "configure",
]


def __getattr__(name: str) -> Any:
    # Import the spawner lazily: `fracspawner plan`, the devcluster and the notebook extension
    # must not pay for importing JupyterHub and kubespawner.
    if name == "FracSpawner":
        from .hub.spawner import FracSpawner

        return FracSpawner
    raise AttributeError(name)


def _all_problems(catalog_file: str | None, catalog: dict | None) -> list[str]:
    from .backends import backend_names, check_pool
    from .model.check import catalog_problems, file_problems

    if catalog_file is not None:
        return file_problems(catalog_file, check_pool, backend_names())
    return catalog_problems(catalog, check_pool, backend_names())


def configure(c: Any, *, catalog_file: str | None = None, catalog: dict | None = None) -> None:
    """Use FracSpawner with a catalog, validating the catalog NOW (at hub start-up).

    In jupyterhub_config.py (or z2jh's hub.extraConfig)::

        import fracspawner
        fracspawner.configure(c, catalog_file="/etc/jupyterhub/catalog.yaml")

    A bad catalog stops the hub (SystemExit 1) after printing every problem, each with its
    path, and the file's name (the same report as `fracspawner check CATALOG`), instead of
    failing at the first spawn.
    """
    from .backends import load_catalog
    from .model.check import report
    from .model.errors import CatalogError

    if (catalog_file is None) == (catalog is None):
        raise ValueError("fracspawner.configure: give exactly one of catalog_file= or catalog=")
    try:
        load_catalog(catalog_file if catalog_file is not None else catalog)
    except CatalogError as exc:
        # every problem at once, naming the file (as `fracspawner check` does), not the first
        # one as the last line of a traceback
        problems = _all_problems(catalog_file, catalog) or [str(exc)]
        source = catalog_file if catalog_file is not None else "the catalog given to configure()"
        print(f"fracspawner: {report(source, problems)}", file=sys.stderr)
        raise SystemExit(1) from None
    c.JupyterHub.spawner_class = "fracspawner"
    # a refused spawn is logged as one INFO line, not ERROR with a traceback
    from .hub.refusal import install_log_filter

    install_log_filter()
    # the slice on JupyterHub's pending and home pages (fracspawner.hub.pages)
    from .hub.pages import TEMPLATE_DIR, template_vars

    # after the deployment's own template paths: a site's own home.html still wins
    c.JupyterHub.template_paths = [*c.JupyterHub.get("template_paths", []), TEMPLATE_DIR]
    c.JupyterHub.template_vars = {**template_vars(), **c.JupyterHub.get("template_vars", {})}
    if catalog_file is not None:
        c.FracSpawner.catalog_file = str(catalog_file)
    else:
        c.FracSpawner.catalog = catalog


def _resolved(c: Any, name: str, empty: Any) -> Any:
    """c.JupyterHub.<name> as the hub will see it: appended/added to, never set, resolves
    traitlets' LazyConfigValue (c.JupyterHub.load_roles.append(...)) onto `empty`."""
    from traitlets.config import LazyConfigValue

    value = c.JupyterHub.get(name, empty)
    if isinstance(value, LazyConfigValue):
        value = value.get_value(empty)
    return value


def hub_has_extra_user_scopes() -> bool:
    """Whether this JupyterHub has `JupyterHub.extra_user_scopes` (6.0 and later)."""
    from jupyterhub.app import JupyterHub

    return "extra_user_scopes" in JupyterHub.class_trait_names()


def add_user_scopes(c: Any, *scopes: str) -> None:
    """Grant every user `scopes` (e.g. access to the live-offers service), keeping whatever
    the operator's config grants or takes away. Call it last (z2jh's hub.extraConfig runs after
    hub.loadRoles and hub.config).

    JupyterHub loads roles in `init_role_creation` (jupyterhub/app.py): a `user` role in
    `load_roles` that has `scopes` replaces the default one's (`self`), and then
    `extra_user_scopes` (JupyterHub >= 6.0) is ignored; without `scopes` it keeps the
    default's, extended by `extra_user_scopes`. So:

    - the operator has a `user` role with `scopes` (even an empty list, which takes `self`
      away on purpose): the scopes are added to that list and nothing else (never `self`);
    - otherwise, on JupyterHub >= 6.0: added to `c.JupyterHub.extra_user_scopes` (with any the
      operator put there); no `user` role is made, which would make the hub ignore them;
    - otherwise (JupyterHub 5): a `user` role with the default's `self` and the scopes.
    """
    roles = [dict(r) for r in _resolved(c, "load_roles", [])]
    user = next((r for r in roles if r.get("name") == "user"), None)
    if user is not None and "scopes" in user:
        current = list(user["scopes"] or [])
        user["scopes"] = current + [s for s in scopes if s not in current]
        c.JupyterHub.load_roles = roles
        return
    if hub_has_extra_user_scopes():
        extra = set(_resolved(c, "extra_user_scopes", set()) or ())
        c.JupyterHub.extra_user_scopes = extra | set(scopes)
        return
    if user is None:
        user = {"name": "user"}
        roles.append(user)
    user["scopes"] = ["self", *[s for s in scopes if s != "self"]]  # the default role's + ours
    c.JupyterHub.load_roles = roles


def add_roles(c: Any, *roles: dict[str, Any]) -> None:
    """Make sure `c.JupyterHub.load_roles` holds each of `roles` (the culler's and the
    service's), merged into a role of the same name the operator already has (its scopes and
    members kept, these added), whatever way the operator set their roles.

    For z2jh: it turns `hub.loadRoles` into load_roles, and later replaces the whole list with
    `hub.config.JupyterHub.load_roles` if the operator set that (jupyterhub_config.py:
    `c[section].update(cfg)` of hub.config runs after the hub.loadRoles loop); hub.extraConfig
    runs last, so roles added here survive either layout."""
    current = [dict(r) for r in _resolved(c, "load_roles", [])]
    by_name = {r.get("name"): r for r in current}
    for role in roles:
        mine = by_name.get(role["name"])
        if mine is None:
            current.append(copy.deepcopy(role))
            continue
        for key in ("scopes", "users", "services", "groups"):
            if role.get(key):
                have = list(mine.get(key) or [])
                mine[key] = have + [v for v in role[key] if v not in have]
    c.JupyterHub.load_roles = current


def add_service_roles(c: Any, *, service: str | None = None, culler: str | None = None) -> None:
    """Grant the live-offers service (`service`, its JupyterHub service name) and the culler
    (`culler`) the roles they need (fracspawner.model.hubroles), by add_roles: in z2jh's
    hub.extraConfig they hold whether the operator's roles are in hub.loadRoles or in
    hub.config.JupyterHub.load_roles."""
    from .model.hubroles import culler_role, service_role

    roles = [service_role(service)] if service else []
    if culler:
        roles.append(culler_role(culler))
    add_roles(c, *roles)
