"""A bound pod's life in run mode: what the kubelet's pod worker does (kubernetes
pkg/kubelet/kubelet.go syncPod and SyncTerminatingPod, pkg/kubelet/prober/worker.go,
pkg/kubelet/kuberuntime/kuberuntime_manager.go computePodActions/doBackOff,
pkg/kubelet/status/status_manager.go), for every container of the pod, each a process of its own
(containers.py) on devcluster.kubelet.Kubelet, on the runtime's event loop:

- init containers run in order, each to completion before the next starts; a failing one is
  restarted with the back-off (the pod stays Pending, `Init:Error`/`Init:CrashLoopBackOff`)
  unless the pod's restartPolicy is Never, which fails the pod (kubernetes.io, "Init
  Containers"). An init container with restartPolicy Always is a sidecar (KEP-753, "Sidecar
  Containers"): once it is started (its startupProbe passed, at once without one) the next init
  container starts; it keeps running, is restarted whatever the pod's policy, counts for the
  pod's readiness and is stopped after the app containers. Until then the app containers wait
  with PodInitializing and Initialized is False (ContainersNotInitialized);
- then every app container starts, each restarted by the pod's restartPolicy on its own; the
  phase follows the kubelet's getPhase (podstatus.phase_of);
- a container is created with the Service env (serviceenv.py); until it can be, it waits with
  the kubelet's reason and event (ContainerCreating with FailedMount,
  CreateContainerConfigError, CreateContainerError) and is tried again;
- once started: Pulled, Created and Started events; `started` after the startupProbe (at once
  without one); Ready after the readinessProbe passes (with Unhealthy events while it fails)
  or, without one, once its first container port answers (at once without ports: the
  devcluster's rule, images take that long to start anyway); a regular init container is never
  Ready while it runs; a failing liveness or startup probe kills the container (Killing
  "... will be restarted");
- an exited container is restarted as its policy says after the crash-loop back-off
  (CrashLoopBackOff, BackOff event, restartCount, lastState);
- the pod's status is written one write at a time, the latest, a failed write tried again
  (statuswriter.py); an error that ends the pod's life (a bug) is logged when it happens, and
  `describe()` says where the worker stands (tests print it when a pod does not get there);
- a deleted pod's containers get SIGTERM and the grace period (Killing "Stopping container"),
  app containers first, then the sidecars in reverse order; then the pod is removed with grace
  0, as a kubelet does once its containers stopped.

Every API call (status, events, reads) goes through `NodeApi`, the node's own credentials."""

from __future__ import annotations

import asyncio
import collections
import logging
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.client import HTTPException
from typing import Any, Protocol

from devcluster import probes
from devcluster.kubelet import ConfigError, Running, port_open
from devcluster.volumes import MountError

from . import podstatus
from .claimenv import ClaimNotReady
from .containers import ContainerRunner, all_ports
from .nodeobject import now
from .statuswriter import StatusWriter

log = logging.getLogger("devcluster.nodeagent")
TICK = 0.2  # seconds between looks at a running container
#: the kubelet's sync period of a pod (KubeletConfiguration syncFrequency, 1m by default): each
#: sync writes its configMap/secret/projected/downwardAPI volumes again from their sources
SYNC_SECONDS = 60.0
#: up to half again, at random, as the kubelet's pod workers (workerResyncIntervalJitterFactor)
SYNC_JITTER = 0.5


