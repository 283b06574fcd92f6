"""A bound pod's life in run mode: what the kubelet's pod worker does (kubernetes
pkg/kubelet/kubelet.go syncPod and SyncTerminatingPod, pkg/kubelet/prober/worker.go,
pkg/kubelet/kuberuntime/kuberuntime_manager.go computePodActions/doBackOff,
pkg/kubelet/status/status_manager.go), for the pod's first container, run by
devcluster.kubelet.Kubelet on the runtime's event loop:

- the container is created with the Service env (serviceenv.py); until it can be, the pod stays
  Pending with the kubelet's waiting reason and event (ContainerCreating with FailedMount,
  CreateContainerConfigError, CreateContainerError) and is tried again;
- once started: Pulled, Created and Started events, phase Running; `started` after the
  startupProbe (at once without one); Ready after the readinessProbe passes (with Unhealthy
  events while it fails) or, without one, once the first container port answers (at once
  without ports: the devcluster's rule, images take that long to start anyway); a failing
  liveness or startup probe kills the container (Killing "... will be restarted");
- an exited container is restarted as restartPolicy says after the crash-loop back-off
  (CrashLoopBackOff, BackOff event, restartCount, lastState), or the pod ends Succeeded/Failed;
- a deleted pod's container gets SIGTERM and its grace period (Killing "Stopping container"),
  then the pod is removed with grace 0, as a kubelet does once its containers stopped.

Every API call (status, events, reads) goes through `NodeApi`, the node's own credentials."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from devcluster import probes
from devcluster.kubelet import ConfigError, Kubelet, Running, port_open
from devcluster.volumes import MountError

from . import podstatus
from .nodeobject import now

log = logging.getLogger("devcluster.nodeagent")
TICK = 0.2  # seconds between looks at a running container


class NodeApi(Protocol):
    """What a pod worker asks of its node (agent.NodeRunner), synchronously."""

    def patch_status(self, pod: Mapping[str, Any], status: dict[str, Any]) -> bool: ...
    def event(self, pod: Mapping[str, Any], kind: str, reason: str, message: str,
              container: str | None = None) -> None: ...  # fmt: skip
    def remove(self, pod: Mapping[str, Any]) -> None: ...
    def lookup(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None: ...
    def service_env(self, pod: Mapping[str, Any]) -> dict[str, str]: ...


def _should_restart(policy: str, code: int) -> bool:
    return policy == "Always" or (policy == "OnFailure" and code != 0)


class PodWorker:
    def __init__(
        self,
        pod: dict[str, Any],
        api: NodeApi,
        kubelet: Kubelet,
        backoff: tuple[float, float] = probes.DEFAULT_BACKOFF,
    ) -> None:
        self.pod = pod
        self.api = api
        self.kubelet = kubelet
        self.backoff = backoff
        meta = pod["metadata"]
        self.key = (meta["namespace"], meta["name"])
        self.uid = meta["uid"]
        self.container = pod["spec"]["containers"][0]
        self.ip: str | None = None
        self.restarts = 0
        self.last_state: dict[str, Any] | None = None
        self.deleting = asyncio.Event()
        self.task: asyncio.Task | None = None
        self._written: dict[str, Any] | None = None

    # --- from the node's watch (on the runtime's loop) --------------------------------------
    def update(self, pod: dict[str, Any]) -> None:
        self.pod = pod
        if pod["metadata"].get("deletionTimestamp"):
            self.deleting.set()

    async def main(self) -> None:
        if self.deleting.is_set():  # deleted before it ran (or finished before this agent)
            await self._call("remove", self.pod)
            return
        life = asyncio.create_task(self._life())
        deleting = asyncio.create_task(self.deleting.wait())
        try:
            await asyncio.wait({life, deleting}, return_when=asyncio.FIRST_COMPLETED)
            if not self.deleting.is_set():
                await self.deleting.wait()  # finished for good: the pod stays until deleted
        finally:  # deleted, or the agent stops
            life.cancel()
            deleting.cancel()
        [outcome] = await asyncio.gather(life, return_exceptions=True)
        if isinstance(outcome, Exception):  # the apiserver went, or a bug: said, then deleted
            log.warning("nodeagent: pod %s/%s: %r", *self.key, outcome)
        await self._terminate()

    # --- helpers -----------------------------------------------------------------------------
    async def _call(self, method: str, *args: Any) -> Any:
        return await asyncio.to_thread(getattr(self.api, method), *args)

    async def _event(self, kind: str, reason: str, message: str) -> None:
        try:
            await self._call("event", self.pod, kind, reason, message, self.container["name"])
        except Exception as err:  # an event is best effort, as the kubelet's recorder
            log.warning("nodeagent: event %s for %s/%s: %s", reason, *self.key, err)

    async def _status(self, main: dict[str, Any], phase: str) -> None:
        status = podstatus.pod_status(self.pod, main, phase, now(), self.ip)
        comparable = {**status, "conditions": [{**c, "lastTransitionTime": ""}
                                               for c in status["conditions"]]}  # fmt: skip
        if comparable == self._written:
            return
        if await self._call("patch_status", self.pod, status):
            self._written = comparable
            # the pod as written: later conditions keep their transition times
            self.pod = {**self.pod, "status": {**(self.pod.get("status") or {}), **status}}

    def _entry(self, state: dict[str, Any], **more: Any) -> dict[str, Any]:
        return podstatus.container_status(
            self.container, self.uid, state, restarts=self.restarts,
            last_state=self.last_state, **more,
        )  # fmt: skip

    # --- the container's life ---------------------------------------------------------------
    async def _create(self) -> Running:
        """Start the container, trying again (with the back-off) while it cannot be."""
        wait: float | None = None
        while True:
            try:
                env = await self._call("service_env", self.pod)
                return await self.kubelet.start(self.pod, self.api.lookup, env, ip=self.ip)
            except MountError as err:
                reason, words, event = "ContainerCreating", "", ("FailedMount", str(err))
            except ConfigError as err:
                reason, words = "CreateContainerConfigError", str(err)
                event = ("Failed", f"Error: {err}")
            except RuntimeError as err:
                reason, words, event = "CreateContainerError", str(err), ("Failed", f"Error: {err}")
            waiting = {"reason": reason, **({"message": words} if words else {})}
            await self._status(self._entry({"waiting": waiting}), "Pending")
            await self._event("Warning", *event)
            wait = probes.next_backoff(wait, 0.0, self.backoff) or 1.0
            await asyncio.sleep(wait)

    async def _life(self) -> None:
        loop = asyncio.get_running_loop()
        backoff: float | None = None
        name = self.container["name"]
        while True:
            running = await self._create()
            self.ip = running.ip
            began, started_at = loop.time(), now()
            image = self.container.get("image", "")
            await self._event("Normal", "Pulled",
                              f'Container image "{image}" already present on machine')  # fmt: skip
            await self._event("Normal", "Created", f"Created container: {name}")
            await self._event("Normal", "Started", f"Started container {name}")
            code = await self._watch(running, started_at)
            policy = self.pod["spec"].get("restartPolicy", "Always")
            terminated = {
                "exitCode": code,
                "reason": "Completed" if code == 0 else "Error",
                "startedAt": started_at,
                "finishedAt": now(),
                "containerID": podstatus.container_status(self.container, self.uid, {})[
                    "containerID"
                ],
            }
            if not _should_restart(policy, code):
                phase = "Succeeded" if code == 0 and policy != "Always" else "Failed"
                await self._status(self._entry({"terminated": terminated}), phase)
                await self.kubelet.stop(*self.key, 0)  # its address goes back
                self.ip = None
                return
            await self.kubelet.stop(*self.key, 0, release_ip=False)
            backoff = probes.next_backoff(backoff, loop.time() - began, self.backoff)
            self.last_state = {"terminated": terminated}
            if backoff > 0:
                meta = self.pod["metadata"]
                who = f"{meta['name']}_{meta['namespace']}({self.uid})"
                words = f"back-off {backoff:g}s restarting failed container={name} pod={who}"
                waiting = {"reason": "CrashLoopBackOff", "message": words}
                await self._status(self._entry({"waiting": waiting}), "Running")
                said = f"Back-off restarting failed container {name} in pod {who}"
                await self._event("Warning", "BackOff", said)
                await asyncio.sleep(backoff)
            self.restarts += 1

    async def _watch(self, running: Running, started_at: str) -> int:
        """Until the container exits (its code; a probe's kill counts as 137)."""
        loop = asyncio.get_running_loop()
        container = self.container
        t0 = loop.time()
        startup = probes.Probe.of(container.get("startupProbe"))
        readiness = probes.Probe.of(container.get("readinessProbe"))
        liveness = probes.Probe.of(container.get("livenessProbe"))
        # unknown at first (the kubelet's Unknown): failing failureThreshold times kills it
        start_track = probes.Tracker(startup, t0, None) if startup else None
        ready_track = probes.Tracker(readiness, t0, False) if readiness else None
        live_track = probes.Tracker(liveness, t0, True) if liveness else None
        ports = [p.get("containerPort") for p in container.get("ports") or []]
        started = start_track is None
        ready = started and ready_track is None and not ports  # else once it answers
        process = running.process

        async def show() -> None:
            state = {"running": {"startedAt": started_at}}
            await self._status(self._entry(state, ready=ready, started=started), "Running")

        async def attempt(probe: probes.Probe) -> tuple[bool, str]:
            return await probes.run(
                probe, running.ip, container, running.env, running.cwd, running.beside
            )

        async def kill(kind: str, message: str) -> int:
            await self._event("Warning", "Unhealthy", f"{kind} probe failed: {message}")
            why = f"Container {container['name']} failed {kind.lower()} probe, will be restarted"
            await self._event("Normal", "Killing", why)
            grace = float(self.pod["spec"].get("terminationGracePeriodSeconds", 30))
            await self.kubelet.stop(*self.key, grace, release_ip=False)
            return 137

        await show()
        while process.returncode is None:
            now_ = loop.time()
            if start_track is not None and not started and start_track.due(now_):
                ok, message = await attempt(start_track.probe)
                flipped = start_track.record(ok, loop.time())
                if flipped is True:
                    started = True
                    await show()
                    if ready_track:
                        ready_track.next_at = loop.time()
                    if live_track:
                        live_track.next_at = loop.time() + live_track.probe.initial_delay
                elif flipped is False:
                    return await kill("Startup", message)
            if started and ready_track is not None and ready_track.due(now_):
                ok, message = await attempt(ready_track.probe)
                flipped = ready_track.record(ok, loop.time())
                if not ok and process.returncode is None:
                    await self._event("Warning", "Unhealthy", f"Readiness probe failed: {message}")
                if flipped is not None and flipped != ready:
                    ready = flipped
                    await show()
            elif started and ready_track is None and not ready:
                if not ports or await asyncio.to_thread(port_open, running.ip, int(ports[0])):
                    ready = True
                    await show()
            if started and live_track is not None and live_track.due(now_):
                ok, message = await attempt(live_track.probe)
                alive = process.returncode is None
                if live_track.record(ok, loop.time()) is False and alive:
                    return await kill("Liveness", message)  # its own Unhealthy event
                if not ok and alive:
                    await self._event("Warning", "Unhealthy", f"Liveness probe failed: {message}")
            try:
                await asyncio.wait_for(process.wait(), TICK)
            except asyncio.TimeoutError:
                pass
        return process.returncode

    # --- deletion ----------------------------------------------------------------------------
    async def _terminate(self) -> None:
        meta = self.pod["metadata"]
        grace = meta.get("deletionGracePeriodSeconds")
        if grace is None:
            grace = self.pod["spec"].get("terminationGracePeriodSeconds", 30)
        running = self.kubelet.running.get(self.key)
        if running is not None and running.process.returncode is None:
            await self._event("Normal", "Killing", f"Stopping container {self.container['name']}")
            await self.kubelet.stop(*self.key, float(grace))
        elif running is not None:
            await self.kubelet.stop(*self.key, 0)
        elif self.ip is not None:
            await self.kubelet.release(self.ip)
        self.ip = None
        await self._call("remove", self.pod)
