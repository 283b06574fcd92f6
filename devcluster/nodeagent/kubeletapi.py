"""The kubelet API of the agent's nodes: what the apiserver proxies pods/exec, attach, log and
portforward to (`kubectl exec`, `logs`, `port-forward`). It is served by the control-plane
binary's `kubelet-api` subcommand (controlplane/kubeletapi.go, built on the kubelet's own
streaming code, k8s.io/cri-streaming), one process for every node of the topology: each Node
advertises InternalIP 127.0.0.1 and its port in status.daemonEndpoints.kubeletEndpoint.Port.

- TLS as the apiserver expects of a kubelet (--kubelet-certificate-authority): a serving
  certificate for 127.0.0.1 signed by the cluster CA;
- only the apiserver gets in: a client certificate the cluster CA verifies (401 without one)
  whose CN is the apiserver's --kubelet-client-certificate's, kube-apiserver-kubelet-client
  (403 for any other, a node's or the admin's included);
- the pods: `publish` writes, whenever one of its containers starts, one JSON file per pod in
  `pods_dir`: its IP, the names of its containers, and per started container (init containers
  and sidecars included) its process, env, working directory, namespaces, log file and where in
  it this run's output and the previous run's begin, which the process reads per request. A
  file stays after its containers exit (their logs stay readable) until a pod of the same name
  starts again or the agent stops.

The process dies with the thread that started it (PR_SET_PDEATHSIG, as the launcher's
components), so a node agent killed outright leaves no kubelet-api behind."""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from devcluster.certs import issue
from devcluster.controlplane.binary import find_binary
from devcluster.controlplane.pki import KeyPair
from devcluster.controlplane.ports import PortReservation
from devcluster.controlplane.processes import Component, ComponentDied, log_tail
from devcluster.kubelet import Running

from .containers import ContainerRunner, main_name
from .credentials import load_ca

#: the apiserver's kubelet client identity (devcluster/controlplane/pki.py)
APISERVER_CLIENT = "kube-apiserver-kubelet-client"
READY_SECONDS = 30.0


def pod_file(pods_dir: Path, namespace: str, name: str) -> Path:
    """`<namespace>_<name>.json`: neither a namespace nor a pod name can hold '_'."""
    return pods_dir / f"{namespace}_{name}.json"


def _start_time(pid: int) -> str:
    """/proc/<pid>/stat's starttime (field 22): tells the container's process from a later
    process given the same pid."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return raw.rsplit(") ", 1)[1].split()[19]


def container_record(
    running: Running, log_start: int = 0, previous: int | None = None
) -> dict[str, Any]:
    """What the kubelet-api process reads about one started container of a pod
    (controlplane/kubeletpods.go). `log_start`: where this run's output begins in its log file,
    `previous`: where the previous run's of the same container began (the runner appends a
    restart's output)."""
    pid = running.process.pid
    return {
        "pid": pid,
        "start_time": _start_time(pid),
        "env": dict(running.env),
        "cwd": running.cwd,
        "log": str(running.log_path),
        "log_start": log_start,
        "previous_log_start": previous,
        "namespaces": list(running.namespaces),
    }


def pod_record(pod: Mapping[str, Any], ip: str) -> dict[str, Any]:
    """A pod's record with no container started yet; `started` is filled by container_record,
    by container name. `containers`: every container of the spec (init containers and sidecars
    included, as the apiserver's `container ... is not valid for pod` check counts them)."""
    meta = pod["metadata"]
    spec = pod["spec"]
    names = [c["name"] for c in [*(spec.get("initContainers") or []), *spec["containers"]]]
    return {
        "namespace": meta["namespace"],
        "name": meta["name"],
        "uid": meta.get("uid", ""),
        "default": spec["containers"][0]["name"],
        "containers": names,
        "ip": ip,
        "started": {},
    }


def publish(pods_dir: Path, record: Mapping[str, Any]) -> None:
    """Write a pod's record (pod_record) whole: a reader never sees half of it."""
    target = pod_file(pods_dir, record["namespace"], record["name"])
    tmp = target.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record))
    tmp.chmod(0o600)  # the containers' env may hold secrets
    tmp.replace(target)


