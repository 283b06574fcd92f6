"""Topology files: the nodes (and optionally pre-existing pods) of a simulated cluster.

Shorthand per node: `name`, `labels`, `annotations`, `taints`, `capacity`, `allocatable`
(defaults to capacity), `unschedulable`, `count` (N copies named name-1..name-N). A full
Kubernetes Node object (with `metadata`) is taken as it is. Pods: `name`, `namespace`,
`node`, `labels`, `annotations`, `requests`, `limits`, `phase` (default Running); they have
no process behind them.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml


def normalise_node(raw: Mapping[str, Any]) -> dict[str, Any]:
    if "metadata" in raw:
        node = copy.deepcopy(dict(raw))
        node.setdefault("status", {}).setdefault("conditions", [_ready()])
        return node
    capacity = {k: str(v) for k, v in (raw.get("capacity") or {}).items()}
    capacity.setdefault("pods", "110")
    allocatable = {k: str(v) for k, v in (raw.get("allocatable") or capacity).items()}
    allocatable.setdefault("pods", capacity["pods"])
    labels = {
        "kubernetes.io/hostname": raw["name"],
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
    }
    labels.update({k: str(v) for k, v in (raw.get("labels") or {}).items()})
    return {
        "metadata": {
            "name": raw["name"],
            "labels": labels,
            "annotations": {k: str(v) for k, v in (raw.get("annotations") or {}).items()},
        },
        "spec": {
            "taints": list(raw.get("taints") or []),
            **({"unschedulable": True} if raw.get("unschedulable") else {}),
        },
        "status": {
            "capacity": capacity,
            "allocatable": allocatable,
            "conditions": [_ready()],
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": raw["name"]},
            ],
            "nodeInfo": {
                "kubeletVersion": "v1.33.0-devcluster",
                "operatingSystem": "linux",
                "architecture": "amd64",
                "containerRuntimeVersion": "devcluster://1",
                "kernelVersion": "",
                "osImage": "devcluster",
                "kubeProxyVersion": "",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
            },
        },
    }


def now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _ready() -> dict[str, str]:
    now = now_iso()
    return {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "devcluster kubelet is ready",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }


def normalise_pod(raw: Mapping[str, Any]) -> dict[str, Any]:
    if "metadata" in raw:
        return copy.deepcopy(dict(raw))
    resources = {}
    if raw.get("requests"):
        resources["requests"] = {k: str(v) for k, v in raw["requests"].items()}
    if raw.get("limits"):
        resources["limits"] = {k: str(v) for k, v in raw["limits"].items()}
    phase = raw.get("phase", "Running")
    return {
        "metadata": {
            "name": raw["name"],
            "namespace": raw.get("namespace", "default"),
            "labels": {k: str(v) for k, v in (raw.get("labels") or {}).items()},
            "annotations": {k: str(v) for k, v in (raw.get("annotations") or {}).items()},
        },
        "spec": {
            "nodeName": raw.get("node"),
            "schedulerName": "default-scheduler",
            "containers": [
                {"name": "main", "image": raw.get("image", "busybox"), "resources": resources}
            ],
        },
        "status": {
            "phase": phase,
            "podIP": raw.get("podIP"),
            "conditions": [{"type": "Ready", "status": "True" if phase == "Running" else "False"}],
        },
    }


def load_topology(source: Mapping[str, Any] | str | Path) -> dict[str, Any]:
    """A topology dict with `nodes` and `pods` as full Kubernetes objects."""
    if isinstance(source, (str, Path)):
        raw = yaml.safe_load(Path(source).read_text())
    else:
        raw = copy.deepcopy(dict(source))
    if not isinstance(raw, Mapping) or not isinstance(raw.get("nodes"), list):
        raise ValueError("a topology needs a `nodes:` list")
    nodes = []
    dra: dict[str, Any] = {}  # node name -> its `dra:` section (devcluster/dra/nvidia.py)
    for entry in raw["nodes"]:
        count = int(entry.get("count", 1)) if "metadata" not in entry else 1
        for i in range(count):
            item = dict(entry)
            spec = item.pop("dra", None)
            if count > 1:
                item["name"] = f"{entry['name']}-{i + 1}"
            nodes.append(normalise_node(item))
            if spec:
                dra[nodes[-1]["metadata"]["name"]] = spec
    names = [n["metadata"]["name"] for n in nodes]
    if len(set(names)) != len(names):
        raise ValueError("topology: node names must be unique")
    topology = dict(raw)
    topology["nodes"] = nodes
    topology["dra"] = dra
    topology["pods"] = [normalise_pod(p) for p in raw.get("pods") or []]
    return topology


# ---------------------------------------------------------------- a large cluster for benchmarks
A100_MIG = {"nvidia.com/mig-1g.10gb": 2, "nvidia.com/mig-2g.20gb": 1, "nvidia.com/mig-3g.40gb": 1}
#: GPU memory as NVML reports it, which GFD labels and HAMi registers (fracspawner.model.gpumodels
#: NVML_MEMORY_MIB has the sources); never the nominal 81920 of an "80GB" H100
NVML_MIB = {"a100-mig": 81920, "h100": 81559, "t4": 15360}
H100_SPLIT = 10  # HAMi's deviceSplitCount default


def hami_register(node: str, gpus: int, devmem: int, type_: str, split: int = H100_SPLIT) -> str:
    """`hami.io/node-nvidia-register` as HAMi's device plugin writes it (MarshalNodeDevices,
    pkg/device/devices.go: Go's json.Marshal, `omitempty` dropping index 0)."""
    devices = []
    for i in range(gpus):
        index = f'"index":{i},' if i else ""
        devices.append(
            f'{{"id":"{hami_uuid(node, i)}",{index}"count":{split},"devmem":{devmem},'
            f'"devcore":100,"type":"{type_}","mode":"hami-core","health":true}}'
        )
    return "[" + ",".join(devices) + "]"


