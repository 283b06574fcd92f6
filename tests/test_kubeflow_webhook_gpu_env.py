"""Issue 34 items 1, 2 and 6 (visibility): no GPU escape through a pod's own environment or
`kubectl debug`.

The real `fracspawner webhook` process, asked over verified HTTPS with AdmissionReviews as the
API server sends them (the real control plane's kube-apiserver for the namespaces), as the
chart runs it (`--override-visible-devices all`).

What is modelled, and from where (besides tests/test_kubeflow_webhook_visibility.py's models):
- the environment a container holding a device-plugin GPU ends up with (`runtime_env`): the
  kubelet puts the device plugin's Allocate envs first and appends the pod's own env after them
  (kubernetes pkg/kubelet/kubelet_pods.go GenerateRunContainerOptions: `opts.Envs =
  append(opts.Envs, envs...)`), containerd passes both, and the NVIDIA container toolkit reads
  the list into a map, so the last entry of a name wins (nvidia-container-toolkit
  internal/config/image/builder.go WithEnv, used by cuda_image.go). Field reports of exactly
  that: NVIDIA/k8s-device-plugin#90, #1294, otwld/ollama-helm#98;
- HAMi hands a device only for `nvidia.com/gpu`, or for its memory and cores resources, for
  which its webhook adds the count (HAMi pkg/device/nvidia/device.go MutateAdmission);
  `nvidia.com/priority` alone gets no device, so the toolkit reads that container's own env;
- NVIDIA's DRA driver writes `NVIDIA_VISIBLE_DEVICES=void` into the CDI edits of every GPU it
  prepares (k8s-dra-driver-gpu cmd/gpu-kubelet-plugin/cdi.go) and hands the devices as CDI
  device nodes: a claim's devices never come through that variable.
"""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import pytest
import yaml

from devcluster.validation import validate as k8s_validate
from tests.kubeflow_support import (
    WebhookProcess,
    admission_review,
    make_tls,
    notebook_pod,
    other_pod,
    patched,
    profile_namespace,
    with_poddefault,
)
from tests.test_kubeflow_webhook_visibility import (
    debug_review,
    kubeflow_catalog,
    kubelet_env,
    toolkit_devices,
)

NAMESPACE = "gpuenv"
CONTROL_PLANE = "real"
PROFILE = {"app.kubernetes.io/part-of": "kubeflow-profile", "team": "research"}
CUDA_IMAGE_ENV = {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_REQUIRE_CUDA": "cuda>=12.4"}
#: GPUs as every backend hands them to a container through a device plugin
GPUS = {
    "whole-gpu": {"nvidia.com/gpu": "1"},
    "mig-slice": {"nvidia.com/mig-1g.10gb": "1"},
    "hami-eighth": {
        "nvidia.com/gpu": "1",
        "nvidia.com/gpumem-percentage": "12",
        "nvidia.com/gpucores": "12",
    },
    "hami-memory": {"nvidia.com/gpumem": "10240"},
    "time-sliced": {"nvidia.com/gpu.shared": "1"},
}
#: what a GPU container's own env may try: every value, and the ones the webhook cannot read
CHOSEN = {
    "all": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
    "void": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}],
    "index": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "0,1,2,3"}],
    "imex": [{"name": "NVIDIA_IMEX_CHANNELS", "value": "0"}],
    "configmap": [
        {
            "name": "NVIDIA_VISIBLE_DEVICES",
            "valueFrom": {"configMapKeyRef": {"name": "gpus", "key": "which"}},
        }
    ],
}


def runtime_env(device_plugin: dict[str, str], container: dict[str, Any]) -> dict[str, str]:
    """What the toolkit reads for a container holding a device-plugin GPU (module docstring):
    the device plugin's envs, then the container's own; of a name the last wins."""
    out = dict(device_plugin)
    out.update(kubelet_env(container, {}))
    return out


@pytest.fixture(scope="module")
def folder(devcluster, tmp_path_factory):
    client = devcluster.client()
    profile_namespace(client, NAMESPACE, PROFILE)
    folder = tmp_path_factory.mktemp("gpuenv")
    (folder / "catalog.yaml").write_text(yaml.safe_dump(kubeflow_catalog()))
    return folder


CHART = ("--detailed-refusals", "--override-visible-devices", "all")


def _webhook(devcluster, folder, name: str, args: tuple[str, ...]) -> WebhookProcess:
    tls = make_tls(folder / f"tls-{name}")
    log = folder / f"{name}.log"
    return WebhookProcess(folder / "catalog.yaml", devcluster.kubeconfig, tls, log, args)


