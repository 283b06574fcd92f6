"""What the admission webhook decides for one pod. Pure: no I/O, no clock.

A pod in a profile namespace asks for a GPU slice with the CONTRACT labels `fracspawner.io/pool`
and `fracspawner.io/gpu` (a fracspawner PodDefault adds them), or, from the notebook form's GPU
field, with a MIG-mixed resource such as `nvidia.com/mig-1g.10gb` that a catalog pool offers.
The plan is FracSpawner's: `choice.options.resolve_choice` validates the slice against the
namespace's access rule, `backends.plan_slice` makes the PodPlan and `backends.podspec.apply_plan`
puts it on the pod; the JSONPatch is the difference between the pod and that result, so a
second call on the mutated pod (reinvocation) patches nothing.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

from ..backends import (
    LABEL_GPU,
    LABEL_POOL,
    is_reserved_env,
    plan_slice,
    scheduler_for,
)
from ..backends.base import PodPlan
from ..backends.podspec import apply_plan
from ..choice.notebook_env import notebook_env
from ..choice.options import resolve_choice
from ..model.access import within_quota
from ..model.catalog import AccessRule, Catalog
from ..model.errors import OptionsError, SliceError
from .quota import COUNTED_LABEL
from .recognise import (
    ASK_ANNOTATIONS,
    ASK_LABELS,
    FRACTION_SCHEDULERS,
    VISIBILITY_ENV,
    VOID,
    catalog_resources,
    containers_of,
    fraction_schedulers,
    gpu_asks,
    gpu_container_env,
    gpu_equivalent_of_pod,
    holds_gpu,
    is_gpu_resource,
    known_plans,
    matching_plans,
    most_specific,
    pod_asks,
    pool_placement,
    pools_of_pod,
    unreadable_env,
    visibility_env,
)

#: contract labels and annotations nobody may change on an admitted pod (quota counts them)
GUARDED_LABELS = (LABEL_POOL, LABEL_GPU)
GUARDED_ANNOTATIONS = ("fracspawner.io/gpu-equivalent", "fracspawner.io/gpu-memory-mib")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
#: the notebook container: Kubeflow 1.x names it after the Notebook (label notebook-name),
#: Notebooks 2.0 names it "main" (workspace_controller.go)
NOTEBOOK_NAME_LABEL = "notebook-name"
V2_CONTAINER = "main"


class BadReview(ValueError):
    """Not an AdmissionReview v1 for a pod: answered with HTTP 400."""


class Refusal(Exception):
    """The pod is not admitted; the message is for the notebook's owner."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason  # metrics label: invalid, access, quota, guard, unavailable, error


@dataclass(frozen=True)
class Review:
    uid: str
    operation: str
    namespace: str
    pod: dict[str, Any]
    old_pod: dict[str, Any] | None
    dry_run: bool
    #: "" for the pod itself; "ephemeralcontainers" for kubectl debug's subresource, whose
    #: review carries the whole Pod since Kubernetes 1.22 (kubernetes/kubernetes#101034)
    sub_resource: str = ""
    #: request.userInfo.username: who asked (set by the API server)
    user: str = ""

    @property
    def name(self) -> str:
        """The pod's name; its generateName prefix while the API server has not named it."""
        meta = self.pod.get("metadata") or {}
        return str(meta.get("name") or meta.get("generateName") or "")


