"""`fracspawner culler`: the GPU-aware idle culler, a JupyterHub service (hub-managed or not).

Each cycle: list ready servers through the hub API, read GPU activity for all of them (one
Prometheus query, and/or each GPU server's extension), decide with the pure functions in
decide.py, then stop servers through the hub and shut kernels down through the servers.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from tornado import web
from tornado.httpclient import HTTPClientError
from tornado.httpserver import HTTPServer
from tornado.log import LogFormatter
from traitlets import Bool, Dict, Float, Integer, List, Unicode, default
from traitlets.config import Application

from ..backends import load_catalog
from ..model.catalog import IdlePolicy, parse_duration
from .decide import (
    Decision,
    GpuFacts,
    KernelFacts,
    Rules,
    ServerFacts,
    decide_kernel,
    decide_server,
)
from .extension import ExtensionReport, fetch_report, parse_report, shutdown_kernel
from .hubapi import HubClient, HubServer
from .metrics import CullerMetrics
from .podname import DEFAULT_TEMPLATE, pod_name
from .policy import PoolPolicy, policy_for_server
from .prometheus import DcgmConfig, PrometheusError, build_query, parse_result
from .prometheus import query as prom_query

# the policy without a catalog used to have its own class; benchmarks/bench_culler.py imports it
DefaultPolicy = IdlePolicy


@dataclass
class Outcome:
    server: HubServer
    decision: Decision
    gpu: GpuFacts | None = None
    kernels: list[tuple[KernelFacts, Decision]] = field(default_factory=list)
    done: bool = False  # the action was carried out (False in dry-run or on error)
    pool: str = ""  # the pool whose policy applied (metrics label)


@dataclass
class CycleResult:
    servers: int
    outcomes: list[Outcome]
    requests: int
    duration: float
    sources: dict[str, bool]

    def by_action(self, action: str) -> list[Outcome]:
        return [o for o in self.outcomes if o.decision.action == action]


class Culler(Application):
    name = "fracspawner-culler"
    description = "Stop idle JupyterHub servers and shut down idle kernels, counting GPU work."

    # --- the hub (mirrors jupyterhub-idle-culler's options where they overlap) -----------------
    url = Unicode(config=True, help="The JupyterHub API URL. Default: $JUPYTERHUB_API_URL.")
    api_token = Unicode(
        config=True,
        help="Token for the hub API and for servers (through the proxy). "
        "Default: $JUPYTERHUB_API_TOKEN, which JupyterHub sets for a hub-managed service.",
    )
    cull_every = Integer(300, config=True, help="Seconds between culling cycles.")
    concurrency = Integer(
        10, config=True, help="Most HTTP requests in flight at once (hub, servers, Prometheus)."
    )
    api_page_size = Integer(
        200,
        config=True,
        help="Users per page of GET /users (the hub caps it at its api_page_max_limit).",
    )
    request_timeout = Float(60.0, config=True, help="Seconds before an HTTP request fails.")
    dry_run = Bool(False, config=True, help="Log what would be culled, cull nothing.")
    config_file = Unicode("", config=True, help="A Python config file to load (c.Culler....).")

    # --- policy -------------------------------------------------------------------------------
    catalog = Unicode(
        "",
        config=True,
        help="The fracspawner catalog (YAML). Its `idle` section, overridable per pool, is the "
        "policy; a server's pool is its user_options['pool']. Without it the defaults below apply.",
    )
    kernel_gpu_idle = Unicode(
        "1800",
        config=True,
        help="Without a catalog: kernels holding GPU memory idle this long are shut down "
        "(seconds or '30m'; '' off).",
    )
    server_gpu_idle = Unicode(
        "7200",
        config=True,
        help="Without a catalog: servers holding a GPU idle this long are stopped ('' off).",
    )
    server_idle = Unicode(
        "28800",
        config=True,
        help="Without a catalog: servers without a GPU idle this long are stopped ('' off).",
    )
    max_age = Unicode(
        "",
        config=True,
        help="Without a catalog: servers older than this are stopped, busy or not ('' off).",
    )
    exempt_users = List(Unicode(), config=True, help="Users whose servers are never culled.")
    exempt_groups = List(
        Unicode(),
        config=True,
        help="Groups whose members' servers are never culled (needs scope read:users:groups).",
    )
    cull_default_servers = Bool(True, config=True, help="Whether default servers are culled.")
    cull_named_servers = Bool(True, config=True, help="Whether named servers are culled.")
    remove_named_servers = Bool(
        False, config=True, help="Remove culled named servers instead of only stopping them."
    )
    cull_busy_kernels = Bool(
        False,
        config=True,
        help="Shut down GPU-idle kernels even while they execute code (as jupyter-server's "
        "MappingKernelManager.cull_busy).",
    )
    max_staleness = Float(
        300.0,
        config=True,
        help="GPU data older than this (seconds) counts as missing: no culling on GPU grounds.",
    )

    # --- GPU sources --------------------------------------------------------------------------
    prometheus_url = Unicode(
        "", config=True, help="Prometheus with dcgm-exporter metrics; '' to not use Prometheus."
    )
    server_url = Unicode(
        "",
        config=True,
        help="Where servers are reached through the proxy (e.g. http://proxy-public); the "
        "culler then reads each GPU server's /api/fracspawner/gpu, which kernel culling needs "
        "(scope access:servers). '' to not use the extension.",
    )
    utilization_metrics = Dict(
        {"DCGM_FI_DEV_GPU_UTIL": 1.0, "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 100.0},
        config=True,
        help="Utilisation metrics -> factor to percent. GPU_UTIL is not reported for MIG; "
        "PROF_GR_ENGINE_ACTIVE (a 0-1 ratio) is.",
    )
    memory_metric = Unicode("DCGM_FI_DEV_FB_USED", config=True, help="GPU memory used (MiB).")
    pod_label = Unicode(
        "pod",
        config=True,
        help="Label holding the workload pod ('exported_pod' through a ServiceMonitor with "
        "honorLabels: false).",
    )
    namespace_label = Unicode(
        "namespace", config=True, help="Label holding the pod's namespace ('exported_namespace')."
    )
    namespace = Unicode(
        config=True,
        help="Namespace of the server pods; '' matches any. Default: $POD_NAMESPACE "
        "(z2jh sets it in the hub pod).",
    )
    extra_selector = Unicode(
        "", config=True, help='Extra label matchers for the dcgm series, e.g. job="dcgm".'
    )
    busy_threshold = Float(1.0, config=True, help="Utilisation (percent) that counts as busy.")
    scrape_interval = Float(
        30.0,
        config=True,
        help="dcgm-exporter's sample interval (seconds), used to tell gaps in the data.",
    )
    min_coverage = Float(
        0.8,
        config=True,
        help="Share of an idle window that samples must cover; less is a gap, never idle.",
    )
    pod_name_template = Unicode(
        DEFAULT_TEMPLATE, config=True, help="KubeSpawner.pod_name_template of the hub."
    )
    slug_scheme = Unicode(
        "safe", config=True, help="KubeSpawner.slug_scheme of the hub: 'safe' or 'escape'."
    )

    # --- metrics ------------------------------------------------------------------------------
    metrics_port = Integer(
        0, config=True, help="Serve Prometheus metrics on /metrics at this port; 0 = off."
    )
    metrics_ip = Unicode("0.0.0.0", config=True, help="Address for the /metrics server.")

    aliases = {
        "url": "Culler.url",
        "cull-every": "Culler.cull_every",
        "concurrency": "Culler.concurrency",
        "api-page-size": "Culler.api_page_size",
        "config": "Culler.config_file",
        "catalog": "Culler.catalog",
        "prometheus-url": "Culler.prometheus_url",
        "server-url": "Culler.server_url",
        "metrics-port": "Culler.metrics_port",
        "metrics-ip": "Culler.metrics_ip",
        "namespace": "Culler.namespace",
        "log-level": "Application.log_level",
    }
    flags = {
        "dry-run": ({"Culler": {"dry_run": True}}, "Log what would be culled, cull nothing."),
        "cull-busy-kernels": (
            {"Culler": {"cull_busy_kernels": True}},
            "Shut down GPU-idle kernels even while they execute code.",
        ),
    }

    @default("url")
    def _url(self) -> str:
        return os.environ.get("JUPYTERHUB_API_URL", "http://127.0.0.1:8081/hub/api")

    @default("api_token")
    def _token(self) -> str:
        return os.environ.get("JUPYTERHUB_API_TOKEN", "")

    @default("namespace")
    def _namespace(self) -> str:
        return os.environ.get("POD_NAMESPACE", "")

    _log_formatter_cls = LogFormatter

    @default("log_format")
    def _log_format(self) -> str:
        return "%(color)s[%(levelname)1.1s %(asctime)s %(name)s]%(end_color)s %(message)s"

    @default("log_level")
    def _log_level(self) -> int:
        import logging

        return logging.INFO

    # --- set-up -------------------------------------------------------------------------------
    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.metrics = CullerMetrics()
        self._catalog = None

    def initialize(self, argv: list[str] | None = None) -> None:
        super().initialize(argv)
        if self.config_file:
            self.load_config_file(self.config_file)
        if self.catalog:
            self._catalog = load_catalog(self.catalog)

    def policy_for(self, facts: ServerFacts) -> PoolPolicy:
        """The server's pool and its idle policy: the catalog's, else this culler's traits."""
        if self._catalog is not None:
            return policy_for_server(self._catalog, facts.pool, facts.gpu_slice)
        limits = (self.kernel_gpu_idle, self.server_gpu_idle, self.server_idle, self.max_age)
        return PoolPolicy(facts.pool or "", IdlePolicy(*map(parse_duration, limits)))

    def rules(self) -> Rules:
        return Rules(
            max_staleness=self.max_staleness,
            exempt_users=frozenset(self.exempt_users),
            exempt_groups=frozenset(self.exempt_groups),
            cull_default_servers=self.cull_default_servers,
            cull_named_servers=self.cull_named_servers,
            cull_busy_kernels=self.cull_busy_kernels,
        )

    def dcgm(self) -> DcgmConfig:
        return DcgmConfig(
            utilization_metrics=dict(self.utilization_metrics),
            memory_metric=self.memory_metric,
            pod_label=self.pod_label,
            namespace_label=self.namespace_label,
            namespace=self.namespace or None,
            extra_selector=self.extra_selector,
            busy_threshold=self.busy_threshold,
            scrape_interval=self.scrape_interval,
            min_coverage=self.min_coverage,
        )

    def pod_of(self, server: HubServer) -> str:
        return pod_name(
            server.facts.user, server.facts.name, self.pod_name_template, self.slug_scheme
        )

    # --- GPU facts ----------------------------------------------------------------------------
    async def prometheus_facts(
        self, hub: HubClient, servers: list[HubServer]
    ) -> dict[str, GpuFacts] | None:
        """pod name -> facts, for every pod in one query; None when Prometheus is down."""
        windows: set[int] = set()
        for s in servers:
            policy = self.policy_for(s.facts).policy
            windows.update(
                int(w) for w in (policy.server_gpu_idle, policy.server_idle) if w is not None
            )
        if not windows:
            return {}
        cfg = self.dcgm()
        hub.requests += 1
        try:
            result = await prom_query(
                hub.http,
                self.prometheus_url,
                build_query(cfg, sorted(windows)),
                timeout=self.request_timeout,
            )
        except PrometheusError as exc:
            self.log.warning(
                "GPU source prometheus is down (%s): no server is culled on GPU grounds this cycle",
                exc,
            )
            return None
        return {
            pod: facts for (_ns, pod), facts in parse_result(result, cfg, sorted(windows)).items()
        }

    async def extension_report(self, hub: HubClient, server: HubServer) -> ExtensionReport | None:
        url = server.url if "://" in server.url else self.server_url.rstrip("/") + server.url
        try:
            report = await fetch_report(hub.fetch, url, timeout=self.request_timeout)
        except (HTTPClientError, OSError, ValueError) as exc:
            self.log.warning(
                "GPU source extension failed for %s (%s): not culled on GPU grounds this cycle",
                server.facts.log_name,
                exc,
            )
            return None
        parsed = parse_report(report)
        if parsed.server is None:
            self.log.debug("%s: no GPU reading (%s)", server.facts.log_name, parsed.reason)
        return parsed

    @staticmethod
    def merge(a: GpuFacts | None, b: GpuFacts | None) -> GpuFacts | None:
        """Two sources' facts on one server: the more cautious reading of each field."""
        if a is None or b is None:
            return a or b
        # the shorter idle time wins, with the coverage that goes with it
        short = min((a, b), key=lambda f: (f.idle_for, -(f.covered_for or float("inf"))))
        return GpuFacts(
            source=f"{a.source}+{b.source}",
            observed_at=min(a.observed_at, b.observed_at),
            memory_mib=max(a.memory_mib, b.memory_mib),
            idle_for=short.idle_for,
            server_last_activity=b.server_last_activity or a.server_last_activity,
            covered_for=short.covered_for,
        )

    # --- one cycle ----------------------------------------------------------------------------
    async def cull_once(self, now: float | None = None) -> CycleResult:
        started = time.perf_counter()
        hub = HubClient(
            self.url,
            self.api_token,
            concurrency=self.concurrency,
            page_size=self.api_page_size,
            request_timeout=self.request_timeout,
        )
        try:
            result = await self._cycle(hub, now)
        finally:
            hub.close()
        result.duration = time.perf_counter() - started
        self.metrics.cycle_duration.observe(result.duration)
        self.metrics.last_cycle.set(time.time())
        self.metrics.servers.set(result.servers)
        return result

    async def _cycle(self, hub: HubClient, now: float | None) -> CycleResult:
        servers = await hub.ready_servers()
        now = time.time() if now is None else now
        sources: dict[str, bool] = {}
        prom: dict[str, GpuFacts] | None = {}
        if self.prometheus_url:
            prom = await self.prometheus_facts(hub, servers)
            sources["prometheus"] = prom is not None
            self.metrics.source_up.labels("prometheus").set(int(prom is not None))
        reports: dict[int, ExtensionReport | None] = {}
        if self.server_url:
            # only servers with a GPU slice: kernel culling is about GPU memory
            gpu_servers = [i for i, s in enumerate(servers) if s.facts.gpu_slice]
            got = await asyncio.gather(
                *(self.extension_report(hub, servers[i]) for i in gpu_servers)
            )
            reports = dict(zip(gpu_servers, got, strict=True))
            sources["extension"] = all(r is not None for r in got) if got else True

        rules = self.rules()
        outcomes = []
        for i, server in enumerate(servers):
            gpu = prom.get(self.pod_of(server)) if prom else None
            report = reports.get(i)
            gpu = self.merge(gpu, report.server if report else None)
            # A configured source that failed leaves the GPU reading incomplete: the other one
            # may miss what it would have seen (an extension cannot map host PIDs on old
            # drivers; dcgm-exporter cannot split a time-sliced GPU), so no GPU cull this cycle.
            failed = (self.prometheus_url and prom is None) or (i in reports and reports[i] is None)
            pool, policy = self.policy_for(server.facts).astuple()
            decision = decide_server(server.facts, None if failed else gpu, policy, now, rules)
            outcome = Outcome(server, decision, gpu, pool=pool)
            if not outcome.decision.cull and report is not None:
                # stale extension data: its kernel facts are stale too
                fresh = report.server is not None and (
                    now - report.server.observed_at <= rules.max_staleness
                )
                outcome.kernels = [
                    (k, decide_kernel(k, policy, now, rules)) for k in report.kernels if fresh
                ]
            outcomes.append(outcome)

        await asyncio.gather(*(self._act(hub, o, now) for o in outcomes))
        return CycleResult(len(servers), outcomes, hub.requests, 0.0, sources)

    async def _act(self, hub: HubClient, outcome: Outcome, now: float) -> None:
        facts, d = outcome.server.facts, outcome.decision
        pool = outcome.pool
        prefix = "[dry run] would " if self.dry_run else ""
        if d.gpu_failsafe:
            self.metrics.failsafe.labels(pool).inc()
        if d.cull:
            self.log.info("%sstop %s: %s (%s)", prefix, facts.log_name, d.message, d.reason)
        elif d.gpu_failsafe:
            self.log.info("keep %s: %s", facts.log_name, d.message)
        else:
            self.log.debug("keep %s: %s (%s)", facts.log_name, d.message, d.reason)
        if d.cull and not self.dry_run:
            try:
                code = await hub.stop_server(facts.user, facts.name, self.remove_named_servers)
            except (HTTPClientError, OSError) as exc:
                self.log.error("stopping %s failed: %s", facts.log_name, exc)
                return
            if code == 202:
                self.log.warning("server %s is slow to stop", facts.log_name)
            outcome.done = True
            self.metrics.culls.labels(d.reason, pool).inc()
            if outcome.gpu is not None:
                self.metrics.reclaimed.labels(pool).inc(outcome.gpu.memory_mib)
        url = outcome.server.url
        if "://" not in url:
            url = self.server_url.rstrip("/") + url
        for kernel, kd in outcome.kernels:
            kernel_id = kernel.id
            if not kd.cull:
                self.log.debug("keep kernel %s on %s: %s", kernel_id, facts.log_name, kd.message)
                continue
            self.log.info(
                "%sshut down kernel %s on %s: %s", prefix, kernel_id, facts.log_name, kd.message
            )
            if self.dry_run:
                continue
            try:
                await shutdown_kernel(hub.fetch, url, kernel_id)
            except (HTTPClientError, OSError) as exc:
                self.log.error("shutting kernel %s down failed: %s", kernel_id, exc)
                continue
            self.metrics.culls.labels(kd.reason, pool).inc()
            self.metrics.reclaimed.labels(pool).inc(kernel.gpu_memory_mib)

    # --- the service --------------------------------------------------------------------------
    def metrics_app(self) -> web.Application:
        registry = self.metrics.registry

        class MetricsHandler(web.RequestHandler):
            def get(self) -> None:
                self.set_header("Content-Type", CONTENT_TYPE_LATEST)
                self.write(generate_latest(registry))

        return web.Application([(r"/metrics", MetricsHandler)])

    async def run(self) -> None:
        if not self.api_token:
            raise SystemExit("fracspawner culler: no token (set JUPYTERHUB_API_TOKEN)")
        if self.metrics_port:
            server = HTTPServer(self.metrics_app())
            server.listen(self.metrics_port, self.metrics_ip)
            self.log.info("metrics on http://%s:%s/metrics", self.metrics_ip, self.metrics_port)
        self.log.info(
            "culling every %ss; GPU sources: %s%s",
            self.cull_every,
            ", ".join(
                n
                for n, on in (("prometheus", self.prometheus_url), ("extension", self.server_url))
                if on
            )
            or "none (plain idle timeouts only)",
            " [dry run]" if self.dry_run else "",
        )
        while True:
            try:
                result = await self.cull_once()
                self.log.info(
                    "cycle: %d servers, %d stopped, %d kernels shut down, %d requests, %.2fs",
                    result.servers,
                    sum(o.decision.cull for o in result.outcomes),
                    sum(kd.cull for o in result.outcomes for _, kd in o.kernels),
                    result.requests,
                    result.duration,
                )
            except Exception:  # the service must outlive a hub restart or a bad cycle
                self.log.exception("culling cycle failed")
            await asyncio.sleep(self.cull_every)

    def start(self) -> None:
        asyncio.run(self.run())
