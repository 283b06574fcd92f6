"""Who is calling /mutate, when no client certificate says so: the pod whose IP the request
comes from. Pure bookkeeping, fed by the webhook's pod watch (quota.PodIndex passes it every
event).

A pod's connection to the webhook's Service keeps the pod's IP as its source: kube-proxy (and
the CNI replacements of it) rewrites the destination of Service traffic (DNAT), not the source,
for traffic from inside the cluster's pod network (kubernetes pkg/proxy/iptables/proxier.go
marks for masquerade only traffic from outside the cluster CIDR, hairpin traffic of an
endpoint to itself, or everything with --masquerade-all). The
API server is no pod of the pod network: a static pod with hostNetwork on a control-plane node,
or outside the cluster (managed control planes), so its requests come from a node or
control-plane address. So a request from the IP of a running pod that does not use the host's
network is that pod's: a tenant forging reviews, not the API server. One exception: where
the API server reaches the cluster through Konnectivity (GKE, AKS), its requests leave the
konnectivity-agent pods, in kube-system: pods of `trusted` namespaces are not taken for
tenants.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

#: namespaces whose pods may relay the API server's requests (Konnectivity's agents)
DEFAULT_TRUSTED = ("kube-system",)


def pod_ips(pod: Mapping[str, Any]) -> list[str]:
    """The pod-network addresses of a pod (none for a pod on the host's network: its address
    is its node's, shared with whatever runs there)."""
    if (pod.get("spec") or {}).get("hostNetwork"):
        return []
    status = pod.get("status") or {}
    ips = [str(p.get("ip")) for p in status.get("podIPs") or [] if p.get("ip")]
    return ips or ([str(status["podIP"])] if status.get("podIP") else [])


class PodAddresses:
    """IP -> (namespace, name) of the pods in the watch."""

    def __init__(self, trusted: Iterable[str] = DEFAULT_TRUSTED) -> None:
        self.trusted = frozenset(trusted)
        self._by_ip: dict[str, tuple[str, str]] = {}
        self._of_pod: dict[tuple[str, str], list[str]] = {}

    @staticmethod
    def _where(pod: Mapping[str, Any]) -> tuple[str, str]:
        meta = pod.get("metadata") or {}
        return str(meta.get("namespace") or ""), str(meta.get("name") or "")

    def load(self, pods: Iterable[Mapping[str, Any]]) -> None:
        self._by_ip, self._of_pod = {}, {}
        for pod in pods:
            self.put(pod)

    def put(self, pod: Mapping[str, Any]) -> None:
        self.drop(pod)
        where = self._where(pod)
        ips = pod_ips(pod)
        if ips:
            self._of_pod[where] = ips
            for ip in ips:
                self._by_ip[ip] = where

    def drop(self, pod: Mapping[str, Any]) -> None:
        where = self._where(pod)
        for ip in self._of_pod.pop(where, []):
            if self._by_ip.get(ip) == where:
                del self._by_ip[ip]

    def tenant(self, ip: str) -> tuple[str, str] | None:
        """The pod a request from `ip` comes from, unless none or one of a trusted namespace."""
        found = self._by_ip.get(ip)
        return found if found is not None and found[0] not in self.trusted else None


__all__ = ["DEFAULT_TRUSTED", "PodAddresses", "pod_ips"]
