"""The NVIDIA DRA driver's own demo manifests, applied to a devcluster whose node matches the
demo's, behave as the driver's documentation says (issue 30 item 4: fidelity measured).

kubernetes-sigs/dra-driver-nvidia-gpu at 9593204: demo/specs/quickstart/v1/gpu-test{1..6}.yaml
(README.md and demo/specs/quickstart/README.md: an 8-GPU node with MIG enabled on GPUs 0-3 in
mig-parted-config.yaml's `half-balanced` layout, 2 x 1g.5gb + 2g.10gb + 3g.20gb each, A100 40GB)
and demo/specs/consumable-shares/{memory,integer,unlimited}-sharing.yaml (their README: the
plugin's --consumable-shares=memory|N|unlimited). Each manifest below is written here to the same
effect as the file it names (the same objects, requests, selectors and constraints), with two
differences a devcluster needs: a Deployment's replicas are created as the pods its ReplicaSet
would make (`<name>-<i>`; apps/v1 is not served), and containers run `sleep` instead of
`nvidia-smi -L` (no GPU here). Only a pod's first container runs as a process; the devices each
container would see are read from the kubelet's CDI environment for every container.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster import DevCluster
from devcluster.admission import RequestInfo
from devcluster.dra.controller import DEVICES_ENV
from tests.devcluster_helpers import poll

pytestmark = pytest.mark.e2e

CLAIMS = "resourceclaims.resource.k8s.io"
TOLERATE = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
GPU_TAINT = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
#: the quickstart's machine: 8 x A100-SXM4-40GB, half-balanced MIG layout on GPUs 0-3
QUICKSTART = {
    "nodes": [
        {
            "name": "gpu-node",
            "capacity": {"cpu": "96", "memory": "1Ti"},
            "taints": GPU_TAINT,
            "dra": {
                "gpus": 8,
                "model": "A100-40GB",
                "mig": "static",
                "migGpus": [0, 1, 2, 3],
                "migDevices": ["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"],
            },
        }
    ]
}


def shares_node(mode: str) -> dict[str, Any]:
    """One H100 whose plugin runs --consumable-shares=<mode> (the consumable-shares README)."""
    return {
        "nodes": [
            {
                "name": "gpu-node",
                "capacity": {"cpu": "64", "memory": "512Gi"},
                "taints": GPU_TAINT,
                "dra": {"gpus": 1, "model": "H100-80GB", "consumableShares": mode},
            }
        ]
    }


@pytest.fixture
async def cluster(tmp_path: Path, request) -> AsyncIterator[DevCluster]:
    async with DevCluster(request.param, state_dir=tmp_path / "state") as running:
        yield running


def container(name: str, *claims: dict[str, str]) -> dict[str, Any]:
    return {
        "name": name,
        "image": "ubuntu:22.04",
        "command": ["sleep", "600"],
        "resources": {"claims": list(claims)},
    }


def pod(ns: str, name: str, containers: list, claims: list, labels=None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"namespace": ns, "name": name, "labels": labels or {"app": "pod"}},
        "spec": {"containers": containers, "resourceClaims": claims, "tolerations": TOLERATE},
    }


def deployment(ns: str, name: str, replicas: int, spec_pod: dict[str, Any]) -> list[dict]:
    """The pods a Deployment's ReplicaSet makes (apps/v1 is not served by the devcluster)."""
    return [pod(ns, f"{name}-{i}", **spec_pod) for i in range(replicas)]


def claim_template(ns: str, name: str, requests: list, **devices: Any) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"namespace": ns, "name": name},
        "spec": {"spec": {"devices": {"requests": requests, **devices}}},
    }


def exactly(name: str, device_class: str, **more: Any) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": device_class, **more}}


def profile(p: str) -> list[dict[str, Any]]:
    return [{"cel": {"expression": f"device.attributes['gpu.nvidia.com'].profile == '{p}'"}}]


# ---------------------------------------------------------------- the manifests
def gpu_test1() -> list[dict]:
    """quickstart/v1/gpu-test1.yaml: two pods, one container each, each its own GPU."""
    ns = "gpu-test1"
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        claim_template(ns, "single-gpu", [exactly("gpu", "gpu.nvidia.com")]),
        *[
            pod(ns, name, [container("ctr", {"name": "gpu"})],
                [{"name": "gpu", "resourceClaimTemplateName": "single-gpu"}])
            for name in ("pod1", "pod2")
        ],
    ]  # fmt: skip


