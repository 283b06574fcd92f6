"""Start one real control plane: certificates, ports, etcd, kube-apiserver, kube-scheduler,
kube-controller-manager, then the objects a real GPU cluster has from the start (NVIDIA's
DeviceClasses, the Kubeflow CRDs). Each step waits until its component answers and reports a
component that dies with its log's last lines; a failed start stops what it started."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from . import flags
from .admission import admission_configuration, webhook_kubeconfig
from .binary import find_binary
from .kubeconfigs import write_kubeconfig
from .pki import ClusterPKI, KeyPair, make_pki
from .ports import PortReservation
from .processes import Component, ComponentDied, log_tail
from .rest import Client, ok

MANIFESTS = Path(__file__).parent / "manifests"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
SERVICE_ACCOUNTS = "/api/v1/namespaces/default/serviceaccounts"
STATE_MARKER = ".controlplane-state"


class ControlPlaneError(RuntimeError):
    """The control plane did not come up; the message says which component and why."""


# libyaml's safe loader where PyYAML was built with it (its wheels are): the vendored CRDs are
# 1.1 MB of YAML, read at every cluster's start: 3.3 s in pure Python on a busy 2-core
# machine, 0.5 s with libyaml, the same objects (tests/test_controlplane_manifests.py)
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _manifests() -> list[dict[str, Any]]:
    """DeviceClasses first, then each vendored CRD file (manifests/crds/*.yaml)."""
    files = [MANIFESTS / "deviceclasses.yaml", *sorted((MANIFESTS / "crds").glob("*.yaml"))]
    return [doc for f in files for doc in yaml.load_all(f.read_text(), SAFE_LOADER) if doc]


class ControlPlane:
    """One running cluster. `ControlPlane.start(dir)` returns when all of it is ready; `stop()`
    (or leaving the `with` block) ends every process and frees its ports."""

    def __init__(self, state_dir: Path, binary: Path, progress: Callable[[str], None]) -> None:
        self.state_dir = state_dir
        self.binary = binary
        self._progress = progress
        self._reservation = PortReservation(5)
        self.ports = flags.Ports(*self._reservation.ports)
        self.components: list[Component] = []
        self.scheduler_profiles: tuple[Mapping[str, Any], ...] = ()
        self.scheduler_extenders: tuple[Mapping[str, Any], ...] = ()
        self.webhook_clients: dict[str, tuple[Path, Path]] = {}
        self.pki: ClusterPKI
        self.kubeconfig: Path
        self.client: Client

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    @classmethod
    def start(
        cls,
        state_dir: Path,
        *,
        timeout: float = 300.0,
        progress: Callable[[str], None] = lambda _msg: None,
        scheduler_profiles: Sequence[Mapping[str, Any]] = (),
        scheduler_extenders: Sequence[Mapping[str, Any]] = (),
        webhook_clients: Mapping[str, tuple[Path, Path]] | None = None,
    ) -> ControlPlane:
        """`scheduler_profiles`: more kube-scheduler profiles (KubeSchedulerProfile objects)
        besides default-scheduler; `scheduler_extenders`: KubeSchedulerConfiguration extenders;
        `webhook_clients`: the client certificates kube-apiserver presents to admission
        webhooks, webhook target (`host:port`, `*.svc`, `*`: admission.py) -> (certificate,
        key) files, given it in an AdmissionConfiguration; none by default."""
        binary = find_binary()
        cp = cls(Path(state_dir).resolve(), binary, progress)
        cp.scheduler_profiles = tuple(scheduler_profiles)
        cp.scheduler_extenders = tuple(scheduler_extenders)
        clients = webhook_clients or {}
        cp.webhook_clients = {t: (Path(c), Path(k)) for t, (c, k) in clients.items()}
        try:
            cp._start(timeout)
        except BaseException:
            cp.stop()
            raise
        return cp

    # --- start-up ---------------------------------------------------------------------------
    def _start(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        self._fresh_state_dir()
        self.pki = pki = make_pki(self.state_dir / "pki")
        self.kubeconfig = self._kubeconfig("admin", pki.admin)
        self.client = Client(self.server, str(pki.ca.cert), pki.admin)
        etcd_url = f"http://127.0.0.1:{self.ports.etcd_client}/health"

        self._run("etcd", flags.etcd(self.state_dir / "etcd", self.ports))
        self._wait("etcd", lambda: ok(etcd_url), deadline)
        self._run("kube-apiserver", flags.kube_apiserver(pki, self.ports, self._admission()))
        self._wait("kube-apiserver", self._apiserver_ready, deadline)
        scheduler = self._kubeconfig("scheduler", pki.scheduler)
        config = None
        if self.scheduler_profiles or self.scheduler_extenders:
            config = self.state_dir / "scheduler-config.yaml"
            config.write_text(
                yaml.safe_dump(
                    flags.scheduler_config(
                        scheduler, self.scheduler_profiles, self.scheduler_extenders
                    )
                )
            )
        self._run(
            "kube-scheduler",
            flags.kube_scheduler(scheduler, self.state_dir / "scheduler", self.ports, config),
        )
        kcm = self._kubeconfig("controller-manager", pki.controller_manager)
        kcm_dir = self.state_dir / "controller-manager"
        self._run(
            "kube-controller-manager", flags.kube_controller_manager(kcm, kcm_dir, pki, self.ports)
        )
        # the objects need the apiserver only: made, and their CRDs established, while the
        # scheduler and the controller-manager start (a few seconds less per cluster)
        self._install(deadline)
        for name, port in (
            ("kube-scheduler", self.ports.scheduler),
            ("kube-controller-manager", self.ports.controller_manager),
        ):
            self._wait(name, lambda p=port: ok(f"https://127.0.0.1:{p}/healthz"), deadline)
        # a pod in `default` is refused until the controller-manager has made the namespace's
        # ServiceAccount (the ServiceAccount admission plugin: 'serviceaccount "default" not
        # found'): since the CRDs are installed while the controllers start (ba22a3e), a test
        # could create its first pod before that; the cluster is ready once a pod can be made
        self._wait("the default ServiceAccount", self._default_service_account, deadline)
        self._progress(f"control plane ready at {self.server} (kubeconfig {self.kubeconfig})")

    def _admission(self) -> Path | None:
        """The AdmissionConfiguration file for `webhook_clients`, and the kubeconfig it names."""
        if not self.webhook_clients:
            return None
        kubeconfig = self.state_dir / "webhook-clients.kubeconfig"
        try:
            kubeconfig.write_text(yaml.safe_dump(webhook_kubeconfig(self.webhook_clients)))
        except ValueError as err:
            raise ControlPlaneError(str(err)) from None
        config = self.state_dir / "admission-config.yaml"
        config.write_text(yaml.safe_dump(admission_configuration(kubeconfig)))
        return config

    def _default_service_account(self) -> bool:
        return self.client.get_json(f"{SERVICE_ACCOUNTS}/default") is not None

    def _fresh_state_dir(self) -> None:
        """A fresh cluster every start: the directory is emptied, but only when it is empty or
        one of ours (a marker file), never a directory someone named by mistake."""
        marker = self.state_dir / STATE_MARKER
        if self.state_dir.exists() and any(self.state_dir.iterdir()) and not marker.exists():
            raise ControlPlaneError(
                f"{self.state_dir} is not empty and not a control-plane state directory "
                f"(no {STATE_MARKER}): refusing to empty it; name a new directory"
            )
        shutil.rmtree(self.state_dir, ignore_errors=True)
        self.state_dir.mkdir(parents=True)
        marker.write_text("devcluster.controlplane state; emptied at every start\n")

    def _kubeconfig(self, name: str, identity: KeyPair) -> Path:
        return write_kubeconfig(
            self.state_dir / f"{name}.kubeconfig", self.server, self.pki.ca.cert, identity, name
        )

    def _run(self, name: str, argv: list[str]) -> None:
        self._progress(f"starting {name}")
        component = Component(name, [str(self.binary), *argv], self.state_dir / f"{name}.log")
        self.components.append(component)
        component.start()

    def _wait(self, what: str, ready: Callable[[], bool], deadline: float) -> None:
        while not ready():
            try:
                self.check()
            except ComponentDied as err:
                raise ControlPlaneError(str(err)) from None
            if time.monotonic() > deadline:
                logs = "\n".join(
                    f"--- {c.name} ({c.log}):\n{log_tail(c.log, 10)}" for c in self.components
                )
                raise ControlPlaneError(f"{what} not ready in time; the components' logs:\n{logs}")
            time.sleep(0.25)

    def _apiserver_ready(self) -> bool:
        try:
            return self.client.request("GET", "/readyz", timeout=5)[0] == 200
        except OSError:
            return False

    def _install(self, deadline: float) -> None:
        docs = _manifests()
        self._progress(f"installing {len(docs)} objects (NVIDIA DeviceClasses, Kubeflow CRDs)")
        for doc in docs:
            self.client.create(doc)
        for doc in docs:
            if doc["kind"] == "CustomResourceDefinition":
                name = doc["metadata"]["name"]
                path = f"{CRDS}/{name}"
                self._wait(name, lambda p=path: self._established(p), deadline)

    def _established(self, path: str) -> bool:
        crd = self.client.get_json(path) or {}
        conditions = (crd.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    # --- running and stopping ---------------------------------------------------------------
    def check(self) -> None:
        """ComponentDied when a component has exited, with its log's last lines."""
        for component in self.components:
            component.check()

    def stop(self) -> None:
        """Stop the components in reverse order of start (etcd last) and free the ports."""
        for component in reversed(self.components):
            component.stop()
        self._reservation.release()

    def __enter__(self) -> ControlPlane:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
