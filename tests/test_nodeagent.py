"""The node agent (devcluster/nodeagent, issue 35 item 2) against the real control plane: the
topology's nodes register with their own credentials and stay Ready on their Leases, kube-
scheduler binds pods to them and the agent reports them Running ("pods do not run" mode),
NodeRestriction keeps a node to its own objects, and NVIDIA's DRA driver's demo manifests,
applied with kubectl to ResourceSlices laid out as its kubelet plugin publishes them on 1.36,
are allocated by kube-scheduler as their comments say. docs/controlplane.md "Node agent".

The demo manifests are tests/dra_demo_manifests.py's (each written there to the same
effect as the driver's file it names; a Deployment's replicas as the pods it would make)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster.controlplane import ControlPlane
from devcluster.controlplane.pki import KeyPair
from devcluster.nodeagent import ApiError, NodeAgent, podstatus
from devcluster.nodeagent.credentials import load_ca
from devcluster.nodeagent.slices import node_slices
from devcluster.proctree import proc
from devcluster.topology import hami_register, load_topology
from tests import dra_demo_manifests as demos
from tests.realcluster_support import control_plane_fixture, node_agent_fixture
from tests.test_controlplane import eventually, get_json, kubectl, namespace

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
REPO = Path(__file__).resolve().parent.parent
CLAIMS = "resourceclaims.resource.k8s.io"
GPU_TAINT = demos.GPU_TAINT
HAMI = "hami.io/node-nvidia-register"
TOPOLOGY: dict[str, Any] = {
    "nodes": [
        {   # HAMi: nvidia.com/gpu = devices x deviceSplitCount, devices in its annotation
            "name": "gpu-h100-hami",
            "labels": {"gpu": "on", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
            "annotations": {HAMI: hami_register("gpu-h100-hami", 2, 81559,
                                                "NVIDIA-NVIDIA H100 80GB HBM3")},
            "capacity": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "20"},
        },
        {   # the device plugin's MIG mixed strategy
            "name": "gpu-a100-mig",
            "labels": {"nvidia.com/mig.strategy": "mixed"},
            "capacity": {"cpu": "64", "memory": "512Gi", "nvidia.com/mig-1g.10gb": "4",
                         "nvidia.com/mig-3g.40gb": "2"},
        },
        {**demos.QUICKSTART["nodes"][0], "name": "quickstart"},
        {**demos.QUICKSTART["nodes"][0], "name": "quickstart-2"},
        {"name": "share-memory", "taints": GPU_TAINT, "capacity": {"cpu": "64", "memory": "512Gi"},
         "dra": {"gpus": 1, "model": "H100-80GB", "consumableShares": "memory"}},
        {"name": "share-unlimited", "taints": GPU_TAINT,
         "capacity": {"cpu": "64", "memory": "512Gi"},
         "dra": {"gpus": 1, "model": "H100-80GB", "consumableShares": "unlimited"}},
        {"name": "share-4", "taints": GPU_TAINT, "capacity": {"cpu": "64", "memory": "512Gi"},
         "dra": {"gpus": 1, "model": "H100-80GB", "consumableShares": "4"}},
        {"name": "dynamic-mig", "taints": GPU_TAINT, "capacity": {"cpu": "64", "memory": "512Gi"},
         "dra": {"gpus": 1, "model": "A100-80GB", "mig": "dynamic"}},
        {"name": "cpu-1", "capacity": {"cpu": "16", "memory": "64Gi"}},
    ]
}  # fmt: skip
NODES = [n["name"] for n in TOPOLOGY["nodes"]]


cp = control_plane_fixture()
agent = node_agent_fixture(TOPOLOGY)


def schedulable_only(cp: ControlPlane, *names: str) -> None:
    """Cordon every topology node but `names`: each test chooses where its pods may go."""
    for name in NODES:
        kubectl(cp, "uncordon" if name in names else "cordon", name)


def apply_manifests(cp: ControlPlane, docs: list[dict]) -> None:
    """`kubectl apply` of a demo's objects; its Namespace first, until its default
    ServiceAccount exists (the ServiceAccount admission plugin refuses pods before)."""
    docs = list(yaml.safe_load_all(yaml.safe_dump_all(docs)))  # plain manifest data
    for doc in docs:
        if doc["kind"] == "Namespace":
            namespace(cp, doc["metadata"]["name"])
    rest = [d for d in docs if d["kind"] != "Namespace"]
    stdin = {"apiVersion": "v1", "kind": "List", "items": rest}
    kubectl(cp, "apply", "-f", "-", stdin=stdin)


def pods(cp: ControlPlane, ns: str) -> dict[str, dict]:
    return {p["metadata"]["name"]: p for p in get_json(cp, "pods", "-n", ns)["items"]}


def running(cp: ControlPlane, ns: str) -> list[str]:
    return sorted(n for n, p in pods(cp, ns).items() if p["status"].get("phase") == "Running")


def devices(cp: ControlPlane) -> dict[tuple[str, str], dict]:
    """(pool, device name) -> the device as its ResourceSlice publishes it."""
    return {
        (s["spec"]["pool"]["name"], d["name"]): d
        for s in get_json(cp, "resourceslices")["items"]
        for d in s["spec"].get("devices") or []
    }


def results(cp: ControlPlane, ns: str, pod: str) -> list[dict]:
    """The allocation results of the pod's (first) claim, made from its template."""
    status = get_json(cp, "pod", pod, "-n", ns)["status"]
    claim = status["resourceClaimStatuses"][0]["resourceClaimName"]
    return get_json(cp, CLAIMS, claim, "-n", ns)["status"]["allocation"]["devices"]["results"]