def gpu_test2() -> list[dict]:
    """quickstart/v1/gpu-test2.yaml: one pod, two containers sharing one claim's GPU."""
    ns = "gpu-test2"
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        claim_template(ns, "single-gpu", [exactly("gpu", "gpu.nvidia.com")]),
        pod(ns, "pod", [container("ctr0", {"name": "shared-gpu"}),
                        container("ctr1", {"name": "shared-gpu"})],
            [{"name": "shared-gpu", "resourceClaimTemplateName": "single-gpu"}]),
    ]  # fmt: skip


def gpu_test3() -> list[dict]:
    """quickstart/v1/gpu-test3.yaml: two pods sharing one ResourceClaim (a global GPU)."""
    ns = "gpu-test3"
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
         "metadata": {"namespace": ns, "name": "single-gpu"},
         "spec": {"devices": {"requests": [exactly("gpu", "gpu.nvidia.com")]}}},
        *[
            pod(ns, name, [container("ctr", {"name": "shared-gpu"})],
                [{"name": "shared-gpu", "resourceClaimName": "single-gpu"}])
            for name in ("pod1", "pod2")
        ],
    ]  # fmt: skip


def gpu_test4() -> list[dict]:
    """quickstart/v1/gpu-test4.yaml: a Deployment of 4 pods, each claiming 2 x 1g.5gb, a
    2g.10gb and a 3g.20gb MIG device with matchAttribute gpu.nvidia.com/parentUUID: all four
    from one GPU."""
    ns = "gpu-test4"
    requests = [
        exactly("mig-1g-5gb-0", "mig.nvidia.com", selectors=profile("1g.5gb")),
        exactly("mig-1g-5gb-1", "mig.nvidia.com", selectors=profile("1g.5gb")),
        exactly("mig-2g-10gb", "mig.nvidia.com", selectors=profile("2g.10gb")),
        exactly("mig-3g-20gb", "mig.nvidia.com", selectors=profile("3g.20gb")),
    ]
    constraints = [{"requests": [], "matchAttribute": "gpu.nvidia.com/parentUUID"}]
    containers = [
        container(f"ctr{i}", {"name": "mig-devices", "request": r["name"]})
        for i, r in enumerate(requests)
    ]
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        claim_template(ns, "mig-devices", requests, constraints=constraints),
        *deployment(ns, "pod", 4, {"containers": containers, "claims": [
            {"name": "mig-devices", "resourceClaimTemplateName": "mig-devices"}]}),
    ]  # fmt: skip


def gpu_test5() -> list[dict]:
    """quickstart/v1/gpu-test5.yaml: one pod, two GPUs, one time-sliced, one under MPS (opaque
    GpuConfig per request)."""
    ns = "gpu-test5"
    config = [
        {"requests": ["ts-gpu"], "opaque": {"driver": "gpu.nvidia.com", "parameters": {
            "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
            "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}}}},
        {"requests": ["mps-gpu"], "opaque": {"driver": "gpu.nvidia.com", "parameters": {
            "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
            "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50,
                        "defaultPinnedDeviceMemoryLimit": "10Gi"}}}}},
    ]  # fmt: skip
    containers = [
        container(name, {"name": "shared-gpus", "request": request})
        for name, request in (("ts-ctr0", "ts-gpu"), ("ts-ctr1", "ts-gpu"),
                              ("mps-ctr0", "mps-gpu"), ("mps-ctr1", "mps-gpu"))
    ]  # fmt: skip
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        claim_template(ns, "multiple-gpus", [exactly("ts-gpu", "gpu.nvidia.com"),
                       exactly("mps-gpu", "gpu.nvidia.com")], config=config),
        pod(ns, "pod0", containers, [{"name": "shared-gpus",
                                      "resourceClaimTemplateName": "multiple-gpus"}]),
    ]  # fmt: skip