def parse_review(body: bytes) -> Review:
    """An AdmissionReview (admission.k8s.io/v1) for a pod, or BadReview saying what is wrong."""
    try:
        review = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadReview(f"not JSON: {exc}") from None
    if not isinstance(review, dict) or review.get("kind") != "AdmissionReview":
        raise BadReview("expected an AdmissionReview object")
    if review.get("apiVersion") != "admission.k8s.io/v1":
        raise BadReview(f"apiVersion {review.get('apiVersion')!r}: only admission.k8s.io/v1")
    request = review.get("request")
    if not isinstance(request, dict):
        raise BadReview("request: missing")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise BadReview("request.uid: missing")
    operation = request.get("operation")
    if operation not in ("CREATE", "UPDATE", "DELETE", "CONNECT"):
        raise BadReview(f"request.operation: {operation!r}")
    kind = request.get("kind") or {}
    if not isinstance(kind, dict) or (kind.get("group"), kind.get("kind")) != ("", "Pod"):
        raise BadReview(f"request.kind: {kind!r}; this webhook admits pods")
    pod = request.get("object")
    old = request.get("oldObject")
    if operation in ("CREATE", "UPDATE") and not _is_pod(pod):
        raise BadReview("request.object: not a pod")
    if operation == "UPDATE" and not _is_pod(old):
        raise BadReview("request.oldObject: not a pod")
    namespace = request.get("namespace")
    if not isinstance(namespace, str):
        raise BadReview("request.namespace: missing")
    return Review(
        uid=uid,
        operation=operation,
        namespace=namespace,
        pod=pod if isinstance(pod, dict) else {},
        old_pod=old if isinstance(old, dict) else None,
        dry_run=bool(request.get("dryRun")),
        sub_resource=str(request.get("subResource") or ""),
        user=str((request.get("userInfo") or {}).get("username") or ""),
    )


def _is_pod(obj: Any) -> bool:
    if not isinstance(obj, dict):
        return False
    meta, spec = obj.get("metadata", {}), obj.get("spec")
    return (
        isinstance(meta, dict)
        and isinstance(spec, dict)
        and isinstance(spec.get("containers"), list)
        and all(isinstance(c, dict) for c in spec["containers"])
        and all(isinstance(meta.get(k) or {}, dict) for k in ("labels", "annotations"))
    )


def response(
    uid: str,
    *,
    patch: list[dict[str, Any]] | None = None,
    refusal: Refusal | None = None,
    warnings: list[str] | None = None,
) -> dict[str, Any]:
    """The AdmissionReview answer (`warnings`: AdmissionResponse.warnings, which the API server
    passes to the client as Warning headers: kubectl prints them)."""
    answer: dict[str, Any] = {"uid": uid, "allowed": refusal is None}
    if warnings:
        answer["warnings"] = list(warnings)
    if refusal is not None:
        answer["status"] = {"code": 403, "reason": "Forbidden", "message": refusal.message}
    elif patch:
        answer["patchType"] = "JSONPatch"
        answer["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": answer}


# --------------------------------------------------------------------------- JSONPatch
def _pointer(path: list[str]) -> str:
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in path)


def json_patch(before: Any, after: Any, path: list[str] | None = None) -> list[dict[str, Any]]:
    """RFC 6902 operations turning `before` into `after`: objects key by key, anything else
    (lists included) replaced whole where it differs."""
    path = path or []
    if isinstance(before, dict) and isinstance(after, dict):
        ops: list[dict[str, Any]] = []
        for key in before:
            if key not in after:
                ops.append({"op": "remove", "path": _pointer(path + [key])})
        for key, value in after.items():
            if key not in before:
                ops.append({"op": "add", "path": _pointer(path + [key]), "value": value})
            else:
                ops += json_patch(before[key], value, path + [key])
        return ops
    if before == after and type(before) is type(after):
        return []
    return [{"op": "replace", "path": _pointer(path), "value": after}]


# --------------------------------------------------------------------------- the slice
@dataclass(frozen=True)
class SliceAsk:
    """What a pod asks for: the option keys of resolve_choice, and where they came from."""

    options: Mapping[str, str]
    source: str  # "labels" or the resource name of a form GPU field


def _label(pod: Mapping[str, Any], key: str) -> str | None:
    value = (pod.get("metadata", {}).get("labels") or {}).get(key)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.match(value):
        shown = repr(value)[:40] + ("..." if len(repr(value)) > 40 else "")
        raise Refusal(
            f"label {key}: {shown} is not a valid label value (at most 63 letters, digits, "
            "'-', '_', '.'); use a fracspawner PodDefault to choose a GPU slice",
            "invalid",
        )
    return value


def _visible_pools(catalog: Catalog) -> list[str]:
    visible = list(catalog.pools)
    if catalog.kubeflow.pools is not None:
        visible = [p for p in visible if p in catalog.kubeflow.pools]
    return visible


def _shown(resources: Mapping[str, Any], asks: Mapping[str, str]) -> str:
    parts = [f"{k}={v}" for k, v in sorted(resources.items())]
    return ", ".join(parts + [f"{k}={v}" for k, v in sorted(asks.items())])