def attribute(device: dict, name: str) -> str:
    value = device["attributes"][name]
    return next(iter(value.values()))


def failed_scheduling(cp: ControlPlane, ns: str, pod: str) -> str | None:
    events = get_json(cp, "events", "-n", ns, f"--field-selector=involvedObject.name={pod}")
    found = [e["message"] for e in events["items"] if e["reason"] == "FailedScheduling"]
    return found[-1] if found else None


# ---------------------------------------------------------------- no cluster needed
def test_dynamic_mig_slices_put_the_counter_sets_first_then_a_slice_per_gpu():
    spec = {"gpus": 2, "model": "A100-80GB", "mig": "dynamic"}
    first, gpu0, gpu1 = node_slices("n", spec)
    assert [c["name"] for c in first["spec"]["sharedCounters"]] == [
        "gpu-0-counter-set",
        "gpu-1-counter-set",
    ]
    assert "devices" not in first["spec"]
    assert {d["name"].split("-")[1] for d in gpu0["spec"]["devices"]} == {"0"}
    assert {d["name"].split("-")[1] for d in gpu1["spec"]["devices"]} == {"1"}
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in (first, gpu0, gpu1)} == {3}
    [whole] = node_slices("n", {"gpus": 2, "model": "H100-80GB"})
    assert [d["name"] for d in whole["spec"]["devices"]] == ["gpu-0", "gpu-1"]


def test_a_running_status_keeps_the_scheduler_s_condition_and_completes_init_containers():
    scheduled = {"type": "PodScheduled", "status": "True"}
    pod = {
        "metadata": {"uid": "u1"},
        "spec": {"initContainers": [{"name": "init"}], "containers": [{"name": "main"}]},
        "status": {"phase": "Pending", "conditions": [scheduled]},
    }
    status = podstatus.running(pod, "10.244.0.2", "127.0.0.1", "2026-01-01T00:00:00Z")
    assert status["conditions"][0] == scheduled
    assert {c["type"] for c in status["conditions"]} >= {"Ready", "ContainersReady"}
    assert status["initContainerStatuses"][0]["state"]["terminated"]["reason"] == "Completed"
    assert podstatus.reported({**pod, "status": status})
    done = podstatus.finished({**pod, "status": status}, 3, "2026-01-01T00:00:01Z")
    assert done["phase"] == "Failed"


