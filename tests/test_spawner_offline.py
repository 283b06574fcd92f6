"""FracSpawner's own code path without a cluster: `fracspawner plan`, the clean baseline,
reserved env, kubespawner profile_list interplay, the rendered form."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from fracspawner.backends import load_catalog
from fracspawner.cli.plan import build_manifest
from tests.conftest import DEMO_CATALOG, REPO

K8S_VERSION = "1.33.0"
EXAMPLES = sorted((REPO / "examples" / "catalogs").glob("*.yaml"))


def every_offer():
    for path in EXAMPLES:
        catalog = load_catalog(path)
        for pool in catalog.pools.values():
            for offer in pool.offers:
                yield pytest.param(
                    path, pool.name, str(offer), id=f"{path.stem}-{pool.name}-{offer}"
                )


def gpu_limits(manifest: dict) -> dict:
    limits = manifest["spec"]["containers"][0]["resources"].get("limits") or {}
    return {k: v for k, v in limits.items() if k not in ("cpu", "memory")}


@pytest.mark.parametrize(("path", "pool", "offer"), list(every_offer()))
async def test_spawner_pod_for_every_example_offer_is_a_valid_pod(path, pool, offer):
    manifest = await build_manifest(str(path), {"gpu": offer, "pool": pool}, admin=True)
    kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
    meta = manifest["metadata"]
    assert meta["labels"]["fracspawner.io/pool"] == pool
    assert float(meta["annotations"]["fracspawner.io/gpu-equivalent"]) > 0
    env = {e["name"]: e.get("value") for e in manifest["spec"]["containers"][0]["env"]}
    assert int(env["FRACSPAWNER_GPU_MEMORY_MIB"]) == int(
        meta["annotations"]["fracspawner.io/gpu-memory-mib"]
    )
    # a GPU reaches the pod through a resource limit, a scheduler-read annotation/label, or
    # a DRA claim the GPU container uses (named in the pod's spec.resourceClaims)
    marks = {**meta["annotations"], **meta["labels"]}
    claims = (manifest["spec"]["containers"][0].get("resources") or {}).get("claims")
    assert (
        gpu_limits(manifest)
        or {"gpu-fraction", "gpu-memory"} & set(marks)
        or any(k.startswith("clearml-injector/") for k in marks)
        or (claims and manifest["spec"]["resourceClaims"])
    )


def _spawner(config: dict):
    """A FracSpawner as JupyterHub keeps one per server: the same object across spawns."""
    from traitlets.config import Config

    from fracspawner.cli.plan import _PLACEHOLDER_KUBECONFIG, _Hub, _User, use_kubeconfig
    from fracspawner.hub.spawner import FracSpawner

    cfg = Config(config)
    cfg.FracSpawner.catalog_file = str(DEMO_CATALOG)
    cfg.FracSpawner.live_capacity = False
    kubeconfig = Path(__file__).parent / ".placeholder-kubeconfig"
    kubeconfig.write_text(_PLACEHOLDER_KUBECONFIG)
    try:
        with use_kubeconfig(kubeconfig):
            return FracSpawner(
                _mock=True, config=cfg, user=_User("lee", ["ml-research"], False), hub=_Hub()
            )
    finally:
        kubeconfig.unlink()


PROFILES = [
    {
        "display_name": "Small",
        "slug": "small",
        "default": True,
        "kubespawner_override": {"cpu_limit": 1},
    },
    {
        "display_name": "GPU box (legacy profile)",
        "slug": "gpu-box",
        "kubespawner_override": {
            "extra_resource_limits": {"nvidia.com/gpu": "1"},
            "node_selector": {"legacy-gpu": "yes"},
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            ],
            "environment": {"CUDA_DISABLE_CONTROL": "true"},
        },
    },
]


async def test_gpu_spawn_then_failed_then_cpu_spawn_leaves_no_gpu_behind():
    """kubespawner#546 on one spawner object: GPU profile + MIG slice, a refused spawn, CPU.
    Each spawn as JupyterHub runs it: options set, clear_state(), then start's
    load_user_options; a refused spawn is stopped (clear_state again)."""
    from tornado.web import HTTPError

    spawner = _spawner({"KubeSpawner": {"profile_list": PROFILES, "node_selector": {"zone": "a"}}})
    spawner.user_options = {"profile": "gpu-box", "gpu": "mig-1g.10gb", "pool": "a100-mig"}
    spawner.clear_state()
    await spawner.load_user_options()
    pod = await spawner.get_pod_manifest()
    assert pod.spec.containers[0].resources.limits["nvidia.com/mig-1g.10gb"] == "1"
    assert pod.spec.node_selector["legacy-gpu"] == "yes"
    # the profile's bypass env never reaches the pod, not even from admin config
    assert "CUDA_DISABLE_CONTROL" not in {e.name for e in pod.spec.containers[0].env}

    spawner.clear_state()  # the server stopped
    spawner.user_options = {"profile": "gpu-box", "gpu": "mig-7g.80gb", "pool": "a100-mig"}
    spawner.clear_state()
    with pytest.raises(HTTPError) as info:
        await spawner.load_user_options()
    assert info.value.status_code == 400
    spawner.clear_state()  # JupyterHub stops a spawn that failed

    spawner.user_options = {"gpu": "none"}
    spawner.clear_state()
    await spawner.load_user_options()
    pod = await spawner.get_pod_manifest()
    limits = pod.spec.containers[0].resources.limits or {}
    assert not [k for k in limits if "nvidia" in k]
    assert pod.spec.node_selector == {"zone": "a"}
    assert not pod.spec.tolerations or not [t for t in pod.spec.tolerations if "nvidia" in t.key]
    assert not [k for k in pod.metadata.labels if k.startswith("fracspawner.io/")]
    assert not [k for k in pod.metadata.annotations if k.startswith("fracspawner.io/")]
    assert pod.spec.containers[0].image == "quay.io/jupyter/pytorch-notebook:cuda12-latest"


async def test_reserved_env_is_dropped_from_config_and_the_backend_wins():
    spawner = _spawner(
        {
            "KubeSpawner": {
                "environment": {
                    "CUDA_DISABLE_CONTROL": "true",
                    "CUDA_DEVICE_MEMORY_LIMIT_0": "80g",
                    "LD_PRELOAD": "/x.so",
                    "MY_SETTING": "kept",
                },
                "extra_container_config": {"env": [{"name": "CUDA_DISABLE_CONTROL", "value": "1"}]},
            }
        }
    )
    spawner.user_options = {"gpu": "1/4", "pool": "h100"}
    await spawner.load_user_options()
    pod = await spawner.get_pod_manifest()
    env = {e.name: e.value for e in pod.spec.containers[0].env}
    assert env["MY_SETTING"] == "kept"
    assert not {"CUDA_DISABLE_CONTROL", "CUDA_DEVICE_MEMORY_LIMIT_0", "LD_PRELOAD"} & set(env)
    assert env["FRACSPAWNER_GPU_MEMORY_MIB"] == "20389"  # 25% of the 81559 MiB NVML reports


async def test_profile_list_without_gpu_keys_still_validates_profile():
    from tornado.web import HTTPError

    spawner = _spawner({"KubeSpawner": {"profile_list": PROFILES}})
    spawner.user_options = {"profile": "no-such-profile", "gpu": "none"}
    with pytest.raises(HTTPError) as info:
        await spawner.load_user_options()
    assert info.value.status_code == 400 and "no-such-profile" in info.value.log_message


IMAGE_OPTION_PROFILE = {
    "display_name": "Data science",
    "slug": "datasci",
    "profile_options": {
        "image": {
            "display_name": "Image",
            "choices": {
                "minimal": {
                    "display_name": "Minimal",
                    "default": True,
                    "kubespawner_override": {"image": "quay.io/jupyter/minimal-notebook:2025"},
                },
                "r": {
                    "display_name": "R",
                    "kubespawner_override": {"image": "quay.io/jupyter/r-notebook:2025"},
                },
            },
        }
    },
}


async def test_a_profile_option_named_image_picks_the_image_when_the_catalog_offers_none():
    """z2jh's documented profile_list shape (an option called `image`) keeps working where the
    catalog has no images: the key is the profile's, the GPU slice comes on top."""
    catalog = yaml.safe_load(DEMO_CATALOG.read_text())
    del catalog["images"]
    spawner = _spawner(
        {
            "KubeSpawner": {"profile_list": [IMAGE_OPTION_PROFILE]},
            "FracSpawner": {"catalog": catalog},
        }
    )
    form = await spawner._render_options_form_async(spawner)
    assert "profile-option-datasci--image" in form and 'name="image"' not in form
    options = spawner.options_from_form(
        {"profile": ["datasci"], "profile-option-datasci--image": ["r"], "gpu": ["1/4"]}
    )
    assert options == {"profile": "datasci", "image": "r", "gpu": "1/4"}
    spawner.user_options = {**options, "pool": "h100"}
    spawner.clear_state()
    await spawner.load_user_options()
    pod = await spawner.get_pod_manifest()
    assert pod.spec.containers[0].image == "quay.io/jupyter/r-notebook:2025"
    assert pod.metadata.labels["fracspawner.io/pool"] == "h100"


