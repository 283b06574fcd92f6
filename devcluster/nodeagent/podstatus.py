"""Pod status as a kubelet reports a pod whose containers run (pkg/kubelet/status,
kubelet_pods.go generateAPIPodStatus), for the "pods do not run" mode (as kwok fakes it): phase
Running, the five conditions, a running and ready status per container (init containers
terminated with Completed, sidecars running), podIP and hostIP; and, for run mode, each
container's entry, the pod's conditions and phase (podworker.py). Pure: the caller writes it
with pods/status."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: conditions the kubelet owns; others (PodScheduled, readiness gates) are kept as they are
KUBELET_CONDITIONS = ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")


def _container_id(pod_uid: str, name: str) -> str:
    return f"devcluster://{pod_uid}/{name}"


def running(pod: Mapping[str, Any], pod_ip: str, host_ip: str, t: str) -> dict[str, Any]:
    spec = pod.get("spec") or {}
    uid = pod["metadata"].get("uid", "")
    previous = pod.get("status") or {}
    kept = [c for c in previous.get("conditions") or [] if c["type"] not in KUBELET_CONDITIONS]
    ours = [
        {"type": kind, "status": "True", "lastTransitionTime": t} for kind in KUBELET_CONDITIONS
    ]
    return {
        "phase": "Running",
        "conditions": kept + ours,
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "podIP": pod_ip,
        "podIPs": [{"ip": pod_ip}],
        "startTime": previous.get("startTime") or t,
        "initContainerStatuses": [_init_done(c, uid, t) for c in spec.get("initContainers") or []],
        "containerStatuses": [
            {
                "name": c["name"],
                "image": c.get("image", ""),
                "imageID": "",
                "containerID": _container_id(uid, c["name"]),
                "ready": True,
                "restartCount": 0,
                "started": True,
                "state": {"running": {"startedAt": t}},
            }
            for c in spec.get("containers") or []
        ],
    }


def _init_done(container: Mapping[str, Any], uid: str, t: str) -> dict[str, Any]:
    """An init container of a running pod: Completed, or running, started and ready for a
    sidecar (restartPolicy Always, KEP-753), which runs beside the app containers."""
    sidecar = container.get("restartPolicy") == "Always"
    state: dict[str, Any] = {"running": {"startedAt": t}} if sidecar else {
        "terminated": {
            "exitCode": 0, "reason": "Completed", "startedAt": t, "finishedAt": t,
            "containerID": _container_id(uid, container["name"]),
        }
    }  # fmt: skip
    return {
        "name": container["name"],
        "image": container.get("image", ""),
        "imageID": "",
        "containerID": _container_id(uid, container["name"]),
        "ready": True,
        "restartCount": 0,
        "started": sidecar,
        "state": state,
    }


def reported(pod: Mapping[str, Any]) -> bool:
    """Whether the pod already carries a node's Running (or final) status."""
    status = pod.get("status") or {}
    return status.get("phase") in ("Running", "Succeeded", "Failed") and bool(
        status.get("containerStatuses")
    )


def _not_ready(pod: Mapping[str, Any], reason: str, t: str) -> list[dict[str, Any]]:
    previous = (pod.get("status") or {}).get("conditions") or []
    kept = [c for c in previous if c["type"] not in ("ContainersReady", "Ready")]
    ours = [{"type": k, "status": "False", "reason": reason, "lastTransitionTime": t}
            for k in ("ContainersReady", "Ready")]  # fmt: skip
    return kept + ours


def finished(pod: Mapping[str, Any], exit_code: int, t: str) -> dict[str, Any]:
    """The pod once its (first) container exited: Succeeded on 0, else Failed (no restarts
    yet: what a kubelet reports for restartPolicy Never)."""
    uid = pod["metadata"].get("uid", "")
    started = (pod.get("status") or {}).get("startTime") or t
    statuses = []
    for c in (pod.get("spec") or {}).get("containers") or []:
        statuses.append({
            "name": c["name"],
            "image": c.get("image", ""),
            "imageID": "",
            "containerID": _container_id(uid, c["name"]),
            "ready": False,
            "restartCount": 0,
            "started": False,
            "state": {"terminated": {
                "exitCode": exit_code,
                "reason": "Completed" if exit_code == 0 else "Error",
                "startedAt": started,
                "finishedAt": t,
                "containerID": _container_id(uid, c["name"]),
            }},
        })  # fmt: skip
    return {
        "phase": "Succeeded" if exit_code == 0 else "Failed",
        "conditions": _not_ready(pod, "PodCompleted" if exit_code == 0 else "PodFailed", t),
        "containerStatuses": statuses,
    }


def waiting(pod: Mapping[str, Any], reason: str, message: str, t: str) -> dict[str, Any]:
    """A container that could not start (CreateContainerConfigError, CreateContainerError):
    the pod stays Pending with the reason on each container."""
    return {
        "phase": "Pending",
        "startTime": (pod.get("status") or {}).get("startTime") or t,
        "conditions": _not_ready(pod, "ContainersNotReady", t),
        "containerStatuses": [
            {
                "name": c["name"],
                "image": c.get("image", ""),
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "started": False,
                "state": {"waiting": {"reason": reason, "message": message}},
            }
            for c in (pod.get("spec") or {}).get("containers") or []
        ],
    }


