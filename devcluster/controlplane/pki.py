"""One cluster's certificates and keys, as kubeadm lays them out (`kubeadm init phase certs`):
a cluster CA signing the apiserver's serving certificate and every client identity, a separate
front-proxy CA for the aggregation layer, and the service-account signing key pair.

Client identities are the ones the components' default RBAC expects: system:kube-scheduler,
system:kube-controller-manager, and an admin in system:masters. The CAs come from
devcluster.certs (make_ca), the serving certificate from certs.issue; every lifetime is
kubeadm's (certs.CA_VALIDITY, certs.CERT_VALIDITY).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from devcluster.certs import BACKDATE, CERT_VALIDITY, CertificateAuthority, issue, make_ca

#: the first address of --service-cluster-ip-range: the `kubernetes` Service's ClusterIP, which
#: in-cluster clients reach the apiserver by, so the serving certificate names it
SERVICE_CIDR = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"
APISERVER_HOSTS = [
    "127.0.0.1",
    "localhost",
    KUBERNETES_SERVICE_IP,
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
]


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class ClusterPKI:
    ca: KeyPair
    apiserver: KeyPair
    apiserver_kubelet_client: KeyPair
    front_proxy_ca: KeyPair
    front_proxy_client: KeyPair
    service_account_key: Path
    service_account_pub: Path
    admin: KeyPair
    scheduler: KeyPair
    controller_manager: KeyPair


def _pem_key(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _write(path: Path, data: bytes, private: bool = False) -> Path:
    path.write_bytes(data)
    if private:
        path.chmod(0o600)
    return path


def _write_ca(ca: CertificateAuthority, directory: Path, name: str) -> KeyPair:
    return KeyPair(
        _write(directory / f"{name}.crt", ca.pem),
        _write(directory / f"{name}.key", _pem_key(ca.key), private=True),
    )


def issue_client(
    ca: CertificateAuthority, directory: Path, name: str, user: str, groups: tuple[str, ...] = ()
) -> KeyPair:
    """A client certificate: the apiserver takes CN as the user name and each O as a group."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name(
        [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
        + [x509.NameAttribute(NameOID.COMMON_NAME, user)]
    )
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + CERT_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca.key, hashes.SHA256())
    )
    return KeyPair(
        _write(directory / f"{name}.crt", cert.public_bytes(serialization.Encoding.PEM)),
        _write(directory / f"{name}.key", _pem_key(key), private=True),
    )


def make_pki(directory: Path) -> ClusterPKI:
    """Every certificate and key one cluster needs, written under `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = make_ca("kubernetes")
    front_proxy_ca = make_ca("front-proxy-ca")
    serving = issue(ca, APISERVER_HOSTS, directory, name="apiserver")
    # RSA as kubeadm makes it: every component and client library reads it
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    sa_pub = sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return ClusterPKI(
        ca=_write_ca(ca, directory, "ca"),
        apiserver=KeyPair(serving.cert_file, serving.key_file),
        apiserver_kubelet_client=issue_client(
            ca,
            directory,
            "apiserver-kubelet-client",
            "kube-apiserver-kubelet-client",
            ("system:masters",),
        ),  # fmt: skip
        front_proxy_ca=_write_ca(front_proxy_ca, directory, "front-proxy-ca"),
        front_proxy_client=issue_client(
            front_proxy_ca, directory, "front-proxy-client", "front-proxy-client"
        ),
        service_account_key=_write(directory / "sa.key", _pem_key(sa_key), private=True),
        service_account_pub=_write(directory / "sa.pub", sa_pub),
        admin=issue_client(ca, directory, "admin", "kubernetes-admin", ("system:masters",)),
        scheduler=issue_client(ca, directory, "scheduler", "system:kube-scheduler"),
        controller_manager=issue_client(
            ca, directory, "controller-manager", "system:kube-controller-manager"
        ),
    )