async def test_a_profile_option_named_like_fracspawners_keys_is_a_clear_config_error():
    """With catalog images, `image` is FracSpawner's: a profile option of that name would be
    read as the catalog image behind the admin's back, so the form and the spawn say why."""
    from tornado.web import HTTPError

    spawner = _spawner({"KubeSpawner": {"profile_list": [IMAGE_OPTION_PROFILE]}})
    for step in (spawner._render_options_form_async(spawner), spawner.load_user_options()):
        spawner.user_options = {"profile": "datasci", "image": "r", "gpu": "none"}
        with pytest.raises(HTTPError) as info:
            await step
        assert info.value.status_code == 500
        assert "profile 'datasci' has an option named 'image'" in info.value.log_message
        assert "rename the option" in info.value.log_message


def run_plan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fracspawner", "plan", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_plan_cli_prints_the_pod_as_yaml_and_json():
    result = run_plan("--catalog", str(DEMO_CATALOG), "--gpu", "mig-1g.10gb")
    assert result.returncode == 0, result.stderr
    pod = yaml.safe_load(result.stdout)
    assert pod["kind"] == "Pod" and pod["metadata"]["labels"]["hub.jupyter.org/username"] == "alice"
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/mig-1g.10gb": "1"}
    result = run_plan("--catalog", str(DEMO_CATALOG), "--gpu", "1/4", "--pool", "t4", "-o", "json")
    assert json.loads(result.stdout)["spec"]["nodeSelector"]["nvidia.com/gpu.replicas"] == "4"


