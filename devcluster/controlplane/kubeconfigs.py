"""Kubeconfigs with client certificates: one per identity (admin, scheduler, controller-manager)."""

from __future__ import annotations

from pathlib import Path

import yaml

from .pki import KeyPair


def write_kubeconfig(path: Path, server: str, ca_cert: Path, client: KeyPair, name: str) -> Path:
    """A kubeconfig for `server` as `client`, with absolute file paths (kubectl, client-go and
    kubernetes_asyncio all read them). Written atomically: a reader never sees half of one."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "controlplane",
                "cluster": {"server": server, "certificate-authority": str(ca_cert)},
            }
        ],
        "users": [
            {
                "name": name,
                "user": {"client-certificate": str(client.cert), "client-key": str(client.key)},
            }
        ],
        "contexts": [
            {
                "name": name,
                "context": {"cluster": "controlplane", "user": name, "namespace": "default"},
            }
        ],
        "current-context": name,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(config, sort_keys=False))
    tmp.replace(path)
    return path
