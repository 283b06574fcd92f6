"""Issue 28 item 6: no container of a profile namespace's pod sees GPUs it does not hold.

The real `fracspawner webhook` process, asked over verified HTTPS with AdmissionReviews as the
API server sends them (the real control plane's kube-apiserver for the namespaces and pods).

What is modelled, and from where:
- the NVIDIA container toolkit's reading of NVIDIA_VISIBLE_DEVICES (`toolkit_devices` below,
  written from NVIDIA/nvidia-container-toolkit internal/config/image/cuda_image.go
  devicesFromEnvvars and devices.go NewVisibleDevices): entries split at ',' and trimmed, any
  "void" or nothing is no device, else the first "all"/"none" decides, else device ids. It is
  honoured in unprivileged containers by default (api/config/v1/config.go GetDefault:
  AcceptEnvvarUnprivileged, `accept-nvidia-visible-devices-envvar-when-unprivileged`, true), so
  a container holding no GPU resource that sets it sees those GPUs. A container holding a GPU
  resource gets the device plugin's value over its image's (NVIDIA/nvidia-container-toolkit#27),
  but not over its own env, which the kubelet appends after the plugin's (issue 34:
  tests/test_kubeflow_webhook_gpu_env.py);
- the kubelet's env for a container (`kubelet_env`): envFrom sources first, then `env`, a later
  value replacing an earlier one ("Values defined by an Env with a duplicate key will take
  precedence", k8s.io/api core/v1 Container.EnvFrom; pkg/kubelet/kubelet_pods.go
  makeEnvironmentVariables);
- a container's environment over its image's: "The environment variables set using the env or
  envFrom field override any environment variables specified in the container image"
  (kubernetes.io/docs/tasks/inject-data-application/define-environment-variable-container);
  CUDA base images set NVIDIA_VISIBLE_DEVICES=all (NVIDIA's "Specialized Configurations with
  Docker": "the default value in base CUDA container images");
- KAI's (Run:ai's) GPU sharing: its admission webhook gives the fraction container (annotation
  gpu-fraction-container-name, else the first) NVIDIA_VISIBLE_DEVICES from a ConfigMap key,
  which its binder fills with the allocated device (kai-scheduler
  pkg/admission/webhook/v1alpha2/gpusharing/gpu_sharing.go, pkg/binder/common/gpu_access.go);
- kubectl debug's request: an UPDATE of the subresource pods/ephemeralcontainers whose object
  and oldObject are the whole Pod (kubernetes/kubernetes#101034, Kubernetes >= 1.22; the
  AdmissionRequest fields of k8s.io/api admission/v1 types.go, subResource included).
"""

from __future__ import annotations

import copy
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.kubeflow_support import (
    WebhookProcess,
    admission_review,
    make_tls,
    notebook_pod,
    other_pod,
    patched,
    profile_namespace,
    validated_by_the_api_server,
    with_poddefault,
)

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "examples" / "catalogs" / "demo.yaml"
PROFILE = {"app.kubernetes.io/part-of": "kubeflow-profile"}
NAMESPACE = "seer"
CONTROL_PLANE = "real"


def toolkit_devices(env: dict[str, str]) -> str:
    """What the NVIDIA toolkit hands a container holding no GPU resource: "all", "none"
    (the driver, no GPU), "void" (nothing) or the device ids (module docstring)."""
    if "NVIDIA_VISIBLE_DEVICES" not in env:
        return "void"  # not a legacy image here: the test pods set no CUDA_VERSION
    entries = [e.strip() for e in env["NVIDIA_VISIBLE_DEVICES"].split(",") if e.strip()]
    if not entries or "void" in entries:
        return "void"
    for entry in entries:
        if entry in ("all", "none"):
            return entry
    return ",".join(entries)


def kubelet_env(container: dict[str, Any], configmaps: dict[str, dict[str, str]]) -> dict:
    """The container's environment as the kubelet builds it (module docstring)."""
    out: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        ref = source.get("configMapRef") or {}
        out.update({source.get("prefix", "") + k: v for k, v in configmaps[ref["name"]].items()})
    for entry in container.get("env") or []:
        out[entry["name"]] = entry.get("value", "")
    return out


