"""Issue 36 item 4 on DRA pools: a server's GPUs are those its ResourceClaim was allocated, never
what its report lists.

The allocated devices are named in the claim's `status.allocation.devices.results` (driver,
pool, device: k8s.io/api resource/v1 types.go DeviceRequestAllocationResult); the node's
ResourceSlice maps each device name to its attributes, and NVIDIA's DRA driver publishes the
NVML UUID as `uuid` (a MIG device also `parentUUID`: kubernetes-sigs/dra-driver-nvidia-gpu
cmd/gpu-kubelet-plugin/deviceinfo.go). A pod names its claims in `spec.resourceClaims`; for a
template the generated claim's name is in `status.resourceClaimStatuses`, for a DRA-backed
extended resource (KEP-5004) in `status.extendedResourceClaimStatus`.

The slices and claims below are written as NVIDIA's kubelet plugin and the allocator write them
(tests/test_dra_capacity.py: consumable shares in memory mode, allowMultipleAllocations, a
result's consumedCapacity and shareID).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from fracspawner.backends import load_catalog
from fracspawner.culler.decide import ServerFacts
from fracspawner.culler.reports import parse_report
from fracspawner.culler.serverpods import ServerPods
from fracspawner.culler.swapdesk import SwapDesk, seats_from

DRIVER = "gpu.nvidia.com"
SIZE = 15360.0  # a T4 as NVML reports it
QUARTER = SIZE / 4
NS = "jhub"
CATALOG = load_catalog(
    {"pools": {"t4-dra": {"gpu": "T4", "backend": "dra", "options": {"sharing": "memory"},
                          "offers": ["1/4"]}}}
)  # fmt: skip


def uuid(node: str, minor: int) -> str:
    return f"GPU-{node}-{minor}"


def node_slice(node: str, gpus: int = 2) -> dict[str, Any]:
    """The node's ResourceSlice as the plugin publishes it with --consumable-shares=memory."""
    value = str(int(SIZE) * 2**20)
    return {
        "metadata": {"name": f"{node}-{DRIVER}-x7k2p"},
        "spec": {
            "driver": DRIVER, "nodeName": node, "pool": {"name": node, "generation": 1,
                                                         "resourceSliceCount": 1},
            "devices": [
                {"name": f"gpu-{i}", "allowMultipleAllocations": True,
                 "attributes": {"type": {"string": "gpu"}, "uuid": {"string": uuid(node, i)},
                                "productName": {"string": "Tesla T4"}},
                 "capacity": {"memory": {"value": value, "requestPolicy": {
                     "default": value,
                     "validRange": {"min": "1Mi", "max": value, "step": "1Mi"}}}}}
                for i in range(gpus)
            ],
        },
    }  # fmt: skip


def mig_slice(node: str) -> dict[str, Any]:
    return {
        "metadata": {"name": f"{node}-mig"},
        "spec": {"driver": DRIVER, "nodeName": node, "pool": {"name": f"{node}-mig",
                                                               "generation": 1},
                 "devices": [{"name": "gpu-0-mig-1g10gb-0", "attributes": {
                     "type": {"string": "mig"}, "uuid": {"string": "MIG-aaaa"},
                     "parentUUID": {"string": uuid(node, 0)}}}]},
    }  # fmt: skip


def claim(name: str, *devices: tuple[str, str], memory: str | None = None) -> dict[str, Any]:
    """A claim in NS allocated `devices` ((pool, device) each); `memory`: what each consumes
    of a shared device (a consumable-shares claim: it has a shareID)."""
    results = []
    for i, (pool, device) in enumerate(devices):
        result = {"request": "gpu", "driver": DRIVER, "pool": pool, "device": device}
        if memory:
            result |= {"consumedCapacity": {"memory": memory}, "shareID": f"share-{name}-{i}"}
        results.append(result)
    return {
        "metadata": {"name": name, "namespace": NS},
        "status": {"allocation": {"devices": {"results": results}}} if results else {},
    }


