"""The Kubernetes REST API subset kubernetes_asyncio, kubespawner and kubectl use."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any

from tornado import iostream, web
from tornado.log import access_log

from .selectors import SelectorError, parse_field_selector, parse_label_selector
from .store import KINDS, SHORT_NAMES, ApiError
from .tables import table, wants_table

if TYPE_CHECKING:
    from .cluster import DevCluster

VERSION = {
    "major": "1",
    "minor": "33",
    "gitVersion": "v1.33.0-devcluster",
    "gitCommit": "devcluster",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.24",
    "compiler": "gc",
    "platform": "linux/amd64",
}
_VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]


def resource_list() -> dict[str, Any]:
    return {
        "kind": "APIResourceList",
        "groupVersion": "v1",
        "resources": [
            {
                "name": plural,
                "singularName": kind.lower(),
                "namespaced": namespaced,
                "kind": kind,
                "verbs": _VERBS,
                **({"shortNames": SHORT_NAMES[plural]} if plural in SHORT_NAMES else {}),
            }
            for plural, (kind, namespaced) in KINDS.items()
        ]
        + [
            {
                "name": "pods/log",
                "singularName": "",
                "namespaced": True,
                "kind": "Pod",
                "verbs": ["get"],
            }
        ],
    }


class Base(web.RequestHandler):
    cluster: DevCluster

    def initialize(self, cluster: DevCluster) -> None:
        self.cluster = cluster

    def check_xsrf_cookie(self) -> None:
        return None

    def write_json(self, obj: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(obj if isinstance(obj, bytes) else json.dumps(obj))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None))[1]
        if isinstance(exc, ApiError):
            self.write_json(exc.status(), exc.code)
            return
        message = getattr(exc, "log_message", None) or self._reason
        self.write_json(ApiError(status_code, "InternalError", str(message)).status(), status_code)

    async def _handle(self, fn: Any, *args: Any) -> None:
        try:
            result = fn(*args)
            if asyncio.iscoroutine(result):
                result = await result
        except ApiError as exc:
            self.write_json(exc.status(), exc.code)
            return
        except SelectorError as exc:
            self.write_json(ApiError(400, "BadRequest", str(exc)).status(), 400)
            return
        if result is not None:
            self.write_json(result, 201 if self.request.method == "POST" else 200)

    def body_json(self) -> Any:
        try:
            return json.loads(self.request.body or b"null")
        except ValueError as exc:
            raise ApiError(400, "BadRequest", f"invalid JSON body: {exc}") from None


class Discovery(Base):
    def get(self, what: str) -> None:
        if what == "version":
            self.write_json(VERSION)
        elif what == "api":
            self.write_json(
                {
                    "kind": "APIVersions",
                    "versions": ["v1"],
                    "serverAddressByClientCIDRs": [
                        {"clientCIDR": "0.0.0.0/0", "serverAddress": self.request.host}
                    ],
                }
            )
        elif what == "apis":
            self.write_json({"kind": "APIGroupList", "apiVersion": "v1", "groups": []})
        elif what == "api/v1":
            self.write_json(resource_list())
        elif what in ("healthz", "readyz", "livez"):
            self.finish("ok")
        else:
            raise web.HTTPError(404)


class Collection(Base):
    """/api/v1/{plural} and /api/v1/namespaces/{ns}/{plural}: list, watch, create."""

    async def get(self, namespace: str | None, plural: str) -> None:
        await self._handle(self._get, namespace, plural)

    async def _get(self, namespace: str | None, plural: str) -> Any:
        if plural not in KINDS:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        labels = parse_label_selector(self.get_argument("labelSelector", None))
        fields = parse_field_selector(self.get_argument("fieldSelector", None), plural)

        def matches(obj: Any) -> bool:
            return labels((obj.get("metadata") or {}).get("labels") or {}) and fields(obj)

        if self.get_argument("watch", "false").lower() in ("true", "1"):
            await self._watch(namespace, plural, matches)
            return None
        store = self.cluster.store
        if wants_table(self.request.headers.get("Accept")):  # kubectl get
            objects = [e.obj for e in store.entries(plural, namespace) if matches(e.obj)]
            return table(plural, objects, str(store.rv))
        return store.list_raw(plural, namespace, matches)

    async def _watch(self, namespace: str | None, plural: str, matches: Any) -> None:
        store = self.cluster.store
        try:
            w = store.watch(plural, namespace, matches, self.get_argument("resourceVersion", None))
        except ApiError as exc:
            if exc.code != 410:
                raise
            # like the apiserver's watch cache: once the version parsed, an error is one ERROR
            # event on a 200 stream, then the end (k8s.io/apiserver cacher.go, newErrWatcher)
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps({"type": "ERROR", "object": exc.status()}).encode() + b"\n")
            return
        as_table = wants_table(self.request.headers.get("Accept"))  # kubectl get -w
        timeout = float(self.get_argument("timeoutSeconds", "1800") or 1800)
        bookmarks = self.get_argument("allowWatchBookmarks", "false").lower() == "true"
        self.set_header("Content-Type", "application/json")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            await self.flush()
            while True:
                left = deadline - loop.time()
                if left <= 0:
                    break
                try:
                    line = await asyncio.wait_for(
                        w.queue.get(), timeout=min(left, self.cluster.bookmark_interval)
                    )
                except asyncio.TimeoutError:
                    if bookmarks:
                        kind = KINDS[plural][0]
                        line = (
                            json.dumps(
                                {
                                    "type": "BOOKMARK",
                                    "object": {
                                        "kind": kind,
                                        "apiVersion": "v1",
                                        "metadata": {"resourceVersion": str(store.rv)},
                                    },
                                }
                            ).encode()
                            + b"\n"
                        )
                    else:
                        continue
                if line is None:
                    break
                # write what is already queued in one go (a fresh watch of 20,000 pods is
                # 20,000 events at once): one flush per batch, not per event
                lines = [line]
                while not w.queue.empty() and len(lines) < 1000 and lines[-1] is not None:
                    lines.append(w.queue.get_nowait())
                ended = lines[-1] is None
                for item in lines[:-1] if ended else lines:
                    self.write(_table_event(plural, item) if as_table else item)
                await self.flush()
                if ended:
                    break
        except iostream.StreamClosedError:
            pass
        finally:
            store.watches.discard(w)
        if not self._finished:
            self.finish()

    async def post(self, namespace: str | None, plural: str) -> None:
        if plural not in KINDS:
            raise web.HTTPError(404)
        await self._handle(lambda: self.cluster.create(plural, namespace, self.body_json()))


def _table_event(plural: str, line: bytes) -> bytes:
    event = json.loads(line)
    obj = event["object"]
    if event["type"] not in ("BOOKMARK", "ERROR"):
        rv = obj["metadata"].get("resourceVersion", "")
        event["object"] = table(plural, [obj], rv)
    return json.dumps(event).encode() + b"\n"


class Item(Base):
    """/api/v1/{plural}/{name} and /api/v1/namespaces/{ns}/{plural}/{name}."""

    async def get(self, namespace: str | None, plural: str, name: str) -> None:
        def read() -> Any:
            obj = self.cluster.store.get(plural, namespace, name)
            if wants_table(self.request.headers.get("Accept")):
                return table(plural, [obj], obj["metadata"]["resourceVersion"])
            return obj

        await self._handle(read)

    async def delete(self, namespace: str | None, plural: str, name: str) -> None:
        def grace() -> float | None:
            body = self.body_json() if self.request.body else None
            value = self.get_argument("gracePeriodSeconds", None)
            if value is None and isinstance(body, dict):
                value = body.get("gracePeriodSeconds")
            return None if value is None else float(value)

        await self._handle(lambda: self.cluster.delete(plural, namespace, name, grace()))

    async def patch(self, namespace: str | None, plural: str, name: str) -> None:
        content_type = self.request.headers.get("Content-Type", "application/merge-patch+json")
        await self._handle(
            lambda: self.cluster.patch(plural, namespace, name, self.body_json(), content_type)
        )

    async def put(self, namespace: str | None, plural: str, name: str) -> None:
        def replace() -> Any:
            current = self.cluster.store.get(plural, namespace, name)
            return self.cluster.patch(
                plural,
                namespace,
                name,
                {
                    **{k: None for k in current if k not in ("metadata", "kind", "apiVersion")},
                    **self.body_json(),
                },
                "application/merge-patch+json",
            )

        await self._handle(replace)


class PodLog(Base):
    """GET .../pods/{name}/log: the container's output (`kubectl logs [-f] [--tail N]`)."""

    async def get(self, namespace: str, name: str) -> None:
        try:
            self.cluster.store.get("pods", namespace, name)
            tail = self.get_argument("tailLines", None)
            tail_lines = int(tail) if tail else None
        except ApiError as exc:
            self.write_json(exc.status(), exc.code)
            return
        except ValueError:
            self.write_json(ApiError(400, "BadRequest", "tailLines: not a number").status(), 400)
            return
        path = self.cluster.kubelet.pod_dir(namespace, name) / "container.log"
        data = path.read_bytes() if path.exists() else b""
        if tail_lines is not None:
            data = b"".join(data.splitlines(keepends=True)[-tail_lines:] if tail_lines else [])
        self.set_header("Content-Type", "text/plain")
        if self.get_argument("follow", "false").lower() not in ("true", "1"):
            self.finish(data)
            return
        # follow: keep sending what the process writes while it runs
        offset = path.stat().st_size if path.exists() else 0
        try:
            self.write(data)
            await self.flush()
            while (namespace, name) in self.cluster.kubelet.running or offset < _size(path):
                if offset < _size(path):
                    with open(path, "rb") as f:
                        f.seek(offset)
                        chunk = f.read()
                    offset += len(chunk)
                    self.write(chunk)
                    await self.flush()
                else:
                    await asyncio.sleep(0.2)
        except iostream.StreamClosedError:
            return
        self.finish()


