"""What the webhook reads from the Kubernetes API: a namespace's labels and annotations (its
access rule), every pod through one watch (the GPU-equivalents they hold: quota.PodIndex), and
the quota reservation records it writes (a ConfigMap per namespace, conditional on its
resourceVersion). kubernetes_asyncio, raw JSON."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from typing import Any

from kubernetes_asyncio import client, config

from ..capacity.rawwatch import watch_once
from ..k8s.forbidden import Answer, refused
from .quota import PodIndex

log = logging.getLogger("fracspawner.webhook")


class ApiUnavailable(Exception):
    """The API server could not be asked; a slice pod is then refused (unknown is never
    allowed)."""


ConfigException = config.ConfigException


#: what in the chart grants the webhook's calls (rbac.yaml, webhook.enabled)
WEBHOOK_GRANT = (
    "the chart's webhook ClusterRole grants get on namespaces and list and watch on pods (with "
    "dra.enabled also resourceclaims, and resourceclaimtemplates get, create and update), its "
    "webhook Role in the release namespace get, create and update on configmaps: check that "
    "rbac.create is true and that they and their bindings are installed as the chart renders "
    "them"
)


def forbidden_words(answer: object, needs: str) -> str | None:
    """For a 403 the admin's words (the apiserver's message, the account, what grants it)."""
    return refused(answer, component="the webhook", needs=needs, grant=lambda _: WEBHOOK_GRANT)


async def _fetch(call: Any, timeout: float, *args: Any, **kwargs: Any) -> tuple[int, bytes]:
    """(status, raw body) of one API call; ApiUnavailable when it could not be made. A 403 is
    logged in words: the tenant's refusal says only that the API answered 403."""
    try:
        response = await call(*args, _preload_content=False, _request_timeout=timeout, **kwargs)
        status, body = response.status, await response.read()
    except Exception as exc:  # connection refused, TLS, timeout: all mean "cannot know"
        raise ApiUnavailable(f"the Kubernetes API is unavailable ({exc})") from exc
    words = forbidden_words(Answer(status, body), f"make {getattr(call, '__name__', 'a')} call")
    if words:
        log.warning("%s", words)
    return status, body


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
        status, body = await _fetch(call, self.timeout, *args, **kwargs)
        if status != 200:
            raise ApiUnavailable(f"the Kubernetes API answered {status}")
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

    async def pods_labelled(self, namespace: str, key: str, value: str) -> bool:
        """Whether a pod of `namespace` carries label key=value, read from the API server's
        storage (resourceVersion unset: a consistent read, kubernetes api-concepts
        "Semantics for get and list"), not from a cache or the watch."""
        found = await self._get(
            self._v1.list_namespaced_pod, namespace, label_selector=f"{key}={value}", limit=1
        )
        return bool(found.get("items"))

    def pod_watch(self, index: PodIndex) -> PodWatch:
        return PodWatch(self._v1, index, timeout=self.timeout)

    def records(self, namespace: str) -> ConfigMapRecords:
        return ConfigMapRecords(self._v1, namespace, timeout=self.timeout)


