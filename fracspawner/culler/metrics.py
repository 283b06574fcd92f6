"""The culler's Prometheus metrics, in a registry of its own (one per culler instance)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class CullerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.culls = Counter(
            "fracspawner_culls",
            "Servers stopped and kernels shut down by the culler, by reason and pool.",
            ["reason", "pool"],
            registry=self.registry,
        )
        self.reclaimed = Counter(
            "fracspawner_reclaimed_gpu_memory_mib",
            "GPU memory (MiB) held by the servers and kernels the culler ended.",
            ["pool"],
            registry=self.registry,
        )
        self.failsafe = Counter(
            "fracspawner_culler_gpu_failsafe",
            "Decisions made without fresh GPU data: only the plain idle timeout applied.",
            ["pool"],
            registry=self.registry,
        )
        # GPU hibernation (issue 22): what servers report of their kernels' suspends and resumes
        self.hibernated = Gauge(
            "fracspawner_hibernated_bytes",
            "GPU memory (bytes) that hibernated kernels hold in host memory (a copy under way "
            "included), by pool, from the servers' latest reports.",
            ["pool"],
            registry=self.registry,
        )
        self.hibernations = Counter(
            "fracspawner_hibernations",
            "Kernels whose GPU state their server suspended to host memory, by pool.",
            ["pool"],
            registry=self.registry,
        )
        self.resumes = Counter(
            "fracspawner_resumes",
            "Hibernated kernels resumed (on a message or the meter's Resume), by pool.",
            ["pool"],
            registry=self.registry,
        )
        self.hibernation_duration = Histogram(
            "fracspawner_hibernation_duration_seconds",
            "Time a suspend or a resume took (operation: hibernate | resume); a resume is what "
            "the user waits for before the cell runs.",
            ["operation"],
            buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120),
            registry=self.registry,
        )
        # over-commit's swap (pressure.py): what the culler asked, and GPUs short of memory
        self.swap_orders = Counter(
            "fracspawner_swap_orders",
            "Idle kernels the culler asked their server to swap out of a GPU under memory "
            "pressure (over-committed pools), by pool: one per kernel per order, however often "
            "it is asked again while still on the GPU.",
            ["pool"],
            registry=self.registry,
        )
        self.swap_orders_held = Counter(
            "fracspawner_swap_orders_held_by_host_budget",
            "Swap orders the node's host memory budget for hibernated kernels had no room for "
            "(the idle kernel stayed on the GPU under memory pressure), by pool: one per kernel "
            "per order, however often it is held again. Rising while kernels wait to resume: "
            "the budget, not the GPU, limits the pool.",
            ["pool"],
            registry=self.registry,
        )
        self.gpus_under_pressure = Gauge(
            "fracspawner_gpus_under_memory_pressure",
            "GPUs of over-committed pools whose resident memory plus what waits to resume "
            "exceeds their size minus the margin, at the latest report from each.",
            registry=self.registry,
        )
        self.cycle_duration = Histogram(
            "fracspawner_culler_cycle_duration_seconds",
            "Time one culling cycle took.",
            buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
            registry=self.registry,
        )
        self.last_cycle = Gauge(
            "fracspawner_culler_last_cycle_timestamp_seconds",
            "Unix time the last culling cycle finished.",
            registry=self.registry,
        )
        self.servers = Gauge(
            "fracspawner_culler_servers",
            "Ready servers seen in the last cycle.",
            registry=self.registry,
        )
        self.missing_scope = Gauge(
            "fracspawner_culler_missing_scope",
            "1 for each scope the culler needs that its hub token lacks (checked at start and "
            "on a 403): while any is 1 the culler cannot list or stop servers.",
            ["scope"],
            registry=self.registry,
        )
        # the Kubeflow culler (culler/kubeflow.py) with a list of namespaces: the label's values
        # are that list, the admin's configuration, never a tenant's text. Not `namespace`: a
        # ServiceMonitor's scrape sets that label to the culler's own namespace, and would
        # rename this one exported_namespace
        self.namespace_unreadable = Gauge(
            "fracspawner_culler_namespace_unreadable",
            "1 for each namespace of the Kubeflow culler's list (kubeflowCuller.namespaces) it "
            "could not read in the last cycle (a list answered 403, or failed): its notebooks "
            "were kept, not judged; 0 for each it read.",
            ["kubeflow_namespace"],
            registry=self.registry,
        )
        self.source_up = Gauge(
            "fracspawner_culler_gpu_source_up",
            "1 if the GPU source answered in the last cycle, else 0.",
            ["source"],
            registry=self.registry,
        )