def kubeflow_catalog() -> dict[str, Any]:
    """The demo catalog, profile namespaces labelled team=research in ml-research (all pools,
    up to 2 GPU): room for a whole GPU."""
    data = yaml.safe_load(DEMO.read_text())
    data["kubeflow"] = {"namespaces": [{"labels": {"team": "research"}, "groups": ["ml-research"]}]}
    return data


@pytest.fixture(scope="module")
def webhook(devcluster, tmp_path_factory):
    client = devcluster.client()
    profile_namespace(client, NAMESPACE, {**PROFILE, "team": "research"})
    folder = tmp_path_factory.mktemp("visibility")
    catalog = folder / "catalog.yaml"
    catalog.write_text(yaml.safe_dump(kubeflow_catalog()))
    process = WebhookProcess(
        catalog, devcluster.kubeconfig, make_tls(folder / "tls"), folder / "webhook.log"
    )
    yield process
    process.stop()


def gpu_step(gpu: dict[str, str], **sidecar: Any) -> dict[str, Any]:
    """A Kubeflow Pipelines step holding `gpu` in its `main` container, with a sidecar
    container (`sidecar` its fields: env, envFrom)."""
    step = other_pod(NAMESPACE, f"train-{uuid.uuid4().hex[:5]}-1", {"limits": gpu})
    step["spec"]["containers"].append(
        {"name": "peek", "image": "nvidia/cuda:12.4.1-base-ubuntu22.04", **sidecar}
    )
    return step


def dry(pod: dict[str, Any]) -> dict[str, Any]:
    """A dry-run review (the pods are never created: nothing may stay reserved)."""
    return admission_review(pod, dry_run=True)


def env_of(value: str) -> list[dict[str, Any]]:
    return [{"name": "NVIDIA_VISIBLE_DEVICES", "value": value}]


GPUS = [{"nvidia.com/gpu": "1"}, {"nvidia.com/mig-1g.10gb": "1"}]


@pytest.mark.parametrize("gpu", GPUS, ids=["whole-gpu", "mig-slice"])
@pytest.mark.parametrize("where", ["sidecar", "initContainer", "native-sidecar"])
def test_a_gpu_pod_whose_other_container_chooses_every_gpu_is_refused(webhook, gpu, where):
    step = gpu_step(gpu)
    peek = step["spec"]["containers"].pop()
    peek["env"] = env_of("all")
    if where == "sidecar":
        step["spec"]["containers"].append(peek)
    else:  # an init container, or one that keeps running beside the app (KEP-753)
        if where == "native-sidecar":
            peek["restartPolicy"] = "Always"
        step["spec"]["initContainers"] = [peek]
    answer = webhook.review(dry(step))
    assert answer["allowed"] is False, answer
    message = answer["status"]["message"]
    assert "container peek: NVIDIA_VISIBLE_DEVICES=all" in message, message
    assert toolkit_devices(kubelet_env(peek, {})) == "all"  # what it would have seen


def test_which_values_of_the_variable_pass(webhook):
    risky = [
        "all",
        "0",
        "1,2",
        "GPU-6b3f9a2e-1c1d-4c3e-9b7a-2f5e8d1c0a11",  # a GPU UUID
        "MIG-0c7a5d6f-3b1e-5a4f-8e2d-7c9b1a0f3e22",  # a MIG device UUID
        " all ",
    ]
    for value in risky:
        assert toolkit_devices({"NVIDIA_VISIBLE_DEVICES": value}) not in ("void", "none")
        answer = webhook.review(dry(gpu_step(GPUS[0], env=env_of(value))))
        assert answer["allowed"] is False, (value, answer)
    # "none,all": the first of all/none decides (the driver, no GPU)
    harmless = ["void", "none", "", "0,void", "none,all"]
    for value in harmless:
        assert toolkit_devices({"NVIDIA_VISIBLE_DEVICES": value}) in ("void", "none")
        answer = webhook.review(dry(gpu_step(GPUS[0], env=env_of(value))))
        assert answer["allowed"] is True, (value, answer)
    # values the webhook cannot read are refused: a ConfigMap key, a $(VAR) the kubelet
    # expands from the container's other env (envFrom included)
    unknown = [
        [
            {
                "name": "NVIDIA_VISIBLE_DEVICES",
                "valueFrom": {"configMapKeyRef": {"name": "gpus", "key": "which"}},
            }
        ],
        [
            {"name": "WHICH", "value": "all"},
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "$(WHICH)"},
        ],
    ]
    for env in unknown:
        answer = webhook.review(dry(gpu_step(GPUS[0], env=env)))
        assert answer["allowed"] is False, (env, answer)
        assert "container peek: NVIDIA_VISIBLE_DEVICES" in answer["status"]["message"]


