"""The Service environment variables the kubelet gives every container (kubernetes
pkg/kubelet/kubelet_pods.go getServiceEnvVarMap, pkg/kubelet/envvars/envvars.go FromServices):
for each Service of the pod's namespace with a ClusterIP (all of them unless the pod says
`enableServiceLinks: false`) and for the `kubernetes` Service always, `{NAME}_SERVICE_HOST`,
`{NAME}_SERVICE_PORT`, `{NAME}_SERVICE_PORT_{PORT NAME}` and the Docker link variables
(`{NAME}_PORT`, `{NAME}_PORT_{port}_{PROTO}` and its `_PROTO`, `_PORT`, `_ADDR`). Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def _upper(name: str) -> str:
    return name.upper().replace("-", "_")


def service_vars(service: Mapping[str, Any]) -> dict[str, str]:
    """One Service's variables; none for a headless one or one without a ClusterIP."""
    spec = service.get("spec") or {}
    ip = spec.get("clusterIP") or ""
    if not ip or ip == "None":
        return {}
    prefix = _upper(service["metadata"]["name"])
    ports = spec.get("ports") or []
    env: dict[str, str] = {f"{prefix}_SERVICE_HOST": ip}
    for i, port in enumerate(ports):
        number = str(port.get("port", ""))
        if i == 0:
            env[f"{prefix}_SERVICE_PORT"] = number
        if port.get("name"):
            env[f"{prefix}_SERVICE_PORT_{_upper(port['name'])}"] = number
    for i, port in enumerate(ports):
        protocol = str(port.get("protocol") or "TCP")
        url = f"{protocol.lower()}://{ip}:{port.get('port')}"
        if i == 0:
            env[f"{prefix}_PORT"] = url
        each = f"{prefix}_PORT_{port.get('port')}_{protocol.upper()}"
        env.update({each: url, f"{each}_PROTO": protocol.lower(),
                    f"{each}_PORT": str(port.get("port")), f"{each}_ADDR": ip})  # fmt: skip
    return env


def pod_service_env(
    pod: Mapping[str, Any], services: Iterable[Mapping[str, Any]], kubernetes: Mapping[str, Any]
) -> dict[str, str]:
    """The variables for `pod` from its namespace's `services` and the `kubernetes` Service
    (given as where pods reach the apiserver, which wins over a namesake in the namespace)."""
    env: dict[str, str] = {}
    if (pod.get("spec") or {}).get("enableServiceLinks", True) is not False:
        for service in services:
            if service["metadata"].get("name") != "kubernetes":
                env.update(service_vars(service))
    env.update(service_vars(kubernetes))
    return env


def kubernetes_service(host: str, port: int) -> dict[str, Any]:
    """The `kubernetes` Service as pods of the node agent reach the apiserver."""
    return {
        "metadata": {"name": "kubernetes", "namespace": "default"},
        "spec": {"clusterIP": host, "ports": [{"name": "https", "port": port, "protocol": "TCP"}]},
    }