def slice_ask(pod: Mapping[str, Any], catalog: Catalog, rule: AccessRule) -> SliceAsk | None:
    """The slice a notebook pod asks for, None for a pod that asks for none.

    First the slice labels (a fracspawner PodDefault, a Workspace's podMetadata); else what
    reaches the pod from a Notebook's GPU field or a Workspace's podConfig (recognise.py): the
    notebook container's GPU resources and the backend ask fields of the pod, as the catalog
    plan that sets exactly these (the pool whose node selector the pod carries, then one the
    namespace may use); a bare `nvidia.com/gpu: N` (the form's NVIDIA vendor, upstream's GPU
    podConfigs) as N whole GPUs on a pool the namespace may use. Anything else with GPU in it
    is refused: it is no slice of the catalog, and the quota could not count it."""
    pool = _label(pod, LABEL_POOL)
    gpu = _label(pod, LABEL_GPU)
    if pool is not None or gpu is not None:
        if gpu is None:
            raise Refusal(
                f"label {LABEL_POOL}={pool} without {LABEL_GPU}: choose one of the fracspawner "
                "GPU configurations, which set both",
                "invalid",
            )
        options = {"gpu": gpu}
        if pool is not None:
            options["pool"] = pool
        return SliceAsk(options, "labels")
    target = target_container(pod)
    box = next(c for c in pod["spec"]["containers"] if c.get("name", "") == target)
    resources = gpu_asks(box)
    others = [str(c.get("name")) for c in containers_of(pod) if c is not box and gpu_asks(c)]
    asks = pod_asks(pod)
    if not resources and not asks:
        if others:
            raise Refusal(
                f"GPU resources on container(s) {', '.join(others)}: a notebook's GPU goes on "
                f"its notebook container {target}, through a fracspawner GPU configuration",
                "invalid",
            )
        return None
    visible = set(_visible_pools(catalog))
    plans = [p for p in known_plans(catalog) if p.pool in visible]
    found = matching_plans(resources, asks, plans)
    pinned = most_specific(found, pod["spec"].get("nodeSelector") or {})
    count = resources.get("nvidia.com/gpu")
    bare = set(resources) == {"nvidia.com/gpu"} and not asks and count == int(count or 0)
    # a bare nvidia.com/gpu: N means a whole GPU unless the pod is pinned to the nodes of a
    # pool where it means a share (a time-slicing replica)
    if pinned or (found and not bare):
        allowed = rule.pools if rule.pools is not None else tuple(catalog.pools)
        # one the namespace may use first; else the first (resolve_choice says why not)
        best = min(pinned or found, key=lambda p: p.pool not in allowed)
        return SliceAsk({"gpu": best.offer, "pool": best.pool}, ", ".join(sorted(resources)))
    if bare:
        return SliceAsk({"gpu": str(int(count or 0))}, "nvidia.com/gpu")
    mig = [k for k in resources if k.startswith("nvidia.com/mig-")]
    if mig and not asks:
        if len(resources) > 1 or resources[mig[0]] != 1:
            raise Refusal(
                "one MIG slice per notebook: choose a number of GPUs of 1 "
                f"(asked: {_shown(resources, {})})",
                "invalid",
            )
    raise Refusal(
        f"the notebook asks for GPU through {_shown(resources, asks)}, which is none of the "
        "GPU configurations fracspawner offers here; choose one of them (a Configuration or "
        "podConfig named after a pool and slice)",
        "invalid",
    )


def target_container(pod: Mapping[str, Any]) -> str:
    """The notebook's container: named after the notebook (1.x), `main` (2.0), else the first."""
    containers = pod["spec"]["containers"]
    names = [str(c.get("name", "")) for c in containers]
    notebook = (pod.get("metadata", {}).get("labels") or {}).get(NOTEBOOK_NAME_LABEL)
    for wanted in (notebook, V2_CONTAINER):
        if wanted in names:
            return str(wanted)
    if not names:
        raise Refusal("the pod has no container", "invalid")
    return names[0]


def _fmt(value: float) -> str:
    return f"{value:g}"


@dataclass(frozen=True)
class Admitted:
    pod: dict[str, Any]  # the pod as it will be created
    plan: PodPlan
    ask: SliceAsk


