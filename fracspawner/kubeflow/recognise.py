"""Which pods are notebooks, and what GPU a pod holds, read from what reaches the pod. Pure.

Kubeflow's controllers decide what reaches a notebook's pod, not the catalog:
- Notebooks 1.x (kubeflow/notebooks `notebooks-v1` components/notebook-controller/controllers/
  notebook_controller.go generateStatefulSet): pod labels `statefulset` and `notebook-name`
  plus the Notebook's own labels; the pod spec is the Notebook's `spec.template.spec`;
- Notebooks 2.0 (kubeflow/notebooks `notebooks-v2` workspaces/controller/internal/controller/
  workspace_controller.go generateStatefulSet): pod labels from the WorkspaceKind's and the
  Workspace's `podMetadata` plus `notebooks.kubeflow.org/workspace-name` and `statefulset`;
  from the chosen podConfig ONLY `resources` (of the container `main`), `nodeSelector`,
  `tolerations` and `affinity`: never its `spawner.labels`.
So a slice is recognised from the GPU resources of every known backend, the pod fields a
backend owns (Run:ai/KAI's `gpu-fraction`/`gpu-memory` annotations, ClearML's injector label)
and the pool's node selector, not from labels a controller never copies.

`gpu_equivalent_of_pod` is what any pod (notebook or not) holds, in GPU-equivalents, for the
namespace quota: an exact catalog plan counts as that plan (the most specific pool whose node
selector the pod carries); anything else counts as the most it can get (a whole GPU per
`nvidia.com/gpu`, HAMi's memory or cores without a count as the one GPU HAMi gives them).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from ..backends import plan_slice
from ..backends.base import PodPlan
from ..k8s.objects import quantity
from ..model.catalog import Catalog
from .quota import pod_gpu

#: Notebooks 1.x: the notebook controller labels each pod with its Notebook's name
V1_NOTEBOOK_LABEL = "notebook-name"
#: Notebooks 2.0: the workspace controller labels each pod with its Workspace's name
V2_WORKSPACE_LABEL = "notebooks.kubeflow.org/workspace-name"

#: extended resources through which a container gets GPU, for every backend fracspawner knows
#: (shared/reference/gpu-backends.md): the NVIDIA device plugin (whole GPUs, time-slicing and
#: MPS replicas, renamed `.shared`), HAMi (`gpumem`, `gpumem-percentage`, `gpucores`,
#: `priority`), Volcano vGPU, Aliyun gpushare, ClearML's legacy fraction resources, and the
#: other vendors the Kubeflow notebook form offers by default (JWA spawner_ui_config.yaml)
GPU_RESOURCES = frozenset(
    {
        "nvidia.com/gpu",
        "nvidia.com/gpu.shared",
        "nvidia.com/gpumem",
        "nvidia.com/gpumem-percentage",
        "nvidia.com/gpucores",
        "nvidia.com/priority",
        "volcano.sh/vgpu-number",
        "volcano.sh/vgpu-memory",
        "volcano.sh/vgpu-memory-percentage",
        "volcano.sh/vgpu-cores",
        "aliyun.com/gpu-mem",
        "aliyun.com/gpu-count",
        "amd.com/gpu",
        "habana.ai/gaudi",
    }
)
GPU_RESOURCE_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-", "volcano.sh/vgpu-", "clear.ml/")
#: resources that are devices (a count); the others (HAMi/Volcano memory and cores, priority)
#: only shape a device, and imply one when asked without a count
_DEVICE_COUNTS = (
    "nvidia.com/gpu",
    "nvidia.com/gpu.shared",
    "volcano.sh/vgpu-number",
    "aliyun.com/gpu-count",
    "amd.com/gpu",
    "habana.ai/gaudi",
)
#: backend-owned pod fields that ask for a GPU without a resource: Run:ai / KAI annotations
#: (run-ai docs "fractions"; kai-scheduler docs/gpu-sharing), ClearML's injector label
ASK_ANNOTATIONS = ("gpu-fraction", "gpu-memory", "gpu-fraction-num-devices")
ASK_LABELS = ("clearml-injector/fraction",)
_MIG = re.compile(r"^nvidia\.com/mig-(\d+)g\.")


def is_gpu_resource(name: str) -> bool:
    """Whether `name` is an extended resource through which a known backend hands out GPU."""
    return name in GPU_RESOURCES or name.startswith(GPU_RESOURCE_PREFIXES)


def notebook_kind(pod: Mapping[str, Any]) -> str | None:
    """ "v1" for a Notebook's pod, "v2" for a Workspace's, None for any other pod (a pipeline
    step, a Katib trial, a pod a tenant made): the labels the controllers put on every pod
    they make (module docstring), which is also what the webhook configuration's
    objectSelector matches."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    if V1_NOTEBOOK_LABEL in labels:
        return "v1"
    if V2_WORKSPACE_LABEL in labels:
        return "v2"
    return None


