"""What the webhook reads from the Kubernetes API: a namespace's labels and annotations (its
access rule) and its pods (the GPU-equivalents they hold). kubernetes_asyncio, raw JSON."""

from __future__ import annotations

import json
import time
from typing import Any

from kubernetes_asyncio import client, config


class ApiUnavailable(Exception):
    """The API server could not be asked; a slice pod is then refused (unknown is never
    allowed)."""


ConfigException = config.ConfigException


class Cluster:
    """Reads for admissions. Namespaces are cached for `namespace_ttl` seconds: their labels
    change rarely, and each admission otherwise costs two API calls instead of one."""

    def __init__(self, configuration: Any, namespace_ttl: float = 10.0, timeout: float = 5.0):
        self._api_client = client.ApiClient(configuration)
        self._v1 = client.CoreV1Api(self._api_client)
        self.namespace_ttl = namespace_ttl
        self.timeout = timeout
        self._namespaces: dict[str, tuple[float, dict[str, str], dict[str, str]]] = {}

    async def close(self) -> None:
        await self._api_client.close()

    async def _get(self, call: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        try:
            response = await call(
                *args, _preload_content=False, _request_timeout=self.timeout, **kwargs
            )
            body = await response.read()
        except Exception as exc:  # connection refused, TLS, timeout: all mean "cannot know"
            raise ApiUnavailable(f"the Kubernetes API is unavailable ({exc})") from exc
        if response.status != 200:
            raise ApiUnavailable(f"the Kubernetes API answered {response.status}")
        return json.loads(body)

    async def namespace(self, name: str) -> tuple[dict[str, str], dict[str, str]]:
        """(labels, annotations) of a namespace."""
        cached = self._namespaces.get(name)
        if cached and time.monotonic() - cached[0] < self.namespace_ttl:
            return cached[1], cached[2]
        ns = await self._get(self._v1.read_namespace, name)
        meta = ns.get("metadata") or {}
        labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
        self._namespaces[name] = (time.monotonic(), labels, annotations)
        return labels, annotations

    async def pods(self, namespace: str) -> list[dict[str, Any]]:
        """Every pod of the namespace, fresh from the API server (not a cache: a quota decision
        must see the pods admitted a moment ago)."""
        return (await self._get(self._v1.list_namespaced_pod, namespace)).get("items") or []
