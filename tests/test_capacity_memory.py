"""What the capacity watch keeps per pod (issue 37: watch memory): repeated label and request
sets are shared between pods, and a pod that yields no record leaves nothing behind."""

from __future__ import annotations

import gc
import tracemalloc
from typing import Any

from fracspawner.k8s.records import RecordKeys, pod_record

KEYS = RecordKeys(
    pod_labels=("fracspawner.io/*",),
    pod_annotations=("fracspawner.io/*", "hub.jupyter.org/username"),
    context_annotations=frozenset({"hub.jupyter.org/username"}),
)


def _pod(i: int, gpu: bool) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "notebook", "resources": {"requests": {"cpu": "1"}}}
    labels = {"component": "singleuser-server"}
    annotations = {"hub.jupyter.org/username": f"user{i}"}
    if gpu:
        container["resources"]["limits"] = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10240"}
        labels.update({"fracspawner.io/pool": "h100", "fracspawner.io/gpu": "10Gi"})
        annotations["fracspawner.io/gpu-equivalent"] = "0.125"
    return {
        "metadata": {
            "name": f"jupyter-user{i}",
            "namespace": "jhub",
            "uid": f"uid-{i}",
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {"nodeName": "n1", "containers": [container]},
        "status": {"phase": "Running"},
    }


def test_pods_with_nothing_counted_leave_nothing_and_later_pods_still_share():
    raws = [_pod(i, gpu=False) for i in range(9000)]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        assert all(pod_record(raw, KEYS) is None for raw in raws)  # CPU-only notebooks
        gc.collect()
        left = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert left < 100_000, f"{left} bytes kept for 9,000 pods that hold nothing"
    first, second = (pod_record(_pod(i, gpu=True), KEYS) for i in (9001, 9002))
    assert first is not None and second is not None
    assert first.requests is second.requests and first.labels is second.labels
    assert first.annotations == {
        "hub.jupyter.org/username": "user9001",
        "fracspawner.io/gpu-equivalent": "0.125",
    }
