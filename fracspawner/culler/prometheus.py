"""GPU activity of every server pod from Prometheus (dcgm-exporter metrics), in ONE query.

The query joins several parts with `or`, each tagged by a `fracspawner_part` label through
`label_replace`: current GPU memory per pod, the newest sample's time (for staleness), and per
idle window w the maximum utilisation over w and the number of samples in w (for gaps).
A pod is idle over w only when its utilisation stayed under the threshold for the whole window
AND the samples cover the window: a gap (exporter or Prometheus down) never reads as idle.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from urllib.parse import urlencode

from tornado.httpclient import AsyncHTTPClient, HTTPRequest

from .decide import GpuFacts

PART = "fracspawner_part"


@dataclass(frozen=True)
class DcgmConfig:
    # utilisation metric -> factor to percent. DCGM_FI_DEV_GPU_UTIL is not reported for MIG
    # instances; DCGM_FI_PROF_GR_ENGINE_ACTIVE (a 0-1 ratio) is, so both are read by default.
    utilization_metrics: dict[str, float] = field(
        default_factory=lambda: {
            "DCGM_FI_DEV_GPU_UTIL": 1.0,
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 100.0,
        }
    )
    memory_metric: str = "DCGM_FI_DEV_FB_USED"  # MiB
    pod_label: str = "pod"  # "exported_pod" behind a ServiceMonitor with honorLabels: false
    namespace_label: str = "namespace"  # "exported_namespace" likewise
    namespace: str | None = None  # only this namespace's pods; None: all
    extra_selector: str = ""  # e.g. 'job="dcgm-exporter"'
    busy_threshold: float = 1.0  # percent
    scrape_interval: float = 30.0  # seconds; dcgm-exporter's default collection interval
    min_coverage: float = 0.8  # share of a window the samples must cover to call it idle


def _selector(cfg: DcgmConfig, metric: str) -> str:
    matchers = [f'{cfg.pod_label}!=""']
    if cfg.namespace:
        matchers.append(f'{cfg.namespace_label}="{cfg.namespace}"')
    if cfg.extra_selector:
        matchers.append(cfg.extra_selector)
    return f"{metric}{{{','.join(matchers)}}}"


def _tag(expr: str, part: str) -> str:
    return f'label_replace({expr}, "{PART}", "{part}", "", "")'


def build_query(cfg: DcgmConfig, windows: list[int]) -> str:
    by = f"by ({cfg.namespace_label}, {cfg.pod_label})"
    parts = [_tag(f"sum {by} ({_selector(cfg, cfg.memory_metric)})", "mem")]
    for i, metric in enumerate(cfg.utilization_metrics):
        sel = _selector(cfg, metric)
        parts.append(_tag(f"max {by} (timestamp({sel}))", f"seen:{i}"))
        for w in sorted(set(windows)):
            parts.append(_tag(f"max {by} (max_over_time({sel}[{w}s]))", f"max:{w}:{i}"))
            parts.append(_tag(f"max {by} (count_over_time({sel}[{w}s]))", f"count:{w}:{i}"))
    return " or ".join(parts)


def parse_result(
    result: list[dict], cfg: DcgmConfig, windows: list[int]
) -> dict[tuple[str, str], GpuFacts]:
    """(namespace, pod) -> GpuFacts from the vector the query returned."""
    metrics = list(cfg.utilization_metrics.values())
    rows: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    for series in result:
        labels = series["metric"]
        key = (labels.get(cfg.namespace_label, ""), labels.get(cfg.pod_label, ""))
        rows[key][labels.get(PART, "")] = float(series["value"][1])
    facts = {}
    for key, parts in rows.items():
        seen = [parts[f"seen:{i}"] for i in range(len(metrics)) if f"seen:{i}" in parts]
        if not seen:  # memory but no utilisation: activity unknown, so no facts at all
            continue
        idle_for, covered_for = 0.0, None
        for w in sorted(set(windows)):
            peaks = [
                parts[f"max:{w}:{i}"] * scale
                for i, scale in enumerate(metrics)
                if f"max:{w}:{i}" in parts
            ]
            counts = [parts.get(f"count:{w}:{i}", 0.0) for i in range(len(metrics))]
            covered = max(counts, default=0.0) * cfg.scrape_interval >= cfg.min_coverage * w
            if peaks and max(peaks) >= cfg.busy_threshold:
                covered_for = float(w)  # busy seen within w
                break
            if not covered:  # a gap within w: no more is known
                covered_for = idle_for
                break
            idle_for = float(w)  # every longer window holds the same busy sample or gap
        if covered_for is None:  # idle over every window: known back to the longest one
            covered_for = idle_for
        facts[key] = GpuFacts(
            source="prometheus",
            observed_at=max(seen),
            memory_mib=parts.get("mem", 0.0),
            idle_for=idle_for,
            covered_for=covered_for,
        )
    return facts


class PrometheusError(Exception):
    pass


async def query(
    client: AsyncHTTPClient, base_url: str, promql: str, timeout: float = 30.0
) -> list[dict]:
    """POST /api/v1/query (the form body carries long queries); returns the result vector."""
    req = HTTPRequest(
        base_url.rstrip("/") + "/api/v1/query",
        method="POST",
        body=urlencode({"query": promql}),
        headers={"Content-Type": "application/x-www-form-urlencoded"},
        request_timeout=timeout,
    )
    try:
        resp = await client.fetch(req, raise_error=False)
    except OSError as exc:
        raise PrometheusError(f"Prometheus at {base_url} unreachable: {exc}") from exc
    if resp.code == 599:
        raise PrometheusError(f"Prometheus at {base_url} unreachable: {resp.error}")
    try:
        body = json.loads(resp.body or b"{}")
    except ValueError as exc:
        raise PrometheusError(f"Prometheus answered {resp.code} with non-JSON") from exc
    if resp.code != 200 or body.get("status") != "success":
        raise PrometheusError(
            f"Prometheus answered {resp.code}: {body.get('errorType')}: {body.get('error')}"
        )
    if body["data"].get("resultType") != "vector":
        raise PrometheusError(f"expected a vector, got {body['data'].get('resultType')}")
    return body["data"]["result"]
