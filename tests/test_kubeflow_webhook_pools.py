"""Issue 28 item 9: pool access rules for every pod, as an option the chart turns on.

The real `fracspawner webhook` process, registered with the real control plane's kube-apiserver
by the MutatingWebhookConfiguration the export writes (kubeflow_support.register), once per
mode for a namespace of its own; pods are dry-run created through the API and the refusal read
as kube-apiserver passes it to the user. The demo
catalog: the default rule may use pool h100 only (node selector gpu: "on", HAMi), a100-mig's
nodes carry nvidia.com/gpu.product: NVIDIA-A100-SXM4-80GB and expose nvidia.com/mig-*
resources, t4's nodes are time-sliced `nvidia.com/gpu` replicas. A pod lands only on nodes
whose labels its nodeSelector names and whose extended resources it asks for (the scheduler's
NodeAffinity and NodeResourcesFit plugins), so the pools a pod could run on follow from those
two.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.chart_support import objects, one, render
from tests.kubeflow_support import (
    WebhookProcess,
    create_pod,
    denied,
    make_tls,
    other_pod,
    profile_namespace,
    register,
)

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "examples" / "catalogs" / "demo.yaml"
PROFILE = {"app.kubernetes.io/part-of": "kubeflow-profile"}
TOPOLOGY = {"nodes": [{"name": "cpu-1", "capacity": {"cpu": "8", "memory": "32Gi"}}]}
#: the namespace whose pods go to the webhook run with --enforce-pool-access MODE
NAMESPACES = {"all-pods": "pinned", "notebooks": "pinned-loose"}
EIGHTH = {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "12", "nvidia.com/gpucores": "12"}


@pytest.fixture(scope="module")
def webhooks(devcluster, tmp_path_factory):
    """kube-apiserver, calling the webhook of each mode for that mode's namespace."""
    client = devcluster.client()
    folder = tmp_path_factory.mktemp("pools")
    tls = make_tls(folder / "tls")
    processes = []
    try:
        for mode, namespace in NAMESPACES.items():
            profile_namespace(client, namespace, PROFILE)
            flags = ("--detailed-refusals", "--enforce-pool-access", mode)
            log = folder / f"{mode}.log"
            processes.append(WebhookProcess(DEMO, devcluster.kubeconfig, tls, log, flags))
            register(client, processes[-1], f"{namespace}.slices.webhook.fracspawner.io", namespace)
        yield client
    finally:
        for process in processes:
            process.stop()


def step(limits: dict[str, str], **spec: Any) -> dict[str, Any]:
    pod = other_pod("pinned", "train-x7k2p-1", {"limits": limits})
    pod["spec"].update(spec)
    return pod


def ask(api: Any, mode: str, pod: dict[str, Any]) -> str | None:
    """The webhook's refusal of `pod` in the namespace of `mode`, as kube-apiserver passes it
    to the user; None where it is admitted (a dry run: the pods are never created)."""
    pod["metadata"]["namespace"] = NAMESPACES[mode]
    status, body = create_pod(api, pod, dry_run=True)
    refusal = denied(body)
    assert (status == 201) == (refusal is None), (status, body)
    return refusal


def test_every_gpu_pod_keeps_to_the_namespaces_pools(webhooks):
    mig = step({"nvidia.com/mig-1g.10gb": "1"})  # only the A100 pool's nodes expose it
    # notebooks only (the webhook's default): a plain pod runs on a pool the rule forbids
    assert ask(webhooks, "notebooks", mig) is None
    refused = ask(webhooks, "all-pods", mig)
    assert refused and "could run on pool(s) a100-mig, which the namespace may not use" in refused
    assert (
        "Pools you may use: h100; pin it with that pool's nodeSelector (gpu: on for h100)"
        in refused
    )
    # HAMi's resources without a node selector: the T4 pool's nodes have nvidia.com/gpu too
    refused = ask(webhooks, "all-pods", step(dict(EIGHTH)))
    assert refused and "pool(s) t4" in refused, refused
    # pinned to the H100 pool's nodes: allowed, and counted as the 1/8 plan it is
    assert ask(webhooks, "all-pods", step(dict(EIGHTH), nodeSelector={"gpu": "on"})) is None
    # a resource no pool offers cannot be placed on a pool at all
    amd = ask(webhooks, "all-pods", step({"amd.com/gpu": "1"}, nodeSelector={"gpu": "on"}))
    assert amd and "amd.com/gpu is offered by no GPU pool" in amd, amd
    # pods asking for no GPU are not concerned
    assert ask(webhooks, "all-pods", step({"cpu": "1"})) is None


