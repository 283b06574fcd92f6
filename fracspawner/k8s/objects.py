"""Reading raw Kubernetes node and pod dicts the way kube-scheduler reads them.

Pure helpers for the capacity index and each backend's counting: resource quantities, what a
pod requests, whether a node is schedulable for a pool, whether a pod still holds its resources.
Objects are the camelCase dicts the API returns (what the reflectors store), never kubernetes
client models.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from decimal import Decimal
from functools import lru_cache
from pathlib import Path
from typing import Any

#: Pod phases after which the kubelet has released the pod's resources.
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
#: Taint effects that keep a pod off a node (PreferNoSchedule only lowers its score).
BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
_NATIVE_RESOURCES = frozenset({"cpu", "memory", "ephemeral-storage", "pods"})


@lru_cache(maxsize=1)
def parse_quantity() -> Callable[[Any], Decimal]:
    """The kubernetes client's own `parse_quantity`, loaded on first use.

    `import kubernetes.utils.quantity` first runs the package's `__init__`, which imports the
    whole generated client (about 3 s of CPU in every process that parses a quantity: the hub,
    the service, the culler, the webhook, the devcluster). The module itself needs only
    `decimal`, so it is loaded from its file under the installed package, without the package;
    where that file is not found, the ordinary import."""
    loaded = sys.modules.get("kubernetes.utils.quantity")
    if loaded is not None:
        return loaded.parse_quantity
    spec = importlib.util.find_spec("kubernetes")  # a top-level spec: nothing is executed
    locations = list(spec.submodule_search_locations or []) if spec else []
    path = Path(locations[0], "utils", "quantity.py") if locations else None
    if path is None or not path.is_file():
        from kubernetes.utils.quantity import parse_quantity as ordinary

        return ordinary
    module_spec = importlib.util.spec_from_file_location("_fracspawner_k8s_quantity", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.parse_quantity


@lru_cache(maxsize=4096, typed=True)  # typed: True must not hit the cache entry of 1
def quantity(value: Any) -> Decimal | None:
    """A resource quantity ("4", "500m", "10Gi", "1e3", 3) as a Decimal; None when malformed.

    Parsed by the kubernetes client's own `parse_quantity` (see `parse_quantity()`). Cached: a
    cluster repeats the same few quantity strings on thousands of pods.
    """
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, str) and any(c.isspace() for c in value.strip()):
        return None  # the apiserver rejects "5 Gi"; parse_quantity would accept it
    try:
        return parse_quantity()(value)
    except (ValueError, TypeError, ArithmeticError):
        return None


def quantity_int(value: Any) -> int | None:
    """An extended-resource quantity as a whole number (they are integers by API rule)."""
    q = quantity(value)
    if q is None:
        return None
    return math.floor(q)


def meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return meta(obj).get("labels") or {}


def annotations(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return meta(obj).get("annotations") or {}


def created_at(obj: Mapping[str, Any]) -> float | None:
    """Unix seconds of the object's creationTimestamp; None when it has none or it is not one."""
    raw = meta(obj).get("creationTimestamp")
    try:
        return datetime.fromisoformat(str(raw).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def is_active(pod: Mapping[str, Any]) -> bool:
    """A pod holds resources until it reaches a terminal phase (deleting pods still count)."""
    return (pod.get("status") or {}).get("phase") not in TERMINAL_PHASES


def bound_node(pod: Mapping[str, Any]) -> str | None:
    return (pod.get("spec") or {}).get("nodeName") or None


def _container_amounts(container: Mapping[str, Any]) -> dict[str, Decimal]:
    """One container's requests; an extended resource's request defaults to its limit."""
    resources = container.get("resources") or {}
    requests = resources.get("requests") or {}
    limits = resources.get("limits") or {}
    out: dict[str, Decimal] = {}
    for name in {*requests, *limits}:
        q = quantity(requests[name] if name in requests else limits[name])
        if q is not None:
            out[name] = q
    return out


def pod_requests(pod: Mapping[str, Any]) -> dict[str, Decimal]:
    """What the scheduler charges a pod: max(sum of containers, largest init container).

    Same rule as the scheduler's computePodResourceRequest (k8s.io/component-helpers
    resource.PodRequests), plus spec.overhead; sidecar init containers are counted as
    regular init containers, which only matters for pods that hold GPUs in a sidecar.
    """
    spec = pod.get("spec") or {}
    total: dict[str, Decimal] = {}
    for container in spec.get("containers") or []:
        for name, q in _container_amounts(container).items():
            total[name] = total.get(name, Decimal(0)) + q
    for container in spec.get("initContainers") or []:
        for name, q in _container_amounts(container).items():
            if q > total.get(name, Decimal(0)):
                total[name] = q
    for name, value in (spec.get("overhead") or {}).items():
        q = quantity(value)
        if q is not None:
            total[name] = total.get(name, Decimal(0)) + q
    return total


def extended_requests(pod: Mapping[str, Any]) -> dict[str, Decimal]:
    """`pod_requests` limited to extended resources (the GPU-ish ones)."""
    return {k: v for k, v in pod_requests(pod).items() if k not in _NATIVE_RESOURCES}


def allocatable(node: Mapping[str, Any]) -> Mapping[str, Any]:
    return (node.get("status") or {}).get("allocatable") or {}


def is_ready(node: Mapping[str, Any]) -> bool:
    """Ready condition True and not cordoned (spec.unschedulable)."""
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return False


def ready_since(node: Mapping[str, Any]) -> float | None:
    """Unix seconds of the node's last Ready transition (its creationTimestamp where the
    condition has no time); None when neither is readable."""
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready" and cond.get("lastTransitionTime"):
            try:
                raw = str(cond["lastTransitionTime"]).replace("Z", "+00:00")
                return datetime.fromisoformat(raw).timestamp()
            except ValueError:
                break
    return created_at(node)


def selector_matches(node_labels: Mapping[str, str], selector: Mapping[str, Any]) -> bool:
    return all(node_labels.get(k) == str(v) for k, v in selector.items())


def _tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """v1.Toleration.ToleratesTaint (k8s.io/api/core/v1/toleration.go)."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    if key and key != taint.get("key"):
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    if operator == "Equal":
        return (toleration.get("value") or "") == (taint.get("value") or "")
    return False


def normalise_toleration(toleration: Any) -> dict[str, Any]:
    """Accept camelCase dicts, snake_case dicts or (key, value) pairs."""
    raw = dict(toleration)
    if "toleration_seconds" in raw:
        raw["tolerationSeconds"] = raw.pop("toleration_seconds")
    return raw


def taints_tolerated(node: Mapping[str, Any], tolerations: Iterable[Mapping[str, Any]]) -> bool:
    """True when every NoSchedule/NoExecute taint on the node is tolerated."""
    return tolerates_all((node.get("spec") or {}).get("taints") or [], tolerations)


def tolerates_all(
    taints: Iterable[Mapping[str, Any]], tolerations: Iterable[Mapping[str, Any]]
) -> bool:
    """True when every NoSchedule/NoExecute taint of `taints` is tolerated."""
    tols = list(tolerations)
    return all(
        any(_tolerates(t, taint) for t in tols)
        for taint in taints
        if taint.get("effect") in BLOCKING_EFFECTS
    )
