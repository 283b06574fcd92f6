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

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

log = logging.getLogger("fracspawner.webhook")

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


class SourceStandings:
    """How the quota reservations of each unverified caller (its address) ended: with their
    pod in the watch (confirmed) or without (the API server never created the pod: a later
    webhook refused it, or nobody meant to create it: a forged review). A source whose
    reservations mostly end unconfirmed, `strikes` of them or more within `memory` seconds, is
    suspect: its reservations are counted against it, never against the namespace they name
    (quota.Ledger leaves them out), so forged reviews from a node's address can hold another
    namespace's quota for at most `strikes` reservation windows per `memory`. The API server's
    own reservations almost all end confirmed: a pod refused after this webhook now and then
    does not make it suspect."""

    def __init__(
        self,
        memory: float = 600.0,
        strikes: int = 3,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.memory, self.strikes, self.clock = memory, strikes, clock
        self._ended: dict[str, deque[tuple[float, bool]]] = {}
        self._judged: dict[tuple[str, str, float], float] = {}
        self.unconfirmed = 0  # reservations that ended without their pod, since start

    def ended(self, source: str, key: str, at: float, confirmed: bool) -> None:
        """Reservation `key` (made at `at`) of `source` ended; each is judged once, however
        often its record is read."""
        now = self.clock()
        for old in [k for k, when in self._judged.items() if when < now - self.memory]:
            del self._judged[old]
        if not source or (source, key, at) in self._judged:
            return
        self._judged[(source, key, at)] = now
        was = self.suspect(source)
        history = self._ended.setdefault(source, deque())
        history.append((now, confirmed))
        if not confirmed:
            self.unconfirmed += 1
        if self.suspect(source) and not was:
            log.warning(
                "reservations from %s keep ending without their pod: no longer counted against "
                "the namespaces it names (forged reviews? verify the API server: --client-ca)",
                source,
            )

    def suspect(self, source: str) -> bool:
        history = self._ended.get(source)
        if not source or not history:
            return False
        while history and history[0][0] < self.clock() - self.memory:
            history.popleft()
        misses = sum(1 for _, confirmed in history if not confirmed)
        return misses >= self.strikes and misses > len(history) - misses


__all__ = ["DEFAULT_TRUSTED", "PodAddresses", "SourceStandings", "pod_ips"]