class PodWatch:
    """Every pod of the cluster (but finished ones) into a PodIndex: list, then watch from the
    list's resourceVersion; a watch that ends resumes, an error (410 Gone included) relists
    after a backoff as client-go's Reflector does (tools/cache/reflector.go), forever. While it
    is not current, `index.synced` is False and slice pods in quota namespaces are refused."""

    #: the API server drops pods leaving these phases from the watch (DELETED)
    SELECTOR = "status.phase!=Succeeded,status.phase!=Failed"

    def __init__(self, v1: Any, index: PodIndex, timeout: float = 5.0, max_backoff: float = 30.0):
        self._v1, self.index, self.timeout, self.max_backoff = v1, index, timeout, max_backoff
        self._task: asyncio.Task[None] | None = None
        self._synced = asyncio.Event()
        self.failures = 0

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task], timeout=5)
            self._task = None

    async def wait_synced(self, timeout: float) -> None:
        """Until the index is current; ApiUnavailable after `timeout` seconds."""
        if self.index.synced:
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._synced.wait()), timeout)
        except asyncio.TimeoutError:
            raise ApiUnavailable("the pod watch is not current") from None

    async def _list(self) -> str:
        response = await self._v1.list_pod_for_all_namespaces(
            field_selector=self.SELECTOR, _preload_content=False, _request_timeout=60
        )
        body = await response.read()
        if response.status != 200:
            refused = client.ApiException(status=response.status, reason=response.reason)
            refused.body = body  # the apiserver's Status: a 403 names what RBAC refused
            raise refused
        listing = json.loads(body)
        self.index.load(listing.get("items") or [])
        self._synced.set()
        return str((listing.get("metadata") or {}).get("resourceVersion") or "0")

    async def _watch(self, version: str) -> str:
        return await watch_once(
            self._v1.list_pod_for_all_namespaces,
            version,
            put=self.index.put,
            drop=self.index.drop,
            delivered=self._back,
            field_selector=self.SELECTOR,
            timeout_seconds=300,
            allow_watch_bookmarks=True,
            _request_timeout=330,  # silent much longer than the server's timeout: dead
        )

    async def _run(self) -> None:
        version: str | None = None
        while True:
            try:
                if version is None:
                    version = await self._list()
                version = await self._watch(version)
                self._back()  # ended by the server's timeout: a healthy watch
            except asyncio.CancelledError:
                raise
            except client.ApiException as exc:
                version = None
                if exc.status == 410:  # too old to resume from: relist now, no backoff
                    continue
                await self._lost(exc)
            except Exception as exc:  # connection lost, a bad answer: relist after a backoff
                version = None
                await self._lost(exc)

    def _back(self) -> None:
        """The watch delivers again: the backoff starts over (not on a list alone: a watch
        that is refused after every list must not relist in a tight loop)."""
        if self.failures:
            log.warning("watching pods again; quota counts are current")
            self.failures = 0

    async def _lost(self, exc: BaseException) -> None:
        """Not current any more: slice pods wait or are refused until a relist succeeds."""
        self.index.synced = False
        self._synced.clear()
        self.failures += 1
        delay = min(self.max_backoff, 0.8 * 2 ** (self.failures - 1))
        if self.failures == 1 or self.failures % 10 == 0:
            why = forbidden_words(exc, "list and watch pods in every namespace") or exc
            log.warning("cannot watch pods (%s); retrying in %.1f s", why, delay)
        await asyncio.sleep(delay * (1 + random.random() * 0.2))


class ConfigMapRecords:
    """quota.Records as ConfigMaps `fracspawner-quota.<profile namespace>` in the webhook's own
    namespace (tenants cannot edit them there), data key `reservations`."""

    KEY = "reservations"

    def __init__(self, v1: Any, namespace: str, timeout: float = 5.0) -> None:
        self._v1, self.namespace, self.timeout = v1, namespace, timeout

    @staticmethod
    def name(namespace: str) -> str:
        return f"fracspawner-quota.{namespace}"

    async def _call(self, call: Any, *args: Any, **kwargs: Any) -> tuple[int, dict[str, Any]]:
        status, body = await _fetch(call, self.timeout, *args, **kwargs)
        try:
            return status, json.loads(body)
        except ValueError:
            return status, {}

    async def read(self, namespace: str) -> tuple[str | None, str | None]:
        status, cm = await self._call(
            self._v1.read_namespaced_config_map, self.name(namespace), self.namespace
        )
        if status == 404:
            return None, None
        if status != 200:
            raise ApiUnavailable(f"reading the quota record answered {status}")
        return (cm.get("data") or {}).get(self.KEY), cm["metadata"]["resourceVersion"]

    async def write(self, namespace: str, text: str, version: str | None) -> bool:
        meta: dict[str, Any] = {
            "name": self.name(namespace),
            "namespace": self.namespace,
            "labels": {"app.kubernetes.io/managed-by": "fracspawner"},
        }
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
                "data": {self.KEY: text}}  # fmt: skip
        if version is None:
            status, answer = await self._call(
                self._v1.create_namespaced_config_map, self.namespace, body
            )
        else:
            meta["resourceVersion"] = version  # the precondition: 409 if written since
            status, answer = await self._call(
                self._v1.replace_namespaced_config_map, meta["name"], self.namespace, body
            )
        if status == 409:  # Conflict, or AlreadyExists for a create: read again
            return False
        if status not in (200, 201):
            raise ApiUnavailable(
                f"writing the quota record answered {status}: {answer.get('message', '')}"
            )
        return True
