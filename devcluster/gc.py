"""The garbage collector: dependents follow their owners (`metadata.ownerReferences`).

Modelled on kubernetes pkg/controller/garbagecollector (garbagecollector.go attemptToDeleteItem,
processDeletingDependentsItem, orphanDependents) and the apiserver's side of deletion
(staging/src/k8s.io/apiserver/pkg/registry/generic/registry/store.go: Delete,
updateForGracefulDeletionAndFinalizers, deletionFinalizersForGarbageCollection):

- ``Background`` (the default): the owner goes at once; then each dependent none of whose other
  owners still exists is deleted, a dependent with another live owner only loses the reference.
- ``Foreground``: the owner stays with a ``deletionTimestamp`` and the ``foregroundDeletion``
  finalizer; its dependents are deleted (themselves in the foreground), and the finalizer goes
  when no dependent with ``blockOwnerDeletion: true`` is left; then the owner goes.
- ``Orphan``: the owner stays with the ``orphan`` finalizer until the collector has removed the
  reference to it from every dependent; the dependents stay.
- An object being deleted whose last finalizer is removed goes (the registry's
  deleteWithoutFinalizers on update).
- A dependent created naming an owner of a kind this cluster serves that does not exist (or has
  another uid) is deleted, as attemptToDeleteItem does for an absent owner. An owner of a kind
  the cluster does not serve (a StatefulSet, a Job: no controllers here) cannot be looked up,
  as the real collector's REST mapping fails for it, and keeps its dependents.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from .fielderrors import FieldError, invalid, invalid_error, not_supported
from .store import ApiError, Store, now_iso

log = logging.getLogger("devcluster.gc")

ORPHAN = "orphan"
FOREGROUND = "foregroundDeletion"
POLICIES = ("Orphan", "Background", "Foreground")

Key = tuple[str, str, str]  # (plural, namespace, name)
#: (plural, namespace, name, grace seconds, propagation policy) -> awaitable deletion
Deleter = Callable[[str, str | None, str, float | None, str | None], Awaitable[Any]]


def propagation_policy(options: Mapping[str, Any] | None, query: str | None) -> str | None:
    """The DeleteOptions' policy (query parameter first, then body), validated as
    ValidateDeleteOptions (pkg/apis/meta/v1/validation): 422 Invalid on a bad one."""
    options = options or {}
    policy = query if query is not None else options.get("propagationPolicy")
    orphan = options.get("orphanDependents")
    errors: list[FieldError] = []
    if policy is not None and orphan is not None:
        errors.append(
            invalid(
                "propagationPolicy",
                policy,
                "orphanDependents and deletionPropagation cannot be both set",
            )
        )
    elif policy is not None and policy not in POLICIES:
        errors.append(not_supported("propagationPolicy", policy, list(POLICIES)))
    if errors:
        raise invalid_error("DeleteOptions", "meta.k8s.io", "", errors)
    if orphan is not None:  # the deprecated flag
        return "Orphan" if orphan else "Background"
    return policy


def finalizers_for(obj: Mapping[str, Any], policy: str | None) -> list[str]:
    """The object's finalizers once a delete with `policy` asked for it (the registry's
    deletionFinalizersForGarbageCollection: the policy's finalizer replaces the other one)."""
    finalizers = list((obj.get("metadata") or {}).get("finalizers") or [])
    if policy == "Orphan":
        finalizers = [f for f in finalizers if f != FOREGROUND]
        if ORPHAN not in finalizers:
            finalizers.append(ORPHAN)
    elif policy == "Foreground":
        finalizers = [f for f in finalizers if f != ORPHAN]
        if FOREGROUND not in finalizers:
            finalizers.append(FOREGROUND)
    elif policy == "Background":
        finalizers = [f for f in finalizers if f not in (ORPHAN, FOREGROUND)]
    return finalizers


def mark_deleting(obj: Mapping[str, Any], finalizers: list[str]) -> dict[str, Any]:
    """A copy of `obj` being deleted: deletionTimestamp (kept if set) and its finalizers."""
    obj = copy.deepcopy(dict(obj))
    meta = obj["metadata"]
    meta.setdefault("deletionTimestamp", now_iso())
    meta.setdefault("deletionGracePeriodSeconds", 0)
    meta["finalizers"] = finalizers
    return obj