def gpu_asks(container: Mapping[str, Any]) -> dict[str, Decimal]:
    """The container's GPU resources, name -> amount (limits; a request alone counts too)."""
    resources = container.get("resources") or {}
    out: dict[str, Decimal] = {}
    for part in ("requests", "limits"):  # limits last: for extended resources they rule
        for name, value in (resources.get(part) or {}).items():
            if is_gpu_resource(str(name)):
                amount = quantity(value)
                # malformed amounts count as one device (the API server refuses them anyway)
                out[str(name)] = amount if amount is not None and amount >= 0 else Decimal(1)
    return {k: v for k, v in out.items() if v > 0}


def pod_asks(pod: Mapping[str, Any]) -> dict[str, str]:
    """The backend-owned annotations and labels of the pod that ask for a GPU."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    out = {f"annotation {k}": str(annotations[k]) for k in ASK_ANNOTATIONS if k in annotations}
    out.update({f"label {k}": str(labels[k]) for k in ASK_LABELS if k in labels})
    return out


#: every list of containers a pod has: ephemeral ones join a running pod through the
#: pods/ephemeralcontainers subresource (kubectl debug) and may carry env like any other
CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")


def containers_of(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    spec = pod.get("spec") or {}
    return [c for key in CONTAINER_LISTS for c in (spec.get(key) or []) if isinstance(c, Mapping)]


# --------------------------------------------------------------------------- catalog plans
@dataclass(frozen=True)
class KnownPlan:
    """One offer of one pool, as it shows on a pod."""

    pool: str
    offer: str
    resources: Mapping[str, Decimal]  # GPU resources of the plan
    asks: Mapping[str, str]  # its backend-owned ask fields (pod_asks keys)
    node_selector: Mapping[str, str]
    gpu_equivalent: float


def _plan_fields(plan: PodPlan) -> tuple[dict[str, Decimal], dict[str, str]]:
    resources = {
        k: quantity(v) or Decimal(0)
        for k, v in {**plan.requests, **plan.limits}.items()
        if is_gpu_resource(k)
    }
    asks = {f"annotation {k}": v for k, v in plan.annotations.items() if k in ASK_ANNOTATIONS}
    asks.update({f"label {k}": v for k, v in plan.labels.items() if k in ASK_LABELS})
    return {k: v for k, v in resources.items() if v > 0}, asks


_INDEX: dict[int, tuple[Catalog, tuple[KnownPlan, ...]]] = {}


def known_plans(catalog: Catalog) -> tuple[KnownPlan, ...]:
    """Every offer of every pool, in catalog order (computed once per catalog object)."""
    cached = _INDEX.get(id(catalog))
    if cached is not None and cached[0] is catalog:
        return cached[1]
    plans = []
    for name, pool in catalog.pools.items():
        for offer in pool.offers:
            plan = plan_slice(offer, pool, None)
            resources, asks = _plan_fields(plan)
            plans.append(
                KnownPlan(
                    name, str(offer), resources, asks, dict(plan.node_selector), plan.gpu_equivalent
                )
            )
    if len(_INDEX) > 8:  # a process loads one or two catalogs; tests load many
        _INDEX.clear()
    _INDEX[id(catalog)] = (catalog, tuple(plans))
    return tuple(plans)


def catalog_resources(catalog: Catalog) -> frozenset[str]:
    """GPU resource names the catalog's plans use (a third-party backend's among them)."""
    return frozenset(k for p in known_plans(catalog) for k in p.resources)


def matching_plans(
    resources: Mapping[str, Decimal],
    asks: Mapping[str, str],
    plans: Iterable[KnownPlan],
) -> list[KnownPlan]:
    """The plans that put exactly these GPU resources and backend ask fields on a pod."""
    return [p for p in plans if dict(p.resources) == dict(resources) and dict(p.asks) == asks]


def most_specific(plans: list[KnownPlan], node_selector: Mapping[str, str]) -> list[KnownPlan]:
    """Of `plans`, those whose pool's node selector the pod carries, without the ones whose
    selector is a strict part of another's: a pod pinned to the T4 pool's nodes gets a T4
    replica there, not the whole GPU a selector-less pool's plan with the same resources means."""
    carried = [
        p for p in plans if all(node_selector.get(k) == v for k, v in p.node_selector.items())
    ]
    return [
        p
        for p in carried
        if not any(set(p.node_selector.items()) < set(q.node_selector.items()) for q in carried)
    ]


