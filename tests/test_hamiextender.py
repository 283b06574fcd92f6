"""HAMi's scheduler extender for the real control plane (devcluster/controlplane/hamiextender.py),
without a cluster: what it answers kube-scheduler, and the scheduler configuration it needs."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from devcluster.controlplane import flags
from devcluster.controlplane.hamiextender import (
    HamiExtender,
    extender_config,
    filter_nodes,
    is_hami_pod,
    scheduler_profile,
)
from devcluster.topology import load_topology

DEMO = Path(__file__).resolve().parent.parent / "devcluster" / "topologies" / "demo.yaml"
ALLOCATED = "hami.io/vgpu-devices-allocated"


def _nodes() -> dict[str, dict]:
    return {n["metadata"]["name"]: n for n in load_topology(DEMO)["nodes"]}


def _pod(name: str, percent: str = "25", scheduler: str = "hami-scheduler") -> dict:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": percent}
    return {
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {
            "schedulerName": scheduler,
            "containers": [{"name": "c", "resources": {"limits": limits}}],
        },
    }


def test_a_hami_pod_gets_one_node_and_its_devices_written_on_it():
    nodes = _nodes()
    pod = _pod("a")
    chosen, failed = filter_nodes(pod, [nodes["gpu-h100-1"], nodes["cpu-1"]], lambda _n: [])
    assert [n["metadata"]["name"] for n in chosen] == ["gpu-h100-1"]
    assert failed == {"cpu-1": "no HAMi device registration on the node"}
    annotations = pod["metadata"]["annotations"]
    assert annotations["hami.io/vgpu-node"] == "gpu-h100-1"
    assert annotations[ALLOCATED].endswith(",NVIDIA,20389,0:;")  # 25 % of 81559 MiB


def test_devices_already_given_to_other_pods_are_charged():
    """Two GPUs of 100 %: a pod of 60 % on each leaves no room for a third of 60 %."""
    node = _nodes()["gpu-h100-1"]
    placed = []
    for name in ("a", "b"):
        pod = _pod(name, "60")
        chosen, _ = filter_nodes(pod, [node], lambda _n: copy.deepcopy(placed))
        assert chosen
        placed.append(pod)
    devices = {p["metadata"]["annotations"][ALLOCATED].split(",")[0] for p in placed}
    assert len(devices) == 2
    chosen, failed = filter_nodes(_pod("c", "60"), [node], lambda _n: placed)
    assert chosen == []
    assert "no device with room" in failed["gpu-h100-1"]
    # the pod itself (scheduled again after a failed bind) is not charged twice
    again = copy.deepcopy(placed[0])
    chosen, _ = filter_nodes(again, [node], lambda _n: placed)
    assert chosen


def test_other_pods_pass_through_untouched():
    nodes = list(_nodes().values())
    plain = _pod("t", scheduler="default-scheduler")
    plain["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": "1"}
    assert not is_hami_pod(plain)
    extender = HamiExtender()
    try:
        answer = extender.filter({"Pod": plain, "Nodes": {"items": nodes}})
    finally:
        extender.stop()
    assert answer["Nodes"]["items"] == nodes
    # a pod asking HAMi's own resources is HAMi's whatever scheduler it names
    assert is_hami_pod(_pod("k", scheduler="default-scheduler"))


def test_the_scheduler_runs_a_hami_profile_without_dra_and_the_extender():
    extender = extender_config("http://127.0.0.1:1/hami")
    config = flags.scheduler_config(Path("/k"), [scheduler_profile()], [extender])
    assert [p["schedulerName"] for p in config["profiles"]] == [
        "default-scheduler",
        "hami-scheduler",
    ]
    disabled = config["profiles"][1]["plugins"]["multiPoint"]["disabled"]
    assert disabled == [{"name": "DynamicResources"}]
    managed = {r["name"]: r["ignoredByScheduler"] for r in extender["managedResources"]}
    assert managed == {
        "nvidia.com/gpu": False,  # the node advertises it: kube-scheduler counts it
        "nvidia.com/gpumem": True,
        "nvidia.com/gpumem-percentage": True,
        "nvidia.com/gpucores": True,
    }
    assert yaml.safe_load(yaml.safe_dump(config)) == config
    argv = flags.kube_scheduler(Path("/k"), Path("/c"), flags.Ports(1, 2, 3, 4, 5), Path("/f"))
    assert argv[-1] == "--config=/f"
