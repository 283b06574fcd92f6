"""Issue 30 acceptance, through a real JupyterHub on the devcluster: a user picks "10 GiB" on a
DRA pool; the pod carries a claim from a template asking `memory: 10Gi` of `gpu.nvidia.com`;
seven such servers share one H100 80GB (81,559 MiB as the device reports it); an eighth, which
would exceed the device, is refused in words; the form's free count matches the scheduler's
answer at every step.

The H100's ResourceSlice is the one NVIDIA's kubelet plugin publishes in
`--consumable-shares=memory` mode (kubernetes-sigs/dra-driver-nvidia-gpu
cmd/gpu-kubelet-plugin/consumable_shares.go applyConsumableShares: allowMultipleAllocations,
memory in bytes rounded down to 1Mi, request policy default = all of it, min/step 1Mi;
deviceinfo.go Attributes), published by the devcluster from the topology's `dra:` node, with
the driver chart's DeviceClasses (devcluster/dra/nvidia.py). The module runs on the real
control plane (issue 35): kube-controller-manager's resourceclaim controller makes each pod's
claim from its template and kube-scheduler's DynamicResources plugin allocates it; the node
agent publishes the slices (devcluster/nodeagent/slices.py).
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from devcluster.localhub import http_json
from tests.e2e_helpers import Browserless, server_pods, spawn, wait_until

pytestmark = pytest.mark.e2e

NODE = "gpu-h100-dra-1"
H100_MIB = 81559
MIB = 1024 * 1024
TOPOLOGY = {
    "nodes": [
        {"name": "cpu-1", "capacity": {"cpu": "16", "memory": "64Gi"}},
        {
            "name": NODE,
            "labels": {"nvidia.com/gpu.present": "true"},
            "capacity": {"cpu": "64", "memory": "512Gi"},
            # one H100 80GB, the driver run with --consumable-shares=memory (devcluster/dra/
            # nvidia.py publishes its slice as the gpu-kubelet-plugin does)
            "dra": {"gpus": 1, "model": "H100-80GB", "consumableShares": "memory"},
        },
        {
            "name": "gpu-a100-dmig-1",
            "capacity": {"cpu": "64", "memory": "512Gi"},
            # one A100 80GB whose MIG instances are made when a claim asks (DynamicMIG)
            "dra": {"gpus": 1, "model": "A100-80GB", "mig": "dynamic"},
        },
    ]
}
CATALOG = {
    "pools": {
        "h100-dra": {
            "display_name": "H100 80GB (DRA)",
            "gpu": "H100-80GB",
            "backend": "dra",
            "options": {"sharing": "memory"},
            "offers": ["10GiB", "1/8", "1"],
        },
        "a100-dmig": {
            "display_name": "A100 80GB (DRA dynamic MIG)",
            "gpu": "A100-80GB",
            "backend": "dra",
            "options": {"mig": "dynamic"},
            "offers": ["mig-1g.10gb", "mig-3g.40gb"],
        },
    },
    "access": {"default": {"pools": "all", "max_gpu": 1}},
}


@pytest.fixture(scope="module")
def dra_node(devcluster):
    """The node's ResourceSlice as the devcluster publishes it: one device, all of NVML's
    memory, the memory mode's request policy (consumable_shares.go)."""
    status, body = http_json("GET", f"{devcluster.url}/apis/resource.k8s.io/v1/resourceslices")
    assert status == 200, body
    (piece,) = [s for s in body["items"] if s["spec"].get("nodeName") == NODE]
    (device,) = piece["spec"]["devices"]
    assert device["allowMultipleAllocations"] is True
    assert device["capacity"]["memory"]["value"] in (str(H100_MIB * MIB), f"{H100_MIB}Mi")
    return devcluster


def scheduler_room(cluster: Any) -> int:
    """How many more 10 GiB claims the device takes, from what the scheduler allocated: its
    memory less the consumed capacity of every allocated claim on it."""
    status, body = http_json("GET", f"{cluster.url}/apis/resource.k8s.io/v1/resourceclaims")
    assert status == 200, body
    used = 0
    for claim in body["items"]:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or []:
            if result.get("pool") == NODE and result.get("device") == "gpu-0":
                memory = (result.get("consumedCapacity") or {}).get("memory", "0")
                used += _mib(memory)
    return (H100_MIB - used) // 10240


