"""What a GPU notebook is told about itself: its slice and the idle policy that applies to it.

The server extension (fracspawner.serverext.podinfo, docs/serverext.md) reads these from its
environment: the JupyterLab meter shows the slice and warns before a cull, the server shuts its
own idle GPU kernels down by `kernel_gpu_idle`, and pushes its GPU report to the culler at
`FRACSPAWNER_CULLER_URL`. Every name is reserved (fracspawner.backends.RESERVED_ENV): no user,
profile or admin environment can set or change them. CPU-only pods get none of them.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone

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
ENV_MAX_AGE = "FRACSPAWNER_MAX_AGE_SECONDS"
# when the hub started the server: the culler's max_age counts from it (decide.py
# server_deadlines), so the meter can warn before a max_age stop; a time, nothing privileged
ENV_SERVER_STARTED = "FRACSPAWNER_SERVER_STARTED"
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
    ENV_MAX_AGE,
    ENV_SERVER_STARTED,
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
        ENV_MAX_AGE: _seconds(policy.max_age),
    }


def started_env(started: datetime | None) -> dict[str, str]:
    """The hub's start time of the server (orm_spawner.started: naive UTC), ISO 8601 with 'Z'
    as the hub's API writes it; {} when not known."""
    if started is None:
        return {}
    if started.tzinfo is None:
        started = started.replace(tzinfo=timezone.utc)
    return {ENV_SERVER_STARTED: started.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")}


def notebook_env(
    choice: Choice, catalog: Catalog, culler_url: str = "", started: datetime | None = None
) -> dict[str, str]:
    """The environment a spawn of `choice` gets (pure); {} for a CPU-only spawn. `started`:
    when the hub started this spawn (None: not known, as for a Kubeflow notebook)."""
    if choice.pool is None or choice.slice.kind == "none":
        return {}
    pool = choice.pool
    env = {
        ENV_SLICE: str(choice.offer or choice.slice),
        ENV_POOL: pool.name,
        # short, it is in the meter's status bar: "H100 80GB (HAMi)" -> "H100 80GB"
        ENV_POOL_DISPLAY: re.sub(r"\s*\([^)]*\)$", "", pool.display_name) or pool.name,
        **policy_env(catalog.idle_for(pool.name)),
        **started_env(started),
    }
    if culler_url:
        env[ENV_CULLER_URL] = culler_url
    return env
