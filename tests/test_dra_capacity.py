"""Issue 30 item 2: free/total of DRA pools is what the scheduler could still allocate, read
from ResourceSlices and ResourceClaims (LiveCapacity, no API call per read).

The slices are written the way NVIDIA's kubelet plugin publishes them
(kubernetes-sigs/dra-driver-nvidia-gpu cmd/gpu-kubelet-plugin/deviceinfo.go `Attributes`,
consumable_shares.go `applyConsumableShares` for --consumable-shares=memory: memory in bytes
rounded down to 1Mi, default = all of it, min/step 1Mi, allowMultipleAllocations;
partitions.go for DynamicMIG: a counter set per GPU with `memory-slice-<i>` counters, the full
GPU consuming all of them, each MIG placement those of its memory slices). Claims carry their
allocation results as the allocator writes them (k8s.io/api/resource/v1 types.go
DeviceRequestAllocationResult: driver, pool, device, consumedCapacity, shareID).
"""

from __future__ import annotations

from typing import Any

from fracspawner.backends import load_catalog
from fracspawner.capacity.count import compute_capacity
from fracspawner.capacity.live import LiveCapacity

MIB = 1024 * 1024
H100_MIB = 81559
H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"
CATALOG = load_catalog(
    {
        "pools": {
            "h100-dra": {
                "gpu": "H100-80GB",
                "backend": "dra",
                "options": {"sharing": "memory"},
                "offers": ["1/8", "10GiB", "20GiB", "1"],
            },
            "a100-dmig": {
                "gpu": "A100-80GB",
                "backend": "dra",
                "options": {"mig": "dynamic"},
                "offers": ["mig-1g.10gb", "mig-3g.40gb", "1"],
            },
        }
    }
)


def node(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {
            "conditions": [{"type": "Ready", "status": "True"}],
            "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"},
        },
    }


def attrs(product: str, kind: str = "gpu", **more: str) -> dict[str, Any]:
    out = {
        "type": {"string": kind},
        "uuid": {"string": "GPU-" + product[-4:]},
        "productName": {"string": product},
        "architecture": {"string": "Hopper"},
        "cudaComputeCapability": {"version": "9.0.0"},
    }
    out.update({k: {"string": v} for k, v in more.items()})
    return out


def memory_slice(node_name: str, gpus: int = 1) -> dict[str, Any]:
    value = f"{H100_MIB * MIB}"
    devices = [
        {
            "name": f"gpu-{i}",
            "attributes": attrs(H100),
            "allowMultipleAllocations": True,
            "capacity": {
                "memory": {
                    "value": value,
                    "requestPolicy": {
                        "default": value,
                        "validRange": {"min": "1Mi", "max": value, "step": "1Mi"},
                    },
                }
            },
        }
        for i in range(gpus)
    ]
    return {
        "metadata": {"name": f"{node_name}-gpu.nvidia.com-x"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def slices_of(first: int, size: int) -> dict[str, dict[str, str]]:
    return {f"memory-slice-{i}": {"value": "1"} for i in range(first, first + size)}


def dynamic_mig_slice(node_name: str) -> dict[str, Any]:
    """An A100 80GB: 8 memory slices; 1g.10gb at 0..6, 3g.40gb at 0 and 4 (MIG user guide
    placements), the full GPU on all 8 (partitions.go PartGetDevice / MigSpec)."""
    devices = [
        {
            "name": "gpu-0",
            "attributes": attrs(A100),
            "capacity": {"memory": {"value": "80Gi"}},
            "consumesCounters": [{"counterSet": "gpu-0-counter-set", "counters": slices_of(0, 8)}],
        }
    ]
    for start in range(7):
        devices.append(
            {
                "name": f"gpu-0-mig-1g10gb-{start}",
                "attributes": attrs(A100, "mig", profile="1g.10gb"),
                "capacity": {"memory": {"value": "10Gi"}},
                "consumesCounters": [
                    {"counterSet": "gpu-0-counter-set", "counters": slices_of(start, 1)}
                ],
            }
        )
    for start in (0, 4):
        devices.append(
            {
                "name": f"gpu-0-mig-3g40gb-{start}",
                "attributes": attrs(A100, "mig", profile="3g.40gb"),
                "capacity": {"memory": {"value": "40Gi"}},
                "consumesCounters": [
                    {"counterSet": "gpu-0-counter-set", "counters": slices_of(start, 4)}
                ],
            }
        )
    return {
        "metadata": {"name": f"{node_name}-gpu.nvidia.com-y"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": 1, "resourceSliceCount": 1},
            "sharedCounters": [{"name": "gpu-0-counter-set", "counters": slices_of(0, 8)}],
            "devices": devices,
        },
    }


def claim(name: str, node_name: str, device: str, memory: str | None = None) -> dict[str, Any]:
    result: dict[str, Any] = {
        "request": "gpu",
        "driver": "gpu.nvidia.com",
        "pool": node_name,
        "device": device,
    }
    if memory is not None:
        result["consumedCapacity"] = {"memory": memory}
        result["shareID"] = f"{abs(hash(name)) % 10**8:08d}-0000-0000-0000-000000000000"
    return {
        "metadata": {"name": name, "namespace": "jhub"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "x"}}]}},
        "status": {
            "allocation": {
                "devices": {"results": [result]},
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In",
                                          "values": [node_name]}]}
                    ]
                },
            }
        },
    }  # fmt: skip