def admit(
    pod: Mapping[str, Any],
    *,
    catalog: Catalog,
    rule: AccessRule,
    namespace: str,
    used_gpu: float,
) -> Admitted | None:
    """The mutated pod, None for a pod asking for no slice; Refusal when it may not run.
    `used_gpu`: GPU-equivalents the namespace's other pods (and admissions in flight) hold."""
    ask = slice_ask(pod, catalog, rule)
    if ask is None:
        return None
    shown = f"GPU slice {ask.options['gpu']}" + (
        f" on pool {ask.options['pool']}" if "pool" in ask.options else ""
    )
    unlimited = AccessRule(pools=rule.pools, max_gpu=None)  # the quota is checked below
    try:
        choice = resolve_choice(catalog, dict(ask.options), rule=unlimited)
    except (OptionsError, SliceError) as exc:
        text = str(exc)
        reason = "access" if "may not use" in text or "no pool you may use" in text else "invalid"
        raise Refusal(
            f"fracspawner refused the {shown} in namespace {namespace}: {text}", reason
        ) from None
    assert choice.pool is not None
    # the pod's image is the user's choice; a backend image (ClearML's) still wins
    plan = plan_slice(choice.offer or choice.slice, choice.pool, None)
    # what the spawner also tells a GPU notebook (its slice and idle policy: the JupyterLab
    # meter and the server's own kernel culling read them)
    told = notebook_env(choice, catalog)
    plan = replace(plan, env=MappingProxyType({**plan.env, **told}))
    # a backend whose own webhook names its scheduler (HAMi: hami-scheduler) does so only for
    # pods that carry its resources when it is called; configurations are called in name
    # order, so it may have seen a PodDefault pod before ours gave it any: name it
    plan = replace(plan, scheduler_name=scheduler_for(plan, choice.pool))
    if not within_quota(rule, used_gpu, plan.gpu_equivalent):
        left = max((rule.max_gpu or 0.0) - used_gpu, 0.0)
        raise Refusal(
            f"fracspawner refused the {shown} in namespace {namespace}: it counts as "
            f"{_fmt(plan.gpu_equivalent)} GPU and the namespace's notebooks already hold "
            f"{_fmt(used_gpu)} of its {_fmt(rule.max_gpu or 0.0)} GPU quota "
            f"({_fmt(left)} left). Stop a notebook or choose a smaller slice.",
            "quota",
        )
    return Admitted(_mutate(pod, plan, catalog), plan, ask)


def refuse_visible_gpus(
    pod: Mapping[str, Any],
    namespace: str,
    containers: list[Mapping[str, Any]] | None = None,
    schedulers: Collection[str] = FRACTION_SCHEDULERS,
) -> None:
    """Refuse a pod whose spec would let the NVIDIA container toolkit hand GPUs to a container
    that holds no GPU of its own (recognise.visibility_env): every GPU of the node, counted by
    no quota. Every pod, whatever it asks for; `containers`: only these (new ephemeral ones)."""
    found = visibility_env(pod, containers, schedulers)
    if found:
        raise Refusal(
            f"fracspawner refused this pod in namespace {namespace}: {'; '.join(found)}. "
            "A container holding no GPU resource must not choose GPUs through its environment "
            "(the NVIDIA toolkit would give it the node's GPUs outside every quota); remove "
            "the variable, or ask for a GPU through a fracspawner GPU configuration",
            "invalid",
        )


#: the device list strategies of the NVIDIA device plugin (its `deviceListStrategy`,
#: k8s-device-plugin api/config/v1/flags.go) under which a container's own env cannot choose
#: its devices, given the toolkit's accept-nvidia-visible-devices-envvar-when-unprivileged =
#: false; "envvar", the plugin's default, is the one where it can
ENV_PROOF_STRATEGIES = ("volume-mounts", "cdi-annotations", "cdi-cri")
DEVICE_LIST_STRATEGIES = ("envvar", *ENV_PROOF_STRATEGIES)


