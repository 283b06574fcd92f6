"""Issue 28 item 6: no container of a profile namespace's pod sees GPUs it does not hold.

The real `fracspawner webhook` process, registered with the real control plane's kube-apiserver
by the MutatingWebhookConfiguration the export writes (kubeflow_support.register) and called by
it over TLS: pods are created through the API (dry runs: admitted and validated, nothing
stored), `kubectl debug`'s container is added through pods/ephemeralcontainers, and the tests
read what kube-apiserver would store, or the refusal it passes on to the user.

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

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "examples" / "catalogs" / "demo.yaml"
PROFILE = {"app.kubernetes.io/part-of": "kubeflow-profile"}
NAMESPACE = "seer"
#: pods of this namespace go to the webhook run as the chart runs it (`hiding` below)
HIDING = "seer-hiding"
#: this namespace's webhook is registered only after a pod there was debugged (`late` below)
LATE = "seer-late"
TOPOLOGY = {"nodes": [{"name": "cpu-1", "capacity": {"cpu": "8", "memory": "32Gi"}}]}


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
    for namespace in (NAMESPACE, HIDING, LATE):
        profile_namespace(client, namespace, {**PROFILE, "team": "research"})
    folder = tmp_path_factory.mktemp("visibility")
    catalog = folder / "catalog.yaml"
    catalog.write_text(yaml.safe_dump(kubeflow_catalog()))
    process = WebhookProcess(
        catalog, devcluster.kubeconfig, make_tls(folder / "tls"), folder / "webhook.log"
    )
    try:
        register(client, process, "seer.slices.webhook.fracspawner.io", NAMESPACE)
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def api(devcluster, webhook):
    """kube-apiserver, calling the webhook for NAMESPACE's pods."""
    return devcluster.client()


def gpu_step(gpu: dict[str, str], namespace: str = NAMESPACE, **sidecar: Any) -> dict[str, Any]:
    """A Kubeflow Pipelines step holding `gpu` in its `main` container, with a sidecar
    container (`sidecar` its fields: env, envFrom)."""
    step = other_pod(namespace, f"train-{uuid.uuid4().hex[:5]}-1", {"limits": gpu})
    step["spec"]["containers"].append(
        {"name": "peek", "image": "nvidia/cuda:12.4.1-base-ubuntu22.04", **sidecar}
    )
    return step