def test_a_sidecar_is_reported_running_and_ready_in_the_pods_do_not_run_mode():
    """An init container with restartPolicy Always (a sidecar, KEP-753) runs beside the app
    containers: running, started and ready, not Completed (kubectl would print 1/2)."""
    pod = {
        "metadata": {"name": "p", "namespace": "default", "uid": "u"},
        "spec": {
            "initContainers": [{"name": "setup"}, {"name": "proxy", "restartPolicy": "Always"}],
            "containers": [{"name": "main"}],
        },
    }
    status = podstatus.running(pod, "10.244.0.2", "127.0.0.1", "2026-01-01T00:00:00Z")
    setup, proxy = status["initContainerStatuses"]
    assert setup["state"]["terminated"]["reason"] == "Completed"
    assert proxy["state"] == {"running": {"startedAt": "2026-01-01T00:00:00Z"}}, proxy
    assert proxy["ready"] and proxy["started"], proxy


def test_a_missing_cluster_ca_is_named(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="no cluster CA file .*ca.crt"):
        load_ca(KeyPair(tmp_path / "ca.crt", tmp_path / "ca.key"))


# ---------------------------------------------------------------- registration
def test_nodes_register_with_capacity_labels_and_hami_s_annotations(cp, agent):
    nodes = {n["metadata"]["name"]: n for n in get_json(cp, "nodes")["items"]}
    assert set(NODES) <= set(nodes)
    hami = nodes["gpu-h100-hami"]
    assert hami["status"]["allocatable"]["nvidia.com/gpu"] == "20"
    assert hami["metadata"]["labels"]["gpu"] == "on"
    assert json.loads(hami["metadata"]["annotations"][HAMI])[1]["devmem"] == 81559
    mig = nodes["gpu-a100-mig"]["status"]
    assert mig["capacity"]["nvidia.com/mig-1g.10gb"] == "4"
    assert mig["allocatable"]["nvidia.com/mig-3g.40gb"] == "2"
    for node in nodes.values():
        status = node["status"]
        ready = next(c for c in status["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True"
        assert {"type": "InternalIP", "address": "127.0.0.1"} in status["addresses"]
        # the agent's kubelet API (kubeletapi.py), on a port of its own
        assert status["daemonEndpoints"]["kubeletEndpoint"]["Port"] == agent.kubelet_api.port
        assert status["nodeInfo"]["kubeletVersion"] == "v1.36.3"


def test_each_node_renews_its_lease_and_stays_ready(cp, agent):
    """The node-lifecycle controller marks a node NotReady ~50 s after its last renewal; rather
    than wait that out, the Lease is seen renewed, and the nodes are still Ready."""

    def renewals() -> dict[str, str]:
        leases = get_json(cp, "leases", "-n", "kube-node-lease")["items"]
        return {x["metadata"]["name"]: x["spec"]["renewTime"] for x in leases}

    first = renewals()
    assert set(NODES) <= set(first)
    lease = get_json(cp, "lease", "cpu-1", "-n", "kube-node-lease")
    assert lease["spec"]["holderIdentity"] == "cpu-1"
    assert lease["metadata"]["ownerReferences"][0]["kind"] == "Node"
    eventually(
        lambda: all(renewals()[n] > first[n] for n in NODES), "every Lease renewed", timeout=60
    )
    for name in NODES:
        node = get_json(cp, "node", name)
        ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True", name
        taints = {t["key"] for t in node["spec"].get("taints") or []}
        assert not taints & {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}


def test_resource_slices_are_laid_out_as_nvidia_s_plugin_publishes_them_on_1_36(cp, agent):
    """driver.go: one slice for a node without DynamicMIG; with it, the counter sets in a slice
    of their own first, then a slice of devices per GPU (resourceSliceCount = GPUs + 1)."""
    slices = get_json(cp, "resourceslices")["items"]
    by_node: dict[str, list[dict]] = {}
    for s in slices:
        by_node.setdefault(s["spec"]["nodeName"], []).append(s["spec"])
    assert set(by_node) == {
        "quickstart",
        "quickstart-2",
        "share-memory",
        "share-unlimited",
        "share-4",
        "dynamic-mig",
    }
    [quickstart] = by_node["quickstart"]
    assert len(quickstart["devices"]) == 4 * 4 + 4  # 4 GPUs of 4 MIG devices, 4 whole GPUs
    dynamic = by_node["dynamic-mig"]
    assert {s["pool"]["resourceSliceCount"] for s in dynamic} == {2}
    [counters] = [s for s in dynamic if "sharedCounters" in s]
    [gpu0] = [s for s in dynamic if "devices" in s]
    assert "devices" not in counters and "sharedCounters" not in gpu0
    assert [c["name"] for c in counters["sharedCounters"]] == ["gpu-0-counter-set"]
    assert all(d["consumesCounters"][0]["counterSet"] == "gpu-0-counter-set"
               for d in gpu0["devices"])  # fmt: skip
    memory = by_node["share-memory"][0]["devices"][0]
    assert memory["allowMultipleAllocations"] is True


# ---------------------------------------------------------------- pods
def test_a_gpu_pod_is_bound_by_kube_scheduler_and_reported_running_then_deleted(cp, agent):
    schedulable_only(cp, "gpu-h100-hami", "gpu-a100-mig", "cpu-1")
    namespace(cp, "gpu")
    for name, resource in (
        ("wants-gpu", "nvidia.com/gpu"),
        ("wants-mig", "nvidia.com/mig-1g.10gb"),
    ):
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "gpu"},
            "spec": {"containers": [{"name": "main", "image": "busybox",
                                     "resources": {"limits": {resource: "1"}}}]},
        }  # fmt: skip
        kubectl(cp, "create", "-f", "-", stdin=pod)
    for name, node in (("wants-gpu", "gpu-h100-hami"), ("wants-mig", "gpu-a100-mig")):
        pod = eventually(
            lambda n=name: (
                (p := get_json(cp, "pod", n, "-n", "gpu"))["status"].get("phase") == "Running" and p
            ),
            f"{name} Running",
        )
        assert pod["spec"]["nodeName"] == node
        status = pod["status"]
        conditions = {c["type"]: c["status"] for c in status["conditions"]}
        assert conditions["Ready"] == conditions["PodScheduled"] == "True"
        [container] = status["containerStatuses"]
        assert container["ready"] and "running" in container["state"]
        assert status["podIP"].startswith("10.244.") and status["hostIP"] == "127.0.0.1"
    # a deletion completes: the agent removes the pod with grace 0, as a kubelet would
    kubectl(cp, "delete", "pod", "wants-gpu", "-n", "gpu", "--wait=true", "--timeout=60s")
    assert "wants-gpu" not in pods(cp, "gpu")


