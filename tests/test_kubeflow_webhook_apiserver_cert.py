"""The real kube-apiserver authenticates to the webhook with a client certificate, as a cluster
whose API server is configured for it does (Kubernetes "Dynamic Admission Control",
*Authenticate API servers*): the launcher gives it an AdmissionConfiguration
(devcluster/controlplane/admission.py) whose kubeconfig holds the certificate
make_client_tls issued, and the webhook runs with `--client-ca` (docs/kubeflow.md, "Who may
call the webhook"). Its calls are then a verified caller's: a dry run is checked against the
quota and a refusal names the namespace's numbers; the same review posted without the
certificate, from another address, is refused.

One control plane for the module, without the node agent: the pods are pinned to a node that
does not exist, so they stay Pending and nothing runs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devcluster.controlplane import ControlPlane
from tests.kubeflow_support import (
    WebhookProcess,
    admission_review,
    create_pod,
    denied,
    make_client_tls,
    make_tls,
    profile_namespace,
    register,
)
from tests.test_controlplane import _binary
from tests.test_kubeflow_webhook_callers import DEMO, PROFILE, notebook, post_from

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NAMESPACE = "verified"
CLIENT_NAME = "kube-apiserver-webhook-client"
#: an address that is neither the API server's (127.0.0.1) nor a pod's (127.0.x.y)
OTHER = "127.1.2.3"


class JsonClient:
    """The admin's requests to kube-apiserver with JSON answers (kubeflow_support's helpers
    read `body` as decoded JSON)."""

    def __init__(self, cp: ControlPlane) -> None:
        self.rest = cp.client

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        status, text = self.rest.request(method, path, body, timeout=60)
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text

    def get(self, path: str) -> Any:
        status, body = self.request("GET", path)
        assert status == 200, body
        return body


@pytest.fixture(scope="module")
def client_cert(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_client_tls(tmp_path_factory.mktemp("apiserver-client"), CLIENT_NAME)


@pytest.fixture(scope="module")
def cp(tmp_path_factory, client_cert) -> Iterator[ControlPlane]:
    """`*`: the certificate for every webhook (the webhook's URL, 127.0.0.1:PORT, gets its port
    only once the cluster runs); a chart's install would name `NAME.NAMESPACE.svc:443`."""
    _binary()
    clients = {"*": (client_cert["cert"], client_cert["key"])}
    with ControlPlane.start(tmp_path_factory.mktemp("controlplane"), webhook_clients=clients) as c:
        yield c


def test_the_api_server_presents_its_certificate_and_is_a_verified_caller(
    cp, client_cert, tmp_path
):
    api = JsonClient(cp)
    profile_namespace(api, NAMESPACE, PROFILE)
    tls = make_tls(tmp_path / "tls")
    args = ("--client-ca", str(client_cert["ca"]), "--client-name", CLIENT_NAME)
    webhook = WebhookProcess(DEMO, cp.kubeconfig, tls, tmp_path / "webhook.log", args)
    try:
        try:
            register(api, webhook, f"{NAMESPACE}.slices.webhook.fracspawner.io", NAMESPACE)
        except AssertionError as err:  # kube-apiserver's calls refused: no certificate?
            raise AssertionError(f"{err}; the webhook's log:\n{webhook.logs()}") from None
        # the namespace's whole quota (0.25 GPU), created through kube-apiserver
        first = notebook(NAMESPACE, "first")
        first["spec"]["nodeName"] = "not-a-node"  # stays Pending, runs nothing
        status, stored = create_pod(api, first)
        assert status == 201, (status, stored, webhook.logs())
        assert stored["metadata"]["annotations"]["fracspawner.io/gpu-equivalent"] == "0.25"
        # a dry run through kube-apiserver is a verified caller's: checked against the quota,
        # refused with the namespace's numbers (an unverified caller's is admitted with a
        # warning, and its refusals name no usage)
        probe = notebook(NAMESPACE, "probe", "0.125")
        status, body = create_pod(api, probe, dry_run=True)
        reason = denied(body)
        assert reason and "0.25 of its 0.25 GPU quota" in reason, (status, body)
        assert "403 from" not in webhook.logs()  # every call of kube-apiserver's was verified
        status, metrics = webhook.request("GET", "/metrics")
        assert status == 200
        assert b'fracspawner_webhook_refusals_total{reason="quota"} 1.0' in metrics, metrics
        # the same review without the certificate, from another address: not the API server
        review = admission_review(probe, dry_run=True)
        status, answer = post_from(webhook, OTHER, review)
        assert status == 403, answer
        assert "may not send admission reviews" in answer["error"]
        assert f"403 from {OTHER}: no client certificate" in webhook.logs()
    finally:
        webhook.stop()


def test_the_launcher_gives_no_admission_configuration_by_default(tmp_path):
    """Pure: without webhook client certificates, kube-apiserver's flags are unchanged; a
    missing certificate file is named."""
    from devcluster.controlplane import flags
    from devcluster.controlplane.admission import admission_configuration, webhook_kubeconfig
    from devcluster.controlplane.pki import make_pki

    pki = make_pki(tmp_path / "pki")
    ports = flags.Ports(1, 2, 3, 4, 5)
    argv = flags.kube_apiserver(pki, ports)
    assert not [a for a in argv if a.startswith("--admission-control-config-file")]
    configured = flags.kube_apiserver(pki, ports, tmp_path / "admission.yaml")
    assert configured[-1] == f"--admission-control-config-file={tmp_path / 'admission.yaml'}"
    config = admission_configuration(tmp_path / "webhooks.kubeconfig")
    assert [p["name"] for p in config["plugins"]] == [
        "ValidatingAdmissionWebhook",
        "MutatingAdmissionWebhook",
    ]
    with pytest.raises(ValueError, match="certificate for '\\*.svc' not found"):
        webhook_kubeconfig({"*.svc": (tmp_path / "none.crt", tmp_path / "none.key")})
