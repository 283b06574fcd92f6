"""A kubeconfig for the devcluster that kubernetes_asyncio and kubectl both accept."""

from __future__ import annotations

from pathlib import Path

import yaml


def write_kubeconfig(path: Path, url: str) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "devcluster", "cluster": {"server": url}}],
        # the devcluster checks no credentials; a token keeps every client's auth code path happy
        "users": [{"name": "devcluster", "user": {"token": "devcluster"}}],
        "contexts": [
            {
                "name": "devcluster",
                "context": {"cluster": "devcluster", "user": "devcluster", "namespace": "default"},
            }
        ],
        "current-context": "devcluster",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(config, sort_keys=False))
    tmp.replace(path)
    return path
