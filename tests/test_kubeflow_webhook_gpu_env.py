"""Issue 34 items 1, 2 and 6 (visibility): no GPU escape through a pod's own environment or
`kubectl debug`.

The real `fracspawner webhook` process as the chart runs it (`--override-visible-devices all`),
registered with the real control plane's kube-apiserver by the MutatingWebhookConfiguration the
export writes (kubeflow_support.register) and called by it over TLS: pods are created through
the API (dry runs: validated and admitted, nothing stored), `kubectl debug`'s container is added
through pods/ephemeralcontainers, and the tests read what kube-apiserver would store or the
refusal it passes on to the user.

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

import copy
from typing import Any

import pytest
import yaml

from tests.kubeflow_support import (
    WebhookProcess,
    add_ephemeral,
    as_sent,
    create_pod,
    denied,
    make_tls,
    notebook_pod,
    other_pod,
    profile_namespace,
    register,
    with_poddefault,
)
from tests.test_kubeflow_webhook_visibility import kubeflow_catalog, kubelet_env, toolkit_devices

NAMESPACE = "gpuenv"
#: pods of this namespace go to the webhook run with --device-list-strategy volume-mounts
MOUNTS = "gpuenv-mounts"
TOPOLOGY = {"nodes": [{"name": "cpu-1", "capacity": {"cpu": "8", "memory": "32Gi"}}]}
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
    for namespace in (NAMESPACE, MOUNTS):
        profile_namespace(client, namespace, PROFILE)
    folder = tmp_path_factory.mktemp("gpuenv")
    (folder / "catalog.yaml").write_text(yaml.safe_dump(kubeflow_catalog()))
    return folder


CHART = ("--detailed-refusals", "--override-visible-devices", "all")


def _webhook(devcluster, folder, name: str, args: tuple[str, ...]) -> WebhookProcess:
    tls = make_tls(folder / f"tls-{name}")
    log = folder / f"{name}.log"
    return WebhookProcess(folder / "catalog.yaml", devcluster.kubeconfig, tls, log, args)


@pytest.fixture(scope="module")
def api(devcluster, folder):
    """kube-apiserver calling the webhook as the chart runs it for NAMESPACE, and the one
    where the operator declared volume-mount nodes for MOUNTS."""
    client = devcluster.client()
    chart = _webhook(devcluster, folder, "chart", CHART)
    mounts = _webhook(
        devcluster, folder, "mounts", (*CHART, "--device-list-strategy", "volume-mounts")
    )
    try:
        register(client, chart, "gpuenv.slices.webhook.fracspawner.io", NAMESPACE)
        register(client, mounts, "mounts.slices.webhook.fracspawner.io", MOUNTS)
        yield client
    finally:
        chart.stop()
        mounts.stop()


def step(gpu: dict[str, str], namespace: str = NAMESPACE, **main: Any) -> dict[str, Any]:
    """A pipeline step holding `gpu` in its container `main` (with `main`'s other fields)."""
    return other_pod(namespace, "train-x7k2p-1", {"limits": dict(gpu)}, **main)


def dry(api: Any, pod: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """The webhook's refusal as kube-apiserver passes it to the user (None where admitted),
    and the pod as it would be stored: a dry run, nothing created, nothing stays reserved."""
    status, body = create_pod(api, pod, dry_run=True)
    refusal = denied(body)
    assert (status == 201) == (refusal is None), (status, body)
    return refusal, body


# --------------------------------------------------------------------------- item 1
@pytest.mark.parametrize("gpu", list(GPUS), ids=list(GPUS))
@pytest.mark.parametrize("chosen", list(CHOSEN), ids=list(CHOSEN))
def test_a_gpu_container_may_not_choose_its_devices_through_env(api, gpu, chosen):
    pod = step(GPUS[gpu], env=[{"name": "S3_BUCKET", "value": "data"}, *CHOSEN[chosen]])
    if chosen == "all":  # what the toolkit would have done: every GPU of the node
        plugin = {"NVIDIA_VISIBLE_DEVICES": "GPU-6b3f9a2e-1c1d-4c3e-9b7a-2f5e8d1c0a11"}
        assert toolkit_devices(runtime_env(plugin, pod["spec"]["containers"][0])) == "all"
    message, _ = dry(api, pod)
    var = CHOSEN[chosen][0]["name"]
    assert message and f"container main: {var}" in message, message
    assert "device plugin" in message, message


def test_an_init_container_holding_a_gpu_is_held_to_it_too(api):
    pod = step({"cpu": "1"})
    pod["spec"]["initContainers"] = [
        {
            "name": "warm-cache",
            "image": "nvidia/cuda:12.4.1-base-ubuntu22.04",
            "resources": {"limits": {"nvidia.com/gpu": "1"}},
            "env": CHOSEN["all"],
        }
    ]
    message, _ = dry(api, pod)
    assert message and "container warm-cache: NVIDIA_VISIBLE_DEVICES" in message, message


@pytest.mark.parametrize("gpu", ["whole-gpu", "hami-eighth"])
def test_env_from_in_a_gpu_container_only_where_nodes_hand_devices_by_volume_mounts(api, gpu):
    pod = step(GPUS[gpu], envFrom=[{"configMapRef": {"name": "settings"}}])
    message, _ = dry(api, pod)
    assert message and "container main: envFrom" in message, message
    assert "--device-list-strategy" in message, message
    # the operator says the nodes ignore the variable (volume mounts, the toolkit's
    # accept-nvidia-visible-devices-envvar-when-unprivileged = false): allowed, unchanged
    there = step(GPUS[gpu], MOUNTS, envFrom=[{"configMapRef": {"name": "settings"}}])
    message, stored = dry(api, there)
    assert message is None
    sent = there["spec"]["containers"][0]
    assert as_sent(stored["spec"]["containers"][0], sent) == sent


def test_a_notebooks_gpu_container_loses_the_variable_and_may_not_take_env_from(api):
    nb = with_poddefault(notebook_pod(NAMESPACE, "lab"), "h100", "0.25", "fracspawner-h100-0-25")
    nb["spec"]["containers"][0]["env"] += CHOSEN["all"]
    message, stored = dry(api, nb)
    assert message is None
    box = stored["spec"]["containers"][0]
    assert "NVIDIA_VISIBLE_DEVICES" not in {e["name"] for e in box["env"]}, box
    form = notebook_pod(NAMESPACE, "lab2", resources={"limits": {"nvidia.com/mig-1g.10gb": "1"}})
    form["spec"]["containers"][0]["envFrom"] = [{"secretRef": {"name": "s3"}}]
    message, _ = dry(api, form)
    assert message and "container lab2: envFrom" in message, message


# --------------------------------------------------------------------------- item 2
def test_kubectl_debug_gets_void_like_every_other_gpu_less_container(api):
    """kubectl debug's container, added through pods/ephemeralcontainers (kube-apiserver
    sends that UPDATE to the export's ephemeral.slices... webhook), gets the void value; an
    earlier ephemeral container and the pod's own containers are left as stored."""
    running = step(GPUS["whole-gpu"])
    running["metadata"]["name"] = "serve-x7k2p-1"
    running["spec"]["schedulerName"] = "not-served"  # stays Pending: admission is under test
    status, created = create_pod(api, running)
    assert status == 201, created
    name = running["metadata"]["name"]
    earlier = {"name": "earlier", "image": "busybox", "stdin": True}
    status, body = add_ephemeral(api, NAMESPACE, name, earlier)
    assert status == 200, body
    before = api.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
    # kubectl debug -it --image=nvidia/cuda:12.4.1-base-ubuntu22.04 (its image ENV: all)
    bare = {"name": "debugger-x1", "image": "nvidia/cuda:12.4.1-base-ubuntu22.04", "stdin": True}
    with_env = {**bare, "name": "debugger-x2", "env": [{"name": "TERM", "value": "xterm"}]}
    for debugger in (bare, with_env):
        status, out = add_ephemeral(api, NAMESPACE, name, debugger, dry_run=True)
        assert status == 200, out  # validated by kube-apiserver after the webhook's patch
        added = out["spec"]["ephemeralContainers"][1]
        env = {**CUDA_IMAGE_ENV, **kubelet_env(added, {})}
        assert toolkit_devices(env) == "void", added
        assert env["NVIDIA_IMEX_CHANNELS"] == "void"
        assert out["spec"]["ephemeralContainers"][0] == before["spec"]["ephemeralContainers"][0]
        assert out["spec"]["containers"] == before["spec"]["containers"]
        assert out["metadata"]["labels"] == before["metadata"]["labels"]
        assert out["metadata"]["annotations"] == before["metadata"]["annotations"]
        sent = {k: v for k, v in debugger.items() if k != "env"}
        assert {k: added.get(k) for k in sent} == sent  # only its env changed
        if debugger is with_env:
            assert env["TERM"] == "xterm"
    # one that says "none" itself keeps it (IMEX channels: void added beside it)
    own = {**bare, "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}]}
    status, out = add_ephemeral(api, NAMESPACE, name, own, dry_run=True)
    assert status == 200, out
    assert (
        kubelet_env(out["spec"]["ephemeralContainers"][1], {})["NVIDIA_VISIBLE_DEVICES"] == "none"
    )
    # and one that would see every GPU is refused, with the webhook's words
    peek = {**bare, "env": CHOSEN["all"]}
    status, body = add_ephemeral(api, NAMESPACE, name, peek, dry_run=True)
    message = denied(body, "ephemeral.slices.webhook.fracspawner.io")
    assert message and "container debugger-x1: NVIDIA_VISIBLE_DEVICES=all" in message, body
    status, body = api.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
    assert status == 200, body


# --------------------------------------------------------------------------- item 6
def test_hamis_priority_alone_holds_no_gpu(api):
    """`nvidia.com/priority` only ranks a HAMi task; with nothing else the container gets no
    device, so its own NVIDIA_VISIBLE_DEVICES (or its image's) is what the toolkit reads."""
    chooses = step({"nvidia.com/priority": "1"}, env=CHOSEN["all"])
    message, _ = dry(api, chooses)
    assert message and "container main: NVIDIA_VISIBLE_DEVICES=all" in message, message
    silent = step({"nvidia.com/priority": "1"})  # a CUDA image: its ENV shows every GPU
    message, stored = dry(api, silent)
    assert message is None
    main = stored["spec"]["containers"][0]
    assert toolkit_devices({**CUDA_IMAGE_ENV, **kubelet_env(main, {})}) == "void", main


def test_a_sidecar_naming_a_resource_claim_still_gets_void(api):
    pod = step(GPUS["whole-gpu"])
    pod["spec"]["resourceClaims"] = [{"name": "fpga", "resourceClaimTemplateName": "fpga-one"}]
    pod["spec"]["containers"].append(
        {
            "name": "peek",
            "image": "nvidia/cuda:12.4.1-base-ubuntu22.04",
            "resources": {"claims": [{"name": "fpga"}]},
        }
    )
    message, out = dry(api, pod)  # kube-apiserver validated the pod after the webhook's patch
    assert message is None
    peek = out["spec"]["containers"][1]
    assert toolkit_devices({**CUDA_IMAGE_ENV, **kubelet_env(peek, {})}) == "void", peek
    sent = pod["spec"]["containers"][0]
    assert as_sent(out["spec"]["containers"][0], sent) == sent


def test_unchanged_pods_stay_unchanged(api):
    """What the rules above must not catch: a GPU container that sets nothing, a GPU-less
    container's harmless value, CUDA_VISIBLE_DEVICES (it only filters the given devices)."""
    fine = step(GPUS["whole-gpu"], env=[{"name": "CUDA_VISIBLE_DEVICES", "value": "0"}])
    message, stored = dry(api, fine)
    assert message is None
    for box, sent in zip(stored["spec"]["containers"], fine["spec"]["containers"], strict=True):
        assert as_sent(box, sent) == sent
    # counted: marked for the guard (tests/test_kubeflow_guard_counted.py), nothing else
    counted = {**fine["metadata"]["labels"], "fracspawner.io/counted": "true"}
    assert stored["metadata"]["labels"] == counted
    assert stored["metadata"]["annotations"] == fine["metadata"]["annotations"]
    again = copy.deepcopy(fine)
    again["spec"]["containers"].append(
        {"name": "sync", "image": "rclone/rclone", "env": CHOSEN["void"]}
    )
    message, _ = dry(api, again)
    assert message is None
