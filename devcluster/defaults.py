"""The defaults the apiserver gives a pod when it decodes one (k8s.io/kubernetes
pkg/apis/core/v1/defaults.go: SetDefaults_PodSpec, SetDefaults_Container,
SetDefaults_ContainerPort), so that admission webhooks and clients see the fields a real pod
always has: a JSONPatch `add /spec/containers/0/resources/limits` works because `resources`
is there (`{}`), as on a real cluster.

Not applied: what admission plugins add on a real cluster (ServiceAccount's token volume,
DefaultTolerationSeconds' tolerations, Priority's `priority`), and requests copied from
limits (SetDefaults_Pod) — docs/devcluster.md lists these differences.
"""

from __future__ import annotations

from typing import Any


def pull_policy(image: str) -> str:
    """Always for `:latest` or an untagged image, else IfNotPresent (a digest included)."""
    if "@" in image:
        return "IfNotPresent"
    name = image.rsplit("/", 1)[-1]
    tag = name.split(":", 1)[1] if ":" in name else ""
    return "Always" if tag in ("", "latest") else "IfNotPresent"


def pod(obj: dict[str, Any]) -> dict[str, Any]:
    """Fill a pod's defaults in place (and return it)."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return obj
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("securityContext", {})
    spec.setdefault("enableServiceLinks", True)
    for group in ("initContainers", "containers"):
        for container in spec.get(group) or []:
            if not isinstance(container, dict):
                continue
            container.setdefault("terminationMessagePath", "/dev/termination-log")
            container.setdefault("terminationMessagePolicy", "File")
            container.setdefault("imagePullPolicy", pull_policy(str(container.get("image", ""))))
            container.setdefault("resources", {})
            for port in container.get("ports") or []:
                if isinstance(port, dict):
                    port.setdefault("protocol", "TCP")
    return obj
