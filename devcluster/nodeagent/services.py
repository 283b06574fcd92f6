"""Services for pods in network namespaces of their own (run mode, `network="namespaces"`):
the agent follows every Service (a node may list and watch them: the kubelet does, for the
Service env vars) and hands each to its runtime's network (devcluster/network.py: the ClusterIP
bound on the pods' bridge with a userspace proxy to the Service's ready pods, kube-proxy's part,
and a cluster DNS server, CoreDNS's). The `kubernetes` Service's one endpoint is the apiserver
on the host's loopback, so pods reach it at its ClusterIP, a name its certificate holds."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from http.client import HTTPException
from typing import Any

from .client import ApiError, Client

APISERVER_LABEL = "devcluster.io/apiserver"
WATCH_SECONDS = 5  # stop() waits for the watch to end


def proxied(service: Mapping[str, Any], apiserver_port: int) -> dict[str, Any]:
    """The Service as the network proxies it: `kubernetes` selects the apiserver's stand-in
    endpoint (apiserver_endpoint) at the apiserver's port; any other as it is."""
    meta = service["metadata"]
    if (meta.get("namespace"), meta.get("name")) != ("default", "kubernetes"):
        return dict(service)
    spec = dict(service.get("spec") or {})
    spec["selector"] = {APISERVER_LABEL: "true"}
    spec["ports"] = [{**p, "targetPort": apiserver_port} for p in spec.get("ports") or []]
    return {**service, "spec": spec}


def apiserver_endpoint() -> dict[str, Any]:
    """A ready 'pod' at the host's loopback for the `kubernetes` Service's selector."""
    return {
        "metadata": {"name": "kube-apiserver", "namespace": "default",
                     "labels": {APISERVER_LABEL: "true"}},
        "status": {"podIP": "127.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]},
    }  # fmt: skip


def follow(
    client: Client,
    hand: Callable[[str, dict[str, Any]], None],
    stop: threading.Event,
    say: Callable[[str], None],
) -> None:
    """List and watch every Service until `stop`, handing each change on (ADDED, MODIFIED,
    DELETED); a broken watch or 410 lists again."""
    path = "/api/v1/services"
    while not stop.is_set():
        try:
            listed = client.get(path)
            for service in listed["items"]:
                hand("ADDED", service)
            version = listed["metadata"]["resourceVersion"]
            while not stop.is_set():
                for event in client.watch(path, WATCH_SECONDS, resourceVersion=version):
                    if event["type"] == "ERROR":
                        raise ApiError(event["object"].get("code", 500), "WATCH", path, "")
                    version = event["object"]["metadata"]["resourceVersion"]
                    if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                        hand(event["type"], event["object"])
        except (ApiError, OSError, ValueError, HTTPException) as err:
            if not stop.is_set():
                say(f"services: {err}; listing again")
                stop.wait(1.0)
