"""Each node's own identity, as the kubelet's TLS bootstrap would end with: a client certificate
CN=system:node:<name>, O=system:nodes, signed by the cluster CA the launcher made, and a
kubeconfig for it. With it the apiserver's Node authorizer and the NodeRestriction admission
plugin limit the node to its own Node, Lease, pods and ResourceSlices (kubernetes
plugin/pkg/auth/authorizer/node, plugin/pkg/admission/noderestriction)."""

from __future__ import annotations

from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from devcluster.certs import CertificateAuthority
from devcluster.controlplane.kubeconfigs import write_kubeconfig
from devcluster.controlplane.pki import KeyPair, issue_client

NODE_USER = "system:node:{}"
NODE_GROUP = "system:nodes"


def load_ca(ca: KeyPair) -> CertificateAuthority:
    """The launcher's cluster CA (pki/ca.crt, pki/ca.key); a clear error when either is missing
    or the key is not the EC key the launcher writes."""
    for path in (ca.cert, ca.key):
        if not Path(path).is_file():
            raise FileNotFoundError(f"node agent: no cluster CA file {path} (the launcher's pki/)")
    cert = x509.load_pem_x509_certificate(Path(ca.cert).read_bytes())
    key = serialization.load_pem_private_key(Path(ca.key).read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"node agent: {ca.key} is not an EC private key")
    return CertificateAuthority(cert, key)


def node_kubeconfig(ca: KeyPair, server: str, node: str, directory: Path) -> Path:
    """Issue `node`'s client certificate and write `<directory>/<node>.kubeconfig`."""
    directory.mkdir(parents=True, exist_ok=True)
    identity = issue_client(
        load_ca(ca), directory, f"node-{node}", NODE_USER.format(node), (NODE_GROUP,)
    )
    return write_kubeconfig(
        directory / f"{node}.kubeconfig", server, Path(ca.cert), identity, NODE_USER.format(node)
    )
