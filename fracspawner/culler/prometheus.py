"""GPU activity of every server pod from Prometheus (dcgm-exporter metrics), in ONE query.

The query joins several parts with `or`, each tagged by a `fracspawner_part` label through
`label_replace`: current GPU memory per pod, the newest sample's time (for staleness), and per
idle window w the maximum utilisation over w plus how well real samples cover w.

Coverage is measured from the samples' own timestamps, not from an assumed scrape interval
(dcgm-exporter collects every 30 s by default; 15 s and 60 s scrapes are common): a subquery
steps through the window (w/240, at least `min_step`) and at each step takes the age of the
newest sample, `time() - timestamp(metric)`. The window is covered when every step has a sample
within Prometheus's lookback (5 min) and the largest age stays under `max_gap`. A pod is idle
over w only when its utilisation stayed under the threshold AND the window is covered: a gap
(exporter or Prometheus down, a young series) is never idle.

Only series of the dcgm-exporter scrape job count (`job`, `DEFAULT_JOB` by default): Prometheus
sets `job` from its own configuration, so another exporter in the cluster (a tenant's pod with
scrape annotations) cannot put series for someone else's pod into it. Where honor_labels lets a
target choose its own `job`, that target can forge this one too: keep honor_labels off for
targets users control.

A pod that holds memory but has no utilisation series (MIG without
DCGM_FI_PROF_GR_ENGINE_ACTIVE: dcgm-exporter reports DCGM_FI_DEV_GPU_UTIL as 0 for MIG
instances, NVIDIA/dcgm-exporter#216, so that metric is not read for them) is "unknown". A GPU pod
missing from the answer altogether is a failed source for that pod; the caller decides that,
knowing which pods should be there.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from urllib.parse import urlencode

from tornado.httpclient import AsyncHTTPClient, HTTPRequest

from .decide import GpuFacts

PART = "fracspawner_part"
# the scrape job of dcgm-exporter: prometheus-operator names a ServiceMonitor's job after the
# Service, which NVIDIA's dcgm-exporter Helm chart names dcgm-exporter (the GPU Operator's is
# nvidia-dcgm-exporter: set Culler.dcgm_job)
DEFAULT_JOB = "dcgm-exporter"
STEPS = 240  # subquery steps per window: the resolution of gap detection


@dataclass(frozen=True)
class DcgmConfig:
    # utilisation metric -> factor to percent. DCGM_FI_DEV_GPU_UTIL is 0 for MIG instances;
    # DCGM_FI_PROF_GR_ENGINE_ACTIVE (a 0-1 ratio) is reported for them, so both are read.
    utilization_metrics: dict[str, float] = field(
        default_factory=lambda: {
            "DCGM_FI_DEV_GPU_UTIL": 1.0,
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 100.0,
        }
    )
    # metrics that mean nothing on a MIG instance: read only from series without `mig_label`
    whole_gpu_metrics: tuple[str, ...] = ("DCGM_FI_DEV_GPU_UTIL",)
    mig_label: str = "GPU_I_ID"  # set by dcgm-exporter on MIG instances' series
    memory_metric: str = "DCGM_FI_DEV_FB_USED"  # MiB
    pod_label: str = "pod"  # "exported_pod" behind a ServiceMonitor with honorLabels: false
    namespace_label: str = "namespace"  # "exported_namespace" likewise
    namespace: str | None = None  # only this namespace's pods; None: all
    # only series Prometheus scraped in this job are GPU evidence: a tenant's own exporter
    # (another job) cannot invent series for other pods. Never empty (DcgmConfig refuses it).
    job: str = DEFAULT_JOB
    job_label: str = "job"
    extra_selector: str = ""  # more matchers, e.g. 'cluster="gpu-a"'
    busy_threshold: float = 1.0  # percent
    max_gap: float = 150.0  # seconds between samples that still count as covered
    min_step: float = 15.0  # seconds: the finest subquery step

    def __post_init__(self) -> None:
        if not self.job:
            raise ValueError(
                "the dcgm-exporter job must be named: series from any other scrape job are not "
                "GPU evidence (another exporter could invent them for any pod)"
            )


def _quoted(value: str) -> str:
    """A PromQL string literal (Go's double-quoted escapes are JSON's)."""
    return json.dumps(value)


def _selector(cfg: DcgmConfig, metric: str) -> str:
    matchers = [f"{cfg.job_label}={_quoted(cfg.job)}", f'{cfg.pod_label}!=""']
    if metric in cfg.whole_gpu_metrics:
        matchers.append(f'{cfg.mig_label}=""')
    if cfg.namespace:
        matchers.append(f"{cfg.namespace_label}={_quoted(cfg.namespace)}")
    if cfg.extra_selector:
        matchers.append(cfg.extra_selector)
    return f"{metric}{{{','.join(matchers)}}}"


def _tag(expr: str, part: str) -> str:
    return f'label_replace({expr}, "{PART}", "{part}", "", "")'


def step_for(cfg: DcgmConfig, window: int) -> float:
    return max(cfg.min_step, window / STEPS)


def _duration(seconds: float) -> str:
    return f"{max(1, math.ceil(seconds * 1000))}ms"


def build_query(cfg: DcgmConfig, windows: list[int]) -> str:
    by = f"by ({cfg.namespace_label}, {cfg.pod_label})"
    parts = [_tag(f"sum {by} ({_selector(cfg, cfg.memory_metric)})", "mem")]
    for i, metric in enumerate(cfg.utilization_metrics):
        sel = _selector(cfg, metric)
        parts.append(_tag(f"max {by} (timestamp({sel}))", f"seen:{i}"))
        for w in sorted(set(windows)):
            rng = f"[{w}s:{_duration(step_for(cfg, w))}]"
            parts += [
                _tag(f"max {by} (max_over_time({sel}[{w}s]))", f"max:{w}:{i}"),
                # the oldest the newest sample got at any step: the largest gap, measured
                _tag(f"max {by} (max_over_time((time() - timestamp({sel})){rng}))", f"gap:{w}:{i}"),
                # steps that found a sample at all (none within the lookback: a long gap)
                _tag(f"min {by} (count_over_time(timestamp({sel}){rng}))", f"steps:{w}:{i}"),
            ]
    return " or ".join(parts)


def covered(cfg: DcgmConfig, window: int, gap: float | None, steps: float | None) -> bool:
    """Whether samples cover the window: a sample at every step, none too far apart."""
    if gap is None or steps is None:
        return False
    expected = math.floor(window / step_for(cfg, window))
    return steps >= expected and gap <= cfg.max_gap


def parse_result(
    result: list[dict], cfg: DcgmConfig, windows: list[int]
) -> dict[tuple[str, str], GpuFacts]:
    """(namespace, pod) -> GpuFacts for every pod in the vector the query returned."""
    metrics = list(cfg.utilization_metrics.values())
    rows: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    for series in result:
        labels = series["metric"]
        key = (labels.get(cfg.namespace_label, ""), labels.get(cfg.pod_label, ""))
        rows[key][labels.get(PART, "")] = float(series["value"][1])
    facts = {}
    for key, parts in rows.items():
        seen = [parts[f"seen:{i}"] for i in range(len(metrics)) if f"seen:{i}" in parts]
        if not seen:  # memory but no utilisation series: the pod is there, its activity unknown
            facts[key] = GpuFacts(
                source="prometheus",
                observed_at=float(result[0]["value"][0]) if result else 0.0,
                memory_mib=parts.get("mem", 0.0),
                idle_for=None,
                note="no utilisation series (MIG without DCGM_FI_PROF_GR_ENGINE_ACTIVE?)",
            )
            continue
        idle_for, covered_for = 0.0, None
        for w in sorted(set(windows)):
            peaks = [
                parts[f"max:{w}:{i}"] * scale
                for i, scale in enumerate(metrics)
                if f"max:{w}:{i}" in parts
            ]
            # the best-covered metric decides coverage (one of them may be off for MIG)
            ok = any(
                covered(cfg, w, parts.get(f"gap:{w}:{i}"), parts.get(f"steps:{w}:{i}"))
                for i in range(len(metrics))
            )
            if peaks and max(peaks) >= cfg.busy_threshold:
                covered_for = float(w)  # busy seen within w
                break
            if not ok:  # a gap within w: no more is known
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
    client: AsyncHTTPClient,
    base_url: str,
    promql: str,
    timeout: float = 30.0,
    at: float | None = None,
) -> list[dict]:
    """POST /api/v1/query (the form body carries long queries); returns the result vector.

    `at` evaluates at that unix time instead of Prometheus's now (replays, benchmarks)."""
    form = {"query": promql}
    if at is not None:
        form["time"] = f"{at:.3f}"
    req = HTTPRequest(
        base_url.rstrip("/") + "/api/v1/query",
        method="POST",
        body=urlencode(form),
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