def counts(capacity, pool: str) -> dict[str, tuple[int | None, int | None]]:
    return {spec: (c.free, c.total) for spec, c in capacity.pools[pool].items()}


def test_seven_ten_gib_claims_share_one_h100_and_an_eighth_does_not_fit():
    live = LiveCapacity(CATALOG)
    live.replace_nodes([node("dra-1")])
    live.replace_pods([])
    live.replace_slices([memory_slice("dra-1")])
    live.replace_claims([])
    assert counts(live.snapshot(), "h100-dra") == {
        "1/8": (8, 8),
        "10GiB": (7, 7),
        "20GiB": (3, 3),
        "1": (1, 1),
    }
    for i in range(7):
        live.put_claim(claim(f"c{i}", "dra-1", "gpu-0", "10Gi"))
        free = live.snapshot().pools["h100-dra"]["10GiB"].free
        assert free == 6 - i
    snap = counts(live.snapshot(), "h100-dra")
    # 81559 - 7 x 10240 = 9879 MiB left: no 1/8 (10194 MiB), no whole GPU
    assert snap == {"1/8": (0, 8), "10GiB": (0, 7), "20GiB": (0, 3), "1": (0, 1)}
    live.drop_claim("jhub/c3")
    assert live.snapshot().pools["h100-dra"]["10GiB"].free == 1


def test_a_claim_for_the_whole_device_leaves_no_share():
    # memory mode: a claim without a memory request consumes the policy's default, all of it
    capacity = compute_capacity(
        CATALOG,
        [node("dra-1")],
        [],
        [memory_slice("dra-1", gpus=2)],
        [claim("whole", "dra-1", "gpu-1", f"{H100_MIB}Mi")],
    )
    assert counts(capacity, "h100-dra")["10GiB"] == (7, 14)
    assert counts(capacity, "h100-dra")["1"] == (1, 2)


def test_dynamic_mig_counts_what_the_counters_still_allow():
    live = LiveCapacity(CATALOG)
    live.replace_nodes([node("mig-1")])
    live.replace_slices([dynamic_mig_slice("mig-1")])
    snap = live.snapshot().pools["a100-dmig"]
    assert (snap["mig-1g.10gb"].free, snap["mig-1g.10gb"].total) == (7, 7)
    assert (snap["mig-3g.40gb"].free, snap["mig-3g.40gb"].total) == (2, 2)
    assert "counters" in snap["mig-1g.10gb"].note
    # a 3g.40gb made at placement 4 takes memory slices 4-7: 4 x 1g.10gb could still be made
    live.put_claim(claim("big", "mig-1", "gpu-0-mig-3g40gb-4"))
    snap = live.snapshot().pools["a100-dmig"]
    assert snap["mig-1g.10gb"].free == 4
    assert snap["mig-3g.40gb"].free == 1
    assert snap["1"].free == 0  # the full GPU needs every memory slice
    live.put_claim(claim("small", "mig-1", "gpu-0-mig-1g10gb-0"))
    snap = live.snapshot().pools["a100-dmig"]
    assert (snap["mig-1g.10gb"].free, snap["mig-3g.40gb"].free) == (3, 0)


