"""A volume's files written as the kubelet's AtomicWriter writes them, so a reader never finds
the volume empty or half written (kubernetes pkg/volume/util/atomic_writer.go, v1.36.3).

The files are written into a new hidden timestamped directory `..<UTC timestamp>.<random>`; a
symlink `..data_tmp` to it is renamed over `..data` (one rename: atomic); each user-visible name
(a path's first component) is a relative symlink `<name> -> ..data/<name>`; names the former
version had and this one lacks are removed, then the former timestamped directory. A volume
that already holds the payload is left alone (its visible links made where missing, as the
kubelet does since kubernetes issue 121472). Names starting with `..` are the writer's.

A container that binds the volume's directory resolves the links inside it, so it sees every
swap; one that binds a path inside it (a subPath) binds where that path resolves when it
starts, as the kubelet's subPath bind does, and keeps that content after a swap."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

DATA = "..data"
_DATA_TMP = "..data_tmp"
_MAX_NAME = 255  # atomic_writer.go maxFileNameLength
_MAX_PATH = 4096  # atomic_writer.go maxPathLength

#: path inside the volume -> (content, mode)
Payload = Mapping[str, tuple[bytes, int]]


def clean_path(path: str) -> str:
    """The path, normalised; ValueError with the kubelet's words for one it must not write."""
    if not path:
        raise ValueError(f"invalid path: must not be empty: {path!r}")
    if path.startswith("/"):
        raise ValueError(f"invalid path: must be relative path: {path}")
    if len(path) > _MAX_PATH:
        raise ValueError(f"invalid path: must be less than or equal to {_MAX_PATH} characters")
    items = path.split("/")
    if ".." in items:
        raise ValueError(f"invalid path: must not contain '..': {path}")
    if any(len(item) > _MAX_NAME for item in items):
        raise ValueError(
            f"invalid path: filenames must be less than or equal to {_MAX_NAME} characters"
        )
    if items[0].startswith("..") and len(items[0]) > 2:
        raise ValueError(f"invalid path: must not start with '..': {path}")
    return str(PurePosixPath(path))


def _files(directory: Path) -> set[str]:
    return {p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file()}


def _holds(directory: Path, payload: Payload) -> bool:
    """Whether a timestamped directory has exactly the payload, with its content and modes."""
    try:
        if not directory.is_dir() or _files(directory) != set(payload):
            return False
        for rel, (content, mode) in payload.items():
            path = directory / rel
            if path.read_bytes() != content or path.stat().st_mode & 0o7777 != mode:
                return False
    except OSError:
        return False
    return True


def _top(path: str) -> str:
    return path.split("/", 1)[0]


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _link_visible(target: Path, names: set[str]) -> None:
    for name in names:
        visible = target / name
        link = f"{DATA}/{name}"
        if visible.is_symlink() and os.readlink(visible) == link:
            continue
        if visible.is_symlink() or visible.exists():  # the former plain layout's file
            _remove(visible)
        visible.symlink_to(link)


def write(target: Path, payload: Payload) -> bool:
    """Project the payload into `target` (made if missing); whether anything was written.

    ValueError for a path the writer must not write (nothing is changed then). Not safe for
    two writers of one volume at once: the caller serialises them (the kubelet does too)."""
    clean = {clean_path(rel): value for rel, value in payload.items()}
    names = {_top(rel) for rel in clean}
    target.mkdir(parents=True, exist_ok=True)
    try:
        old: str | None = os.readlink(target / DATA)
    except FileNotFoundError:
        old = None
    if old is not None and _holds(target / old, clean):
        _link_visible(target, names)
        return False
    new = Path(tempfile.mkdtemp(prefix=time.strftime("..%Y_%m_%d_%H_%M_%S.", time.gmtime()),
                                dir=target))  # fmt: skip
    new.chmod(0o755)  # whatever the umask: others may walk it
    for rel, (content, mode) in clean.items():
        path = new / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        path.chmod(mode)
    (target / _DATA_TMP).unlink(missing_ok=True)  # a swap cut short
    (target / _DATA_TMP).symlink_to(new.name)
    os.replace(target / _DATA_TMP, target / DATA)  # the swap
    _link_visible(target, names)
    if old is None:  # the first write, or the former plain layout: what is not ours goes
        former = {p.name for p in target.iterdir() if not p.name.startswith("..")}
    else:
        former = {_top(rel) for rel in _files(target / old)}
    for name in former - names:
        _remove(target / name)
    if old is not None:
        shutil.rmtree(target / old, ignore_errors=True)
    return True