def gpu_test6() -> list[dict]:
    """quickstart/v1/gpu-test6.yaml: 4 replicas, each an A100 whose `index` attribute is even."""
    ns = "gpu-test6"
    expression = (
        "device.attributes['gpu.nvidia.com'].productName.lowerAscii().matches('^.*a100.*$')\n&&\n"
        "(device.attributes['gpu.nvidia.com'].index == 0 ||\n"
        "device.attributes['gpu.nvidia.com'].index == 2 ||\n"
        "device.attributes['gpu.nvidia.com'].index == 4 ||\n"
        "device.attributes['gpu.nvidia.com'].index == 6)\n"
    )
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        claim_template(ns, "a100", [exactly("gpu", "gpu.nvidia.com",
                       selectors=[{"cel": {"expression": expression}}])]),
        *deployment(ns, "pod", 4, {"containers": [container("ctr", {"name": "a100"})],
                    "claims": [{"name": "a100", "resourceClaimTemplateName": "a100"}]}),
    ]  # fmt: skip


def sharing(ns: str, name: str, template_name: str, replicas: int, memory: str = "") -> list:
    """consumable-shares/{memory,integer,unlimited}-sharing.yaml: a Deployment whose replicas each
    claim gpu.nvidia.com from one template (memory-sharing asks `capacity.requests.memory`)."""
    request = exactly("gpu", "gpu.nvidia.com")
    if memory:
        request["exactly"]["capacity"] = {"requests": {"memory": memory}}
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        claim_template(ns, template_name, [request]),
        *deployment(ns, name, replicas, {"containers": [container("ctr", {"name": "gpu"})],
                    "claims": [{"name": "gpu", "resourceClaimTemplateName": template_name}],
                    "labels": {"app": name}}),
    ]  # fmt: skip


# ---------------------------------------------------------------- applying and reading
PLURALS = {
    "Namespace": "namespaces",
    "Pod": "pods",
    "ResourceClaim": CLAIMS,
    "ResourceClaimTemplate": "resourceclaimtemplates.resource.k8s.io",
}


async def apply(cluster: DevCluster, docs: list[dict]) -> None:
    """`kubectl apply -f`: each object through the API, in order (YAML round trip first, so
    what is applied is plain manifest data)."""
    for doc in yaml.safe_load_all(yaml.safe_dump_all(docs)):
        ns = doc["metadata"].get("namespace")
        await cluster.api_create(PLURALS[doc["kind"]], "v1", ns, doc, RequestInfo())


def pods(cluster: DevCluster, ns: str) -> dict[str, dict]:
    return {p["metadata"]["name"]: p for p in cluster.list("pods", ns)}


def running(cluster: DevCluster, ns: str) -> list[str]:
    return sorted(n for n, p in pods(cluster, ns).items() if p["status"].get("phase") == "Running")


def seen(cluster: DevCluster, ns: str, pod_name: str, ctr: str) -> list[str]:
    """The GPU or MIG device UUIDs the container's CDI devices give it."""
    p = cluster.get("pods", ns, pod_name)
    c = next(c for c in p["spec"]["containers"] if c["name"] == ctr)
    value = cluster.dra.claim_env(p, c).get(DEVICES_ENV, "")
    return value.split(",") if value else []


def devices(cluster: DevCluster) -> dict[str, dict]:
    return {
        d["attributes"]["uuid"]["string"]: d
        for s in cluster.list("resourceslices.resource.k8s.io")
        for d in s["spec"]["devices"]
        if "uuid" in d["attributes"]
    }


def event(cluster: DevCluster, ns: str, pod_name: str) -> str | None:
    found = [e for e in cluster.events_for(ns, pod_name) if e["reason"] == "FailedScheduling"]
    return found[-1]["message"] if found else None


