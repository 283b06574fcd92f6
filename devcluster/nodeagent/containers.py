"""Every container of a pod as a process of its own, on the runner (devcluster.kubelet.Kubelet)
that starts one container per pod: each container is handed to it as a pod of that one
container, in the same sandbox (the pod's IP, network namespace, hostname and volumes).

- The pod's first app container is the runner's own (`Kubelet.running[(ns, name)]`, its log
  `container.log`, the pod's HOME).
- Every other container (init containers, sidecars, the other app containers) is kept here,
  by (namespace, pod, container), with a log (`<container>.log`) and a HOME of its own, so
  stopping one never touches its siblings' processes.
- The kubelet API reaches each of them (kubeletapi.PublishingKubelet publishes every start).
- emptyDir volumes are made once per pod (`fresh_volumes`) and handed to each container as the
  same directory, so what an init container writes there the app containers read, and a
  restarted container finds what it left (kubernetes.io "Volumes": an emptyDir lives as long as
  the pod; a container crashing does not remove it)."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from devcluster import volumes
from devcluster.kubelet import (
    Kubelet,
    Running,
    _field_ref,
    _kill_escaped,
    _signal_group,
    container_command,
    terminate,
)

#: run in front of a container that is not the runner's own: its output to a log of its own
_TO_LOG = 'exec >>"$DEVCLUSTER_CONTAINER_LOG" 2>&1; unset DEVCLUSTER_CONTAINER_LOG; exec "$@"'


def main_name(pod: Mapping[str, Any]) -> str:
    return pod["spec"]["containers"][0]["name"]


def find(pod: Mapping[str, Any], name: str) -> dict[str, Any]:
    spec = pod["spec"]
    for container in [*(spec.get("initContainers") or []), *spec["containers"]]:
        if container["name"] == name:
            return container
    raise KeyError(name)


def all_ports(pod: Mapping[str, Any]) -> list[int]:
    spec = pod["spec"]
    return [
        int(p["containerPort"])
        for c in [*(spec.get("initContainers") or []), *spec["containers"]]
        for p in c.get("ports") or []
    ]


class ContainerRunner(Kubelet):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: (namespace, pod, container) -> the running container, for all but the first app one
        self.others: dict[tuple[str, str, str], Running] = {}
        self._starting = asyncio.Lock()

    def fresh_volumes(self, pod: Mapping[str, Any]) -> None:
        """The pod's emptyDirs, empty (a former pod of the same name's are gone)."""
        meta = pod["metadata"]
        for volume in pod["spec"].get("volumes") or []:
            if _is_empty_dir(volume):
                target = self.pod_dir(meta["namespace"], meta["name"]) / "volumes" / volume["name"]
                if target.exists():
                    shutil.rmtree(target)
                target.mkdir(parents=True)

    def refresh_volumes(
        self, pod: Mapping[str, Any], lookup: Any, ip: str | None
    ) -> dict[str, str]:
        """The pod's volumes of files written again from their sources (volumes.refresh: the
        kubelet's periodic sync); volume -> why one could not be."""
        meta = pod["metadata"]
        return volumes.refresh(
            pod,
            self.pod_dir(meta["namespace"], meta["name"]),
            lookup,
            lambda p, path: _field_ref(p, path, ip or ""),
        )

    def _view(self, pod: Mapping[str, Any], container: dict[str, Any]) -> dict[str, Any]:
        """The pod as the runner sees it for one container: that container first (the one it
        starts), no init containers, its emptyDirs as the pod's directories (the runner would
        empty an emptyDir at each start)."""
        meta = pod["metadata"]
        volumes = []
        for volume in pod["spec"].get("volumes") or []:
            if _is_empty_dir(volume):
                path = self.pod_dir(meta["namespace"], meta["name"]) / "volumes" / volume["name"]
                volume = {"name": volume["name"], "hostPath": {"path": str(path)}}
            volumes.append(volume)
        # the runner starts the first; the app containers are listed for the kubelet API
        apps = [c for c in pod["spec"]["containers"] if c["name"] != container["name"]]
        spec = {**pod["spec"], "containers": [container, *apps], "volumes": volumes}
        spec.pop("initContainers", None)
        return {**pod, "spec": spec}

    async def start_container(
        self,
        pod: Mapping[str, Any],
        name: str,
        lookup: Any = None,
        env: Mapping[str, str] | None = None,
        ip: str | None = None,
    ) -> Running:
        """Start one container of the pod (ConfigError, MountError, RuntimeError as
        Kubelet.start)."""
        # one start at a time (the kubelet's SyncPod starts containers one by one too): the
        # runner records the container it starts under the pod's key, taken back below
        async with self._starting:
            try:
                return await self._start(pod, name, lookup, env, ip)
            except BaseException:
                if ip is not None:  # the runner gives a failed start's address back: it stays
                    self.ips.used.add(ip)  # the pod's while it waits (its siblings may run)
                raise

    async def _start(
        self, pod: Mapping[str, Any], name: str, lookup: Any, env: Any, ip: str | None
    ) -> Running:
        meta = pod["metadata"]
        key = (meta["namespace"], meta["name"])
        container = find(pod, name)
        if name == main_name(pod):
            return await self.start(self._view(pod, container), lookup, env, ip=ip)
        log = self.pod_dir(*key) / f"{name}.log"
        home = self.pod_dir(*key) / f"home-{name}"
        home.mkdir(parents=True, exist_ok=True)
        command = container_command(container, self.images)
        _check_executable(command, container)
        wrapped = {**container, "command": ["sh", "-c", _TO_LOG, "sh", *command], "args": []}
        own = {**(env or {}), "HOME": str(home), "DEVCLUSTER_CONTAINER_LOG": str(log)}
        main = self.running.pop(key, None)  # the runner keeps one container per pod
        try:
            # the runner's own start: it records the container under the pod's key
            running = await Kubelet.start(self, self._view(pod, wrapped), lookup, own, ip=ip)
            self.running.pop(key, None)
        finally:
            if main is not None:
                self.running[key] = main
        running.log_path = log
        self.others[(*key, name)] = running
        return running

    def running_container(self, pod: Mapping[str, Any], name: str) -> Running | None:
        meta = pod["metadata"]
        if name == main_name(pod):
            return self.running.get((meta["namespace"], meta["name"]))
        return self.others.get((meta["namespace"], meta["name"], name))

    async def stop_container(self, pod: Mapping[str, Any], name: str, grace: float) -> None:
        """SIGTERM, `grace` seconds, then SIGKILL for the container's processes (and what it
        started outside its process group); the pod's IP stays."""
        meta = pod["metadata"]
        if name == main_name(pod):
            await self.stop(meta["namespace"], meta["name"], grace, release_ip=False)
            return
        running = self.others.pop((meta["namespace"], meta["name"], name), None)
        if running is None:
            return
        await terminate(
            running.process, grace, self.pod_dir(meta["namespace"], meta["name"]) / f"home-{name}"
        )

    def kill_all(self) -> None:
        for (namespace, name, container), running in list(self.others.items()):
            _signal_group(running.process.pid, signal.SIGKILL)
            _kill_escaped(self.pod_dir(namespace, name) / f"home-{container}")
        self.others.clear()
        super().kill_all()


def _is_empty_dir(volume: Mapping[str, Any]) -> bool:
    kinds = {"configMap", "secret", "projected", "downwardAPI", "persistentVolumeClaim",
             "hostPath"}  # fmt: skip
    return not kinds & set(volume)


def _check_executable(command: list[str], container: Mapping[str, Any]) -> None:
    """A missing program is the container runtime's "executable file not found" (the runner
    checks its own container; a wrapped one would only exit 127)."""
    exe = command[0] if command else ""
    if "/" in exe:
        return  # relative to the working directory: left to the exec
    path = next((e.get("value") for e in container.get("env") or []
                 if e.get("name") == "PATH" and "value" in e), None)  # fmt: skip
    path = path or os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    if not exe or not shutil.which(exe, path=path):
        raise RuntimeError(f'exec: "{exe}": executable file not found in $PATH')