def pod(
    user: str,
    node: str,
    *,
    template: str | None = None,
    named: str | None = None,
    extended: str | None = None,
) -> dict[str, Any]:
    """The server pod: its claim from a template (the generated name in its status, or not yet
    there: `template` None), by name, or a DRA-backed `nvidia.com/gpu` (KEP-5004)."""
    spec: dict[str, Any] = {"nodeName": node, "containers": [{"name": "notebook"}]}
    status: dict[str, Any] = {"phase": "Running", "podIP": f"10.0.1.{len(user)}"}
    if named is not None:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": named}]
    elif extended is not None:
        spec["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
        status["extendedResourceClaimStatus"] = {
            "resourceClaimName": extended,
            "requestMappings": [{"containerName": "notebook", "resourceName": "nvidia.com/gpu",
                                 "requestName": "container-0-request-0"}]}  # fmt: skip
    else:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "t4-dra-1-4"}]
        if template is not None:
            status["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": template}]
    return {
        "metadata": {"name": f"jupyter-{user}", "namespace": NS,
                     "labels": {"component": "singleuser-server"}},
        "spec": spec, "status": status,
    }  # fmt: skip


def watched(pods: list[dict], claims: list[dict], slices: list[dict]) -> ServerPods:
    """The culler's pod watch with its DRA watches, as their lists fill it."""
    watch = ServerPods(NS, dra=True)
    watch.load(pods)
    watch.dra.load_claims(claims)
    watch.dra.load_slices(slices)
    return watch


def test_a_dra_servers_gpus_are_those_its_claim_was_allocated():
    slices = [node_slice("node-a"), mig_slice("node-a")]
    claims = [
        claim("jupyter-ann-gpu-k8q2w", ("node-a", "gpu-1"), memory="3840Mi"),
        claim("shared", ("node-a", "gpu-0"), ("node-a", "gpu-1")),
        claim("mig", ("node-a-mig", "gpu-0-mig-1g10gb-0")),
        claim("jupyter-eve-gpu-pending"),  # not allocated yet
        claim("jupyter-fay-extended-resources-x2", ("node-a", "gpu-0")),
    ]
    pods = [
        pod("ann", "node-a", template="jupyter-ann-gpu-k8q2w"),
        pod("bob", "node-a", named="shared"),
        pod("cy", "node-a", named="mig"),
        pod("dan", "node-a"),  # the generated claim's name is not in its status yet
        pod("eve", "node-a", template="jupyter-eve-gpu-pending"),
        pod("fay", "node-a", extended="jupyter-fay-extended-resources-x2"),
    ]
    watch = watched(pods, claims, slices)
    ann = watch.placement("jupyter-ann")
    assert (ann.node, ann.gpus, ann.uuids) == ("node-a", 1, frozenset({uuid("node-a", 1)}))
    bob = watch.placement("jupyter-bob")
    assert bob.gpus == 2 and bob.uuids == {uuid("node-a", 0), uuid("node-a", 1)}
    # a MIG device is seen by its own UUID or its parent GPU's, and is one device
    cy = watch.placement("jupyter-cy")
    assert cy.gpus == 1 and cy.uuids == {"MIG-aaaa", uuid("node-a", 0)}
    assert watch.placement("jupyter-fay").uuids == {uuid("node-a", 0)}
    # not known yet (no claim name, no allocation): the node and the count bind, as before
    for user in ("dan", "eve"):
        p = watch.placement(f"jupyter-{user}")
        assert (p.node, p.gpus, p.uuids) == ("node-a", 1, None), user
    # the claim's allocation comes later: the placement follows it
    watch.dra.put_claim(claim("jupyter-eve-gpu-pending", ("node-a", "gpu-0")))
    assert watch.placement("jupyter-eve").uuids == {uuid("node-a", 0)}
    # a claim or a slice gone: not known any more
    watch.dra.drop_claim(claim("shared"))
    assert watch.placement("jupyter-bob").uuids is None
    watch.dra.drop_slice(node_slice("node-a"))
    assert watch.placement("jupyter-ann").uuids is None
    # without the DRA watches a DRA pod is bound by its node and count
    plain = ServerPods(NS)
    plain.load(pods)
    assert plain.placement("jupyter-ann").uuids is None