# --------------------------------------------------------------------------- counting
def _mig_bound(name: str) -> float:
    """A MIG profile no catalog pool offers: its compute slices out of 4 (an A30's, the fewest
    of any MIG GPU), at most one GPU."""
    found = _MIG.match(name)
    return min(int(found.group(1)) / 4, 1.0) if found else 1.0


def resources_bound(resources: Mapping[str, Decimal], plans: Iterable[KnownPlan] = ()) -> float:
    """The most GPU these resources can get, with no catalog plan to say what they are: a
    device each (a MIG profile as the catalog counts one of it)."""
    single = {
        next(iter(p.resources)): p.gpu_equivalent
        for p in plans
        if len(p.resources) == 1 and list(p.resources.values()) == [1] and not p.asks
    }
    total = 0.0
    for name, amount in resources.items():
        if name in _DEVICE_COUNTS or name.startswith("clear.ml/"):
            total += math.ceil(amount)
        elif name.startswith("nvidia.com/mig-"):
            total += math.ceil(amount) * single.get(name, _mig_bound(name))
    hami = {"nvidia.com/gpumem", "nvidia.com/gpumem-percentage", "nvidia.com/gpucores"}
    if hami & set(resources) and "nvidia.com/gpu" not in resources:
        total += 1.0  # HAMi: memory or cores alone mean nvidia.com/gpu: 1
    if any(k.startswith("volcano.sh/vgpu-") for k in resources) and (
        "volcano.sh/vgpu-number" not in resources
    ):
        total += 1.0
    if "aliyun.com/gpu-mem" in resources and "aliyun.com/gpu-count" not in resources:
        total += 1.0
    return total


def _asks_bound(asks: Mapping[str, str]) -> float:
    """Run:ai / KAI fraction annotations no catalog plan matches: the fraction (or a whole
    device for a memory size) times the devices asked."""
    devices = quantity(asks.get("annotation gpu-fraction-num-devices", "1")) or Decimal(1)
    devices = max(math.ceil(devices), 1)
    if "annotation gpu-fraction" in asks:
        fraction = quantity(asks["annotation gpu-fraction"])
        share = float(fraction) if fraction is not None and 0 < fraction <= 1 else 1.0
        return share * devices
    if "annotation gpu-memory" in asks:
        return float(devices)
    return 0.0


def _plan_or_bound(
    resources: Mapping[str, Decimal],
    asks: Mapping[str, str],
    node_selector: Mapping[str, str],
    plans: tuple[KnownPlan, ...],
) -> float:
    found = most_specific(matching_plans(resources, asks, plans), node_selector)
    if found:
        return max(p.gpu_equivalent for p in found)
    return resources_bound(resources, plans) + _asks_bound(asks)


def gpu_equivalent_of_pod(pod: Mapping[str, Any], catalog: Catalog) -> float:
    """GPU-equivalents `pod` holds while it runs, whoever made it (pure; for the quota).

    Per container: its GPU resources (with the pod's backend ask fields, on the first one
    holding GPU) as a catalog plan when they are exactly one and the pod carries the pool's
    node selector, else their upper bound. App containers and sidecars add up; an init
    container runs alone, so the pod holds at least the largest. A pod asking through Run:ai's
    annotations alone counts as the matching plan or the fraction asked."""
    plans = known_plans(catalog)
    spec = pod.get("spec") or {}
    node_selector = spec.get("nodeSelector") or {}
    asks = pod_asks(pod)
    running, init_peak, asks_used = 0.0, 0.0, False
    for key in ("initContainers", "containers"):
        for container in spec.get(key) or []:
            resources = gpu_asks(container)
            if not resources:
                continue
            mine = {} if asks_used else asks
            asks_used = True
            value = _plan_or_bound(resources, mine, node_selector, plans)
            if key == "initContainers" and container.get("restartPolicy") != "Always":
                init_peak = max(init_peak, value)
            else:
                running += value
    if asks and not asks_used:
        running += _plan_or_bound({}, asks, node_selector, plans)
    return max(running, init_peak)


