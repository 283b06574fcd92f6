"""The scheduler rules capacity counting rests on: pod requests, taints, HAMi's formats and fit."""

from __future__ import annotations

import logging

import pytest

from fracspawner.backends import hami_devices as hami
from fracspawner.capacity.count import gpu_usage_by_user
from fracspawner.k8s.objects import is_ready, pod_requests, quantity, taints_tolerated

# A node as HAMi's device plugin registers it, in both formats HAMi has written. devmem is
# what NVML reports for an H100 80GB HBM3 (81559 MiB, fracspawner.model.gpumodels), not 81920.
LEGACY_REGISTER = (
    "GPU-aaaa,10,81559,100,NVIDIA-NVIDIA H100 80GB HBM3,0,true:"
    "GPU-bbbb,10,81559,100,NVIDIA-NVIDIA H100 80GB HBM3,0,true:"
)
JSON_REGISTER = (
    '[{"id":"GPU-aaaa","count":10,"devmem":81559,"devcore":100,'
    '"type":"NVIDIA-NVIDIA H100 80GB HBM3","health":true,"mode":"hami-core"},'
    '{"id":"GPU-bbbb","index":1,"count":10,"devmem":81559,"devcore":100,'
    '"type":"NVIDIA-NVIDIA H100 80GB HBM3","health":true,"mode":"hami-core"}]'
)


