"""The ResourceClaimTemplates of a DRA slice, made in the pod's namespace before its pod: by the
hub for a server (hub/spawner.py), by the Kubeflow webhook for a notebook it maps.

Why the hub makes them (and the chart only grants the role): the catalog is the hub's, so a
changed offer takes effect on the next spawn without a chart upgrade; with
`enable_user_namespaces` every user has a namespace the chart cannot know; and the template
the pod names is always the one the hub planned, checked quotas and capacity against. A
template is created if missing and replaced when its digest (`fracspawner.io/template-digest`,
backends/dra.py) differs from the plan's; a claim is a copy made when its pod is created
(kube-controller-manager's resourceclaim controller), so replacing a template never changes a
running server's claim. Two calls per DRA spawn at most (create, then read on 409), none per
form render.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from ..backends.dra import TEMPLATE_DIGEST

log = logging.getLogger(__name__)


class ClaimTemplateError(Exception):
    """A template could not be made; the message says which and what the role needs."""


def _digest(obj: Mapping[str, Any] | None) -> str | None:
    return ((obj or {}).get("metadata") or {}).get("annotations", {}).get(TEMPLATE_DIGEST)


def _status_reason(exc: Any) -> str:
    try:
        body = json.loads(getattr(exc, "body", "") or "{}")
        return str(body.get("message") or exc.reason)
    except (ValueError, TypeError):
        return str(getattr(exc, "reason", exc))


async def ensure_claim_templates(
    api_client: Any, namespace: str, templates: Iterable[Mapping[str, Any]]
) -> list[str]:
    """Create or update each template in `namespace`; the names made or changed."""
    from kubernetes_asyncio.client import ResourceV1Api
    from kubernetes_asyncio.client.exceptions import ApiException

    api = ResourceV1Api(api_client)
    changed: list[str] = []
    for template in templates:
        body = copy.deepcopy(dict(template))
        body["metadata"] = {**body["metadata"], "namespace": namespace}
        name = body["metadata"]["name"]
        try:
            try:
                await api.create_namespaced_resource_claim_template(namespace, body)
                changed.append(name)
                continue
            except ApiException as exc:
                if exc.status != 409:
                    raise
            current = await api.read_namespaced_resource_claim_template(
                name, namespace, _preload_content=False
            )
            existing = json.loads(await current.read())
            if _digest(existing) == _digest(body):
                continue
            body["metadata"]["resourceVersion"] = existing["metadata"].get("resourceVersion")
            await api.replace_namespaced_resource_claim_template(name, namespace, body)
            log.info("Updated ResourceClaimTemplate %s/%s to the catalog's", namespace, name)
            changed.append(name)
        except ApiException as exc:
            raise ClaimTemplateError(
                f"Cannot make the GPU claim template {name} in namespace {namespace}: "
                f"{exc.status} {_status_reason(exc)}. The service account needs get, "
                "create and update on resourceclaimtemplates (resource.k8s.io) there "
                "(the chart grants them with dra.enabled)."
            ) from None
    return changed
