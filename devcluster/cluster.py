"""DevCluster: the store, validation, the scheduler and the kubelet behind one HTTP API."""

from __future__ import annotations

import asyncio
import base64
import copy
import logging
import socket
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from . import (
    admission,
    crd,
    customresources,
    defaults,
    gc,
    jsonpatch,
    lifecycle,
    objectmeta,
    scheduler,
    strategicmerge,
)
from .admission import Admission, Attributes, RequestInfo
from .dra import controller as dra_controller
from .dra import kinds as dra_kinds
from .dra.controller import Dra
from .fielderrors import invalid, invalid_error
from .kubelet import ConfigError, Kubelet
from .network import make_network
from .probes import DEFAULT_BACKOFF
from .resources import CRDS, MUTATING, VALIDATING, Resource
from .store import ApiError, Store, now_iso
from .topology import load_topology
from .validation import kind_schema, validate
from .volumes import MountError

log = logging.getLogger("devcluster")

#: schedulerName values this stand-in schedules for. A real cluster runs these schedulers
#: beside the default one; here one scheduler plays all of them so the demo's pools work.
SERVED_SCHEDULERS = frozenset(
    {"", "default-scheduler", "hami-scheduler", "volcano", "kai-scheduler", "runai-scheduler"}
)

#: Kinds whose DELETE answers with the deleted object (their registry sets ReturnDeletedObject,
#: kubernetes pkg/registry/core/*/storage); the others answer with a Success Status.
RETURN_DELETED_OBJECT = frozenset(
    {"pods", "persistentvolumeclaims", "serviceaccounts", "services", "namespaces"}
)

#: namespaces the apiserver refuses to delete
PROTECTED_NAMESPACES = frozenset({"default", "kube-system", "kube-public"})


def secret_with_data(secret: dict[str, Any]) -> dict[str, Any]:
    """`stringData` folded into base64 `data`, as the apiserver stores a Secret."""
    if not secret.get("stringData"):
        secret.pop("stringData", None)
        return secret
    secret = dict(secret)
    data = dict(secret.get("data") or {})
    for key, value in secret.pop("stringData").items():
        data[key] = base64.b64encode(str(value).encode()).decode()
    secret["data"] = data
    return secret


def namespace_object(entry: str | Mapping[str, Any]) -> dict[str, Any]:
    """A topology's namespace: a name, or `{name, labels, annotations}` (a profile namespace
    labelled `app.kubernetes.io/part-of: kubeflow-profile`, say), labelled with its own name
    as the apiserver labels every namespace (kubernetes.io/metadata.name)."""
    if isinstance(entry, str):
        entry = {"name": entry}
    name = str(entry["name"])
    labels = {str(k): str(v) for k, v in (entry.get("labels") or {}).items()}
    labels["kubernetes.io/metadata.name"] = name
    annotations = {str(k): str(v) for k, v in (entry.get("annotations") or {}).items()}
    return {
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    }


def service_immutable_errors(current: Mapping[str, Any], updated: Mapping[str, Any]) -> list:
    """ValidateServiceUpdate: a ClusterIP once set stays (unless the type turns ExternalName)."""
    old = (current.get("spec") or {}).get("clusterIP")
    spec = updated.get("spec") or {}
    new = spec.get("clusterIP")
    if old and new and new != old and spec.get("type") != "ExternalName":
        return [invalid("spec.clusterIP", new, "field is immutable")]
    return []


def scheduler_of(pod: Mapping[str, Any]) -> str:
    """The scheduler that reports on a pod: the one it names (events' source.component)."""
    return (pod.get("spec") or {}).get("schedulerName") or "default-scheduler"


def pod_spec_update_allowed(current: Mapping[str, Any], updated: Mapping[str, Any]) -> None:
    """A pod's spec is immutable but for a few fields, as the apiserver enforces
    (pkg/apis/core/validation ValidatePodUpdate); 422 otherwise."""

    def mutable_removed(spec: Mapping[str, Any]) -> dict[str, Any]:
        # defaulted first: a topology's pods are stored as written, an update arrives defaulted
        spec = defaults.pod({"spec": copy.deepcopy(dict(spec))})["spec"]
        for field in ("activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds"):
            spec.pop(field, None)
        for group in ("containers", "initContainers"):
            for container in spec.get(group) or []:
                container.pop("image", None)
        return spec

    if mutable_removed(current.get("spec") or {}) != mutable_removed(updated.get("spec") or {}):
        name = current["metadata"]["name"]
        raise ApiError(
            422,
            "Invalid",
            f'Pod "{name}" is invalid: spec: Forbidden: pod updates may not change fields other '
            "than `spec.containers[*].image`,`spec.initContainers[*].image`,"
            "`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing "
            "tolerations),`spec.terminationGracePeriodSeconds`",
            {"name": name, "kind": "Pod", "causes": [{"field": "spec"}]},
        )


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (also what strategic merge does for labels/annotations)."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if key.startswith("$"):  # strategic-merge directives ($patch, $retainKeys): ignored
            continue
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _apply_patch(
    current: Mapping[str, Any], patch: Any, content_type: str, resource: Resource
) -> Any:
    """A PATCH body applied by its content type: JSON patch (RFC 6902; one that does not
    apply is a 422 worded like evanphx/json-patch's), strategic merge (built-in kinds only,
    as on the apiserver), else a JSON merge patch."""
    if "json-patch" in content_type:
        try:
            return jsonpatch.apply(current, patch)
        except jsonpatch.PatchError as exc:
            raise ApiError(422, "UnprocessableEntity", str(exc)) from None
    if "strategic-merge-patch" in content_type:
        if resource.custom:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media types "
                "include: application/json-patch+json, application/merge-patch+json, "
                "application/apply-patch+yaml",
            )
        schema, defs = kind_schema(resource.kind, resource.api_version())
        try:
            return strategicmerge.apply(current, patch, schema, defs)
        except strategicmerge.PatchError as exc:
            raise ApiError(422, "UnprocessableEntity", str(exc)) from None
    if not isinstance(patch, Mapping):
        raise ApiError(400, "BadRequest", "a merge patch must be a JSON object")
    return merge_patch(current, patch)