# ---------------------------------------------------------------- quickstart
@pytest.mark.parametrize("cluster", [QUICKSTART], indirect=True)
async def test_quickstart_gpu_tests_1_to_4_run_together_on_the_half_balanced_node(cluster):
    """The quickstart applies gpu-test{1,2,3,4}.yaml together: every pod runs; test1's two pods
    have a GPU each, test2's two containers and test3's two pods share one, test4's four
    replicas each hold four MIG devices of one parent GPU (demo/specs/quickstart/README.md,
    README.md "both containers operate on the same GPU device")."""
    for docs in (gpu_test1(), gpu_test2(), gpu_test3(), gpu_test4()):
        await apply(cluster, docs)
    await poll(lambda: len(running(cluster, "gpu-test4")) == 4, "gpu-test4's 4 replicas run")
    for ns, expected in (("gpu-test1", 2), ("gpu-test2", 1), ("gpu-test3", 2)):
        await poll(lambda ns=ns, n=expected: len(running(cluster, ns)) == n, f"{ns} runs")
    whole = devices(cluster)
    # gpu-test1: one full GPU each, not the same
    one, two = seen(cluster, "gpu-test1", "pod1", "ctr"), seen(cluster, "gpu-test1", "pod2", "ctr")
    assert len(one) == len(two) == 1 and one != two
    assert all(whole[u]["attributes"]["type"]["string"] == "gpu" for u in one + two)
    # gpu-test2: both containers, one GPU
    assert seen(cluster, "gpu-test2", "pod", "ctr0") == seen(cluster, "gpu-test2", "pod", "ctr1")
    # gpu-test3: two pods, one claim, one GPU, both reserving it
    assert seen(cluster, "gpu-test3", "pod1", "ctr") == seen(cluster, "gpu-test3", "pod2", "ctr")
    shared = cluster.get(CLAIMS, "gpu-test3", "single-gpu")
    assert sorted(c["name"] for c in shared["status"]["reservedFor"]) == ["pod1", "pod2"]
    # four distinct full GPUs among tests 1-3 (the node's GPUs 4-7)
    full = set(one + two + seen(cluster, "gpu-test2", "pod", "ctr0")
               + seen(cluster, "gpu-test3", "pod1", "ctr"))  # fmt: skip
    assert len(full) == 4
    # gpu-test4: per replica, ctr0..ctr3 see their own MIG device, all of one parent
    parents = set()
    for replica in range(4):
        mine = [seen(cluster, "gpu-test4", f"pod-{replica}", f"ctr{i}") for i in range(4)]
        assert all(len(m) == 1 for m in mine)
        profiles = [whole[m[0]]["attributes"]["profile"]["string"] for m in mine]
        assert profiles == ["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"]
        parent = {whole[m[0]]["attributes"]["parentUUID"]["string"] for m in mine}
        assert len(parent) == 1
        parents |= parent
    assert len(parents) == 4  # each replica a GPU of its own: the layout has one set per GPU

    # the node is full: one more replica of gpu-test1 or gpu-test4 waits, in the scheduler's words
    extra = gpu_test1()[2]
    extra["metadata"]["name"] = "pod3"
    await apply(cluster, [extra])
    message = await poll(lambda: event(cluster, "gpu-test1", "pod3"), "pod3 unschedulable")
    assert message.startswith("0/1 nodes are available: 1 cannot allocate all claims.")
    assert cluster.get("pods", "gpu-test1", "pod3")["status"]["phase"] == "Pending"


@pytest.mark.parametrize("cluster", [QUICKSTART], indirect=True)
async def test_quickstart_gpu_test5_gets_two_gpus_with_their_sharing_configs(cluster):
    await apply(cluster, gpu_test5())
    await poll(lambda: running(cluster, "gpu-test5") == ["pod0"], "pod0 runs")
    ts, mps = (
        seen(cluster, "gpu-test5", "pod0", "ts-ctr0"),
        seen(cluster, "gpu-test5", "pod0", "mps-ctr0"),
    )
    assert ts == seen(cluster, "gpu-test5", "pod0", "ts-ctr1")
    assert mps == seen(cluster, "gpu-test5", "pod0", "mps-ctr1")
    assert len(ts) == len(mps) == 1 and ts != mps
    name = cluster.get("pods", "gpu-test5", "pod0")["status"]["resourceClaimStatuses"][0]
    claim = cluster.get(CLAIMS, "gpu-test5", name["resourceClaimName"])
    config = claim["status"]["allocation"]["devices"]["config"]
    # the claim's opaque GpuConfig travels in the allocation for the kubelet plugin
    assert [(c["source"], c["requests"], c["opaque"]["parameters"]["sharing"]["strategy"])
            for c in config] == [("FromClaim", ["ts-gpu"], "TimeSlicing"),
                                 ("FromClaim", ["mps-gpu"], "MPS")]  # fmt: skip