def report(
    kernels: list[tuple[str, float]],
    device: str,
    *,
    waiting: float = 0.0,
    since: str = "2026-01-01T12:00:00Z",
    used: float = 0.0,
) -> dict:
    """A report naming one device (`device`'s UUID, its NVML reading `used`), resident kernels
    (id, MiB) on it and, with `waiting`, a hibernated kernel w waiting to resume there."""
    kernels_ = [
        {
            "id": k,
            "execution_state": "idle",
            "last_activity": "2026-01-01T10:00:00Z",
            "gpu_memory_mib": mib,
            "gpu_utilization": 0,
            "gpu_activity_known": True,
            "hibernation": {"state": "running"},
        }
        for k, mib in kernels
    ]
    if waiting:
        kernels_.append(
            {
                "id": "w",
                "execution_state": "idle",
                "gpu_memory_mib": 0,
                "gpu_utilization": 0,
                "gpu_activity_known": True,
                "last_activity": "2026-01-01T10:00:00Z",
                "hibernation": {"state": "hibernated"},
            }
        )
    return {
        "available": True, "sampled_at": "2026-01-01T12:00:00Z",
        "devices": [{"index": "0", "uuid": device, "memory_total_mib": SIZE,
                     "memory_used_mib": used}],
        "processes": [{"pid": 10 + i, "kernel_id": k, "device": "0", "gpu_memory_mib": mib,
                       "matched": True} for i, (k, mib) in enumerate(kernels)],
        "kernels": kernels_,
        "swap": {"waiting": [{"kernel_id": "w", "gpu_memory_mib": waiting, "device": device,
                              "since": since}] if waiting else []},
        "presence": {"known": True, "present": False},
    }  # fmt: skip


def seats(watch: ServerPods, bodies: dict[str, dict], users: list[str], now: float) -> list:
    """The culler's seats for `users` of the DRA pool (a quarter each): those in `bodies` have
    reported, the others have not; each bound to its pod by the watch."""
    reports = [(u, "", parse_report(b, received_at=now)) for u, b in bodies.items()]
    known = {(u, ""): ServerFacts(u, user_options={"gpu": "1/4", "pool": "t4-dra"})
             for u in users}  # fmt: skip
    return seats_from(
        reports,
        known,
        CATALOG,
        now,
        30,
        also_pool="t4-dra",
        placement=lambda user, server: watch.placement(f"jupyter-{user}"),
    )


def test_a_dra_report_naming_a_gpu_not_allocated_to_its_claim_holds_no_resume_there():
    """Vic's claim was allocated gpu-0 of node-a, Mallory's gpu-1 of the same node. Vic's kernel
    waits to resume a quarter on gpu-0, which holds nothing else. Mallory's report names gpu-0
    (its UUID is in the node's slice for anyone to read) with her quarter resident and a
    resume of her own waiting there since before Vic's: were she counted there, she would take
    the room and Vic would be told the GPU is full. Her claim was not allocated gpu-0: her
    word does not count on it, so Vic's kernel resumes."""
    watch = watched(
        [pod("vic", "node-a", template="jupyter-vic-gpu-1"),
         pod("mallory", "node-a", template="jupyter-mallory-gpu-1")],
        [claim("jupyter-vic-gpu-1", ("node-a", "gpu-0"), memory="3840Mi"),
         claim("jupyter-mallory-gpu-1", ("node-a", "gpu-1"), memory="3840Mi")],
        [node_slice("node-a")],
    )  # fmt: skip
    gpu0 = uuid("node-a", 0)
    now = 1.8e9
    bodies = {
        "mallory": report(
            [("m1", 3 * QUARTER)],
            gpu0,
            waiting=3 * QUARTER,
            since="2026-01-01T11:00:00Z",
            used=3 * QUARTER,
        ),
        "vic": report([], gpu0, waiting=QUARTER),
    }
    desk = SwapDesk(report_in=10)
    all_seats = seats(watch, bodies, ["vic", "mallory"], now)
    desk.answer("mallory", "", all_seats, now)
    answer = desk.answer("vic", "", all_seats, now)
    assert answer and answer["swap"].get("resume") == [
        {"kernel_id": "w", "gpu_memory_mib": QUARTER}
    ], answer
    # what she names counts nowhere: her claim's GPU is not among her report's devices
    mine = next(s for s in all_seats if s.user == "mallory")
    assert mine.facts.gpus == ()