def _replacement(
    current: Mapping[str, Any], body: Any, resource: Resource, version: str
) -> dict[str, Any]:
    """A PUT's body as the new object (apiVersion and kind as the URL says where missing)."""
    if not isinstance(body, dict):
        raise ApiError(400, "BadRequest", "the body of the request was not a JSON object")
    updated = copy.deepcopy(body)
    if not resource.custom:
        updated.setdefault("apiVersion", resource.api_version(version))
        updated.setdefault("kind", resource.kind)
    name = (updated.get("metadata") or {}).get("name")
    if name and name != current["metadata"]["name"]:
        raise ApiError(
            400,
            "BadRequest",
            f"the name of the object ({name}) does not match the name on the URL "
            f"({current['metadata']['name']})",
        )
    return updated


def _names_version(request: Any) -> bool:
    """Whether a PUT body or a patch names a metadata.resourceVersion (a precondition)."""
    if isinstance(request, Mapping):
        return bool((request.get("metadata") or {}).get("resourceVersion"))
    if isinstance(request, list):
        return any(
            isinstance(op, Mapping) and op.get("path") == "/metadata/resourceVersion"
            for op in request
        )
    return False


def _conflict(plural: str, name: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {plural} "{name}": the object has been modified; '
        "please apply your changes to the latest version and try again",
        {"name": name, "kind": plural},
    )


