"""Service-account identities on the real control plane, as a cluster gives them to pods:
RBAC objects applied with the admin's client, a token minted for a ServiceAccount with the
TokenRequest API (what the kubelet does for a pod's projected token), and a kubeconfig that
authenticates with it, so a component run here holds exactly the permissions a Role grants.
tests/rbac_support.py applies the chart's rendered RBAC with these; docs/controlplane.md "RBAC"."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from .rest import Client

__all__ = ["RBAC_KINDS", "apply", "request_token", "write_token_kubeconfig"]

#: kind -> (API prefix, plural, namespaced): what a chart's RBAC is made of
RBAC_KINDS: dict[str, tuple[str, str, bool]] = {
    "Namespace": ("/api/v1", "namespaces", False),
    "ServiceAccount": ("/api/v1", "serviceaccounts", True),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles", True),
    "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1", "clusterroles", False),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True),
    "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
}


def _collection(obj: dict[str, Any]) -> str:
    kind = obj.get("kind")
    if kind not in RBAC_KINDS:
        raise ValueError(f"cannot apply a {kind}: only {', '.join(RBAC_KINDS)}")
    prefix, plural, namespaced = RBAC_KINDS[kind]
    if not namespaced:
        return f"{prefix}/{plural}"
    namespace = obj["metadata"].get("namespace")
    if not namespace:
        raise ValueError(f"{kind} {obj['metadata']['name']} has no namespace")
    return f"{prefix}/namespaces/{namespace}/{plural}"


def apply(client: Client, objs: Iterable[dict[str, Any]]) -> None:
    """Create each object, or replace the one of that name (a Role re-applied with a rule
    edited replaces the old rules, as `kubectl apply` of the edited manifest would)."""
    for obj in objs:
        collection = _collection(obj)
        name = obj["metadata"]["name"]
        status, text = client.request("POST", collection, obj)
        if status == 409:
            status, text = client.request("GET", f"{collection}/{name}")
            if status == 200:
                current = json.loads(text)
                body = json.loads(json.dumps(obj))
                body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                status, text = client.request("PUT", f"{collection}/{name}", body)
        if status not in (200, 201):
            raise RuntimeError(f"applying {obj['kind']} {name}: {status} {text[:500]}")


def request_token(client: Client, namespace: str, name: str, *, seconds: int = 3600) -> str:
    """A token for ServiceAccount `namespace/name` from the TokenRequest API (the
    `serviceaccounts/token` subresource), signed with the cluster's service-account key."""
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": seconds},
    }
    path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token"
    status, text = client.request("POST", path, request)
    if status != 201:
        raise RuntimeError(f"a token for ServiceAccount {namespace}/{name}: {status} {text[:500]}")
    return json.loads(text)["status"]["token"]


def write_token_kubeconfig(
    path: Path, server: str, ca_cert: Path, token: str, user: str, namespace: str
) -> Path:
    """A kubeconfig for `server` authenticating with a bearer `token` (as in-cluster config
    does with a pod's token), the cluster CA verifying the apiserver. Written atomically."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "controlplane",
                "cluster": {"server": server, "certificate-authority": str(ca_cert)},
            }
        ],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [
            {
                "name": user,
                "context": {"cluster": "controlplane", "user": user, "namespace": namespace},
            }
        ],
        "current-context": user,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(config, sort_keys=False))
    tmp.chmod(0o600)
    tmp.replace(path)
    return path
