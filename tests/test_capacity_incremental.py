"""Incremental capacity: counts kept event by event equal a full recount, and an event costs
only the node it touched.

`LiveCapacity` is what the watches feed, one event at a time; `compute_capacity` counts the
same nodes and pods from scratch. After any sequence of node and pod events (nodes added,
relabelled, tainted, cordoned, deleted, HAMi devices re-registered; pods bound, booked,
finished, moved, deleted) the two agree, offer by offer, and so do the per-user quotas.
"""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fracspawner.backends import load_catalog
from fracspawner.capacity import LiveCapacity, compute_capacity, gpu_usage_by_user

CATALOG = {
    "pools": {
        "mig": {
            "gpu": "A100-80GB",
            "backend": "mig-mixed",
            "node_selector": {"pool": "mig"},
            "offers": ["mig-1g.10gb", "mig-3g.40gb"],
        },
        "t4": {
            "gpu": "T4",
            "backend": "timeslicing",
            "replicas": 4,
            "node_selector": {"pool": "t4"},
            "offers": ["1/4"],
        },
        "hami": {
            "gpu": "H100-80GB",
            "backend": "hami",
            "node_selector": {"pool": "hami"},
            "offers": ["1/4", "1/2", "10GiB", "1"],
        },
        "runai": {
            "gpu": "A100-80GB",
            "backend": "runai",
            "node_selector": {"pool": "runai"},
            "offers": ["1/4", "1/2", "20GiB", "1"],
        },
        "clearml": {
            "gpu": "A100-80GB",
            "backend": "clearml-injector",
            "node_selector": {"pool": "clearml"},
            "offers": ["1/8", "1/2"],
        },
        "volcano": {
            "gpu": "A100-80GB",
            "backend": "volcano",
            "node_selector": {"pool": "volcano"},
            "offers": ["1/4", "10GiB"],
        },
        "whole": {
            "gpu": "A100-80GB",
            "backend": "whole",
            "node_selector": {"pool": "whole"},
            # a pool that only lands on tainted nodes it tolerates
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml"}],
            "offers": ["1", "2"],
        },
    },
    "images": {"base": {"image": "quay.io/jupyter/base-notebook:latest", "default": True}},
}
POOLS = sorted(CATALOG["pools"])
NODE_NAMES = [f"node-{i}" for i in range(3)]
POD_NAMES = [f"pod-{i}" for i in range(6)]
#: what a node of each pool publishes and what its pods ask (so most states count something)
NODE_RESOURCES = {
    "mig": ["nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb"],
    "t4": ["nvidia.com/gpu"],
    "hami": ["nvidia.com/gpu", "nvidia.com/gpumem"],
    "runai": ["nvidia.com/gpu"],
    "clearml": ["nvidia.com/gpu"],
    "volcano": ["volcano.sh/vgpu-number"],
    "whole": ["nvidia.com/gpu"],
}
POD_LIMITS = [
    {},
    {"nvidia.com/gpu": "1"},
    {"nvidia.com/gpu": "2"},
    {"nvidia.com/mig-1g.10gb": "1"},
    {"nvidia.com/mig-3g.40gb": "1"},
    {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20480", "nvidia.com/gpucores": "25"},
    {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"},
    {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory-percentage": "25"},
    {"volcano.sh/vgpu-number": "2", "volcano.sh/vgpu-memory": "10240"},
]


#: hypothesis draws the first of a list more often than the rest: put the common case first
OFTEN = st.sampled_from([True, True, True, True, False])
RARELY = st.sampled_from([False, False, False, False, False, True])


def _register(devices: int, count: int, devmem: int) -> str:
    return (
        "["
        + ",".join(
            f'{{"id":"GPU-{i}","index":{i},"count":{count},"devmem":{devmem},"devcore":100,'
            f'"type":"NVIDIA-H100","health":true}}'
            for i in range(devices)
        )
        + "]"
    )


@pytest.fixture(scope="module")
def catalog():
    return load_catalog(CATALOG)


# ----------------------------------------------------------------------------- events
@st.composite
def node_events(draw):
    name = draw(st.sampled_from(NODE_NAMES))
    if draw(st.sampled_from([False] * 5 + [True])):
        return ("delete-node", name)
    pool = draw(st.sampled_from(POOLS))  # a node is relabelled by putting another pool
    labels = {"pool": pool}
    if draw(OFTEN):
        labels["nvidia.com/gpu.count"] = draw(st.sampled_from(["2", "4", "1", "0"]))
    if draw(OFTEN):
        labels["nvidia.com/gpu.replicas"] = str(draw(st.sampled_from([4, 4, 8])))
    published = NODE_RESOURCES[pool] + draw(
        st.lists(
            st.sampled_from(sorted({r for rs in NODE_RESOURCES.values() for r in rs})), max_size=1
        )
    )
    allocatable = {
        r: draw(st.sampled_from(["0", "2", "4", "8", "16", "40", "81920", "bad"]))
        for r in published
        if draw(OFTEN)
    }
    annotations = {}
    register = draw(
        st.sampled_from(
            [None, "junk", _register(2, 10, 81920), _register(1, 4, 40960), _register(3, 10, 8)]
        )
    )
    if register is not None:  # HAMi (re-)registration, changed devices or none
        annotations["hami.io/node-nvidia-register"] = register
    taint = draw(
        st.sampled_from(
            [
                None,
                {"key": "dedicated", "value": "ml", "effect": "NoSchedule"},
                {"key": "other", "value": "x", "effect": "NoExecute"},
                {"key": "soft", "effect": "PreferNoSchedule"},
            ]
        )
    )
    node = {
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {
            "taints": [taint] if taint else [],
            "unschedulable": draw(RARELY),
        },
        "status": {
            "allocatable": {"cpu": "64", **allocatable},
            "conditions": [{"type": "Ready", "status": "False" if draw(RARELY) else "True"}],
        },
    }
    return ("put-node", node)


@st.composite
def pod_events(draw):
    name = draw(st.sampled_from(POD_NAMES))
    what = draw(st.sampled_from(["put", "put", "put", "move", "move", "delete", "status"]))
    if what == "delete":
        return ("delete-pod", f"jhub/{name}")
    if what == "status":
        return ("status-only", f"jhub/{name}", draw(st.integers(0, 1000)))
    if what == "move":  # the same pod now on another node (recreated, or bound after booking)
        return ("move", f"jhub/{name}", draw(st.sampled_from(NODE_NAMES)))
    limits = dict(draw(st.sampled_from(POD_LIMITS)))
    labels = draw(
        st.sampled_from(
            [
                {},
                {"runai-gpu-group": "g1"},
                {"runai-gpu-group": "g2"},
                {"clearml-injector/fraction": draw(st.sampled_from(["0.125", "0.500", "x"]))},
                {"fracspawner.io/pool": "hami", "unrelated": "y"},
            ]
        )
    )
    annotations = {}
    if draw(st.booleans()):
        annotations["gpu-fraction"] = draw(st.sampled_from(["0.25", "0.5", "bad"]))
    elif draw(st.booleans()):
        annotations["gpu-memory"] = draw(st.sampled_from(["20480", "40960"]))
    allocation = draw(
        st.sampled_from([None, None, "GPU-0,NVIDIA,20480,25:", "GPU-1,NVIDIA,40960,50:;", "junk"])
    )
    if allocation:
        annotations["hami.io/vgpu-devices-allocated"] = allocation
    if draw(st.booleans()):
        annotations["hub.jupyter.org/username"] = draw(st.sampled_from(["ann", "bob", "cy"]))
        annotations["fracspawner.io/gpu-equivalent"] = draw(
            st.sampled_from(["0.25", "0.5", "0.142857", "1", "junk", "-1"])
        )
    bound = draw(st.sampled_from([None, *NODE_NAMES, *NODE_NAMES, "node-nowhere"]))
    if bound is None and draw(st.booleans()):  # booked by HAMi's scheduler, not bound yet
        annotations["hami.io/vgpu-node"] = draw(st.sampled_from(NODE_NAMES))
    pod = {
        "metadata": {
            "name": name,
            "namespace": "jhub",
            "uid": f"uid-{name}-{draw(st.integers(0, 1))}",
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {
            "nodeName": bound,
            "containers": [{"name": "c", "resources": {"limits": limits}}],
        },
        "status": {"phase": draw(st.sampled_from(["Running", "Pending", "Running", "Failed"]))},
    }
    return ("put-pod", pod)


events = st.lists(
    st.one_of(node_events(), pod_events(), pod_events(), st.just(("read",))),
    min_size=10,
    max_size=80,
)


def _counts(capacity):
    return {
        pool: {spec: (c.free, c.total, c.note) for spec, c in offers.items()}
        for pool, offers in capacity.pools.items()
    }


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(sequence=events)
def test_incremental_counts_equal_a_full_recount(catalog, sequence):
    live = LiveCapacity(catalog)
    nodes: dict[str, dict] = {}
    pods: dict[str, dict] = {}
    for event in sequence:
        kind = event[0]
        if kind == "put-node":
            nodes[event[1]["metadata"]["name"]] = event[1]
            live.put_node(copy.deepcopy(event[1]))
        elif kind == "delete-node":
            nodes.pop(event[1], None)
            live.drop_node(event[1])
        elif kind == "put-pod":
            pods[f"jhub/{event[1]['metadata']['name']}"] = event[1]
            live.put_pod(copy.deepcopy(event[1]))
        elif kind == "delete-pod":
            pods.pop(event[1], None)
            live.drop_pod(event[1])
        elif kind == "move" and event[1] in pods:
            pod = pods[event[1]] = copy.deepcopy(pods[event[1]])
            pod["spec"]["nodeName"] = event[2]
            live.put_pod(copy.deepcopy(pod))
        elif kind == "status-only" and event[1] in pods:
            # what kubelets send all day: conditions and container statuses, nothing counted
            pod = copy.deepcopy(pods[event[1]])
            pod["status"]["conditions"] = [{"type": "Ready", "status": str(event[2] % 2 == 0)}]
            pod["status"]["containerStatuses"] = [{"name": "c", "restartCount": event[2]}]
            before = live.changes
            live.put_pod(pod)
            assert live.changes == before, "a status-only update must change nothing"
        else:  # a read in the middle: what was recounted so far must stay right
            assert _counts(live.snapshot()) == _counts(
                compute_capacity(catalog, nodes.values(), pods.values())
            )
    full = compute_capacity(catalog, nodes.values(), pods.values())
    snapshot = live.snapshot()
    assert _counts(snapshot) == _counts(full)
    assert snapshot.nodes_seen == full.nodes_seen == len(nodes)
    expected = gpu_usage_by_user(pods.values())
    usage = live.usage_by_user()
    assert set(usage) == set(expected)
    for user, value in expected.items():
        assert usage[user] == pytest.approx(value)
        assert live.usage_of(user) == pytest.approx(value)


# ----------------------------------------------------------------------------- cost of an event
def _large(catalog, nodes: int = 60, pods_per_node: int = 20):
    live = LiveCapacity(catalog)
    node_list = [
        {
            "metadata": {
                "name": f"n{i}",
                "labels": {"pool": "t4", "nvidia.com/gpu.replicas": "4"},
            },
            "status": {
                "allocatable": {"nvidia.com/gpu": "32"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
        for i in range(nodes)
    ]
    pod_list = [
        {
            "metadata": {"name": f"p{i}-{j}", "namespace": "jhub", "uid": f"u{i}-{j}"},
            "spec": {
                "nodeName": f"n{i}",
                "containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}],
            },
            "status": {"phase": "Running"},
        }
        for i in range(nodes)
        for j in range(pods_per_node)
    ]
    live.replace_nodes(node_list)
    live.replace_pods(pod_list)
    return live, pod_list


def test_a_read_after_one_event_recounts_only_the_node_it_touched(catalog):
    live, pods = _large(catalog)
    assert live.snapshot().get("t4", "1/4").free == 60 * (32 - 20)
    before = live.recounted

    gone = pods[5]  # a pod on node n0 goes: one slot frees there
    live.drop_pod("jhub/" + gone["metadata"]["name"])
    assert live.snapshot().get("t4", "1/4").free == 60 * 12 + 1
    assert live.recounted - before == 1

    # a read with nothing new recounts nothing; status-only updates cost nothing either
    live.snapshot()
    busy = copy.deepcopy(pods[30])
    busy["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    live.put_pod(busy)
    live.snapshot()
    assert live.recounted - before == 1


def test_pods_holding_nothing_countable_are_not_kept(catalog):
    """The watch keeps records of GPU pods only: a CPU pod, or a finished one, is dropped."""
    live, _ = _large(catalog, nodes=2, pods_per_node=3)
    cpu = {
        "metadata": {
            "name": "cpu",
            "namespace": "jhub",
            "annotations": {"hub.jupyter.org/username": "ann", "other": "x"},
        },
        "spec": {"nodeName": "n0", "containers": [{"resources": {"limits": {"cpu": "2"}}}]},
        "status": {"phase": "Running"},
    }
    live.put_pod(cpu)
    assert live.pod("jhub/cpu") is None
    assert len(live.index.pods) == 6
    record = live.pod("jhub/p0-0")
    assert record.node == "n0" and dict(record.requests) == {"nvidia.com/gpu": 1}
    done = {**cpu, "metadata": {"name": "p0-0", "namespace": "jhub"}, "status": {"phase": "Failed"}}
    live.put_pod(done)
    assert live.pod("jhub/p0-0") is None
    assert live.snapshot().get("t4", "1/4").free == 2 * (32 - 3) + 1