def test_devices_of_another_model_or_an_old_pool_generation_do_not_count():
    other = memory_slice("dra-2")
    for device in other["spec"]["devices"]:
        device["attributes"]["productName"] = {"string": "NVIDIA A100-SXM4-80GB"}
    old = memory_slice("dra-1", gpus=4)
    old["metadata"]["name"] = "dra-1-old"
    old["spec"]["pool"]["generation"] = 0
    capacity = compute_capacity(
        CATALOG, [node("dra-1"), node("dra-2")], [], [memory_slice("dra-1"), other, old], []
    )
    assert counts(capacity, "h100-dra")["10GiB"] == (7, 7)


def test_without_slices_dra_counts_are_unknown_never_zero_or_free():
    capacity = compute_capacity(CATALOG, [node("dra-1")], [], [], [])
    free, total = counts(capacity, "h100-dra")["10GiB"]
    assert free is None and total is None


def test_a_dra_spawn_stays_in_flight_until_its_claim_is_allocated_in_the_watch():
    """The pod watch may see the pod bound before the claim watch sees the allocation the
    scheduler wrote before binding it (two watches, no order between them): until then the
    spawn's hold must stay (choice/admission.py counted), or a second spawn could take the
    same memory while the counts do not show the first yet."""
    from fracspawner.capacity.watch import CapacityWatcher
    from fracspawner.choice.admission import counted

    watcher = CapacityWatcher(CATALOG)
    live = watcher.live
    live.replace_nodes([node("dra-1")])
    live.replace_slices([memory_slice("dra-1")])
    pod = {
        "metadata": {
            "name": "jupyter-ann",
            "namespace": "jhub",
            "uid": "u1",
            "labels": {"fracspawner.io/pool": "h100-dra", "fracspawner.io/gpu": "10Gi"},
            "annotations": {
                "hub.jupyter.org/username": "ann",
                "fracspawner.io/gpu-equivalent": "0.125",
            },
        },
        "spec": {"nodeName": "dra-1", "containers": [{"name": "notebook"}]},
        "status": {"phase": "Pending"},
    }
    live.replace_pods([pod])
    made = claim("jupyter-ann-gpu-x1", "dra-1", "gpu-0", "10Gi")
    made["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Pod", "name": "jupyter-ann", "uid": "u1", "controller": True}
    ]
    pending = {**made, "status": {}}
    # not in the counts: among the pods admission counts by their labels (unplaced_holds)
    awaiting = lambda: [r.name for r in watcher.unbound_pods()]  # noqa: E731
    assert awaiting() == ["jupyter-ann"]
    live.replace_claims([pending])  # made from the template, not allocated yet
    assert not counted(watcher.pod("jhub", "jupyter-ann"))
    assert watcher.snapshot().pools["h100-dra"]["10GiB"].free == 7
    assert awaiting() == ["jupyter-ann"]
    live.put_claim(made)  # the allocation arrives
    assert counted(watcher.pod("jhub", "jupyter-ann"))
    assert watcher.snapshot().pools["h100-dra"]["10GiB"].free == 6
    assert awaiting() == []  # counted by the allocation alone
    live.drop_claim("jhub/jupyter-ann-gpu-x1")
    assert awaiting() == ["jupyter-ann"]
    live.drop_pod("jhub/jupyter-ann")
    assert awaiting() == []
    live.put_claim(made)  # the claim first, then its pod: never awaiting
    live.replace_pods([pod])
    assert awaiting() == [] and counted(watcher.pod("jhub", "jupyter-ann"))


def test_the_admin_pages_free_gpus_of_a_dynamic_mig_pool_are_not_a_sum_of_profiles():
    """Each profile's free count of a dynamic-MIG pool is what the same GPU's counters could
    still make: an idle A100 is 1 GPU free, not 7/7 + 2 x 3/7 of a 1g, 3g layout."""
    from fracspawner.capacity.usage import pool_usage

    pool = {"gpu": "A100-80GB", "backend": "dra", "options": {"mig": "dynamic"}}
    catalog = load_catalog({"pools": {"m": {**pool, "offers": ["mig-1g.10gb", "mig-3g.40gb"]}}})
    capacity = compute_capacity(catalog, [node("mig-1")], [], [dynamic_mig_slice("mig-1")], [])
    (usage,) = pool_usage(catalog, capacity, [])
    assert usage.free_gpu == 1.0  # 7 x 1/7, or 2 x 3/7: at most one GPU's worth