def test_node_restriction_keeps_a_node_to_its_own_objects(cp, agent):
    client = next(r.client for r in agent.runners if r.name == "cpu-1")
    assert client.user == "system:node:cpu-1"
    own = client.merge_patch("/api/v1/nodes/cpu-1", {"metadata": {"labels": {"mine": "yes"}}})
    assert own["metadata"]["labels"]["mine"] == "yes"
    with pytest.raises(ApiError) as refused:
        client.merge_patch("/api/v1/nodes/gpu-h100-hami", {"metadata": {"labels": {"x": "y"}}})
    assert refused.value.status == 403
    assert 'node "cpu-1"' in refused.value.message
    foreign = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "not-mine"},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": "quickstart", "devices": [],
                 "pool": {"name": "quickstart", "generation": 1, "resourceSliceCount": 1}},
    }  # fmt: skip
    with pytest.raises(ApiError) as refused:
        client.create("/apis/resource.k8s.io/v1/resourceslices", foreign)
    assert refused.value.status == 403


# ---------------------------------------------------------------- NVIDIA's DRA demos
def test_quickstart_gpu_test1_test4_and_mps_are_allocated_by_kube_scheduler(cp, agent):
    """gpu-test1: two pods, a GPU each; gpu-test4: four replicas, each 2 x 1g.5gb + 2g.10gb +
    3g.20gb of one parent GPU (matchAttribute parentUUID), a GPU each; gpu-test5: a time-sliced
    and an MPS GPU, their GpuConfigs carried in the allocation for the kubelet plugin."""
    schedulable_only(cp, "quickstart")
    for docs in (demos.gpu_test1(), demos.gpu_test4(), demos.gpu_test5()):
        apply_manifests(cp, docs)
    for ns, count in (("gpu-test1", 2), ("gpu-test4", 4), ("gpu-test5", 1)):
        eventually(lambda ns=ns, n=count: len(running(cp, ns)) == n, f"{ns}'s pods Running")
    published = devices(cp)

    def allocated(ns: str, pod: str) -> list[dict]:
        found = results(cp, ns, pod)
        assert {r["pool"] for r in found} == {"quickstart"}
        return [published[(r["pool"], r["device"])] | {"request": r["request"]} for r in found]

    one, two = allocated("gpu-test1", "pod1"), allocated("gpu-test1", "pod2")
    assert [attribute(d, "type") for d in one + two] == ["gpu", "gpu"]
    assert one[0]["name"] != two[0]["name"]
    parents = set()
    for replica in range(4):
        mine = sorted(allocated("gpu-test4", f"pod-{replica}"), key=lambda d: d["request"])
        assert [attribute(d, "profile") for d in mine] == ["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"]
        [parent] = {attribute(d, "parentUUID") for d in mine}
        parents.add(parent)
    assert len(parents) == 4
    ts, mps = sorted(allocated("gpu-test5", "pod0"), key=lambda d: d["request"] != "ts-gpu")
    assert attribute(ts, "type") == attribute(mps, "type") == "gpu" and ts["name"] != mps["name"]
    claim = get_json(cp, "pod", "pod0", "-n", "gpu-test5")["status"]["resourceClaimStatuses"][0]
    config = get_json(cp, CLAIMS, claim["resourceClaimName"], "-n", "gpu-test5")["status"][
        "allocation"
    ]["devices"]["config"]
    assert [(c["requests"], c["opaque"]["parameters"]["sharing"]["strategy"]) for c in config] == [
        (["ts-gpu"], "TimeSlicing"),
        (["mps-gpu"], "MPS"),
    ]