def test_pod_requests_sum_containers_and_take_the_largest_init_container():
    pod = {
        "spec": {
            "containers": [
                {"resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "2"}}},
                {"resources": {"requests": {"nvidia.com/gpu": "1"}, "limits": {}}},
            ],
            "initContainers": [{"resources": {"limits": {"nvidia.com/gpu": "3"}}}],
            "overhead": {"cpu": "250m"},
        }
    }
    got = pod_requests(pod)
    assert got["nvidia.com/gpu"] == 3  # max(1 + 1, 3)
    assert float(got["cpu"]) == 2.25


@pytest.mark.parametrize(
    "taint, toleration, ok",
    [
        ({"key": "gpu", "value": "h100", "effect": "NoSchedule"}, None, False),
        ({"key": "gpu", "value": "h100", "effect": "PreferNoSchedule"}, None, True),
        (
            {"key": "gpu", "value": "h100", "effect": "NoSchedule"},
            {"key": "gpu", "operator": "Equal", "value": "h100", "effect": "NoSchedule"},
            True,
        ),
        (
            {"key": "gpu", "value": "h100", "effect": "NoExecute"},
            {"key": "gpu", "value": "a100"},
            False,
        ),
        ({"key": "gpu", "effect": "NoExecute"}, {"key": "gpu", "operator": "Exists"}, True),
        ({"key": "other", "effect": "NoSchedule"}, {"operator": "Exists"}, True),
        (
            {"key": "gpu", "effect": "NoSchedule"},
            {"key": "gpu", "operator": "Exists", "effect": "NoExecute"},
            False,
        ),
    ],
)
def test_taints_need_a_matching_toleration(taint, toleration, ok):
    node = {"spec": {"taints": [taint]}}
    assert taints_tolerated(node, [toleration] if toleration else []) is ok


def test_a_node_serves_only_when_ready_and_not_cordoned():
    ready = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    assert is_ready(ready)
    assert not is_ready({**ready, "spec": {"unschedulable": True}})
    assert not is_ready({"status": {"conditions": [{"type": "Ready", "status": "False"}]}})


@pytest.mark.parametrize("text", [LEGACY_REGISTER, JSON_REGISTER])
def test_hami_registration_is_read_in_both_formats(text):
    devices = hami.parse_node_devices(text)
    assert [(d.id, d.count, d.devmem, d.devcore, d.health) for d in devices] == [
        ("GPU-aaaa", 10, 81559, 100, True),
        ("GPU-bbbb", 10, 81559, 100, True),
    ]


@pytest.mark.parametrize("text", ["", "garbage", "GPU-a,10,notanumber,100,T,0,true:", "[{}]"])
def test_unreadable_hami_registration_is_none(text):
    assert hami.parse_node_devices(text) is None


def test_hami_pod_allocation_lists_every_device_of_every_container():
    text = "GPU-aaaa,NVIDIA,20480,25:;GPU-bbbb,NVIDIA,10240,0:GPU-cccc[1-0],NVIDIA,9856,14:;"
    assert hami.parse_pod_devices(text) == [
        ("GPU-aaaa", 20480, 25),
        ("GPU-bbbb", 10240, 0),
        ("GPU-cccc", 9856, 14),
    ]


def _device(count=10, devmem=81559, devcore=100, health=True, type_="NVIDIA-H100"):
    return hami.HamiDevice("GPU-x", count, devmem, devcore, type_, health)


@pytest.mark.parametrize(
    "limits, use, fits",
    [
        # a nominal 20 GiB + 25% cores: the 81559 MiB an H100 registers hold only three
        ({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 20480, "nvidia.com/gpucores": 25}, {}, 3),
        # a quarter as 25% of the registered memory: four (what fracspawner now asks)
        (
            {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 25, "nvidia.com/gpucores": 25},
            {},
            4,
        ),
        ({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 12}, {}, 8),
        # a pod already holds 40 GiB and 50 cores: one more nominal 20 GiB
        (
            {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 20480, "nvidia.com/gpucores": 25},
            {"used": 1, "usedmem": 40960, "usedcores": 50},
            1,
        ),
        # memory only, no cores: bounded by memory and the 10 task slots
        ({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4096}, {}, 10),
        ({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4096}, {"used": 9, "usedmem": 9 * 4096}, 1),
        # the whole device (no memory given => 100 %, exclusive cores) only when untouched
        ({"nvidia.com/gpu": 1}, {}, 1),
        ({"nvidia.com/gpu": 1}, {"used": 1, "usedmem": 1024}, 0),
        # percentage of memory
        ({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 50}, {}, 2),
        # a zero-core task does not go onto a device whose cores are all taken
        ({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1024}, {"used": 1, "usedcores": 100}, 0),
    ],
)
def test_hami_device_fit(limits, use, fits):
    req = hami.request_from_resources(limits)
    assert hami.device_fits(_device(), hami.DeviceUse(**use), req) == fits


def test_hami_skips_unhealthy_and_excluded_gpu_types():
    req = hami.request_from_resources(
        {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1024}, {"nvidia.com/use-gputype": "A100"}
    )
    assert hami.device_fits(_device(type_="NVIDIA-H100"), hami.DeviceUse(), req) == 0
    assert hami.device_fits(_device(type_="NVIDIA-A100-SXM4"), hami.DeviceUse(), req) == 10
    plain = hami.request_from_resources({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1024})
    assert hami.device_fits(_device(health=False), hami.DeviceUse(), plain) == 0


@pytest.mark.parametrize(
    "per_device, nums, pods",
    [([4, 4], 1, 8), ([4, 4], 2, 4), ([4, 0], 2, 0), ([3, 1, 1], 2, 2), ([5, 5, 5], 3, 5)],
)
def test_multi_device_tasks_need_distinct_devices(per_device, nums, pods):
    assert hami.tasks_on_node(per_device, nums) == pods


def _pod(user, eq, phase="Running"):
    annotations = {"hub.jupyter.org/username": user}
    if eq is not None:
        annotations["fracspawner.io/gpu-equivalent"] = eq
    return {
        "metadata": {"name": f"jupyter-{user}", "annotations": annotations},
        "status": {"phase": phase},
    }


def test_gpu_usage_by_user_sums_active_pods_and_ignores_malformed(caplog):
    pods = [
        _pod("alice@example.org", "0.25"),
        _pod("alice@example.org", "0.5"),
        _pod("alice@example.org", "1", phase="Succeeded"),
        _pod("bob", "lots"),
        _pod("carol", None),
    ]
    with caplog.at_level(logging.WARNING):
        usage = gpu_usage_by_user(pods)
    assert usage == {"alice@example.org": 0.75, "bob": 0.0}
    assert "malformed" in caplog.text and "lots" in caplog.text


@pytest.mark.parametrize(
    "text, value",
    [("4", 4), ("500m", 0.5), ("10Gi", 10 * 1024**3), ("1e3", 1000), ("2k", 2000), (".5", 0.5)],
)
def test_quantities_parse_like_the_api_server(text, value):
    assert float(quantity(text)) == value


@pytest.mark.parametrize("text", ["", "x", "1.2.3", "5 Gi", True])
def test_malformed_quantities_are_none(text):
    assert quantity(text) is None


def test_quantities_parse_with_the_clients_code_without_importing_the_client():
    """kubernetes' own parse_quantity, loaded from its file: the package's __init__ (the whole
    generated client, ~3 s) is never run by a process that only parses quantities."""
    import subprocess
    import sys

    code = (
        "import sys; from fracspawner.k8s.objects import quantity; "
        "print(quantity('500m'), quantity('10Gi'), quantity('1e3'), quantity('5 Gi')); "
        "print('kubernetes' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["0.500 10737418240 1E+3 None", "False"]
    from kubernetes.utils.quantity import parse_quantity as clients

    from fracspawner.k8s.objects import parse_quantity

    for value in ("4", "500m", "10Gi", "1e3", "1.5Ki", "100M", 3, 2.5):
        assert parse_quantity()(value) == clients(value)