def refuse_gpu_container_env(
    pod: Mapping[str, Any], namespace: str, device_list_strategy: str = "envvar"
) -> None:
    """Refuse a pod whose container holding a device-plugin GPU sets NVIDIA_VISIBLE_DEVICES or
    NVIDIA_IMEX_CHANNELS, or takes `envFrom` unless the operator declared nodes that hand
    devices out another way (recognise.gpu_container_env)."""
    env_from = device_list_strategy not in ENV_PROOF_STRATEGIES
    found = gpu_container_env(pod, env_from=env_from)
    if found:
        hint = (
            "; or, where every GPU node's device plugin hands devices out by volume mounts or "
            "CDI and the toolkit ignores the variable, the webhook's --device-list-strategy "
            "(the chart's webhook.deviceListStrategy) allows envFrom"
            if any(": envFrom" in f for f in found)
            else ""
        )
        raise Refusal(
            f"fracspawner refused this pod in namespace {namespace}: {'; '.join(found)}. A "
            "container holding a GPU must not choose its devices through its environment: the "
            "kubelet puts the pod's env after the device plugin's and the NVIDIA toolkit takes "
            "the last, so it would get whatever GPUs the variable names, outside every quota. "
            f"Remove the variable; set what it needs with env instead of envFrom{hint}",
            "invalid",
        )


#: reserved env (backends.RESERVED_ENV) a pod the webhook does not map may still set: what
#: only filters the devices a container already has (CUDA_VISIBLE_DEVICES), what fracspawner
#: tells a notebook (FRACSPAWNER_*), and the visibility variables, which
#: refuse_gpu_container_env judges with their own words
_HARMLESS_RESERVED = ("CUDA_VISIBLE_DEVICES", "FRACSPAWNER_", *VISIBILITY_ENV)


#: backends whose isolation no container env can loosen: MIG and whole GPUs are isolated by
#: the hardware, an MPS client may only lower the control daemon's limits (NVIDIA MPS docs,
#: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE / CUDA_MPS_PINNED_DEVICE_MEM_LIMIT), time-slicing isolates
#: nothing. A step there may keep its own LD_PRELOAD (jemalloc, tcmalloc) or MPS limits
_ENV_CANNOT_LOOSEN = frozenset(
    {"mig-mixed", "mig-single", "gke-mig", "whole", "timeslicing", "mps", "gke-timesharing",
     "gke-mps"}
)  # fmt: skip


def refuse_isolation_env(
    pod: Mapping[str, Any], namespace: str, catalog: Catalog | None = None
) -> None:
    """Refuse a pod that is no notebook whose container holding a GPU sets a reserved variable
    that loosens its backend's isolation (HAMi's CUDA_DISABLE_CONTROL and
    CUDA_DEVICE_MEMORY_LIMIT*, MPS limits, LD_PRELOAD, ClearML's GPU_MEM_LIMIT_GB), by value or
    valueFrom: the kubelet puts the pod's env after the device plugin's, so the pod's value
    wins, and the quota would count the slice while the container used the GPU unlimited. A
    notebook loses these variables (_mutate); a pod the webhook does not map is refused.
    Not where every pool of `catalog` the pod can land on is one whose isolation no env can
    loosen (_ENV_CANNOT_LOOSEN), and it asks for no GPU resource the catalog does not know."""
    if catalog is not None:
        pools, unknown = pools_of_pod(pod, catalog)
        if pools and not unknown:
            if all(catalog.pools[p].backend in _ENV_CANNOT_LOOSEN for p in pools):
                return
    found = []
    schedulers = fraction_schedulers(catalog)
    for container in containers_of(pod):
        if not holds_gpu(pod, container, schedulers):
            continue
        for entry in container.get("env") or []:
            var = str(entry.get("name", "")) if isinstance(entry, Mapping) else ""
            if is_reserved_env(var) and not var.startswith(_HARMLESS_RESERVED):
                found.append(f"container {container.get('name', '?')}: {var}")
    if found:
        raise Refusal(
            f"fracspawner refused this pod in namespace {namespace}: {'; '.join(found)}. These "
            "variables switch off or loosen the GPU's isolation (its memory and compute "
            "limits), which the namespace's quota counts on; remove them",
            "invalid",
        )


def _void_entries(container: Mapping[str, Any]) -> list[dict[str, str]]:
    """`NAME=void` for each visibility variable the container does not set itself."""
    have = {str(e.get("name", "")) for e in container.get("env") or [] if isinstance(e, Mapping)}
    return [{"name": v, "value": VOID} for v in VISIBILITY_ENV if v not in have]


