"""Pod volumes, materialised for a pod's process (issue 29 item 2).

What the kubelet's volume plugins write (kubernetes pkg/volume/configmap/configmap.go,
pkg/volume/secret/secret.go, pkg/volume/projected/projected.go,
pkg/volume/downwardapi/downwardapi.go, pkg/volume/emptydir; pkg/volume/util/atomic_writer.go)
is written here into a per-pod directory: every key of a ConfigMap/Secret as a file (or only
`items`, each at its `path` with its `mode`), file modes from `defaultMode` (0644 when unset),
downwardAPI fields, emptyDir as an empty directory, a PersistentVolumeClaim as a directory kept
per claim. configMap, secret, projected and downwardAPI volumes are written as the kubelet's
AtomicWriter writes them (`..data` swapped atomically: devcluster/atomicwriter.py). A missing
ConfigMap/Secret (or key named in `items`) that is not `optional` fails the mount with the
kubelet's words (`MountVolume.SetUp failed for volume "v" : configmap "c" not found`), and the
pod stays ContainerCreating until it appears.

The "pods" are local processes without their own mount namespace, so a `mountPath` cannot be
where the process looks: the pod gets a root directory (`<pod dir>/root`) where each mountPath is
a symlink to its volume (to the `subPath` inside it where set), and the kubelet rewrites a
mountPath in the container's command, args, env values and workingDir to its place under that
root (as it rewrites 0.0.0.0 to the pod's address). A path the program builds itself from a
mountPath it was not given is not rewritten: see docs/devcluster.md.
"""

from __future__ import annotations

import base64
import re
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from devcluster import atomicwriter

DEFAULT_MODE = 0o644  # configmap/secret/downwardAPI defaultMode when unset (types.go)

#: (plural, namespace, name) -> the stored object, or None
Lookup = Callable[[str, str, str], "Mapping[str, Any] | None"]
#: a pod field for a downwardAPI item: (pod, fieldPath) -> value
FieldRef = Callable[[Mapping[str, Any], str], str]


class MountError(RuntimeError):
    """A volume cannot be set up: the kubelet's FailedMount; the pod stays ContainerCreating."""


def _files_from(
    kind: str, source: Mapping[str, Any], volume: str, ns: str, lookup: Lookup
) -> dict[str, tuple[bytes, int | None]]:
    """path -> (content, mode) for a configMap or secret source (volume or projection)."""
    name = source.get("name") or source.get("secretName") or ""
    plural = "secrets" if kind == "secret" else "configmaps"
    obj = lookup(plural, ns, name)
    optional = bool(source.get("optional"))
    if obj is None:
        if optional:
            return {}
        raise MountError(
            f'MountVolume.SetUp failed for volume "{volume}" : {kind} "{name}" not found'
        )
    data: dict[str, bytes] = {}
    if kind == "secret":
        for key, value in (obj.get("data") or {}).items():
            data[key] = base64.b64decode(value)
    else:
        for key, value in (obj.get("data") or {}).items():
            data[key] = str(value).encode()
        for key, value in (obj.get("binaryData") or {}).items():
            data[key] = base64.b64decode(value)
    items = source.get("items")
    if not items:
        return {key: (value, None) for key, value in data.items()}
    files = {}
    for item in items:
        key = item.get("key", "")
        if key not in data:
            if optional:
                continue
            what = (
                "secret references non-existent secret key"
                if kind == "secret"
                else ("configmap references non-existent config key")
            )
            raise MountError(f'MountVolume.SetUp failed for volume "{volume}" : {what}: {key}')
        files[item.get("path") or key] = (data[key], item.get("mode"))
    return files


def _downward_files(
    source: Mapping[str, Any], pod: Mapping[str, Any], field_ref: FieldRef
) -> dict[str, tuple[bytes, int | None]]:
    files = {}
    for item in source.get("items") or []:
        if ref := item.get("fieldRef"):
            path = ref.get("fieldPath", "")
            meta = pod.get("metadata") or {}
            if path in ("metadata.labels", "metadata.annotations"):
                pairs = meta.get(path.split(".")[1]) or {}
                value = "\n".join(f'{k}="{v}"' for k, v in sorted(pairs.items()))
            else:
                value = field_ref(pod, path)
            files[item["path"]] = (value.encode(), item.get("mode"))
        # resourceFieldRef: the container's limits are not modelled; left out
    return files


def volume_files(
    volume: Mapping[str, Any],
    pod: Mapping[str, Any],
    lookup: Lookup,
    field_ref: FieldRef,
) -> tuple[dict[str, tuple[bytes, int | None]], int] | None:
    """The files a volume holds and its default mode; None for a volume that is a directory
    (emptyDir, persistentVolumeClaim, hostPath, or one this cluster does not model)."""
    ns = (pod.get("metadata") or {}).get("namespace", "default")
    name = volume.get("name", "")
    for kind in ("configMap", "secret"):
        if kind in volume:
            source = volume[kind] or {}
            mode = source.get("defaultMode", DEFAULT_MODE)
            return _files_from(kind.lower(), source, name, ns, lookup), mode
    if "downwardAPI" in volume:
        source = volume["downwardAPI"] or {}
        return _downward_files(source, pod, field_ref), source.get("defaultMode", DEFAULT_MODE)
    if "projected" in volume:
        source = volume["projected"] or {}
        files: dict[str, tuple[bytes, int | None]] = {}
        for projection in source.get("sources") or []:
            for kind in ("configMap", "secret"):
                if kind in projection:
                    files.update(_files_from(kind.lower(), projection[kind], name, ns, lookup))
            if "downwardAPI" in projection:
                files.update(_downward_files(projection["downwardAPI"], pod, field_ref))
            if "serviceAccountToken" in projection:
                token = projection["serviceAccountToken"]
                files[token.get("path", "token")] = (b"devcluster-token", None)
        return files, source.get("defaultMode", DEFAULT_MODE)
    return None