def pod_gpu_held(pod: Mapping[str, Any], catalog: Catalog) -> float:
    """What the quota counts for a pod: what it holds by its spec (gpu_equivalent_of_pod),
    or its `fracspawner.io/gpu-equivalent` annotation where that says more (a pod admitted
    under an older catalog). The annotation never lowers the count: on a pod the webhook did
    not map, anybody may have written it."""
    return max(pod_gpu(pod), gpu_equivalent_of_pod(pod, catalog))


# --------------------------------------------------------------------------- pools
def _tolerates(tolerations: Iterable[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    """Whether one of `tolerations` tolerates a pool's taint, given as the toleration the
    pool's plan carries (key, value, effect), matched as the scheduler does
    (k8s.io/api core/v1 toleration.go ToleratesTaint: empty effect matches all effects; an
    empty key with Exists matches every key; Exists ignores the value, Equal compares it)."""
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        exists = t.get("operator") == "Exists"
        if not t.get("key") and exists:
            return True
        if t.get("key") != taint.get("key"):
            continue
        if exists or str(t.get("value") or "") == str(taint.get("value") or ""):
            return True
    return False


def pool_placement(catalog: Catalog, pool: str) -> PodPlan:
    """The placement every plan of a pool shares (node selector, tolerations): its first
    offer's plan."""
    return plan_slice(catalog.pools[pool].offers[0], catalog.pools[pool], None)


def pools_of_pod(pod: Mapping[str, Any], catalog: Catalog) -> tuple[list[str], list[str]]:
    """(the catalog pools whose nodes this pod could be scheduled onto with its GPU, the GPU
    resources of the pod that no pool offers). A pool is one where the pod's GPU resources (or
    Run:ai ask fields) are offered, and whose taints (those its plans tolerate) the pod
    tolerates. A pod whose nodeSelector carries whole pools' node selectors can land on those
    pools' nodes only, whatever GPU resource it asks for: their nodes may expose more than the
    catalog's plans name (a mig-mixed node's unpartitioned GPUs, another device plugin); a pod
    that carries none could land on the nodes of every pool offering what it asks.
    Only nodeSelector pins a pod here: node affinity is not read (a pod pinned by affinity
    alone is taken for one that may land on any pool)."""
    spec = pod.get("spec") or {}
    selector = spec.get("nodeSelector") or {}
    tolerations = [t for t in spec.get("tolerations") or [] if isinstance(t, Mapping)]
    names = {k for c in containers_of(pod) for k in gpu_asks(c)}
    asks = pod_asks(pod)
    plans = known_plans(catalog)
    offered = {k for p in plans for k in p.resources}
    offering, pinned = [], []
    for pool in catalog.pools:
        mine = [p for p in plans if p.pool == pool]
        offers = any(names & set(p.resources) or (asks and dict(p.asks) == asks) for p in mine)
        placement = pool_placement(catalog, pool)
        carried = all(selector.get(k) == v for k, v in placement.node_selector.items())
        # a pool without a node selector: every pod can land there, if it offers the GPU
        if not (offers or (carried and placement.node_selector)):
            continue
        if not all(_tolerates(tolerations, t) for t in placement.tolerations):
            continue
        if offers:
            offering.append(pool)
        if carried:
            pinned.append(pool)
    return pinned or offering, sorted(names - offered)


# --------------------------------------------------------------------------- visibility
#: env through which the NVIDIA container toolkit hands devices to a container that holds no
#: GPU resource (NVIDIA/nvidia-container-toolkit internal/config/image/cuda_image.go:
#: VisibleDevices reads NVIDIA_VISIBLE_DEVICES and honours it in unprivileged containers
#: because api/config/v1/config.go GetDefault sets AcceptEnvvarUnprivileged, the config.toml key
#: `accept-nvidia-visible-devices-envvar-when-unprivileged`, to true; ImexChannelRequests reads
#: NVIDIA_IMEX_CHANNELS the same way). CUDA_VISIBLE_DEVICES only filters inside the devices
#: a container already has, so it is harmless. A container that holds a GPU resource gets the
#: device plugin's NVIDIA_VISIBLE_DEVICES, which overrides its image's, but not its own env:
#: the kubelet appends that after the device plugin's (gpu_container_env).
VISIBILITY_ENV = ("NVIDIA_VISIBLE_DEVICES", "NVIDIA_IMEX_CHANNELS")
#: what the webhook writes into a container whose env it cannot read (envFrom): an `env`
#: entry wins over every envFrom source ("Values defined by an Env with a duplicate key will
#: take precedence", k8s.io/api core/v1 Container.EnvFrom), and "void" hands out no device
VOID = "void"


def devices_requested(value: str) -> bool:
    """Whether the toolkit hands a container devices for this NVIDIA_VISIBLE_DEVICES value,
    as cuda_image.go devicesFromEnvvars and devices.go NewVisibleDevices read it: split at ',',
    entries trimmed, empty ones dropped; nothing left, or any entry "void", is no device; else
    the first "all" or "none" decides (all: every GPU; none: the driver, no GPU); any other
    entry is a device (an index, a GPU or MIG UUID). Matched case-sensitively, as there: "ALL"
    is a device name the toolkit fails to find, and counts as a request here."""
    entries = [e.strip() for e in value.split(",") if e.strip()]
    if not entries or VOID in entries:
        return False
    for entry in entries:
        if entry in ("all", "none"):
            return entry == "all"
    return True


#: resources that only shape a device another resource hands out: HAMi's task priority. Its
#: webhook adds a device count for memory or cores asked alone, never for a priority (HAMi
#: pkg/device/nvidia/device.go MutateAdmission), so a container asking for it alone gets no
#: device, and the toolkit reads that container's own NVIDIA_VISIBLE_DEVICES (issue 34)
SHAPE_ONLY = frozenset({"nvidia.com/priority"})


def device_plugin_gpu(container: Mapping[str, Any]) -> dict[str, Decimal]:
    """The container's GPU resources through which a device plugin hands it a device (HAMi's
    memory and cores among them: they imply a count), {} for one that gets none."""
    return {k: v for k, v in gpu_asks(container).items() if k not in SHAPE_ONLY}


def _holds_gpu_resource(
    pod: Mapping[str, Any], container: Mapping[str, Any], schedulers: Collection[str]
) -> bool:
    return bool(device_plugin_gpu(container))


#: schedulers whose binder writes the NVIDIA_VISIBLE_DEVICES of a pod's GPU fraction container:
#: KAI (and Run:ai, whose open core it is). KAI's admission webhook gives the fraction container
#: (annotation gpu-fraction-container-name, else the first container) the env
#: NVIDIA_VISIBLE_DEVICES from a ConfigMap key of that name, replacing any of its own
#: (kai-scheduler pkg/admission/webhook/v1alpha2/gpusharing/gpu_sharing.go Mutate,
#: pkg/binder/common/gpu_access.go AddGPUSharingEnvVars, env_vars.go AddEnvVarToContainer); the
#: binder writes the allocated device into the ConfigMap that env names
#: (gpu_access.go SetNvidiaVisibleDevices)
FRACTION_SCHEDULERS = frozenset({"kai-scheduler", "runai-scheduler"})
FRACTION_CONTAINER_ANNOTATION = "gpu-fraction-container-name"


def sized_when_scheduled(pod: Mapping[str, Any], catalog: Catalog | None = None) -> bool:
    """Whether the pod's scheduler reads its GPU ask from the pod's annotations when it places
    it: KAI's and Run:ai's (FRACTION_SCHEDULERS, and the name a Run:ai or KAI pool of `catalog`
    gives its scheduler: pool option scheduler_name, as KAI's global.schedulerName may be set)
    read `gpu-fraction`/`gpu-memory` (ASK_ANNOTATIONS) then, and annotations stay mutable, so a
    pod of theirs created asking no GPU could be given one while it is Pending. A pod's
    schedulerName cannot change (pod update validation), so a pod of any other scheduler never
    can."""
    name = (pod.get("spec") or {}).get("schedulerName")
    return name in (FRACTION_SCHEDULERS if catalog is None else fraction_schedulers(catalog))


def fraction_schedulers(catalog: Catalog | None) -> frozenset[str]:
    """KAI's and Run:ai's scheduler names (FRACTION_SCHEDULERS) and those the catalog's Run:ai
    and KAI pools (backends.runai, pool option scheduler_name) give their pods."""
    if catalog is None:
        return FRACTION_SCHEDULERS
    from ..backends import get_backend
    from ..backends.runai import RunaiBackend

    names = set(FRACTION_SCHEDULERS)
    for pool in catalog.pools.values():
        scheduler = (pool.options or {}).get("scheduler_name")
        if scheduler and isinstance(get_backend(pool.backend), RunaiBackend):
            names.add(str(scheduler))
    return frozenset(names)


def _holds_gpu_fraction(
    pod: Mapping[str, Any], container: Mapping[str, Any], schedulers: Collection[str]
) -> bool:
    """The fraction container of a pod KAI or Run:ai gives a GPU share (module comment above),
    with NVIDIA_VISIBLE_DEVICES as their webhook writes it (a ConfigMap key the binder fills)
    or not yet written (their webhook may come after this one). `schedulers`: their scheduler
    names (fraction_schedulers: a catalog's KAI pool may name it otherwise)."""
    asks = pod_asks(pod)
    spec = pod.get("spec") or {}
    if not {"annotation gpu-fraction", "annotation gpu-memory"} & set(asks):
        return False
    if spec.get("schedulerName") not in schedulers:
        return False
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    wanted = annotations.get(FRACTION_CONTAINER_ANNOTATION)
    first = (spec.get("containers") or [None])[0]
    if not (container.get("name") == wanted if wanted else container is first):
        return False
    entry = _env(container).get("NVIDIA_VISIBLE_DEVICES")
    if entry is None:
        return True
    ref = (entry.get("valueFrom") or {}).get("configMapKeyRef") or {}
    return ref.get("key") == "NVIDIA_VISIBLE_DEVICES" and "value" not in entry


#: "does this container hold a GPU of its own", one answer per source: device-plugin resources,
#: a KAI/Run:ai fraction; a container any source says yes for gets its devices from that
#: source, not its env. A new source (Dynamic Resource Allocation claims) is one more function.
GPU_HOLDERS: list[Callable[[Mapping[str, Any], Mapping[str, Any], Collection[str]], bool]] = [
    _holds_gpu_resource,
    _holds_gpu_fraction,
]


def holds_gpu(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    schedulers: Collection[str] = FRACTION_SCHEDULERS,
) -> bool:
    """`schedulers`: the names KAI's and Run:ai's schedulers go by (fraction_schedulers)."""
    return any(source(pod, container, schedulers) for source in GPU_HOLDERS)


def _env(container: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The container's env by name; of duplicates the last wins, as the kubelet builds it."""
    return {str(e.get("name", "")): e for e in container.get("env") or [] if isinstance(e, Mapping)}


def visibility_env(
    pod: Mapping[str, Any],
    containers: Iterable[Mapping[str, Any]] | None = None,
    schedulers: Collection[str] = FRACTION_SCHEDULERS,
) -> list[str]:
    """What in the pod's spec would make the NVIDIA toolkit give a container that holds no
    GPU of its own some or all of the node's GPUs: `container NAME: VAR=VALUE` entries, for
    `containers` (default: init, app and ephemeral containers of the pod).

    A value the webhook cannot read counts as a request: `valueFrom` (a ConfigMap, Secret or
    field), and a `$(VAR)` reference (the kubelet expands it from the container's other env,
    envFrom included). Besides NVIDIA_VISIBLE_DEVICES/NVIDIA_IMEX_CHANNELS, the toolkit treats
    a "legacy" CUDA image, one with CUDA_VERSION and no NVIDIA_REQUIRE_CUDA, as asking for
    every GPU when NVIDIA_VISIBLE_DEVICES is unset (cuda_image.go IsLegacy, devicesFromEnvvars).
    `envFrom` is not here: the webhook overrides it (hide_devices_from_env)."""
    found = []
    for container in containers_of(pod) if containers is None else containers:
        if holds_gpu(pod, container, schedulers):
            continue
        env = _env(container)
        name = container.get("name", "?")
        for var in VISIBILITY_ENV:
            if var not in env:
                continue
            entry = env[var]
            value = str(entry.get("value") or "")
            if "valueFrom" in entry:
                found.append(f"container {name}: {var} from valueFrom (cannot be checked)")
            elif "$(" in value:
                found.append(f"container {name}: {var}={value} (a variable reference)")
            elif devices_requested(value):
                found.append(f"container {name}: {var}={value}")
        # set at all (even to ""), NVIDIA_VISIBLE_DEVICES overrides the legacy default
        if (
            not {"NVIDIA_REQUIRE_CUDA", "NVIDIA_VISIBLE_DEVICES"} & set(env)
            and "CUDA_VERSION" in env
        ):
            found.append(
                f"container {name}: CUDA_VERSION without NVIDIA_REQUIRE_CUDA (a legacy CUDA "
                "image: the NVIDIA toolkit then shows it every GPU)"
            )
    return found


def gpu_container_env(
    pod: Mapping[str, Any],
    containers: Iterable[Mapping[str, Any]] | None = None,
    *,
    env_from: bool = True,
) -> list[str]:
    """What in the spec of a container holding a device-plugin GPU could choose its devices:
    `container NAME: VAR...` for NVIDIA_VISIBLE_DEVICES or NVIDIA_IMEX_CHANNELS in its env,
    whatever the value or its source, and (`env_from`) `container NAME: envFrom` for env the
    webhook cannot read. The device plugin's value does not win there: the kubelet appends the
    pod's env after the device plugin's (pkg/kubelet/kubelet_pods.go
    GenerateRunContainerOptions), and the toolkit keeps the last of a name
    (nvidia-container-toolkit internal/config/image/builder.go WithEnv), so `all` there is
    every GPU of the node for the price of one (NVIDIA/k8s-device-plugin#90, #1294,
    otwld/ollama-helm#98)."""
    found = []
    for container in containers_of(pod) if containers is None else containers:
        if not device_plugin_gpu(container):
            continue
        name = container.get("name", "?")
        for entry in container.get("env") or []:
            var = str(entry.get("name", "")) if isinstance(entry, Mapping) else ""
            if var not in VISIBILITY_ENV:
                continue
            if "valueFrom" in entry:
                found.append(f"container {name}: {var} from valueFrom")
            else:
                found.append(f"container {name}: {var}={entry.get('value') or ''}")
        if env_from and container.get("envFrom"):
            found.append(f"container {name}: envFrom (may hold NVIDIA_VISIBLE_DEVICES)")
    return found


def unreadable_env(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    schedulers: Collection[str] = FRACTION_SCHEDULERS,
) -> bool:
    """Whether a container holding no GPU of its own takes env from a source the webhook
    cannot read (envFrom: a ConfigMap or Secret, which may hold NVIDIA_VISIBLE_DEVICES) and
    sets no NVIDIA_VISIBLE_DEVICES/NVIDIA_IMEX_CHANNELS of its own to override it with."""
    env = _env(container)
    return (
        bool(container.get("envFrom"))
        and not holds_gpu(pod, container, schedulers)
        and not all(var in env for var in VISIBILITY_ENV)
    )


__all__ = [
    "ASK_ANNOTATIONS",
    "ASK_LABELS",
    "GPU_RESOURCES",
    "V1_NOTEBOOK_LABEL",
    "V2_WORKSPACE_LABEL",
    "CONTAINER_LISTS",
    "GPU_HOLDERS",
    "SHAPE_ONLY",
    "VISIBILITY_ENV",
    "KnownPlan",
    "catalog_resources",
    "devices_requested",
    "device_plugin_gpu",
    "gpu_container_env",
    "holds_gpu",
    "gpu_asks",
    "gpu_equivalent_of_pod",
    "is_gpu_resource",
    "known_plans",
    "matching_plans",
    "most_specific",
    "notebook_kind",
    "pod_asks",
    "pod_gpu_held",
    "pool_placement",
    "pools_of_pod",
    "resources_bound",
    "fraction_schedulers",
    "sized_when_scheduled",
    "unreadable_env",
    "visibility_env",
]