def hide_devices_from_env(
    pod: Mapping[str, Any], every: bool = False, schedulers: Collection[str] = FRACTION_SCHEDULERS
) -> dict[str, Any]:
    """The pod with `NVIDIA_VISIBLE_DEVICES=void` (and NVIDIA_IMEX_CHANNELS) written into each
    init and app container that holds no GPU of its own and takes env through `envFrom`, which
    the webhook cannot read: an `env` entry wins over every envFrom source, so whatever the
    ConfigMap or Secret says (now or later) hands out no device. `every`: into every container
    holding no GPU that does not set them itself, which also overrides the image's own ENV
    (CUDA base images set NVIDIA_VISIBLE_DEVICES=all; a container's env wins over its image's,
    as containerd builds the OCI spec). A container naming resource claims gets them too: a
    claim may be any driver's, and NVIDIA's DRA driver hands GPUs as CDI device nodes and
    writes NVIDIA_VISIBLE_DEVICES=void into its own CDI edits, which come after the pod's env
    (k8s-dra-driver-gpu cmd/gpu-kubelet-plugin/cdi.go). Unchanged pods are returned as they
    are (a copy)."""
    out = json.loads(json.dumps(pod))
    spec = out.get("spec") or {}
    for key in ("initContainers", "containers"):
        for container in spec.get(key) or []:
            hidden = every and not holds_gpu(out, container, schedulers)
            if not (hidden or unreadable_env(out, container, schedulers)):
                continue
            missing = _void_entries(container)
            if missing:
                container.setdefault("env", []).extend(missing)
    return out


def _added_ephemeral(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[int, Any]]:
    """(index, container) of the ephemeral containers `new` has and `old` had not."""
    before = {str(c.get("name")) for c in (old.get("spec") or {}).get("ephemeralContainers") or []}
    return [
        (i, c)
        for i, c in enumerate((new.get("spec") or {}).get("ephemeralContainers") or [])
        if isinstance(c, Mapping) and str(c.get("name")) not in before
    ]