class PublishingKubelet(ContainerRunner):
    """The runner, publishing each container of a pod to the kubelet API whenever it starts
    (init containers, sidecars, every app container; restarts included)."""

    def __init__(self, *args: Any, pods_dir: Path, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pods_dir = pods_dir
        #: (namespace, name) -> the pod's record as last published
        self._records: dict[tuple[str, str], dict[str, Any]] = {}

    async def start_container(self, pod: Mapping[str, Any], name: str, *args: Any,
                              **kwargs: Any) -> Running:  # fmt: skip
        meta = pod["metadata"]
        key = (meta["namespace"], meta["name"])
        # where the runner appends this container's output (containers.py)
        file = "container.log" if name == main_name(pod) else f"{name}.log"
        log = self.pod_dir(*key) / file
        log_start = log.stat().st_size if log.exists() else 0
        running = await super().start_container(pod, name, *args, **kwargs)
        record = self._records.get(key)
        if record is None or record["uid"] != meta.get("uid", ""):  # a new pod of that name
            record = pod_record(pod, running.ip)
        before = record["started"].get(name)
        previous = before["log_start"] if before else None  # a restart
        record = {**record, "ip": running.ip,
                  "started": {**record["started"],
                              name: container_record(running, log_start, previous)}}  # fmt: skip
        self._records[key] = record
        publish(self.pods_dir, record)
        return running


class KubeletAPI:
    """One `kube-controlplane kubelet-api` process on a port of its own."""

    def __init__(self, state_dir: Path, port: int, component: Component,
                 reservation: PortReservation, ca_cert: Path) -> None:  # fmt: skip
        self.state_dir = state_dir
        self.ca_cert = ca_cert  # what the serving certificate is signed by
        self.pods_dir = state_dir / "pods"
        self.port = port
        self.component = component
        self._reservation = reservation

    @classmethod
    def start(cls, ca: KeyPair, state_dir: Path, binary: Path | None = None) -> KubeletAPI:
        """Serve on a reserved loopback port; returns once it answers (ComponentDied with its
        log when it exits first, TimeoutError when it does not answer)."""
        state_dir = Path(state_dir).resolve()
        state_dir.mkdir(parents=True, exist_ok=True)
        pods_dir = state_dir / "pods"
        shutil.rmtree(pods_dir, ignore_errors=True)  # a former run's pods are not this one's
        pods_dir.mkdir(mode=0o700)
        serving = issue(load_ca(ca), ["127.0.0.1", "localhost"], state_dir, name="kubelet")
        reservation = PortReservation(1)
        port = reservation.ports[0]
        argv = [
            str(binary or find_binary()), "kubelet-api",
            f"--port={port}",
            f"--tls-cert-file={serving.cert_file}",
            f"--tls-private-key-file={serving.key_file}",
            f"--client-ca-file={ca.cert}",
            f"--allowed-names={APISERVER_CLIENT}",
            f"--pods-dir={pods_dir}",
        ]  # fmt: skip
        component = Component("kubelet-api", argv, state_dir / "kubelet-api.log")
        api = cls(state_dir, port, component, reservation, Path(ca.cert))
        try:
            component.start()
            api._wait_ready()
        except BaseException:
            api.stop()
            raise
        return api

    def _wait_ready(self) -> None:
        """Serving once a TLS request without a client certificate is answered 401."""
        tls = ssl.create_default_context(cafile=str(self.ca_cert))
        deadline = time.monotonic() + READY_SECONDS
        while True:
            self.component.check()
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=2) as raw:
                    with tls.wrap_socket(raw, server_hostname="127.0.0.1") as conn:
                        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                        if conn.recv(64).startswith(b"HTTP/1.1 401"):
                            return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"kubelet-api did not answer on 127.0.0.1:{self.port} within "
                    f"{READY_SECONDS:g}s; last lines of {self.component.log}:\n"
                    f"{log_tail(self.component.log)}"
                )
            time.sleep(0.2)

    def check(self) -> None:
        """ComponentDied if the process exited."""
        self.component.check()

    def stop(self) -> None:
        self.component.stop(grace=5.0)
        self._reservation.release()
        shutil.rmtree(self.pods_dir, ignore_errors=True)


__all__ = [
    "APISERVER_CLIENT",
    "ComponentDied",
    "KubeletAPI",
    "PublishingKubelet",
    "container_record",
    "pod_record",
    "publish",
]