class GarbageCollector:
    """Listens to the store; deletes through `delete` (the cluster's own delete, so pods stop)."""

    def __init__(
        self,
        store: Store,
        delete: Deleter,
        spawn: Callable[[Any], None],
        may_remove: Callable[[str, Mapping[str, Any]], bool],
    ) -> None:
        self.store = store
        self.delete = delete
        self.spawn = spawn
        #: whether a deleting object with no finalizers left may go now (a pod: once stopped)
        self.may_remove = may_remove
        self.dependents: dict[str, set[Key]] = {}  # owner uid -> dependents
        self.owners: dict[Key, set[str]] = {}  # dependent -> owner uids
        self.foreground: dict[str, Key] = {}  # uid -> owner being deleted in the foreground

    # ------------------------------------------------------------ events
    def on_change(self, plural: str, kind: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        key = (plural, meta.get("namespace", ""), meta["name"])
        self._index(key, [] if kind == "DELETED" else meta.get("ownerReferences") or [])
        uid = meta.get("uid", "")
        if meta.get("deletionTimestamp") and FOREGROUND in (meta.get("finalizers") or []):
            self.foreground[uid] = key
        else:
            self.foreground.pop(uid, None)
        if kind == "DELETED":
            self.spawn(self._owner_gone(meta.get("uid", ""), meta.get("finalizers") or []))
            for ref in meta.get("ownerReferences") or []:
                self.spawn(self._check_foreground(ref.get("uid", "")))
            return
        if kind == "ADDED" and meta.get("ownerReferences"):
            self.spawn(self._check_owners(key))
        if meta.get("deletionTimestamp") and plural != "namespaces":
            finalizers = meta.get("finalizers") or []
            if ORPHAN in finalizers:
                self.spawn(self._orphan(key, meta["uid"]))
            elif FOREGROUND in finalizers:
                self.spawn(self._foreground(key, meta["uid"]))
            elif not finalizers and self.may_remove(plural, obj):
                self.spawn(self._remove(key, meta["uid"]))

    def _index(self, key: Key, refs: list[Mapping[str, Any]]) -> None:
        for uid in self.owners.pop(key, set()):
            deps = self.dependents.get(uid)
            if deps is not None:
                deps.discard(key)
                if not deps:
                    del self.dependents[uid]
        uids = {r.get("uid", "") for r in refs if r.get("uid")}
        if uids:
            self.owners[key] = uids
            for uid in uids:
                self.dependents.setdefault(uid, set()).add(key)

    # ------------------------------------------------------------ lookups
    def _get(self, key: Key) -> dict[str, Any] | None:
        entry = self.store.objects.get(key[0], {}).get((key[1], key[2]))
        return entry.obj if entry else None

    def _owner_exists(self, namespace: str, ref: Mapping[str, Any]) -> bool | None:
        """True/False, or None where the owner's kind is not served (cannot be looked up)."""
        api_version = ref.get("apiVersion", "")
        group = api_version.rpartition("/")[0] if "/" in api_version else ""
        resource = next(
            (r for r in self.store.resources if r.kind == ref.get("kind") and r.group == group),
            None,
        )
        if resource is None:
            return None
        owner = self._get((resource.key, namespace if resource.namespaced else "", ref["name"]))
        return owner is not None and owner["metadata"].get("uid") == ref.get("uid")

    # ------------------------------------------------------------ actions
    async def _delete(self, key: Key, policy: str | None) -> None:
        try:
            await self.delete(key[0], key[1] or None, key[2], None, policy)
        except ApiError:
            pass  # already gone
        except Exception:
            log.exception("garbage collector: deleting %s failed", key)

    async def _drop_reference(self, key: Key, owner_uid: str) -> None:
        obj = self._get(key)
        if obj is None:
            return
        refs = obj["metadata"].get("ownerReferences") or []
        kept = [r for r in refs if r.get("uid") != owner_uid]
        if kept != refs:
            obj = copy.deepcopy(obj)
            if kept:
                obj["metadata"]["ownerReferences"] = kept
            else:
                obj["metadata"].pop("ownerReferences", None)
            self.store.update(key[0], obj)

    async def _owner_gone(self, uid: str, finalizers: list[str]) -> None:
        """attemptToDeleteItem for each dependent of a deleted owner."""
        for key in sorted(self.dependents.get(uid, ())):
            await self._check_owners(key, gone=uid, foreground=FOREGROUND in finalizers)

    async def _check_owners(self, key: Key, gone: str = "", foreground: bool = False) -> None:
        obj = self._get(key)
        if obj is None:
            return
        meta = obj["metadata"]
        if meta.get("deletionTimestamp"):
            return
        refs = meta.get("ownerReferences") or []
        exists = [False if r.get("uid") == gone else self._owner_exists(key[1], r) for r in refs]
        if any(e is True or e is None for e in exists):
            # a live owner (or one that cannot be looked up) keeps it: only the dangling go
            for ref, e in zip(refs, exists, strict=True):
                if e is False:
                    await self._drop_reference(key, ref.get("uid", ""))
            return
        await self._delete(key, "Foreground" if foreground else "Background")

    async def _orphan(self, key: Key, uid: str) -> None:
        """orphanDependents, then the orphan finalizer removed."""
        for dep in sorted(self.dependents.get(uid, ())):
            await self._drop_reference(dep, uid)
        self._remove_finalizer(key, uid, ORPHAN)

    async def _foreground(self, key: Key, uid: str) -> None:
        """Delete the dependents; the owner goes once no blocking dependent is left."""
        for dep in sorted(self.dependents.get(uid, ())):
            obj = self._get(dep)
            if obj is not None and not obj["metadata"].get("deletionTimestamp"):
                await self._delete(dep, "Foreground")
        await self._check_foreground(uid)

    async def _check_foreground(self, uid: str) -> None:
        """processDeletingDependentsItem: the finalizer goes when no blocking dependent is left."""
        owner_key = self.foreground.get(uid)
        if owner_key is None:
            return
        for dep in self.dependents.get(uid, ()):
            obj = self._get(dep)
            if obj is None:
                continue
            for ref in obj["metadata"].get("ownerReferences") or []:
                if ref.get("uid") == uid and ref.get("blockOwnerDeletion"):
                    return  # still blocks
        self._remove_finalizer(owner_key, uid, FOREGROUND)

    def _remove_finalizer(self, key: Key, uid: str, finalizer: str) -> None:
        obj = self._get(key)
        if obj is None or obj["metadata"].get("uid") != uid:
            return
        finalizers = obj["metadata"].get("finalizers") or []
        if finalizer not in finalizers:
            return
        obj = copy.deepcopy(obj)
        obj["metadata"]["finalizers"] = [f for f in finalizers if f != finalizer]
        self.store.update(key[0], obj)  # on_change removes it once none is left

    async def _remove(self, key: Key, uid: str) -> None:
        obj = self._get(key)
        if obj is None or obj["metadata"].get("uid") != uid:
            return
        if obj["metadata"].get("finalizers") or not self.may_remove(key[0], obj):
            return
        try:
            self.store.remove(key[0], key[1] or None, key[2])
        except ApiError:
            pass
