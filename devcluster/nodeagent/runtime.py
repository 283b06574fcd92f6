"""The node agent's "run" mode: every container of a bound pod runs as a local process
(containers.py), by the devcluster's runner (devcluster.kubelet.Kubelet: the command from the pod's
command/args, env as the kubelet builds it from env/envFrom/fieldRef/secrets/config maps, the
pod's volumes, its own mount and UTS namespaces where root, a loopback pod IP), and lives as
podworker.PodWorker says (probes, restarts, status, events, deletion). Kubelet is asyncio code;
here it and the pod workers run on an event loop of its own thread, and the node threads hand
each pod to it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from devcluster import probes
from devcluster.network import make_network

from .containers import ContainerRunner
from .kubeletapi import PublishingKubelet
from .podworker import SYNC_SECONDS, NodeApi, PodWorker


class ProcessRuntime:
    def __init__(
        self,
        state_dir: Path,
        images: Mapping[str, list[str]] | None = None,
        backoff: tuple[float, float] = probes.DEFAULT_BACKOFF,
        pods_dir: Path | None = None,
        network: str = "host",
        sync_seconds: float = SYNC_SECONDS,
    ) -> None:
        """`pods_dir`: where each started container is published to the kubelet API
        (kubeletapi.py); None: nowhere. `network`: "host" (each pod on a loopback address of
        the host's network) or "namespaces" (each pod in a network namespace of its own on a
        bridge, with Services proxied and named by a cluster DNS: services.py), where root."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="nodeagent-runtime", daemon=True
        )
        self._thread.start()
        #: what the network proxies Services to besides the pods (the apiserver's endpoint)
        self.endpoints: list[dict[str, Any]] = []
        net = make_network(network, Path(state_dir), self.pods)
        if pods_dir is None:
            self.kubelet = ContainerRunner(Path(state_dir), images, net, bind_mounts=True)
        else:
            self.kubelet = PublishingKubelet(
                Path(state_dir), images, net, bind_mounts=True, pods_dir=pods_dir
            )
        self.kubelet: ContainerRunner
        if net.mode == "namespaces":  # the host's network keeps the host's resolver
            asyncio.run_coroutine_threadsafe(net.start(), self._loop).result(60)
        self.backoff = backoff
        self.sync_seconds = sync_seconds
        self.workers: dict[str, PodWorker] = {}  # pod uid -> its worker (on the loop)
        self._ended: set[str] = set()  # uids whose worker removed the pod

    def alive(self) -> bool:
        """Whether the pods' event loop still runs (close() ends it)."""
        return self._thread.is_alive()

    def sync(self, pod: dict[str, Any], api: NodeApi) -> None:
        """A bound pod as the node's watch sees it: a new one gets a worker, a known one its
        latest version (a deletionTimestamp ends it)."""
        self._loop.call_soon_threadsafe(self._sync, pod, api)

    def _sync(self, pod: dict[str, Any], api: NodeApi) -> None:
        uid = pod["metadata"]["uid"]
        worker = self.workers.get(uid)
        if worker is None:
            if uid in self._ended:
                return
            final = (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
            if final and not pod["metadata"].get("deletionTimestamp"):
                return  # finished before this agent started: nothing to run
            worker = self.workers[uid] = PodWorker(
                pod, api, self.kubelet, self.backoff, self.sync_seconds
            )
            worker.task = self._loop.create_task(worker.main())
            worker.task.add_done_callback(lambda _t: self._end(uid))
        worker.update(pod)

    def _end(self, uid: str) -> None:
        self.workers.pop(uid, None)
        self._ended.add(uid)

    def describe(self, namespace: str, name: str) -> str:
        """Where the pod's worker stands (PodWorker.describe), asked on the pods' loop."""

        async def look() -> str:
            found = [w.describe() for w in self.workers.values() if w.key == (namespace, name)]
            return "\n".join(found) or f"no pod worker for {namespace}/{name} (not seen, or ended)"

        try:
            return asyncio.run_coroutine_threadsafe(look(), self._loop).result(10)
        except Exception as err:  # the loop is stuck or gone: that is the answer
            return f"the pods' event loop did not answer: {err!r}"

    def pods(self, namespace: str) -> list[dict[str, Any]]:
        """The namespace's pods as this agent last wrote them (the network's endpoints)."""
        found = [w.pod for w in list(self.workers.values()) if w.key[0] == namespace]
        return found + [e for e in self.endpoints if e["metadata"]["namespace"] == namespace]

    def service(self, kind: str, service: dict[str, Any]) -> None:
        """A Service changed (ADDED, MODIFIED, DELETED): its proxy and DNS name follow."""
        network = self.kubelet.network
        self._loop.call_soon_threadsafe(
            lambda: self._loop.create_task(network.on_service(kind, service))
        )

    def forget(self, uid: str) -> None:
        """The pod is gone from the API (deleted with grace 0 by someone): stop what runs."""
        self._loop.call_soon_threadsafe(self._forget, uid)

    def _forget(self, uid: str) -> None:
        worker = self.workers.get(uid)
        if worker is not None and not worker.deleting.is_set():
            worker.pod = {**worker.pod, "metadata": {**worker.pod["metadata"],
                                                     "deletionGracePeriodSeconds": 0}}  # fmt: skip
            worker.deleting.set()

    def close(self) -> None:
        """Kill every pod's processes and end the loop."""

        async def end() -> None:
            tasks = [w.task for w in self.workers.values() if w.task is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.kubelet.kill_all()
            await self.kubelet.network.stop()  # its bridge and namespaces go

        try:
            asyncio.run_coroutine_threadsafe(end(), self._loop).result(30)
        except Exception:  # the loop is stopped below whatever happened
            self._loop.call_soon_threadsafe(self.kubelet.kill_all)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