def test_quickstart_gpu_test2_test3_share_and_gpu_test6_waits_on_a_missing_attribute(cp, agent):
    """gpu-test2: two containers, one claim, one GPU; gpu-test3: two pods, one ResourceClaim
    reserved for both; gpu-test6 selects on `index`, which the plugin no longer publishes: the
    scheduler's CEL evaluation fails and its pods stay Pending (as
    the Python devcluster's allocator said before issue 35)."""
    schedulable_only(cp, "quickstart-2")
    for docs in (demos.gpu_test2(), demos.gpu_test3(), demos.gpu_test6()):
        apply_manifests(cp, docs)
    eventually(lambda: running(cp, "gpu-test2") == ["pod"], "gpu-test2's pod Running")
    eventually(lambda: running(cp, "gpu-test3") == ["pod1", "pod2"], "gpu-test3's pods Running")
    [shared] = results(cp, "gpu-test2", "pod")
    assert shared["pool"] == "quickstart-2"
    claim = get_json(cp, CLAIMS, "single-gpu", "-n", "gpu-test3")["status"]
    assert sorted(r["name"] for r in claim["reservedFor"]) == ["pod1", "pod2"]
    assert len(claim["allocation"]["devices"]["results"]) == 1
    message = eventually(lambda: failed_scheduling(cp, "gpu-test6", "pod-0"), "gpu-test6 waits")
    assert "no such key: index" in message, message
    assert running(cp, "gpu-test6") == []
    kubectl(cp, "delete", "namespace", "gpu-test6", "--wait=true", "--timeout=120s")


def test_unlimited_sharing_lets_six_replicas_share_one_gpu(cp, agent):
    schedulable_only(cp, "share-unlimited")
    ns = "gpu-share-unlimited"
    apply_manifests(cp, demos.sharing(ns, "unlimited-sharing", "gpu-unlimited", 6))
    eventually(lambda: len(running(cp, ns)) == 6, "six replicas Running")
    found = {(r["pool"], r["device"]) for i in range(6)
             for r in results(cp, ns, f"unlimited-sharing-{i}")}  # fmt: skip
    assert found == {("share-unlimited", "gpu-0")}


