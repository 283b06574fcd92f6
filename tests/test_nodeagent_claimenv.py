"""A container's DRA devices as the node agent gives them (devcluster/nodeagent/claimenv.py):
claims + the node's published slices -> the env NVIDIA's CDI edits stand for."""

from __future__ import annotations

from typing import Any

import pytest

from devcluster.dra import nvidia
from devcluster.nodeagent.claimenv import (
    ClaimNotReady,
    claim_names,
    container_claims,
    device_env,
)
from devcluster.nodeagent.slices import node_slices

NODE = "n1"
STATIC = {"gpus": 2, "model": "A100-40GB", "mig": "static", "migGpus": [0],
          "migDevices": ["1g.5gb", "3g.20gb"]}  # fmt: skip
DYNAMIC = {"gpus": 1, "model": "A100-80GB", "mig": "dynamic"}


def pod() -> dict[str, Any]:
    def ctr(name: str, *claims: dict[str, str]) -> dict[str, Any]:
        return {"name": name, "resources": {"claims": list(claims)}}

    return {
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {
            "initContainers": [ctr("init", {"name": "mine"})],
            "containers": [ctr("a", {"name": "gpus", "request": "r0"}), ctr("b", {"name": "gpus"}),
                           ctr("plain")],
            "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "t"},
                               {"name": "mine", "resourceClaimName": "shared"}],
        },
        "status": {"resourceClaimStatuses": [{"name": "gpus", "resourceClaimName": "p-gpus-x"}]},
    }  # fmt: skip


def claim(*results: tuple[str, str]) -> dict[str, Any]:
    return {"status": {"allocation": {"devices": {"results": [
        {"request": r, "driver": "gpu.nvidia.com", "pool": NODE, "device": d}
        for r, d in results]}}}}  # fmt: skip


def test_claim_names_come_from_the_spec_or_the_controller_s_status():
    assert claim_names(pod()) == {"gpus": "p-gpus-x", "mine": "shared"}
    assert container_claims(pod(), "a") == [("p-gpus-x", "r0")]
    assert container_claims(pod(), "init") == [("shared", None)]
    assert container_claims(pod(), "plain") == []


def test_each_container_sees_the_uuids_of_its_own_requests_only():
    slices = node_slices(NODE, STATIC)
    claims = {"p-gpus-x": claim(("r0", "gpu-1"), ("r1", "gpu-0-mig-3g20gb-9-0"))}
    mig = nvidia.mig_uuid(NODE, 0, 0, "3g.20gb")
    gpu1 = nvidia.gpu_uuid(NODE, 1)
    a = device_env(container_claims(pod(), "a"), claims, slices)
    assert a == {"NVIDIA_VISIBLE_DEVICES": "void", "DEVCLUSTER_DRA_DEVICES": gpu1}
    b = device_env(container_claims(pod(), "b"), claims, slices)
    assert b["DEVCLUSTER_DRA_DEVICES"] == f"{gpu1},{mig}"  # a MIG device has its own UUID
    assert mig.startswith("MIG-") and gpu1.startswith("GPU-")
    assert device_env(container_claims(pod(), "plain"), claims, slices) == {}


def test_a_dynamic_mig_device_shows_its_parent_gpu_and_a_subrequest_counts_for_its_request():
    slices = node_slices(NODE, DYNAMIC)
    claims = {"p-gpus-x": claim(("r0/small", "gpu-0-mig-1g10gb-19-0"))}
    env = device_env([("p-gpus-x", "r0")], claims, slices)
    assert env["DEVCLUSTER_DRA_DEVICES"] == nvidia.gpu_uuid(NODE, 0)


def test_a_claim_that_cannot_be_prepared_keeps_the_container_waiting():
    slices = node_slices(NODE, STATIC)
    with pytest.raises(ClaimNotReady, match="'p-gpus-x' is not allocated"):
        device_env([("p-gpus-x", None)], {"p-gpus-x": {"status": {}}}, slices)
    with pytest.raises(ClaimNotReady, match="'p-gpus-x' not found"):
        device_env([("p-gpus-x", None)], {"p-gpus-x": None}, slices)
    with pytest.raises(ClaimNotReady, match="device 'gpu-7' of pool 'n1' is not published"):
        device_env([("c", None)], {"c": claim(("r", "gpu-7"))}, slices)
    unmade = pod()
    unmade["status"] = {}
    with pytest.raises(ClaimNotReady, match="'gpus': its ResourceClaim is not created yet"):
        container_claims(unmade, "a")
    with pytest.raises(KeyError, match="no container 'zz'"):
        container_claims(unmade, "zz")