@pytest.fixture(scope="module")
def webhook(devcluster, folder):
    """The webhook as the chart runs it."""
    process = _webhook(devcluster, folder, "chart", CHART)
    yield process
    process.stop()


@pytest.fixture(scope="module")
def declared(devcluster, folder):
    """The chart's webhook where the operator declared volume-mount nodes."""
    args = (*CHART, "--device-list-strategy", "volume-mounts")
    process = _webhook(devcluster, folder, "mounts", args)
    yield process
    process.stop()


def dry(pod: dict[str, Any]) -> dict[str, Any]:
    return admission_review(pod, dry_run=True)  # nothing is created, nothing stays reserved


def step(gpu: dict[str, str], **main: Any) -> dict[str, Any]:
    """A pipeline step holding `gpu` in its container `main` (with `main`'s other fields)."""
    return other_pod(NAMESPACE, "train-x7k2p-1", {"limits": dict(gpu)}, **main)


# --------------------------------------------------------------------------- item 1
@pytest.mark.parametrize("gpu", list(GPUS), ids=list(GPUS))
@pytest.mark.parametrize("chosen", list(CHOSEN), ids=list(CHOSEN))
def test_a_gpu_container_may_not_choose_its_devices_through_env(webhook, gpu, chosen):
    pod = step(GPUS[gpu], env=[{"name": "S3_BUCKET", "value": "data"}, *CHOSEN[chosen]])
    if chosen == "all":  # what the toolkit would have done: every GPU of the node
        plugin = {"NVIDIA_VISIBLE_DEVICES": "GPU-6b3f9a2e-1c1d-4c3e-9b7a-2f5e8d1c0a11"}
        assert toolkit_devices(runtime_env(plugin, pod["spec"]["containers"][0])) == "all"
    answer = webhook.review(dry(pod))
    assert answer["allowed"] is False, answer
    message = answer["status"]["message"]
    var = CHOSEN[chosen][0]["name"]
    assert f"container main: {var}" in message, message
    assert "device plugin" in message, message


def test_an_init_container_holding_a_gpu_is_held_to_it_too(webhook):
    pod = step({"cpu": "1"})
    pod["spec"]["initContainers"] = [
        {
            "name": "warm-cache",
            "image": "nvidia/cuda:12.4.1-base-ubuntu22.04",
            "resources": {"limits": {"nvidia.com/gpu": "1"}},
            "env": CHOSEN["all"],
        }
    ]
    answer = webhook.review(dry(pod))
    assert answer["allowed"] is False, answer
    assert "container warm-cache: NVIDIA_VISIBLE_DEVICES" in answer["status"]["message"]


@pytest.mark.parametrize("gpu", ["whole-gpu", "hami-eighth"])
def test_env_from_in_a_gpu_container_only_where_nodes_hand_devices_by_volume_mounts(
    webhook, gpu, request
):
    pod = step(GPUS[gpu], envFrom=[{"configMapRef": {"name": "settings"}}])
    answer = webhook.review(dry(pod))
    assert answer["allowed"] is False, answer
    message = answer["status"]["message"]
    assert "container main: envFrom" in message and "--device-list-strategy" in message, message
    # the operator says the nodes ignore the variable (volume mounts, the toolkit's
    # accept-nvidia-visible-devices-envvar-when-unprivileged = false): allowed, unchanged
    answer = request.getfixturevalue("declared").review(dry(pod))
    assert answer["allowed"] is True, answer
    assert patched(pod, answer)["spec"]["containers"][0] == pod["spec"]["containers"][0]


def test_a_notebooks_gpu_container_loses_the_variable_and_may_not_take_env_from(webhook):
    nb = with_poddefault(notebook_pod(NAMESPACE, "lab"), "h100", "0.25", "fracspawner-h100-0-25")
    nb["spec"]["containers"][0]["env"] += CHOSEN["all"]
    answer = webhook.review(dry(nb))
    assert answer["allowed"] is True, answer
    box = patched(nb, answer)["spec"]["containers"][0]
    assert "NVIDIA_VISIBLE_DEVICES" not in {e["name"] for e in box["env"]}, box
    form = notebook_pod(NAMESPACE, "lab2", resources={"limits": {"nvidia.com/mig-1g.10gb": "1"}})
    form["spec"]["containers"][0]["envFrom"] = [{"secretRef": {"name": "s3"}}]
    answer = webhook.review(dry(form))
    assert answer["allowed"] is False, answer
    assert "container lab2: envFrom" in answer["status"]["message"], answer


# --------------------------------------------------------------------------- item 2
def _operations(answer: dict[str, Any]) -> list[dict[str, Any]]:
    return json.loads(base64.b64decode(answer["patch"])) if "patch" in answer else []


