"""GPU facts from a server's own extension (`/api/fracspawner/gpu`), reached through the proxy.

This source alone knows kernels, so kernel culling needs it; it costs one request per GPU server
per cycle. The token needs `access:servers`. `no_track_activity` keeps the culler's own requests
out of the server's activity (the proxy still sees them: see GpuFacts.server_last_activity).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from dateutil.parser import isoparse
from tornado.httpclient import HTTPRequest, HTTPResponse

from .decide import GpuFacts, KernelFacts


def ts(value: str | None) -> float | None:
    return None if not value else isoparse(value).timestamp()


@dataclass(frozen=True)
class ExtensionReport:
    server: GpuFacts | None  # None where the server has no readable GPU
    kernels: list[KernelFacts]
    reason: str | None = None  # why GPU data is unavailable


def parse_report(report: dict) -> ExtensionReport:
    """Map the extension's JSON onto decision facts (pure)."""
    if not report.get("available"):
        return ExtensionReport(None, [], reason=report.get("reason") or "unavailable")
    observed = ts(report["sampled_at"])
    started = ts(report.get("monitor_started")) or observed
    assert observed is not None

    def idle_since(last_gpu: str | None) -> float:
        # never seen busy: idle at least since the monitor started watching
        return ts(last_gpu) or started

    server = GpuFacts(
        source="extension",
        observed_at=observed,
        memory_mib=float(report.get("gpu_memory_mib") or 0.0),
        idle_for=max(0.0, observed - idle_since(report.get("last_gpu_activity"))),
        server_last_activity=ts(report.get("server_last_activity")),
        covered_for=max(0.0, observed - started),
    )
    kernels = [
        KernelFacts(
            id=k["id"],
            last_activity=ts(k.get("last_activity")),
            execution_state=k.get("execution_state") or "unknown",
            gpu_memory_mib=float(k.get("gpu_memory_mib") or 0.0),
            gpu_idle_for=(
                max(0.0, observed - idle_since(k.get("last_gpu_activity")))
                if k.get("gpu_activity_known", True)
                else None
            ),
        )
        for k in report.get("kernels", [])
    ]
    return ExtensionReport(server, kernels)


Fetch = Callable[[HTTPRequest], Awaitable[HTTPResponse]]


async def fetch_report(fetch: Fetch, server_url: str, timeout: float = 10.0) -> dict:
    """GET the server's GPU report; `fetch` adds the culler's token (access:servers)."""
    req = HTTPRequest(
        server_url.rstrip("/") + "/api/fracspawner/gpu?no_track_activity=1",
        request_timeout=timeout,
        follow_redirects=False,
    )
    resp = await fetch(req)
    return json.loads(resp.body)


async def shutdown_kernel(fetch: Fetch, server_url: str, kernel_id: str) -> None:
    req = HTTPRequest(f"{server_url.rstrip('/')}/api/kernels/{kernel_id}", method="DELETE")
    await fetch(req)
