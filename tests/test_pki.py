"""Certificate lifetimes of a cluster's PKI (devcluster/controlplane/pki.py, devcluster/certs.py):
kubeadm's, so a demo left running for days keeps working. kubeadm's constants
(cmd/kubeadm/app/constants/constants.go): CACertificateValidityPeriod 10 years,
CertificateValidityPeriod 1 year."""

from __future__ import annotations

import datetime
from pathlib import Path

from cryptography import x509

from devcluster.certs import issue, make_ca
from devcluster.controlplane.pki import issue_client, make_pki

YEAR = datetime.timedelta(days=365)
SLACK = datetime.timedelta(minutes=10)


def _lifetime_from_now(cert: x509.Certificate) -> datetime.timedelta:
    return cert.not_valid_after_utc - datetime.datetime.now(datetime.timezone.utc)


def _read(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_cluster_cas_last_ten_years_and_their_leaves_one(tmp_path: Path):
    pki = make_pki(tmp_path)
    for ca in (pki.ca, pki.front_proxy_ca):
        assert abs(_lifetime_from_now(_read(ca.cert)) - 10 * YEAR) < SLACK, ca.cert
    leaves = (
        pki.apiserver,
        pki.apiserver_kubelet_client,
        pki.front_proxy_client,
        pki.admin,
        pki.scheduler,
        pki.controller_manager,
    )
    for leaf in leaves:
        assert abs(_lifetime_from_now(_read(leaf.cert)) - YEAR) < SLACK, leaf.cert


def test_serving_and_client_certificates_of_a_node_last_one_year(tmp_path: Path):
    """What the node agent issues from the cluster CA: the kubelet API's serving certificate
    (certs.issue) and a node's client identity (pki.issue_client)."""
    ca = make_ca("kubernetes")
    assert abs(_lifetime_from_now(ca.cert) - 10 * YEAR) < SLACK
    serving = issue(ca, ["127.0.0.1", "localhost"], tmp_path, name="kubelet")
    node = issue_client(ca, tmp_path, "node", "system:node:n1", ("system:nodes",))
    for path in (serving.cert_file, node.cert):
        cert = _read(path)
        assert abs(_lifetime_from_now(cert) - YEAR) < SLACK, path
        assert cert.not_valid_after_utc < ca.cert.not_valid_after_utc  # never outlives its CA