class NodeApi(Protocol):
    """What a pod worker asks of its node (agent.NodeRunner), synchronously."""

    def patch_status(self, pod: Mapping[str, Any], status: dict[str, Any]) -> bool: ...
    def event(self, pod: Mapping[str, Any], kind: str, reason: str, message: str,
              container: str | None = None) -> None: ...  # fmt: skip
    def remove(self, pod: Mapping[str, Any]) -> None: ...
    def lookup(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None: ...
    def service_env(self, pod: Mapping[str, Any]) -> dict[str, str]: ...
    def claim_env(self, pod: Mapping[str, Any], container: str) -> dict[str, str]: ...


def _should_restart(policy: str, code: int) -> bool:
    return policy == "Always" or (policy == "OnFailure" and code != 0)


@dataclass
class Box:
    """One container of the pod: its spec, kind (init, sidecar, app) and status entry."""

    spec: dict[str, Any]
    kind: str
    entry: dict[str, Any]
    restarts: int = 0
    last_state: dict[str, Any] | None = None
    started: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def name(self) -> str:
        return self.spec["name"]


class PodWorker:
    def __init__(
        self,
        pod: dict[str, Any],
        api: NodeApi,
        kubelet: ContainerRunner,
        backoff: tuple[float, float] = probes.DEFAULT_BACKOFF,
        sync_seconds: float = SYNC_SECONDS,
    ) -> None:
        self.pod = pod
        self.api = api
        self.kubelet = kubelet
        self.backoff = backoff
        self.sync_seconds = sync_seconds
        meta = pod["metadata"]
        self.key = (meta["namespace"], meta["name"])
        self.uid = meta["uid"]
        spec = pod["spec"]
        # not yet run: init containers and, during init, app containers wait PodInitializing
        waiting = {"waiting": {"reason": "PodInitializing"}}
        creating = (
            waiting if spec.get("initContainers") else {"waiting": {"reason": "ContainerCreating"}}
        )
        self.inits = []
        for c in spec.get("initContainers") or []:
            kind = "sidecar" if c.get("restartPolicy") == "Always" else "init"
            self.inits.append(Box(c, kind, self._blank(c, waiting)))
        self.apps = [Box(c, "app", self._blank(c, creating)) for c in spec["containers"]]
        self.initialized = not self.inits
        self.final: str | None = None  # Succeeded or Failed once the pod is done for good
        self.ip: str | None = None
        self.deleting = asyncio.Event()
        self.task: asyncio.Task | None = None
        self.life: asyncio.Task | None = None
        #: the last warnings about this pod (describe())
        self.troubles: collections.deque[str] = collections.deque(maxlen=8)
        self.writer = StatusWriter(
            self._compute_status, self._write_status, self._wrote,
            lambda err: self._warn(f"status write failed: {err!r}; trying again"),
        )  # fmt: skip

    def _blank(self, container: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
        return podstatus.container_status(container, self.uid, state)

    # --- from the node's watch (on the runtime's loop) --------------------------------------
    def update(self, pod: dict[str, Any]) -> None:
        self.pod = pod
        if pod["metadata"].get("deletionTimestamp"):
            self.deleting.set()

    async def main(self) -> None:
        if self.deleting.is_set():  # deleted before it ran (or finished before this agent)
            await self._call("remove", self.pod)
            return
        life = self.life = asyncio.create_task(self._life())
        deleting = asyncio.create_task(self.deleting.wait())
        try:
            await asyncio.wait({life, deleting}, return_when=asyncio.FIRST_COMPLETED)
            if life.done() and not life.cancelled() and life.exception() is not None:
                # a bug: said now, not once the pod is deleted (its status stays as it was)
                self._warn(f"the pod's life ended: {life.exception()!r}")
            if not self.deleting.is_set():
                await self.deleting.wait()  # finished for good: the pod stays until deleted
        finally:  # deleted, or the agent stops: the life ends (its sidecars' tasks with it)
            life.cancel()
            deleting.cancel()
            await asyncio.gather(life, deleting, return_exceptions=True)
            self.writer.close()
        await self._terminate()

    # --- helpers -----------------------------------------------------------------------------
    def _warn(self, what: str) -> None:
        log.warning("nodeagent: pod %s/%s: %s", *self.key, what)
        self.troubles.append(f"{now()} {what}")

    def describe(self) -> str:
        """Where the worker stands, for a test that waited in vain: its life, each container's
        state as the worker has it, its status writes, the last warnings."""
        life = self.life
        if life is None:
            said = "not started"
        elif not life.done():
            said = "running"
        else:
            said = "cancelled" if life.cancelled() else f"ended ({life.exception()!r})"
        lines = [f"node agent's worker for {'/'.join(self.key)}: life {said}, final "
                 f"{self.final}, initialized {self.initialized}, deleting "
                 f"{self.deleting.is_set()}, status writes failing {self.writer.failing} "
                 f"({self.writer.failures} failed, last {self.writer.last_error!r})"]  # fmt: skip
        for box in [*self.inits, *self.apps]:
            entry = box.entry
            lines.append(f"  {box.kind} {box.name}: {entry.get('state')} ready "
                         f"{entry.get('ready')} started {box.started.is_set()} restarts "
                         f"{box.restarts}")  # fmt: skip
        lines += [f"  warning: {t}" for t in self.troubles]
        return "\n".join(lines)

    async def _call(self, method: str, *args: Any) -> Any:
        return await asyncio.to_thread(getattr(self.api, method), *args)

    async def _event(self, box: Box, kind: str, reason: str, message: str) -> None:
        try:
            await self._call("event", self.pod, kind, reason, message, box.name)
        except Exception as err:  # an event is best effort, as the kubelet's recorder
            log.warning("nodeagent: event %s for %s/%s: %s", reason, *self.key, err)

    async def _set(self, box: Box, state: dict[str, Any], **more: Any) -> None:
        """The container's new status entry, and the pod's status written."""
        box.entry = podstatus.container_status(
            box.spec, self.uid, state, restarts=box.restarts, last_state=box.last_state, **more
        )
        await self._status()

    async def _status(self) -> None:
        """The pod's status written as it is now (after any write under way: statuswriter)."""
        await self.writer.sync()

    def _compute_status(self) -> dict[str, Any]:
        statuses = [b.entry for b in self.apps]
        phase = self.final or podstatus.phase_of(self.pod["spec"], self.initialized, statuses)
        return podstatus.pod_status(
            self.pod, statuses, phase, now(), self.ip,
            init_statuses=[b.entry for b in self.inits], initialized=self.initialized,
        )  # fmt: skip

    async def _write_status(self, status: dict[str, Any]) -> bool:
        return await self._call("patch_status", self.pod, status)

    def _wrote(self, status: dict[str, Any]) -> None:
        # the pod as written: later conditions keep their transition times
        self.pod = {**self.pod, "status": {**(self.pod.get("status") or {}), **status}}

    # --- the pod's life ----------------------------------------------------------------------
    async def _life(self) -> None:
        self.kubelet.fresh_volumes(self.pod)
        self.ip = self.kubelet.ips.take(all_ports(self.pod))
        await self._status()
        policy = self.pod["spec"].get("restartPolicy", "Always")
        # an init container is restarted only when it fails (kuberuntime computeInitContainer
        # Actions); with Never its failure fails the pod
        init_policy = "Never" if policy == "Never" else "OnFailure"
        sidecars: list[asyncio.Task] = []
        resync = asyncio.create_task(self._resync())
        try:
            for box in self.inits:
                if box.kind == "sidecar":
                    sidecars.append(asyncio.create_task(self._run(box, "Always")))
                    await _until_started(box, sidecars[-1])
                    continue
                code = await self._run(box, init_policy)
                if code != 0:
                    self.final = "Failed"
                    await self._status()
                    return
            self.initialized = True
            await self._status()
            codes = await asyncio.gather(*(self._run(b, policy) for b in self.apps))
            self.final = "Succeeded" if all(c == 0 for c in codes) else "Failed"
        finally:
            for task in [resync, *sidecars]:
                task.cancel()
            await asyncio.gather(resync, *sidecars, return_exceptions=True)
        await self._stop_sidecars(0.0)
        await self._status()
        await self.kubelet.release(self.ip)  # its address goes back
        self.ip = None

    async def _resync(self) -> None:
        """The kubelet's periodic sync of a pod that runs, for its volumes: every sync period
        (with its jitter) the volumes of files are written again from their sources, so a
        changed ConfigMap or Secret (a rotated certificate, a new catalog) reaches the running
        containers without a restart; one that cannot be read keeps its files, with the
        kubelet's FailedMount event."""
        while True:
            await asyncio.sleep(self.sync_seconds * (1.0 + random.random() * SYNC_JITTER))
            try:
                failed = await asyncio.to_thread(
                    self.kubelet.refresh_volumes, self.pod, self.api.lookup, self.ip
                )
            except (OSError, HTTPException) as err:  # the apiserver timed out, a reset
                self._warn(f"volumes: reading their sources: {err!r}; again at the next sync")
                continue
            for words in failed.values():
                try:
                    await self._call("event", self.pod, "Warning", "FailedMount", words)
                except Exception as err:  # best effort, as the kubelet's recorder
                    log.warning("nodeagent: event FailedMount for %s/%s: %s", *self.key, err)

    async def _create(self, box: Box) -> Running:
        """Start the container, trying again (with the back-off) while it cannot be."""
        wait: float | None = None
        while True:
            try:
                try:
                    env = await self._call("service_env", self.pod)
                    env.update(await self._call("claim_env", self.pod, box.name))
                except (OSError, HTTPException) as err:  # the apiserver timed out, a reset
                    self._warn(f"container {box.name}: reading its env: {err!r}; trying again")
                    wait = probes.next_backoff(wait, 0.0, self.backoff) or 1.0
                    await asyncio.sleep(wait)
                    continue
                return await self.kubelet.start_container(
                    self.pod, box.name, self.api.lookup, env, ip=self.ip
                )
            except MountError as err:
                reason, words, event = "ContainerCreating", "", ("FailedMount", str(err))
            except ClaimNotReady as err:  # the kubelet's PrepareDynamicResources fails
                reason, words = "ContainerCreating", str(err)
                event = ("FailedPrepareDynamicResources", str(err))
            except ConfigError as err:
                reason, words = "CreateContainerConfigError", str(err)
                event = ("Failed", f"Error: {err}")
            except RuntimeError as err:
                reason, words, event = "CreateContainerError", str(err), ("Failed", f"Error: {err}")
            waiting = {"reason": reason, **({"message": words} if words else {})}
            await self._set(box, {"waiting": waiting})
            await self._event(box, "Warning", *event)
            wait = probes.next_backoff(wait, 0.0, self.backoff) or 1.0
            await asyncio.sleep(wait)

    async def _run(self, box: Box, policy: str) -> int:
        """The container's life: started, watched, restarted as `policy` says; its last exit
        code once it is not restarted."""
        loop = asyncio.get_running_loop()
        backoff: float | None = None
        name = box.name
        while True:
            running = await self._create(box)
            began, started_at = loop.time(), now()
            image = box.spec.get("image", "")
            await self._event(box, "Normal", "Pulled",
                              f'Container image "{image}" already present on machine')  # fmt: skip
            await self._event(box, "Normal", "Created", f"Created container: {name}")
            await self._event(box, "Normal", "Started", f"Started container {name}")
            code = await self._watch(box, running, started_at)
            terminated = {
                "exitCode": code,
                "reason": "Completed" if code == 0 else "Error",
                "startedAt": started_at,
                "finishedAt": now(),
                "containerID": podstatus.container_status(box.spec, self.uid, {})["containerID"],
            }
            await self.kubelet.stop_container(self.pod, name, 0)
            box.started.clear()
            if not _should_restart(policy, code):
                # a completed init container is reported ready (kubelet_pods.go)
                await self._set(
                    box, {"terminated": terminated}, ready=box.kind == "init" and code == 0
                )
                return code
            backoff = probes.next_backoff(backoff, loop.time() - began, self.backoff)
            box.last_state = {"terminated": terminated}
            if backoff > 0:
                meta = self.pod["metadata"]
                who = f"{meta['name']}_{meta['namespace']}({self.uid})"
                words = f"back-off {backoff:g}s restarting failed container={name} pod={who}"
                waiting = {"reason": "CrashLoopBackOff", "message": words}
                await self._set(box, {"waiting": waiting})
                said = f"Back-off restarting failed container {name} in pod {who}"
                await self._event(box, "Warning", "BackOff", said)
                await asyncio.sleep(backoff)
            box.restarts += 1

    async def _watch(self, box: Box, running: Running, started_at: str) -> int:
        """Until the container exits (its code; a probe's kill counts as 137)."""
        loop = asyncio.get_running_loop()
        container = box.spec
        t0 = loop.time()
        # a regular init container has no probes and is never Ready while it runs
        regular_init = box.kind == "init"
        startup = None if regular_init else probes.Probe.of(container.get("startupProbe"))
        readiness = None if regular_init else probes.Probe.of(container.get("readinessProbe"))
        liveness = None if regular_init else probes.Probe.of(container.get("livenessProbe"))
        # unknown at first (the kubelet's Unknown): failing failureThreshold times kills it
        start_track = probes.Tracker(startup, t0, None) if startup else None
        ready_track = probes.Tracker(readiness, t0, False) if readiness else None
        live_track = probes.Tracker(liveness, t0, True) if liveness else None
        ports = [p.get("containerPort") for p in container.get("ports") or []]
        started = start_track is None
        ready = started and ready_track is None and not ports and not regular_init
        process = running.process

        async def show() -> None:
            await self._set(box, {"running": {"startedAt": started_at}}, ready=ready,
                            started=started)  # fmt: skip
            if started:
                box.started.set()

        async def attempt(probe: probes.Probe) -> tuple[bool, str]:
            return await probes.run(
                probe, running.ip, container, running.env, running.cwd, running.beside
            )

        async def kill(kind: str, message: str) -> int:
            await self._event(box, "Warning", "Unhealthy", f"{kind} probe failed: {message}")
            why = f"Container {container['name']} failed {kind.lower()} probe, will be restarted"
            await self._event(box, "Normal", "Killing", why)
            grace = float(self.pod["spec"].get("terminationGracePeriodSeconds", 30))
            await self.kubelet.stop_container(self.pod, box.name, grace)
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
                    await self._event(box, "Warning", "Unhealthy",
                                      f"Readiness probe failed: {message}")  # fmt: skip
                if flipped is not None and flipped != ready:
                    ready = flipped
                    await show()
            elif started and ready_track is None and not ready and not regular_init:
                if not ports or await asyncio.to_thread(port_open, running.ip, int(ports[0])):
                    ready = True
                    await show()
            if started and live_track is not None and live_track.due(now_):
                ok, message = await attempt(live_track.probe)
                alive = process.returncode is None
                if live_track.record(ok, loop.time()) is False and alive:
                    return await kill("Liveness", message)  # its own Unhealthy event
                if not ok and alive:
                    await self._event(box, "Warning", "Unhealthy",
                                      f"Liveness probe failed: {message}")  # fmt: skip
            try:
                await asyncio.wait_for(process.wait(), TICK)
            except asyncio.TimeoutError:
                pass
        return process.returncode

    # --- deletion ----------------------------------------------------------------------------
    async def _stop(self, boxes: list[Box], grace: float) -> None:
        async def one(box: Box) -> None:
            running = self.kubelet.running_container(self.pod, box.name)
            if running is not None and running.process.returncode is None:
                await self._event(box, "Normal", "Killing", f"Stopping container {box.name}")
            await self.kubelet.stop_container(self.pod, box.name, grace)

        await asyncio.gather(*(one(b) for b in boxes))

    async def _stop_sidecars(self, grace: float) -> None:
        """Sidecars stop after the app containers, in the reverse of their order (KEP-753)."""
        for box in reversed([b for b in self.inits if b.kind == "sidecar"]):
            await self._stop([box], grace)

    async def _terminate(self) -> None:
        meta = self.pod["metadata"]
        grace = meta.get("deletionGracePeriodSeconds")
        if grace is None:
            grace = self.pod["spec"].get("terminationGracePeriodSeconds", 30)
        await self._stop([b for b in self.inits if b.kind == "init"] + self.apps, float(grace))
        await self._stop_sidecars(float(grace))
        if self.ip is not None:
            await self.kubelet.release(self.ip)
        self.ip = None
        await self._call("remove", self.pod)


async def _until_started(box: Box, life: asyncio.Task) -> None:
    """Until the sidecar `box` is started; the error that ended its `life` first, raised
    (else the pod would wait for it for ever, Pending with nothing said)."""
    started = asyncio.create_task(box.started.wait())
    try:
        await asyncio.wait({started, life}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        started.cancel()
    if not box.started.is_set():
        life.result()  # its error (a sidecar is restarted for ever: it ends no other way)
        raise RuntimeError(f"sidecar {box.name} ended before it started")