@pytest.mark.parametrize("cluster", [QUICKSTART], indirect=True)
async def test_quickstart_gpu_test6_selects_on_an_attribute_the_plugin_no_longer_publishes(
    cluster,
):
    """gpu-test6.yaml selects `index`, which the plugin stopped publishing (commit 36fc80ab,
    "Remove GPU index for CDI spec generation / attribute advertisement"): the CEL selector
    errors on the missing key, and the scheduler reports allocator.go's "CEL runtime error"; the
    pods stay Pending. (On a driver that still published `index` they would run.)"""
    await apply(cluster, gpu_test6())
    message = await poll(lambda: event(cluster, "gpu-test6", "pod-0"), "FailedScheduling")
    claim = cluster.get("pods", "gpu-test6", "pod-0")["status"]["resourceClaimStatuses"][0]
    assert message == (
        'running "DynamicResources" filter plugin: claim gpu-test6/'
        f"{claim['resourceClaimName']}: selector #0: CEL runtime error: no such key: index"
    )
    assert running(cluster, "gpu-test6") == []


# ---------------------------------------------------------------- consumable shares
@pytest.mark.parametrize("cluster", [shares_node("memory")], indirect=True)
async def test_memory_sharing_replicas_share_one_gpu_by_4gi(cluster):
    """memory-sharing.yaml: 2 replicas x 4Gi run on one GPU; each claim consumed 4Gi of it."""
    await apply(cluster, sharing("gpu-share-memory", "memory-sharing", "gpu-4gi", 2, "4Gi"))
    await poll(lambda: len(running(cluster, "gpu-share-memory")) == 2, "both replicas run")
    a = seen(cluster, "gpu-share-memory", "memory-sharing-0", "ctr")
    assert a == seen(cluster, "gpu-share-memory", "memory-sharing-1", "ctr")
    for claim in cluster.list(CLAIMS, "gpu-share-memory"):
        result = claim["status"]["allocation"]["devices"]["results"][0]
        assert result["consumedCapacity"] == {"memory": "4Gi"} and result["shareID"]
    # "If a ResourceClaim does not specify an explicit capacity.requests.memory value, the
    # claim will allocate the entire GPU memory quota": with 8Gi taken, it cannot fit
    await apply(cluster, sharing("whole", "whole", "gpu-all", 1))
    message = await poll(lambda: event(cluster, "whole", "whole-0"), "the whole-GPU claim")
    assert "cannot allocate all claims" in message


@pytest.mark.parametrize("cluster", [shares_node("4")], indirect=True)
async def test_integer_sharing_runs_four_replicas_on_one_gpu_and_a_fifth_waits(cluster):
    """integer-sharing.yaml (--consumable-shares=4): "Up to N claims (each consuming 1 share by
    default) can share a single ... GPU"."""
    await apply(cluster, sharing("gpu-share-integer", "integer-sharing", "gpu-1share", 5))
    await poll(lambda: len(running(cluster, "gpu-share-integer")) == 4, "four replicas run")
    message = await poll(
        lambda: event(cluster, "gpu-share-integer", "integer-sharing-4"), "the fifth waits"
    )
    assert "1 cannot allocate all claims" in message
    allocated = [c for c in cluster.list(CLAIMS, "gpu-share-integer") if c.get("status")]
    consumed = [c["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"]
                for c in allocated]  # fmt: skip
    assert consumed == [{"memory": "0", "shares": "1"}] * 4


@pytest.mark.parametrize("cluster", [shares_node("unlimited")], indirect=True)
async def test_unlimited_sharing_lets_any_number_of_replicas_share(cluster):
    """unlimited-sharing.yaml: "Claims that do not specify a memory capacity request will
    allocate 0 quota, allowing an unlimited number of claims to co-allocate on the device"
    (scaled to 6 replicas as its README does)."""
    await apply(cluster, sharing("gpu-share-unlimited", "unlimited-sharing", "gpu-unlimited", 6))
    await poll(lambda: len(running(cluster, "gpu-share-unlimited")) == 6, "six replicas run")
    uuids = {seen(cluster, "gpu-share-unlimited", f"unlimited-sharing-{i}", "ctr")[0]
             for i in range(6)}  # fmt: skip
    assert len(uuids) == 1
