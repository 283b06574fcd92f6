"""What a GPU notebook is told about itself: its slice and the idle policy that applies to it.

The server extension (fracspawner.serverext.podinfo, docs/serverext.md) reads these from its
environment: the JupyterLab meter shows the slice and warns before a cull, the server shuts its
own idle GPU kernels down by `kernel_gpu_idle`, and pushes its GPU report to the culler at
`FRACSPAWNER_CULLER_URL`. Every name is reserved (fracspawner.backends.RESERVED_ENV): no user,
profile or admin environment can set or change them. CPU-only pods get none of them.
"""

from __future__ import annotations

import re

from ..model.catalog import Catalog, IdlePolicy
from .options import Choice

ENV_SLICE = "FRACSPAWNER_GPU_SLICE"
ENV_POOL = "FRACSPAWNER_GPU_POOL"
ENV_POOL_DISPLAY = "FRACSPAWNER_GPU_POOL_DISPLAY"
ENV_KERNEL_GPU_IDLE = "FRACSPAWNER_KERNEL_GPU_IDLE_SECONDS"
ENV_KERNEL_GPU_HIBERNATE = "FRACSPAWNER_KERNEL_GPU_HIBERNATE_SECONDS"
ENV_SERVER_GPU_IDLE = "FRACSPAWNER_SERVER_GPU_IDLE_SECONDS"
ENV_SERVER_IDLE = "FRACSPAWNER_SERVER_IDLE_SECONDS"
ENV_SERVER_UNATTENDED = "FRACSPAWNER_SERVER_UNATTENDED_SECONDS"
ENV_CULLER_URL = "FRACSPAWNER_CULLER_URL"

NOTEBOOK_ENV = (
    ENV_SLICE,
    ENV_POOL,
    ENV_POOL_DISPLAY,
    ENV_KERNEL_GPU_IDLE,
    ENV_KERNEL_GPU_HIBERNATE,
    ENV_SERVER_GPU_IDLE,
    ENV_SERVER_IDLE,
    ENV_SERVER_UNATTENDED,
    ENV_CULLER_URL,
)


def _seconds(limit: float | None) -> str:
    return "0" if limit is None else str(int(limit))  # "0" = off, as the extension reads it


def policy_env(policy: IdlePolicy) -> dict[str, str]:
    return {
        ENV_KERNEL_GPU_IDLE: _seconds(policy.kernel_gpu_idle),
        ENV_KERNEL_GPU_HIBERNATE: _seconds(policy.kernel_gpu_hibernate),
        ENV_SERVER_GPU_IDLE: _seconds(policy.server_gpu_idle),
        ENV_SERVER_IDLE: _seconds(policy.server_idle),
        ENV_SERVER_UNATTENDED: _seconds(policy.server_unattended),
    }


def notebook_env(choice: Choice, catalog: Catalog, culler_url: str = "") -> dict[str, str]:
    """The environment a spawn of `choice` gets (pure); {} for a CPU-only spawn."""
    if choice.pool is None or choice.slice.kind == "none":
        return {}
    pool = choice.pool
    env = {
        ENV_SLICE: str(choice.offer or choice.slice),
        ENV_POOL: pool.name,
        # short, it is in the meter's status bar: "H100 80GB (HAMi)" -> "H100 80GB"
        ENV_POOL_DISPLAY: re.sub(r"\s*\([^)]*\)$", "", pool.display_name) or pool.name,
        **policy_env(catalog.idle_for(pool.name)),
    }
    if culler_url:
        env[ENV_CULLER_URL] = culler_url
    return env
