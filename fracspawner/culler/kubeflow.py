"""`fracspawner culler kubeflow`: GPU-aware culling of Kubeflow notebooks, no hub needed.

Each cycle lists the Notebooks (`kubeflow.org/v1`) and, where Notebooks 2.0 is installed, the
Workspaces (`kubeflow.org/v1beta1`), finds each one's pod, reads GPU activity for all pods in
one Prometheus query (dcgm-exporter metrics, culler/prometheus.py) and decides with the hub
culler's pure functions (culler/decide.py: `combine`, `decide_server`) under the catalog's idle
policy of the pod's pool. An idle GPU notebook is stopped the way Kubeflow's own UI and culler
stop one: the Notebook gets the annotation `kubeflow-resource-stopped` (RFC 3339 time; the
Notebook controller then scales its StatefulSet to 0; kubeflow/notebooks notebooks-v1
notebook-controller/controllers/culling_controller.go and the web app's PATCH route), a
Workspace gets `spec.paused: true` (notebooks-v2 workspace_controller.go pauses the same way).

User activity comes from the notebook itself: jupyter-server's `/api/status` `last_activity`
(what Notebooks 2.0's Jupyter activity probe reads; the status request does not count as
activity), and from what Kubeflow already recorded (`notebooks.kubeflow.org/last-activity` on
a Notebook when Kubeflow's culler runs, `status.activity.lastActivity` on a Workspace); the
newest wins. A notebook whose activity cannot be learnt is kept, and so is a Notebook whose
server was asked and did not answer (Kubeflow's culler leaves the annotation as it was when
its own probe fails or finds no kernel: no stand-in for the server's answer). A kernel that is
running is activity now: with the status the culler reads the server's `/api/kernels` (with
`no_track_activity=1`, so that the read is not activity), and any kernel whose
`execution_state` is not "idle" counts as activity at this moment, as Kubeflow's culler counts
it (kubeflow/kubeflow components/notebook-controller/controllers/culling_controller.go
`allKernelsAreIdle`): a long silent cell stops updating `last_activity`, and a GPU idle
meanwhile (a CPU-bound cell) must not stop it. It is not user activity: `server_unattended`
still stops a notebook nobody has used for that long, running kernel or not, as on the hub side
GPU work does not hold a server past it (docs/culler.md). A server that answers the status but
not the kernels is one that did not answer. A Workspace's
record proves idleness only until its probe read it (`status.activity.lastUpdate`). A GPU reading
that is missing (Prometheus down, no series, stale) never counts as idle: then only
`server_idle` applies.
CPU-only notebooks are left to Kubeflow's own culler unless gpu_only is off.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any, cast
from urllib.parse import urlsplit, urlunsplit

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError
from tornado.httpserver import HTTPServer
from tornado.iostream import StreamClosedError
from traitlets import Bool, Dict, Float, Integer, List, Unicode

from ..backends import load_catalog
from ..capacity.apiconfig import load_configuration
from ..k8s.forbidden import Answer, refused
from ..model.catalog import Catalog
from ..model.errors import CatalogError
from .base import CullerApplication
from .decide import Decision, GpuFacts, Rules, ServerFacts, combine, decide_server, fmt
from .policy import gpu_windows, metrics_pool, policy_for_server
from .prometheus import DEFAULT_JOB, DcgmConfig, PrometheusError, build_query, parse_result
from .prometheus import query as prom_query

NOTEBOOKS = ("kubeflow.org", "v1", "notebooks")
WORKSPACES = ("kubeflow.org", "v1beta1", "workspaces")
#: the Notebook annotation that stops it (Kubeflow's STOP_ANNOTATION)
STOP_ANNOTATION = "kubeflow-resource-stopped"
#: kept up to date on a Notebook by Kubeflow's own culler (ENABLE_CULLING=true)
LAST_ACTIVITY_ANNOTATION = "notebooks.kubeflow.org/last-activity"
#: labels the Notebook controller (v1) and the Workspace controller (v2) put on their pods
V1_POD_LABEL = "notebook-name"
V2_POD_LABEL = "notebooks.kubeflow.org/workspace-name"
#: jupyter-server's /api/status is a few hundred bytes, /api/kernels as much per kernel; a
#: tenant's server answers whatever it likes, so the culler reads at most this much of either
STATUS_MAX_BYTES = 64 * 1024
#: a kernel in this execution_state is not running code; any other state (busy, starting, one
#: unknown) is (Kubeflow's KERNEL_EXECUTION_STATE_IDLE, culling_controller.go)
KERNEL_IDLE = "idle"
LABEL_POOL = "fracspawner.io/pool"
LABEL_GPU = "fracspawner.io/gpu"


# --------------------------------------------------------------------------- pure part
@dataclass(frozen=True)
class Notebook:
    kind: str  # "Notebook" (v1) or "Workspace" (v2)
    namespace: str
    name: str
    pod: Mapping[str, Any] | None
    stopped: bool
    recorded_activity: float | None  # what Kubeflow itself recorded, unix seconds
    # the resourceVersion it was read at: the stop patch's precondition ("" none)
    resource_version: str = ""
    # when Kubeflow's record was read from the server (a Workspace's status.activity
    # .lastUpdate, its probe's end); None: not said
    recorded_at: float | None = None

    @property
    def log_name(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"


@dataclass(frozen=True)
class Probed:
    """What a notebook server answered: its `/api/status` last_activity (clamped at the
    answer's arrival) and the execution states of its kernels that are not idle
    (`/api/kernels`; empty: every kernel idle, or none)."""

    last_activity: float
    running: tuple[str, ...] = ()


def kernels_url(status_url: str) -> str:
    """The server's `/api/kernels` beside its `/api/status` (the same base), asked with
    `no_track_activity=1`: jupyter-server counts any other API request as activity (its
    APIHandler.update_api_activity), which would keep every notebook the culler reads active.
    ValueError when the URL's path does not end in /api/status."""
    parts = urlsplit(status_url)
    if not parts.path.endswith("/api/status"):
        raise ValueError(f"{status_url!r}: the path does not end in /api/status")
    query = "&".join(q for q in ("no_track_activity=1", parts.query) if q)
    return urlunsplit(parts._replace(path=parts.path[: -len("status")] + "kernels", query=query))


def running_kernels(body: bytes) -> tuple[str, ...]:
    """The execution states of the kernels in a `/api/kernels` answer that are not idle (a
    missing or odd state counts as running: unknown is never idle). ValueError when the answer
    is not jupyter-server's list of kernel models."""
    kernels = json.loads(body)
    if not isinstance(kernels, list) or not all(isinstance(k, dict) for k in kernels):
        raise ValueError("not a list of kernels")
    states = (k.get("execution_state") for k in kernels)
    return tuple(str(state) for state in states if state != KERNEL_IDLE)


def parse_time(value: Any) -> float | None:
    """RFC 3339 text or UNIX seconds (or milliseconds) -> unix seconds; None if unusable."""
    if isinstance(value, bool) or value in (None, "", 0):
        return None
    if isinstance(value, (int, float)):
        seconds = float(value)
        return seconds / 1000 if seconds > 1e11 else seconds  # epoch ms in some v2 alphas
    try:
        text = str(value).replace("Z", "+00:00")
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.timestamp()


def rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def find_notebooks(
    notebooks: list[Mapping[str, Any]],
    workspaces: list[Mapping[str, Any]],
    pods: list[Mapping[str, Any]],
) -> list[Notebook]:
    """Every Notebook and Workspace with its pod (None while it has none)."""
    by_name = {(_meta(p).get("namespace"), _meta(p).get("name")): p for p in pods}
    by_workspace = {
        (_meta(p).get("namespace"), (_meta(p).get("labels") or {}).get(V2_POD_LABEL)): p
        for p in pods
        if V2_POD_LABEL in (_meta(p).get("labels") or {})
    }
    out = []
    for nb in notebooks:
        ns, name = _meta(nb).get("namespace", ""), _meta(nb).get("name", "")
        annotations = _meta(nb).get("annotations") or {}
        pod = by_name.get((ns, f"{name}-0"))  # the StatefulSet's only pod
        if pod is not None and (_meta(pod).get("labels") or {}).get(V1_POD_LABEL) != name:
            pod = None
        out.append(
            Notebook(
                "Notebook",
                ns,
                name,
                pod,
                STOP_ANNOTATION in annotations,
                parse_time(annotations.get(LAST_ACTIVITY_ANNOTATION)),
                str(_meta(nb).get("resourceVersion") or ""),
            )
        )
    for ws in workspaces:
        ns, name = _meta(ws).get("namespace", ""), _meta(ws).get("name", "")
        status = ws.get("status") or {}
        out.append(
            Notebook(
                "Workspace",
                ns,
                name,
                by_workspace.get((ns, name)),
                bool((ws.get("spec") or {}).get("paused")),
                parse_time((status.get("activity") or {}).get("lastActivity")),
                str(_meta(ws).get("resourceVersion") or ""),
                parse_time((status.get("activity") or {}).get("lastUpdate")),
            )
        )
    return out


def gpu_of(pod: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(slice, pool) of a pod: its fracspawner labels, else "gpu" for any GPU resource in a
    container's limits (a notebook from Kubeflow's own GPU field) or a DRA claim a container
    uses (`resources.claims`: a GPU asked through a ResourceClaim holds no extended resource)."""
    labels = _meta(pod).get("labels") or {}
    if labels.get(LABEL_GPU):
        return str(labels[LABEL_GPU]), labels.get(LABEL_POOL)
    for container in (pod.get("spec") or {}).get("containers") or []:
        if (container.get("resources") or {}).get("claims"):
            return "gpu", None
        for key, value in ((container.get("resources") or {}).get("limits") or {}).items():
            if ("gpu" in key or key.startswith("nvidia.com/mig-")) and str(value) not in ("0", ""):
                return "gpu", None
    return None, None


def server_facts(nb: Notebook, activity: float | None) -> ServerFacts:
    """The notebook as the decision functions see a server (`user` is the namespace)."""
    pod = nb.pod or {}
    status = pod.get("status") or {}
    ready = status.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    gpu, pool = gpu_of(pod)
    options = {k: v for k, v in (("gpu", gpu), ("pool", pool)) if v}
    return ServerFacts(
        user=nb.namespace,
        name=nb.name,
        user_options=options,
        started=parse_time(status.get("startTime")),
        last_activity=activity,
        ready=ready,
    )


def stop_request(nb: Notebook, now: float) -> tuple[tuple[str, str, str], dict[str, Any]]:
    """(group, version, plural) and the merge patch that stops the notebook.

    The patch carries the resourceVersion the notebook was judged at: the API server applies
    it only to that version (409 Conflict otherwise), so a notebook stopped and started again
    since it was read (its user, or another culler replica) is not stopped on what was read of
    the previous run."""
    meta: dict[str, Any] = {"resourceVersion": nb.resource_version} if nb.resource_version else {}
    if nb.kind == "Notebook":
        return NOTEBOOKS, {"metadata": {**meta, "annotations": {STOP_ANNOTATION: rfc3339(now)}}}
    return WORKSPACES, {**({"metadata": meta} if meta else {}), "spec": {"paused": True}}


class Changed(Exception):
    """The notebook changed since it was read (409 to the stop patch): not stopped."""


@dataclass
class Outcome:
    notebook: Notebook
    decision: Decision
    pool: str = ""
    gpu: GpuFacts | None = None
    done: bool = False


# --------------------------------------------------------------------------- the service
def _forbidden(answer: Answer, needs: str) -> str | None:
    """For a 403 the admin's words: the apiserver's message and what in the chart grants it."""
    return refused(
        answer,
        component="the Kubeflow culler",
        needs=needs,
        grant=lambda _: (
            "the chart's kubeflow-culler ClusterRole grants list and patch on notebooks and "
            "workspaces and list on pods, bound in every namespace or in each of "
            "kubeflowCuller.namespaces: check that rbac.create is true and that it and its "
            "bindings are installed as the chart renders them"
        ),
    )


class ListFailed(RuntimeError):
    """A list the API server answered with a status other than 200 (its words in the message;
    for a 403 the admin's, `_forbidden`)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


#: times a list answered 429 is asked again (client-go's rest.Request retries up to 10)
_RETRIES_429 = 5


def retry_after(header: str | None, body: bytes) -> float:
    """Seconds to wait before asking again after a 429: the Retry-After header, else the
    Status's details.retryAfterSeconds, else 1; at most 10."""
    for raw in (header, _status_retry_after(body)):
        try:
            seconds = float(raw)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
        if seconds >= 0:
            return min(seconds, 10.0)
    return 1.0


def _status_retry_after(body: bytes) -> Any:
    try:
        status = json.loads(body)
    except ValueError:
        return None
    details = status.get("details") if isinstance(status, dict) else None
    return details.get("retryAfterSeconds") if isinstance(details, dict) else None


class KubeflowCuller(CullerApplication):
    name = "fracspawner-culler-kubeflow"
    description = "Stop idle GPU notebooks of Kubeflow (Notebooks 1.x and 2.0), counting GPU work."

    kubeconfig = Unicode(
        "",
        config=True,
        help="kubeconfig file; '' for in-cluster config in a pod, else $KUBECONFIG or "
        "~/.kube/config.",
    )
    namespaces = List(
        Unicode(), config=True, help="Profile namespaces to watch; empty: every namespace."
    )
    catalog = Unicode(
        "",
        config=True,
        help="The fracspawner catalog (YAML): its idle policy, per pool (a pod's pool is its "
        "fracspawner.io/pool label). Required.",
    )
    cull_every = Integer(300, config=True, help="Seconds between culling cycles.")
    dry_run = Bool(False, config=True, help="Log what would be stopped, stop nothing.")
    gpu_only = Bool(
        True,
        config=True,
        help="Judge only notebooks holding a GPU; CPU notebooks are left to Kubeflow's own "
        "culler (ENABLE_CULLING). Off: server_idle applies to them too.",
    )
    request_timeout = Float(10.0, config=True, help="Seconds before an HTTP request fails.")
    max_staleness = Float(
        300.0,
        config=True,
        help="GPU data older than this (seconds) counts as missing: no culling on GPU grounds.",
    )
    status_url = Unicode(
        "http://{name}.{namespace}.svc.{cluster_domain}/notebook/{namespace}/{name}/api/status",
        config=True,
        help="Where a v1 notebook's jupyter-server answers /api/status (its last_activity); "
        "fields {name}, {namespace}, {pod_ip}, {cluster_domain}. Its /api/kernels beside it is "
        "read too (a running kernel is activity), so the path ends in /api/status. The default "
        "goes through the notebook's Service, as Kubeflow's own culler does. '' to not ask.",
    )
    workspace_status_url = Unicode(
        "",
        config=True,
        help="The same for v2 Workspaces (fields as status_url); '' uses only the Workspace's "
        "status.activity.lastActivity.",
    )
    cluster_domain = Unicode("cluster.local", config=True, help="The cluster's DNS domain.")

    # --- GPU source (the hub culler's names) ---------------------------------------------------
    prometheus_url = Unicode(
        "", config=True, help="Prometheus with dcgm-exporter metrics; '' for none (fail-safe)."
    )
    utilization_metrics = Dict(
        {"DCGM_FI_DEV_GPU_UTIL": 1.0, "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 100.0},
        config=True,
        help="Utilisation metrics -> factor to percent.",
    )
    memory_metric = Unicode("DCGM_FI_DEV_FB_USED", config=True, help="GPU memory used (MiB).")
    pod_label = Unicode(
        "pod", config=True, help="Label holding the workload pod ('exported_pod' likewise)."
    )
    namespace_label = Unicode(
        "namespace", config=True, help="Label holding the pod's namespace ('exported_namespace')."
    )
    dcgm_job = Unicode(
        DEFAULT_JOB,
        config=True,
        help="The Prometheus scrape job of dcgm-exporter: only its series are GPU evidence "
        "(nvidia-dcgm-exporter under the GPU Operator; docs/culler.md). Never empty.",
    )
    extra_selector = Unicode("", config=True, help="Extra label matchers for the dcgm series.")
    busy_threshold = Float(1.0, config=True, help="Utilisation (percent) that counts as busy.")
    max_sample_gap = Float(
        150.0, config=True, help="Seconds between samples that still count as covered."
    )
    coverage_step = Float(15.0, config=True, help="Finest step (seconds) of the coverage check.")

    metrics_port = Integer(0, config=True, help="Serve /metrics at this port; 0 = off.")
    metrics_ip = Unicode("0.0.0.0", config=True, help="Address for the /metrics server.")

    aliases = {
        "kubeconfig": "KubeflowCuller.kubeconfig",
        "namespace": "KubeflowCuller.namespaces",
        "catalog": "KubeflowCuller.catalog",
        "cull-every": "KubeflowCuller.cull_every",
        "prometheus-url": "KubeflowCuller.prometheus_url",
        "status-url": "KubeflowCuller.status_url",
        "workspace-status-url": "KubeflowCuller.workspace_status_url",
        "metrics-port": "KubeflowCuller.metrics_port",
        "log-level": "Application.log_level",
    }
    flags = {
        "dry-run": ({"KubeflowCuller": {"dry_run": True}}, "Log what would be stopped."),
        "all-notebooks": (
            {"KubeflowCuller": {"gpu_only": False}},
            "Also stop CPU notebooks idle past server_idle.",
        ),
    }

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._catalog: Catalog | None = None
        self._api: Any = None
        #: namespace -> how it failed (the status, or the error's type) while it cannot be read
        self.unreadable: dict[str, str] = {}

    def initialize(self, argv: list[str] | None = None) -> None:
        super().initialize(argv)
        if not self.catalog:
            raise CatalogError("--catalog is required")
        if self.prometheus_url and not self.dcgm_job:
            raise SystemExit(
                "fracspawner culler kubeflow: KubeflowCuller.dcgm_job is empty: name "
                "dcgm-exporter's scrape job (series from any other job are not GPU evidence)"
            )
        for option, template in (
            ("status_url", self.status_url),
            ("workspace_status_url", self.workspace_status_url),
        ):
            try:
                if template:
                    kernels_url(template)
            except ValueError:
                raise SystemExit(
                    f"fracspawner culler kubeflow: KubeflowCuller.{option} {template!r} does "
                    "not end in /api/status: the culler reads the server's /api/kernels beside "
                    "it (a running kernel is activity)"
                ) from None
        self._catalog = load_catalog(self.catalog)

    def rules(self) -> Rules:
        return Rules(max_staleness=self.max_staleness)

    def dcgm(self) -> DcgmConfig:
        return DcgmConfig(
            utilization_metrics=dict(self.utilization_metrics),
            memory_metric=self.memory_metric,
            pod_label=self.pod_label,
            namespace_label=self.namespace_label,
            namespace=self.namespaces[0] if len(self.namespaces) == 1 else None,
            job=self.dcgm_job,
            extra_selector=self.extra_selector,
            busy_threshold=self.busy_threshold,
            max_gap=self.max_sample_gap,
            min_step=self.coverage_step,
        )

    # --- Kubernetes ---------------------------------------------------------------------------
    async def _client(self) -> Any:
        """The API client of this cycle (one per cycle: it belongs to the cycle's event loop;
        a cycle every few minutes can afford building it)."""
        if self._api is None:
            from kubernetes_asyncio import client

            configuration = await load_configuration(self.kubeconfig or None)
            self._api = client.ApiClient(configuration)
        return self._api

    async def _close_client(self) -> None:
        api, self._api = self._api, None
        if api is not None:
            await api.close()

    async def _list(
        self, path: str, selector: str = "", optional: bool = False
    ) -> list[dict[str, Any]]:
        """GET a list from the API server (raw JSON); a kind not served is [] when optional."""
        api = await self._client()
        for attempt in range(_RETRIES_429 + 1):
            response = await api.call_api(
                path,
                "GET",
                query_params=[("labelSelector", selector)] if selector else [],
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=self.request_timeout,
            )
            response = response[0] if isinstance(response, tuple) else response
            body = await response.read()
            if response.status != 429 or attempt == _RETRIES_429:
                break
            # "storage is (re)initializing": the apiserver's watch cache of a kind is not
            # ready yet (the first list of a CRD's objects, an apiserver just started); it
            # says when to ask again, and client-go waits and retries (rest/request.go)
            headers = getattr(response, "headers", None) or {}
            await asyncio.sleep(retry_after(headers.get("Retry-After"), body))
        if response.status == 404 and optional:
            return []
        if response.status != 200:
            words = _forbidden(Answer(response.status, body), f"list {path}")
            raise ListFailed(
                response.status, f"GET {path}: " + (words or f"{response.status} {body[:200]!r}")
            )
        return json.loads(body).get("items") or []

    async def _read_scope(self, namespace: str | None) -> list[Notebook]:
        """The Notebooks, Workspaces (none where Notebooks 2.0 is not installed) and their pods
        of one namespace (None: of every namespace). All four lists are read to the end; the
        first that failed is raised then (no half of a namespace is judged)."""
        prefix = "" if namespace is None else f"/namespaces/{namespace}"
        v1 = "/apis/{}/{}".format(*NOTEBOOKS[:2]) + prefix
        v2 = "/apis/{}/{}".format(*WORKSPACES[:2]) + prefix
        pods = f"/api/v1{prefix}/pods"
        lists = await asyncio.gather(
            self._list(f"{v1}/{NOTEBOOKS[2]}"),
            self._list(f"{v2}/{WORKSPACES[2]}", optional=True),
            self._list(pods, V1_POD_LABEL),
            self._list(pods, V2_POD_LABEL),
            return_exceptions=True,
        )
        failures = [items for items in lists if isinstance(items, BaseException)]
        if failures:
            raise failures[0]
        notebooks, workspaces, v1_pods, v2_pods = cast("list[list[dict[str, Any]]]", lists)
        return find_notebooks(notebooks, workspaces, [*v1_pods, *v2_pods])

    async def read_cluster(self) -> list[Notebook]:
        """Notebooks, Workspaces (none where Notebooks 2.0 is not installed) and their pods, of
        every namespace or of each of `namespaces`.

        A namespace of `namespaces` that cannot be read (a list of it answered 403: its
        RoleBinding is missing, or the namespace was deleted and its binding with it; or a
        request failed on its way) is left out of this cycle whole: its notebooks are neither
        judged nor stopped (unknown is never idle, and no notebook is judged without its pods'
        list), while the other namespaces are culled as usual (`skip_unreadable`). A cycle
        that read no namespace failed, as one whose lists of every namespace failed has."""
        if not self.namespaces:
            return await self._read_scope(None)
        namespaces = list(dict.fromkeys(self.namespaces))
        read = await asyncio.gather(
            *(self._read_scope(ns) for ns in namespaces), return_exceptions=True
        )
        failed: dict[str, BaseException] = {}
        found: list[Notebook] = []
        for ns, result in zip(namespaces, read, strict=True):
            if isinstance(result, Exception):
                failed[ns] = result
            elif isinstance(result, BaseException):
                raise result  # cancelled
            else:
                found.extend(result)
        self.skip_unreadable(namespaces, failed)
        if len(failed) == len(namespaces):
            raise RuntimeError(
                f"no namespace of the culler's could be read ({', '.join(namespaces)}): "
                f"{next(iter(failed.values()))}"
            )
        return found

    def skip_unreadable(self, namespaces: list[str], failed: Mapping[str, BaseException]) -> None:
        """Say which namespaces this cycle could not read: the gauge
        fracspawner_culler_namespace_unreadable for each of `namespaces` (the admin's list,
        so a bounded label), and the log once per namespace per change: a warning (with the
        apiserver's words and what in the chart grants the list, for a 403) when a namespace
        becomes unreadable or fails another way, debug while it stays so, info once it can be
        read again. Every cycle repeating the warning would bury the rest of the log."""
        for ns in namespaces:
            exc = failed.get(ns)
            self.metrics.namespace_unreadable.labels(ns).set(int(exc is not None))
            before = self.unreadable.get(ns)
            if exc is None:
                if before is not None:
                    del self.unreadable[ns]
                    self.log.info(
                        "namespace %s can be read again: its notebooks are judged again", ns
                    )
                continue
            state = str(exc.status) if isinstance(exc, ListFailed) else type(exc).__name__
            self.unreadable[ns] = state
            log = self.log.debug if before == state else self.log.warning
            log(
                "namespace %s cannot be read (%s): its notebooks are kept, not judged, until "
                "it can be; the culler's other namespaces are culled as usual",
                ns,
                exc if isinstance(exc, ListFailed) else f"{type(exc).__name__}: {exc}",
            )

    async def stop(self, nb: Notebook, now: float) -> None:
        (group, version, plural), patch = stop_request(nb, now)
        api = await self._client()
        path = f"/apis/{group}/{version}/namespaces/{nb.namespace}/{plural}/{nb.name}"
        response = await api.call_api(
            path,
            "PATCH",
            header_params={
                "Accept": "application/json",
                "Content-Type": "application/merge-patch+json",
            },
            body=patch,
            auth_settings=["BearerToken"],
            _preload_content=False,
            _request_timeout=self.request_timeout,
        )
        response = response[0] if isinstance(response, tuple) else response
        body = await response.read()
        if response.status == 409:
            raise Changed(f"PATCH {path}: 409 {body[:300]!r}")
        if response.status != 200:
            words = _forbidden(Answer(response.status, body), f"patch {path}")
            raise RuntimeError(f"PATCH {path}: " + (words or f"{response.status} {body[:300]!r}"))

    # --- activity and GPU ---------------------------------------------------------------------
    async def probe(self, http: AsyncHTTPClient, nb: Notebook) -> Probed | None:
        """What the notebook server says (GET /api/status, then GET /api/kernels beside it);
        None if either is not learnt: a server that answered its status but not its kernels
        did not answer (unknown is never idle)."""
        template = self.status_url if nb.kind == "Notebook" else self.workspace_status_url
        if not template or nb.pod is None:
            return None
        url = template.format(
            name=nb.name,
            namespace=nb.namespace,
            pod_ip=(nb.pod.get("status") or {}).get("podIP", ""),
            cluster_domain=self.cluster_domain,
        )
        try:
            seen = parse_time(json.loads(await self._get(http, url)).get("last_activity"))
            if seen is None:
                return None
            url = kernels_url(url)
            running = running_kernels(await self._get(http, url))
        except (HTTPClientError, OSError, ValueError, AttributeError, StreamClosedError) as exc:
            self.log.info("%s: its activity is unknown (%s %s)", nb.log_name, url, exc)
            return None
        # a time after the answer came is not activity that happened: clamped, as the hub
        # culler clamps a server's reported times at their arrival (reports.py _ts)
        return Probed(min(seen, time.time()), running)

    async def _get(self, http: AsyncHTTPClient, url: str) -> bytes:
        """GET from a notebook server: the notebook is the tenant's, so no redirect (it could
        send the culler anywhere) and a bounded body (the client's max_body_size, see
        cull_once); ValueError for an answer other than 200."""
        response = await http.fetch(
            url, request_timeout=self.request_timeout, follow_redirects=False
        )
        if response.code != 200:
            raise ValueError(f"answered {response.code}")
        return response.body

    async def prometheus_facts(
        self, http: AsyncHTTPClient, notebooks: list[Notebook], at: float | None
    ) -> dict[tuple[str, str], GpuFacts] | None:
        """(namespace, pod) -> facts in one query; None when Prometheus is down."""
        assert self._catalog is not None
        policies = []
        for nb in notebooks:
            gpu, pool = gpu_of(nb.pod or {})
            policies.append(policy_for_server(self._catalog, pool, gpu).policy)
        windows = gpu_windows(policies)
        if not windows:
            return {}
        cfg = self.dcgm()
        try:
            result = await prom_query(
                http, self.prometheus_url, build_query(cfg, windows),
                timeout=self.request_timeout, at=at,
            )  # fmt: skip
        except PrometheusError as exc:
            self.log.warning(
                "GPU source prometheus is down (%s): no notebook is stopped on GPU grounds", exc
            )
            return None
        return parse_result(result, cfg, windows)

    # --- one cycle ----------------------------------------------------------------------------
    async def cull_once(self, now: float | None = None) -> list[Outcome]:
        started = time.perf_counter()
        assert self._catalog is not None
        http = AsyncHTTPClient(force_instance=True)
        try:
            found = [nb for nb in await self.read_cluster() if not nb.stopped and nb.pod]
            judged = [nb for nb in found if not self.gpu_only or gpu_of(nb.pod or {})[0]]
            at = now
            now = time.time() if now is None else now
            prom: dict[tuple[str, str], GpuFacts] | None = {}
            if self.prometheus_url:
                prom = await self.prometheus_facts(http, judged, at)
                self.metrics.source_up.labels("prometheus").set(int(prom is not None))
            probes = AsyncHTTPClient(force_instance=True, max_body_size=STATUS_MAX_BYTES)
            try:
                activity = await asyncio.gather(*(self.probe(probes, nb) for nb in judged))
            finally:
                probes.close()
            outcomes = [
                self.judge(
                    nb,
                    None if probed is None else probed.last_activity,
                    prom,
                    now,
                    running=() if probed is None else probed.running,
                )
                for nb, probed in zip(judged, activity, strict=True)
            ]
            await asyncio.gather(*(self.act(o, now) for o in outcomes))
        finally:
            http.close()
            await self._close_client()
        self.metrics.cycle_duration.observe(time.perf_counter() - started)
        self.metrics.last_cycle.set(time.time())
        self.metrics.servers.set(len(outcomes))
        return outcomes

    def judge(
        self,
        nb: Notebook,
        probed: float | None,
        prom: dict[tuple[str, str], GpuFacts] | None,
        now: float,
        running: tuple[str, ...] = (),
    ) -> Outcome:
        """Decide on `nb`: `probed` is its server's last_activity (None: not asked or no
        answer), `running` the execution states of its kernels that are not idle."""
        assert self._catalog is not None and nb.pod is not None
        recorded = nb.recorded_activity
        if nb.kind == "Notebook" and self.status_url and probed is None:
            # its server was asked and did not answer: Kubeflow's last-activity annotation is
            # no substitute (its culler leaves it as it was when its own probe fails or finds
            # no kernel: culling_controller.go), so the activity is unknown
            recorded = None
        if nb.kind == "Workspace" and recorded is not None and probed is None:
            # the Workspace controller's probe read it at lastUpdate (every
            # probeIntervalSeconds, 1 h by default; a failed probe advances neither): idle is
            # known only until then, and it pauses only on a fresh probe (workspace_activity.go
            # evaluatePauseDecision), so the time since counts as not idle
            if nb.recorded_at is None:
                recorded = None
            else:
                recorded += now - min(max(nb.recorded_at, recorded), now)
        # what Kubeflow recorded can be ahead too (a Notebook's annotations are the tenant's
        # to edit): nothing counts as later than now
        times = [min(t, now) for t in (probed, recorded) if t is not None]
        facts = server_facts(nb, max(times) if times else None)
        if running and times:
            # a running kernel is activity now (Kubeflow's culler sets last-activity to now
            # for it), but not user activity: last_activity stays the user's, which
            # server_unattended reads (ServerFacts.user_activity), as GPU work is on the hub
            facts = replace(facts, own_last_activity=now)
        pool, policy = policy_for_server(self._catalog, facts.pool, facts.gpu_slice).astuple()
        pool = metrics_pool(self._catalog, pool)  # the pod's label is the tenant's text
        if not times:  # unknown is never idle
            decision = Decision(
                "keep", "activity_unknown", "its activity is unknown: kept", gpu_failsafe=True
            )
            return Outcome(nb, decision, pool)
        sources: dict[str, GpuFacts | None] = {}
        found = None
        if self.prometheus_url:
            pod_name = _meta(nb.pod).get("name", "")
            found = None if prom is None else prom.get((nb.namespace, pod_name))
            if found is not None or facts.gpu_slice is not None:
                sources["prometheus"] = found
        reading = combine(sources, now, self.rules())
        decision = decide_server(facts, reading, policy, now, self.rules())
        if running and decision.reason == "active":
            # kept for the activity the running kernel is: say so
            decision = Decision(
                "keep",
                "kernel_running",
                f"a kernel is running (execution_state {', '.join(sorted(set(running)))}): "
                "activity now, as Kubeflow's culler counts it; only server_unattended (no "
                "user activity) or max_age stops it",
                gpu_failsafe=decision.gpu_failsafe,
            )
        return Outcome(nb, decision, pool, found)

    async def act(self, outcome: Outcome, now: float) -> None:
        nb, d = outcome.notebook, outcome.decision
        prefix = "[dry run] would " if self.dry_run else ""
        if d.gpu_failsafe:
            self.metrics.failsafe.labels(outcome.pool).inc()
        if not d.cull:
            log = self.log.info if d.gpu_failsafe else self.log.debug
            log("keep %s: %s (%s)", nb.log_name, d.message, d.reason)
            return
        self.log.info("%sstop %s: %s (%s)", prefix, nb.log_name, d.message, d.reason)
        if self.dry_run:
            return
        try:
            await self.stop(nb, now)
        except Changed:
            self.log.info(
                "%s changed since it was read (started again, stopped or edited): not "
                "stopped; judged again next cycle",
                nb.log_name,
            )
            return
        except Exception as exc:  # one failed PATCH must not end the cycle
            self.log.error("stopping %s failed: %s", nb.log_name, exc)
            return
        outcome.done = True
        self.metrics.culls.labels(d.reason, outcome.pool).inc()
        if outcome.gpu is not None:
            self.metrics.reclaimed.labels(outcome.pool).inc(outcome.gpu.memory_mib)

    # --- the service --------------------------------------------------------------------------
    async def run(self) -> None:
        if self.metrics_port:
            registry = self.metrics.registry

            class MetricsHandler(web.RequestHandler):
                def get(self) -> None:
                    self.set_header("Content-Type", CONTENT_TYPE_LATEST)
                    self.write(generate_latest(registry))

            HTTPServer(web.Application([(r"/metrics", MetricsHandler)])).listen(
                self.metrics_port, self.metrics_ip
            )
        self.log.info(
            "culling Kubeflow notebooks every %ss in %s; GPU source: %s%s",
            self.cull_every,
            ", ".join(self.namespaces) or "every namespace",
            self.prometheus_url or "none (plain idle timeouts only)",
            " [dry run]" if self.dry_run else "",
        )
        while True:
            try:
                outcomes = await self.cull_once()
                self.log.info(
                    "cycle: %d notebooks judged, %d stopped%s",
                    len(outcomes),
                    sum(o.done for o in outcomes),
                    f"; namespaces not read: {', '.join(sorted(self.unreadable))}"
                    if self.unreadable
                    else "",
                )
            except Exception:  # the service must outlive an API server restart
                self.log.exception("culling cycle failed")
            await asyncio.sleep(self.cull_every)

    def start(self) -> None:
        asyncio.run(self.run())


def main(argv: list[str]) -> int:
    app = KubeflowCuller()
    try:
        app.initialize(argv)
    except CatalogError as exc:
        print(f"fracspawner culler kubeflow: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    app.start()
    return 0


__all__ = [
    "KubeflowCuller",
    "Notebook",
    "Probed",
    "find_notebooks",
    "fmt",
    "kernels_url",
    "running_kernels",
    "server_facts",
    "stop_request",
]