def _mib(quantity: str) -> int:
    units = {"Gi": 1024, "Mi": 1, "Ki": 1 / 1024, "": 1 / MIB}
    number, unit = re.fullmatch(r"(\d+)([KMG]i)?", quantity).groups()
    return int(int(number) * units[unit or ""])


def claim_made_for(cluster: Any, pod: dict, ref: dict) -> dict:
    """The claim made from `ref`'s template for `pod`: named in the pod's status, annotated with
    the pod's claim name, owned by the pod, reserved for it and allocated 10 GiB on the H100.
    On the real control plane, who wrote it (its managedFields): kube-controller-manager made it,
    kube-scheduler allocated it."""
    (state,) = pod["status"]["resourceClaimStatuses"]
    assert state["name"] == ref["name"], state
    status, claim = http_json(
        "GET",
        f"{cluster.url}/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/"
        f"{state['resourceClaimName']}",
    )
    assert status == 200, claim
    meta = claim["metadata"]
    assert meta["annotations"]["resource.kubernetes.io/pod-claim-name"] == ref["name"], meta
    (owner,) = meta["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner.get("controller")) == (
        "Pod",
        pod["metadata"]["uid"],
        True,
    ), owner
    assert [r["uid"] for r in claim["status"]["reservedFor"]] == [pod["metadata"]["uid"]]
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert (result["pool"], result["device"]) == (NODE, "gpu-0"), result
    assert _mib(result["consumedCapacity"]["memory"]) == 10240, result
    # made by kube-controller-manager's resourceclaim controller; kube-scheduler adds the
    # delete-protection finalizer, then allocates and reserves it (its DynamicResources
    # plugin's PreBind, pkg/scheduler/framework/plugins/dynamicresources); nobody else.
    # Each names itself though one binary runs both (docs/controlplane.md).
    writers = {(f["manager"], f.get("subresource", "")) for f in meta["managedFields"]}
    assert writers == {
        ("kube-controller-manager", ""),
        ("kube-scheduler", ""),
        ("kube-scheduler", "status"),
    }, writers
    return claim


def form_free(hub: Any, user: str) -> int:
    html = Browserless(hub, user).spawn_form()
    card = html.split('data-pool="h100-dra" data-spec="10GiB"', 1)[1].split("</span>", 1)[0]
    match = re.search(r"(\d+) of (\d+) free", card)
    assert match, card
    assert match.group(2) == "7"
    return int(match.group(1))


