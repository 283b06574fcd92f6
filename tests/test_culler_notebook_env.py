"""What FracSpawner tells a GPU notebook (its slice, the idle policy of its pool, where the
culler listens) is exactly what the server extension reads, and nobody else can set it."""

from __future__ import annotations

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
        "FRACSPAWNER_KERNEL_GPU_HIBERNATE_SECONDS": "600",  # the default: 10 min
        "FRACSPAWNER_SERVER_GPU_IDLE_SECONDS": "7200",
        "FRACSPAWNER_SERVER_IDLE_SECONDS": "28800",
        "FRACSPAWNER_SERVER_UNATTENDED_SECONDS": "86400",
        "FRACSPAWNER_CULLER_URL": URL,
    }
    pod = podinfo.PodInfo.from_environ(env)
    assert pod.policy.kernel_gpu_idle == 600 and pod.policy.server_unattended == 86400
    assert pod.slice_json()["label"] == "1/4 H100 80GB"


def test_a_catalog_without_idle_gives_the_defaults_and_off_is_zero():
    cat = catalog()
    env = notebook_env(choose(cat, {"gpu": "1/4", "pool": "h100"}), cat)
    assert env["FRACSPAWNER_KERNEL_GPU_IDLE_SECONDS"] == "1800"
    assert env["FRACSPAWNER_SERVER_GPU_IDLE_SECONDS"] == "3600"
    assert "FRACSPAWNER_CULLER_URL" not in env  # no culler_url: report to no one
    off = catalog({"kernel_gpu_idle": "off"})
    env = notebook_env(choose(off, {"gpu": "1/4", "pool": "h100"}), off)
    assert env["FRACSPAWNER_KERNEL_GPU_IDLE_SECONDS"] == "0"
    assert podinfo.PodInfo.from_environ(env).policy.kernel_gpu_idle is None


def test_hibernation_per_pool():
    """kernel_gpu_hibernate: on by default (10 min), off or another time per pool."""
    cat = catalog({"kernel_gpu_hibernate": "off"}, {"kernel_gpu_hibernate": "5m"})
    env = notebook_env(choose(cat, {"gpu": "1/4", "pool": "h100"}), cat)
    assert env["FRACSPAWNER_KERNEL_GPU_HIBERNATE_SECONDS"] == "300"
    assert podinfo.PodInfo.from_environ(env).policy.kernel_gpu_hibernate == 300
    off = catalog(None, {"kernel_gpu_hibernate": "off"})
    env = notebook_env(choose(off, {"gpu": "1/4", "pool": "h100"}), off)
    assert env["FRACSPAWNER_KERNEL_GPU_HIBERNATE_SECONDS"] == "0"
    assert podinfo.PodInfo.from_environ(env).policy.kernel_gpu_hibernate is None


def test_a_cpu_notebook_is_told_nothing():
    cat = catalog()
    assert notebook_env(choose(cat, {"gpu": "none"}), cat, URL) == {}


def test_the_names_are_the_extensions_and_reserved():
    read = {
        podinfo.ENV_SLICE, podinfo.ENV_POOL, podinfo.ENV_POOL_DISPLAY,
        podinfo.ENV_KERNEL_GPU_IDLE, podinfo.ENV_SERVER_GPU_IDLE, podinfo.ENV_SERVER_IDLE,
        podinfo.ENV_SERVER_UNATTENDED, ENV_CULLER_URL, podinfo.ENV_KERNEL_GPU_HIBERNATE,
    }  # fmt: skip
    assert set(NOTEBOOK_ENV) == read
    assert all(is_reserved_env(name) for name in NOTEBOOK_ENV)
