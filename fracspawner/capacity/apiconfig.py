"""How fracspawner's commands reach the API server: in-cluster config inside a pod, else a
kubeconfig (the one given, $KUBECONFIG or ~/.kube/config), as kubectl does.

One function for `fracspawner capacity`, the Kubeflow webhook and the Kubeflow culler. It
imports only kubernetes_asyncio (not kubespawner), so the [webhook] install can use it.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["load_configuration"]


async def load_configuration(kubeconfig: str | None) -> Any:
    """A kubernetes_asyncio Configuration: the kubeconfig given, in-cluster config inside a
    pod, else $KUBECONFIG or ~/.kube/config."""
    from kubernetes_asyncio import client, config

    configuration = client.Configuration()
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=configuration)
    else:
        await config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    return configuration
