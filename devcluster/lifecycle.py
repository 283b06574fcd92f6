"""A started container's life: status, probes, exit, restarts (issue 29 item 3).

What the kubelet's pod workers do once a container runs (kubernetes pkg/kubelet/kubelet.go
syncPod, pkg/kubelet/prober/worker.go, pkg/kubelet/kuberuntime/kuberuntime_manager.go
computePodActions/doBackOff, pkg/kubelet/status/status_manager.go):

- `started` is true once the startupProbe succeeds (at once without one); until then neither the
  readiness nor the liveness probe runs; a startup or liveness probe failing `failureThreshold`
  times kills the container ("Container c failed liveness probe, will be restarted").
- Ready follows the readinessProbe where there is one (every container, with ports or not), with
  `Unhealthy` events "Readiness probe failed: ..."; without one the devcluster keeps its former
  rule (Ready once the first container port answers, at once without ports).
- An exited container is restarted where restartPolicy says so (Always; OnFailure on a non-zero
  exit), after the crash-loop back-off (waiting reason CrashLoopBackOff, `restartCount`,
  `lastState.terminated`), the pod staying Running and keeping its IP; otherwise the pod ends
  Succeeded/Failed as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from . import probes
from .kubelet import ConfigError, Running, port_open
from .store import now_iso
from .volumes import MountError

if TYPE_CHECKING:
    from .cluster import DevCluster

TICK = 0.2  # seconds between looks at a running container


def container_status(
    container: Mapping[str, Any],
    state: dict[str, Any],
    *,
    started: bool = False,
    restarts: int = 0,
) -> dict[str, Any]:
    """A pod's `status.containerStatuses[]` entry for `container` in `state` (waiting,
    running or terminated), not ready."""
    return {
        "name": container["name"],
        "image": container.get("image", ""),
        "imageID": "",
        "ready": False,
        "started": started,
        "restartCount": restarts,
        "state": state,
    }


def _should_restart(policy: str, code: int) -> bool:
    return policy == "Always" or (policy == "OnFailure" and code != 0)


async def supervise(
    cluster: DevCluster,
    namespace: str,
    name: str,
    container: Mapping[str, Any],
    running: Running,
    device_env: Mapping[str, str] | None,
) -> None:
    loop = asyncio.get_running_loop()
    restarts = 0
    backoff: float | None = None
    last_state: dict[str, Any] | None = None
    while True:
        started = now_iso()
        began = loop.time()
        if not _mark_running(cluster, namespace, name, container, running, restarts, last_state):
            await cluster.kubelet.stop(namespace, name, 0)
            return
        code = await _watch(cluster, namespace, name, container, running)
        pod = cluster._current(namespace, name)
        if code is None or pod is None or pod["metadata"].get("deletionTimestamp"):
            return  # deletion in progress: the pod disappears, no status to report
        policy = pod["spec"].get("restartPolicy", "Always")
        terminated = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": started,
            "finishedAt": now_iso(),
        }
        if not _should_restart(policy, code):
            await cluster.kubelet.stop(namespace, name, 0)
            pod["status"]["phase"] = "Succeeded" if code == 0 and policy != "Always" else "Failed"
            pod["status"]["containerStatuses"][0].update(
                {"ready": False, "started": False, "state": {"terminated": terminated}}
            )
            cluster._condition(pod, "ContainersReady", "False", reason="PodCompleted")
            cluster._condition(pod, "Ready", "False", reason="PodCompleted")
            cluster.store.update("pods", pod)
            return
        ip = running.ip
        await cluster.kubelet.stop(namespace, name, 0, release_ip=False)
        backoff = probes.next_backoff(backoff, loop.time() - began, cluster.restart_backoff)
        restarts += 1
        last_state = {"terminated": terminated}
        if backoff > 0:
            _mark_backoff(cluster, pod, container, restarts - 1, last_state, backoff)
            if not await _wait_out(cluster, namespace, name, backoff):
                await cluster.kubelet.release(ip)
                return
        pod = cluster._current(namespace, name)
        if pod is None or pod["metadata"].get("deletionTimestamp"):
            await cluster.kubelet.release(ip)
            return
        try:
            running = await cluster.kubelet.start(pod, cluster._lookup, device_env, ip=ip)
        except (ConfigError, MountError, RuntimeError) as exc:
            await cluster.kubelet.release(ip)
            cluster.event(pod, "Warning", "Failed", f"Error: {exc}", "kubelet")
            return


def _mark_running(
    cluster: DevCluster,
    namespace: str,
    name: str,
    container: Mapping[str, Any],
    running: Running,
    restarts: int,
    last_state: dict[str, Any] | None,
) -> bool:
    pod = cluster._current(namespace, name)
    if pod is None:
        return False
    started = now_iso()
    status = pod["status"]
    status.update({"phase": "Running", "podIP": running.ip, "podIPs": [{"ip": running.ip}]})
    status.setdefault("startTime", started)
    cluster._condition(pod, "Initialized", "True")
    cluster._condition(pod, "ContainersReady", "False", reason="ContainersNotReady")
    cluster._condition(pod, "Ready", "False", reason="ContainersNotReady")
    entry = container_status(
        container,
        {"running": {"startedAt": started}},
        started=not container.get("startupProbe"),
        restarts=restarts,
    )
    if last_state:
        entry["lastState"] = last_state
    status["containerStatuses"] = [entry]
    cluster.store.update("pods", pod)
    # kubelet 1.33's wording; kubespawner shows these in the spawn progress
    image = container.get("image", "")
    pulled = f'Container image "{image}" already present on machine'
    cluster.event(pod, "Normal", "Pulled", pulled, "kubelet")
    cluster.event(pod, "Normal", "Created", f"Created container: {container['name']}", "kubelet")
    cluster.event(pod, "Normal", "Started", f"Started container {container['name']}", "kubelet")
    return True


def _mark_backoff(
    cluster: DevCluster,
    pod: dict[str, Any],
    container: Mapping[str, Any],
    restarts: int,
    last_state: dict[str, Any],
    backoff: float,
) -> None:
    meta = pod["metadata"]
    who = f"{meta['name']}_{meta['namespace']}({meta['uid']})"
    message = f"back-off {backoff:g}s restarting failed container={container['name']} pod={who}"
    pod["status"]["phase"] = "Running"
    entry = pod["status"]["containerStatuses"][0]
    entry.update(
        {
            "ready": False,
            "started": False,
            "restartCount": restarts,
            "state": {"waiting": {"reason": "CrashLoopBackOff", "message": message}},
            "lastState": last_state,
        }
    )
    cluster._condition(pod, "ContainersReady", "False", reason="ContainersNotReady")
    cluster._condition(pod, "Ready", "False", reason="ContainersNotReady")
    cluster.store.update("pods", pod)
    cluster.event(
        pod,
        "Warning",
        "BackOff",
        f"Back-off restarting failed container {container['name']} in pod {who}",
        "kubelet",
    )


async def _wait_out(cluster: DevCluster, namespace: str, name: str, seconds: float) -> bool:
    """Sleep the back-off; False where the pod is deleted meanwhile."""
    loop = asyncio.get_running_loop()
    until = loop.time() + seconds
    while loop.time() < until:
        pod = cluster._current(namespace, name)
        if pod is None or pod["metadata"].get("deletionTimestamp"):
            return False
        await asyncio.sleep(min(TICK, max(until - loop.time(), 0)))
    return True


def _set_status(
    cluster: DevCluster, namespace: str, name: str, *, ready: bool | None, started: bool | None
) -> bool:
    pod = cluster._current(namespace, name)
    if pod is None:
        return False
    entry = pod["status"]["containerStatuses"][0]
    if started is not None:
        entry["started"] = started
    if ready is not None:
        entry["ready"] = ready
        reason = {} if ready else {"reason": "ContainersNotReady"}
        cluster._condition(pod, "ContainersReady", "True" if ready else "False", **reason)
        cluster._condition(pod, "Ready", "True" if ready else "False", **reason)
    cluster.store.update("pods", pod)
    return True


async def _watch(
    cluster: DevCluster,
    namespace: str,
    name: str,
    container: Mapping[str, Any],
    running: Running,
) -> int | None:
    """Until the container exits (its code; a probe's kill counts as 137) or the pod goes."""
    loop = asyncio.get_running_loop()
    now = loop.time()
    startup = probes.Probe.of(container.get("startupProbe"))
    readiness = probes.Probe.of(container.get("readinessProbe"))
    liveness = probes.Probe.of(container.get("livenessProbe"))
    start_track = probes.Tracker(startup, now, False) if startup else None
    ready_track = probes.Tracker(readiness, now, False) if readiness else None
    live_track = probes.Tracker(liveness, now, True) if liveness else None
    ports = [p.get("containerPort") for p in container.get("ports") or []]
    started = start_track is None
    ready = False
    process = running.process
    cname = container["name"]

    async def try_probe(probe: probes.Probe) -> tuple[bool, str]:
        return await probes.run(
            probe, running.ip, container, running.env, running.cwd, running.beside
        )

    async def kill(kind: str, message: str) -> int:
        pod = cluster._current(namespace, name)
        if pod is not None:
            cluster.event(pod, "Warning", "Unhealthy", f"{kind} probe failed: {message}", "kubelet")
            why = f"Container {cname} failed {kind.lower()} probe, will be restarted"
            cluster.event(pod, "Normal", "Killing", why, "kubelet")
        await cluster.kubelet.stop(namespace, name, 0, release_ip=False)
        cluster.kubelet.ips.used.add(running.ip)  # the pod keeps its address
        cluster.kubelet.running[(namespace, name)] = running
        return 137

    while process.returncode is None:
        now = loop.time()
        if cluster._current(namespace, name) is None:
            return None
        if start_track is not None and not started and start_track.due(now):
            ok, message = await try_probe(start_track.probe)
            flipped = start_track.record(ok, loop.time())
            if flipped is True:
                started = True
                _set_status(cluster, namespace, name, ready=None, started=True)
                now = loop.time()
                if ready_track:
                    ready_track.next_at = now
                if live_track:
                    live_track.next_at = now + live_track.probe.initial_delay
            elif flipped is False:
                return await kill("Startup", message)
        if started and ready_track is not None and ready_track.due(now):
            ok, message = await try_probe(ready_track.probe)
            flipped = ready_track.record(ok, loop.time())
            if not ok and process.returncode is None:
                pod = cluster._current(namespace, name)
                if pod is not None:
                    words = f"Readiness probe failed: {message}"
                    cluster.event(pod, "Warning", "Unhealthy", words, "kubelet")
            if flipped is not None and flipped != ready:
                ready = flipped
                if not _set_status(cluster, namespace, name, ready=ready, started=None):
                    return None
        elif started and ready_track is None and not ready:
            if not ports or await asyncio.to_thread(port_open, running.ip, int(ports[0])):
                ready = True
                if not _set_status(cluster, namespace, name, ready=True, started=None):
                    return None
        if started and live_track is not None and live_track.due(now):
            ok, message = await try_probe(live_track.probe)
            if not ok and process.returncode is None:
                pod = cluster._current(namespace, name)
                if pod is not None:
                    words = f"Liveness probe failed: {message}"
                    cluster.event(pod, "Warning", "Unhealthy", words, "kubelet")
            if live_track.record(ok, loop.time()) is False:
                return await kill("Liveness", message)
        try:
            await asyncio.wait_for(process.wait(), TICK)
        except asyncio.TimeoutError:
            pass
    return process.returncode