def test_kubectl_debug_gets_void_like_every_other_gpu_less_container(webhook):
    running = step(GPUS["whole-gpu"])
    running["spec"]["ephemeralContainers"] = [
        {"name": "earlier", "image": "busybox", "stdin": True}  # added before: left alone
    ]
    # kubectl debug -it --image=nvidia/cuda:12.4.1-base-ubuntu22.04 (its image ENV: all)
    bare = {"name": "debugger-x1", "image": "nvidia/cuda:12.4.1-base-ubuntu22.04", "stdin": True}
    with_env = {**bare, "name": "debugger-x2", "env": [{"name": "TERM", "value": "xterm"}]}
    for debugger in (bare, with_env):
        review = debug_review(running, debugger)
        assert review["request"]["subResource"] == "ephemeralcontainers"
        answer = webhook.review(review)
        assert answer["allowed"] is True, answer
        ops = _operations(answer)
        assert ops and all(o["path"].startswith("/spec/ephemeralContainers/1/env") for o in ops)
        out = patched(review["request"]["object"], answer)
        k8s_validate(out)
        added = out["spec"]["ephemeralContainers"][1]
        env = {**CUDA_IMAGE_ENV, **kubelet_env(added, {})}
        assert toolkit_devices(env) == "void", added
        assert env["NVIDIA_IMEX_CHANNELS"] == "void"
        assert out["spec"]["ephemeralContainers"][0] == running["spec"]["ephemeralContainers"][0]
        assert out["spec"]["containers"] == running["spec"]["containers"]
        if debugger is with_env:
            assert env["TERM"] == "xterm"
    # one that says "none" itself keeps it (IMEX channels: void added beside it)
    own = {**bare, "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}]}
    out = patched(debug_review(running, own)["request"]["object"],
                  webhook.review(debug_review(running, own)))  # fmt: skip
    assert (
        kubelet_env(out["spec"]["ephemeralContainers"][1], {})["NVIDIA_VISIBLE_DEVICES"] == "none"
    )


# --------------------------------------------------------------------------- item 6
def test_hamis_priority_alone_holds_no_gpu(webhook):
    """`nvidia.com/priority` only ranks a HAMi task; with nothing else the container gets no
    device, so its own NVIDIA_VISIBLE_DEVICES (or its image's) is what the toolkit reads."""
    chooses = step({"nvidia.com/priority": "1"}, env=CHOSEN["all"])
    answer = webhook.review(dry(chooses))
    assert answer["allowed"] is False, answer
    assert "container main: NVIDIA_VISIBLE_DEVICES=all" in answer["status"]["message"]
    silent = step({"nvidia.com/priority": "1"})  # a CUDA image: its ENV shows every GPU
    answer = webhook.review(dry(silent))
    assert answer["allowed"] is True, answer
    main = patched(silent, answer)["spec"]["containers"][0]
    assert toolkit_devices({**CUDA_IMAGE_ENV, **kubelet_env(main, {})}) == "void", main


def test_a_sidecar_naming_a_resource_claim_still_gets_void(webhook):
    pod = step(GPUS["whole-gpu"])
    pod["spec"]["resourceClaims"] = [{"name": "fpga", "resourceClaimTemplateName": "fpga-one"}]
    pod["spec"]["containers"].append(
        {
            "name": "peek",
            "image": "nvidia/cuda:12.4.1-base-ubuntu22.04",
            "resources": {"claims": [{"name": "fpga"}]},
        }
    )
    answer = webhook.review(dry(pod))
    assert answer["allowed"] is True, answer
    out = patched(pod, answer)
    k8s_validate(out)
    peek = out["spec"]["containers"][1]
    assert toolkit_devices({**CUDA_IMAGE_ENV, **kubelet_env(peek, {})}) == "void", peek
    assert out["spec"]["containers"][0] == pod["spec"]["containers"][0]


def test_unchanged_pods_stay_unchanged(webhook):
    """What the rules above must not catch: a GPU container that sets nothing, a GPU-less
    container's harmless value, CUDA_VISIBLE_DEVICES (it only filters the given devices)."""
    fine = step(GPUS["whole-gpu"], env=[{"name": "CUDA_VISIBLE_DEVICES", "value": "0"}])
    answer = webhook.review(dry(fine))
    assert answer["allowed"] is True and "patch" not in answer, answer
    again = copy.deepcopy(fine)
    again["spec"]["containers"].append(
        {"name": "sync", "image": "rclone/rclone", "env": CHOSEN["void"]}
    )
    answer = webhook.review(dry(again))
    assert answer["allowed"] is True, answer