def _write(
    volume: str, directory: Path, files: Mapping[str, tuple[bytes, int | None]], mode: int
) -> None:
    # As the kubelet's AtomicWriter (devcluster/atomicwriter.py): a changed source swaps the
    # `..data` symlink, so a container reading or binding the volume at that moment never finds
    # it empty or half written; one that already holds what it must is left alone. Rewriting it
    # in place (rmtree, then write) under a starting sibling failed its bind: "special device
    # ... does not exist" (tests/test_volumes_rewrite.py).
    payload = {rel: (content, mode if m is None else m) for rel, (content, m) in files.items()}
    try:
        atomicwriter.write(directory, payload)
    except ValueError as exc:
        raise MountError(f'MountVolume.SetUp failed for volume "{volume}" : {exc}') from exc


def refresh(
    pod: Mapping[str, Any], pod_dir: Path, lookup: Lookup, field_ref: FieldRef
) -> dict[str, str]:
    """Write the running pod's configMap, secret, projected and downwardAPI volumes again from
    their sources now, as the kubelet's periodic sync of a pod does (kubernetes.io "ConfigMaps":
    "mounted ConfigMaps are updated automatically", within the kubelet sync period plus its
    cache's delay; a subPath mount gets no update: atomicwriter.py). Only volumes already
    materialised are written. A volume whose source cannot be read now (a ConfigMap deleted,
    a key gone) keeps what it holds, as the kubelet's failed remount does; volume -> the
    kubelet's words for each of those."""
    failed: dict[str, str] = {}
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        name = volume.get("name", "")
        target = pod_dir / "volumes" / name
        if not (target / atomicwriter.DATA).exists():
            continue  # not mounted yet (or not a volume of files): the start writes it
        try:
            made = volume_files(volume, pod, lookup, field_ref)
            if made is not None:
                _write(name, target, *made)
        except MountError as err:
            failed[name] = str(err)
    return failed


def materialise(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    pod_dir: Path,
    state_dir: Path,
    lookup: Lookup,
    field_ref: FieldRef,
) -> dict[str, str]:
    """Write the container's mounted volumes; mountPath -> where the process finds it.

    Raises MountError (nothing is started) where a volume cannot be set up."""
    ns = (pod.get("metadata") or {}).get("namespace", "default")
    volumes = {v.get("name"): v for v in (pod.get("spec") or {}).get("volumes") or []}
    mounts = container.get("volumeMounts") or []
    dirs: dict[str, Path] = {}
    for mount in mounts:  # every volume first, as the kubelet waits for all of them
        name = mount.get("name", "")
        if name in dirs:
            continue
        volume = volumes.get(name)
        if volume is None:
            raise MountError(f'unable to find volume "{name}" in the pod spec')
        target = pod_dir / "volumes" / name
        made = volume_files(volume, pod, lookup, field_ref)
        if made is not None:
            _write(name, target, *made)
        elif "persistentVolumeClaim" in volume:
            claim = volume["persistentVolumeClaim"].get("claimName", name)
            target = state_dir / "volumes" / ns / claim  # outlives the pod, as a PV does
            target.mkdir(parents=True, exist_ok=True)
        elif "hostPath" in volume:
            target = Path(volume["hostPath"].get("path", "/"))
        else:  # emptyDir, and kinds not modelled: an empty directory for the pod's life
            if target.exists():  # a former pod of the same name's
                shutil.rmtree(target)
            target.mkdir(parents=True)
        dirs[name] = target
    root = pod_dir / "root"
    if root.exists():
        shutil.rmtree(root)
    paths: dict[str, str] = {}
    for mount in mounts:
        mount_path = mount.get("mountPath", "")
        source = dirs[mount.get("name", "")]
        if sub := mount.get("subPath"):
            source = source / sub
            if not source.exists():  # the kubelet creates a missing subPath as a directory
                source.mkdir(parents=True, exist_ok=True)
        place = root / mount_path.lstrip("/")
        place.parent.mkdir(parents=True, exist_ok=True)
        place.symlink_to(source)
        paths[mount_path.rstrip("/") or "/"] = str(place)
    return paths


def rewriter(paths: Mapping[str, str]) -> Callable[[str], str]:
    """A function rewriting each mountPath (a whole path component prefix) in a string."""
    if not paths:
        return lambda text: text
    ordered = sorted(paths, key=len, reverse=True)
    pattern = re.compile(
        r"(?<![\w./-])(" + "|".join(re.escape(p) for p in ordered) + r")(?=$|[/\s:;,'\"=])"
    )
    return lambda text: pattern.sub(lambda m: paths[m.group(1)], text)
