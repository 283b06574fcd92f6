"""kube-apiserver's admission configuration for webhooks (pure: certificates in, documents out):
the client certificates the API server presents when it calls admission webhooks.

Kubernetes "Dynamic Admission Control", *Authenticate API servers*: `--admission-control-config-
file` names an AdmissionConfiguration whose ValidatingAdmissionWebhook and MutatingAdmissionWebhook
plugins each name a kubeconfig (WebhookAdmissionConfiguration, `kubeConfigFile`); its `users`
are keyed by the webhook they are presented to. How a webhook finds its user
(k8s.io/apiserver v0.36.3 pkg/util/webhook/authentication.go, clientConfig): the exact target
(a Service webhook: `NAME.NAMESPACE.svc:PORT`; a URL webhook: the URL's `host:port`), then
star-prefixed names (`*.svc`, `*.example.org`), then both again without the port where it is
443, then `*` for any webhook; no match: no certificate.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: the two plugins that call webhooks (both take the same kubeconfig)
WEBHOOK_PLUGINS = ("ValidatingAdmissionWebhook", "MutatingAdmissionWebhook")


def webhook_kubeconfig(clients: Mapping[str, tuple[Path, Path]]) -> dict[str, Any]:
    """A kubeconfig whose users are `clients`: webhook target (`host:port`, `*.svc`, `*`) ->
    (client certificate, key) files."""
    if not clients:
        raise ValueError("webhook_kubeconfig: no webhook client certificates given")
    users = []
    for target, (cert, key) in sorted(clients.items()):
        if not target:
            raise ValueError("webhook_kubeconfig: a webhook target name is empty")
        for what, path in (("certificate", cert), ("key", key)):
            if not Path(path).is_file():
                raise ValueError(f"webhook client {what} for {target!r} not found: {path}")
        user = {"client-certificate": str(cert), "client-key": str(key)}
        users.append({"name": target, "user": user})
    return {"apiVersion": "v1", "kind": "Config", "users": users}


def admission_configuration(kubeconfig: Path) -> dict[str, Any]:
    """An AdmissionConfiguration (apiserver.config.k8s.io/v1) giving both webhook plugins
    `kubeconfig` (webhook_kubeconfig)."""
    webhook = {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "WebhookAdmissionConfiguration",
        "kubeConfigFile": str(kubeconfig),
    }
    return {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "AdmissionConfiguration",
        "plugins": [{"name": name, "configuration": webhook} for name in WEBHOOK_PLUGINS],
    }