def test_memory_sharing_two_replicas_share_one_gpu_by_4gi(cp, agent):
    schedulable_only(cp, "share-memory")
    apply_manifests(cp, demos.sharing("gpu-share-memory", "memory-sharing", "gpu-4gi", 2, "4Gi"))
    eventually(lambda: len(running(cp, "gpu-share-memory")) == 2, "both replicas Running")
    found = [results(cp, "gpu-share-memory", f"memory-sharing-{i}")[0] for i in range(2)]
    assert {(r["pool"], r["device"]) for r in found} == {("share-memory", "gpu-0")}
    assert all(r["consumedCapacity"] == {"memory": "4Gi"} and r["shareID"] for r in found)
    assert found[0]["shareID"] != found[1]["shareID"]


def test_integer_sharing_runs_four_replicas_on_one_gpu_and_a_fifth_waits(cp, agent):
    schedulable_only(cp, "share-4")
    ns = "gpu-share-integer"
    apply_manifests(cp, demos.sharing(ns, "integer-sharing", "gpu-1share", 5))
    eventually(lambda: len(running(cp, ns)) == 4, "four replicas Running")
    waiting = [n for n, p in pods(cp, ns).items() if p["status"].get("phase") != "Running"]
    assert len(waiting) == 1
    message = eventually(lambda: failed_scheduling(cp, ns, waiting[0]), "the fifth waits")
    assert "cannot allocate all claims" in message
    for name in running(cp, ns):
        [result] = results(cp, ns, name)
        assert result["device"] == "gpu-0"
        assert result["consumedCapacity"]["shares"] == "1"
    # the fifth would take a whole GPU of the next node uncordoned (gpu.nvidia.com matches it)
    kubectl(cp, "delete", "pod", waiting[0], "-n", ns, "--wait=true", "--timeout=60s")


def test_dynamic_mig_devices_are_placed_by_the_counters_of_a_separate_slice(cp, agent):
    """A 4g.40gb (memory slices 0-3 only) and a 3g.40gb claimed together: the allocator, reading
    the counter set from its own slice, must put the 3g at slices 4-7."""
    schedulable_only(cp, "dynamic-mig")
    namespace(cp, "dmig")
    requests = [
        demos.exactly(f"mig-{p.replace('.', '-')}", "mig.nvidia.com", selectors=demos.profile(p))
        for p in ("4g.40gb", "3g.40gb")
    ]
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "two-migs", "namespace": "dmig"},
        "spec": {"devices": {"requests": requests}},
    }
    pod = demos.pod("dmig", "migs", [demos.container("ctr", {"name": "migs"})],
                    [{"name": "migs", "resourceClaimName": "two-migs"}])  # fmt: skip
    apply_manifests(cp, [claim, pod])
    eventually(lambda: running(cp, "dmig") == ["migs"], "the pod Running")
    found = get_json(cp, CLAIMS, "two-migs", "-n", "dmig")["status"]["allocation"]
    names = sorted(r["device"] for r in found["devices"]["results"])
    assert names == ["gpu-0-mig-3g40gb-9-4", "gpu-0-mig-4g40gb-5-0"]


# ---------------------------------------------------------------- the command
def test_the_command_registers_a_topology_and_stops_on_sigterm(cp, tmp_path: Path):
    topology = tmp_path / "one.yaml"
    topology.write_text(yaml.safe_dump({"nodes": [
        {"name": "cli-node", "unschedulable": True, "capacity": {"cpu": "4", "memory": "8Gi"}}
    ]}))  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "devcluster.nodeagent", "--kubeconfig", str(cp.kubeconfig),
         "--topology", str(topology)],
        cwd=REPO, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        eventually(
            lambda: kubectl(cp, "get", "lease", "cli-node", "-n", "kube-node-lease",
                            check=False).returncode == 0,
            "cli-node's Lease",
        )  # fmt: skip
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
    assert "nodeagent: stopping" in proc.stderr.read()