def _size(path: Any) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


class NamespaceItem(Item):
    """/api/v1/namespaces/{name}: the namespace object itself."""

    async def get(self, name: str) -> None:  # type: ignore[override]
        await super().get(None, "namespaces", name)

    async def delete(self, name: str) -> None:  # type: ignore[override]
        await super().delete(None, "namespaces", name)

    async def patch(self, name: str) -> None:  # type: ignore[override]
        await super().patch(None, "namespaces", name)


def _log_request(handler: web.RequestHandler) -> None:
    """Server errors as warnings; 404s and 409s are ordinary answers here, so only at debug."""
    status = handler.get_status()
    level = logging.WARNING if status >= 500 else logging.DEBUG
    request = handler.request
    access_log.log(level, "%d %s %s", status, request.method, request.uri)


def make_app(cluster: DevCluster) -> web.Application:
    plurals = "|".join(KINDS)
    args = {"cluster": cluster}
    return web.Application(
        [
            (r"/(version|api|apis|api/v1|healthz|readyz|livez)/?", Discovery, args),
            (r"/api/v1/namespaces/([^/]+)/pods/([^/]+)/log", PodLog, args),
            (rf"/api/v1/namespaces/([^/]+)/({plurals})/([^/]+)", Item, args),
            (rf"/api/v1/namespaces/([^/]+)/({plurals})", Collection, args),
            (r"/api/v1/namespaces/([^/]+)", NamespaceItem, args),
            (rf"/api/v1/()({plurals})/([^/]+)", Item, args),
            (rf"/api/v1/()({plurals})", Collection, args),
        ],
        log_function=_log_request,
    )