class DevCluster:
    """A local Kubernetes stand-in: `async with DevCluster(topology) as cluster:`."""

    #: seconds of silence after which a watch that allows bookmarks gets one (the apiserver
    #: sends them about once a minute; shorter here so clients resume from recent versions)
    bookmark_interval: float = 10.0

    def __init__(
        self,
        topology: dict | str | Path,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        state_dir: Path | str = Path(".devcluster"),
        kubeconfig: Path | str | None = None,
        restart_backoff: tuple[float, float] = DEFAULT_BACKOFF,
        network: str | None = None,
    ) -> None:
        self.topology = load_topology(topology)
        self.host = host
        self.port = port
        self.state_dir = Path(state_dir).resolve()
        self.kubeconfig_path = Path(kubeconfig) if kubeconfig else self.state_dir / "kubeconfig"
        self.store = Store()
        self.admission = Admission(self.store)
        #: pod sandboxes, ClusterIPs, the Service proxy and the cluster DNS (devcluster/network.py);
        #: `network: namespaces` in the topology: a network namespace per pod, where root
        self.network = make_network(
            network or self.topology.get("network") or "host", self.state_dir, self._pods_in
        )
        self.kubelet = Kubelet(self.state_dir, self.topology.get("images") or {}, self.network)
        self.dra = Dra(self)  # Dynamic Resource Allocation: claims, allocation, slices
        self.gc = gc.GarbageCollector(
            self.store, self.delete, self._spawn, self._may_remove
        )  # ownerReferences: dependents follow their owners (devcluster/gc.py)
        self.served = SERVED_SCHEDULERS | set(self.topology.get("schedulers") or [])
        #: the kubelet's crash-loop back-off, (initial, maximum) seconds (devcluster/probes.py)
        self.restart_backoff = restart_backoff
        self._server: Any = None
        self._tasks: set[asyncio.Task] = set()
        self._reschedule = asyncio.Event()
        self._requests: dict[str, Mapping[str, Any]] = {}  # pod uid -> resource requests
        self._running_pods: set[tuple[str, str]] = set()  # pods whose _run_pod is under way
        self._scheduler_task: asyncio.Task | None = None
        #: (verb, plural) pairs, verb list or watch, refused 403 Forbidden as RBAC refuses a
        #: role without them: {("watch", "pods")} is one that may list pods but not watch them
        self.forbidden: set[tuple[str, str]] = set()
        self.url = ""

    # ---------------------------------------------------------------- lifecycle
    async def start(self) -> DevCluster:
        from tornado.httpserver import HTTPServer

        from .api import make_app
        from .kubeconfig import write_kubeconfig

        # resourceVersions go on from the last run in this state_dir, as etcd's revision
        # survives an apiserver restart: a client's old version is then older than anything
        # the new watch history holds (410, relist), never mistaken for a current one
        rv_file = self.state_dir / "resource-version"
        if rv_file.is_file() and rv_file.read_text().strip().isdigit():
            self.store.rv = max(self.store.rv, int(rv_file.read_text()))
        for ns in [
            "default",
            "kube-system",
            "kube-public",
            *(self.topology.get("namespaces") or []),
        ]:
            self.store.load("namespaces", namespace_object(ns))
        for node in self.topology["nodes"]:
            self.store.load("nodes", node)
        for pod in self.topology.get("pods") or []:
            self.store.load("pods", pod)
        self.dra.load_topology(self.topology)
        self.store.floor = self.store.rv
        self.state_dir.mkdir(parents=True, exist_ok=True)
        await self.network.start()
        sock = socket.socket()
        # a restart on the same port must not wait out TIME_WAIT (~60 s) of the connections
        # stop() closed: tests take the API away and back to show outage behaviour
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        sock.listen(128)
        sock.setblocking(False)
        self.port = sock.getsockname()[1]
        self._server = HTTPServer(make_app(self), idle_connection_timeout=3600)
        self._server.add_sockets([sock])
        self.url = f"http://{self.host}:{self.port}"
        write_kubeconfig(self.kubeconfig_path, self.url)
        self.store.listeners.append(self._on_change)
        self.store.listeners.append(self.gc.on_change)
        self._scheduler_task = asyncio.ensure_future(self._scheduler_loop())
        for limit in self.network.limitations():  # what this machine does not let it model
            log.info("devcluster does not model: %s", limit)
        return self

    async def stop(self) -> None:
        if self._scheduler_task:
            self._scheduler_task.cancel()
        for task in list(self._tasks):
            task.cancel()
        self.kubelet.kill_all()
        await self.network.stop()
        if self._server is not None:
            self._server.stop()
            await self._server.close_all_connections()
        for w in list(self.store.watches):
            w.queue.put_nowait(None)
        if self.state_dir.is_dir():
            (self.state_dir / "resource-version").write_text(f"{self.store.rv}\n")

    async def __aenter__(self) -> DevCluster:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ---------------------------------------------------------------- direct accessors
    def get(self, plural: str, namespace: str | None, name: str) -> dict[str, Any]:
        return copy.deepcopy(self.store.get(plural, namespace, name))

    def list(
        self, plural: str, ns: str | None = None, *, namespace: str | None = None
    ) -> list[dict[str, Any]]:
        """Copies of every stored object of a kind (in one namespace, or all)."""
        return [copy.deepcopy(e.obj) for e in self.store.entries(plural, ns or namespace)]

    def add_node(self, node: dict[str, Any]) -> dict[str, Any]:
        from .topology import normalise_node

        node = dict(node)
        dra = node.pop("dra", None)
        created = self.create("nodes", None, normalise_node(node))
        if dra:  # its DRA kubelet plugin publishes the node's devices
            self.dra.publish(created["metadata"]["name"], dra)
        return created

    def events_for(self, namespace: str, pod_name: str) -> list[dict[str, Any]]:
        return [
            copy.deepcopy(e.obj)
            for e in self.store.entries("events", namespace)
            if e.obj.get("involvedObject", {}).get("name") == pod_name
        ]

    # ---------------------------------------------------------------- API operations
    def create(self, plural: str, namespace: str | None, body: dict[str, Any]) -> dict[str, Any]:
        """Create without admission webhooks (the devcluster's own objects, add_node)."""
        resource = self.store.resources[plural]
        body = self._decode_create(resource, resource.storage, namespace, body, RequestInfo())
        self._validate(resource, resource.storage, body)
        return self._store_create(resource, namespace, body)

    async def api_create(
        self,
        plural: str,
        version: str,
        namespace: str | None,
        body: Any,
        info: RequestInfo,
    ) -> dict[str, Any]:
        """A create through the API: decoded, mutating webhooks, validated, validating
        webhooks, stored (or, for a dry run, not)."""
        resource = self.store.resources[plural]
        body = self._decode_create(resource, version, namespace, body, info)
        if plural == CRDS:
            info.warnings.extend(crd.unsupported(body))
        meta = body["metadata"]
        attrs = Attributes(
            "CREATE", resource, version, meta.get("namespace", ""), meta.get("name", ""),
            body, None, info,
        )  # fmt: skip
        body = await self.admission.mutate(attrs, lambda o: self._redefault(resource, version, o))
        self._validate(resource, version, body)
        attrs.object = body
        await self.admission.validate(attrs)
        if resource.key not in self.store.resources:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if info.dry_run:
            return self.store.new_object(plural, namespace, self._before_store(resource, body))
        return self._store_create(resource, namespace, body)

    def _decode_create(
        self,
        resource: Resource,
        version: str,
        namespace: str | None,
        body: Any,
        info: RequestInfo,
    ) -> dict[str, Any]:
        """The object as the apiserver has it before admission: decoded, defaulted, in an
        existing namespace that is not terminating (NamespaceLifecycle)."""
        plural = resource.key
        if resource.custom:
            decoded = customresources.decode(
                resource, version, body, info.field_validation, info.warnings
            )
            body = customresources.for_create(resource, decoded)
        else:
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "the body of the request was not a JSON object")
            body = copy.deepcopy(body)
            body.setdefault("apiVersion", resource.api_version(version))
            body.setdefault("kind", resource.kind)
            if body["kind"] != resource.kind:
                raise ApiError(
                    400, "BadRequest", f"the body's kind {body['kind']} is not {resource.kind}"
                )
        meta = body.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise ApiError(400, "BadRequest", "metadata: not an object")
        if resource.namespaced:
            ns_name = namespace or meta.get("namespace") or "default"
            if meta.get("namespace") and namespace and meta["namespace"] != namespace:
                raise ApiError(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does not match the namespace sent "
                    "on the request",
                )
            ns = self.store.objects["namespaces"].get(("", ns_name))
            if ns is None:
                raise ApiError(
                    404,
                    "NotFound",
                    f'namespaces "{ns_name}" not found',
                    {"name": ns_name, "kind": "namespaces"},
                )
            if ns.obj["metadata"].get("deletionTimestamp") and plural != "events":
                raise ApiError(
                    403,
                    "Forbidden",
                    f"unable to create new content in namespace {ns_name} because it is being "
                    "terminated",
                    {"name": meta.get("name", ""), "kind": plural},
                )
            meta["namespace"] = ns_name
        else:
            meta.pop("namespace", None)
        if plural in ("pods", dra_kinds.RESOURCECLAIMS):  # status has its own writers
            body.pop("status", None)
        if plural == CRDS:
            body.pop("status", None)
            crd.set_defaults(body)
        if plural in (MUTATING, VALIDATING):
            admission.set_defaults(body, mutating=plural == MUTATING)
        return self._redefault(resource, version, body)

    def _redefault(self, resource: Resource, version: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Defaulting, as the apiserver applies it when it decodes an object (again after a
        mutating webhook's patch)."""
        plural = resource.key
        if resource.custom:
            customresources.coerce(resource, version, obj)
        if plural == "pods":
            defaults.pod(obj)
        if plural == "secrets":
            folded = secret_with_data(obj)
            if folded is not obj:  # a Secret with only `data` comes back as itself: keep it
                obj.clear()
                obj.update(folded)
        if plural == "namespaces":
            meta = obj.setdefault("metadata", {})
            if meta.get("name"):  # the apiserver labels every namespace with its own name
                meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = meta["name"]
        return obj

    def _validate(self, resource: Resource, version: str, obj: dict[str, Any]) -> None:
        """422 for what the apiserver refuses: the schema, then ObjectMeta, then each kind's
        own rules."""
        plural = resource.key
        if resource.custom:
            customresources.check(resource, version, obj)
            return
        validate(
            {k: v for k, v in obj.items() if k != "status"} if plural == "pods" else obj,
            required=plural not in (CRDS, MUTATING, VALIDATING),
        )
        name = (obj.get("metadata") or {}).get("name", "")
        errors = objectmeta.validate_metadata(plural, obj.get("metadata") or {})
        if plural == CRDS:
            errors += crd.errors(obj)
        elif plural in (MUTATING, VALIDATING):
            errors += admission.config_errors(obj, mutating=plural == MUTATING)
        elif plural in dra_kinds.KEYS:
            errors += dra_kinds.errors(plural, obj)
        elif plural == "pods":
            errors += dra_kinds.pod_errors(obj)  # its DRA claims (core validation)
        if errors:
            raise invalid_error(resource.kind, resource.group, name, errors)

    def _before_store(self, resource: Resource, body: dict[str, Any]) -> dict[str, Any]:
        """What the registry sets as it stores a new object (PrepareForCreate)."""
        if resource.key == "services":
            self.network.allocate(body, None)  # its ClusterIP
        if resource.key == "pods":
            body["status"] = {"phase": "Pending", "qosClass": scheduler.qos_class(body)}
        if resource.key == CRDS:
            body = crd.with_status(body)
        if resource.key == "namespaces":
            body.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
            body["status"] = {"phase": "Active"}
        return body

    def _store_create(
        self, resource: Resource, namespace: str | None, body: dict[str, Any]
    ) -> dict[str, Any]:
        plural = resource.key
        if plural == CRDS:
            self._check_crd_names(body)
        obj = self.store.create(plural, namespace, self._before_store(resource, body))
        if plural == CRDS:
            self.store.serve(crd.resource_of(obj))
        node = obj["spec"].get("nodeName") if plural == "pods" else None
        if node and ("", node) in self.store.objects["nodes"]:
            # created already bound (no scheduler involved): the node's kubelet just runs it
            self._bind(obj, node, scheduled_by=None)
            return self.store.get(plural, obj["metadata"]["namespace"], obj["metadata"]["name"])
        return obj

    def _check_crd_names(self, body: Mapping[str, Any]) -> None:
        """A CRD may not serve what a built-in kind serves already."""
        key = f"{body['spec']['names']['plural']}.{body['spec']['group']}"
        existing = self.store.resources.get(key)
        if existing is not None and not existing.custom:
            raise ApiError(
                409,
                "AlreadyExists",
                f"the resource {key} is built into the devcluster; a CRD cannot serve it",
            )

    def patch(
        self, plural: str, namespace: str | None, name: str, patch: Any, content_type: str
    ) -> dict[str, Any]:
        """A patch without admission webhooks, in the storage version."""
        current = self.store.get(plural, namespace, name)
        resource = self.store.resources[plural]
        updated = _apply_patch(current, patch, content_type, resource)
        self._check_version(plural, name, current, updated)
        updated = self._prepare_update(resource, resource.storage, current, updated, "")
        return self._store_update(resource, updated)

    async def api_update(
        self,
        plural: str,
        version: str,
        namespace: str | None,
        name: str,
        info: RequestInfo,
        *,
        patch: Any = None,
        content_type: str = "",
        body: Any = None,
        subresource: str = "",
    ) -> dict[str, Any]:
        """A PATCH (`patch`) or PUT (`body`) through the API: mutating webhooks, validation,
        validating webhooks, then stored if nothing else wrote the object meanwhile (else
        done again on the new version, as the apiserver's GuaranteedUpdate retries)."""
        resource = self.store.resources[plural]
        # a precondition only if the client named a resourceVersion (a patch leaves the
        # current one in place, which is no precondition)
        explicit = _names_version(body if body is not None else patch)
        if body is not None and resource.custom and not explicit:
            # a custom resource's strategy allows no unconditional update (apiextensions-apiserver
            # pkg/registry/customresource/strategy.go AllowUnconditionalUpdate false; the
            # message: apiserver pkg/registry/generic/registry/store.go Update)
            error = invalid("metadata.resourceVersion", 0, "must be specified for an update")
            raise invalid_error(resource.kind, resource.group, name, [error])
        for _ in range(8):
            del info.warnings[:]  # each attempt says its own
            current = self.store.get(plural, namespace, name)
            seen = current["metadata"]["resourceVersion"]
            view = {**current, "apiVersion": resource.api_version(version)}
            if body is not None:
                updated = _replacement(view, body, resource, version)
            else:
                updated = _apply_patch(view, patch, content_type, resource)
            self._check_version(plural, name, current, updated)
            if resource.custom:
                updated = customresources.decode(
                    resource, version, updated, info.field_validation, info.warnings
                )
            else:
                updated = self._redefault(resource, version, updated)
            if plural == CRDS:
                info.warnings[:] = crd.unsupported(updated)
            attrs = Attributes(
                "UPDATE", resource, version, namespace or "", name, updated, view, info,
                subresource,
            )  # fmt: skip
            updated = await self.admission.mutate(
                attrs, lambda o: self._redefault(resource, version, o)
            )
            updated = self._prepare_update(resource, version, current, updated, subresource)
            attrs.object = updated  # validating webhooks see what would be stored
            await self.admission.validate(attrs)
            latest = self.store.get(plural, namespace, name)
            if latest["metadata"]["resourceVersion"] != seen:
                if explicit:
                    raise _conflict(plural, name)
                continue  # written meanwhile: do it again on what is there now
            if info.dry_run:
                return updated
            return self._store_update(resource, updated)
        raise _conflict(plural, name)

    def _check_version(
        self, plural: str, name: str, current: Mapping[str, Any], updated: Any
    ) -> bool:
        """Optimistic concurrency: a write naming an older resourceVersion is a 409. True when
        the write named one."""
        if not isinstance(updated, dict):
            raise ApiError(400, "BadRequest", "the patched object is not a JSON object")
        wanted = (updated.get("metadata") or {}).get("resourceVersion")
        if wanted and wanted != current["metadata"]["resourceVersion"]:
            raise _conflict(plural, name)
        return bool(wanted)

    def _prepare_update(
        self,
        resource: Resource,
        version: str,
        current: Mapping[str, Any],
        updated: dict[str, Any],
        subresource: str,
    ) -> dict[str, Any]:
        """What the registry does on update (PrepareForUpdate, ValidateUpdate): fixed metadata
        kept, status kept where it has its own writer, the kind's immutable fields checked."""
        plural = resource.key
        meta = updated.setdefault("metadata", {})
        for fixed in ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp"):
            if fixed in current["metadata"]:
                meta[fixed] = current["metadata"][fixed]
        meta["resourceVersion"] = current["metadata"]["resourceVersion"]
        updated["apiVersion"] = resource.api_version()
        if plural == "pods":
            pod_spec_update_allowed(current, updated)
            # status belongs to the kubelet (its own subresource): a write here leaves it alone
            updated["status"] = copy.deepcopy(current.get("status") or {})
        if plural in (CRDS, "namespaces"):
            updated["status"] = copy.deepcopy(current.get("status") or {})
        if plural == dra_kinds.RESOURCECLAIMS:
            updated = dra_kinds.prepare_update(current, updated, subresource)
        if resource.custom:
            updated = customresources.for_update(resource, current, updated, subresource)
        if plural == "services":
            errors = service_immutable_errors(current, updated)
            if errors:
                raise invalid_error(resource.kind, resource.group, meta.get("name", ""), errors)
            self.network.allocate(updated, current)
        if plural == CRDS:
            errors = crd.immutable_errors(current, updated)
            if errors:
                raise invalid_error(resource.kind, resource.group, meta.get("name", ""), errors)
            crd.set_defaults(updated)
        if plural in (MUTATING, VALIDATING):
            admission.set_defaults(updated, mutating=plural == MUTATING)
        self._validate(resource, version, updated)
        if plural == CRDS:
            updated = crd.with_status(updated, current)
        return updated

    def _store_update(self, resource: Resource, updated: dict[str, Any]) -> dict[str, Any]:
        self.store.update(resource.key, updated)
        if resource.key == "nodes":
            self._reschedule.set()
        if resource.key == CRDS:
            self.store.serve(crd.resource_of(updated))
        return updated

    async def api_delete(
        self,
        plural: str,
        version: str,
        namespace: str | None,
        name: str,
        grace: float | None,
        info: RequestInfo,
        propagation: str | None = None,
    ) -> dict[str, Any]:
        """A delete through the API: webhooks for DELETE see the object as oldObject."""
        resource = self.store.resources[plural]
        current = self.store.get(plural, namespace, name)
        view = {**current, "apiVersion": resource.api_version(version)}
        attrs = Attributes("DELETE", resource, version, namespace or "", name, None, view, info)
        await self.admission.mutate(attrs)
        await self.admission.validate(attrs)
        if info.dry_run:
            return copy.deepcopy(current)
        return await self.delete(plural, namespace, name, grace, propagation)

    async def delete(
        self,
        plural: str,
        namespace: str | None,
        name: str,
        grace: float | None = None,
        propagation: str | None = None,
    ) -> dict[str, Any]:
        obj = self.store.get(plural, namespace, name)
        if plural == "namespaces":
            return await self._delete_namespace(obj)
        finalizers = gc.finalizers_for(obj, propagation)
        if plural != "pods" and finalizers:
            # finalizers keep it, being deleted, until they are gone (registry store.go Delete)
            return self.store.update(plural, gc.mark_deleting(obj, finalizers))
        if plural == "pods" and finalizers != (obj["metadata"].get("finalizers") or []):
            obj = copy.deepcopy(obj)
            obj["metadata"]["finalizers"] = finalizers
            self.store.update(plural, obj)
        if plural != "pods":
            removed = self.store.remove(plural, namespace, name)
            if plural == CRDS:
                # the apiserver's CRD finalizer deletes every custom resource, then the CRD
                spec = removed["spec"]
                self.store.unserve(f"{spec['names']['plural']}.{spec['group']}")
            resource = self.store.resources.get(plural)
            if plural in RETURN_DELETED_OBJECT or (resource is not None and resource.custom):
                return removed
            return {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "details": {"name": name, "kind": plural, "uid": removed["metadata"]["uid"]},
            }
        if grace is None:
            grace = obj["spec"].get("terminationGracePeriodSeconds", 30)
        running = (obj["metadata"].get("namespace"), name) in self.kubelet.running
        if not running or grace == 0:
            await self.kubelet.stop(obj["metadata"]["namespace"], name, 0)
            return self._pod_stopped(namespace or "", name)
        if not obj["metadata"].get("deletionTimestamp"):
            obj = copy.deepcopy(obj)
            obj["metadata"]["deletionTimestamp"] = now_iso()
            obj["metadata"]["deletionGracePeriodSeconds"] = int(grace)
            self.store.update("pods", obj)
            container = obj["spec"]["containers"][0]["name"]
            self.event(obj, "Normal", "Killing", f"Stopping container {container}", "kubelet")
            self._spawn(self._terminate(obj["metadata"]["namespace"], name, grace))
        return obj

    async def _delete_namespace(self, ns: dict[str, Any]) -> dict[str, Any]:
        """Terminating, then everything in it deleted (pods at once), then the namespace."""
        name = ns["metadata"]["name"]
        if name in PROTECTED_NAMESPACES:
            raise ApiError(
                403,
                "Forbidden",
                f'namespaces "{name}" is forbidden: this namespace may not be deleted',
                {"name": name, "kind": "namespaces"},
            )
        if not ns["metadata"].get("deletionTimestamp"):
            ns = copy.deepcopy(ns)
            ns["metadata"]["deletionTimestamp"] = now_iso()
            ns.setdefault("status", {})["phase"] = "Terminating"
            self.store.update("namespaces", ns)
            self._spawn(self._finalize_namespace(name))
        return ns

    async def _finalize_namespace(self, name: str) -> None:
        for resource in self.store.resources:
            if not resource.namespaced:
                continue
            plural = resource.key
            for entry in list(self.store.entries(plural, name)):
                member = entry.obj["metadata"]["name"]
                if plural == "pods":
                    await self.kubelet.stop(name, member, 0)
                try:
                    self.store.remove(plural, name, member)
                except ApiError:
                    pass
        try:
            self.store.remove("namespaces", None, name)
        except ApiError:
            pass

    async def _terminate(self, namespace: str, name: str, grace: float) -> None:
        await self.kubelet.stop(namespace, name, grace)
        try:
            self._pod_stopped(namespace, name)
        except ApiError:
            pass

    def _pod_stopped(self, namespace: str, name: str) -> dict[str, Any]:
        """A deleted pod whose containers stopped goes, unless finalizers keep it (then the
        garbage collector removes it when the last one is removed)."""
        obj = self.store.get("pods", namespace, name)
        if not obj["metadata"].get("finalizers"):
            return self.store.remove("pods", namespace, name)
        if obj["metadata"].get("deletionTimestamp"):
            return obj
        return self.store.update("pods", gc.mark_deleting(obj, obj["metadata"]["finalizers"]))

    def _may_remove(self, plural: str, obj: Mapping[str, Any]) -> bool:
        """Whether a deleting object without finalizers may go now: a pod once stopped."""
        if plural != "pods":
            return True
        key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
        return key not in self.kubelet.running

    # ---------------------------------------------------------------- scheduling
    def _pod_requests(self, pod: Mapping[str, Any]) -> Mapping[str, Any]:
        uid = pod["metadata"]["uid"]
        cached = self._requests.get(uid)
        if cached is None:
            cached = self._requests[uid] = scheduler.pod_requests(pod)
        return cached

    def _on_change(self, plural: str, kind: str, obj: dict[str, Any]) -> None:
        if plural == "pods" and kind == "DELETED":
            self._requests.pop(obj["metadata"]["uid"], None)
        self.dra.on_change(plural, kind, obj)
        if plural == "services":
            self._spawn(self.network.on_service(kind, copy.deepcopy(obj)))
        if plural in ("secrets", "configmaps") and kind != "DELETED":
            self._retry_config_errors(obj["metadata"]["namespace"])
        if plural == "pods" and (
            kind == "DELETED"
            or not obj["spec"].get("nodeName")
            # a finished pod no longer holds its resources: waiting pods may fit now
            or (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed")
        ):
            self._reschedule.set()
        elif plural == "nodes":
            self._reschedule.set()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _scheduler_loop(self) -> None:
        while True:
            await self._reschedule.wait()
            self._reschedule.clear()
            try:
                self.schedule_pending()
            except Exception:
                log.exception("scheduling failed")
            await asyncio.sleep(0.05)

    def schedule_pending(self) -> None:
        pods = [e.obj for e in self.store.entries("pods", None)]
        pending = [
            p
            for p in pods
            if not p["spec"].get("nodeName")
            and p["status"].get("phase") == "Pending"
            and not p["metadata"].get("deletionTimestamp")
            and p["spec"].get("schedulerName", "") in self.served
        ]
        if not pending:
            return
        nodes = [e.obj for e in self.store.entries("nodes", None)]
        usage = scheduler.usage_by_node(pods, self._pod_requests)
        # the store keeps pods in creation order: first come, first served, higher priority first
        for pod in sorted(pending, key=lambda p: -int(p["spec"].get("priority") or 0)):
            claims, check = None, None
            if pod["spec"].get("resourceClaims"):
                claims, why = self.dra.prefilter(pod)
                if claims is None:
                    if why:
                        self._unschedulable(pod, f"0/{len(nodes)} nodes are available: {why}.")
                    continue  # waits for its claims (PreEnqueue), no event
                check = self.dra.filter_for(pod, claims)
            post = dra_controller.POST_FILTER if check else ""
            node, message = scheduler.schedule(pod, nodes, usage, check, post)
            if node is None:
                self._unschedulable(pod, message)
                continue
            if check is not None and claims is not None:
                self.dra.reserve(pod, node, claims, check)
            node_use = usage.setdefault(node, {})
            for k, v in self._pod_requests(pod).items():
                node_use[k] = node_use.get(k, 0) + v
            node_use["pods"] = node_use.get("pods", 0) + 1
            self._bind(pod, node, scheduler_of(pod))

    def _condition(self, pod: dict[str, Any], type_: str, status: str, **extra: str) -> None:
        conditions = [c for c in pod["status"].get("conditions") or [] if c["type"] != type_]
        conditions.append(
            {"type": type_, "status": status, "lastTransitionTime": now_iso(), **extra}
        )
        pod["status"]["conditions"] = conditions

    def _unschedulable(self, pod: dict[str, Any], message: str) -> None:
        current = next(
            (c for c in pod["status"].get("conditions") or [] if c["type"] == "PodScheduled"), {}
        )
        if current.get("message") == message:
            return  # nothing new to say
        pod = copy.deepcopy(pod)
        self._condition(pod, "PodScheduled", "False", reason="Unschedulable", message=message)
        self.store.update("pods", pod)
        self.event(pod, "Warning", "FailedScheduling", message, scheduler_of(pod))

    def event(
        self, pod: Mapping[str, Any], type_: str, reason: str, message: str, component: str
    ) -> None:
        meta = pod["metadata"]
        now = now_iso()
        self.store.create(
            "events",
            meta["namespace"],
            {
                "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:16]}"},
                "involvedObject": {
                    "kind": "Pod",
                    "apiVersion": "v1",
                    "name": meta["name"],
                    "namespace": meta["namespace"],
                    "uid": meta["uid"],
                },
                "reason": reason,
                "message": message,
                "type": type_,
                "source": {"component": component},
                "reportingComponent": component,
                "firstTimestamp": now,
                "lastTimestamp": now,
                "count": 1,
            },
        )

    def _bind(self, pod: dict[str, Any], node: str, scheduled_by: str | None) -> None:
        pod = copy.deepcopy(pod)
        pod["spec"]["nodeName"] = node
        pod["status"]["hostIP"] = "127.0.0.1"
        pod["status"]["hostIPs"] = [{"ip": "127.0.0.1"}]
        self._condition(pod, "PodScheduled", "True")
        self.store.update("pods", pod)
        meta = pod["metadata"]
        if scheduled_by:
            message = f"Successfully assigned {meta['namespace']}/{meta['name']} to {node}"
            self.event(pod, "Normal", "Scheduled", message, scheduled_by)
        self._spawn(self._run_pod(meta["namespace"], meta["name"]))

    # ---------------------------------------------------------------- kubelet
    def _retry_config_errors(self, namespace: str) -> None:
        """Start again the containers that waited for a secret or config map (the kubelet
        retries CreateContainerConfigError)."""
        for entry in list(self.store.entries("pods", namespace)):
            pod = entry.obj
            statuses = pod["status"].get("containerStatuses") or []
            waiting = statuses and (statuses[0].get("state") or {}).get("waiting") or {}
            key = (namespace, pod["metadata"]["name"])
            if (
                waiting.get("reason") in ("CreateContainerConfigError", "ContainerCreating")
                and key not in self._running_pods
            ):
                self._spawn(self._run_pod(*key))

    def _pods_in(self, namespace: str) -> list[dict[str, Any]]:
        """The namespace's stored pods (the Service proxy's and the DNS's endpoints)."""
        return [e.obj for (ns, _), e in self.store.objects["pods"].items() if ns == namespace]

    def _lookup(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        entry = self.store.objects[plural].get((namespace, name))
        return entry.obj if entry else None

    def _current(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return copy.deepcopy(self.store.get("pods", namespace, name))
        except ApiError:
            return None

    async def _run_pod(self, namespace: str, name: str) -> None:
        key = (namespace, name)
        if key in self._running_pods or key in self.kubelet.running:
            return
        self._running_pods.add(key)
        try:
            await self._run_pod_once(namespace, name)
        finally:
            self._running_pods.discard(key)

    def _container_waits(
        self,
        namespace: str,
        name: str,
        container: Mapping[str, Any],
        waiting: dict[str, str],
        event_reason: str,
        event_message: str,
    ) -> None:
        """The pod's container did not start and waits (`waiting`: reason, message), with the
        kubelet's Warning event; nothing if the pod is gone meanwhile."""
        pod = self._current(namespace, name)
        if pod is None:
            return
        pod["status"]["containerStatuses"] = [
            lifecycle.container_status(container, {"waiting": waiting})
        ]
        self.store.update("pods", pod)
        self.event(pod, "Warning", event_reason, event_message, "kubelet")

    async def _run_pod_once(self, namespace: str, name: str) -> None:
        pod = self._current(namespace, name)
        if pod is None:
            return
        container = pod["spec"]["containers"][0]
        try:
            device_env = self.dra.claim_env(pod, container)
            running = await self.kubelet.start(pod, self._lookup, device_env)
        except MountError as exc:
            # the kubelet's volume manager: FailedMount, the container stays ContainerCreating
            self._container_waits(
                namespace, name, container, {"reason": "ContainerCreating"}, "FailedMount", str(exc)
            )
            return
        except ConfigError as exc:
            # the kubelet's CreateContainerConfigError: stays Pending
            waiting = {"reason": "CreateContainerConfigError", "message": str(exc)}
            self._container_waits(namespace, name, container, waiting, "Failed", f"Error: {exc}")
            return
        except RuntimeError as exc:
            pod = self._current(namespace, name)
            if pod is not None:
                # as containerd reports a container that cannot start: exit code 128, StartError
                now = now_iso()
                pod["status"]["phase"] = "Failed"
                terminated = {
                    "exitCode": 128,
                    "reason": "StartError",
                    "message": str(exc),
                    "startedAt": now,
                    "finishedAt": now,
                }
                pod["status"]["containerStatuses"] = [
                    lifecycle.container_status(container, {"terminated": terminated})
                ]
                self.store.update("pods", pod)
                self.event(pod, "Warning", "Failed", f"Error: {exc}", "kubelet")
            return
        await lifecycle.supervise(self, namespace, name, container, running, device_env)
