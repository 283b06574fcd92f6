"""NVIDIA's DRA driver's own demo manifests, as Python objects, for tests/test_nodeagent.py (kube-
scheduler allocates them on the node agent's ResourceSlices).
kubernetes-sigs/dra-driver-nvidia-gpu at 9593204: demo/specs/quickstart/v1/gpu-test{1..6}.yaml
(README.md and demo/specs/quickstart/README.md: an 8-GPU node with MIG enabled on GPUs 0-3 in
mig-parted-config.yaml's `half-balanced` layout, 2 x 1g.5gb + 2g.10gb + 3g.20gb each, A100 40GB)
and demo/specs/consumable-shares/{memory,integer,unlimited}-sharing.yaml (their README: the
plugin's --consumable-shares=memory|N|unlimited). Each manifest is written here to the same
effect as the file it names (the same objects, requests, selectors and constraints), with two
differences: a Deployment's replicas are the pods its ReplicaSet would make (`<name>-<i>`), and
containers run `sleep` instead of `nvidia-smi -L` (no GPU here).
"""

from __future__ import annotations

from typing import Any

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
    """The pods a Deployment's ReplicaSet makes (`<name>-<i>`)."""
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