@pytest.mark.parametrize(
    "args, words",
    [
        (["--gpu", "0.3"], "not a multiple of 1/8"),
        (["--gpu", "1/4", "--pool", "nope"], "unknown pool 'nope'"),
        (["--gpu", "mig-1g.10gb", "--check-access"], "no pool you may use offers"),
        (["--gpu", "1/4", "--image", "nope"], "unknown image"),
    ],
)
def test_plan_cli_bad_input_is_one_line_and_exit_2(args, words):
    result = run_plan("--catalog", str(DEMO_CATALOG), *args)
    assert result.returncode == 2
    assert words in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_plan_cli_bad_catalog(tmp_path):
    bad = tmp_path / "bad.yaml"
    data = yaml.safe_load(DEMO_CATALOG.read_text())
    data["pools"]["h100"]["offers"][0] = "0.3"
    bad.write_text(yaml.safe_dump(data))
    result = run_plan("--catalog", str(bad), "--gpu", "1/4")
    assert result.returncode == 2 and "pools.h100.offers[0]" in result.stderr
    result = run_plan("--catalog", str(tmp_path / "missing.yaml"), "--gpu", "1/4")
    assert result.returncode == 2 and "not found" in result.stderr


def test_form_escapes_every_catalog_string():
    from fracspawner.choice.offers import build_offer_model
    from fracspawner.hub.form import render_form

    data = yaml.safe_load(DEMO_CATALOG.read_text())
    data["pools"]["h100"]["display_name"] = "<script>window.__xss=1</script>H100"
    data["images"]["pytorch"]["description"] = '"><img src=x onerror=alert(1)>'
    catalog = load_catalog(data)
    model = build_offer_model(
        catalog,
        rule=catalog.rule_for("x", []),
        used_gpu=0,
        previous={"gpu": "</script><script>alert(1)</script>"},
    )
    html = render_form(model)
    assert "<script>window.__xss" not in html
    assert "&lt;script&gt;window.__xss=1&lt;/script&gt;H100" in html
    assert "<img src=x" not in html
    # the embedded JSON cannot close its <script> element
    embedded = html.split('id="fracspawner-model">', 1)[1].split("</script>", 1)[0]
    assert "<" not in embedded
    assert json.loads(embedded)["pools"][1]["display_name"].startswith("<script>")


