"""fracspawner: a KubeSpawner for GPU slices (fractions, memory sizes, MIG profiles)."""

from __future__ import annotations

import sys
from typing import Any

from ._version import __version__

__all__ = ["FracSpawner", "__version__", "add_user_scopes", "configure"]


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


def add_user_scopes(c: Any, *scopes: str) -> None:
    """Add scopes to JupyterHub's `user` role (every user has it) without replacing it.

    For z2jh's hub.extraConfig (which runs after z2jh loaded hub.loadRoles): a `user` role in
    an overlay's hub.loadRoles would REPLACE the operator's scope list (Helm replaces lists),
    this adds to whatever `user` role there is, or to JupyterHub's default one (`self`).
    """
    from traitlets.config import LazyConfigValue

    roles = c.JupyterHub.get("load_roles", [])
    if isinstance(roles, LazyConfigValue):  # appended to, never set: resolve the appends
        roles = roles.get_value([])
    roles = [dict(r) for r in roles]
    user = next((r for r in roles if r.get("name") == "user"), None)
    if user is None:
        user = {"name": "user", "scopes": ["self"]}
        roles.append(user)
    # a role without scopes keeps JupyterHub's default ones, `self`
    current = list(user.get("scopes") or ["self"])
    user["scopes"] = current + [s for s in scopes if s not in current]
    c.JupyterHub.load_roles = roles