def hide_devices_from_ephemeral(
    old: Mapping[str, Any], new: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """JSONPatch operations writing `NVIDIA_VISIBLE_DEVICES=void` (and NVIDIA_IMEX_CHANNELS)
    into the ephemeral containers being added (kubectl debug), as hide_devices_from_env(every)
    does for every other container holding no GPU: an ephemeral container may ask for no
    resources, so no device plugin gives it a device, and a CUDA image's ENV would show it
    every GPU. Only /spec/ephemeralContainers/N/env of the new ones: the API server refuses
    any other change through this subresource."""
    ops: list[dict[str, Any]] = []
    for index, container in _added_ephemeral(old, new):
        missing = _void_entries(container)
        path = f"/spec/ephemeralContainers/{index}/env"
        if not missing:
            continue
        if container.get("env"):
            ops += [{"op": "add", "path": f"{path}/-", "value": e} for e in missing]
        else:
            ops.append({"op": "add", "path": path, "value": missing})
    return ops


def check_ephemeral(
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    namespace: str,
    schedulers: Collection[str] = FRACTION_SCHEDULERS,
) -> None:
    """Refuse ephemeral containers (kubectl debug) added to a pod that could see GPUs through
    their env: they hold no GPU resource (an ephemeral container may not set resources), so the
    device plugin gives them none, but the toolkit honours their NVIDIA_VISIBLE_DEVICES. An
    `envFrom` cannot be checked and is refused too (it could be overridden as on a create, but
    a debugging container needs no ConfigMap's env)."""
    added = [c for _, c in _added_ephemeral(old, new)]
    refuse_visible_gpus(new, namespace, added, schedulers)
    unread = [str(c.get("name")) for c in added if unreadable_env(new, c, schedulers)]
    if unread:
        raise Refusal(
            f"fracspawner refused the ephemeral container(s) {', '.join(unread)} in namespace "
            f"{namespace}: envFrom could set NVIDIA_VISIBLE_DEVICES, which would give the "
            "container the node's GPUs; set the variables it needs with env instead",
            "invalid",
        )


def other_pod_gpu(
    pod: Mapping[str, Any], *, catalog: Catalog, rule: AccessRule, namespace: str, used_gpu: float
) -> float:
    """What a pod that is no notebook (a pipeline step, a Katib trial) holds, checked against
    the namespace's GPU quota: it is counted, never mapped (the webhook only labels it
    COUNTED_LABEL, so that its updates reach the guard: guard_update; it labels a GPU-less pod
    for KAI or Run:ai too, without calling this)."""
    amount = gpu_equivalent_of_pod(pod, catalog)
    if amount > 0 and not within_quota(rule, used_gpu, amount):
        left = max((rule.max_gpu or 0.0) - used_gpu, 0.0)
        raise Refusal(
            f"fracspawner refused this pod's GPU in namespace {namespace}: its GPU resources "
            f"count as {_fmt(amount)} GPU and the namespace's pods already hold "
            f"{_fmt(used_gpu)} of its {_fmt(rule.max_gpu or 0.0)} GPU quota ({_fmt(left)} "
            "left). Stop a notebook or another GPU pod, or ask for less.",
            "quota",
        )
    return amount


def check_pool_access(
    pod: Mapping[str, Any], *, catalog: Catalog, rule: AccessRule, namespace: str
) -> None:
    """Refuse a pod that is no notebook whose GPU could run on a pool the namespace may not
    use (`--enforce-pool-access all-pods`): every pool it could be scheduled onto
    (recognise.pools_of_pod) must be allowed, and at least one must be."""
    if rule.pools is None:
        return
    allowed = [p for p in catalog.pools if p in rule.pools]
    shown = ", ".join(allowed) or "none"
    where, unknown = pools_of_pod(pod, catalog)
    if unknown:
        raise Refusal(
            f"fracspawner refused this pod's GPU in namespace {namespace}: "
            f"{', '.join(unknown)} is offered by no GPU pool of this cluster. Pools you may use: "
            f"{shown}",
            "access",
        )
    denied = [p for p in where if p not in allowed]
    if denied or not where:
        pins = []
        for pool in allowed:
            selector = pool_placement(catalog, pool).node_selector
            if selector:
                pins.append(f"{', '.join(f'{k}: {v}' for k, v in selector.items())} for {pool}")
        hint = f"; pin it with that pool's nodeSelector ({'; '.join(pins)})" if pins else ""
        what = (
            f"it could run on pool(s) {', '.join(denied)}, which the namespace may not use"
            if denied
            else "it is pinned to none of the GPU pools"
        )
        raise Refusal(
            f"fracspawner refused this pod's GPU in namespace {namespace}: {what}. Pools you "
            f"may use: {shown}{hint}",
            "access",
        )


def _is_gpu_resource(key: str, known: frozenset[str]) -> bool:
    """Every GPU resource of every known backend (recognise.py), and any a catalog plan uses."""
    return key in known or is_gpu_resource(key)


def _mutate(pod: Mapping[str, Any], plan: PodPlan, catalog: Catalog) -> dict[str, Any]:
    target = target_container(pod)
    cleaned = json.loads(json.dumps(pod))  # a deep copy of plain JSON
    spec = cleaned["spec"]
    known = catalog_resources(catalog)
    planned = set(plan.limits) | set(plan.requests)
    for key in ("containers", "initContainers"):
        for container in spec.get(key) or []:
            # GPU resources besides the slice's would be GPU the quota never counted: a MIG
            # profile from the form's GPU field next to a ticked PodDefault, or HAMi's
            # nvidia.com/gpumem next to a percentage plan (HAMi takes the MiB value first)
            resources = container.get("resources") or {}
            for part in ("limits", "requests"):
                asked = resources.get(part) or {}
                for name in [k for k in asked if _is_gpu_resource(k, known)]:
                    if container.get("name") != target or name not in planned:
                        del asked[name]
            # reserved env (isolation switches, NVIDIA_VISIBLE_DEVICES...) goes from EVERY
            # container: on a GPU node a sidecar's NVIDIA_VISIBLE_DEVICES=all sees every GPU
            if container.get("name") == target or not container.get("env"):
                continue
            env = [e for e in container["env"] if not is_reserved_env(str(e.get("name", "")))]
            if env:
                container["env"] = env
            else:
                del container["env"]
    return apply_plan(cleaned, plan, container=target, reserved=is_reserved_env)


def _guard_refusal(what: str) -> Refusal:
    return Refusal(
        f"the {what} of a GPU pod cannot be changed or removed (fracspawner counts the "
        "namespace's GPU quota with it); delete the pod and create a new one instead",
        "guard",
    )


def _guard_placement(
    old: Mapping[str, Any], new: Mapping[str, Any], *, tolerations: bool = True
) -> None:
    """Refuse changing what a scheduler reads from an admitted GPU pod to size and place it:
    the backend ask annotations and labels, and (`tolerations`) the tolerations."""
    for field_, keys in (("labels", ASK_LABELS), ("annotations", ASK_ANNOTATIONS)):
        before = old.get("metadata", {}).get(field_) or {}
        after = new.get("metadata", {}).get(field_) or {}
        for key in keys:
            if before.get(key) != after.get(key):
                raise _guard_refusal(f"{field_[:-1]} {key}")
    if tolerations and tolerations_changed(old, new):
        raise _guard_refusal("tolerations")


def tolerations_changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    return (old.get("spec") or {}).get("tolerations") != (new.get("spec") or {}).get("tolerations")


def guard_update(
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    catalog: Catalog | None = None,
    *,
    counted_tolerations: bool = True,
) -> None:
    """Refuse changing the slice labels or quota annotations of an admitted pod: the namespace's
    quota is counted from them. On a slice pod (one carrying fracspawner.io/pool, which the
    guard webhook is sent), also what a scheduler or the node still reads after admission:
    the backend ask annotations and labels (Run:ai/KAI's `gpu-fraction`, `gpu-memory`: a
    pending pod would be scheduled with the new size), the tolerations (Kubernetes lets
    tolerations be added to a pod: a pending pod would reach another pool's tainted nodes), and
    the notebook container's image where the pool's plan sets it (`clearml-image`: the image
    carries the memory limit). On a pod that is no notebook whose GPU the webhook counted at
    CREATE, or a pod without a slice for KAI or Run:ai (which read the ask from annotations
    when they schedule it) counted as what it asked then, 0 included (labelled COUNTED_LABEL,
    which the guard's second webhook is sent), the ask fields and tolerations likewise, and the
    label itself: removed, the pod's next updates would no longer reach the guard."""
    for field_, keys in (("labels", GUARDED_LABELS), ("annotations", GUARDED_ANNOTATIONS)):
        before = old.get("metadata", {}).get(field_) or {}
        after = new.get("metadata", {}).get(field_) or {}
        for key in keys:
            if key in before and before.get(key) != after.get(key):
                raise _guard_refusal(f"{field_[:-1]} {key}")
    labels = old.get("metadata", {}).get("labels") or {}
    pool = labels.get(LABEL_POOL)
    counted = COUNTED_LABEL in labels
    if counted and labels[COUNTED_LABEL] != (new.get("metadata", {}).get("labels") or {}).get(
        COUNTED_LABEL
    ):
        raise _guard_refusal(f"label {COUNTED_LABEL}")
    if pool is None and not counted:
        return
    # a counted pod's tolerations are what its pool access was checked by, where it was
    # (`counted_tolerations` False: the caller checks the new ones itself, or none were)
    _guard_placement(old, new, tolerations=pool is not None or counted_tolerations)
    if catalog is not None and pool is not None and pool in catalog.pools:
        placement = pool_placement(catalog, str(pool))
        images = {
            str(c.get("name")): c.get("image")
            for c in (old.get("spec") or {}).get("containers") or []
            if isinstance(c, Mapping)
        }
        target = target_container(old)
        for container in (new.get("spec") or {}).get("containers") or []:
            if (
                placement.image
                and container.get("name") == target
                and container.get("image") != images.get(target)
            ):
                raise _guard_refusal(f"image of container {target} (the pool's plan sets it)")


__all__ = [
    "DEVICE_LIST_STRATEGIES",
    "Admitted",
    "BadReview",
    "Refusal",
    "Review",
    "SliceAsk",
    "admit",
    "check_ephemeral",
    "check_pool_access",
    "guard_update",
    "hide_devices_from_env",
    "hide_devices_from_ephemeral",
    "refuse_gpu_container_env",
    "refuse_isolation_env",
    "json_patch",
    "other_pod_gpu",
    "parse_review",
    "refuse_visible_gpus",
    "response",
    "slice_ask",
    "target_container",
    "tolerations_changed",
]
