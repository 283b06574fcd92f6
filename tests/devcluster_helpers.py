"""What the in-process devcluster tests share: a one-node topology and waits on pod state
through the API (deadlines, not timing assertions)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from kubernetes_asyncio import client

ONE_NODE = {"nodes": [{"name": "node-1", "capacity": {"cpu": "4", "memory": "8Gi"}}]}
NS = "default"


async def eventually(probe: Callable[[], Awaitable[Any]], what: str, timeout: float = 60) -> Any:
    """Await `probe` every 0.1 s until it returns something truthy; that value."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        result = await probe()
        if result:
            return result
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


async def finished(api: client.CoreV1Api, name: str, namespace: str = NS) -> tuple[str, str]:
    """Wait until the pod has ended (Succeeded or Failed); its phase and log."""

    async def ended() -> str | None:
        phase = (await api.read_namespaced_pod(name, namespace)).status.phase
        return phase if phase in ("Succeeded", "Failed") else None

    phase = await eventually(ended, f"{name} to finish")
    return phase, await api.read_namespaced_pod_log(name, namespace)


async def ready(api: client.CoreV1Api, name: str, namespace: str = NS) -> client.V1Pod:
    """Wait until the pod is Ready; the pod."""

    async def is_ready() -> client.V1Pod | None:
        pod = await api.read_namespaced_pod(name, namespace)
        conditions = pod.status.conditions or []
        return pod if any(c.type == "Ready" and c.status == "True" for c in conditions) else None

    return await eventually(is_ready, f"{name} to be Ready")


async def poll(probe: Callable[[], Any], what: str, timeout: float = 20) -> Any:
    """Call `probe` (not a coroutine: it reads the in-process cluster) every 0.05 s until it
    returns something truthy; that value."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not (result := probe()):
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)
    return result
