"""The slice on JupyterHub's own pages: the pending page and the home page's server list.

`fracspawner.configure` adds `templates/jupyterhub` to `c.JupyterHub.template_paths` (two small
templates extending JupyterHub's own, `{% extends "templates/..." %}`) and the template variable
`fracspawner_slice`, which JupyterHub calls with the current user (template_vars values may be
callables, JupyterHub 4.1+) and which gives the templates `fracspawner_slice(spawner)`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..choice.options import describe_offer
from ..model.errors import SliceError
from ..model.slices import parse_slice

__all__ = ["TEMPLATE_DIR", "slice_words", "template_vars"]

TEMPLATE_DIR = str(Path(__file__).resolve().parent / "templates" / "jupyterhub")


def slice_words(spawner: Any) -> str:
    """'1/4 GPU on H100 80GB (HAMi) · PyTorch (CUDA 12)', '' for a server with no GPU slice.

    From the spawn's validated choice; for a server started before a hub restart (no choice in
    memory) from its saved options, in the same words."""
    choice = getattr(spawner, "choice", None)
    if choice is not None and choice.pool is not None:
        offer = choice.offer or choice.slice
        words = f"{describe_offer(offer)} on {choice.pool.display_name}"
        if choice.image is not None:
            words += f" · {choice.image.display_name}"
        return words
    options = getattr(spawner, "user_options", None) or {}
    try:
        requested = parse_slice(options.get("gpu"), step=16)
    except SliceError:
        return ""
    if requested.kind == "none":
        return ""
    pool = options.get("pool")
    return describe_offer(requested) + (f" on {pool}" if isinstance(pool, str) and pool else "")


def template_vars() -> dict[str, Any]:
    """JupyterHub template variables: `fracspawner_slice(spawner)` on every page."""
    return {"fracspawner_slice": lambda user: slice_words}