def test_a_dra_claim_sharing_a_device_counts_its_slice_there_and_nowhere_else():
    """Consumable shares (memory mode): gpu-0 of node-a is shared by four claims of a quarter.
    Xi and Yu have reported a quarter each resident; Nia's claim was allocated gpu-0 and her
    server has not reported: her slice counts there (unknown memory is never free). Wes's
    claim is on gpu-1 and he has not reported: he counts on gpu-1, not on gpu-0. Vic waits to
    resume a quarter on gpu-0: it fits (3 quarters on it), and Zed's quarter, waiting after
    Vic's, does not."""
    users = ["xi", "yu", "nia", "wes", "vic", "zed"]
    on = {"xi": 0, "yu": 0, "nia": 0, "wes": 1, "vic": 0, "zed": 0}
    watch = watched(
        [pod(u, "node-a", template=f"jupyter-{u}-gpu-1") for u in users],
        [claim(f"jupyter-{u}-gpu-1", ("node-a", f"gpu-{on[u]}"), memory="3840Mi")
         for u in users],
        [node_slice("node-a")],
    )  # fmt: skip
    gpu0 = uuid("node-a", 0)
    now = 1.8e9
    bodies = {
        "xi": report([("x1", QUARTER)], gpu0, used=3 * QUARTER),
        "yu": report([("y1", QUARTER)], gpu0, used=3 * QUARTER),
        "vic": report([], gpu0, waiting=QUARTER, used=3 * QUARTER),
        "zed": report([], gpu0, waiting=QUARTER, since="2026-01-01T12:00:05Z", used=3 * QUARTER),
    }
    desk = SwapDesk(report_in=10)
    all_seats = seats(watch, bodies, users, now)
    answer = desk.answer("vic", "", all_seats, now)
    assert answer and answer["swap"].get("resume") == [
        {"kernel_id": "w", "gpu_memory_mib": QUARTER}
    ], answer
    answer = desk.answer("zed", "", all_seats, now)
    assert answer and answer["swap"].get("wait"), answer  # Nia's slice holds the rest
    assert not answer["swap"].get("resume"), answer
    # Nia may be on gpu-0 only; Wes on gpu-1 only
    by_user = {s.user: s for s in all_seats}
    assert by_user["nia"].may_be_on(f"node-a/{gpu0}")
    assert not by_user["wes"].may_be_on(f"node-a/{gpu0}")
    assert by_user["wes"].may_be_on(f"node-a/{uuid('node-a', 1)}")


