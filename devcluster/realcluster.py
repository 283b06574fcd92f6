"""`fracspawner devcluster`: a topology on the real control plane, in the foreground. One
process starts kube-apiserver, etcd, kube-scheduler (with HAMi's hami-scheduler profile and
extender) and kube-controller-manager (devcluster/controlplane), the topology's namespaces and
background pods, the node agent in run mode (pods run as local processes; the topology's
`network: namespaces` puts each in a network namespace of its own, with Services proxied and
named, its resolv.conf at `<state>/nodeagent/pods/network/`) and a plain-HTTP door to the
apiserver with the admin's identity (as `kubectl proxy`), then prints its READY line:

    devcluster ready: <proxy url> kubeconfig=<admin kubeconfig> server=<apiserver url>

SIGTERM or Ctrl-C stops everything it started, pods included; a control-plane component or the
node agent's kubelet-api process that dies, or a node agent's thread that ends, ends it with that
part's log (or error) and stops the rest.
"""

from __future__ import annotations

import shutil
import signal
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .controlplane.apiproxy import ApiProxy
from .controlplane.binary import BinaryMissing
from .controlplane.hamiextender import HamiExtender, extender_config, scheduler_profile
from .controlplane.launcher import ControlPlane, ControlPlaneError
from .controlplane.processes import ComponentDied
from .nodeagent.agent import NodeAgent
from .nodeagent.client import ApiError, Client
from .topology import load_topology

#: how long the controller-manager may take to make a namespace's default ServiceAccount
SA_WAIT_SECONDS = 60.0
#: a background pod runs this where its topology entry names no command (a job holding a GPU)
BACKGROUND_COMMAND = ["sleep", "infinity"]


def namespace_object(entry: str | Mapping[str, Any]) -> dict[str, Any]:
    """A topology's namespace: a name, or `{name, labels, annotations}`."""
    if isinstance(entry, str):
        entry = {"name": entry}
    meta: dict[str, Any] = {"name": str(entry["name"])}
    for part in ("labels", "annotations"):
        if entry.get(part):
            meta[part] = {str(k): str(v) for k, v in entry[part].items()}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}


def background_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
    """A topology pod (devcluster/topology.py's object), created bound to its node: its status
    comes from the node agent, its container sleeps unless it names a command."""
    meta = {k: v for k, v in pod["metadata"].items() if k in ("name", "labels", "annotations")}
    spec = dict(pod["spec"])
    spec["containers"] = [
        {"command": BACKGROUND_COMMAND, **c} if not c.get("command") else c
        for c in spec["containers"]
    ]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def _populate(client: Client, topology: Mapping[str, Any], say: Callable[[str], None]) -> None:
    """The topology's namespaces (each with its default ServiceAccount, which the
    controller-manager makes and the ServiceAccount admission plugin needs) and pods."""
    names = ["default"]
    for entry in topology.get("namespaces") or []:
        body = namespace_object(entry)
        try:
            client.create("/api/v1/namespaces", body)
        except ApiError as err:
            if err.status != 409:
                raise
        names.append(body["metadata"]["name"])
    deadline = time.monotonic() + SA_WAIT_SECONDS
    for ns in names:
        while True:
            try:
                client.get(f"/api/v1/namespaces/{ns}/serviceaccounts/default")
                break
            except ApiError as err:
                if err.status != 404 or time.monotonic() > deadline:
                    raise
                time.sleep(0.25)
    for pod in topology.get("pods") or []:
        ns = pod["metadata"].get("namespace") or "default"
        client.create(f"/api/v1/namespaces/{ns}/pods", background_pod(pod))
    say(f"{len(names)} namespaces ready, {len(topology.get('pods') or [])} background pods")


class RealCluster:
    """Everything one `fracspawner devcluster` runs; `stop()` ends it all."""

    def __init__(self) -> None:
        self.extender: HamiExtender | None = None
        self.cp: ControlPlane | None = None
        self.agent: NodeAgent | None = None
        self.proxy: ApiProxy | None = None

    def start(
        self,
        topology_file: Path,
        state_dir: Path,
        kubeconfig: Path,
        say: Callable[[str], None],
    ) -> None:
        topology = load_topology(topology_file)
        state_dir = Path(state_dir).resolve()
        state_dir.mkdir(parents=True, exist_ok=True)
        self.extender = HamiExtender()
        self.cp = ControlPlane.start(
            state_dir / "controlplane",
            progress=say,
            scheduler_profiles=[scheduler_profile()],
            scheduler_extenders=[extender_config(self.extender.url)],
        )
        self.extender.connect(self.cp.kubeconfig)
        _populate(Client(self.cp.kubeconfig), topology, say)
        self.agent = NodeAgent.start(
            topology,
            self.cp.server,
            self.cp.pki.ca,
            state_dir / "nodeagent",
            mode="run",
            images=topology.get("images") or {},
            say=say,
            network=str(topology.get("network") or "host"),
        )
        self.proxy = ApiProxy(self.cp.server, str(self.cp.pki.ca.cert), self.cp.pki.admin)
        kubeconfig.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.cp.kubeconfig, kubeconfig)

    def check(self) -> None:
        """ComponentDied when a control-plane component, the kubelet API or a node agent's
        thread ended: the cluster is then stopped with what ended said."""
        for part in (self.cp, self.agent):
            if part is not None:
                part.check()

    def stop(self) -> None:
        for part in (self.agent, self.proxy, self.extender, self.cp):
            if part is not None:
                part.stop()


def run(topology: Path, state_dir: Path, kubeconfig: Path) -> int:
    def say(msg: str) -> None:
        print(f"devcluster: {msg}", file=sys.stderr, flush=True)

    def stop_on(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, stop_on)
    cluster = RealCluster()
    try:
        cluster.start(topology, state_dir, kubeconfig, say)
        assert cluster.cp is not None and cluster.proxy is not None
        print(
            f"devcluster ready: {cluster.proxy.url} kubeconfig={kubeconfig} "
            f"server={cluster.cp.server}",
            flush=True,
        )
        while True:
            cluster.check()
            time.sleep(1)
    except KeyboardInterrupt:
        say("stopping")
        return 0
    except (BinaryMissing, ControlPlaneError, ComponentDied, ApiError, OSError, ValueError) as err:
        say(str(err))
        return 1
    finally:
        cluster.stop()