def test_seven_ten_gib_servers_share_one_h100_and_the_eighth_is_refused(hub, dra_node):
    cluster = dra_node
    users = [f"dra{i}" for i in range(1, 9)]
    for i, user in enumerate(users[:7]):
        # the form's count is the scheduler's answer before every spawn
        expected = scheduler_room(cluster)
        assert expected == 7 - i
        wait_until(lambda u=user, e=expected: form_free(hub, u) == e, 60, f"{expected} free")
        status, body = spawn(hub, user, {"gpu": "10GiB", "pool": "h100-dra"})
        assert status in (201, 202), body
        hub.wait_ready(user, timeout=180)
        (pod,) = server_pods(cluster, user)
        assert pod["spec"]["nodeName"] == NODE
        (ref,) = pod["spec"]["resourceClaims"]
        claim_made_for(cluster, pod, ref)
        assert pod["spec"]["containers"][0]["resources"]["claims"] == [{"name": ref["name"]}]
        assert not [k for k in pod["spec"]["containers"][0]["resources"].get("limits", {})
                    if "nvidia" in k]  # fmt: skip
        status, template = http_json(
            "GET",
            f"{cluster.url}/apis/resource.k8s.io/v1/namespaces/default/resourceclaimtemplates/"
            f"{ref['resourceClaimTemplateName']}",
        )
        assert status == 200, template
        (request,) = template["spec"]["spec"]["devices"]["requests"]
        assert request["exactly"]["deviceClassName"] == "gpu.nvidia.com"
        assert request["exactly"]["capacity"] == {"requests": {"memory": "10Gi"}}
    # 7 x 10,240 MiB = 71,680 of 81,559: 9,879 MiB left, not enough for another
    assert scheduler_room(cluster) == 0
    # and the scheduler says so: a pod asking the same claim outside the hub stays Pending
    probe = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "dra-probe", "namespace": "default"},
        "spec": {
            "containers": [
                {"name": "c", "image": "busybox", "command": ["sleep", "60"],
                 "resources": {"claims": [{"name": "gpu"}]}}
            ],
            "resourceClaims": [
                {"name": "gpu", "resourceClaimTemplateName": ref["resourceClaimTemplateName"]}
            ],
        },
    }  # fmt: skip
    status, body = http_json("POST", f"{cluster.url}/api/v1/namespaces/default/pods", probe)
    assert status == 201, body

    def failed_scheduling() -> str | None:
        status, events = http_json(
            "GET",
            f"{cluster.url}/api/v1/namespaces/default/events"
            "?fieldSelector=involvedObject.name=dra-probe",
        )
        reasons = [e for e in events.get("items", []) if e.get("reason") == "FailedScheduling"]
        return reasons[-1]["message"] if reasons else None

    message = wait_until(failed_scheduling, 60, "FailedScheduling of the probe")
    assert "cannot allocate all claims" in message, message
    status, probe_now = http_json("GET", f"{cluster.url}/api/v1/namespaces/default/pods/dra-probe")
    assert not probe_now["spec"].get("nodeName")
    http_json("DELETE", f"{cluster.url}/api/v1/namespaces/default/pods/dra-probe")
    wait_until(lambda: form_free(hub, users[7]) == 0, 60, "0 free")
    status, body = spawn(hub, users[7], {"gpu": "10GiB", "pool": "h100-dra"})
    assert status == 400, body
    assert body["message"].startswith("No 10 GiB is free on H100 80GB (DRA) right now"), body
    assert not server_pods(cluster, users[7])


def mig_free(hub: Any, user: str) -> dict[str, int]:
    html = Browserless(hub, user).spawn_form()
    out = {}
    for spec in ("mig-1g.10gb", "mig-3g.40gb"):
        card = html.split(f'data-pool="a100-dmig" data-spec="{spec}"', 1)[1].split("</span>", 1)[0]
        match = re.search(r"(\d+) of (\d+) free", card)
        assert match, card
        out[spec] = int(match.group(1))
    return out


def test_dynamic_mig_counts_what_the_gpus_counters_still_allow(hub, dra_node):
    """An idle A100 could make 7 x 1g.10gb or 2 x 3g.40gb; once a 3g.40gb is made, what its
    counters still allow: 3 x 1g.10gb (and one more 3g.40gb), which the scheduler then makes."""
    cluster = dra_node
    wait_until(lambda: mig_free(hub, "mig0") == {"mig-1g.10gb": 7, "mig-3g.40gb": 2}, 60, "7/2")
    status, body = spawn(hub, "mig0", {"gpu": "mig-3g.40gb", "pool": "a100-dmig"})
    assert status in (201, 202), body
    hub.wait_ready("mig0", timeout=180)
    # the 3g.40gb took four of the eight memory slices: three 1g.10gb placements are left
    wait_until(lambda: mig_free(hub, "mig1") == {"mig-1g.10gb": 3, "mig-3g.40gb": 1}, 60, "3/1")
    for user in ("mig1", "mig2", "mig3"):
        status, body = spawn(hub, user, {"gpu": "mig-1g.10gb", "pool": "a100-dmig"})
        assert status in (201, 202), body
        hub.wait_ready(user, timeout=180)
        (pod,) = server_pods(cluster, user)
        assert pod["spec"]["nodeName"] == "gpu-a100-dmig-1"
    wait_until(lambda: mig_free(hub, "mig4") == {"mig-1g.10gb": 0, "mig-3g.40gb": 0}, 60, "0/0")
    status, body = spawn(hub, "mig4", {"gpu": "mig-1g.10gb", "pool": "a100-dmig"})
    assert status == 400, body
    assert not server_pods(cluster, "mig4")