# --- run mode: the status of a pod whose containers run (podworker.py) ----------------------
def container_status(
    container: Mapping[str, Any],
    uid: str,
    state: dict[str, Any],
    *,
    ready: bool = False,
    started: bool = False,
    restarts: int = 0,
    last_state: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A `status.containerStatuses[]` entry; a containerID once the container was created."""
    entry = {
        "name": container["name"],
        "image": container.get("image", ""),
        "imageID": "",
        "ready": ready,
        "started": started,
        "restartCount": restarts,
        "state": state,
    }
    if "waiting" not in state or restarts:
        entry["containerID"] = _container_id(uid, container["name"])
    if last_state:
        entry["lastState"] = last_state
    return entry


def _condition(
    previous: Mapping[str, Mapping[str, Any]], kind: str, ok: bool, t: str, reason: str = "",
    message: str = "",
) -> dict[str, Any]:  # fmt: skip
    """A condition; its lastTransitionTime kept while its status stays (status_manager.go)."""
    status = "True" if ok else "False"
    before = previous.get(kind) or {}
    entry: dict[str, Any] = {
        "type": kind,
        "status": status,
        "lastProbeTime": None,
        "lastTransitionTime": before.get("lastTransitionTime", t)
        if before.get("status") == status
        else t,
    }
    if reason and not ok:
        entry["reason"] = reason
    if message and not ok:
        entry["message"] = message
    return entry


def phase_of(spec: Mapping[str, Any], initialized: bool, statuses: list[dict[str, Any]]) -> str:
    """The pod's phase from its app containers' statuses, as the kubelet's getPhase
    (pkg/kubelet/kubelet_pods.go): Pending while initializing or while a container waits to be
    created; Running while one runs or will restart; once every one has stopped for good,
    Succeeded if each exited 0, else Failed."""
    if not initialized:
        return "Pending"
    running = waiting = stopped = succeeded = 0
    for s in statuses:
        state = s.get("state") or {}
        if "running" in state:
            running += 1
        elif "terminated" in state:
            stopped += 1
            succeeded += state["terminated"].get("exitCode") == 0
        elif "terminated" in (s.get("lastState") or {}):  # between restarts
            stopped += 1
        else:
            waiting += 1
    if waiting:
        return "Pending"
    if running:
        return "Running"
    policy = spec.get("restartPolicy", "Always")
    if policy == "Always" or (policy == "OnFailure" and succeeded < stopped):
        return "Running"  # about to restart
    return "Succeeded" if succeeded == stopped else "Failed"


def pod_status(
    pod: Mapping[str, Any],
    statuses: list[dict[str, Any]],
    phase: str,
    t: str,
    ip: str | None = None,
    host_ip: str = "127.0.0.1",
    init_statuses: list[dict[str, Any]] | None = None,
    initialized: bool = True,
) -> dict[str, Any]:
    """The pod's status with every container's entry (`statuses` for the app containers,
    `init_statuses` for the init containers and sidecars). The conditions as
    generateAPIPodStatus makes them (pkg/kubelet/status/generate.go): Initialized once every
    init container completed (sidecars started), else False with ContainersNotInitialized;
    ContainersReady when every app container and sidecar is ready, Ready when also every
    readiness gate's condition is True; a finished pod's are False with PodCompleted."""
    spec = pod.get("spec") or {}
    previous_status = pod.get("status") or {}
    previous = {c["type"]: c for c in previous_status.get("conditions") or []}
    inits = init_statuses or []
    sidecars = {c["name"] for c in spec.get("initContainers") or []
                if c.get("restartPolicy") == "Always"}  # fmt: skip
    counted = [s for s in inits if s["name"] in sidecars] + list(statuses)
    unready = [s["name"] for s in counted if not s["ready"]]
    incomplete = [
        s["name"] for s in inits
        if not (s["name"] in sidecars and s.get("started"))
        and (s.get("state") or {}).get("terminated", {}).get("exitCode") != 0
    ]  # fmt: skip
    gates = [g.get("conditionType") for g in spec.get("readinessGates") or []]
    gated = [g for g in gates if (previous.get(g) or {}).get("status") != "True"]
    done = phase in ("Succeeded", "Failed")
    reason = "PodCompleted" if done else "ContainersNotReady"
    words = "" if done else f"containers with unready status: [{' '.join(unready)}]"
    ready_reason, ready_words = reason, words
    if not unready and gated:
        ready_reason = "ReadinessGatesNotReady"
        ready_words = f"corresponding condition of pod readiness gate {gated[0]!r} does not exist."
    init_reason = "PodCompleted" if done and initialized else "ContainersNotInitialized"
    init_words = f"containers with incomplete status: [{' '.join(incomplete)}]"
    kept = [c for c in previous.values() if c["type"] not in KUBELET_CONDITIONS]
    status: dict[str, Any] = {
        "phase": phase,
        "conditions": [
            *kept,
            _condition(previous, "PodReadyToStartContainers", ip is not None and not done, t),
            _condition(previous, "Initialized", initialized, t, init_reason, init_words),
            _condition(previous, "ContainersReady", not unready, t, reason, words),
            _condition(previous, "Ready", not unready and not gated, t, ready_reason, ready_words),
        ],
        "startTime": previous_status.get("startTime") or t,
        "containerStatuses": list(statuses),
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
    }
    if inits:
        status["initContainerStatuses"] = list(inits)
    if ip:
        status.update({"podIP": ip, "podIPs": [{"ip": ip}]})
    return status
