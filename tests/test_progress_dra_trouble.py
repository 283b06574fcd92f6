"""A DRA pool's claim that kube-scheduler cannot allocate for a reason other than a taken
device is not a wait for a free one. The messages are kube-scheduler v1.36.3's DRA plugin's
(pkg/scheduler/framework/plugins/dynamicresources/dynamicresources.go), as its FitError puts
them into FailedScheduling and the PodScheduled condition (pkg/scheduler/framework/types.go
`FitError.Error`: "0/N nodes are available: <PreFilter message>." or "<n> <Filter reason>, ...",
then the PostFilter plugins' words: the DRA plugin's "still not schedulable", preemption's)."""

from __future__ import annotations

import pytest

from fracspawner.hub.progress import scheduling_trouble

POST = (
    " still not schedulable, preemption: 0/6 nodes are available: 6 Preemption is not helpful "
    "for scheduling."
)
#: Filter: no device of the node fits the claim now (capacity): the plain wait
NO_FREE_DEVICE = (
    "0/6 nodes are available: 1 cannot allocate all claims, 5 node(s) didn't match Pod's node "
    "affinity/selector." + POST
)
#: Filter: the claim is allocated on another node
ELSEWHERE = "0/2 nodes are available: 2 resourceclaim not available on the node." + POST
#: PreFilter: the claim is reserved by other pods
IN_USE = "0/2 nodes are available: resourceclaim in use." + POST
ALLOCATING = (
    "0/2 nodes are available: resource claim jhub/jupyter-ann-gpu-x7k2p is in the process of "
    "being allocated." + POST
)
#: PreFilter (validateDeviceClass): the claim names a DeviceClass the cluster does not have
NO_CLASS = (
    "0/6 nodes are available: request gpu: device class gpu.nvidia.com does not exist." + POST
)
#: PreFilter: firstAvailable without the DRAPrioritizedList feature
NO_SUBREQUESTS = (
    "0/6 nodes are available: resource claim jhub/jupyter-ann-gpu-x7k2p, request gpu: has "
    "subrequests, but the DRAPrioritizedList feature is disabled." + POST
)
UNKNOWN_REQUEST = (
    "0/6 nodes are available: resource claim jhub/jupyter-ann-gpu-x7k2p, request gpu: unknown "
    "request type." + POST
)
#: Filter (structured allocator, ErrFailedAllocationOnNode): the driver's slices are invalid
INVALID_POOLS = (
    "0/6 nodes are available: 1 invalid resource pools were encountered, 5 node(s) didn't match "
    "Pod's node affinity/selector." + POST
)


@pytest.mark.parametrize("message", [NO_FREE_DEVICE, ELSEWHERE, IN_USE, ALLOCATING])
def test_a_claim_that_waits_for_a_device_is_a_gpu_wait(message):
    assert scheduling_trouble(message) is None


def test_a_device_class_that_does_not_exist_is_no_wait():
    """Before: "Waiting for a free 1 GPU on H100 80GB (DRA): ...; it starts by itself as soon
    as one frees" for as long as queue_timeout."""
    assert scheduling_trouble(NO_CLASS) == (
        "Your server's GPU cannot be allocated: it asks for the device class gpu.nvidia.com, "
        "which this cluster does not have (its DRA driver is not installed, or the pool names "
        "another class). This does not change by itself: tell an administrator."
    )


@pytest.mark.parametrize("message", [NO_SUBREQUESTS, UNKNOWN_REQUEST])
def test_a_request_the_scheduler_cannot_read_is_no_wait(message):
    assert scheduling_trouble(message) == (
        "Your server's GPU cannot be allocated: the cluster's scheduler cannot handle its "
        "request (its Kubernetes version or feature gates do not match the pool's settings). "
        "This does not change by itself: tell an administrator."
    )


def test_invalid_driver_slices_are_no_wait():
    assert scheduling_trouble(INVALID_POOLS) == (
        "Your server's GPU cannot be allocated: the DRA driver of the pool's nodes publishes "
        "its devices in a form the scheduler refuses (invalid resource pools). This does not "
        "change by itself: tell an administrator."
    )
    # one node whose device may free: still a wait
    mixed = "0/2 nodes are available: 1 cannot allocate all claims, 1 invalid resource pools "
    assert scheduling_trouble(mixed + "were encountered." + POST) is None
