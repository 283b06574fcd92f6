"""The Kubernetes REST API subset kubernetes_asyncio, kubespawner and kubectl use."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tornado import iostream, web
from tornado.log import access_log

from . import gc
from .admission import RequestInfo
from .podstream import PodStream
from .resources import Registry, Resource
from .selectors import SelectorError, parse_field_selector, parse_label_selector
from .store import ApiError
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


def _entry(resource: Resource) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": resource.plural,
        "singularName": resource.singular,
        "namespaced": resource.namespaced,
        "kind": resource.kind,
        "verbs": _VERBS,
    }
    if resource.short_names:
        entry["shortNames"] = list(resource.short_names)
    if resource.categories:
        entry["categories"] = list(resource.categories)
    return entry


def resource_list(registry: Registry, group: str = "", version: str = "v1") -> dict[str, Any]:
    """APIResourceList of one group version: what kubectl's discovery reads."""
    resources = []
    for resource in registry:
        if resource.group != group or version not in resource.versions:
            continue
        resources.append(_entry(resource))
        if resource.has_status(version):
            resources.append(
                {**_entry(resource), "name": f"{resource.plural}/status", "singularName": "",
                 "verbs": ["get", "patch", "update"]}
            )  # fmt: skip
            resources[-1].pop("shortNames", None)
            resources[-1].pop("categories", None)
    if not group:
        resources.append(
            {"name": "pods/log", "singularName": "", "namespaced": True, "kind": "Pod",
             "verbs": ["get"]}
        )  # fmt: skip
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": resources,
    }


def api_group(group: str, versions: list[str]) -> dict[str, Any]:
    listed = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"name": group, "versions": listed, "preferredVersion": listed[0]}


def at_version(resource: Resource, version: str, obj: Any) -> Any:
    """An object as the request's version shows it (a Status is left alone)."""
    if not isinstance(obj, dict) or obj.get("kind") != resource.kind:
        return obj
    return {**obj, "apiVersion": resource.api_version(version)}