def test_a_pod_pinned_to_a_denied_pools_nodes_is_refused_whatever_it_asks(webhooks):
    """Issue 34 item 6: a nodeSelector carrying a pool's node selector puts the pod on that
    pool's nodes, whichever GPU resource it asks for: a node may expose more than the catalog's
    plans name (a mig-mixed node's unpartitioned GPUs are `nvidia.com/gpu`, HAMi's device
    plugin may run there too), so the pool is one the pod runs on, offered or not."""
    a100 = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    # the H100 pool's 1/8 (allowed, within the quota), pinned to the A100 pool's nodes too
    refused = ask(webhooks, "all-pods", step(dict(EIGHTH), nodeSelector={**a100, "gpu": "on"}))
    assert refused and "pool(s) a100-mig, which the namespace may not use" in refused, refused
    # HAMi's memory resource alone, which only the H100 pool's plans use, on the A100's nodes
    memory = {"nvidia.com/gpumem": "10240"}
    refused = ask(webhooks, "all-pods", step(dict(memory), nodeSelector=a100))
    assert refused and "pool(s) a100-mig, which the namespace may not use" in refused, refused
    # on the pool it may use, only its count is judged (HAMi gives a whole GPU for memory
    # alone: over the namespace's 0.25 quota)
    fine = ask(webhooks, "all-pods", step(dict(memory), nodeSelector={"gpu": "on"}))
    assert fine and "may not use" not in fine and "quota" in fine, fine
    assert ask(webhooks, "all-pods", step(dict(EIGHTH), nodeSelector={"gpu": "on"})) is None


def test_the_chart_enforces_pool_access_on_all_pods_by_default():
    def command(values: dict[str, Any]) -> list[str]:
        objs = objects(render({"webhook": {"enabled": True, **values}}))
        deploy = one(objs, "Deployment", "webhook")
        return deploy["spec"]["template"]["spec"]["containers"][0]["command"]

    assert "--enforce-pool-access=all-pods" in command({})
    assert "--trusted-pod-namespace=kube-system" in command({})
    # issue 28 item 6: the image's ENV is hidden too (tests/test_kubeflow_webhook_visibility.py)
    assert "--override-visible-devices=all" in command({})
    # issue 34 item 1: a GPU container's envFrom is refused unless the nodes are declared
    assert "--device-list-strategy=envvar" in command({})
    mounts = command({"deviceListStrategy": "volume-mounts"})
    assert "--device-list-strategy=volume-mounts" in mounts
    assert "--enforce-pool-access=notebooks" in command({"enforcePoolAccess": "notebooks"})
    with pytest.raises(Exception, match="enforcePoolAccess"):
        render({"webhook": {"enabled": True, "enforcePoolAccess": "everything"}})


def test_the_charts_notes_say_whose_reviews_the_webhook_cannot_verify():
    """Issue 28 item 7: without a client CA the webhook refuses pod addresses and stays
    generic; the install notes say so and where to turn verification on."""

    def notes(values: dict[str, Any]) -> str:
        return render({"webhook": {"enabled": True, **values}})["fracspawner/templates/NOTES.txt"]

    assert "set webhook.clientAuth" in notes({})
    assert "pool access rules bind every GPU pod" in notes({})
    verified = {"clientAuth": {"caSecret": "apiserver-ca", "names": [], "detailedRefusals": False}}
    assert "set webhook.clientAuth" not in notes(verified)