@pytest.mark.e2e
@pytest.mark.slow
async def test_the_watches_bind_a_server_to_the_gpu_its_claim_was_allocated(tmp_path):
    """On the real control plane (issue 35): kube-controller-manager's resourceclaim controller
    makes each server pod's claim from its template, kube-scheduler's DynamicResources plugin
    allocates it from the slices the node agent publishes as NVIDIA's kubelet plugin does
    (devcluster/nodeagent/slices.py). Two server pods claim 10Gi of a two-GPU node with
    consumable shares. The culler's watches list pods, claims and slices from kube-apiserver
    as the chart runs them, and each server's placement is the one GPU UUID of the device its
    claim was allocated (which the plugin's CDI spec would hand its container)."""
    import asyncio
    import time

    from devcluster.controlplane import ControlPlane
    from devcluster.nodeagent import NodeAgent
    from devcluster.topology import load_topology
    from tests.test_controlplane import _binary

    _binary()
    topology = {"nodes": [{"name": "gpu-a", "capacity": {"cpu": "64", "memory": "512Gi"},
                           "dra": {"gpus": 2, "model": "H100-80GB",
                                   "consumableShares": "memory"}}]}  # fmt: skip
    ask = {"deviceClassName": "gpu.nvidia.com", "capacity": {"requests": {"memory": "10Gi"}}}
    request = {"name": "gpu", "exactly": ask}
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": "t4-dra-10gi", "namespace": "default"},
                "spec": {"spec": {"devices": {"requests": [request]}}}}  # fmt: skip
    names = ("jupyter-ann", "jupyter-bob")
    # started from this thread: a component dies with the thread that started it
    with (
        ControlPlane.start(tmp_path / "controlplane") as cp,
        NodeAgent.start(load_topology(topology), cp.server, cp.pki.ca, tmp_path / "agent"),
    ):
        api = cp.client

        def call(method: str, path: str, body: Any = None) -> Any:
            status, text = api.request(method, path, body)
            assert status in (200, 201), (method, path, status, text)
            return json.loads(text)

        call("POST", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaimtemplates",
             template)  # fmt: skip
        for name in names:
            notebook = {"name": "notebook", "image": "x", "command": ["sleep", "infinity"],
                        "resources": {"claims": [{"name": "gpu"}]}}  # fmt: skip
            pod = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": name, "labels": {"component": "singleuser-server"}},
                   "spec": {"resourceClaims": [{"name": "gpu",
                                                "resourceClaimTemplateName": "t4-dra-10gi"}],
                            "containers": [notebook]}}  # fmt: skip
            call("POST", "/api/v1/namespaces/default/pods", pod)

        def given(name: str) -> str | None:
            """The UUID of the device the pod's claim was allocated, from the claim and the
            node's slices (None until the pod is bound)."""
            pod = call("GET", f"/api/v1/namespaces/default/pods/{name}")
            if not pod["spec"].get("nodeName"):
                return None
            (claim_status,) = pod["status"]["resourceClaimStatuses"]
            claim = call("GET", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/"
                         + claim_status["resourceClaimName"])  # fmt: skip
            (result,) = claim["status"]["allocation"]["devices"]["results"]
            slices = call("GET", "/apis/resource.k8s.io/v1/resourceslices")["items"]
            return next(
                d["attributes"]["uuid"]["string"]
                for s in slices if s["spec"]["pool"]["name"] == result["pool"]
                for d in s["spec"].get("devices") or [] if d["name"] == result["device"]
            )  # fmt: skip

        seen: dict[str, str] = {}
        deadline = time.monotonic() + 120
        while len(seen) < len(names):
            assert time.monotonic() < deadline, f"pods not scheduled: {names} ({seen})"
            seen = {n: u for n in names if (u := given(n))}
            await asyncio.sleep(0.5)
        watch = ServerPods("default", kubeconfig=str(cp.kubeconfig), dra=True)
        watch.start()
        try:
            await asyncio.wait_for(watch.listed.wait(), 60)
            for name, device in seen.items():
                deadline = time.monotonic() + 60
                while not ((placement := watch.placement(name)) and placement.uuids):
                    assert time.monotonic() < deadline, f"{name}'s claim and slice watched"
                    await asyncio.sleep(0.2)
                assert (placement.node, placement.gpus) == ("gpu-a", 1)
                assert placement.uuids == {device}, (name, placement, device)
        finally:
            await watch.stop()
