"""fracspawner: a KubeSpawner for GPU slices (fractions, memory sizes, MIG profiles)."""

from __future__ import annotations

from typing import Any

from ._version import __version__

__all__ = ["FracSpawner", "__version__", "configure"]


def __getattr__(name: str) -> Any:
    # Import the spawner lazily: `fracspawner plan`, the devcluster and the notebook extension
    # must not pay for importing JupyterHub and kubespawner.
    if name == "FracSpawner":
        from .hub.spawner import FracSpawner

        return FracSpawner
    raise AttributeError(name)


def configure(c: Any, *, catalog_file: str | None = None, catalog: dict | None = None) -> None:
    """Use FracSpawner with a catalog, validating the catalog NOW (at hub start-up).

    In jupyterhub_config.py (or z2jh's hub.extraConfig)::

        import fracspawner
        fracspawner.configure(c, catalog_file="/etc/jupyterhub/catalog.yaml")

    A bad catalog raises `CatalogError` naming the key, so the hub refuses to start instead of
    failing at the first spawn.
    """
    from .backends import load_catalog

    if (catalog_file is None) == (catalog is None):
        raise ValueError("fracspawner.configure: give exactly one of catalog_file= or catalog=")
    load_catalog(catalog_file if catalog_file is not None else catalog)
    c.JupyterHub.spawner_class = "fracspawner"
    # the slice on JupyterHub's pending and home pages (fracspawner.hub.pages)
    from .hub.pages import TEMPLATE_DIR, template_vars

    # after the deployment's own template paths: a site's own home.html still wins
    c.JupyterHub.template_paths = [*c.JupyterHub.get("template_paths", []), TEMPLATE_DIR]
    c.JupyterHub.template_vars = {**template_vars(), **c.JupyterHub.get("template_vars", {})}
    if catalog_file is not None:
        c.FracSpawner.catalog_file = str(catalog_file)
    else:
        c.FracSpawner.catalog = catalog
