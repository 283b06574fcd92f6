"""The node agent in run mode gives each container the devices of the DRA claims it references
(devcluster/nodeagent/claimenv.py), on the real control plane: kube-scheduler allocates a
claim made from a template; the containers read their env; one whose claim is not allocated
waits in ContainerCreating. docs/devcluster.md "Dynamic Resource Allocation"."""

from __future__ import annotations

from typing import Any

import pytest

from devcluster.controlplane import ControlPlane
from tests import dra_demo_manifests as demos
from tests.nodeagent_support import explained
from tests.realcluster_support import control_plane_fixture, node_agent_fixture
from tests.test_controlplane import eventually, get_json, kubectl

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
NS = "dra-env"
NODE = "dra-run"
TOPOLOGY = {"nodes": [{
    "name": NODE, "taints": demos.GPU_TAINT, "capacity": {"cpu": "16", "memory": "64Gi"},
    "dra": {"gpus": 2, "model": "A100-40GB", "mig": "static", "migGpus": [0],
            "migDevices": ["1g.5gb", "3g.20gb"]},
}]}  # fmt: skip
SHOW = (
    "import os, time; e = os.environ; "
    "print('DEVICES=' + e.get('DEVCLUSTER_DRA_DEVICES', '-'), "
    "'VISIBLE=' + e.get('NVIDIA_VISIBLE_DEVICES', '-'), flush=True); time.sleep(600)"
)

cp = control_plane_fixture()
agent = node_agent_fixture(TOPOLOGY, [NS], state="nodeagent-dra", mode="run")


def ctr(name: str, *claims: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "image": "python", "command": ["python", "-c", SHOW],
            "resources": {"claims": list(claims)}}  # fmt: skip


def line(cp: ControlPlane, pod: str, container: str) -> str | None:
    out = kubectl(cp, "logs", pod, "-c", container, "-n", NS, check=False)
    return out.stdout.strip() if out.returncode == 0 and "DEVICES=" in out.stdout else None


def test_each_container_sees_the_uuids_of_exactly_its_allocation(cp, agent):
    requests = [
        demos.exactly("gpu", "gpu.nvidia.com"),
        demos.exactly("mig", "mig.nvidia.com", selectors=demos.profile("1g.5gb")),
    ]
    pod = demos.pod(
        NS, "two", [ctr("a", {"name": "devs", "request": "gpu"}), ctr("b", {"name": "devs"}),
                    ctr("c")],
        [{"name": "devs", "resourceClaimTemplateName": "devs"}],
    )  # fmt: skip
    pod["spec"]["restartPolicy"] = "Never"
    kubectl(cp, "apply", "-f", "-", stdin={"apiVersion": "v1", "kind": "List", "items": [
        demos.claim_template(NS, "devs", requests), pod]})  # fmt: skip
    with explained(cp, NS, "two", agent):
        shown = eventually(
            lambda: (
                all(line(cp, "two", c) for c in "abc") and {c: line(cp, "two", c) for c in "abc"}
            ),
            "the three containers print their env",
        )
    made = get_json(cp, "pod", "two", "-n", NS)["status"]["resourceClaimStatuses"][0]
    results = get_json(cp, "resourceclaims.resource.k8s.io", made["resourceClaimName"], "-n", NS)[
        "status"]["allocation"]["devices"]["results"]  # fmt: skip
    published = {
        d["name"]: d["attributes"]["uuid"]["string"]
        for s in get_json(cp, "resourceslices.resource.k8s.io")["items"]
        for d in s["spec"].get("devices") or []
    }
    uuid = {r["request"]: published[r["device"]] for r in results}
    assert uuid["gpu"].startswith("GPU-") and uuid["mig"].startswith("MIG-"), results
    assert shown == {
        "a": f"DEVICES={uuid['gpu']} VISIBLE=void",
        "b": f"DEVICES={uuid['gpu']},{uuid['mig']} VISIBLE=void",
        "c": "DEVICES=- VISIBLE=-",
    }


def test_a_container_whose_claim_is_not_allocated_waits(cp, agent):
    claim = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"namespace": NS, "name": "later"},
        "spec": {"devices": {"requests": [demos.exactly("gpu", "gpu.nvidia.com")]}},
    }  # fmt: skip
    pod = demos.pod(NS, "waits", [ctr("a", {"name": "g"})], [{"name": "g",
                    "resourceClaimName": "later"}])  # fmt: skip
    pod["spec"]["nodeName"] = NODE  # past the scheduler, which would allocate it
    kubectl(cp, "apply", "-f", "-", stdin={"apiVersion": "v1", "kind": "List",
                                            "items": [claim, pod]})  # fmt: skip

    def waiting() -> dict | None:
        """The container's waiting state once it says why: a plain ContainerCreating comes
        first, before the node agent has looked at the claim (a fresh-clone run read that one)."""
        statuses = get_json(cp, "pod", "waits", "-n", NS)["status"].get("containerStatuses")
        state = statuses and statuses[0]["state"].get("waiting")
        return state if state and state.get("message") else None

    with explained(cp, NS, "waits", agent):
        state = eventually(waiting, "the container waits and says why")
    assert state["reason"] == "ContainerCreating", state
    assert "'later' is not allocated" in state.get("message", ""), state
