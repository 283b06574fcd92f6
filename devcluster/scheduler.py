"""A scheduler that filters nodes the way kube-scheduler's default plugins do.

Filter order follows the default profile (NodeUnschedulable, TaintToleration, NodeAffinity,
NodeResourcesFit); a node fails on its first failing filter, except resources, where every
insufficient resource is reported. The message matches kube-scheduler 1.33's FitError
(pkg/scheduler/framework/types.go, FitError.Error()): reasons "<count> <reason>" sorted as
strings, each part closed by " %v." (SeparatorFormat), then the preemption PostFilter's own
FitError, prefixed "preemption: ". Preemption cannot help a node that failed an
UnschedulableAndUnresolvable filter (cordoned, untolerated taint, affinity); on a node short of
resources it looks for lower-priority victims, and there are none here (no priorities, no
preemption), so those nodes read "No preemption victims found for incoming pod"
(pkg/scheduler/framework/preemption/preemption.go). Both FitErrors end in "." and the outer
separator adds another, hence the ".." at the end of real messages.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from decimal import Decimal
from typing import Any

from fracspawner.k8s.objects import parse_quantity as _parse_quantity

from . import hami

parse_quantity = _parse_quantity()  # the kubernetes client's, without its 3 s package import

NATIVE = ("cpu", "memory", "ephemeral-storage")


class FilterError(Exception):
    """A filter plugin's error (not a "no"): the scheduling attempt ends with its message."""


NOT_HELPFUL = "Preemption is not helpful for scheduling"
NO_VICTIMS = "No preemption victims found for incoming pod"


def quantity(value: Any) -> Decimal:
    try:
        return parse_quantity(value)
    except (ValueError, TypeError):
        return Decimal(0)


def pod_requests(pod: Mapping[str, Any]) -> dict[str, Decimal]:
    """Effective requests: sum over containers, max with each init container.

    For extended resources a limit without a request implies the request (they must be equal).
    """

    def container_requests(c: Mapping[str, Any]) -> dict[str, Decimal]:
        resources = c.get("resources") or {}
        requests = {k: quantity(v) for k, v in (resources.get("requests") or {}).items()}
        for k, v in (resources.get("limits") or {}).items():
            requests.setdefault(k, quantity(v))
        return requests

    spec = pod.get("spec") or {}
    total: dict[str, Decimal] = {}
    for c in spec.get("containers") or []:
        for k, v in container_requests(c).items():
            total[k] = total.get(k, Decimal(0)) + v
    for c in spec.get("initContainers") or []:
        for k, v in container_requests(c).items():
            total[k] = max(total.get(k, Decimal(0)), v)
    return total


def qos_class(pod: Mapping[str, Any]) -> str:
    """Guaranteed (every container limits cpu and memory, requests equal to limits), BestEffort
    (no container requests or limits cpu or memory), else Burstable (pkg/apis/core/helper/qos)."""
    spec = pod.get("spec") or {}
    containers = [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]
    guaranteed, anything = True, False
    for c in containers:
        resources = c.get("resources") or {}
        limits = {k: quantity(v) for k, v in (resources.get("limits") or {}).items()}
        requests = {k: quantity(v) for k, v in (resources.get("requests") or {}).items()}
        for name in ("cpu", "memory"):
            limit, request = limits.get(name), requests.get(name, limits.get(name))
            if (limit or 0) > 0 or (request or 0) > 0:
                anything = True
            if not limit or request != limit:
                guaranteed = False
    if not anything:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def holds_resources(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("spec") or {}).get("nodeName")) and (pod.get("status") or {}).get(
        "phase"
    ) not in ("Succeeded", "Failed")


