"""ResourceSlices as NVIDIA's DRA kubelet plugin publishes them on Kubernetes 1.35 and later.

kubernetes-sigs/dra-driver-nvidia-gpu, cmd/gpu-kubelet-plugin/driver.go (commit bbcbdfb):
without DynamicMIG, publishResources puts every device of the node in ONE slice of the pool
named after the node; with DynamicMIG, shouldUseSplitResourceSlices picks, for an apiserver of
1.35+, generateSplitResourceSlices: G+1 slices for G GPUs, first one holding only the
sharedCounters (a counter set per GPU), then one slice per GPU with its devices only (the full
GPU and its possible MIG partitions), because resource.k8s.io/v1 on 1.35+ allows only one of
devices and sharedCounters in a slice. The devices themselves are devcluster.dra.nvidia's
(its docstring has the sources); this module only lays them out for the pinned release.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any

from devcluster.dra import nvidia

_GPU = re.compile(r"^gpu-(\d+)")


def node_slices(node: str, spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The slices of `node`'s pool, in the order the plugin publishes them."""
    combined = nvidia.node_slice(node, spec)
    body = combined["spec"]
    counters = body.pop("sharedCounters", None)
    if not counters:
        return [combined]
    per_gpu: dict[int, list[dict[str, Any]]] = {}
    for device in body["devices"]:
        match = _GPU.match(device["name"])
        if match is None:
            raise ValueError(f"dra: device {device['name']!r} names no GPU")
        per_gpu.setdefault(int(match.group(1)), []).append(device)
    parts: list[dict[str, Any]] = [{"sharedCounters": counters}]
    parts += [{"devices": per_gpu[minor]} for minor in sorted(per_gpu)]
    out = []
    for part in parts:
        one = copy.deepcopy(combined)
        one["spec"].pop("devices")
        one["spec"].update(copy.deepcopy(part))
        one["spec"]["pool"]["resourceSliceCount"] = len(parts)
        out.append(one)
    return out