def test_env_from_a_configmap_is_overridden_in_containers_holding_no_gpu(webhook, devcluster):
    """envFrom cannot be read at admission (and the ConfigMap may change later): the webhook
    writes NVIDIA_VISIBLE_DEVICES=void into the container's env, which wins over it."""
    configmaps = {"settings": {"NVIDIA_VISIBLE_DEVICES": "all", "S3_BUCKET": "data"}}
    source = [{"configMapRef": {"name": "settings"}}]
    for pod in (
        gpu_step(GPUS[0], envFrom=source),  # a GPU step's sidecar
        other_pod(NAMESPACE, "etl-x7k2p-1", {}, envFrom=source),  # a pod holding no GPU
    ):
        answer = webhook.review(dry(pod))
        assert answer["allowed"] is True, answer
        out = patched(pod, answer)
        validated_by_the_api_server(devcluster.client(), out)  # what kube-apiserver would store
        for before, after in zip(pod["spec"]["containers"], out["spec"]["containers"], strict=True):
            holds = "nvidia.com/gpu" in ((before.get("resources") or {}).get("limits") or {})
            if holds:  # the device plugin's value rules there: left as it was
                assert after == before
                continue
            assert toolkit_devices(kubelet_env(before, configmaps)) == "all"  # the escape
            env = kubelet_env(after, configmaps)
            assert toolkit_devices(env) == "void"
            assert env["S3_BUCKET"] == "data"  # the rest of the ConfigMap still arrives
            assert env["NVIDIA_IMEX_CHANNELS"] == "void"


def test_a_notebooks_sidecar_is_checked_and_its_env_from_overridden(webhook):
    nb = with_poddefault(notebook_pod(NAMESPACE, "lab"), "h100", "0.25", "fracspawner-h100-0-25")
    nb["spec"]["containers"].append(
        {"name": "sync", "image": "rclone/rclone", "envFrom": [{"secretRef": {"name": "s3"}}]}
    )
    answer = webhook.review(dry(nb))
    assert answer["allowed"] is True, answer
    sync = patched(nb, answer)["spec"]["containers"][1]
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"} in sync["env"]
    legacy = copy.deepcopy(nb)
    legacy["spec"]["containers"][1]["env"] = [{"name": "CUDA_VERSION", "value": "11.0"}]
    refused = webhook.review(dry(legacy))
    assert refused["allowed"] is False and "CUDA_VERSION" in refused["status"]["message"]


def debug_review(pod: dict[str, Any], debugger: dict[str, Any]) -> dict[str, Any]:
    """The AdmissionReview of `kubectl debug` adding `debugger` to a running pod (module
    docstring): UPDATE of pods/ephemeralcontainers, object and oldObject whole Pods."""
    old = copy.deepcopy(pod)
    new = copy.deepcopy(pod)
    new["spec"].setdefault("ephemeralContainers", []).append(debugger)
    review = admission_review(new, operation="UPDATE", old=old)
    request = review["request"]
    request["subResource"] = request["requestSubResource"] = "ephemeralcontainers"
    request["options"] = {"apiVersion": "meta.k8s.io/v1", "kind": "UpdateOptions"}
    return review


def test_kubectl_debug_cannot_attach_a_container_that_sees_every_gpu(webhook):
    running = other_pod(NAMESPACE, "serve-x7k2p-1", {"limits": {"nvidia.com/gpu": "1"}})
    base = {"name": "debugger-x1", "image": "nvidia/cuda:12.4.1-base-ubuntu22.04", "stdin": True}
    answer = webhook.review(debug_review(running, {**base, "env": env_of("all")}))
    assert answer["allowed"] is False, answer
    assert "container debugger-x1: NVIDIA_VISIBLE_DEVICES=all" in answer["status"]["message"]
    env_from = {**base, "envFrom": [{"configMapRef": {"name": "settings"}}]}
    answer = webhook.review(debug_review(running, env_from))
    assert answer["allowed"] is False and "envFrom" in answer["status"]["message"], answer
    # a plain debugging container is let through, unchanged
    answer = webhook.review(debug_review(running, {**base, "env": env_of("void")}))
    assert answer["allowed"] is True and "patch" not in answer, answer
    # an earlier ephemeral container is not judged again
    earlier = copy.deepcopy(running)
    earlier["spec"]["ephemeralContainers"] = [{**base, "name": "old", "env": env_of("all")}]
    answer = webhook.review(debug_review(earlier, base))
    assert answer["allowed"] is True, answer


