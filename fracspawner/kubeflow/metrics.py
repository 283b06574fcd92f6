"""The webhook's Prometheus metrics, in a registry of its own."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector


class CountedBy(Collector):
    """A counter whose value a function gives at each scrape (what Gauge.set_function is for
    gauges): a count something else keeps, exposed as `<name>_total`."""

    def __init__(self, name: str, documentation: str, registry: CollectorRegistry) -> None:
        self.name, self.documentation = name, documentation
        self.function: Callable[[], float] = lambda: 0.0
        registry.register(self)

    def set_function(self, function: Callable[[], float]) -> None:
        self.function = function

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(self.name, self.documentation, value=float(self.function()))


class WebhookMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.admissions = Counter(
            "fracspawner_webhook_admissions",
            "Pod and ResourceClaim admissions answered, by operation and result: mutated (the "
            "slice was applied), unchanged (already applied), skipped (no slice nor GPU asked: "
            "nothing counted, no API call; its patch may still mark a pod for KAI or Run:ai, or "
            "hide devices from env), allowed (admitted as it was), refused (an error included).",
            ["operation", "result"],
            registry=self.registry,
        )
        self.refusals = Counter(
            "fracspawner_webhook_refusals",
            "Pods and ResourceClaims refused, by reason: access, quota, invalid, guard, "
            "unavailable, error (the webhook failed on it: see its log).",
            ["reason"],
            registry=self.registry,
        )
        self.bad_requests = Counter(
            "fracspawner_webhook_bad_requests",
            "Requests that were not an AdmissionReview v1 for a pod (answered 400).",
            registry=self.registry,
        )
        self.pod_callers = Counter(
            "fracspawner_webhook_pod_callers",
            "Reviews sent from a pod's address (a tenant, never the API server; answered 403).",
            registry=self.registry,
        )
        self.duration = Histogram(
            "fracspawner_webhook_admission_duration_seconds",
            "Time to answer one AdmissionReview of a pod or a ResourceClaim, API calls included.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
        # counts since start kept by the ledger and the standings: counters (`_total`), read
        # at each scrape (they were gauges named without `_total` before: docs/kubeflow.md)
        self.conflicts = CountedBy(
            "fracspawner_webhook_quota_conflicts",
            "Writes of a namespace's quota reservations another replica's write came before "
            "(409 Conflict; the admission counted again).",
            registry=self.registry,
        )
        self.unconfirmed = CountedBy(
            "fracspawner_webhook_unconfirmed_reservations",
            "Reservations of unverified callers that ended without their pod in the watch "
            "(a pod refused after this webhook, or a forged review).",
            registry=self.registry,
        )
        self.reserved = Gauge(
            "fracspawner_webhook_reserved_gpu_equivalents",
            "GPU-equivalents admitted whose pods the API server has not listed yet.",
            registry=self.registry,
        )