#: a CPU-only container as z2jh's jupyterhub_config.py appends it to init_containers (a
#: kubernetes_asyncio model), and sidecars an admin configured (API dicts)
def _added_containers() -> dict:
    from kubernetes_asyncio.client import V1Container, V1SecurityContext

    block = V1Container(
        name="block-cloud-metadata",
        image="quay.io/jupyterhub/k8s-network-tools:4.4.0",
        command=["iptables", "-A", "OUTPUT", "-d", "169.254.169.254", "-j", "DROP"],
        security_context=V1SecurityContext(privileged=True, run_as_user=0),
    )
    return {
        "init_containers": [block],
        "extra_containers": [
            {"name": "sync", "image": "rclone/rclone", "env": [{"name": "A", "value": "b"}]},
            {"name": "own-choice", "image": "busybox", "env": [
                {"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}]},
            {"name": "gpu-helper", "image": "nvidia/cuda:12.4.1-base-ubuntu22.04",
             "resources": {"limits": {"nvidia.com/gpu": "1"}}},
        ],
    }  # fmt: skip


def _env(container) -> dict:
    return {e.name if hasattr(e, "name") else e["name"]: e.value if hasattr(e, "value")
            else e.get("value") for e in container.env or []}  # fmt: skip


async def test_a_cpu_only_spawn_after_a_gpu_spawn_hides_the_nodes_gpus():
    """Issue 34 item 3: the notebook image (a CUDA base: ENV NVIDIA_VISIBLE_DEVICES=all) on a
    `gpu: none` server, and every GPU-less container the spawner adds, get
    NVIDIA_VISIBLE_DEVICES=void; a GPU spawn's notebook container is left to its device
    plugin; a user's options cannot set the variable."""
    from tornado.web import HTTPError

    spawner = _spawner({"KubeSpawner": _added_containers()})
    spawner.user_options = {"gpu": "mig-1g.10gb", "pool": "a100-mig"}
    spawner.clear_state()
    await spawner.load_user_options()
    pod = await spawner.get_pod_manifest()
    notebook, sync, own, helper = pod.spec.containers
    assert "NVIDIA_VISIBLE_DEVICES" not in _env(notebook)  # the device plugin's business
    assert _env(sync) == {
        "A": "b",
        "NVIDIA_VISIBLE_DEVICES": "void",
        "NVIDIA_IMEX_CHANNELS": "void",
    }
    assert _env(own)["NVIDIA_VISIBLE_DEVICES"] == "none"  # the admin's own choice stands
    assert "NVIDIA_VISIBLE_DEVICES" not in _env(helper)  # holds a GPU: the plugin's value
    assert _env(pod.spec.init_containers[0])["NVIDIA_VISIBLE_DEVICES"] == "void"
    spawner.clear_state()

    spawner.user_options = {"gpu": "none"}
    spawner.clear_state()
    await spawner.load_user_options()
    pod = await spawner.get_pod_manifest()
    notebook = pod.spec.containers[0]
    env = _env(notebook)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void" and env["NVIDIA_IMEX_CHANNELS"] == "void"
    limits = notebook.resources.limits or {}
    assert not [k for k in limits if "nvidia" in k or "/" in k]
    assert pod.spec.containers[0].image == "quay.io/jupyter/pytorch-notebook:cuda12-latest"
    assert _env(pod.spec.init_containers[0])["NVIDIA_VISIBLE_DEVICES"] == "void"
    spawner.clear_state()
    # the configured containers themselves are untouched (the next spawn starts from them)
    assert spawner.init_containers[0].env is None
    assert "env" not in spawner.extra_containers[2]

    spawner.user_options = {"gpu": "none", "environment": {"NVIDIA_VISIBLE_DEVICES": "all"}}
    spawner.clear_state()
    with pytest.raises(HTTPError) as info:
        await spawner.load_user_options()
    assert info.value.status_code == 400
    spawner.clear_state()


def test_plan_cli_shows_a_cpu_only_server_its_gpus_hidden():
    from fracspawner.cli.plan import build_bare_manifest

    result = run_plan("--catalog", str(DEMO_CATALOG), "--gpu", "none", "-o", "json")
    assert result.returncode == 0, result.stderr
    for pod in (json.loads(result.stdout), build_bare_manifest(str(DEMO_CATALOG), {"gpu": "none"})):
        box = pod["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in box.get("env") or []}
        assert env["NVIDIA_VISIBLE_DEVICES"] == "void", box
        assert env["NVIDIA_IMEX_CHANNELS"] == "void", box
        limits = (box.get("resources") or {}).get("limits") or {}
        assert not [k for k in limits if "/" in k]