def kai_fraction_step(**spec: Any) -> dict[str, Any]:
    """A pipeline step asking KAI for half a GPU, as KAI's webhook leaves it (module
    docstring): the first container's NVIDIA_VISIBLE_DEVICES and an envFrom from KAI's
    ConfigMaps."""
    pod = other_pod(NAMESPACE, "half-x7k2p-1", {})
    pod["metadata"]["annotations"]["gpu-fraction"] = "0.5"
    pod["spec"]["schedulerName"] = "kai-scheduler"
    main = pod["spec"]["containers"][0]
    main["env"] = [
        {
            "name": "NVIDIA_VISIBLE_DEVICES",
            "valueFrom": {
                "configMapKeyRef": {
                    "name": "half-x7k2p-1-shared-gpu",
                    "key": "NVIDIA_VISIBLE_DEVICES",
                }
            },
        }
    ]
    main["envFrom"] = [{"configMapRef": {"name": "half-x7k2p-1-evar", "optional": False}}]
    pod["spec"].update(spec)
    return pod


def test_a_kai_fraction_container_keeps_the_devices_its_binder_writes(webhook):
    step = kai_fraction_step()
    answer = webhook.review(dry(step))
    assert answer["allowed"] is True, answer
    assert patched(step, answer)["spec"]["containers"][0] == step["spec"]["containers"][0]
    # its other containers are held to the rule
    sidecar = kai_fraction_step()
    sidecar["spec"]["containers"].append(
        {"name": "peek", "image": "busybox", "env": sidecar["spec"]["containers"][0]["env"]}
    )
    refused = webhook.review(dry(sidecar))
    assert refused["allowed"] is False and "container peek" in refused["status"]["message"]
    # not scheduled by KAI, nobody writes that ConfigMap: the tenant's own says what it likes
    stray = kai_fraction_step(schedulerName="default-scheduler")
    assert webhook.review(dry(stray))["allowed"] is False


@pytest.fixture(scope="module")
def hiding(devcluster, webhook, tmp_path_factory):
    """The webhook as the chart runs it: --override-visible-devices all."""
    folder = tmp_path_factory.mktemp("hiding")
    process = WebhookProcess(
        webhook.catalog,
        devcluster.kubeconfig,
        make_tls(folder / "tls"),
        folder / "webhook.log",
        ("--detailed-refusals", "--override-visible-devices", "all"),
    )
    yield process
    process.stop()


def test_every_container_holding_no_gpu_is_shown_none_whatever_its_image_says(hiding):
    cuda_image = {"NVIDIA_VISIBLE_DEVICES": "all", "CUDA_VERSION": "12.4.1"}  # its ENV
    step = gpu_step(GPUS[0])  # a GPU step and a CUDA-image sidecar setting nothing
    etl = other_pod(NAMESPACE, "etl-x7k2p-2", {})
    mine = gpu_step(GPUS[0], env=env_of("none"))  # says what it wants itself
    for pod in (step, etl, mine):
        answer = hiding.review(dry(pod))
        assert answer["allowed"] is True, answer
        out = patched(pod, answer)
        for before, after in zip(pod["spec"]["containers"], out["spec"]["containers"], strict=True):
            holds = "nvidia.com/gpu" in ((before.get("resources") or {}).get("limits") or {})
            seen = toolkit_devices({**cuda_image, **kubelet_env(after, {})})
            if holds:
                assert after == before  # the device plugin's value rules there
            elif before.get("env"):
                assert seen == "none"  # its own choice stands (IMEX channels: void added)
            else:
                assert toolkit_devices({**cuda_image, **kubelet_env(before, {})}) == "all"
                assert seen == "void", after
    kai = kai_fraction_step()
    answer = hiding.review(dry(kai))
    assert patched(kai, answer)["spec"]["containers"][0] == kai["spec"]["containers"][0]
