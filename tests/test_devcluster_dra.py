"""devcluster speaks Dynamic Resource Allocation (resource.k8s.io/v1, issue 30 item 4): the API's
four kinds with the apiserver's validation, the resourceclaim controller, the scheduler's
structured-parameters allocation, NVIDIA's kubelet plugin's slices and the kubelet's CDI env.

In-process DevClusters (they start in milliseconds); pods run `sleep`. What each test models is
cited in devcluster/dra/*.py; the driver's own demo manifests are in test_devcluster_dra_demos.py.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.rest import ApiException

from devcluster import DevCluster
from devcluster.admission import RequestInfo
from devcluster.store import ApiError
from tests.devcluster_helpers import poll

pytestmark = pytest.mark.e2e

CLAIMS = "resourceclaims.resource.k8s.io"
TEMPLATES = "resourceclaimtemplates.resource.k8s.io"
SLICES = "resourceslices.resource.k8s.io"
H100_MEMORY = {
    "nodes": [
        {
            "name": "gpu-h100",
            "capacity": {"cpu": "64", "memory": "512Gi"},
            "dra": {"gpus": 1, "model": "H100-80GB", "consumableShares": "memory"},
        }
    ]
}


@pytest.fixture
async def cluster(tmp_path: Path, request) -> AsyncIterator[DevCluster]:
    topology = getattr(request, "param", H100_MEMORY)
    async with DevCluster(topology, state_dir=tmp_path / "state") as running:
        yield running


@pytest.fixture
async def api(cluster: DevCluster) -> AsyncIterator[client.ApiClient]:
    async with client.ApiClient(client.Configuration(host=cluster.url)) as api_client:
        yield api_client


def template(name: str, request: dict[str, Any], namespace: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", **request}]}}},
    }


def gpu_pod(name: str, *, template_name: str = "", claim_name: str = "", ns: str = "default"):
    source = (
        {"resourceClaimTemplateName": template_name}
        if template_name
        else {"resourceClaimName": claim_name}
    )
    return {
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "containers": [
                {
                    "name": "ctr",
                    "image": "ubuntu:22.04",
                    "command": [
                        "sh",
                        "-c",
                        'echo "devices=$DEVCLUSTER_DRA_DEVICES"; exec sleep 600',
                    ],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
            "resourceClaims": [{"name": "gpu", **source}],
        },
    }


async def create(cluster: DevCluster, plural: str, body: dict, ns: str | None = "default"):
    return await cluster.api_create(plural, "v1", ns, body, RequestInfo())


def bound(cluster: DevCluster, ns: str = "default") -> dict[str, str]:
    return {
        p["metadata"]["name"]: p["spec"]["nodeName"]
        for p in cluster.list("pods", ns)
        if p["spec"].get("nodeName")
    }


def claim_of(cluster: DevCluster, pod_name: str, ns: str = "default") -> dict[str, Any]:
    pod = cluster.get("pods", ns, pod_name)
    name = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    return cluster.get(CLAIMS, ns, name)


def failed_scheduling(cluster: DevCluster, pod: str, ns: str = "default") -> str | None:
    events = [e for e in cluster.events_for(ns, pod) if e["reason"] == "FailedScheduling"]
    return events[-1]["message"] if events else None


# ---------------------------------------------------------------- the API
async def test_the_api_serves_resource_k8s_io_v1_validated_as_the_apiserver_does(cluster, api):
    resource = client.ResourceV1Api(api)
    classes = await resource.list_device_class()
    # the chart's classes, installed with the driver on a node with `dra:`
    assert {c.metadata.name for c in classes.items} == {"gpu.nvidia.com", "mig.nvidia.com"}
    slices = await resource.list_resource_slice()
    assert [s.spec.node_name for s in slices.items] == ["gpu-h100"]
    url = f"{cluster.url}/apis/resource.k8s.io/v1"
    discovery = json.loads(await asyncio.to_thread(lambda: urllib.request.urlopen(url).read()))
    names = {r["name"] for r in discovery["resources"]}
    assert {"deviceclasses", "resourceslices", "resourceclaims", "resourceclaims/status",
            "resourceclaimtemplates"} <= names  # fmt: skip

    claim = {
        "metadata": {"name": "c1"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.nvidia.com"}}]}},
    }  # fmt: skip
    made = await resource.create_namespaced_resource_claim("default", claim)
    assert made.status is None or made.status.allocation is None

    # an unknown field: the 1.34 schema, strict
    bad = {**claim, "metadata": {"name": "c2"}}
    bad["spec"] = {"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": "gpu.nvidia.com", "colour": "red"}}]}}  # fmt: skip
    with pytest.raises(ApiException) as refused:
        await resource.create_namespaced_resource_claim("default", bad)
    assert refused.value.status == 422
    assert "colour" in refused.value.body

    # validation.go validateDeviceRequest: exactly one of exactly / firstAvailable
    both = {"metadata": {"name": "c3"}, "spec": {"devices": {"requests": [{"name": "gpu",
            "exactly": {"deviceClassName": "gpu.nvidia.com"},
            "firstAvailable": [{"name": "a", "deviceClassName": "gpu.nvidia.com"}]}]}}}  # fmt: skip
    with pytest.raises(ApiException) as refused:
        await resource.create_namespaced_resource_claim("default", both)
    assert refused.value.status == 422
    assert "exactly one of `exactly` or `firstAvailable` is required" in refused.value.body

    # a selector that is not CEL (validateSelector compiles it)
    broken = {"metadata": {"name": "bad-class"}, "spec": {"selectors": [{"cel": {
        "expression": "device.driver == "}}]}}  # fmt: skip
    with pytest.raises(ApiException) as refused:
        await resource.create_device_class(broken)
    assert refused.value.status == 422
    assert "spec.selectors[0].cel.expression" in refused.value.body

    # ValidateResourceClaimUpdate: the spec is immutable
    with pytest.raises(ApiException) as refused:
        await resource.patch_namespaced_resource_claim(
            "c1", "default",
            {"spec": {"devices": {"requests": [{"name": "other", "exactly": {
                "deviceClassName": "gpu.nvidia.com"}}]}}},
        )  # fmt: skip
    assert refused.value.status == 422
    assert "field is immutable" in refused.value.body

    # the status subresource writes the status only; the claim's own write leaves it alone
    status = {"status": {"allocation": {"devices": {"results": [{"request": "gpu",
              "driver": "gpu.nvidia.com", "pool": "gpu-h100", "device": "gpu-0"}]}}}}  # fmt: skip
    written = await resource.patch_namespaced_resource_claim_status("c1", "default", status)
    assert written.status.allocation.devices.results[0].device == "gpu-0"
    relabelled = await resource.patch_namespaced_resource_claim(
        "c1", "default", {"metadata": {"labels": {"a": "b"}}, "status": None}
    )
    assert relabelled.status.allocation.devices.results[0].device == "gpu-0"
    # a result must name a request of the claim
    with pytest.raises(ApiException) as refused:
        await resource.patch_namespaced_resource_claim_status(
            "c1", "default",
            {"status": {"allocation": {"devices": {"results": [{"request": "nope",
             "driver": "gpu.nvidia.com", "pool": "gpu-h100", "device": "gpu-0"}]}}}},
        )  # fmt: skip
    assert refused.value.status == 422


async def test_a_template_makes_one_claim_per_pod_owned_by_it_as_the_controller_names_it(cluster):
    await create(
        cluster, TEMPLATES, template("whole", {"exactly": {"deviceClassName": "gpu.nvidia.com"}})
    )
    long_name = "jupyter-" + "a" * 50
    for name in ("nb", long_name):
        await create(cluster, "pods", gpu_pod(name, template_name="whole"))
    pod = await poll(
        lambda: (
            (p := cluster.get("pods", "default", "nb"))["status"].get("resourceClaimStatuses") and p
        ),
        "the claim's name in the pod's status",
    )
    name = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    assert pod["status"]["resourceClaimStatuses"][0]["name"] == "gpu"
    assert name.startswith("nb-gpu-") and len(name) == len("nb-gpu-") + 5
    claim = cluster.get(CLAIMS, "default", name)
    owner = claim["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "Pod", "nb", pod["metadata"]["uid"], True,
    )  # fmt: skip
    assert claim["metadata"]["annotations"]["resource.kubernetes.io/pod-claim-name"] == "gpu"
    # over 57 characters: pod and claim names cut in proportion, no dash before the suffix
    other = (
        claim_of(cluster, long_name)
        if await poll(
            lambda: cluster.get("pods", "default", long_name)["status"].get(
                "resourceClaimStatuses"
            ),
            "the long pod's claim",
        )
        else None
    )
    assert other["metadata"]["name"][:-5] == long_name[: len(long_name) * 57 // 63] + "-" + "gp"


async def test_seven_10gi_claims_share_one_h100_and_the_eighth_waits_until_one_ends(cluster):
    request = {"exactly": {"deviceClassName": "gpu.nvidia.com",
                           "capacity": {"requests": {"memory": "10Gi"}}}}  # fmt: skip
    await create(cluster, TEMPLATES, template("gpu-10gi", request))
    for i in range(8):
        await create(cluster, "pods", gpu_pod(f"nb-{i}", template_name="gpu-10gi"))
    await poll(lambda: len(bound(cluster)) == 7, "seven pods bound")
    message = await poll(lambda: failed_scheduling(cluster, "nb-7"), "the 8th's event")
    # 81,559 MiB as NVML reports an H100 80GB: 7 x 10,240 fit, 8 do not
    assert message == (
        "0/1 nodes are available: 1 cannot allocate all claims. still not schedulable, "
        "preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling."
    )
    assert cluster.get("pods", "default", "nb-7")["status"]["phase"] == "Pending"
    results = [claim_of(cluster, f"nb-{i}")["status"]["allocation"]["devices"]["results"][0]
               for i in range(7)]  # fmt: skip
    assert {r["device"] for r in results} == {"gpu-0"}
    assert all(r["consumedCapacity"] == {"memory": "10Gi"} for r in results)
    assert len({r["shareID"] for r in results}) == 7
    reserved = claim_of(cluster, "nb-0")["status"]["reservedFor"]
    uid = cluster.get("pods", "default", "nb-0")["metadata"]["uid"]
    assert reserved == [{"resource": "pods", "name": "nb-0", "uid": uid}]
    assert claim_of(cluster, "nb-0")["metadata"]["finalizers"] == [
        "resource.kubernetes.io/delete-protection"
    ]
    gone = claim_of(cluster, "nb-0")["metadata"]["name"]
    await cluster.delete("pods", "default", "nb-0", 0)
    await poll(lambda: "nb-7" in bound(cluster), "the 8th bound once one ended")
    # the controller deleted the claim it had made for the pod
    await poll(lambda: all(c["metadata"]["name"] != gone for c in cluster.list(CLAIMS)),
                   "the ended pod's claim deleted")  # fmt: skip


async def test_a_shared_claim_is_deallocated_when_its_last_pod_ends(cluster):
    claim = {"metadata": {"name": "shared"}, "spec": {"devices": {"requests": [{"name": "gpu",
             "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}  # fmt: skip
    await create(cluster, CLAIMS, claim)
    for name in ("a", "b"):
        await create(cluster, "pods", gpu_pod(name, claim_name="shared"))
    await poll(lambda: len(bound(cluster)) == 2, "both pods bound")
    status = cluster.get(CLAIMS, "default", "shared")["status"]
    assert sorted(c["name"] for c in status["reservedFor"]) == ["a", "b"]
    await cluster.delete("pods", "default", "a", 0)
    await poll(
        lambda: [c["name"] for c in cluster.get(CLAIMS, "default", "shared")["status"].get(
            "reservedFor") or []] == ["b"], "a out of reservedFor",
    )  # fmt: skip
    assert cluster.get(CLAIMS, "default", "shared")["status"]["allocation"]
    await cluster.delete("pods", "default", "b", 0)
    await poll(lambda: not cluster.get(CLAIMS, "default", "shared").get("status", {}).get(
        "allocation"), "deallocated")  # fmt: skip
    left = cluster.get(CLAIMS, "default", "shared")
    assert not left["status"].get("reservedFor")  # the named claim stays, unallocated
    assert not left["metadata"].get("finalizers")


async def test_the_container_gets_what_the_cdi_spec_gives_it(cluster):
    await create(
        cluster, TEMPLATES, template("whole", {"exactly": {"deviceClassName": "gpu.nvidia.com"}})
    )
    await create(cluster, "pods", gpu_pod("nb", template_name="whole"))
    await poll(lambda: cluster.get("pods", "default", "nb")["status"].get("phase") == "Running",
                   "running")  # fmt: skip
    uuid = cluster.list(SLICES)[0]["spec"]["devices"][0]["attributes"]["uuid"]["string"]
    log = cluster.kubelet.pod_dir("default", "nb") / "container.log"
    await poll(lambda: log.exists() and "devices=" in log.read_text(), "the log")
    assert f"devices={uuid}" in log.read_text()
    pod = cluster.get("pods", "default", "nb")
    env = cluster.dra.claim_env(pod, pod["spec"]["containers"][0])
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"


async def test_kubectl_applies_a_template_and_prints_the_claims_state(cluster, tmp_path):
    """`kubectl apply -f` of a DRA manifest, then `kubectl get` printing a claim's STATE as
    printers.go's resourceClaimState does ("allocated,reserved"; "pending" before)."""
    manifest = tmp_path / "gpu.yaml"
    manifest.write_text(
        yaml.safe_dump_all(
            [
                template(
                    "gpu-4gi",
                    {
                        "exactly": {
                            "deviceClassName": "gpu.nvidia.com",
                            "capacity": {"requests": {"memory": "4Gi"}},
                        }
                    },
                ),  # fmt: skip
                {"apiVersion": "v1", "kind": "Pod", **gpu_pod("p", template_name="gpu-4gi")},
            ]
        )
    )

    def kubectl(*args: str) -> str:
        done = subprocess.run(
            ["kubectl", "--kubeconfig", str(cluster.kubeconfig_path), *args],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout

    out = await asyncio.to_thread(kubectl, "apply", "-f", str(manifest))
    assert "resourceclaimtemplate.resource.k8s.io/gpu-4gi created" in out
    await poll(lambda: bound(cluster), "the pod bound")
    table = await asyncio.to_thread(kubectl, "get", "resourceclaims")
    header, row = table.splitlines()[:2]
    assert header.split() == ["NAME", "STATE", "AGE"]
    assert row.split()[0].startswith("p-gpu-") and row.split()[1] == "allocated,reserved"
    slices = await asyncio.to_thread(kubectl, "get", "resourceslices")
    assert slices.splitlines()[0].split() == ["NAME", "NODE", "DRIVER", "POOL", "AGE"]


async def test_make_demos_simulated_gpu_reaches_a_pod_through_its_claim(cluster, monkeypatch):
    """`make demo` (DEVCLUSTER_SIMULATED_GPU=1): a pod whose GPU comes from a claim reads the
    simulated device its claim gives it, with the whole GPU's memory (a memory share is not
    enforced inside the container)."""
    monkeypatch.setenv("DEVCLUSTER_SIMULATED_GPU", "1")
    monkeypatch.delenv("FRACSPAWNER_GPU_SOURCE", raising=False)
    request = {"exactly": {"deviceClassName": "gpu.nvidia.com",
                           "capacity": {"requests": {"memory": "10Gi"}}}}  # fmt: skip
    await create(cluster, TEMPLATES, template("gpu-10gi", request))
    await create(cluster, "pods", gpu_pod("nb", template_name="gpu-10gi"))
    await poll(lambda: bound(cluster), "bound")
    pod = cluster.get("pods", "default", "nb")
    env = cluster.dra.claim_env(pod, pod["spec"]["containers"][0])
    assert env["FRACSPAWNER_GPU_SOURCE"] == "simulated-demo"
    device = json.loads(env["FRACSPAWNER_SIMULATED_GPU"])
    assert device["name"] == "NVIDIA H100 80GB HBM3 (simulated)"
    assert device["memory_total_mib"] == 81559


async def test_the_dra_topology_publishes_a_slice_per_gpu_node(tmp_path):
    """devcluster/topologies/dra.yaml: the nodes examples/catalogs/dra.yaml's pools need."""
    topology = Path(__file__).resolve().parent.parent / "devcluster" / "topologies" / "dra.yaml"
    async with DevCluster(topology, state_dir=tmp_path / "state") as running:
        slices = {s["spec"]["nodeName"]: s["spec"] for s in running.list(SLICES)}
    assert sorted(slices) == ["gpu-a100-dmig", "gpu-h100-dra", "gpu-l40s-dra"]
    h100 = slices["gpu-h100-dra"]["devices"]
    assert [d["capacity"]["memory"]["value"] for d in h100] == ["81559Mi", "81559Mi"]
    assert slices["gpu-a100-dmig"]["sharedCounters"][0]["name"] == "gpu-0-counter-set"
    l40s = slices["gpu-l40s-dra"]["devices"][0]
    assert l40s["attributes"]["productName"] == {"string": "NVIDIA L40S"}
    assert l40s["capacity"]["shares"]["value"] == "4"


async def test_a_pod_whose_containers_name_no_claim_of_the_pod_is_refused(cluster):
    """pkg/apis/core/validation validateResourceClaimNames / validatePodResourceClaimSource."""
    pod = gpu_pod("bad", template_name="whole")
    pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpus"}]
    with pytest.raises(ApiError) as refused:
        await create(cluster, "pods", pod)
    assert refused.value.code == 422
    assert refused.value.message == (
        'Pod "bad" is invalid: spec.containers[0].resources.claims[0]: Not found: "gpus": '
        "must be one of the names in pod.spec.resourceClaims: gpu"
    )
    sourceless = gpu_pod("none", template_name="whole")
    del sourceless["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
    with pytest.raises(ApiError) as refused:
        await create(cluster, "pods", sourceless)
    assert refused.value.message == (
        'Pod "none" is invalid: spec.resourceClaims[0]: Invalid value: core.PodResourceClaim{'
        'Name:"gpu", ResourceClaimName:(*string)(nil), ResourceClaimTemplateName:(*string)(nil)}'
        ": must specify one of: `resourceClaimName`, `resourceClaimTemplateName`"
    )
    assert cluster.list("pods", "default") == []


async def test_a_pod_that_finishes_gives_its_claim_back(cluster):
    """controller.go: a pod that is done (Succeeded) leaves reservedFor, its template claim is
    deallocated and deleted, and a waiting pod gets the GPU."""
    await create(
        cluster, TEMPLATES, template("whole", {"exactly": {"deviceClassName": "gpu.nvidia.com"}})
    )
    short = gpu_pod("short", template_name="whole")
    short["spec"]["restartPolicy"] = "Never"
    # it ends when the test says so: no race with the scheduler on a loaded machine
    short["spec"]["containers"][0]["command"] = [
        "sh", "-c", 'while [ ! -e "$HOME/go" ]; do sleep 0.1; done'
    ]  # fmt: skip
    await create(cluster, "pods", short)
    await poll(lambda: bound(cluster), "the short pod bound")
    name = claim_of(cluster, "short")["metadata"]["name"]
    await create(cluster, "pods", gpu_pod("next", template_name="whole"))
    await poll(lambda: failed_scheduling(cluster, "next"), "next waits for the GPU")
    (cluster.kubelet.pod_dir("default", "short") / "home" / "go").touch()
    await poll(lambda: "next" in bound(cluster), "next bound once short finished")
    assert cluster.get("pods", "default", "short")["status"]["phase"] == "Succeeded"
    assert name not in {c["metadata"]["name"] for c in cluster.list(CLAIMS)}


async def test_the_controller_tries_again_when_creating_a_claim_fails(cluster, monkeypatch):
    """A claim create refused for a while (a webhook down under failurePolicy Fail) and a
    template that comes after the pod: the controller's work queue tries again."""
    original = cluster.api_create
    refusals = []

    async def flaky(plural, *args, **kwargs):
        if plural == CLAIMS and len(refusals) < 2:
            refusals.append(plural)
            raise ApiError(500, "InternalError", "Internal error occurred: failed calling webhook")
        return await original(plural, *args, **kwargs)

    monkeypatch.setattr(cluster, "api_create", flaky)
    await create(cluster, "pods", gpu_pod("early", template_name="later"))
    await asyncio.sleep(0.2)
    assert cluster.list(CLAIMS) == []  # no template yet: nothing made, the pod waits
    whole = {"exactly": {"deviceClassName": "gpu.nvidia.com"}}
    await create(cluster, TEMPLATES, template("later", whole))
    await poll(lambda: "early" in bound(cluster), "bound after two refused creates")
    assert len(refusals) == 2 and len(cluster.list(CLAIMS)) == 1


async def test_a_node_added_with_dra_publishes_its_slice_owned_by_it_and_it_goes_with_it(cluster):
    cluster.add_node({"name": "gpu-t4", "capacity": {"cpu": "8", "memory": "32Gi"},
                      "dra": {"gpus": 1, "model": "T4"}})  # fmt: skip
    node = cluster.get("nodes", None, "gpu-t4")
    mine = await poll(
        lambda: [s for s in cluster.list(SLICES) if s["spec"]["nodeName"] == "gpu-t4"], "its slice"
    )
    assert mine[0]["metadata"]["name"].startswith("gpu-t4-gpu.nvidia.com-")
    owner = mine[0]["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == (
        "Node",
        "gpu-t4",
        node["metadata"]["uid"],
    )
    await cluster.delete("nodes", None, "gpu-t4", None)
    await poll(
        lambda: all(s["spec"]["nodeName"] != "gpu-t4" for s in cluster.list(SLICES)), "slice gone"
    )


TWO_NODES = {
    "nodes": [
        {"name": f"gpu-{i}", "capacity": {"cpu": "8", "memory": "32Gi"},
         "labels": {"rack": str(i)}, "dra": {"gpus": 1, "model": "H100-80GB"}}
        for i in (1, 2)
    ]
}  # fmt: skip


@pytest.mark.parametrize("cluster", [TWO_NODES], indirect=True)
async def test_an_allocated_claim_keeps_its_pods_on_its_node(cluster):
    """Filter: a pod sharing an allocated claim can only go where the allocation's
    nodeSelector points ("resourceclaim not available on the node" elsewhere)."""
    claim = {"metadata": {"name": "shared"}, "spec": {"devices": {"requests": [{"name": "gpu",
             "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}  # fmt: skip
    await create(cluster, CLAIMS, claim)
    first = gpu_pod("first", claim_name="shared")
    first["spec"]["nodeSelector"] = {"rack": "1"}
    await create(cluster, "pods", first)
    await poll(lambda: bound(cluster) == {"first": "gpu-1"}, "first on gpu-1")
    second = gpu_pod("second", claim_name="shared")
    second["spec"]["nodeSelector"] = {"rack": "2"}
    await create(cluster, "pods", second)
    message = await poll(lambda: failed_scheduling(cluster, "second"), "second refused")
    assert message.startswith(
        "0/2 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, "
        "1 resourceclaim not available on the node."
    )
    await create(cluster, "pods", gpu_pod("third", claim_name="shared"))
    await poll(lambda: bound(cluster).get("third") == "gpu-1", "third joins it on gpu-1")


async def test_a_claim_naming_a_class_that_does_not_exist_says_so(cluster):
    """allocator.go: "could not retrieve device class", a Filter error, not "no room"."""
    typo = {"exactly": {"deviceClassName": "gpu.nvidia.co"}}
    await create(cluster, TEMPLATES, template("typo", typo))
    await create(cluster, "pods", gpu_pod("nb", template_name="typo"))
    message = await poll(lambda: failed_scheduling(cluster, "nb"), "FailedScheduling")
    claim = claim_of(cluster, "nb")["metadata"]["name"]
    assert message == (
        f'running "DynamicResources" filter plugin: claim default/{claim}, request gpu: could '
        'not retrieve device class gpu.nvidia.co: deviceclass.resource.k8s.io "gpu.nvidia.co" '
        "not found"
    )


async def test_a_claim_deleted_while_in_use_stays_until_its_pod_ends(cluster):
    """The scheduler's resource.kubernetes.io/delete-protection finalizer keeps a deleted claim
    (deletionTimestamp, STATE deleted,allocated,reserved) while a pod uses it; once the pod
    is gone the controller deallocates it, removes the finalizer, and it goes."""
    claim = {"metadata": {"name": "shared"}, "spec": {"devices": {"requests": [{"name": "gpu",
             "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}  # fmt: skip
    await create(cluster, CLAIMS, claim)
    await create(cluster, "pods", gpu_pod("user", claim_name="shared"))
    await poll(lambda: bound(cluster), "bound")
    await cluster.api_delete(CLAIMS, "v1", "default", "shared", None, RequestInfo())
    kept = cluster.get(CLAIMS, "default", "shared")
    assert kept["metadata"]["deletionTimestamp"] and kept["status"]["allocation"]
    await cluster.delete("pods", "default", "user", 0)
    await poll(lambda: all(c["metadata"]["name"] != "shared" for c in cluster.list(CLAIMS)),
                   "the claim gone once its pod is")  # fmt: skip