def _tolerates(tolerations: Iterable[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        if t.get("operator") == "Exists":
            if not t.get("key") or t["key"] == taint.get("key"):
                return True
        elif t.get("key") == taint.get("key") and (t.get("value") or "") == (
            taint.get("value") or ""
        ):
            return True
    return False


def _term_matches(term: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    for expr in term.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        value = labels.get(key)
        if op == "In" and value not in values:
            return False
        if op == "NotIn" and value in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
        if op in ("Gt", "Lt"):
            try:
                ok = int(value) > int(values[0]) if op == "Gt" else int(value) < int(values[0])
            except (TypeError, ValueError, IndexError):
                ok = False
            if not ok:
                return False
    return True


def _affinity_ok(pod: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    spec = pod.get("spec") or {}
    for k, v in (spec.get("nodeSelector") or {}).items():
        if labels.get(k) != v:
            return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms") or []
    return not terms or any(_term_matches(t, labels) for t in terms)


def node_failures(
    pod: Mapping[str, Any],
    node: Mapping[str, Any],
    used: Mapping[str, Decimal],
    extra: Callable[[Mapping[str, Any], Mapping[str, Any]], str | None] | None = None,
) -> list[str]:
    """Why `pod` does not fit `node` (empty: it fits). `extra` is a later filter plugin
    (DynamicResources, devcluster/dra), run where the default filters pass."""
    if (node.get("spec") or {}).get("unschedulable"):
        return ["node(s) were unschedulable"]
    tolerations = (pod.get("spec") or {}).get("tolerations") or []
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerates(
            tolerations, taint
        ):
            return [
                f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value', '')}}}"
            ]
    labels = (node.get("metadata") or {}).get("labels") or {}
    if not _affinity_ok(pod, labels):
        return ["node(s) didn't match Pod's node affinity/selector"]
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    # HAMi's resources on a HAMi node: its extender decides per device, not NodeResourcesFit
    hami_pod = hami.node_devices(node) is not None and bool(hami.container_requests(pod))
    failures = []
    for resource, amount in sorted(pod_requests(pod).items()):
        if amount <= 0 or (hami_pod and resource in hami.MANAGED):
            continue
        have = quantity(allocatable.get(resource, 0)) - used.get(resource, Decimal(0))
        if amount > have:
            failures.append(f"Insufficient {resource}")
    pods_allowed = quantity(allocatable.get("pods", 110))
    if used.get("pods", Decimal(0)) + 1 > pods_allowed:
        failures.append("Too many pods")
    if hami_pod and not failures:
        allocation, reason = hami.allocate(pod, node, used)
        if allocation is None:
            failures.append(reason)
    if extra is not None and not failures:
        reason = extra(pod, node)
        if reason:
            failures.append(reason)
    return failures


def usage_by_node(
    pods: Iterable[Mapping[str, Any]],
    requests: Callable[[Mapping[str, Any]], Mapping[str, Decimal]] = pod_requests,
) -> dict[str, dict[str, Decimal]]:
    """What the bound, unfinished pods request per node (`requests` may be a cached
    `pod_requests`: a pod's resources cannot change once created)."""
    usage: dict[str, dict[str, Decimal]] = {}
    for pod in pods:
        if not holds_resources(pod):
            continue
        node_use = usage.setdefault(pod["spec"]["nodeName"], {})
        for k, v in requests(pod).items():
            node_use[k] = node_use.get(k, Decimal(0)) + v
        node_use["pods"] = node_use.get("pods", Decimal(0)) + 1
        hami.book_allocations(pod, node_use)  # the devices HAMi gave it, per device
    return usage


def schedule(
    pod: MutableMapping[str, Any],
    nodes: list[Mapping[str, Any]],
    usage: MutableMapping[str, MutableMapping[str, Decimal]],
    extra: Callable[[Mapping[str, Any], Mapping[str, Any]], str | None] | None = None,
    post_filter: str = "",
) -> tuple[str | None, str]:
    """(node name, "") for the first fitting node in least-allocated order, else (None, message).

    A pod HAMi places gets its device allocation written onto it (the caller binds and stores
    this very object) and booked into `usage`, as HAMi's scheduler does before binding."""
    if not nodes:
        return None, "no nodes available to schedule pods"  # kube-scheduler's ErrNoNodesAvailable
    reasons: Counter[str] = Counter()
    preemption: Counter[str] = Counter()
    fitting = []
    for node in nodes:
        name = node["metadata"]["name"]
        try:
            failures = node_failures(pod, node, usage.get(name, {}), extra)
        except FilterError as exc:
            return None, str(exc)
        if failures:
            reasons.update(failures)
            resolvable = all(
                f.startswith("Insufficient ") or f == "Too many pods" for f in failures
            )
            preemption[NO_VICTIMS if resolvable else NOT_HELPFUL] += 1
        else:
            fitting.append(name)
    if fitting:
        # spread like the default LeastAllocated score: fewest pods first, then name
        chosen = min(fitting, key=lambda n: (usage.get(n, {}).get("pods", 0), n))
        node = next(n for n in nodes if n["metadata"]["name"] == chosen)
        if hami.node_devices(node) is not None and hami.container_requests(pod):
            node_use = usage.setdefault(chosen, {})
            allocation, _ = hami.allocate(pod, node, node_use)
            assert allocation is not None  # node_failures found room a moment ago
            hami.assign(pod, chosen, allocation, node_use)
        return chosen, ""
    return None, fit_error(len(nodes), reasons, preemption, post_filter)


def _fit_error(num_nodes: int, reasons: Counter[str]) -> str:
    message = f"0/{num_nodes} nodes are available:"
    parts = sorted(f"{count} {reason}" for reason, count in reasons.items())
    if parts:
        message += " " + ", ".join(parts) + "."
    return message


def fit_error(
    num_nodes: int, reasons: Counter[str], preemption: Counter[str], post_filter: str = ""
) -> str:
    """kube-scheduler's FailedScheduling message, e.g. `0/3 nodes are available: 1 node(s) had
    untolerated taint {gpu: true}, 2 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are
    available: 1 Preemption is not helpful for scheduling, 2 No preemption victims found for
    incoming pod..`

    With `post_filter` (the DynamicResources PostFilter's "still not schedulable" for a pod
    with claims), the PostFilter plugins' reasons are joined with ", ", as a 1.34 cluster
    running NVIDIA's DRA driver words it: `0/2 nodes are available: 1 cannot allocate all
    claims, 1 node(s) didn't match Pod's node affinity/selector. still not schedulable,
    preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling.`
    (one full stop at the end there)."""
    if post_filter:
        return (
            f"{_fit_error(num_nodes, reasons)} {post_filter}, preemption: "
            f"{_fit_error(num_nodes, preemption)}"
        )
    return f"{_fit_error(num_nodes, reasons)} preemption: {_fit_error(num_nodes, preemption)}."
