"""What FracSpawner tells a GPU notebook (its slice, the idle policy of its pool, where the
culler listens) is exactly what the server extension reads, and nobody else can set it."""

from __future__ import annotations

from datetime import datetime, timezone

import yaml

from fracspawner.backends import is_reserved_env, load_catalog
from fracspawner.choice.notebook_env import NOTEBOOK_ENV, notebook_env
from fracspawner.choice.options import resolve_choice
from fracspawner.model.catalog import AccessRule
from fracspawner.serverext import podinfo
from fracspawner.serverext.reporter import ENV_CULLER_URL
from tests.conftest import DEMO_CATALOG

URL = "http://hub:10101/services/fracspawner-culler/"


def catalog(idle=None, pool_idle=None):
    data = yaml.safe_load(DEMO_CATALOG.read_text())
    data.pop("idle")
    if idle is not None:
        data["idle"] = idle
    if pool_idle is not None:
        data["pools"]["h100"]["idle"] = pool_idle
    return load_catalog(data)


def choose(cat, options):
    return resolve_choice(cat, options, rule=AccessRule())


def test_a_gpu_notebook_is_told_its_pools_policy_as_the_extension_reads_it():
    cat = catalog({"server_gpu_idle": "2h"}, {"kernel_gpu_idle": "10m"})
    env = notebook_env(choose(cat, {"gpu": "1/4", "pool": "h100"}), cat, URL)
    assert env == {
        "FRACSPAWNER_GPU_SLICE": "1/4",
        "FRACSPAWNER_GPU_POOL": "h100",
        "FRACSPAWNER_GPU_POOL_DISPLAY": "H100 80GB",
        "FRACSPAWNER_KERNEL_GPU_IDLE_SECONDS": "600",
        # HAMi reserves the slice: hibernation frees nothing usable, off by default
        "FRACSPAWNER_KERNEL_GPU_HIBERNATE_SECONDS": "0",
        "FRACSPAWNER_SERVER_GPU_IDLE_SECONDS": "7200",
        "FRACSPAWNER_SERVER_IDLE_SECONDS": "28800",
        "FRACSPAWNER_SERVER_UNATTENDED_SECONDS": "86400",
        "FRACSPAWNER_MAX_AGE_SECONDS": "0",  # off unless the catalog sets it
        "FRACSPAWNER_CULLER_URL": URL,
    }
    pod = podinfo.PodInfo.from_environ(env)
    assert pod.policy.kernel_gpu_idle == 600 and pod.policy.server_unattended == 86400
    assert pod.slice_json()["label"] == "1/4 H100 80GB"


def test_a_catalog_without_idle_gives_the_defaults_and_off_is_zero():
    cat = catalog()
    env = notebook_env(choose(cat, {"gpu": "1/4", "pool": "h100"}), cat)
    # HAMi reserves the slice: a kernel shut down frees nothing usable, off by default
    # (per backend: test_kernel_idle_defaults.py)
    assert env["FRACSPAWNER_KERNEL_GPU_IDLE_SECONDS"] == "0"
    assert env["FRACSPAWNER_SERVER_GPU_IDLE_SECONDS"] == "3600"
    assert "FRACSPAWNER_CULLER_URL" not in env  # no culler_url: report to no one
    env = notebook_env(choose(cat, {"gpu": "1/4", "pool": "t4"}), cat)
    assert env["FRACSPAWNER_KERNEL_GPU_IDLE_SECONDS"] == "1800"  # time-sliced: 30 min
    off = catalog({"kernel_gpu_idle": "off"})
    env = notebook_env(choose(off, {"gpu": "1/4", "pool": "t4"}), off)
    assert env["FRACSPAWNER_KERNEL_GPU_IDLE_SECONDS"] == "0"
    assert podinfo.PodInfo.from_environ(env).policy.kernel_gpu_idle is None


def test_hibernation_per_pool():
    """kernel_gpu_hibernate: per backend by default (test_hibernation_defaults.py), off or
    another time per pool."""
    cat = catalog({"kernel_gpu_hibernate": "off"}, {"kernel_gpu_hibernate": "5m"})
    env = notebook_env(choose(cat, {"gpu": "1/4", "pool": "h100"}), cat)
    assert env["FRACSPAWNER_KERNEL_GPU_HIBERNATE_SECONDS"] == "300"
    assert podinfo.PodInfo.from_environ(env).policy.kernel_gpu_hibernate == 300
    off = catalog(None, {"kernel_gpu_hibernate": "off"})
    env = notebook_env(choose(off, {"gpu": "1/4", "pool": "h100"}), off)
    assert env["FRACSPAWNER_KERNEL_GPU_HIBERNATE_SECONDS"] == "0"
    assert podinfo.PodInfo.from_environ(env).policy.kernel_gpu_hibernate is None


def test_a_gpu_notebook_is_told_max_age_and_when_the_hub_started_it():
    """The culler stops a server max_age after the hub started it (decide.py server_deadlines):
    the extension is told both, so the meter warns before that stop too."""
    cat = catalog({"max_age": "12h"})
    started = datetime(2027, 1, 15, 9, 30, 0, 250000)  # orm_spawner.started: naive UTC
    env = notebook_env(choose(cat, {"gpu": "1/4", "pool": "h100"}), cat, URL, started)
    assert env["FRACSPAWNER_MAX_AGE_SECONDS"] == "43200"
    assert env["FRACSPAWNER_SERVER_STARTED"] == "2027-01-15T09:30:00.250000Z"  # as the hub's API
    pod = podinfo.PodInfo.from_environ(env)
    assert pod.policy.max_age == 43200
    assert pod.started == started.replace(tzinfo=timezone.utc)
    # not told (a Kubeflow notebook) or nonsense: no start time, so no max_age warning
    assert "FRACSPAWNER_SERVER_STARTED" not in notebook_env(choose(cat, {"gpu": "1/4"}), cat)
    assert podinfo.PodInfo.from_environ({"FRACSPAWNER_SERVER_STARTED": "noon"}).started is None


def test_a_cpu_notebook_is_told_nothing():
    cat = catalog()
    assert notebook_env(choose(cat, {"gpu": "none"}), cat, URL) == {}


def test_the_names_are_the_extensions_and_reserved():
    read = {
        podinfo.ENV_SLICE, podinfo.ENV_POOL, podinfo.ENV_POOL_DISPLAY,
        podinfo.ENV_KERNEL_GPU_IDLE, podinfo.ENV_SERVER_GPU_IDLE, podinfo.ENV_SERVER_IDLE,
        podinfo.ENV_SERVER_UNATTENDED, ENV_CULLER_URL, podinfo.ENV_KERNEL_GPU_HIBERNATE,
        podinfo.ENV_MAX_AGE, podinfo.ENV_SERVER_STARTED,
    }  # fmt: skip
    assert set(NOTEBOOK_ENV) == read
    assert all(is_reserved_env(name) for name in NOTEBOOK_ENV)
