"""configMap/secret/projected/downwardAPI volumes are written as the kubelet's AtomicWriter
writes them (kubernetes pkg/volume/util/atomic_writer.go): the files in a hidden timestamped
directory `..<timestamp>`, a `..data` symlink to it swapped by a rename, each key a symlink
`<key> -> ..data/<key>`, the former timestamped directory removed after the swap. A container
reading the volume while its source changes never finds it empty or half written."""

from __future__ import annotations

import os
import re
import sys
import threading
from pathlib import Path
from typing import Any

from devcluster import bindmounts, volumes

TIMESTAMPED = re.compile(r"^\.\.\d{4}_\d\d_\d\d_\d\d_\d\d_\d\d\.")


def _pod(items: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    source: dict[str, Any] = {"name": "cfg", "optional": True}
    if items:
        source["items"] = items
    return {
        "metadata": {"name": "reader", "namespace": "atomic"},
        "spec": {"volumes": [{"name": "config", "configMap": source}]},
    }


def _start(tmp_path: Path, stored: Any, pod: Any = None, mounts: Any = None) -> dict[str, str]:
    container = {
        "name": "app",
        "volumeMounts": mounts or [{"name": "config", "mountPath": "/etc/cfg"}],
    }
    return volumes.materialise(
        pod or _pod(), container, tmp_path / "pod", tmp_path, lambda *_: stored, lambda *_: ""
    )


def _volume(tmp_path: Path) -> Path:
    return tmp_path / "pod" / "volumes" / "config"


def _hidden(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(".."))


def visible(directory: Path) -> dict[str, str]:
    """The volume as a program lists and reads it: its entries not starting with `..`."""
    return {p.name: p.read_text() for p in directory.iterdir() if not p.name.startswith("..")}


def test_a_volume_has_the_kubelets_layout(tmp_path):
    _start(tmp_path, {"data": {"greeting": "hello", "other": "x"}})
    volume = _volume(tmp_path)
    data = os.readlink(volume / "..data")
    assert TIMESTAMPED.match(data), data
    assert (volume / data).is_dir() and not (volume / data).is_symlink()
    assert _hidden(volume) == sorted(["..data", data])
    for key in ("greeting", "other"):
        assert os.readlink(volume / key) == f"..data/{key}"
    assert visible(volume) == {"greeting": "hello", "other": "x"}


def test_a_nested_item_path_is_linked_by_its_first_component(tmp_path):
    pod = _pod([{"key": "greeting", "path": "conf/deep/greeting.txt"}])
    _start(tmp_path, {"data": {"greeting": "hello"}}, pod)
    volume = _volume(tmp_path)
    assert os.readlink(volume / "conf") == "..data/conf"
    assert (volume / "conf" / "deep" / "greeting.txt").read_text() == "hello"


def test_a_changed_source_swaps_data_and_removes_the_former_directory(tmp_path):
    _start(tmp_path, {"data": {"greeting": "hello", "gone": "soon"}})
    volume = _volume(tmp_path)
    before = os.readlink(volume / "..data")
    _start(tmp_path, {"data": {"greeting": "bye", "new": "key"}})
    after = os.readlink(volume / "..data")
    assert after != before and TIMESTAMPED.match(after)
    assert _hidden(volume) == sorted(["..data", after]), "the former directory is removed"
    assert visible(volume) == {"greeting": "bye", "new": "key"}


def test_a_volume_that_holds_its_files_keeps_its_data_directory(tmp_path):
    _start(tmp_path, {"data": {"greeting": "hello"}})
    volume = _volume(tmp_path)
    before = os.readlink(volume / "..data")
    _start(tmp_path, {"data": {"greeting": "hello"}})  # a sibling container's start
    assert os.readlink(volume / "..data") == before


def test_a_volume_in_the_former_plain_layout_is_rewritten(tmp_path):
    volume = _volume(tmp_path)
    volume.mkdir(parents=True)
    (volume / "greeting").write_text("stale")
    (volume / "gone").write_text("stale")
    _start(tmp_path, {"data": {"greeting": "hello"}})
    assert os.readlink(volume / "greeting") == "..data/greeting"
    assert visible(volume) == {"greeting": "hello"}


def test_a_key_starting_with_two_dots_fails_the_mount(tmp_path):
    pod = _pod([{"key": "greeting", "path": "..data"}])
    try:
        _start(tmp_path, {"data": {"greeting": "hello"}}, pod)
    except volumes.MountError as exc:
        assert "must not start with '..'" in str(exc)
    else:
        raise AssertionError("a path starting with '..' was written")


def _read_all(volume: Path, keys: set[str]) -> str | None:
    """What is wrong with the volume as one reader sees it now, or None."""
    try:
        link = os.readlink(volume / "..data")
    except OSError:
        link = None
    try:
        names = {n for n in os.listdir(volume) if not n.startswith("..")}
    except FileNotFoundError:
        return "the volume directory is missing"
    if names != keys:
        return f"listed {sorted(names)}"
    for key in sorted(keys):
        try:
            content = (volume / key).read_text()
        except FileNotFoundError:
            try:
                now = os.readlink(volume / "..data")
            except OSError:
                now = None
            if now is not None and now != link:
                return None  # swapped while this read resolved the former `..data`: read again
            return f"{key} is missing"
        if not re.fullmatch(r"(v\d+-)\1{199}", content):
            return f"{key} holds {len(content)} characters: partly written"
    return None


def test_a_reader_never_sees_an_empty_or_partial_volume(tmp_path):
    keys = {f"key{i}" for i in range(8)}

    def version(n: int) -> dict[str, Any]:
        return {"data": {key: f"v{n}-" * 200 for key in keys}}

    _start(tmp_path, version(0))
    volume = _volume(tmp_path)
    done = threading.Event()
    seen: list[str] = []

    def reader() -> None:
        while not done.is_set():
            if (problem := _read_all(volume, keys)) is not None:
                seen.append(problem)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # interleave the reader with every step of the writer
    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for n in range(1, 60):
            _start(tmp_path, version(n))
    finally:
        done.set()
        thread.join()
        sys.setswitchinterval(interval)
    assert not seen, f"{len(seen)} bad reads, the first: {seen[:3]}"
    assert visible(volume) == version(59)["data"]


def test_a_subpath_is_bound_where_it_is_now_and_not_updated(tmp_path):
    """The kubelet binds a subPath's resolved path once (pkg/volume/util/subpath): a container
    mounting one key as a file keeps its content when the ConfigMap changes; one mounting the
    whole volume binds the directory, whose `..data` swaps it sees."""
    whole, key = str(tmp_path / "mnt" / "cfg"), str(tmp_path / "mnt" / "greeting")
    mounts = [
        {"name": "config", "mountPath": whole},
        {"name": "config", "mountPath": key, "subPath": "greeting"},
    ]
    places = _start(tmp_path, {"data": {"greeting": "hello"}}, mounts=mounts)
    args = bindmounts.plan(places, tmp_path / "rootfs", tmp_path / "mountpoints")
    binds = {args[i + 2]: args[i + 1] for i in range(0, len(args), 3)}
    volume = _volume(tmp_path).resolve()
    assert binds[whole] == str(volume)
    assert binds[key] == str(volume / os.readlink(volume / "..data") / "greeting")
