"""A container's start does not rewrite the pod's volumes under a sibling that is binding them.

Each container's start materialises the pod's volumes again. The second of two app containers
emptied and rewrote the projected service-account volume while the first one's mount namespace
was binding it, and the first failed: "mount: /run/secrets/kubernetes.io/serviceaccount: special
device .../volumes/kube-api-access-... does not exist" (exit 125; fresh-clone run at 1b4ff34,
test_two_app_containers_run_and_one_exiting_leaves_the_pod_running_not_ready). A volume that
already holds what it must is left alone; one whose source changed is written again, by a
`..data` swap (tests/test_volumes_atomic.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from devcluster import volumes
from tests.test_volumes_atomic import visible

CONFIG = {"data": {"greeting": "hello"}}


def _pod() -> dict[str, Any]:
    return {
        "metadata": {"name": "two-apps", "namespace": "multi"},
        "spec": {"volumes": [{"name": "config", "configMap": {"name": "cfg", "optional": True}}]},
    }


CONTAINER = {"name": "server", "volumeMounts": [{"name": "config", "mountPath": "/etc/cfg"}]}


def _start(tmp_path: Path, stored: dict[str, Any]) -> Path:
    volumes.materialise(
        _pod(), CONTAINER, tmp_path / "pod", tmp_path, lambda *_: stored, lambda *_: ""
    )
    return tmp_path / "pod" / "volumes" / "config"


def test_a_siblings_start_leaves_a_volume_that_holds_its_files_in_place(tmp_path, monkeypatch):
    first = _start(tmp_path, CONFIG)
    assert (first / "greeting").read_text() == "hello"
    emptied: list[Path] = []
    rmtree = volumes.shutil.rmtree

    def recording(path: Any, *args: Any, **kwargs: Any) -> None:
        emptied.append(Path(path))
        rmtree(path, *args, **kwargs)

    monkeypatch.setattr(volumes.shutil, "rmtree", recording)
    _start(tmp_path, CONFIG)  # the sibling container's start
    assert first not in emptied, "the volume was emptied under a container binding it"
    assert (first / "greeting").read_text() == "hello"


@pytest.mark.parametrize("change", ["content", "key"])
def test_a_volume_whose_source_changed_is_written_again(tmp_path, change):
    first = _start(tmp_path, CONFIG)
    changed = {"data": {"greeting": "bye"}} if change == "content" else {"data": {"other": "x"}}
    _start(tmp_path, changed)
    assert visible(first) == changed["data"]


def test_an_optional_volume_with_nothing_in_it_is_still_made(tmp_path):
    """An optional ConfigMap that is absent: an empty directory to bind, at every start."""
    first = _start(tmp_path, None)  # type: ignore[arg-type]
    assert first.is_dir() and visible(first) == {}