def test_the_command_says_in_one_line_what_it_cannot_read(tmp_path: Path):
    result = subprocess.run(
        [sys.executable, "-m", "devcluster.nodeagent", "--kubeconfig", str(tmp_path / "none"),
         "--topology", str(tmp_path / "none.yaml")],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.startswith("nodeagent: cannot read the kubeconfig or topology:")
    assert len(result.stderr.strip().splitlines()) == 1


# ---------------------------------------------------------------- run mode
RUN_TAINT = {"key": "devcluster.io/run", "value": "true", "effect": "NoSchedule"}


@pytest.fixture(scope="module")
def runner(cp: ControlPlane, agent: NodeAgent) -> Iterator[NodeAgent]:
    """A second agent, in run mode, for one node only pods that tolerate its taint go to."""
    topology = load_topology(
        {"nodes": [{"name": "run-node", "taints": [RUN_TAINT],
                    "capacity": {"cpu": "8", "memory": "16Gi"}}]}
    )  # fmt: skip
    state = cp.state_dir / "nodeagent-run"
    with NodeAgent.start(topology, cp.server, cp.pki.ca, state, mode="run") as running:
        yield running
        assert running.runtime is not None
        left = [proc(r.process.pid) for r in running.runtime.kubelet.running.values()]
        assert left, "the run-mode test leaves a pod running"
    # a stopped agent leaves no pod's process behind
    eventually(lambda: not any(p and p.alive() for p in left), "the pods' processes end", 30)


def run_pod(name: str, command: list[str], **container: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "run"},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": {"kubernetes.io/hostname": "run-node"},
            "tolerations": [{**RUN_TAINT, "operator": "Equal"}],
            "containers": [{"name": "main", "image": "python", "command": command, **container}],
        },
    }


def phase(cp: ControlPlane, name: str, *phases: str) -> dict | None:
    pod = get_json(cp, "pod", name, "-n", "run")
    return pod if pod["status"].get("phase") in phases else None


def test_run_mode_runs_the_container_with_the_kubelet_s_env_and_reports_its_exit(cp, runner):
    namespace(cp, "run")
    check = (
        "import os, sys; e = os.environ; "
        "sys.exit(0 if (e['GREETING'], e['POD_NAME'], e['POD_IP'], e['KUBERNETES_SERVICE_PORT'])"
        f" == ('hi', 'env', e['POD_IP'], '{cp.ports.apiserver}') else 5)"
    )
    env = [
        {"name": "GREETING", "value": "hi"},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]
    for pod in (
        run_pod("env", ["python", "-c", check], env=env),
        run_pod("fails", ["python", "-c", "raise SystemExit(3)"]),
        run_pod("sleeps", ["sleep", "600"]),
        run_pod("missing", ["no-such-program"]),
        run_pod("left", ["sleep", "600"]),  # still running when the agent stops
    ):
        kubectl(cp, "create", "-f", "-", stdin=pod)
    done = eventually(lambda: phase(cp, "env", "Succeeded", "Failed"), "env exits")
    assert done["status"]["phase"] == "Succeeded", done["status"]
    failed = eventually(lambda: phase(cp, "fails", "Succeeded", "Failed"), "fails exits")
    terminated = failed["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (failed["status"]["phase"], terminated["exitCode"]) == ("Failed", 3)
    eventually(lambda: phase(cp, "left", "Running"), "left Running")
    sleeping = eventually(lambda: phase(cp, "sleeps", "Running"), "sleeps Running")
    assert sleeping["status"]["containerStatuses"][0]["ready"] is True
    assert runner.runtime is not None
    [(key, process)] = [
        (k, r.process) for k, r in runner.runtime.kubelet.running.items() if k[1] == "sleeps"
    ]
    assert process.returncode is None
    waiting = eventually(
        lambda: get_json(cp, "pod", "missing", "-n", "run")["status"].get("containerStatuses"),
        "missing's status",
    )[0]["state"]["waiting"]
    assert waiting["reason"] == "CreateContainerError"
    assert "executable file not found" in waiting["message"]
    # deleting the running pod stops its process, then the pod goes
    kubectl(cp, "delete", "pod", "sleeps", "-n", "run", "--wait=true", "--timeout=60s")
    assert key not in runner.runtime.kubelet.running
    assert process.returncode is not None
