"""Each component's command line (pure: paths and ports in, argv out).

What a default cluster runs (kubeadm's static pod manifests, kubernetes.io "Admission control":
the recommended plugins), on loopback, plus the DRA features NVIDIA's DRA driver uses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .pki import SERVICE_CIDR, ClusterPKI

#: DRA features NVIDIA's DRA driver relies on (shared/reference/real-kubernetes.md). All beta and
#: on by default in 1.36; named so a pin where one is off or gone fails loudly at start-up:
#: - DRAPartitionableDevices (KEP-4815): counters in ResourceSlices, dynamic MIG's layout;
#: - DRAConsumableCapacity (KEP-5075): shares of one device (allowMultipleAllocations);
#: - DRAExtendedResource: gpu.nvidia.com's `extendedResourceName: nvidia.com/gpu`, so a pod asking
#:   for nvidia.com/gpu can be served by DRA where no device plugin advertises it;
#: - DRADeviceTaints: the driver taints unhealthy devices.
FEATURE_GATES = {
    "DRAPartitionableDevices": True,
    "DRAConsumableCapacity": True,
    "DRAExtendedResource": True,
    "DRADeviceTaints": True,
}
#: resource.k8s.io/v1 is GA (on by default since 1.34); asked for explicitly all the same
RUNTIME_CONFIG = "resource.k8s.io/v1=true"
#: on top of the plugins on by default: NodeRestriction is off by default but every real cluster
#: (kubeadm, k3s, kind) turns it on; the rest are on by default and listed so the intent is visible
ADMISSION_PLUGINS = (
    "NamespaceLifecycle",
    "LimitRanger",
    "ServiceAccount",
    "DefaultTolerationSeconds",
    "Priority",
    "PodSecurity",
    "NodeRestriction",
    "RuntimeClass",
    "MutatingAdmissionWebhook",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionWebhook",
    "ResourceQuota",
)
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"


@dataclass(frozen=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    scheduler: int
    controller_manager: int


def feature_gates() -> str:
    return ",".join(f"{name}={str(on).lower()}" for name, on in sorted(FEATURE_GATES.items()))


def etcd(data_dir: Path, ports: Ports) -> list[str]:
    return [
        "etcd",
        f"--data-dir={data_dir}",
        f"--client-port={ports.etcd_client}",
        f"--peer-port={ports.etcd_peer}",
        "--unsafe-no-fsync",  # a throw-away cluster: fsync only slows a shared disk down
    ]


def kube_apiserver(
    pki: ClusterPKI, ports: Ports, admission_config: Path | None = None
) -> list[str]:
    """`admission_config`: an AdmissionConfiguration file (admission.py), for the client
    certificates kube-apiserver presents to webhooks; none by default."""
    argv = [
        "kube-apiserver",
        f"--etcd-servers=http://127.0.0.1:{ports.etcd_client}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={ports.apiserver}",
        f"--tls-cert-file={pki.apiserver.cert}",
        f"--tls-private-key-file={pki.apiserver.key}",
        f"--client-ca-file={pki.ca.cert}",
        "--authorization-mode=Node,RBAC",
        "--anonymous-auth=false",
        f"--enable-admission-plugins={','.join(ADMISSION_PLUGINS)}",
        "--allow-privileged=true",  # refusing privileged pods is Pod Security's job, per namespace
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
        f"--service-account-key-file={pki.service_account_pub}",
        f"--service-account-signing-key-file={pki.service_account_key}",
        f"--kubelet-client-certificate={pki.apiserver_kubelet_client.cert}",
        f"--kubelet-client-key={pki.apiserver_kubelet_client.key}",
        f"--kubelet-certificate-authority={pki.ca.cert}",
        # as kubeadm sets it: a node's Hostname (its name here) resolves nowhere; the node
        # agent's kubelet API is at its InternalIP (devcluster/nodeagent/kubeletapi.py)
        "--kubelet-preferred-address-types=InternalIP,ExternalIP,Hostname",
        f"--proxy-client-cert-file={pki.front_proxy_client.cert}",
        f"--proxy-client-key-file={pki.front_proxy_client.key}",
        f"--requestheader-client-ca-file={pki.front_proxy_ca.cert}",
        "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-username-headers=X-Remote-User",
        f"--runtime-config={RUNTIME_CONFIG}",
        f"--feature-gates={feature_gates()}",
        "--profiling=false",
    ]
    return (
        [*argv, f"--admission-control-config-file={admission_config}"] if admission_config else argv
    )


def _component_common(kubeconfig: Path, cert_dir: Path, port: int) -> list[str]:
    return [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={cert_dir}",
        "--leader-elect=false",  # one instance per cluster: no lease to wait for
        f"--feature-gates={feature_gates()}",
        "--profiling=false",
    ]


def kube_scheduler(
    kubeconfig: Path, cert_dir: Path, ports: Ports, config: Path | None = None
) -> list[str]:
    """`config`: a KubeSchedulerConfiguration file (scheduler_config), for extra profiles and
    extenders; the flags above still set the connection and leader election."""
    argv = ["kube-scheduler", *_component_common(kubeconfig, cert_dir, ports.scheduler)]
    return [*argv, f"--config={config}"] if config else argv


def scheduler_config(
    kubeconfig: Path,
    profiles: Sequence[Mapping[str, Any]],
    extenders: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    """A KubeSchedulerConfiguration (kubescheduler.config.k8s.io/v1) with the default profile,
    the given profiles (a second scheduler, e.g. HAMi's hami-scheduler, as its chart runs
    kube-scheduler under that name) and extenders."""
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": "default-scheduler"}, *(dict(p) for p in profiles)],
        "extenders": [dict(e) for e in extenders],
    }


def kube_controller_manager(
    kubeconfig: Path, cert_dir: Path, pki: ClusterPKI, ports: Ports
) -> list[str]:
    return [
        "kube-controller-manager",
        *_component_common(kubeconfig, cert_dir, ports.controller_manager),
        "--use-service-account-credentials=true",  # each controller under its own RBAC identity
        f"--service-account-private-key-file={pki.service_account_key}",
        f"--root-ca-file={pki.ca.cert}",
        f"--cluster-signing-cert-file={pki.ca.cert}",
        f"--cluster-signing-key-file={pki.ca.key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
    ]
