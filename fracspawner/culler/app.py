"""`fracspawner culler`: the GPU-aware idle culler, a JupyterHub service (hub-managed or not).

Each cycle: list ready servers through the hub API, read GPU activity for all of them (one
Prometheus query, and the reports servers pushed), decide with the pure functions in
decide.py, then stop servers through the hub. The culler never calls into a user's server, and
its token goes to the hub only: servers push their reports to its endpoint (receiver.py) with
their own tokens, and shut their idle GPU kernels down themselves (fracspawner.serverext).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlparse

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from tornado import web
from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.httpserver import HTTPServer
from traitlets import Bool, Dict, Float, Integer, List, TraitError, Unicode, default, validate

from ..backends import load_catalog
from ..choice.admission import ROOM_TAG_KEY_ENV
from ..model.catalog import DEFAULT_IDLE, IdlePolicy, parse_duration
from ..model.hubroles import CULLER_SCOPES, missing_scopes, scope_problem
from .away import RELEASABLE, release_at, room_for_waiting, smallest_waiting
from .base import CullerApplication
from .decide import Decision, GpuFacts, Reading, Rules, ServerFacts, combine, decide_server
from .hostbudget import Holder, Want, plan_evictions
from .hostroom import UNKNOWN_MIB, HostRoom
from .hubapi import HubClient, HubServer
from .identity import Identity, TokenVerifier, token_key
from .keep import Kept, may_keep, releasable, released, tabs_closed, waited, waiting_mib
from .nodememory import node_budget_mib
from .placement import Placement
from .podname import DEFAULT_TEMPLATE, pod_name
from .policy import PoolPolicy, gpu_windows, policy_for_server, slice_memory_cap
from .prometheus import DEFAULT_JOB, DcgmConfig, PrometheusError, build_query, parse_result
from .prometheus import query as prom_query
from .receiver import MAX_BODY, ReportRate, receiver_app, report_server
from .reports import EVENTS_PER_HOUR, CulledKernel, ReportStore, ServerReport, shown
from .room import gpu_rooms
from .shared import own_share
from .state import CullerState, CullEvent, server_row
from .stateapi import state_handler
from .swapdesk import Seat, SwapDesk, pool_enforced, seats_from
from .unlisted import unlisted_seats


def _seconds(value: float | None) -> str:
    return "" if value is None else str(int(value))


def swap_orders(answer: dict | None) -> list[dict]:
    """The swap orders (`swap.hibernate`) an answer to a report carries, none where it has none."""
    return ((answer or {}).get("swap") or {}).get("hibernate") or []


@dataclass
class Outcome:
    server: HubServer
    decision: Decision
    gpu: GpuFacts | None = None
    done: bool = False  # the action was carried out (False in dry-run or on error)
    pool: str = ""  # the pool whose policy applied (metrics label)


class HubRefused(Exception):
    """The hub answered 403 to the culler's own token (its scopes were checked and said)."""


@dataclass
class CycleResult:
    servers: int
    outcomes: list[Outcome]
    requests: int
    duration: float
    sources: dict[str, bool]