def dry(api: Any, pod: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """The webhook's refusal as kube-apiserver passes it to the user (None where admitted),
    and the pod as it would be stored: a dry run (nothing created, nothing stays reserved)."""
    status, body = create_pod(api, pod, dry_run=True)
    refusal = denied(body)
    assert (status == 201) == (refusal is None), (status, body)
    return refusal, body


def env_of(value: str) -> list[dict[str, Any]]:
    return [{"name": "NVIDIA_VISIBLE_DEVICES", "value": value}]


GPUS = [{"nvidia.com/gpu": "1"}, {"nvidia.com/mig-1g.10gb": "1"}]


@pytest.mark.parametrize("gpu", GPUS, ids=["whole-gpu", "mig-slice"])
@pytest.mark.parametrize("where", ["sidecar", "initContainer", "native-sidecar"])
def test_a_gpu_pod_whose_other_container_chooses_every_gpu_is_refused(api, gpu, where):
    step = gpu_step(gpu)
    peek = step["spec"]["containers"].pop()
    peek["env"] = env_of("all")
    if where == "sidecar":
        step["spec"]["containers"].append(peek)
    else:  # an init container, or one that keeps running beside the app (KEP-753)
        if where == "native-sidecar":
            peek["restartPolicy"] = "Always"
        step["spec"]["initContainers"] = [peek]
    message, _ = dry(api, step)
    assert message and "container peek: NVIDIA_VISIBLE_DEVICES=all" in message, message
    assert toolkit_devices(kubelet_env(peek, {})) == "all"  # what it would have seen


def test_which_values_of_the_variable_pass(api):
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
        message, _ = dry(api, gpu_step(GPUS[0], env=env_of(value)))
        assert message, value
    # "none,all": the first of all/none decides (the driver, no GPU)
    harmless = ["void", "none", "", "0,void", "none,all"]
    for value in harmless:
        assert toolkit_devices({"NVIDIA_VISIBLE_DEVICES": value}) in ("void", "none")
        message, _ = dry(api, gpu_step(GPUS[0], env=env_of(value)))
        assert message is None, value
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
        message, _ = dry(api, gpu_step(GPUS[0], env=env))
        assert message and "container peek: NVIDIA_VISIBLE_DEVICES" in message, (env, message)


def test_env_from_a_configmap_is_overridden_in_containers_holding_no_gpu(api):
    """envFrom cannot be read at admission (and the ConfigMap may change later): the webhook
    writes NVIDIA_VISIBLE_DEVICES=void into the container's env, which wins over it."""
    configmaps = {"settings": {"NVIDIA_VISIBLE_DEVICES": "all", "S3_BUCKET": "data"}}
    source = [{"configMapRef": {"name": "settings"}}]
    for pod in (
        gpu_step(GPUS[0], envFrom=source),  # a GPU step's sidecar
        other_pod(NAMESPACE, "etl-x7k2p-1", {}, envFrom=source),  # a pod holding no GPU
    ):
        message, out = dry(api, pod)  # what kube-apiserver would store, validated by it
        assert message is None
        for before, after in zip(pod["spec"]["containers"], out["spec"]["containers"], strict=True):
            holds = "nvidia.com/gpu" in ((before.get("resources") or {}).get("limits") or {})
            if holds:  # the device plugin's value rules there: left as it was
                assert as_sent(after, before) == before
                continue
            assert toolkit_devices(kubelet_env(before, configmaps)) == "all"  # the escape
            env = kubelet_env(after, configmaps)
            assert toolkit_devices(env) == "void"
            assert env["S3_BUCKET"] == "data"  # the rest of the ConfigMap still arrives
            assert env["NVIDIA_IMEX_CHANNELS"] == "void"


def test_a_notebooks_sidecar_is_checked_and_its_env_from_overridden(api):
    nb = with_poddefault(notebook_pod(NAMESPACE, "lab"), "h100", "0.25", "fracspawner-h100-0-25")
    nb["spec"]["containers"].append(
        {"name": "sync", "image": "rclone/rclone", "envFrom": [{"secretRef": {"name": "s3"}}]}
    )
    message, out = dry(api, nb)
    assert message is None
    sync = out["spec"]["containers"][1]
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"} in sync["env"]
    legacy = copy.deepcopy(nb)
    legacy["spec"]["containers"][1]["env"] = [{"name": "CUDA_VERSION", "value": "11.0"}]
    message, _ = dry(api, legacy)
    assert message and "CUDA_VERSION" in message, message


def _running(api: Any, namespace: str, name: str) -> None:
    """A GPU step created for real (it stays Pending: no scheduler serves it), to debug."""
    pod = other_pod(namespace, name, {"limits": {"nvidia.com/gpu": "1"}})
    pod["spec"]["schedulerName"] = "not-served"
    status, body = create_pod(api, pod)
    assert status == 201, body


def test_kubectl_debug_cannot_attach_a_container_that_sees_every_gpu(api, webhook):
    """kubectl debug's container goes through pods/ephemeralcontainers, which kube-apiserver
    sends to the export's ephemeral.slices... webhook (kubernetes/kubernetes#101034: an UPDATE
    whose object is the whole Pod, Kubernetes >= 1.22)."""
    _running(api, NAMESPACE, "serve-x7k2p-1")
    base = {"name": "debugger-x1", "image": "nvidia/cuda:12.4.1-base-ubuntu22.04", "stdin": True}
    hook = "ephemeral.slices.webhook.fracspawner.io"

    def debug(namespace: str, debugger: dict[str, Any], dry_run: bool = True) -> Any:
        return add_ephemeral(api, namespace, "serve-x7k2p-1", debugger, dry_run=dry_run)

    status, body = debug(NAMESPACE, {**base, "env": env_of("all")})
    message = denied(body, hook)
    assert message and "container debugger-x1: NVIDIA_VISIBLE_DEVICES=all" in message, body
    env_from = {**base, "envFrom": [{"configMapRef": {"name": "settings"}}]}
    status, body = debug(NAMESPACE, env_from)
    message = denied(body, hook)
    assert message and "envFrom" in message, body
    # a plain debugging container is let through, unchanged
    plain = {**base, "env": env_of("void")}
    status, out = debug(NAMESPACE, plain)
    assert status == 200, out
    assert as_sent(out["spec"]["ephemeralContainers"][0], plain) == plain
    # an earlier ephemeral container is not judged again: one added before the webhook was
    # registered for its namespace
    _running(api, LATE, "serve-x7k2p-1")
    status, body = debug(LATE, {**base, "name": "old", "env": env_of("all")}, dry_run=False)
    assert status == 200, body
    register(api, webhook, "late.slices.webhook.fracspawner.io", LATE)
    status, out = debug(LATE, base)
    assert status == 200, out
    assert [c["name"] for c in out["spec"]["ephemeralContainers"]] == ["old", "debugger-x1"]


def kai_fraction_step(**spec: Any) -> dict[str, Any]:
    """A pipeline step asking KAI for half a GPU, as KAI's webhook leaves it (module
    docstring): the first container's NVIDIA_VISIBLE_DEVICES and an envFrom from KAI's
    ConfigMaps."""
    pod = other_pod(spec.pop("namespace", NAMESPACE), "half-x7k2p-1", {})
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


def test_a_kai_fraction_container_keeps_the_devices_its_binder_writes(api):
    step = kai_fraction_step()
    message, out = dry(api, step)
    assert message is None
    sent = step["spec"]["containers"][0]
    assert as_sent(out["spec"]["containers"][0], sent) == sent
    # its other containers are held to the rule
    sidecar = kai_fraction_step()
    sidecar["spec"]["containers"].append(
        {"name": "peek", "image": "busybox", "env": sidecar["spec"]["containers"][0]["env"]}
    )
    message, _ = dry(api, sidecar)
    assert message and "container peek" in message, message
    # not scheduled by KAI, nobody writes that ConfigMap: the tenant's own says what it likes
    stray = kai_fraction_step(schedulerName="default-scheduler")
    assert dry(api, stray)[0]


@pytest.fixture(scope="module")
def hiding(devcluster, webhook, tmp_path_factory):
    """kube-apiserver calling the webhook as the chart runs it (--override-visible-devices
    all) for HIDING's pods."""
    folder = tmp_path_factory.mktemp("hiding")
    process = WebhookProcess(
        webhook.catalog,
        devcluster.kubeconfig,
        make_tls(folder / "tls"),
        folder / "webhook.log",
        ("--detailed-refusals", "--override-visible-devices", "all"),
    )
    client = devcluster.client()
    try:
        register(client, process, "hiding.slices.webhook.fracspawner.io", HIDING)
        yield client
    finally:
        process.stop()


def test_every_container_holding_no_gpu_is_shown_none_whatever_its_image_says(hiding):
    cuda_image = {"NVIDIA_VISIBLE_DEVICES": "all", "CUDA_VERSION": "12.4.1"}  # its ENV
    step = gpu_step(GPUS[0], HIDING)  # a GPU step and a CUDA-image sidecar setting nothing
    etl = other_pod(HIDING, "etl-x7k2p-2", {})
    mine = gpu_step(GPUS[0], HIDING, env=env_of("none"))  # says what it wants itself
    for pod in (step, etl, mine):
        message, out = dry(hiding, pod)
        assert message is None
        for before, after in zip(pod["spec"]["containers"], out["spec"]["containers"], strict=True):
            holds = "nvidia.com/gpu" in ((before.get("resources") or {}).get("limits") or {})
            seen = toolkit_devices({**cuda_image, **kubelet_env(after, {})})
            if holds:
                assert as_sent(after, before) == before  # the device plugin's value rules there
            elif before.get("env"):
                assert seen == "none"  # its own choice stands (IMEX channels: void added)
            else:
                assert toolkit_devices({**cuda_image, **kubelet_env(before, {})}) == "all"
                assert seen == "void", after
    kai = kai_fraction_step(namespace=HIDING)
    message, out = dry(hiding, kai)
    assert message is None
    sent = kai["spec"]["containers"][0]
    assert as_sent(out["spec"]["containers"][0], sent) == sent