def hami_uuid(node: str, i: int) -> str:
    return f"GPU-{node}-{i}"


def _large_node(kind: str, i: int) -> dict[str, Any]:
    gpus = 8
    name = f"{kind}-{i:04d}"
    base = {"cpu": "96", "memory": "1024Gi", "pods": "110"}
    annotations = {}
    if kind == "a100-mig":
        capacity = {**base, **{k: str(v * gpus) for k, v in A100_MIG.items()}}
        labels = {
            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
            "nvidia.com/mig.strategy": "mixed",
            "nvidia.com/gpu.count": str(gpus),
        }
    elif kind == "h100":
        # HAMi's device plugin publishes only nvidia.com/gpu (devices x deviceSplitCount); memory
        # and cores are in its registration annotation, fitted per device by its scheduler
        capacity = {**base, "nvidia.com/gpu": str(gpus * H100_SPLIT)}
        labels = {
            "gpu": "on",
            "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
            "nvidia.com/gpu.count": str(gpus),
        }
        annotations["hami.io/node-nvidia-register"] = hami_register(
            name, gpus, NVML_MIB[kind], "NVIDIA-NVIDIA H100 80GB HBM3"
        )
    else:
        capacity = {**base, "nvidia.com/gpu": str(gpus * 4)}
        labels = {
            "nvidia.com/gpu.product": "Tesla-T4-SHARED",
            "nvidia.com/gpu.replicas": "4",
            "nvidia.com/gpu.sharing-strategy": "time-slicing",
            "nvidia.com/gpu.count": str(gpus),
        }
    labels["nvidia.com/gpu.memory"] = str(NVML_MIB[kind])
    return {"name": name, "labels": labels, "annotations": annotations, "capacity": capacity}


def generate_large(nodes: int = 1000, pods: int = 20000, seed: int = 0) -> dict[str, Any]:
    """1,000 GPU nodes (MIG A100, HAMi H100, time-sliced T4) and 20,000 running pods, some of
    them fracspawner notebooks holding slices: the cluster the form benchmark renders against."""
    rng = random.Random(seed)
    kinds = ["a100-mig", "h100", "t4"]
    node_list = [_large_node(kinds[i % 3], i) for i in range(nodes)]
    pod_list = []
    for i in range(pods):
        node = node_list[rng.randrange(nodes)]
        kind = node["name"].rsplit("-", 1)[0]
        user = f"user{rng.randrange(5000)}"
        # what kubespawner 7 puts on a singleuser pod (common_labels + _build_pod_labels)
        labels = {
            "app.kubernetes.io/name": "jupyterhub",
            "app.kubernetes.io/managed-by": "kubespawner",
            "app.kubernetes.io/component": "singleuser-server",
            "app": "jupyterhub",
            "heritage": "jupyterhub",
            "component": "singleuser-server",
            "hub.jupyter.org/username": user,
            "hub.jupyter.org/servername": "",
        }
        annotations = {"hub.jupyter.org/username": user}
        limits: dict[str, str] = {}
        if rng.random() < 0.3:  # a fracspawner notebook with a slice
            if kind == "a100-mig":
                limits = {"nvidia.com/mig-1g.10gb": "1"}
                spec, eq, mem = "mig-1g.10gb", "0.142857", "9856"
            elif kind == "h100":
                limits = {
                    "nvidia.com/gpu": "1",
                    "nvidia.com/gpumem": "10240",
                    "nvidia.com/gpucores": "12",
                }
                spec, eq, mem = "10Gi", "0.125", "10240"
                # the device HAMi's scheduler gave it (vgpu-devices-allocated, as it writes it)
                device = hami_uuid(node["name"], i % 8)
                annotations["hami.io/vgpu-devices-allocated"] = f"{device},NVIDIA,10240,12:;"
            else:
                limits = {"nvidia.com/gpu": "1"}
                spec, eq, mem = "0.25", "0.25", "4096"
            pool = {"a100-mig": "a100-mig", "h100": "h100", "t4": "t4"}[kind]
            labels.update({"fracspawner.io/pool": pool, "fracspawner.io/gpu": spec})
            annotations.update(
                {"fracspawner.io/gpu-equivalent": eq, "fracspawner.io/gpu-memory-mib": mem}
            )
        pod_list.append(
            {
                "name": f"jupyter-{user}-{i}",
                "namespace": "default",
                "node": node["name"],
                "labels": labels,
                "annotations": annotations,
                "limits": limits,
                "requests": {"cpu": "100m", "memory": "256Mi"},
                "phase": "Running",
                "podIP": f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}",
            }
        )
    return {"nodes": node_list, "pods": pod_list}