class Base(web.RequestHandler):
    cluster: DevCluster

    def initialize(self, cluster: DevCluster) -> None:
        self.cluster = cluster

    def check_xsrf_cookie(self) -> None:
        return None

    def write_json(self, obj: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        for warning in getattr(self, "_info", RequestInfo()).warnings:
            # RFC 7234 warning headers, as the apiserver sends them (kubectl prints "Warning:")
            self.add_header("Warning", "299 - " + json.dumps(warning))
        self.finish(obj if isinstance(obj, bytes) else json.dumps(obj))

    def request_info(self) -> RequestInfo:
        """Who asks (Impersonate-User/-Group/-Uid, as `kubectl --as`; else an administrator:
        the devcluster authenticates nobody), dryRun and fieldValidation."""
        if not hasattr(self, "_info"):
            info = RequestInfo()
            user = self.request.headers.get("Impersonate-User")
            if user:
                groups = self.request.headers.get_list("Impersonate-Group")
                info.user = {"username": user, "groups": [*groups, "system:authenticated"]}
                uid = self.request.headers.get("Impersonate-Uid")
                if uid:
                    info.user["uid"] = uid
            info.dry_run = self.get_argument("dryRun", "") == "All"
            validation = self.get_argument("fieldValidation", "Warn") or "Warn"
            if validation not in ("Ignore", "Warn", "Strict"):
                raise ApiError(
                    400,
                    "BadRequest",
                    f"fieldValidation parameter unsupported: {validation}",
                )
            info.field_validation = validation
            self._info = info
        return self._info

    def resolve(self, group: str, version: str, plural: str) -> Resource:
        resource = self.cluster.store.resources.lookup(group, version, plural)
        if resource is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return resource

    def authorize(self, verb: str, resource: Resource, namespace: str | None) -> None:
        """403 for a verb `cluster.forbidden` withholds, worded as the apiserver's authorization
        filter words it (kubernetes/kubernetes staging/src/k8s.io/apiserver/pkg/endpoints/
        handlers/responsewriters/errors.go: Forbidden, forbiddenMessage; the Status is
        apimachinery's errors.NewForbidden: "<resource> is forbidden: <message>")."""
        if (verb, resource.plural) not in self.cluster.forbidden:
            return
        user = self.request_info().user.get("username", "")
        qualified = f"{resource.plural}.{resource.group}" if resource.group else resource.plural
        scope = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
        details = {"kind": resource.plural, **({"group": resource.group} if resource.group else {})}
        raise ApiError(
            403,
            "Forbidden",
            f'{qualified} is forbidden: User "{user}" cannot {verb} resource '
            f'"{resource.plural}" in API group "{resource.group}" {scope}',
            details,
        )

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
            groups = self.cluster.store.resources.groups()
            self.write_json(
                {
                    "kind": "APIGroupList",
                    "apiVersion": "v1",
                    "groups": [api_group(g, v) for g, v in groups.items()],
                }
            )
        elif what == "api/v1":
            self.write_json(resource_list(self.cluster.store.resources))
        elif what in ("healthz", "readyz", "livez"):
            self.finish("ok")
        else:
            raise web.HTTPError(404)


class Collection(Base):
    """/api/v1/{plural} and /api/v1/namespaces/{ns}/{plural}: list, watch, create."""

    async def get(self, namespace: str | None, plural: str) -> None:
        await self._handle(
            lambda: self.list_or_watch(self.resolve("", "v1", plural), "v1", namespace or None)
        )

    async def post(self, namespace: str | None, plural: str) -> None:
        await self._handle(
            lambda: self.create(self.resolve("", "v1", plural), "v1", namespace or None)
        )

    async def list_or_watch(self, resource: Resource, version: str, namespace: str | None) -> Any:
        watching = self.get_argument("watch", "false").lower() in ("true", "1")
        self.authorize("watch" if watching else "list", resource, namespace)
        key = resource.key
        labels = parse_label_selector(self.get_argument("labelSelector", None))
        fields = parse_field_selector(self.get_argument("fieldSelector", None), key)

        def matches(obj: Any) -> bool:
            return labels((obj.get("metadata") or {}).get("labels") or {}) and fields(obj)

        if watching:
            await self._watch(resource, version, namespace, matches)
            return None
        store = self.cluster.store
        if wants_table(self.request.headers.get("Accept")):  # kubectl get
            objects = [e.obj for e in store.entries(key, namespace) if matches(e.obj)]
            return table(key, objects, str(store.rv), resource, version)
        return store.list_raw(key, namespace, matches, version)

    async def create(self, resource: Resource, version: str, namespace: str | None) -> Any:
        created = await self.cluster.api_create(
            resource.key, version, namespace, self.body_json(), self.request_info()
        )
        return at_version(resource, version, created)

    async def _watch(
        self, resource: Resource, version: str, namespace: str | None, matches: Any
    ) -> None:
        store = self.cluster.store
        plural = resource.key
        api_version = resource.api_version(version)
        try:
            w = store.watch(
                plural, namespace, matches, self.get_argument("resourceVersion", None),
                api_version,
            )  # fmt: skip
        except ApiError as exc:
            if exc.code not in (410, 504):  # too old / too large a resourceVersion
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
                        line = (
                            json.dumps(
                                {
                                    "type": "BOOKMARK",
                                    "object": {
                                        "kind": resource.kind,
                                        "apiVersion": api_version,
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
                    self.write(_table_event(resource, version, item) if as_table else item)
                await self.flush()
                if ended:
                    break
        except iostream.StreamClosedError:
            pass
        finally:
            store.watches.discard(w)
        if not self._finished:
            self.finish()


def _table_event(resource: Resource, version: str, line: bytes) -> bytes:
    event = json.loads(line)
    obj = event["object"]
    if event["type"] not in ("BOOKMARK", "ERROR"):
        rv = obj["metadata"].get("resourceVersion", "")
        event["object"] = table(resource.key, [obj], rv, resource, version)
    return json.dumps(event).encode() + b"\n"


class Item(Base):
    """/api/v1/{plural}/{name} and /api/v1/namespaces/{ns}/{plural}/{name}."""

    async def get(self, namespace: str | None, plural: str, name: str) -> None:
        await self._handle(
            lambda: self.read(self.resolve("", "v1", plural), "v1", namespace or None, name)
        )

    async def delete(self, namespace: str | None, plural: str, name: str) -> None:
        await self._handle(
            lambda: self.remove(self.resolve("", "v1", plural), "v1", namespace or None, name)
        )

    async def patch(self, namespace: str | None, plural: str, name: str) -> None:
        await self._handle(
            lambda: self.change(self.resolve("", "v1", plural), "v1", namespace or None, name)
        )

    async def put(self, namespace: str | None, plural: str, name: str) -> None:
        await self._handle(
            lambda: self.replace(self.resolve("", "v1", plural), "v1", namespace or None, name)
        )

    def read(self, resource: Resource, version: str, namespace: str | None, name: str) -> Any:
        obj = self.cluster.store.get(resource.key, namespace, name)
        obj = {**obj, "apiVersion": resource.api_version(version)}
        if wants_table(self.request.headers.get("Accept")):
            return table(resource.key, [obj], obj["metadata"]["resourceVersion"], resource,
                         version)  # fmt: skip
        return obj

    async def remove(
        self, resource: Resource, version: str, namespace: str | None, name: str
    ) -> Any:
        body = self.body_json() if self.request.body else None
        value = self.get_argument("gracePeriodSeconds", None)
        if value is None and isinstance(body, dict):
            value = body.get("gracePeriodSeconds")
        grace = None if value is None else float(value)
        if isinstance(body, dict) and body.get("dryRun") == ["All"]:
            self.request_info().dry_run = True
        propagation = gc.propagation_policy(
            body if isinstance(body, dict) else None, self.get_argument("propagationPolicy", None)
        )
        deleted = await self.cluster.api_delete(
            resource.key, version, namespace, name, grace, self.request_info(), propagation
        )
        return at_version(resource, version, deleted)

    async def change(
        self,
        resource: Resource,
        version: str,
        namespace: str | None,
        name: str,
        subresource: str = "",
    ) -> Any:
        content_type = self.request.headers.get("Content-Type", "application/merge-patch+json")
        if "apply-patch" in content_type:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                "the devcluster does not support server-side apply (application/apply-patch)",
            )
        updated = await self.cluster.api_update(
            resource.key, version, namespace, name, self.request_info(),
            patch=self.body_json(), content_type=content_type, subresource=subresource,
        )  # fmt: skip
        return at_version(resource, version, updated)

    async def replace(
        self,
        resource: Resource,
        version: str,
        namespace: str | None,
        name: str,
        subresource: str = "",
    ) -> Any:
        updated = await self.cluster.api_update(
            resource.key, version, namespace, name, self.request_info(),
            body=self.body_json(), subresource=subresource,
        )  # fmt: skip
        return at_version(resource, version, updated)


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

    async def put(self, name: str) -> None:  # type: ignore[override]
        await super().put(None, "namespaces", name)


def openapi_v3_root(registry: Registry) -> dict[str, Any]:
    """/openapi/v3: one entry per group version, as the apiserver lists them."""
    versions = {("", "v1")} | {(r.group, v) for r in registry if r.group for v in r.versions}
    paths = {}
    for group, version in sorted(versions):
        where = f"apis/{group}/{version}" if group else "api/v1"
        paths[where] = {"serverRelativeURL": f"/openapi/v3/{where}"}
    return {"paths": paths}


def openapi_v3_spec(registry: Registry, group: str, version: str) -> dict[str, Any]:
    """A group version's OpenAPI v3 document, reduced to what kubectl reads before a write:
    each kind's PATCH operation, its `x-kubernetes-group-version-kind`, and the
    `fieldValidation` query parameter. kubectl then leaves validation to the server
    (`fieldValidation=Strict`) instead of downloading schemas to validate itself
    (k8s.io/cli-runtime resource/query_param_verifier_v3.go)."""
    prefix = f"/apis/{group}/{version}" if group else "/api/v1"
    params = [{"name": "fieldValidation", "in": "query", "schema": {"type": "string"}},
              {"name": "dryRun", "in": "query", "schema": {"type": "string"}}]  # fmt: skip
    paths = {}
    for resource in registry:
        if resource.group != group or version not in resource.versions:
            continue
        scope = "/namespaces/{namespace}" if resource.namespaced else ""
        gvk = {"group": group, "version": version, "kind": resource.kind}
        paths[f"{prefix}{scope}/{resource.plural}/{{name}}"] = {
            "patch": {
                "operationId": f"patch{resource.kind}",
                "x-kubernetes-group-version-kind": gvk,
                "parameters": params,
                "responses": {"200": {"description": "OK"}},
            }
        }
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": VERSION["gitVersion"]},
        "paths": paths,
    }


class OpenApiV3(Base):
    """/openapi/v3 and /openapi/v3/{api/v1|apis/<group>/<version>}."""

    def get(self, where: str | None = None) -> None:
        registry = self.cluster.store.resources
        if not where:
            self.write_json(openapi_v3_root(registry))
            return
        parts = where.strip("/").split("/")
        if parts == ["api", "v1"]:
            self.write_json(openapi_v3_spec(registry, "", "v1"))
        elif (
            len(parts) == 3
            and parts[0] == "apis"
            and parts[2] in (registry.groups().get(parts[1]) or [])
        ):
            self.write_json(openapi_v3_spec(registry, parts[1], parts[2]))
        else:
            raise web.HTTPError(404)


class GroupDiscovery(Base):
    """/apis/{group} (APIGroup) and /apis/{group}/{version} (APIResourceList)."""

    def get(self, group: str, version: str | None = None) -> None:
        versions = self.cluster.store.resources.groups().get(group)
        if not versions or (version and version not in versions):
            raise web.HTTPError(404)
        if version:
            self.write_json(resource_list(self.cluster.store.resources, group, version))
        else:
            self.write_json({"kind": "APIGroup", "apiVersion": "v1", **api_group(group, versions)})


def _method_not_allowed() -> ApiError:
    return ApiError(
        405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
    )


class GroupCollection(Collection):
    """/apis/{group}/{version}[/namespaces/{ns}]/{plural}."""

    def _scoped(self, group: str, version: str, namespace: str | None, plural: str) -> Resource:
        resource = self.resolve(group, version, plural)
        if namespace and not resource.namespaced:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return resource

    async def get(self, group: str, version: str, namespace: str | None, plural: str) -> None:  # type: ignore[override]
        await self._handle(
            lambda: self.list_or_watch(
                self._scoped(group, version, namespace, plural), version, namespace or None
            )
        )

    async def post(self, group: str, version: str, namespace: str | None, plural: str) -> None:  # type: ignore[override]
        def create() -> Any:
            resource = self._scoped(group, version, namespace, plural)
            if resource.namespaced and not namespace:
                raise _method_not_allowed()
            return self.create(resource, version, namespace)

        await self._handle(create)


class GroupItem(Item):
    """/apis/{group}/{version}[/namespaces/{ns}]/{plural}/{name}[/status]."""

    def _scoped(
        self, group: str, version: str, namespace: str | None, plural: str, sub: str | None
    ) -> Resource:
        resource = self.resolve(group, version, plural)
        if bool(namespace) != resource.namespaced or (sub and not resource.has_status(version)):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return resource

    async def _on_item(
        self,
        action: Callable[..., Any],
        group: str,
        version: str,
        namespace: str | None,
        plural: str,
        name: str,
        sub: str | None,
        **kwargs: Any,
    ) -> None:
        """`action(resource, version, namespace, name, **kwargs)` on the object this path names,
        answered as `_handle` answers."""
        await self._handle(
            lambda: action(
                self._scoped(group, version, namespace, plural, sub),
                version,
                namespace or None,
                name,
                **kwargs,
            )
        )

    async def get(
        self,
        group: str,
        version: str,
        namespace: str | None,
        plural: str,
        name: str,
        sub: str | None = None,
    ) -> None:  # type: ignore[override]  # noqa: E501
        await self._on_item(self.read, group, version, namespace, plural, name, sub)

    async def delete(
        self,
        group: str,
        version: str,
        namespace: str | None,
        plural: str,
        name: str,
        sub: str | None = None,
    ) -> None:  # type: ignore[override]  # noqa: E501
        if sub:  # a subresource takes no DELETE: 405 before the resource is looked up
            error = _method_not_allowed()
            self.write_json(error.status(), error.code)
            return
        await self._on_item(self.remove, group, version, namespace, plural, name, sub)

    async def patch(
        self,
        group: str,
        version: str,
        namespace: str | None,
        plural: str,
        name: str,
        sub: str | None = None,
    ) -> None:  # type: ignore[override]  # noqa: E501
        await self._on_item(
            self.change, group, version, namespace, plural, name, sub, subresource=sub or ""
        )

    async def put(
        self,
        group: str,
        version: str,
        namespace: str | None,
        plural: str,
        name: str,
        sub: str | None = None,
    ) -> None:  # type: ignore[override]  # noqa: E501
        await self._on_item(
            self.replace, group, version, namespace, plural, name, sub, subresource=sub or ""
        )


def _log_request(handler: web.RequestHandler) -> None:
    """Server errors as warnings; 404s and 409s are ordinary answers here, so only at debug."""
    status = handler.get_status()
    level = logging.WARNING if status >= 500 else logging.DEBUG
    request = handler.request
    access_log.log(level, "%d %s %s", status, request.method, request.uri)


def make_app(cluster: DevCluster) -> web.Application:
    plurals = "|".join(r.plural for r in cluster.store.resources if not r.group)
    args = {"cluster": cluster}
    seg = "([^/]+)"
    return web.Application(
        [
            (r"/(version|api|apis|api/v1|healthz|readyz|livez)/?", Discovery, args),
            (r"/api/v1/namespaces/([^/]+)/pods/([^/]+)/log", PodLog, args),
            (r"/api/v1/namespaces/([^/]+)/pods/([^/]+)/(exec|attach)", PodStream, args),
            (rf"/api/v1/namespaces/([^/]+)/({plurals})/([^/]+)", Item, args),
            (rf"/api/v1/namespaces/([^/]+)/({plurals})", Collection, args),
            (r"/api/v1/namespaces/([^/]+)", NamespaceItem, args),
            (rf"/api/v1/()({plurals})/([^/]+)", Item, args),
            (rf"/api/v1/()({plurals})", Collection, args),
            (r"/openapi/v3/?", OpenApiV3, args),
            (r"/openapi/v3/(.+)", OpenApiV3, args),
            # named groups: what the apiserver serves for built-in groups and for CRDs
            (rf"/apis/{seg}/?", GroupDiscovery, args),
            (rf"/apis/{seg}/{seg}/?", GroupDiscovery, args),
            (rf"/apis/{seg}/{seg}/namespaces/{seg}/{seg}/{seg}(?:/(status))?/?", GroupItem, args),
            (rf"/apis/{seg}/{seg}/namespaces/{seg}/{seg}/?", GroupCollection, args),
            (rf"/apis/{seg}/{seg}/(){seg}/{seg}(?:/(status))?/?", GroupItem, args),
            (rf"/apis/{seg}/{seg}/(){seg}/?", GroupCollection, args),
        ],
        log_function=_log_request,
    )
