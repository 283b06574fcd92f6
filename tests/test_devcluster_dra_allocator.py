"""The devcluster's structured-parameters allocator (devcluster/dra/allocator.py, after
k8s.io/dynamic-resource-allocation/structured allocator.go) on the slices NVIDIA's kubelet
plugin publishes (devcluster/dra/nvidia.py): pure functions, no cluster, plus one scheduling
case across two nodes."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from devcluster import DevCluster
from devcluster.admission import RequestInfo
from devcluster.dra import allocator, nvidia

CLASSES = {c["metadata"]["name"]: c for c in nvidia.device_classes()}


def node_slice(spec: dict[str, Any], node: str = "n1") -> dict[str, Any]:
    s = nvidia.node_slice(node, spec)
    s["metadata"]["name"] = f"{node}-slice"
    return s


def claim(*requests: dict[str, Any], name: str = "c", **devices: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"devices": {"requests": list(requests), **devices}},
    }


def exactly(name: str, klass: str = "gpu.nvidia.com", **more: Any) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": klass, **more}}


def cel(expression: str) -> list[dict[str, Any]]:
    return [{"cel": {"expression": expression}}]


def allocate(slices: list[dict], claims: list[dict], allocated: list[dict] = ()) -> Any:
    devices = allocator.node_devices(slices, "n1")
    used = allocator.in_use(allocated, {d.key: d for d in devices})
    return allocator.Allocator(devices, CLASSES, used).allocate(claims, "n1")


def results(allocation: dict) -> list[tuple[str, str]]:
    return [(r["request"], r["device"]) for r in allocation["devices"]["results"]]


def with_status(c: dict, allocation: dict) -> dict:
    return {**c, "status": {"allocation": allocation}}


# ---------------------------------------------------------------- requests
def test_first_available_takes_the_first_subrequest_that_fits():
    slices = [node_slice({"gpus": 1, "model": "A100-40GB"})]
    request = {"name": "gpu", "firstAvailable": [
        {"name": "h100", "deviceClassName": "gpu.nvidia.com",
         "selectors": cel("device.attributes['gpu.nvidia.com'].productName.matches('H100')")},
        {"name": "any", "deviceClassName": "gpu.nvidia.com"},
    ]}  # fmt: skip
    [allocation] = allocate(slices, [claim(request)])
    assert results(allocation) == [("gpu/any", "gpu-0")]


def test_exact_count_and_all_modes():
    slices = [node_slice({"gpus": 4, "model": "H100-80GB"})]
    [two] = allocate(slices, [claim(exactly("gpu", count=2))])
    assert results(two) == [("gpu", "gpu-0"), ("gpu", "gpu-1")]
    [every] = allocate(slices, [claim(exactly("gpu", allocationMode="All"))])
    assert [d for _, d in results(every)] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    # All needs every matching device: one held elsewhere and it cannot be satisfied
    held = with_status(claim(exactly("gpu"), name="other"), two)
    assert allocate(slices, [claim(exactly("gpu", allocationMode="All"))], [held]) is None
    assert allocate(slices, [claim(exactly("gpu", count=3))], [held]) is None
    [rest] = allocate(slices, [claim(exactly("gpu", count=2))], [held])
    assert [d for _, d in results(rest)] == ["gpu-2", "gpu-3"]


def test_cel_capacity_quantities_and_versions():
    slices = [node_slice({"gpus": 1, "model": "A100-40GB"})]
    at_least = "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('{}')) >= 0"
    assert allocate(slices, [claim(exactly("gpu", selectors=cel(at_least.format("40Gi"))))])
    assert allocate(slices, [claim(exactly("gpu", selectors=cel(at_least.format("41Gi"))))]) is None
    newer = (
        "device.attributes['gpu.nvidia.com'].cudaComputeCapability.isGreaterThan(semver('7.5.0'))"
    )
    assert allocate(slices, [claim(exactly("gpu", selectors=cel(newer)))])
    older = newer.replace("7.5.0", "9.0.0")
    assert allocate(slices, [claim(exactly("gpu", selectors=cel(older)))]) is None


def test_match_attribute_keeps_a_claims_mig_devices_on_one_parent():
    spec = {"gpus": 2, "model": "A100-40GB", "mig": "static",
            "migDevices": ["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"]}  # fmt: skip
    slices = [node_slice(spec)]
    profile = "device.attributes['gpu.nvidia.com'].profile == '{}'"
    big = [exactly(f"r{i}", "mig.nvidia.com", selectors=cel(profile.format("3g.20gb")))
           for i in range(2)]  # fmt: skip
    same = [{"requests": [], "matchAttribute": "gpu.nvidia.com/parentUUID"}]
    # two 3g.20gb exist, one per GPU: together they cannot share a parent
    assert allocate(slices, [claim(*big, constraints=same)]) is None
    [apart] = allocate(slices, [claim(*big)])
    assert len({d for _, d in results(apart)}) == 2
    # a constraint naming other requests does not bind these
    small = exactly("s", "mig.nvidia.com", selectors=cel(profile.format("1g.5gb")))
    loose = [{"requests": ["s"], "matchAttribute": "gpu.nvidia.com/parentUUID"}]
    assert allocate(slices, [claim(*big, small, constraints=loose)])


# ---------------------------------------------------------------- consumable capacity
def policy_device(**policy: Any) -> dict[str, Any]:
    s = node_slice({"gpus": 1, "model": "H100-80GB"})
    device = s["spec"]["devices"][0]
    device["allowMultipleAllocations"] = True
    device["capacity"] = {"memory": {"value": "80Gi", "requestPolicy": policy}}
    return s


@pytest.mark.parametrize(
    ("policy", "asked", "consumed"),
    [
        ({"default": "80Gi", "validRange": {"min": "1Gi", "step": "1Gi"}}, "2500Mi", "3Gi"),
        ({"default": "80Gi", "validRange": {"min": "4Gi", "step": "2Gi"}}, "5Gi", "6Gi"),
        ({"default": "80Gi", "validRange": {"min": "4Gi"}}, "1Gi", "4Gi"),
        ({"default": "80Gi", "validValues": ["10Gi", "20Gi", "40Gi"]}, "11Gi", "20Gi"),
        ({"default": "20Gi", "validValues": ["10Gi", "20Gi"]}, None, "20Gi"),
        ({"default": "80Gi", "validRange": {"min": "1Gi", "max": "40Gi"}}, "41Gi", None),
        ({"default": "80Gi", "validValues": ["10Gi", "20Gi"]}, "30Gi", None),
    ],
)
def test_request_policies_fit_what_a_claim_asks(policy, asked, consumed):
    extra = {"capacity": {"requests": {"memory": asked}}} if asked else {}
    found = allocate([policy_device(**policy)], [claim(exactly("gpu", **extra))])
    if consumed is None:
        assert found is None
    else:
        assert found[0]["devices"]["results"][0]["consumedCapacity"] == {"memory": consumed}


def test_shared_device_sums_stay_within_its_capacity_and_exclusive_requests_are_minimums():
    shared = [policy_device(default="10Gi", validRange={"min": "1Mi", "step": "1Mi"})]
    taken = []
    for i in range(8):
        [allocation] = allocate(shared, [claim(exactly("gpu"), name=f"c{i}")], taken)
        taken.append(with_status(claim(exactly("gpu"), name=f"c{i}"), allocation))
    # 80Gi used up: neither the default nor 1Gi more fits
    assert allocate(shared, [claim(exactly("gpu"))], taken) is None
    one_gi = {"capacity": {"requests": {"memory": "1Gi"}}}
    assert allocate(shared, [claim(exactly("gpu", **one_gi))], taken) is None
    assert allocate(shared, [claim(exactly("gpu", **one_gi))], taken[1:])  # 70Gi used
    # a capacity the device does not have cannot be asked of it
    assert allocate(shared, [claim(exactly("gpu", capacity={"requests": {"shares": "1"}}))]) is None
    exclusive = [node_slice({"gpus": 1, "model": "T4"})]
    assert allocate(exclusive, [claim(exactly("gpu", capacity={"requests": {"memory": "15Gi"}}))])
    assert (
        allocate(exclusive, [claim(exactly("gpu", capacity={"requests": {"memory": "16Gi"}}))])
        is None
    )


# ---------------------------------------------------------------- partitionable devices
def test_dynamic_mig_counters_leave_three_1g_after_a_3g_and_no_full_gpu():
    """KEP-4815 counters as the plugin's partitions.go publishes them: a 3g.40gb takes memory
    slices 0-3; 1g.10gb placements are slices 0..6, so three more 1g.10gb can be made (4, 5,
    6), not four, and the full GPU (all counters) no longer can."""
    slices = [node_slice({"gpus": 1, "model": "A100-80GB", "mig": "dynamic"})]
    profile = "device.attributes['gpu.nvidia.com'].profile == '{}'"

    def mig(p: str, name: str) -> dict:
        return claim(exactly("mig", "mig.nvidia.com", selectors=cel(profile.format(p))), name=name)

    [big] = allocate(slices, [mig("3g.40gb", "big")])
    assert results(big) == [("mig", "gpu-0-mig-3g40gb-9-0")]
    taken = [with_status(mig("3g.40gb", "big"), big)]
    assert allocate(slices, [claim(exactly("gpu"))], taken) is None
    made = []
    for i in range(3):
        [small] = allocate(slices, [mig("1g.10gb", f"s{i}")], taken)
        made.append(results(small)[0][1])
        taken.append(with_status(mig("1g.10gb", f"s{i}"), small))
    assert made == ["gpu-0-mig-1g10gb-19-4", "gpu-0-mig-1g10gb-19-5", "gpu-0-mig-1g10gb-19-6"]
    assert allocate(slices, [mig("1g.10gb", "s3")], taken) is None
    # the whole GPU first: nothing else can be made
    [whole] = allocate(slices, [claim(exactly("gpu"))])
    assert (
        allocate(slices, [mig("1g.10gb", "x")], [with_status(claim(exactly("gpu")), whole)]) is None
    )


def test_an_older_pool_generation_is_not_used():
    old = node_slice({"gpus": 1, "model": "T4"})
    new = node_slice({"gpus": 1, "model": "H100-80GB"})
    new["metadata"]["name"] = "n1-slice-2"
    new["spec"]["pool"]["generation"] = 2
    [allocation] = allocate([old, new], [claim(exactly("gpu", count=1))])
    assert allocate([old, new], [claim(exactly("gpu", count=2))]) is None
    assert results(allocation) == [("gpu", "gpu-0")]


# ---------------------------------------------------------------- in the scheduler
@pytest.mark.e2e
async def test_a_pod_with_claims_goes_only_where_they_can_be_allocated(tmp_path: Path):
    size = {"cpu": "8", "memory": "32Gi"}
    taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    topology = {"nodes": [
        {"name": "t4", "capacity": size, "dra": {"model": "T4"}},
        {"name": "h100", "capacity": size, "dra": {"model": "H100-80GB"}},
        {"name": "tainted", "capacity": size, "dra": {"model": "H100-80GB"}, "taints": [taint]},
    ]}  # fmt: skip
    h100 = "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100 80GB HBM3'"
    async with DevCluster(topology, state_dir=tmp_path / "state") as cluster:
        await cluster.api_create(
            "resourceclaimtemplates.resource.k8s.io", "v1", "default",
            {"metadata": {"name": "h100"}, "spec": {"spec": {"devices": {"requests": [
                exactly("gpu", selectors=cel(h100))]}}}}, RequestInfo(),
        )  # fmt: skip
        for name in ("first", "second"):
            await cluster.api_create("pods", "v1", "default", {
                "metadata": {"name": name},
                "spec": {"containers": [{"name": "c", "image": "x", "command": ["sleep", "600"],
                                         "resources": {"claims": [{"name": "gpu"}]}}],
                         "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "h100"}]},
            }, RequestInfo())  # fmt: skip
        deadline = time.monotonic() + 20
        while not [e for e in cluster.events_for("default", "second")
                   if e["reason"] == "FailedScheduling"]:  # fmt: skip
            assert time.monotonic() < deadline, "no FailedScheduling for the second pod"
            await asyncio.sleep(0.05)
        assert cluster.get("pods", "default", "first")["spec"]["nodeName"] == "h100"
        event = [e for e in cluster.events_for("default", "second")
                 if e["reason"] == "FailedScheduling"][-1]  # fmt: skip
        assert event["message"] == (
            "0/3 nodes are available: 1 node(s) had untolerated taint {nvidia.com/gpu: present}, "
            "2 cannot allocate all claims. still not schedulable, preemption: 0/3 nodes are "
            "available: 3 Preemption is not helpful for scheduling."
        )


def test_a_topology_may_name_the_product_instead_of_the_model():
    """The product helper's spelling (product, memory_mib, consumable_shares, dynamic_mig) gives
    the same slices as the model's; a bad section is refused in words."""
    by_product = node_slice({"product": "NVIDIA H100 80GB HBM3", "memory_mib": 81559,
                             "consumable_shares": "memory"})  # fmt: skip
    by_model = node_slice({"model": "H100-80GB", "consumableShares": "memory"})
    strip = [{k: v for k, v in d.items() if k != "attributes"} for d in by_model["spec"]["devices"]]
    assert [{k: v for k, v in d.items() if k != "attributes"}
            for d in by_product["spec"]["devices"]] == strip  # fmt: skip
    dynamic = node_slice({"product": "NVIDIA A100-SXM4-80GB", "dynamic_mig": True})
    assert dynamic["spec"]["sharedCounters"][0]["name"] == "gpu-0-counter-set"
    for bad, words in (
        ({"model": "B200"}, "unknown model 'B200'"),
        ({"product": "NVIDIA B200"}, "give memory_mib"),
        ({"consumableShares": "some"}, "consumableShares must be memory, unlimited or N"),
        ({"driver": "gpu.example.com"}, "only NVIDIA's driver"),
        ({"model": "A100-40GB", "mig": "static", "migDevices": ["7g.40gb", "1g.5gb"]},
         "does not fit one NVIDIA A100-SXM4-40GB"),
    ):  # fmt: skip
        with pytest.raises(nvidia.TopologyError, match=words):
            nvidia.node_slice("n1", bad)


def test_distinct_attribute_puts_each_request_on_another_gpu():
    """KEP-5075 distinctAttribute: two shares of memory-shared GPUs, never the same GPU."""
    slices = [node_slice({"gpus": 2, "model": "H100-80GB", "consumableShares": "memory"})]
    small = {"capacity": {"requests": {"memory": "10Gi"}}}
    apart = [{"requests": [], "distinctAttribute": "gpu.nvidia.com/uuid"}]
    [spread] = allocate(slices, [claim(exactly("a", **small), exactly("b", **small),
                                       constraints=apart)])  # fmt: skip
    assert [d for _, d in results(spread)] == ["gpu-0", "gpu-1"]
    [together] = allocate(slices, [claim(exactly("a", **small), exactly("b", **small))])
    assert [d for _, d in results(together)] == ["gpu-0", "gpu-0"]
    three = [exactly(n, **small) for n in "abc"]
    assert allocate(slices, [claim(*three, constraints=apart)]) is None