class Culler(CullerApplication):
    name = "fracspawner-culler"
    description = "Stop idle JupyterHub servers, counting GPU work; never calls into them."

    # --- the hub (mirrors jupyterhub-idle-culler's options where they overlap) -----------------
    url = Unicode(config=True, help="The JupyterHub API URL. Default: $JUPYTERHUB_API_URL.")
    api_token = Unicode(
        config=True,
        help="Token for the hub API (sent to the hub only, never to a user's server). "
        "Default: $JUPYTERHUB_API_TOKEN, which JupyterHub sets for a hub-managed service.",
    )
    cull_every = Integer(300, config=True, help="Seconds between culling cycles.")
    cull_when_waiting = Float(
        15.0,
        config=True,
        help="Seconds after the pod watch sees a server pod waiting for a node (made, not "
        "scheduled: the hub's admission \"wait\") that a cycle runs before cull_every's next, "
        "if the pod still waits then, so that a slot whose person left is released for it "
        "within a minute (release_away_after) rather than at the next cycle. 0: off.",
    )
    concurrency = Integer(
        10, config=True, help="Most HTTP requests in flight at once (hub, Prometheus)."
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
    server_gpu_idle = Unicode(
        _seconds(DEFAULT_IDLE.server_gpu_idle),
        config=True,
        help="Without a catalog: servers holding a GPU, GPU and activity idle this long, are "
        "stopped (seconds or '1h'; '' off).",
    )
    server_idle = Unicode(
        _seconds(DEFAULT_IDLE.server_idle),
        config=True,
        help="Without a catalog: servers idle this long are stopped ('' off).",
    )
    server_unattended = Unicode(
        _seconds(DEFAULT_IDLE.server_unattended),
        config=True,
        help="Without a catalog: servers without user activity this long are stopped even while "
        "their GPU is busy ('' off).",
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
    max_staleness = Float(
        300.0,
        config=True,
        help="GPU data older than this (seconds) counts as missing: no culling on GPU grounds.",
    )

    # --- GPU sources --------------------------------------------------------------------------
    prometheus_url = Unicode(
        "", config=True, help="Prometheus with dcgm-exporter metrics; '' to not use Prometheus."
    )
    report_url = Unicode(
        config=True,
        help="Where this culler listens for the GPU reports servers push (e.g. "
        "http://0.0.0.0:10101); servers reach it at FracSpawner.culler_url. Default: "
        "$JUPYTERHUB_SERVICE_URL (a hub-managed service with a url). '' = no reports: the "
        "extension is then no GPU source.",
    )
    report_prefix = Unicode(
        config=True,
        help="URL prefix of the report endpoint ({prefix}api/reports). "
        "Default: $JUPYTERHUB_SERVICE_PREFIX, else '/'.",
    )
    room_tag_key = Unicode(
        config=True,
        help="The key of the server tags in the room answer (GET api/room), which any server's "
        "token may read: HMAC-SHA256 of user/server with it, so that nobody can tell whose "
        "server a tag is. Must be FracSpawner.room_tag_key's (the hub finds its own spawns by "
        "them; a different key only makes its admission more cautious). Default: "
        "$FRACSPAWNER_ROOM_TAG_KEY (the chart sets it from a Secret it generates). '' = plain "
        "SHA-256, which anyone who can guess a username can compute (a warning at start).",
    )
    token_cache_seconds = Float(
        300.0,
        config=True,
        help="How long the hub's answer about a server's token is reused (seconds).",
    )
    token_cache_size = Integer(
        10000,
        config=True,
        help="Most tokens whose hub answer is remembered (least recently used evicted).",
    )
    unknown_token_rate = Float(
        5.0,
        config=True,
        help="Reports per second (bursts of 10 times this) with a token the hub has not "
        "vouched for that one source address may make the culler ask the hub about; more are "
        "answered 429. A token the hub accepted once does not count.",
    )
    unknown_token_rate_total = Float(
        20.0,
        config=True,
        help="The same over all addresses together (bursts of 10 times this): bounds the hub "
        "requests random tokens can cause.",
    )
    service_api_token = Unicode(
        config=True,
        help="The fracspawner service's hub token (default $FRACSPAWNER_SERVICE_API_TOKEN; the "
        "chart sets it from the service's secret): the admin page's state calls with it spend "
        "a budget of their own before the hub has vouched for it (after a culler restart), "
        "never the one random tokens spend. Only its SHA-256 is used. '' = none.",
    )
    report_rate = Float(
        3.0,
        config=True,
        help="Reports a minute one server (and one token) may send, in bursts of "
        "report_burst; more are answered 429 with Retry-After. The extension sends one a "
        "minute.",
    )
    report_burst = Float(
        5.0, config=True, help="Reports one server may send at once (see report_rate)."
    )
    report_events_per_hour = Integer(
        EVENTS_PER_HOUR,
        config=True,
        help="Kernel shutdowns, and as many hibernations and resumes, counted per server an "
        "hour (metrics and the admin page's history); a server reporting more has the rest "
        "ignored, with a warning.",
    )
    watch_server_pods = Bool(
        False,
        config=True,
        help="Watch the hub's server pods (list and watch pods in `namespace`, labelled "
        "server_pod_selector; RBAC: pods list, watch) so that reports from their addresses "
        "spend a budget of their own for tokens the hub has not vouched for yet: after a "
        "culler restart, random tokens from other pods cannot make real servers' first "
        "reports wait.",
    )
    watch_dra_claims = Bool(
        False,
        config=True,
        help="With watch_server_pods, also watch the ResourceClaims in `namespace` and the "
        "cluster's ResourceSlices (RBAC: resourceclaims list, watch in the namespace; "
        "resourceslices list, watch: the chart grants them with dra.enabled), so that a DRA "
        "pool's server is bound to the GPUs its claims were allocated, by the UUIDs the "
        "slices publish. Without it a DRA server is bound by its pod's node and GPU count.",
    )
    server_pod_selector = Unicode(
        "component=singleuser-server",
        config=True,
        help="Label selector of the hub's server pods (KubeSpawner's component label).",
    )
    kubeconfig = Unicode(
        "",
        config=True,
        help="Kubeconfig for the server pod watch; '' = in-cluster config inside a pod, else "
        "$KUBECONFIG or ~/.kube/config.",
    )
    server_url = Unicode(
        "",
        config=True,
        help="Removed: the culler no longer calls into user servers (they push reports to "
        "report_url). Setting it stops the culler with a message saying so.",
    )
    utilization_metrics = Dict(
        {"DCGM_FI_DEV_GPU_UTIL": 1.0, "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 100.0},
        config=True,
        help="Utilisation metrics -> factor to percent. GPU_UTIL is 0 for MIG instances (not "
        "read there); PROF_GR_ENGINE_ACTIVE (a 0-1 ratio) is reported for them.",
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
    dcgm_job = Unicode(
        DEFAULT_JOB,
        config=True,
        help="The Prometheus scrape job of dcgm-exporter (its `job` label; a ServiceMonitor's "
        "job is its Service's name: dcgm-exporter for NVIDIA's chart, nvidia-dcgm-exporter for "
        "the GPU Operator). Only this job's series are GPU evidence; never empty.",
    )
    extra_selector = Unicode(
        "", config=True, help='More label matchers for the dcgm series, e.g. cluster="a".'
    )
    busy_threshold = Float(1.0, config=True, help="Utilisation (percent) that counts as busy.")
    max_sample_gap = Float(
        150.0,
        config=True,
        help="Seconds between two samples (by their own timestamps) beyond which a window has a "
        "gap and is never idle. Above dcgm-exporter's interval: 15, 30 and 60 s all work.",
    )
    coverage_step = Float(
        15.0,
        config=True,
        help="Finest step (seconds) at which sample timestamps are checked for gaps; windows "
        "longer than 240 steps use window/240.",
    )
    pod_name_template = Unicode(
        DEFAULT_TEMPLATE, config=True, help="KubeSpawner.pod_name_template of the hub."
    )
    slug_scheme = Unicode(
        "safe", config=True, help="KubeSpawner.slug_scheme of the hub: 'safe' or 'escape'."
    )

    # --- over-commit and swap (pressure.py) ------------------------------------------------------
    swap_margin_mib = Float(
        None,
        allow_none=True,
        config=True,
        help="On pools with overcommit above 1: GPU memory (MiB) kept free on each GPU; beyond "
        "its size minus this, the least recently used idle kernels on it are swapped out to host "
        "memory (their server is told in the answer to its report). Default: the pool's largest "
        "slice, so one more of it fits at once, at most half the GPU's memory.",
    )
    grant_margin_mib = Float(
        4096.0,
        config=True,
        help="GPU memory (MiB) on each GPU of a pool that limits memory to the slice (HAMi) "
        "that the culler never grants to kernels waiting to resume (grants.py; at most 1/16 of "
        "the GPU, and never more than the GPU leaves beyond the kernel). There the pod's NVML is "
        "its slice's, so the grant is the only check, and what the culler counts comes from "
        "reports up to a report interval old: a co-tenant that grew since, or made its first "
        "allocation, holds memory no report showed yet, and a restore that meets CUDA "
        "out-of-memory loses the kernel's GPU state for good (NVIDIA/cuda-checkpoint#44). "
        "Elsewhere the server's own reading, a moment old, must show the room (no margin "
        "here). 4096: the culler benchmark's breaks mix met a co-tenant grown 2,093 MiB since "
        "its last report and a first allocation that left an 8 GiB restore 2,409 MiB short.",
    )
    keep_hibernated_servers = Bool(
        False,
        config=True,
        help="On pools where hibernation frees memory others use (time-slicing, MPS, "
        "overcommit > 1): an idle server whose kernels are all hibernated is stopped for "
        "server_gpu_idle only while a server pod of its pool waits for a node, least recently "
        "active first (keep.py); otherwise server_idle, server_unattended and max_age still stop "
        "it. Needs the pod watch (watch_server_pods). Turn it on where the hub's admission is "
        '"wait" (FracSpawner.admission): a spawn refused at once makes no pod, so under '
        '"refuse" newcomers would be refused while kept servers hold the slots.',
    )
    release_away_after = Float(
        900.0,
        allow_none=True,
        config=True,
        help='While a server pod of a pool waits for a node (the hub\'s admission "wait"; '
        "seen by the pod watch), servers of that pool whose person left this many seconds ago "
        "are stopped for it, least recently active first, until the slices they free cover "
        "those waiting (away.py): a tab of theirs reported them once and none keeps them "
        "present or in session now, no activity, no GPU work, no cell running, no resume "
        "waiting. Sooner than server_gpu_idle, and only where someone waits. None or 0: off.",
    )
    release_tab_open_after = Float(
        300.0,
        config=True,
        help="A server whose person left a tab of it open (hidden, or on a desk past its "
        "session) is released for a pod waiting for a node (keep_hibernated_servers, "
        "release_away_after) only once a pod of its pool has waited this many seconds; those "
        "whose person closed every tab go at once. Such a tab's person is often back within "
        "minutes (keep.py). 0: at once.",
    )
    host_memory_budget_mib = Float(
        None,
        allow_none=True,
        config=True,
        help="Host memory (MiB) the hibernated kernels of the servers on one node may keep in "
        "all (their GPU state, copied to host memory; hostbudget.py): beyond it the oldest are "
        "shut down by their servers, those of servers above an equal share first; never one "
        "whose resume waits, nor a present user's. Needs the pod watch (watch_server_pods) to "
        "know each server's node. None (default): each node's budget is "
        "host_memory_budget_fraction of its allocatable memory, 65,536 MiB where that is not "
        "known; a number: that budget on every node (and no node watch); 0: no budget (each "
        "pod's memory limit still bounds its own).",
    )
    host_memory_budget_fraction = Float(
        0.25,
        config=True,
        help="Where host_memory_budget_mib is None: the share of each node's allocatable memory "
        "(its Node's status.allocatable.memory, from a node watch beside the pod watch; RBAC: "
        "nodes list, watch) its servers' hibernated kernels may keep. The rest is the pods' own: "
        "the scheduler has promised it to their memory requests, and a node short of memory "
        "makes the kubelet evict the pods using most beyond their requests first, the very pods "
        "holding hibernated state (nodememory.py, docs/culler.md). Above 0, at most 1.",
    )

    @validate("host_memory_budget_fraction")
    def _share(self, proposal: Any) -> float:
        value = proposal["value"]
        if not 0.0 < value <= 1.0:  # 0 would read as "no budget": unlimited, never meant here
            raise TraitError(
                f"Culler.host_memory_budget_fraction must be above 0 and at most 1 (a share of "
                f"each node's allocatable memory), not {value!r}; to turn the budget off set "
                "Culler.host_memory_budget_mib = 0"
            )
        return float(value)

    swap_report_in = Float(
        20.0,
        config=True,
        help="Seconds after which the servers on a GPU under memory pressure are asked to report "
        "again (they report every minute otherwise), so a swap is told in time; keep it at "
        "least 60 / report_rate.",
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
        "report-url": "Culler.report_url",
        "server-url": "Culler.server_url",
        "metrics-port": "Culler.metrics_port",
        "metrics-ip": "Culler.metrics_ip",
        "namespace": "Culler.namespace",
        "log-level": "Application.log_level",
    }
    flags = {
        "dry-run": ({"Culler": {"dry_run": True}}, "Log what would be culled, cull nothing."),
    }

    @default("url")
    def _url(self) -> str:
        return os.environ.get("JUPYTERHUB_API_URL", "http://127.0.0.1:8081/hub/api")

    @default("api_token")
    def _token(self) -> str:
        return os.environ.get("JUPYTERHUB_API_TOKEN", "")

    @default("service_api_token")
    def _default_service_api_token(self) -> str:
        return os.environ.get("FRACSPAWNER_SERVICE_API_TOKEN", "")

    @default("namespace")
    def _namespace(self) -> str:
        return os.environ.get("POD_NAMESPACE", "")

    @default("report_url")
    def _report_url(self) -> str:
        return os.environ.get("JUPYTERHUB_SERVICE_URL", "")

    @default("report_prefix")
    def _report_prefix(self) -> str:
        return os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/")

    @default("room_tag_key")
    def _room_tag_key(self) -> str:
        return os.environ.get(ROOM_TAG_KEY_ENV, "")

    # --- set-up -------------------------------------------------------------------------------
    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self._catalog = None
        self.reports = ReportStore()
        self._verifier: TokenVerifier | None = None
        # the hub's record of every ready server (the last cycle's list): what a report may
        # claim (its pool, its slice's memory) comes from here, never from the report
        self.known: dict[tuple[str, str], ServerFacts] = {}
        self.listed_at: float | None = None  # when the hub last listed them (room_json)
        self._hibernated_labels: set[str] = set()
        self._swap_desk: SwapDesk | None = None  # over-commit's swap orders (swapdesk.py)
        # swap orders counted, per server: kernel id -> how ("sent", "held"), while the kernel
        # is on the GPU (`_count_orders`: a re-ask of a standing order is not counted again)
        self._orders_counted: dict[tuple[str, str], dict[str, set[str]]] = {}
        self._host_room = HostRoom()  # room given to hibernate, per node (hostroom.py)
        self._host_over: set[tuple[str, str]] = set()  # reports beyond their share: logged once
        self._host_silent: set[tuple[str, str]] = set()  # stale or no report: logged once
        self._began = time.time()  # a server unheard of since is expected silent for a while
        self._pod_names: dict[tuple[str, str], str] = {}  # placement_of's names, per server
        self._caps: dict[tuple[str | None, str | None], float | None] = {}  # claim()'s sizes
        self._caps_of: object = None  # ... for this catalog
        # this cycle's readings and decisions (`decide`), by id of the objects they came from
        self._readings: dict[int, tuple[Any, ...]] = {}
        self._decided: dict[int, tuple[Any, ...]] = {}
        # what the culler's own token lacks (check_scopes); "" / [] when nothing or not known
        self.scopes_missing: list[str] = []
        self.scope_problem = ""
        self.server_pods: Any = None  # serverpods.ServerPods while watch_server_pods
        # the admin page's view (GET .../api/state): last cycle + bounded 24 h history
        self.state = CullerState(time.time())

    def initialize(self, argv: list[str] | None = None) -> None:
        super().initialize(argv)
        if self.config_file:
            self.load_config_file(self.config_file)
        if self.server_url:
            raise SystemExit(
                "fracspawner culler: --server-url was removed: the culler no longer calls into "
                "user servers (it would hand them its token). Servers push their GPU reports to "
                "the culler instead: set --report-url here and FracSpawner.culler_url in the "
                "hub (docs/culler.md)."
            )
        if self.prometheus_url and not self.dcgm_job:
            raise SystemExit(
                "fracspawner culler: Culler.dcgm_job is empty: name dcgm-exporter's scrape job "
                "(series from any other job are not GPU evidence; docs/culler.md)"
            )
        if self.catalog:
            self._catalog = load_catalog(self.catalog)

    @property
    def reports_enabled(self) -> bool:
        return bool(self.report_url)

    def policy_for(self, facts: ServerFacts) -> PoolPolicy:
        """The server's pool and its idle policy: the catalog's, else this culler's traits."""
        if self._catalog is not None:
            return policy_for_server(self._catalog, facts.pool, facts.gpu_slice)
        return PoolPolicy(
            facts.pool or "",
            IdlePolicy(
                kernel_gpu_idle=None,  # kernels are the servers' own business (serverext)
                server_gpu_idle=parse_duration(self.server_gpu_idle),
                server_idle=parse_duration(self.server_idle),
                max_age=parse_duration(self.max_age),
                server_unattended=parse_duration(self.server_unattended),
            ),
        )

    def rules(self) -> Rules:
        return Rules(
            max_staleness=self.max_staleness,
            exempt_users=frozenset(self.exempt_users),
            exempt_groups=frozenset(self.exempt_groups),
            cull_default_servers=self.cull_default_servers,
            cull_named_servers=self.cull_named_servers,
        )

    def dcgm(self) -> DcgmConfig:
        return DcgmConfig(
            utilization_metrics=dict(self.utilization_metrics),
            memory_metric=self.memory_metric,
            pod_label=self.pod_label,
            namespace_label=self.namespace_label,
            namespace=self.namespace or None,
            job=self.dcgm_job,
            extra_selector=self.extra_selector,
            busy_threshold=self.busy_threshold,
            max_gap=self.max_sample_gap,
            min_step=self.coverage_step,
        )

    def pod_of(self, server: HubServer) -> str:
        return pod_name(
            server.facts.user, server.facts.name, self.pod_name_template, self.slug_scheme
        )

    def pool_label(self, pool: object) -> str:
        """A metrics label from a pool name: only the catalog's names (no user text)."""
        if self._catalog is not None and isinstance(pool, str) and pool in self._catalog.pools:
            return pool
        return ""

    def claim(self, facts: ServerFacts) -> tuple[str, float]:
        """(pool label, most GPU memory in MiB) a server's reports may claim, from the hub's
        record of it: its pool and slice (user_options, which FracSpawner writes back with the
        pool the pod is on). Without a catalog, or a slice it cannot size, no memory at all:
        a server's word alone is never counted as GPU memory given back."""
        if self._catalog is None:
            return "", 0.0
        pool = self.policy_for(facts).pool
        if self._caps_of is not self._catalog:  # the catalog changed: sizes anew
            self._caps_of, self._caps = self._catalog, {}
        key = (facts.pool, facts.gpu_slice)
        if key not in self._caps:  # asked for each server at each report: computed once
            self._caps[key] = slice_memory_cap(self._catalog, facts.pool, facts.gpu_slice)
        return self.pool_label(pool), self._caps[key] or 0.0

    # --- reports ------------------------------------------------------------------------------
    def on_report(self, who: Identity, culled: list[CulledKernel]) -> None:
        """A server's report was taken: count what it tells (once the hub has listed it)."""
        self.account(who.user, who.server, time.time())
        self.update_hibernated()

    def account(self, user: str, server: str, now: float) -> None:
        """Count the kernels a server says it shut down and its hibernations, each once and at
        most report_events_per_hour, with the pool and memory bound of the hub's record of
        it. A server the hub has not listed yet (started since the last cycle) keeps them
        until a cycle lists it."""
        facts = self.known.get((user, server))
        if facts is None:
            return
        culled, events, dropped = self.reports.take_new(
            user, server, now, self.report_events_per_hour
        )
        if dropped:
            self.log.warning(
                "%s reported more than %d kernel shutdowns or hibernations in an hour: %d not "
                "counted",
                facts.log_name,
                self.report_events_per_hour,
                dropped,
            )
        pool, cap = self.claim(facts)
        for kernel in culled:
            mib = min(kernel.gpu_memory_mib, cap)
            self.log.info(
                "%s shut down its idle kernel %s (%.0f MiB of GPU memory)",
                facts.log_name,
                kernel.id,
                mib,
            )
            self.metrics.culls.labels("kernel_gpu_idle", pool).inc()
            self.metrics.reclaimed.labels(pool).inc(mib)
            self.state.record(
                CullEvent(
                    at=kernel.at, user=user, server=server, pool=pool,
                    slice=facts.gpu_slice or "", kind="kernel", reason="kernel_gpu_idle",
                    message=f"shut down its idle kernel ({mib:.0f} MiB)",
                    gpu_memory_mib=mib, gpu_equivalent=0.0,
                )
            )  # fmt: skip
        # GPU hibernation (issue 22): the server's suspends and resumes, each counted once
        for event in events:
            (
                self.metrics.hibernations if event.kind == "hibernate" else self.metrics.resumes
            ).labels(pool).inc()
            self.metrics.hibernation_duration.labels(event.kind).observe(event.seconds)
            if event.kind == "hibernate":  # in the admin page's last 24 hours (issue 38 #3)
                mib = min(event.gpu_memory_mib, cap)
                self.state.record(
                    CullEvent(
                        at=event.at, user=user, server=server, pool=pool,
                        slice=facts.gpu_slice or "", kind="hibernate",
                        reason="kernel_gpu_hibernate",
                        message=f"hibernated its idle kernel {event.kernel_id} ({mib:.0f} MiB "
                        f"to host memory in {event.seconds:.1f} s)",
                        gpu_memory_mib=mib, gpu_equivalent=0.0,
                    )
                )  # fmt: skip

    def answer_report(self, who: Identity, now: float | None = None) -> dict | None:
        """What the answer to a server's report carries: the swap's orders and grants
        (`_swap_answer`), its hibernated kernels to shut down where its node's servers keep
        more hibernated state than its budget (`host_budget`; hostbudget.py), whether its
        user is at a tab of another server of theirs (`presence_elsewhere`), and on an
        over-committed pool whose pods read only their slice (HAMi-core) what its GPUs have
        free by the culler's count (`gpu.free_mib`: the meter says it)."""
        now = time.time() if now is None else now  # a replay in virtual time passes its own
        answer = self._swap_answer(who, now)
        asked = list(swap_orders(answer))  # host_room_answer may drop some
        answer = self.host_room_answer(who, now, answer)
        self._count_orders(who, asked, answer)
        shutdown = self.host_budget_orders(who, now)
        if shutdown:
            answer = answer or {"swap": {}}
            answer["swap"]["shutdown"] = shutdown
        word = self.presence_elsewhere(who, now)
        if word is not None:
            answer = answer or {}
            answer["presence"] = {"elsewhere": word}
        free = self._swap_desk.free_told(who.user, who.server, now) if self._swap_desk else None
        if free is not None:  # HAMi-core's NVML shows the pod its slice, not the GPU's room
            answer = answer or {}
            answer["gpu"] = {"free_mib": round(free, 1)}
        return answer

    def presence_elsewhere(self, who: Identity, now: float) -> str | None:
        """The word "present" or "in_session" where a fresh report of another server of the
        same user (the hub lists it) says so by its own tabs (serverext/presence.py): the user
        is in the hub session, so this server's idle kernels may hibernate, never be shut down.
        A server in session only by this word is no evidence (no loop between two servers)."""
        word = None
        for user, server, report in self.reports.latest():
            if user != who.user or server == who.server or (user, server) not in self.known:
                continue
            if now - report.received_at > self.max_staleness:
                continue
            if report.present:
                return "present"
            if report.in_session and not report.elsewhere:
                word = "in_session"
        return word

    def host_room_answer(self, who: Identity, now: float, answer: dict | None) -> dict | None:
        """Hibernation within the node's host budget (hostroom.py): room for the kernels the
        server would hibernate (`swap.host_room`, or why not: `swap.host_wait`), and the
        culler's own swap orders only where they fit."""
        entry = self.reports.get(who.user, who.server)
        orders = swap_orders(answer)
        if entry is None or (not entry.host_wants and not orders):
            return answer
        report, key = entry, (who.user, who.server)
        facts = self.known.get(key)
        where = self.placement_of(who.user, who.server)
        budget = self.host_budget(where.node if where is not None else None)
        wants = list(report.host_wants)
        if orders:  # the culler's own swap orders: each kernel at what it holds on the GPU
            on_gpu = {k.kernel_id: k.resident_mib for g in report.swap.gpus for k in g.kernels}
            named = {w.kernel_id for w in wants}
            wants += [
                Want(o["kernel_id"], on_gpu.get(o["kernel_id"], UNKNOWN_MIB))
                for o in orders
                if o["kernel_id"] not in named
            ]
        if facts is None and budget > 0 and self.server_pods is not None:
            # not listed by the hub yet (started since the last cycle): not counted on its node
            # either, so no room until it is (its kernels stay on the GPU meanwhile); nor where
            # the pod watch does not know its pod yet (room with no budget is for a culler
            # without the watch, whose pods' memory limits bound them)
            why = "not hibernated yet: the culler has not listed this server yet"
            waits = [{"kernel_id": w.kernel_id, "reason": why} for w in report.host_wants]
            answer = answer or {"swap": {}}
            answer["swap"]["host_wait"] = waits
            answer["swap"].pop("hibernate", None)
            return answer
        if budget <= 0 or facts is None or where is None or not where.node:
            # no budget, or the node is not known: each pod's memory limit bounds its own
            room = [{"kernel_id": w.kernel_id, "gpu_memory_mib": w.mib} for w in report.host_wants]
            if room:
                answer = answer or {"swap": {}}
                answer["swap"]["host_room"] = room
            return answer
        holders = self.host_holders(now, budget, where.node)
        away = not (report.present or report.in_session)
        # where the pool over-commits, a kernel due to hibernate for idleness shuts nobody's
        # kernel down: it stays on the GPU, and if its memory is needed the swap orders it out
        # then (only a swap order may shut the oldest down: the last resort, issue 36 item 2)
        pool = self._catalog.pools.get(facts.pool or "") if self._catalog is not None else None
        evict_for = {o["kernel_id"] for o in orders} if pool and pool.overcommit > 1 else None
        plan = self._host_room.plan(
            who.user, who.server, where.node, holders, wants, self.host_cap(facts, budget),
            budget, now, {(u, n): r.received_at for u, n, r in self.reports.latest()}, away=away,
            share_mib=self.host_share(facts, where, budget), evict_for=evict_for,
        )  # fmt: skip
        granted = {w.kernel_id: w.mib for w in plan.grants}
        answer = answer or {"swap": {}}
        swap = answer["swap"]
        if orders:
            kept = [o for o in orders if o["kernel_id"] in granted]
            if kept:
                swap["hibernate"] = kept
            else:
                swap.pop("hibernate", None)
        asked = {w.kernel_id for w in report.host_wants}
        room = [{"kernel_id": k, "gpu_memory_mib": m} for k, m in granted.items() if k in asked]
        if room:
            swap["host_room"] = room
        waits = [{"kernel_id": k, "reason": why} for k, why in plan.waits if k in asked]
        if waits:
            swap["host_wait"] = waits
        for kid, why in plan.waits:
            self.log.info("%s: kernel %s not hibernated now: %s", who.log_name, shown(kid), why)
        return answer

    def host_budget(self, node: str | None) -> float:
        """The host memory budget of `node` (nodememory.py): host_memory_budget_mib where set,
        else host_memory_budget_fraction of the node's allocatable memory as the node watch
        last saw it, else (not known) the fixed 64 GiB."""
        nodes = getattr(self.server_pods, "nodes", None)
        mib = nodes.mib(node) if nodes is not None and node else None
        return node_budget_mib(self.host_memory_budget_mib, self.host_memory_budget_fraction, mib)

    def enforced_slice_mib(self, facts: ServerFacts) -> float | None:
        """The server's slice's memory (MiB) where its pool's backend holds a pod to its slice
        (HAMi, MIG: `enforced`): the most its kernels can hold, one or all together; None
        elsewhere, or where the catalog cannot size its slice."""
        pool = self._catalog.pools.get(facts.pool or "") if self._catalog is not None else None
        slice_mib = self.claim(facts)[1]
        return slice_mib if pool is not None and slice_mib > 0 and pool_enforced(pool) else None

    def host_cap(self, facts: ServerFacts, budget: float) -> float:
        """The most host memory one hibernated kernel of the server counts for: what its GPU
        holds (a kernel on a time-sliced pool may hold more than its slice, and hibernating
        it copies all of it), at least its slice; its slice where the pool's backend holds a
        pod to it (`enforced_slice_mib`); the budget where the catalog cannot tell."""
        enforced = self.enforced_slice_mib(facts)
        if enforced is not None:
            return enforced
        pool = self._catalog.pools.get(facts.pool or "") if self._catalog is not None else None
        device = float(pool.gpu.device_memory_mib) if pool is not None else 0.0
        return max(self.claim(facts)[1], device) or budget

    def host_share(self, facts: ServerFacts, where: Placement, budget: float) -> float:
        """The most host memory all the server's hibernated kernels together (and room held for
        it) count for on its node: what its pod can hold on the GPUs it is bound to (host_cap
        each, by the pod's device count: placement.py), never its report's word. Hibernating
        moves what its kernels hold on its GPUs to the host; a report listing more is ignored
        beyond this, so it can take its own share of the node's budget, never others'. Where
        the backend holds the pod to its slice, all its kernels together hold at most that
        (HAMi-core counts a hibernated kernel's memory against the pod too)."""
        enforced = self.enforced_slice_mib(facts)
        if enforced is not None:
            return enforced
        return self.host_cap(facts, budget) * max(1, where.gpus)

    def host_holders(
        self,
        now: float,
        budget: float,
        node: str,
        cap_of: Callable[[ServerFacts], float] | None = None,
    ) -> list[Holder]:
        """The hibernated kernels on `node` (an answer needs its server's node only, and every
        node has its own budget), by the servers' fresh reports (spared included); each
        server's kernels counted up to `cap_of(facts)` (host_cap by default). A listed server whose
        report is stale or missing (its reporter stuck, a partition, the culler restarted) is
        silent (`Holder.silent`) while its pod is on its node: it counts at its share
        (host_share: it may hold anything up to that; unknown is never free) and is ordered
        nothing; one without a GPU slice counts at most its last word and the room held for
        it (`Holder.whole_share` False)."""
        cap_of = cap_of or (lambda facts: self.host_cap(facts, budget))
        out: list[Holder] = []
        over: set[tuple[str, str]] = set()
        silent: set[tuple[str, str]] = set()
        for key, facts in self.known.items():
            report = self.reports.get(*key)
            fresh = report is not None and now - report.received_at <= self.max_staleness
            kernels = report.hibernated_kernels if report is not None else ()
            if fresh and not kernels:
                continue
            where = self.placement_of(*key)
            if where is None or not where.node:
                # its node is not known (its pod's memory limit bounds it), or its pod is gone
                # (the pod watch): its GPU state went with it
                continue
            if where.node != node:  # another node's: as it was logged
                over.update({key} & self._host_over)
                silent.update({key} & self._host_silent)
                continue
            gpu = self.claim(facts)[1] > 0  # a slice: its pod may hold GPU state
            if not fresh and not gpu and not kernels:
                continue  # no GPU slice and no word of hibernated kernels: nothing to hold
            cap, share = cap_of(facts), self.host_share(facts, where, budget)
            # a user present or in session keeps their kernels (serverext/presence.py)
            holder = Holder(*key, where.node, cap,
                            bool(fresh and (report.present or report.in_session)), kernels,
                            share, silent=not fresh)  # fmt: skip
            if not fresh:
                if not gpu:  # a GPU some other way: what its last report said, no more
                    holder = replace(
                        holder, share_mib=min(share, holder.said_mib()), whole_share=False
                    )
                if self._note_silent(holder, report, now):
                    silent.add(key)
            elif self._note_over_share(replace(holder, cap_mib=self.host_cap(facts, budget))):
                over.add(key)
            out.append(holder)
        # every listed server was read: a server gone (or within its share, or heard from
        # again) is forgotten, so the sets stay as small as the servers over (silent) now, and
        # a later excess (silence) of the same name is logged again
        self._host_over = over
        self._host_silent = silent
        return out

    def _note_silent(self, holder: Holder, report: ServerReport | None, now: float) -> bool:
        """Log once while it lasts that a server's report is stale or missing, and that its
        node counts it at its share meanwhile (host_holders keeps `_host_silent` to those
        logged); False where not logged yet: a culler just started has heard from nobody, and a
        warning for each would say nothing (one still silent after `max_staleness` is)."""
        if (holder.user, holder.server) in self._host_silent:
            return True
        if report is None and now - self._began < self.max_staleness:
            return False
        since = (
            f"has not reported for {now - report.received_at:.0f} s"
            if report is not None
            else "has not reported since the culler started (or for 4 x max_staleness)"
        )
        self.log.warning(
            "%s %s: its hibernated kernels on node %s count at %.0f MiB, what its pod can hold, "
            "until it reports or its pod is gone (no room is given out of it, none of its "
            "kernels is ordered)",
            Identity(holder.user, holder.server).log_name, since, holder.node, holder.held_mib(),
        )  # fmt: skip
        return True

    def _note_over_share(self, holder: Holder) -> bool:
        """Whether a server's report says its kernels hold more than its share (hostile, or a
        culler restarted after hibernations it did not grant): the excess is ignored, logged
        once while it lasts (host_holders keeps `_host_over` to those over now)."""
        said = holder.said_mib()
        if said <= holder.share_mib:
            return False
        if (holder.user, holder.server) not in self._host_over:
            self.log.warning(
                "%s: its report says %d hibernated kernel(s) on node %s hold %.0f MiB, beyond "
                "what its pod can hold on its GPUs (%.0f MiB): the excess is ignored",
                Identity(holder.user, holder.server).log_name, len(holder.kernels), holder.node,
                said,
                holder.share_mib,
            )  # fmt: skip
        return True

    def host_budget_orders(self, who: Identity, now: float | None = None) -> list[dict]:
        """The reporting server's hibernated kernels to shut down for its node's budget: those
        ordered to make room for another kernel to hibernate (hostroom.py), and any beyond the
        budget (a culler restarted, reports grown: plan_evictions), by its node's budget."""
        if (who.user, who.server) not in self.known:
            return []
        where = self.placement_of(who.user, who.server)
        node = where.node if where is not None else None
        budget = self.host_budget(node)
        if budget <= 0:
            return []
        now = time.time() if now is None else now
        entry = self.reports.get(who.user, who.server)
        ordered = self._host_room.orders_for(who.user, who.server, now)
        due: dict[str, str] = {}  # kernel_id -> why
        if ordered and entry is not None and not (entry.present or entry.in_session):
            for k in entry.hibernated_kernels:
                if k.kernel_id in ordered and not k.waiting and not k.copying:
                    due[k.kernel_id] = ordered[k.kernel_id]
        # only its own node's: its kernels are told in the answer to its own report, and every
        # node has its own budget
        holders = (
            self.host_holders(now, budget, node, lambda facts: self.claim(facts)[1] or budget)
            if node
            else []
        )
        for e in plan_evictions(holders, budget):
            if (e.user, e.server) == (who.user, who.server):  # others: told to their server
                due.setdefault(e.kernel_id, e.reason)
        orders = []
        # each told once, again only after EVICT_SECONDS: refused (its resume under way), its
        # server reports at once, and an order at every answer had it refuse again at once
        for kid in self._host_room.tell(who.user, who.server, due, now):
            self.log.info(
                "%s: shut down hibernated kernel %s: %s", who.log_name, shown(kid), due[kid]
            )
            orders.append({"kernel_id": kid, "reason": due[kid]})
        return orders

    def _swap_answer(self, who: Identity, now: float | None = None) -> dict | None:
        """What the answer to a server's report carries: its own idle kernels to swap out while
        the GPU it shares on an over-committed pool is under memory pressure, and room for its
        kernels waiting to resume, on any pool (swapdesk.py)."""
        facts = self.known.get((who.user, who.server))
        pool = self._catalog.pools.get(facts.pool or "") if self._catalog and facts else None
        if pool is None:
            return None
        if pool.overcommit <= 1 and not self.reports.waits(who.user, who.server):
            return None  # the hub's record: not an over-committed pool, and nothing waits
        if self._swap_desk is None:
            self._swap_desk = SwapDesk(report_in=self.swap_report_in)
        self._swap_desk.grant_margin_mib = self.grant_margin_mib  # as configured now
        now = time.time() if now is None else now
        seats = seats_from(
            self.reports.latest(), self.known, self._catalog, now, self.max_staleness,
            self.swap_margin_mib, also_pool=pool.name, placement=self.placement_of,
        )  # fmt: skip
        seats += self.unlisted(now, also_pool=pool.name)
        answer = self._swap_desk.answer(who.user, who.server, seats, now)
        self.metrics.gpus_under_pressure.set(self._swap_desk.under_pressure())
        for grant in (answer or {}).get("swap", {}).get("resume", []):
            self.log.info(
                "%s/%s: room on the GPU for kernel %s to resume",
                who.user, who.server, shown(grant["kernel_id"]),
            )  # fmt: skip
        return answer

    def _count_orders(self, who: Identity, asked: list[dict], answer: dict | None) -> None:
        """The swap orders `answer` carries, and those of `asked` that the node's host memory
        budget held back (`host_room_answer`: the kernel stays on the GPU). Held orders while
        people wait to resume mean the budget, not the GPU, limits the pool: the capacity
        replay's breaks mix on half the GPUs had present people wait 690 person-minutes beside
        idle kernels of people away that the budget kept on the GPU (docs/benchmarks.md).

        Each kernel counts once per order, in each counter: the desk asks again every 30 s
        while the kernel is still on the GPU (or still held), and such a re-ask is the same
        order (`_orders_counted`). Once its server's report shows it off the GPU (hibernated,
        ended) or the server is gone, the order is done: ordered out again after it came back,
        it counts again."""
        self._forget_orders(who)
        if not asked:
            return
        facts = self.known.get((who.user, who.server))
        pool = self.pool_label(facts.pool if facts is not None else None)
        sent = {o["kernel_id"] for o in swap_orders(answer)}
        counted = self._orders_counted.setdefault((who.user, who.server), {})
        for order in asked:
            kid = shown(order["kernel_id"])
            how = counted.setdefault(order["kernel_id"], set())
            if order["kernel_id"] in sent:
                # a re-ask of the same order is logged at debug: info once per order
                log = self.log.debug if "sent" in how else self.log.info
                if "sent" not in how:
                    how.add("sent")
                    self.metrics.swap_orders.labels(pool).inc()
                log(
                    "%s/%s: swap out idle kernel %s (GPU memory pressure)",
                    who.user, who.server, kid,
                )  # fmt: skip
            else:
                log = self.log.debug if "held" in how else self.log.info
                if "held" not in how:
                    how.add("held")
                    self.metrics.swap_orders_held.labels(pool).inc()
                log(
                    "%s/%s: idle kernel %s stays on the GPU under memory pressure: no room for it "
                    "in its node's host memory budget", who.user, who.server, kid,
                )  # fmt: skip

    def _forget_orders(self, who: Identity) -> None:
        """Forget the counted orders of servers the hub no longer lists, and of `who`'s kernels
        its latest report shows off the GPU (hibernated, ended): those orders are done. A
        report that reads no GPU says nothing of them (kept until it does, or the server goes)."""
        for key in [key for key in self._orders_counted if key not in self.known]:
            del self._orders_counted[key]
        key = (who.user, who.server)
        counted = self._orders_counted.get(key)
        if not counted:
            self._orders_counted.pop(key, None)
            return
        report = self.reports.get(who.user, who.server)
        if report is not None and not report.swap.gpus:
            return
        on_gpu = set() if report is None else {
            k.kernel_id for g in report.swap.gpus for k in g.back()
        }  # fmt: skip
        for kid in [kid for kid in counted if kid not in on_gpu]:
            del counted[kid]
        if not counted:
            del self._orders_counted[key]

    def unlisted(self, now: float, also_pool: str | None = None) -> list[Seat]:
        """Seats for the server pods the hub has not listed yet (started since the last cycle):
        they hold GPU memory too (unlisted.py). None without the pod watch."""
        pods = getattr(self.server_pods, "placements", None)
        if pods is None or self._catalog is None:
            return []

        def name(user: str, server: str) -> str:
            return pod_name(user, server, self.pod_name_template, self.slug_scheme)

        listed_pods = {name(user, server) for user, server in self.known}
        reports = {
            (user, server): report
            for user, server, report in self.reports.latest()
            if (user, server) not in self.known
        }
        return unlisted_seats(
            pods(), self.known, listed_pods, reports, self._catalog, now, self.max_staleness,
            self.swap_margin_mib, also_pool,
        )  # fmt: skip

    def placement_of(self, user: str, server: str) -> Placement | None:
        """Where the server's pod is, by the pod watch (watch_server_pods): its node and the
        GPUs its allocation names (placement.py); None where the watch is off or lacks it."""
        if self.server_pods is None:
            return None
        name = self._pod_names.get((user, server))
        if name is None:  # a slug per server, asked at every answer (host_holders)
            name = pod_name(user, server, self.pod_name_template, self.slug_scheme)
            if len(self._pod_names) > 4 * max(len(self.known), 1024):
                self._pod_names.clear()  # servers gone: start over rather than grow
            self._pod_names[(user, server)] = name
        return self.server_pods.placement(name)

    def update_hibernated(self) -> None:
        """fracspawner_hibernated_bytes by pool: the servers' latest reports, each bounded by
        its slice and labelled with its pool as the hub records it (listed servers only)."""
        by_label: dict[str, float] = dict.fromkeys(self._hibernated_labels, 0.0)
        for user, server, mib in self.reports.hibernated():
            facts = self.known.get((user, server))
            if facts is None:
                continue
            label, cap = self.claim(facts)
            by_label[label] = by_label.get(label, 0.0) + min(mib, cap)
        for label, mib in by_label.items():
            self.metrics.hibernated.labels(label).set(mib * 2**20)
        self._hibernated_labels = set(by_label)

    def verifier(self) -> TokenVerifier:
        """The hub's word on tokens (reports and the state API), made on first use."""
        if self._verifier is None:
            self._verifier = TokenVerifier(
                self.url,
                ttl=self.token_cache_seconds,
                timeout=self.request_timeout,
                max_entries=self.token_cache_size,
                unknown_rate=self.unknown_token_rate,
                unknown_burst=10 * self.unknown_token_rate,
                unknown_total_rate=self.unknown_token_rate_total,
                unknown_total_burst=10 * self.unknown_token_rate_total,
                known=self.known_address,
                reserved=[token_key(self.service_api_token)] if self.service_api_token else [],
            )
        return self._verifier

    def known_address(self, address: str) -> bool:
        """Whether `address` is a server pod's (the pod watch): its unknown tokens spend a
        budget of its own (identity.RateLimit)."""
        return self.server_pods is not None and self.server_pods.known(address)

    def start_server_pods(self) -> None:
        """Start the server pod watch (watch_server_pods), in the running event loop."""
        if self.watch_server_pods and self.server_pods is None:
            from .serverpods import ServerPods

            self.server_pods = ServerPods(
                self.namespace,
                selector=self.server_pod_selector,
                kubeconfig=self.kubeconfig or None,
                dra=self.watch_dra_claims,
                # each node's memory, for its host memory budget (unless the admin set one)
                nodes=self.host_memory_budget_mib is None,
            )
            self.server_pods.start()

    def slice_equivalent(self, facts: ServerFacts) -> float:
        """GPU-equivalents a server's slice stands for (0 when the catalog cannot tell)."""
        if self._catalog is None or facts.gpu_slice is None:
            return 0.0
        from ..choice.admission import options_gpu_equivalent

        return options_gpu_equivalent(self._catalog, facts.user_options) or 0.0

    def start_receiver(self) -> HTTPServer | None:
        """Listen for reports at report_url (in the running event loop); None when off."""
        if not self.reports_enabled:
            return None
        where = urlparse(
            self.report_url if "://" in self.report_url else "http://" + self.report_url
        )
        rate = ReportRate(self.report_rate, self.report_burst)
        app = receiver_app(
            self.report_prefix, self.verifier(), self.reports, self.on_report, rate,
            answer=self.answer_report,
        )  # fmt: skip
        prefix = "/" + self.report_prefix.strip("/") + "/" if self.report_prefix.strip("/") else "/"
        state = state_handler(f"{prefix}api/state", self.verifier, self.state_json, gated=True)
        # any hub token (the spawning server's own, as the hub's admission sends it): no names
        room = state_handler(
            f"{prefix}api/room", self.verifier, self.room_json, gated=True, scope=None
        )
        app.add_handlers(r".*", [state, room])
        server = report_server(app, self.verifier(), max_body_size=MAX_BODY * 2)
        server.listen(where.port or 80, where.hostname or "")
        self.log.info(
            "GPU reports taken at %s://%s:%s%sapi/reports",
            where.scheme,
            where.hostname,
            where.port or 80,
            "/" + self.report_prefix.strip("/") + "/" if self.report_prefix.strip("/") else "/",
        )
        return server

    # --- its own token ------------------------------------------------------------------------
    def required_scopes(self) -> list[str]:
        """What the culler's token needs (read:users:groups only for exempt_groups)."""
        return [s for s in CULLER_SCOPES if s != "read:users:groups" or self.exempt_groups]

    async def check_scopes(self, hub: HubClient) -> list[str] | None:
        """Ask the hub what this culler's token may do (`GET /user` answers its scopes); say
        plainly what is missing (ERROR log, /health, the metrics, the state API's problems).
        The missing scopes, or None when the hub could not be asked."""
        req = HTTPRequest(f"{self.url}/user", request_timeout=self.request_timeout)
        try:
            resp = await hub.fetch(req, raise_error=False)
        except OSError as exc:
            self.log.warning("the hub cannot be asked about the culler's token: %s", exc)
            return None
        required = self.required_scopes()
        if resp.code in (401, 403):
            missing, problem = (
                required,
                (
                    "the hub does not know the culler's token ($JUPYTERHUB_API_TOKEN): it cannot "
                    "list or stop servers. Register the culler as a service with that token "
                    "(z2jh: hub.services.<name>, whose apiToken z2jh generates)"
                ),
            )
        elif resp.code == 200:
            try:
                granted = json.loads(resp.body).get("scopes") or []
            except (ValueError, AttributeError):
                return None
            missing = missing_scopes(granted, required)
            problem = scope_problem("culler", missing, self.name_in_hub())
        else:
            return None
        for scope in required:
            self.metrics.missing_scope.labels(scope).set(int(scope in missing))
        self.scopes_missing, self.scope_problem = missing, problem
        if problem:
            self.log.error("%s", problem)
        return missing

    def name_in_hub(self) -> str:
        """The culler's service (and role) name: $JUPYTERHUB_SERVICE_NAME when hub-managed."""
        return os.environ.get("JUPYTERHUB_SERVICE_NAME", "fracspawner-culler")

    # --- GPU facts ----------------------------------------------------------------------------
    async def prometheus_facts(
        self, hub: HubClient, servers: list[HubServer], at: float | None
    ) -> dict[str, GpuFacts] | None:
        """pod name -> facts, for every pod in one query; None when Prometheus is down."""
        windows = gpu_windows(self.policy_for(s.facts).policy for s in servers)
        if not windows:
            return {}
        cfg = self.dcgm()
        hub.requests += 1
        try:
            result = await prom_query(
                hub.http,
                self.prometheus_url,
                build_query(cfg, windows),
                timeout=self.request_timeout,
                at=at,
            )
        except PrometheusError as exc:
            self.log.warning(
                "GPU source prometheus is down (%s): no server is culled on GPU grounds this cycle",
                exc,
            )
            return None
        return {pod: facts for (_ns, pod), facts in parse_result(result, cfg, windows).items()}

    def gather(
        self, server: HubServer, prom: dict[str, GpuFacts] | None, now: float
    ) -> tuple[ServerFacts, dict[str, GpuFacts | None]]:
        """The server's facts with its own report's activity, and each source's reading.

        A source that is configured but has nothing fresh for a server holding a GPU is
        recorded as failed (None): Prometheus down or a pod missing from its answer, no report
        or a stale one. Holding a GPU is known by its slice or by GPU memory that either source
        saw: a pod may get a GPU other than through user_options["gpu"], and the other source's
        word alone must not stop it on GPU grounds. A report marked unavailable still gives the
        server's own activity."""
        facts = server.facts
        found = None
        if self.prometheus_url and prom is not None:
            found = prom.get(self.pod_of(server))
        report = self.fresh_report(facts, now) if self.reports_enabled else None
        own = None if report is None else report.gpu
        holds = facts.gpu_slice is not None or any(
            f is not None and f.memory_mib > 0 for f in (found, own)
        )
        sources: dict[str, GpuFacts | None] = {}
        if self.prometheus_url and (found is not None or holds):
            sources["prometheus"] = found
        if self.reports_enabled:
            if report is not None:
                facts = replace(
                    facts,
                    own_last_activity=report.server_last_activity,
                    user_last_activity=report.user_last_activity,
                    present=report.present,
                    in_session=report.in_session,
                    resume_waiting=any(g.waiting for g in report.swap.gpus),
                )
                if report.gpu is not None or holds:
                    sources["extension"] = report.gpu
            elif holds:
                sources["extension"] = None
        # on a shared GPU, DCGM's reading is the device's: a neighbour's work is not this
        # server's where its own report knows (shared.py)
        return facts, own_share(sources, facts.gpu_slice)

    def fresh_report(self, facts: ServerFacts, now: float) -> ServerReport | None:
        """The server's latest report where it came within `max_staleness` of `now`; None
        where there is none or it is stale (what it said may no longer hold)."""
        report = self.reports.for_server(facts)
        if report is None or now - report.received_at > self.max_staleness:
            return None
        return report

    def keep_hibernated(
        self,
        gathered: list[tuple[HubServer, ServerFacts, dict[str, GpuFacts | None]]],
        now: float,
        rules: Rules,
    ) -> list[tuple[HubServer, ServerFacts, dict[str, GpuFacts | None]]]:
        """Mark the servers kept hibernated (keep.py; issue 36 item 2): every kernel of
        theirs hibernated on a pool where that frees memory others use, and nothing waiting
        for what they hold. Where server pods of a pool wait for a node, its kept servers that
        their idle timeouts would stop now are released for them, least recently active first.
        Off (`keep_hibernated_servers`), or without the pod watch (nobody waiting can be seen)
        or a catalog, nothing is kept."""
        pods = getattr(self.server_pods, "placements", None)
        catalog = self._catalog
        if not self.keep_hibernated_servers or pods is None or catalog is None:
            return gathered
        if not self.reports_enabled:
            return gathered
        placements = pods()
        waiting = waiting_mib(placements, catalog)
        out, due = [], []
        for server, facts, sources in gathered:
            report = self.fresh_report(facts, now)
            _, stop = self.decide(facts, sources, now, rules)
            if report is not None and may_keep(report, facts.pool, catalog):
                if stop.cull and stop.reason == "gpu_idle":
                    at = facts.activity or now
                    due.append(Kept((facts.user, facts.name), facts.pool or "", at,
                                    self.claim(facts)[1], tabs_closed(report)))  # fmt: skip
                facts = replace(facts, kept_hibernated=True)
            elif stop.cull:  # stopped this cycle anyway: its slot goes to those waiting
                pool = facts.pool or ""
                waiting[pool] = waiting.get(pool, 0.0) - self.claim(facts)[1]
            out.append((server, facts, sources))
        freed = released(
            releasable(due, waited(placements, now), self.release_tab_open_after), waiting
        )
        for key in sorted(freed):
            self.log.info(
                "%s/%s: its kernels are hibernated, but %.0f MiB of slices wait for a node on "
                "its pool: no longer kept",
                *key, waiting.get(next(k.pool for k in due if k.key == key), 0.0),
            )  # fmt: skip
        return [
            (s, replace(f, kept_hibernated=False) if (f.user, f.name) in freed else f, src)
            for s, f, src in out
        ]

    def release_for_waiting(
        self,
        gathered: list[tuple[HubServer, ServerFacts, dict[str, GpuFacts | None]]],
        now: float,
        rules: Rules,
    ) -> list[tuple[HubServer, ServerFacts, dict[str, GpuFacts | None]]]:
        """Mark the servers released for the pods waiting for a node on their pools (away.py):
        their person left `release_away_after` ago; least recently active first, until the
        slices they free, with those the other rules free this cycle, cover the slices
        waiting. Without the pod watch, reports or a catalog, nothing is released early."""
        pods = getattr(self.server_pods, "placements", None)
        catalog, after = self._catalog, self.release_away_after
        if not after or pods is None or catalog is None or not self.reports_enabled:
            return gathered
        placements = pods()
        need = waiting_mib(placements, catalog)
        if not need:
            return gathered
        # on an over-committed pool, only where a GPU has room for a waiting pod (away.py)
        rooms = self.room_json(now)["gpus"]
        smallest = smallest_waiting(placements, catalog)
        seats = {p for p in need if room_for_waiting(rooms, p, smallest.get(p, 0.0))}
        due: dict[tuple[str, str], float] = {}
        candidates = []
        for _server, facts, sources in gathered:
            reading, decision = self.decide(facts, sources, now, rules)
            pool, slice_mib = facts.pool or "", self.claim(facts)[1]
            if decision.cull:  # freed this cycle anyway
                need[pool] = need.get(pool, 0.0) - slice_mib
                continue
            if decision.reason not in RELEASABLE or pool not in seats:
                continue
            report = self.fresh_report(facts, now)
            at = release_at(report, facts, reading.gpu, after, now)
            if at is not None and at <= now:
                key = (facts.user, facts.name)
                due[key] = at
                candidates.append(
                    Kept(key, pool, facts.activity or now, slice_mib, tabs_closed(report))
                )
        freed = released(
            releasable(candidates, waited(placements, now), self.release_tab_open_after), need
        )
        pools = {k.key: k.pool for k in candidates}
        for key in sorted(freed):
            self.log.info(
                "%s/%s: its user left, and %.0f MiB of slices wait for a node on its pool: "
                "released for them",
                *key,
                need.get(pools[key], 0.0),
            )
        out = []
        for server, facts, sources in gathered:
            key = (facts.user, facts.name)
            if key in freed:
                facts = replace(facts, needed_at=due[key])
            out.append((server, facts, sources))
        return out

    def decide(
        self,
        facts: ServerFacts,
        sources: dict[str, GpuFacts | None],
        now: float,
        rules: Rules,
    ) -> tuple[Reading, Decision]:
        """A server's reading (`combine`) and decision (`decide_server`), computed once per
        cycle for the same inputs: keep_hibernated, release_for_waiting and the cycle's own loop
        each need them, and asked each its own, a server was decided up to three times a cycle.
        Both are pure in (facts, sources, now, rules) and the pool's policy (fixed within a
        cycle), so they are reused while those are the very same objects; a step that changes a
        server's facts (kept hibernated, released for a waiting pod) makes new ones, decided
        again. Forgotten at each cycle's start and end."""
        seen = self._decided.get(id(facts))
        same = seen is not None and seen[0] is facts and seen[1] is sources
        if same and seen[2] == now and seen[3] is rules:
            return seen[4], seen[5]
        got = self._readings.get(id(sources))
        if got is not None and got[0] is sources and got[1] == now and got[2] is rules:
            reading = got[3]
        else:
            reading = combine(sources, now, rules)
            self._readings[id(sources)] = (sources, now, rules, reading)
        _, policy = self.policy_for(facts).astuple()
        decision = decide_server(facts, reading, policy, now, rules)
        # the objects are kept with their results: while kept, no other object takes their id
        self._decided[id(facts)] = (facts, sources, now, rules, reading, decision)
        return reading, decision

    # --- one cycle ----------------------------------------------------------------------------
    async def cull_once(self, now: float | None = None) -> CycleResult:
        """One cycle. `now` (unix seconds) replays a moment: Prometheus is asked about it too."""
        started = time.perf_counter()
        hub = HubClient(
            self.url,
            self.api_token,
            concurrency=self.concurrency,
            page_size=self.api_page_size,
            request_timeout=self.request_timeout,
        )
        self._readings.clear()
        self._decided.clear()
        try:
            result = await self._cycle(hub, now)
        finally:
            hub.close()
            self._readings.clear()  # a cycle's figures are not the next one's
            self._decided.clear()
        result.duration = time.perf_counter() - started
        self.metrics.cycle_duration.observe(result.duration)
        self.metrics.last_cycle.set(time.time())
        self.metrics.servers.set(result.servers)
        return result

    async def _cycle(self, hub: HubClient, at: float | None) -> CycleResult:
        if self.scopes_missing:  # until the hub grants them (a role added, the hub restarted)
            await self.check_scopes(hub)
        try:
            servers = await hub.ready_servers()
        except HTTPClientError as exc:
            if exc.code != 403:
                raise
            await self.check_scopes(hub)  # says which scopes are missing
            problem = self.scope_problem or f"the hub refused to list servers: {exc}"
            raise HubRefused(problem) from None
        now = time.time() if at is None else at
        self.reports.prune(now - 4 * self.max_staleness)
        # the hub's record of each server: reports held back until it was listed count now
        self.known = {(s.facts.user, s.facts.name): s.facts for s in servers}
        self.listed_at = now
        for user, server in self.known:
            self.account(user, server, time.time())
        self.update_hibernated()
        sources_up: dict[str, bool] = {}
        prom: dict[str, GpuFacts] | None = {}
        if self.prometheus_url:
            prom = await self.prometheus_facts(hub, servers, at)
            sources_up["prometheus"] = prom is not None
            self.metrics.source_up.labels("prometheus").set(int(prom is not None))
        rules = self.rules()
        outcomes = []
        rows = []
        missing_reports = 0
        gathered = self.keep_hibernated(
            [(server, *self.gather(server, prom, now)) for server in servers], now, rules
        )
        gathered = self.release_for_waiting(gathered, now, rules)
        for server, facts, sources in gathered:
            missing_reports += "extension" in sources and sources["extension"] is None
            reading, decision = self.decide(facts, sources, now, rules)
            pool, policy = self.policy_for(facts).astuple()
            outcomes.append(Outcome(server, decision, reading.gpu, pool=pool))
            report = self.reports.for_server(facts) if self.reports_enabled else None
            hibernated = None if report is None else report.hibernated_mib
            simulated = report is not None and report.simulated
            rows.append(
                server_row(facts, reading, decision, policy, pool, now, hibernated, simulated)
            )
        if self.reports_enabled:  # up: every GPU server's report came in time
            sources_up["extension"] = missing_reports == 0
            self.metrics.source_up.labels("extension").set(int(sources_up["extension"]))
        await asyncio.gather(*(self._act(hub, o) for o in outcomes))
        self.state.cycle(rows, [s.facts for s in servers], now)
        return CycleResult(len(servers), outcomes, hub.requests, 0.0, sources_up)

    async def _act(self, hub: HubClient, outcome: Outcome) -> None:
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
        if not d.cull or self.dry_run:
            return
        try:
            code = await hub.stop_server(facts.user, facts.name, self.remove_named_servers)
        except (HTTPClientError, OSError) as exc:
            self.log.error("stopping %s failed: %s", facts.log_name, exc)
            if isinstance(exc, HTTPClientError) and exc.code == 403:
                await self.check_scopes(hub)  # says which scopes are missing
            return
        if code == 202:
            self.log.warning("server %s is slow to stop", facts.log_name)
        outcome.done = True
        self.reports.forget(facts.user, facts.name)
        self.metrics.culls.labels(d.reason, pool).inc()
        if outcome.gpu is not None:
            self.metrics.reclaimed.labels(pool).inc(outcome.gpu.memory_mib)
        self.state.record(
            CullEvent(
                at=time.time(), user=facts.user, server=facts.name, pool=pool,
                slice=facts.gpu_slice or "", kind="server", reason=d.reason, message=d.message,
                gpu_memory_mib=outcome.gpu.memory_mib if outcome.gpu is not None else 0.0,
                gpu_equivalent=self.slice_equivalent(facts),
            )
        )  # fmt: skip

    # --- the service --------------------------------------------------------------------------
    def state_json(self, now: float) -> dict[str, Any]:
        body = self.state.to_json(now)
        body["cull_every"] = self.cull_every
        body["dry_run"] = self.dry_run
        body["problems"] = [self.scope_problem] if self.scope_problem else []
        body["scopes_missing"] = list(self.scopes_missing)
        return body

    def room_json(self, now: float) -> dict[str, Any]:
        """`GET .../api/room`: per GPU of an over-committed pool, what present users and busy
        kernels hold (room.py), for the hub's admission (hub/room.py). `listed`: False until
        the hub has listed its servers once (until then the culler knows nobody: no answer)."""
        gpus: list[dict[str, Any]] = []
        if self._catalog is not None and self.listed_at is not None:
            seats = seats_from(
                self.reports.latest(), self.known, self._catalog, now, self.max_staleness,
                self.swap_margin_mib, placement=self.placement_of,
            )  # fmt: skip
            pairs = [(self.known[(s.user, s.server)].pool or "", s) for s in seats]
            pairs += [(s.placement.pool or "", s) for s in self.unlisted(now) if s.placement]
            above = self._swap_desk.above if self._swap_desk is not None else None
            gpus = [r.to_json() for r in gpu_rooms(pairs, above, self.room_tag_key)]
        return {"at": now, "listed": self.listed_at is not None, "gpus": gpus}

    def warn_guessable_room_tags(self) -> bool:
        """Say once, at start, that the room answer's server tags can be computed from
        usernames when no key is set and the catalog over-commits a pool (only then does the
        answer list servers). True when it warned."""
        pools = self._catalog.pools.values() if self._catalog is not None else ()
        if self.room_tag_key or not any(p.overcommit > 1 for p in pools):
            return False
        self.log.warning(
            "no Culler.room_tag_key: the room answer (api/room), which any server's token may "
            "read, tags servers by SHA-256 of user/server, so anyone who can guess a username "
            "can find that server's GPU in it. Set the same random key in %s for the culler "
            "and the hub (FracSpawner.room_tag_key; the chart generates one: docs/install.md)",
            ROOM_TAG_KEY_ENV,
        )
        return True

    def metrics_app(self) -> web.Application:
        """/metrics (open, as Prometheus scrapes it) and /api/state (a token that may read
        every server: stateapi.py)."""
        registry = self.metrics.registry
        culler = self

        class MetricsHandler(web.RequestHandler):
            def get(self) -> None:
                self.set_header("Content-Type", CONTENT_TYPE_LATEST)
                self.write(generate_latest(registry))

        class HealthHandler(web.RequestHandler):
            """503 while the culler's token lacks scopes it needs (it can do nothing)."""

            def get(self) -> None:
                if culler.scopes_missing:
                    self.set_status(503)
                    self.finish({"status": "missing scopes", "missing": culler.scopes_missing,
                                 "message": culler.scope_problem})  # fmt: skip
                else:
                    self.finish({"status": "ok"})

        return web.Application(
            [
                (r"/metrics", MetricsHandler),
                (r"/health", HealthHandler),
                state_handler(r"/api/state", self.verifier, self.state_json),
                state_handler(r"/api/room", self.verifier, self.room_json, scope=None),
            ]
        )

    async def run(self) -> None:
        if not self.api_token:
            raise SystemExit("fracspawner culler: no token (set JUPYTERHUB_API_TOKEN)")
        if self.metrics_port:
            server = HTTPServer(self.metrics_app())
            server.listen(self.metrics_port, self.metrics_ip)
            self.log.info("metrics on http://%s:%s/metrics", self.metrics_ip, self.metrics_port)
        self.start_server_pods()
        self.start_receiver()
        self.warn_guessable_room_tags()
        hub = HubClient(self.url, self.api_token, request_timeout=self.request_timeout)
        try:
            await self.check_scopes(hub)
        finally:
            hub.close()
        self.log.info(
            "culling every %ss; GPU sources: %s%s",
            self.cull_every,
            ", ".join(
                n
                for n, on in (
                    ("prometheus", self.prometheus_url),
                    ("extension reports", self.reports_enabled),
                )
                if on
            )
            or "none (plain idle timeouts only)",
            " [dry run]" if self.dry_run else "",
        )
        while True:
            try:
                result = await self.cull_once()
                self.log.info(
                    "cycle: %d servers, %d stopped, %d requests, %.2fs",
                    result.servers,
                    sum(o.decision.cull for o in result.outcomes),
                    result.requests,
                    result.duration,
                )
            except HubRefused as exc:
                if not self.scope_problem:  # else said already, with the scopes missing
                    self.log.error("culling cycle failed: %s", exc)
            except Exception:  # the service must outlive a hub restart or a bad cycle
                self.log.exception("culling cycle failed")
            await self.until_next_cycle()

    def pods_waiting(self) -> bool:
        """Whether a server pod of a known pool waits for a node now (the pod watch)."""
        pods = getattr(self.server_pods, "placements", None)
        return bool(pods and self._catalog and waiting_mib(pods(), self._catalog))

    async def until_next_cycle(self) -> None:
        """`cull_every`, or sooner: `cull_when_waiting` after the pod watch saw a server pod
        waiting for a node, where it still waits then (a pod waits for a moment before the
        scheduler places it; only one nothing places calls for a cycle)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.cull_every
        wake = asyncio.Event()
        if self.cull_when_waiting > 0 and self.server_pods is not None:
            self.server_pods.on_waiting = wake.set
        try:
            while (left := deadline - loop.time()) > 0:
                wake.clear()
                try:
                    await asyncio.wait_for(wake.wait(), left)
                except asyncio.TimeoutError:
                    return
                await asyncio.sleep(min(self.cull_when_waiting, max(deadline - loop.time(), 0)))
                if self.pods_waiting():
                    return
        finally:
            if self.server_pods is not None:
                self.server_pods.on_waiting = None

    def start(self) -> None:
        asyncio.run(self.run())
