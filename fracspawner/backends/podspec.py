"""Apply a PodPlan onto a pod manifest (a camelCase API dict). Pure and idempotent.

FracSpawner applies plans through kubespawner's traits; everything that meets a pod it did
not build itself (`fracspawner plan` without the hub extra, the Kubeflow admission webhook)
applies it here, so one function says what a plan does to a pod. Applying the same plan twice
gives the same pod (a webhook may be invoked again after other webhooks ran).
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from .base import PodPlan


def _merge(target: dict[str, Any], key: str, values: Mapping[str, Any]) -> None:
    if values:
        target[key] = {**(target.get(key) or {}), **values}


def apply_to_container(
    container: dict[str, Any], plan: PodPlan, reserved: Any = lambda name: False
) -> None:
    """Put the plan's resources and env on one container, in place.

    `reserved(name)` says which env names nobody but the plan may set: they are removed
    before the plan's env goes on (fracspawner.backends.is_reserved_env)."""
    resources = container.setdefault("resources", {})
    _merge(resources, "limits", dict(plan.limits))
    _merge(resources, "requests", dict(plan.requests))
    if plan.container_claims:
        resources["claims"] = merge_by_name(resources.get("claims"), plan.container_claims)
    if not resources:
        del container["resources"]
    env = [
        e
        for e in container.get("env") or []
        if not reserved(str(e.get("name", ""))) and e.get("name") not in plan.env
    ]
    env += [{"name": k, "value": str(v)} for k, v in plan.env.items()]
    if env:
        container["env"] = env
    else:
        container.pop("env", None)
    if plan.image:
        container["image"] = plan.image
    for key, value in plan.extra_container_config.items():
        container[key] = copy.deepcopy(value)


def apply_plan(
    pod: Mapping[str, Any],
    plan: PodPlan,
    *,
    container: str | None = None,
    reserved: Any = lambda name: False,
) -> dict[str, Any]:
    """A copy of `pod` with `plan` applied to it and to its container named `container`
    (default: the first container)."""
    out = copy.deepcopy(dict(pod))
    meta = out.setdefault("metadata", {})
    _merge(meta, "labels", dict(plan.labels))
    _merge(meta, "annotations", dict(plan.annotations))
    spec = out.setdefault("spec", {})
    containers = spec.setdefault("containers", [])
    target = next((c for c in containers if c.get("name") == container), None)
    if target is None:
        if container is not None or not containers:
            raise ValueError(f"the pod has no container {container or '(none at all)'}")
        target = containers[0]
    apply_to_container(target, plan, reserved)
    _merge(spec, "nodeSelector", dict(plan.node_selector))
    if plan.tolerations:
        tolerations = list(spec.get("tolerations") or [])
        for toleration in map(dict, plan.tolerations):
            if toleration not in tolerations:
                tolerations.append(toleration)
        spec["tolerations"] = tolerations
    if plan.scheduler_name:
        spec["schedulerName"] = plan.scheduler_name
    for key, value in plan.extra_pod_config.items():
        if key == "resourceClaims":  # the pod's own claims stay beside the plan's
            spec[key] = merge_by_name(spec.get(key), value)
        else:
            spec[key] = copy.deepcopy(value)
    return out


def merge_by_name(current: Any, entries: Any) -> list[dict[str, Any]]:
    """A list of named entries (claims) with `entries` in it: an entry of the same name is
    replaced, so applying a plan twice gives the same list."""
    new = [dict(copy.deepcopy(dict(e))) for e in entries]
    names = {e.get("name") for e in new}
    kept = [copy.deepcopy(e) for e in current or [] if e.get("name") not in names]
    return kept + new


def is_privileged(container: Any) -> bool:
    """Whether a container runs privileged: a camelCase API dict, a snake_case dict or a
    kubernetes(_asyncio) model, as kubespawner's `init_containers` holds them (z2jh appends
    its `block-cloud-metadata` init container as a model)."""
    if isinstance(container, Mapping):
        context = container.get("securityContext") or container.get("security_context") or {}
    else:
        context = getattr(container, "security_context", None) or {}
    if isinstance(context, Mapping):
        return bool(context.get("privileged"))
    return bool(getattr(context, "privileged", False))


def container_name(container: Any) -> str:
    if isinstance(container, Mapping):
        return str(container.get("name", "?"))
    return str(getattr(container, "name", "?"))


#: the env that shows a container none of its node's GPUs: the NVIDIA container toolkit hands
#: an unprivileged container the devices NVIDIA_VISIBLE_DEVICES names (and IMEX channels from
#: NVIDIA_IMEX_CHANNELS), `void` names none, and a container's env wins over its image's, where
#: CUDA base images (the notebook image's among them) set NVIDIA_VISIBLE_DEVICES=all
#: (nvidia-container-toolkit internal/config/image/cuda_image.go; docs/install.md "GPU nodes")
NO_DEVICES_ENV: Mapping[str, str] = MappingProxyType(
    {"NVIDIA_VISIBLE_DEVICES": "void", "NVIDIA_IMEX_CHANNELS": "void"}
)
#: an extended resource that hands out no device by itself (HAMi's task priority)
_SHAPE_ONLY = frozenset({"nvidia.com/priority"})


def _field(obj: Any, camel: str, snake: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(camel, obj.get(snake))
    return getattr(obj, snake, None)


def holds_device(container: Any) -> bool:
    """Whether a container (an API dict, snake_case dict or model) asks for an extended
    resource, through which a device plugin may hand it a device: its env is the plugin's
    business, not ours."""
    resources = _field(container, "resources", "resources") or {}
    for part in ("limits", "requests"):
        asked = _field(resources, part, part) or {}
        if any("/" in str(k) and k not in _SHAPE_ONLY for k in asked):
            return True
    return False


def hide_devices(container: Any) -> Any:
    """A copy of a container holding no device with NO_DEVICES_ENV entries for the variables
    it does not set itself (one that does made its own choice); others as they are."""
    if holds_device(container):
        return container
    env = list(_field(container, "env", "env") or [])
    have = {str(_field(e, "name", "name")) for e in env}
    missing = [(k, v) for k, v in NO_DEVICES_ENV.items() if k not in have]
    if not missing:
        return container
    out = copy.deepcopy(container)
    if isinstance(out, Mapping):
        out = dict(out)
        out["env"] = env + [{"name": k, "value": v} for k, v in missing]
        return out
    # a kubernetes(_asyncio) model (z2jh's block-cloud-metadata): its own V1EnvVar class
    models = importlib.import_module(type(out).__module__.rsplit(".", 1)[0])
    out.env = copy.deepcopy(env) + [models.V1EnvVar(name=k, value=v) for k, v in missing]
    return out
