"""The chart's RBAC, bitten by the real apiserver (issue 35 item 3): every component of the
chart that talks to the Kubernetes API does its real work on the real control plane (with the
node agent's nodes) authenticated by a service-account token bound to exactly the RBAC the
chart renders (tests/rbac_support.py applies it), so a verb the chart forgets is a 403 here
and a failed test. The hub's ServiceAccount is z2jh's, with z2jh's hub Role beside the
chart's roles for it. Then one verb is taken away: the culler without `list` on pods is
refused by the apiserver and says so in its log; and one namespace of the Kubeflow culler's
list is left without its RoleBinding: skipped, the other culled. docs/controlplane.md "RBAC".

Without the control-plane binary these tests skip on a developer's machine and fail in CI."""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster.controlplane import ControlPlane
from devcluster.controlplane.serviceaccounts import apply
from devcluster.nodeagent import NodeAgent
from tests.chart_support import NAMESPACE, Container, objects, one, render
from tests.conftest import REPO
from tests.rbac_support import (
    CULLER,
    HUB,
    KUBEFLOW_CULLER,
    SERVICE,
    VALUES,
    WEBHOOK,
    install,
    rendered_rbac,
    without_verb,
    z2jh_hub_rbac,
)
from tests.realcluster_support import control_plane_fixture, node_agent_fixture
from tests.test_controlplane import eventually, get_json, kubectl, with_token

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
DRA_CATALOG = REPO / "examples" / "catalogs" / "dra.yaml"
DRA_TOPOLOGY = REPO / "devcluster" / "topologies" / "dra.yaml"
SERVER_LABELS = {"component": "singleuser-server"}


cp = control_plane_fixture()
#: the DRA topology's nodes ("pods do not run" mode): a CPU node and three DRA GPU nodes
agent = node_agent_fixture(DRA_TOPOLOGY)


@pytest.fixture(scope="module")
def tokens(cp: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """ServiceAccount -> a kubeconfig with its token, the chart's RBAC and z2jh's hub Role
    applied."""
    return install(cp, rendered_rbac() + z2jh_hub_rbac(), tmp_path_factory.mktemp("tokens"))


def _server_pod(cp: ControlPlane, name: str) -> dict:
    """A server pod in the release namespace as KubeSpawner labels one, Running on a node."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": SERVER_LABELS},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": "cpu-1"},
            "containers": [{"name": "notebook", "image": "quay.io/jupyter/base-notebook"}],
        },
    }
    kubectl(cp, "apply", "-f", "-", stdin=pod)
    return eventually(
        lambda: (p := get_json(cp, "pod", name, "-n", NAMESPACE))["status"].get("podIP") and p,
        f"server pod {name} running with an address",
    )


def test_every_service_account_the_chart_renders_gets_a_token(tokens: dict[str, Path]):
    assert set(tokens) == {HUB, CULLER, SERVICE, WEBHOOK, KUBEFLOW_CULLER}
    for path in tokens.values():
        assert "token:" in path.read_text() and "client-certificate" not in path.read_text()


def test_a_token_holds_its_roles_and_nothing_more(cp: ControlPlane, tokens: dict[str, Path]):
    """The hub's token reads secrets where z2jh's Role grants it (the release namespace), not
    in every namespace; the service's token lists nodes (the capacity ClusterRole), not
    secrets: the tokens are the ServiceAccounts', not the admin's."""

    def status(account: str, path: str) -> int:
        token = yaml.safe_load(tokens[account].read_text())["users"][0]["user"]["token"]
        return with_token(cp, token, path)[0]

    assert eventually(lambda: status(HUB, f"/api/v1/namespaces/{NAMESPACE}/secrets") == 200,
                      "the hub's Role is in force")  # fmt: skip
    assert status(HUB, "/api/v1/secrets") == 403
    assert eventually(lambda: status(SERVICE, "/api/v1/nodes") == 200, "the capacity role")
    assert status(SERVICE, f"/api/v1/namespaces/{NAMESPACE}/secrets") == 403


async def test_the_culler_watches_the_hubs_server_pods_with_its_token(
    cp: ControlPlane, agent: NodeAgent, tokens: dict[str, Path]
):
    """The culler's server pod watch (fracspawner/culler/serverpods.py) lists and watches
    the release namespace's server pods with the culler's token: a server pod's address is
    known, and forgotten once the pod is deleted (the watch, not the list, saw that). With
    DRA (Culler.watch_dra_claims, the chart's dra.enabled) it also lists and watches the
    namespace's ResourceClaims (its Role) and the ResourceSlices (its ClusterRole); and the
    Nodes (its ClusterRole): the node agent's node's allocatable memory, its host budget."""
    from fracspawner.culler.serverpods import ServerPods

    pod = await asyncio.to_thread(_server_pod, cp, "jupyter-ann")
    address = pod["status"]["podIP"]
    pods = ServerPods(NAMESPACE, kubeconfig=str(tokens[CULLER]), dra=True, nodes=True)
    pods.start()
    try:
        await asyncio.wait_for(pods.listed.wait(), 60)
        assert pods.known(address)
        deadline = time.monotonic() + 60
        while pods.nodes is not None and pods.nodes.mib(pod["spec"]["nodeName"]) is None:
            assert time.monotonic() < deadline and not pods.failures, pods._failures
            await asyncio.sleep(0.2)
        deadline = time.monotonic() + 60
        while not (pods.dra is not None and pods.dra._slices):  # the node agent's slices
            assert time.monotonic() < deadline and not pods.failures, pods._failures
            await asyncio.sleep(0.2)
        await asyncio.to_thread(kubectl, cp, "delete", "pod", "jupyter-ann", "-n", NAMESPACE)
        deadline = time.monotonic() + 60
        while pods.known(address):
            assert time.monotonic() < deadline, "the watch never saw the pod go"
            await asyncio.sleep(0.2)
        assert pods.failures == 0
    finally:
        await pods.stop()


def test_the_culler_without_pods_list_is_refused_and_says_so(
    cp: ControlPlane, agent: NodeAgent, tokens: dict[str, Path], tmp_path: Path
):
    """The chart's culler Role re-applied without `list` on pods: the culler, run as its
    rendered Deployment runs it with its ServiceAccount's token, is refused 403 by the
    apiserver's RBAC authoriser, and its log says so in words an admin can act on: which
    account, which verb on what, where, and what in the chart grants it. It keeps running
    and retrying, and watches again once the chart's Role is back."""
    rendered = rendered_rbac()
    full = next(o for o in rendered if o["kind"] == "Role" and o["metadata"]["name"] == CULLER)
    apply(cp.client, [without_verb(rendered, "Role", CULLER, "pods", "list")])
    account = f"system:serviceaccount:{NAMESPACE}:{CULLER}"
    token = yaml.safe_load(tokens[CULLER].read_text())["users"][0]["user"]["token"]
    pods = f"/api/v1/namespaces/{NAMESPACE}/pods"
    eventually(lambda: with_token(cp, token, pods)[0] == 403, "the authoriser sees the edit")
    culler = None
    try:
        objs = objects(render(VALUES))
        culler = Container(
            one(objs, "Deployment", "culler"),
            objs,
            tmp_path / "culler",
            secrets={("hub", "hub.services.fracspawner-culler.apiToken"): "culler-token",
                     ("hub", "hub.services.fracspawner.apiToken"): "service-token"},
            fields={"metadata.namespace": NAMESPACE},
            # in its pod the culler reads the projected token; here the same token's kubeconfig
            env={"KUBECONFIG": str(tokens[CULLER])},
        )  # fmt: skip
        line = eventually(
            lambda: next(
                (x for x in culler.output().splitlines() if "watch server pods" in x), None
            ),
            "the culler says its server pod watch failed",
        )
        assert culler.process.poll() is None, culler.output()  # no crash loop
        # only what was taken away is refused: its claims and slices watches (dra) are not
        assert "cannot watch resource" not in culler.output(), culler.output()
        assert "forbidden" in line, line
        assert f'User "{account}" cannot list resource "pods"' in line, line  # the apiserver's
        assert f"the culler's ServiceAccount {CULLER} may not list pods in namespace " \
               f"{NAMESPACE}" in line, line  # fmt: skip
        assert f"the chart's Role {CULLER}" in line, line
        assert "culler.watchServerPods" in line, line
        # the Role as the chart renders it again: the culler, still retrying, recovers; it
        # says so at its watch's first event (a server pod changing: its list already had it)
        apply(cp.client, [full])
        _server_pod(cp, "jupyter-bob")
        deadline, poke = time.monotonic() + 120, 0
        while "watching server pods again" not in culler.output():
            assert time.monotonic() < deadline, culler.output()
            poke += 1
            kubectl(cp, "label", "pod", "jupyter-bob", "-n", NAMESPACE, f"poke={poke}",
                    "--overwrite")  # fmt: skip
            time.sleep(2)
    finally:
        if culler is not None:
            culler.stop()
        apply(cp.client, [full])
        kubectl(cp, "delete", "pod", "jupyter-bob", "-n", NAMESPACE, "--ignore-not-found")


@pytest.mark.parametrize("account", [SERVICE, HUB])
async def test_the_capacity_watch_runs_on_the_service_s_and_the_hub_s_token(
    cp: ControlPlane, agent: NodeAgent, tokens: dict[str, Path], account: str
):
    """The live-capacity watch (fracspawner/capacity/watch.py) of the live-offers service and
    of FracSpawner in z2jh's hub, with a DRA catalog: nodes, pods, ResourceSlices and
    ResourceClaims listed and watched with each one's token (the chart's capacity
    ClusterRole), a node's new label seen through the watch, and no reflector refused."""
    from kubernetes_asyncio import client, config

    from fracspawner.backends import load_catalog
    from fracspawner.capacity.watch import CapacityWatcher

    saved = client.Configuration.get_default_copy()
    # what kubespawner's load_config does in the pod (in-cluster config: this token)
    await config.load_kube_config(config_file=str(tokens[account]))
    watcher = CapacityWatcher(load_catalog(DRA_CATALOG), first_load_timeout=60)
    label = f"rbac-{account}"
    try:
        await watcher.start()
        assert [r.kind for r in watcher._reflectors] == [
            "nodes", "pods", "resourceslices", "resourceclaims"
        ]  # fmt: skip
        assert watcher.freshness() == (False, 0.0), [
            (r.kind, r.failures) for r in watcher._reflectors
        ]
        assert {n.name for n in watcher.nodes()} >= {"gpu-h100-dra", "cpu-1"}
        offers = watcher.snapshot().pools["h100-dra"]
        assert offers["1/8"].total, offers  # the DRA devices, counted from the slices
        await asyncio.to_thread(kubectl, cp, "label", "node", "cpu-1", f"{label}=seen")
        deadline = time.monotonic() + 60
        while next(n for n in watcher.nodes() if n.name == "cpu-1").labels.get(label) != "seen":
            assert time.monotonic() < deadline, "the node watch never delivered the label"
            await asyncio.sleep(0.2)
        assert [(r.kind, r.failures) for r in watcher._reflectors if r.failures] == []
    finally:
        await watcher.stop()
        client.Configuration.set_default(saved)
        await asyncio.to_thread(kubectl, cp, "label", "node", "cpu-1", f"{label}-")


def _review(pod: dict, uid: str) -> bytes:
    """The AdmissionReview the apiserver sends for the notebook controller's create of `pod`."""
    meta = pod["metadata"]
    return json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": uid,
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": meta["namespace"],
                "name": meta["name"],
                "operation": "CREATE",
                "userInfo": {"username": "system:serviceaccount:kubeflow:notebook-controller"},
                "object": pod,
                "dryRun": False,
            },
        }
    ).encode()


async def test_the_webhook_admits_a_dra_notebook_with_its_token(
    cp: ControlPlane, agent: NodeAgent, tokens: dict[str, Path]
):
    """The Kubeflow webhook's own code (fracspawner/kubeflow) with the webhook's token: it
    reads the profile namespace, watches pods and ResourceClaims, makes the DRA offer's
    ResourceClaimTemplate in the profile namespace and keeps the quota reservations in
    ConfigMaps of the release namespace (created, then updated), as the chart's ClusterRole
    and Role allow."""
    from fracspawner.backends import load_catalog
    from fracspawner.capacity.apiconfig import load_configuration
    from fracspawner.kubeflow.admission import parse_review
    from fracspawner.kubeflow.cluster import Cluster
    from fracspawner.kubeflow.webhook import Webhook

    profile = "kf-team"
    await asyncio.to_thread(kubectl, cp, "create", "namespace", profile)
    cluster = Cluster(await load_configuration(str(tokens[WEBHOOK])))
    catalog = yaml.safe_load(DRA_CATALOG.read_text())
    catalog["access"] = {"default": {"pools": ["h100-dra"], "max_gpu": 0.5}}  # a quota: a ledger
    webhook = Webhook(load_catalog(catalog), cluster, ledger_namespace=NAMESPACE)
    webhook.start()
    answers = []
    try:
        for n in range(2):  # the second updates the reservation record the first created
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"nb{n}-0",
                    "namespace": profile,
                    "labels": {"notebook-name": f"nb{n}", "fracspawner.io/pool": "h100-dra",
                               "fracspawner.io/gpu": "0.125"},
                },
                "spec": {"containers": [{"name": f"nb{n}", "image": "example.org/nb:1"}]},
            }  # fmt: skip
            review = parse_review(_review(pod, f"6e4b8c1a-0000-4000-8000-00000000000{n}"))
            answers.append(await webhook.review(review))
    finally:
        await webhook.stop()
        await cluster.close()
    for answer in answers:
        assert answer["response"]["allowed"] is True, answer
        assert answer["response"].get("patch"), answer  # the slice was applied
    assert webhook.watch.failures == 0
    assert webhook.dra is not None and webhook.dra.watch._watch.failures == 0  # the claims
    templates = await asyncio.to_thread(
        get_json, cp, "resourceclaimtemplates.resource.k8s.io", "-n", profile
    )
    assert templates["items"], "the DRA offer's ResourceClaimTemplate was not made"
    records = await asyncio.to_thread(get_json, cp, "configmaps", "-n", NAMESPACE)
    assert f"fracspawner-quota.{profile}" in {c["metadata"]["name"] for c in records["items"]}


def _idle_notebook(cp: ControlPlane, ns: str) -> None:
    """In a new namespace `ns`, Notebook `idle` whose activity Kubeflow recorded two hours
    ago, and its GPU slice pod as the notebook controller's StatefulSet makes it, running."""
    from fracspawner.culler.kubeflow import rfc3339
    from tests.test_chart import SLICE_LABELS

    kubectl(cp, "create", "namespace", ns)
    eventually(
        lambda: kubectl(cp, "get", "sa", "default", "-n", ns, check=False).returncode == 0,
        f"namespace {ns}'s default ServiceAccount",
    )
    then = rfc3339(time.time() - 7200)
    notebook = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "Notebook",
        "metadata": {"name": "idle", "namespace": ns,
                     "annotations": {"notebooks.kubeflow.org/last-activity": then}},
        "spec": {"template": {"spec": {"containers": [{"name": "idle", "image": "scipy"}]}}},
    }  # fmt: skip
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "idle-0", "namespace": ns,
                     "labels": {"notebook-name": "idle", "statefulset": "idle", **SLICE_LABELS}},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": "cpu-1"},
                 "containers": [{"name": "idle", "image": "scipy"}]},
    }  # fmt: skip
    kubectl(cp, "apply", "-f", "-", stdin={"apiVersion": "v1", "kind": "List",
                                           "items": [notebook, pod]})  # fmt: skip
    eventually(
        lambda: get_json(cp, "pod", "idle-0", "-n", ns)["status"].get("phase") == "Running",
        "the notebook's pod runs",
    )


def _kubeflow_culler(kubeconfig: Path, tmp_path: Path, *args: str) -> Any:
    from fracspawner.culler.kubeflow import KubeflowCuller
    from tests.test_chart import IDLE_CATALOG

    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(yaml.safe_dump(IDLE_CATALOG))
    app = KubeflowCuller()
    app.initialize([f"--kubeconfig={kubeconfig}", f"--catalog={catalog}", "--status-url=", *args])
    return app


def test_the_kubeflow_culler_stops_an_idle_notebook_with_its_token(
    cp: ControlPlane, agent: NodeAgent, tokens: dict[str, Path], tmp_path: Path
):
    """A culling cycle of the Kubeflow culler (fracspawner/culler/kubeflow.py) with its token:
    it lists Notebooks and Workspaces and the notebooks' pods in every namespace, and stops the
    idle Notebook with a merge PATCH, as the chart's ClusterRole allows."""
    ns = "kf-idle"
    _idle_notebook(cp, ns)
    app = _kubeflow_culler(tokens[KUBEFLOW_CULLER], tmp_path)
    outcomes = asyncio.run(app.cull_once())
    done = {(o.notebook.kind, o.notebook.name) for o in outcomes
            if o.done and o.notebook.namespace == ns}  # fmt: skip
    assert done == {("Notebook", "idle")}, [(o.notebook.log_name, o.decision.reason)
                                            for o in outcomes]  # fmt: skip
    annotations = get_json(cp, "notebook", "idle", "-n", ns)["metadata"]["annotations"]
    assert "kubeflow-resource-stopped" in annotations


async def test_the_hub_spawns_and_stops_a_dra_server_with_z2jh_s_role_and_the_chart_s(
    cp: ControlPlane, agent: NodeAgent, tokens: dict[str, Path]
):
    """FracSpawner in z2jh's hub, with the hub's token (z2jh's hub Role, the chart's capacity
    ClusterRole and claim-templates Role): a spawn on the DRA pool makes the offer's
    ResourceClaimTemplate, a PVC, a Service and the pod, watches pods and events, waits for the
    pod to run (its claim allocated by kube-scheduler); stop and delete_forever remove them.
    Not exercised: secrets (kubespawner makes one only with internal_ssl)."""
    from kubernetes_asyncio import client, config

    from tests.hub_support import HubUsers, running_server

    saved = client.Configuration.get_default_copy()
    # kubespawner's load_config runs once per process (lru_cache): set the hub's token here
    await config.load_kube_config(config_file=str(tokens[HUB]))
    hub = HubUsers(
        {"FracSpawner": {"catalog_file": str(DRA_CATALOG), "namespace": NAMESPACE,
                         "storage_pvc_ensure": True, "storage_capacity": "1Gi",
                         "services_enabled": True, "start_timeout": 180}},
        live_capacity=True,
    )  # fmt: skip
    hub.kubeconfig = tokens[HUB]
    spawner = hub.spawner(hub.user("ann"))
    try:
        spawner.user_options = {"gpu": "1/8", "pool": "h100-dra"}
        spawner.server = running_server(spawner)
        url = await spawner.start()
        assert url, url
        pod = await asyncio.to_thread(get_json, cp, "pod", spawner.pod_name, "-n", NAMESPACE)
        assert pod["status"]["phase"] == "Running"
        assert pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
        made = await asyncio.to_thread(
            lambda: {kind: [o["metadata"]["name"] for o in get_json(cp, kind, "-n", NAMESPACE)
                            ["items"]]
                     for kind in ("resourceclaimtemplates.resource.k8s.io", "pvc", "services")}
        )  # fmt: skip
        assert made["resourceclaimtemplates.resource.k8s.io"], made
        assert spawner.pvc_name in made["pvc"], made
        assert spawner.pod_name in made["services"], made
        await spawner.stop()
        await spawner.delete_forever()
    finally:
        client.Configuration.set_default(saved)
    gone = await asyncio.to_thread(
        kubectl, cp, "get", "pod", spawner.pod_name, "-n", NAMESPACE, check=False
    )
    assert gone.returncode != 0 and "NotFound" in gone.stderr, gone


async def test_the_service_without_pods_watch_is_refused_and_says_which_role_grants_it(
    cp: ControlPlane, agent: NodeAgent, tokens: dict[str, Path], caplog: pytest.LogCaptureFixture
):
    """The chart's capacity ClusterRole re-applied without `watch` on pods: the service's
    capacity watch lists pods, is refused the watch 403, and logs the apiserver's words and
    the chart's ClusterRole that grants it (before: the apiserver's message alone)."""
    from kubernetes_asyncio import client, config

    from fracspawner.backends import load_catalog
    from fracspawner.capacity.watch import CapacityWatcher

    rendered = rendered_rbac()
    role = next(o for o in rendered if o["kind"] == "ClusterRole"
                and o["metadata"]["name"].endswith("-capacity"))  # fmt: skip
    await asyncio.to_thread(
        apply, cp.client, [without_verb(rendered, "ClusterRole", role["metadata"]["name"],
                                        "pods", "watch")]
    )  # fmt: skip
    token = yaml.safe_load(tokens[SERVICE].read_text())["users"][0]["user"]["token"]
    watch = "/api/v1/pods?watch=true&timeoutSeconds=1"
    await asyncio.to_thread(
        eventually, lambda: with_token(cp, token, watch)[0] == 403, "the authoriser sees it"
    )
    saved = client.Configuration.get_default_copy()
    await config.load_kube_config(config_file=str(tokens[SERVICE]))
    watcher = CapacityWatcher(load_catalog(DRA_CATALOG), first_load_timeout=30)
    caplog.set_level(logging.WARNING)
    try:
        await watcher.start()
        deadline = time.monotonic() + 60
        while not (lines := [r.getMessage() for r in caplog.records
                             if r.getMessage().startswith("Cannot watch pods")]):  # fmt: skip
            assert time.monotonic() < deadline, caplog.text
            await asyncio.sleep(0.2)
    finally:
        await watcher.stop()
        client.Configuration.set_default(saved)
        await asyncio.to_thread(apply, cp.client, [role])
    line = lines[0]
    account = f"system:serviceaccount:{NAMESPACE}:{SERVICE}"
    assert f'User "{account}" cannot watch resource "pods"' in line, line
    assert f"ServiceAccount {SERVICE} may not watch pods in any namespace" in line, line
    assert "the chart's capacity ClusterRole grants list and watch on nodes and pods" in line


def test_the_kubeflow_culler_without_notebooks_patch_is_refused_and_says_so(
    cp: ControlPlane, agent: NodeAgent, tokens: dict[str, Path], tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
):  # fmt: skip
    """The chart's kubeflow-culler ClusterRole without `patch`: the idle Notebook is not
    stopped, and the culler's log says which account may not patch what, and what grants it."""
    rendered = rendered_rbac()
    role = next(o for o in rendered if o["kind"] == "ClusterRole"
                and o["metadata"]["name"].endswith("-kubeflow-culler"))  # fmt: skip
    name = role["metadata"]["name"]
    apply(cp.client, [without_verb(rendered, "ClusterRole", name, "notebooks", "patch")])
    ns = "kf-idle-refused"
    _idle_notebook(cp, ns)
    try:
        token = yaml.safe_load(tokens[KUBEFLOW_CULLER].read_text())["users"][0]["user"]["token"]
        path = f"/apis/kubeflow.org/v1/namespaces/{ns}/notebooks/idle"
        tls = ssl.create_default_context(cafile=str(cp.pki.ca.cert))

        def patch_refused() -> bool:
            req = urllib.request.Request(
                cp.server + path,
                data=b"{}",
                method="PATCH",
                headers={
                    "Authorization": f"Bearer {token}",
                    "Content-Type": "application/merge-patch+json",
                },
            )
            try:
                urllib.request.urlopen(req, context=tls, timeout=10).close()
            except urllib.error.HTTPError as err:
                return err.code == 403
            return False

        # fmt: skip

        eventually(patch_refused, "the authoriser sees the edit")
        app = _kubeflow_culler(tokens[KUBEFLOW_CULLER], tmp_path)
        app.log.addHandler(caplog.handler)  # the application's logger does not propagate
        try:
            outcomes = asyncio.run(app.cull_once())
        finally:
            app.log.removeHandler(caplog.handler)
    finally:
        apply(cp.client, [role])
    mine = [o for o in outcomes if o.notebook.namespace == ns]
    assert mine and not any(o.done for o in mine), mine
    account = f"system:serviceaccount:{NAMESPACE}:{KUBEFLOW_CULLER}"
    line = next(r.getMessage() for r in caplog.records if "stopping" in r.getMessage())
    assert f'User "{account}" cannot patch resource "notebooks"' in line, line
    assert f"ServiceAccount {KUBEFLOW_CULLER} may not patch notebooks.kubeflow.org in " \
           f"namespace {ns}" in line, line  # fmt: skip
    assert "the chart's kubeflow-culler ClusterRole grants list and patch" in line, line
    annotations = get_json(cp, "notebook", "idle", "-n", ns)["metadata"].get("annotations") or {}
    assert "kubeflow-resource-stopped" not in annotations


def test_the_kubeflow_culler_skips_a_namespace_it_may_not_read_and_culls_the_others(
    cp: ControlPlane, agent: NodeAgent, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """kubeflowCuller.namespaces lists two namespaces, and the chart's RoleBinding is in one
    only (the other's is missing: the admin added it to the list later, or it was deleted and
    made again): the apiserver answers that namespace's lists 403. The idle Notebook of the
    namespace the culler may read is stopped; the other's is left alone; the log says which
    namespace, and the apiserver's words, once in two cycles; the gauge says it too."""
    readable, refused = "kf-ns-granted", "kf-ns-unbound"
    for ns in (readable, refused):
        _idle_notebook(cp, ns)
    # a second release of the chart (its own ServiceAccount: the module's one is bound
    # cluster-wide) whose kubeflowCuller.namespaces are the two; its RoleBinding in
    # `refused` not installed
    values = {"kubeflowCuller": {"enabled": True, "namespaces": [readable, refused]}}
    mine = [o for o in objects(render(values, name="kfns"))
            if o["kind"] in ("ServiceAccount", "ClusterRole", "RoleBinding")
            and o["metadata"]["name"].endswith("kfns-fracspawner-kubeflow-culler")]  # fmt: skip
    assert {o["metadata"].get("namespace") for o in mine if o["kind"] == "RoleBinding"} == {
        readable, refused}  # fmt: skip
    mine = [o for o in mine if o["metadata"].get("namespace") != refused]
    kubeconfig = install(cp, mine, tmp_path / "kfns")["kfns-fracspawner-kubeflow-culler"]
    token = yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]["token"]
    eventually(
        lambda: with_token(cp, token, f"/api/v1/namespaces/{readable}/pods")[0] == 200,
        "the authoriser sees the RoleBinding",
    )
    app = _kubeflow_culler(
        kubeconfig, tmp_path, f"--namespace={readable}", f"--namespace={refused}"
    )
    app.log.addHandler(caplog.handler)  # the application's logger does not propagate
    try:
        first = asyncio.run(app.cull_once())
        second = asyncio.run(app.cull_once())
    finally:
        app.log.removeHandler(caplog.handler)
    assert {(o.notebook.namespace, o.notebook.name) for o in first if o.done} == {
        (readable, "idle")}, [(o.notebook.log_name, o.decision.reason) for o in first]  # fmt: skip
    assert not any(o.notebook.namespace == refused for o in first + second)
    stopped = get_json(cp, "notebook", "idle", "-n", readable)["metadata"]["annotations"]
    assert "kubeflow-resource-stopped" in stopped
    kept = get_json(cp, "notebook", "idle", "-n", refused)["metadata"].get("annotations") or {}
    assert "kubeflow-resource-stopped" not in kept
    said = [r.getMessage() for r in caplog.records
            if r.name == app.log.name and r.levelno >= logging.WARNING]  # fmt: skip
    assert len(said) == 1, said  # once, not every cycle
    account = f"system:serviceaccount:{NAMESPACE}:kfns-fracspawner-kubeflow-culler"
    assert said[0].startswith(f"namespace {refused} cannot be read"), said
    assert f'User "{account}" cannot list resource' in said[0], said
    assert "ServiceAccount kfns-fracspawner-kubeflow-culler may not list " in said[0], said
    assert f"in namespace {refused}; the chart's kubeflow-culler ClusterRole" in said[0], said
    value = app.metrics.registry.get_sample_value
    name = "fracspawner_culler_namespace_unreadable"
    assert value(name, {"kubeflow_namespace": refused}) == 1
    assert value(name, {"kubeflow_namespace": readable}) == 0


async def test_the_webhook_without_namespaces_get_is_refused_and_says_so(
    cp: ControlPlane, agent: NodeAgent, tokens: dict[str, Path], caplog: pytest.LogCaptureFixture
):
    """The chart's webhook ClusterRole without `get` on namespaces: a slice pod's admission
    is refused to its tenant as "cannot check right now", and the webhook's log tells the admin
    which account may not get which namespace, and what in the chart grants it."""
    from fracspawner.backends import load_catalog
    from fracspawner.capacity.apiconfig import load_configuration
    from fracspawner.kubeflow.admission import parse_review
    from fracspawner.kubeflow.cluster import Cluster
    from fracspawner.kubeflow.webhook import Webhook

    rendered = rendered_rbac()
    role = next(o for o in rendered if o["kind"] == "ClusterRole"
                and o["metadata"]["name"].endswith("-webhook"))  # fmt: skip
    edited = without_verb(rendered, "ClusterRole", role["metadata"]["name"], "namespaces", "get")
    await asyncio.to_thread(apply, cp.client, [edited])
    profile = "kf-refused"
    await asyncio.to_thread(kubectl, cp, "create", "namespace", profile)
    token = yaml.safe_load(tokens[WEBHOOK].read_text())["users"][0]["user"]["token"]
    await asyncio.to_thread(
        eventually,
        lambda: with_token(cp, token, f"/api/v1/namespaces/{profile}")[0] == 403,
        "the authoriser sees the edit",
    )
    caplog.set_level(logging.WARNING)
    cluster = Cluster(await load_configuration(str(tokens[WEBHOOK])))
    catalog = yaml.safe_load(DRA_CATALOG.read_text())
    webhook = Webhook(load_catalog(catalog), cluster, ledger_namespace=NAMESPACE)
    webhook.start()
    try:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "nb-0", "namespace": profile,
                         "labels": {"notebook-name": "nb", "fracspawner.io/pool": "h100-dra",
                                    "fracspawner.io/gpu": "0.125"}},
            "spec": {"containers": [{"name": "nb", "image": "example.org/nb:1"}]},
        }  # fmt: skip
        answer = await webhook.review(
            parse_review(_review(pod, "6e4b8c1a-0000-4000-8000-0000000000ff"))
        )
    finally:
        await webhook.stop()
        await cluster.close()
        await asyncio.to_thread(apply, cp.client, [role])
    assert answer["response"]["allowed"] is False, answer
    assert "cannot check GPU access and quota right now" in answer["response"]["status"]["message"]
    account = f"system:serviceaccount:{NAMESPACE}:{WEBHOOK}"
    lines = [
        r.getMessage() for r in caplog.records if "forbidden by the API server" in r.getMessage()
    ]
    assert lines, caplog.text
    assert f'User "{account}" cannot get resource "namespaces"' in lines[0], lines
    assert f"ServiceAccount {WEBHOOK} may not get namespaces" in lines[0], lines
    assert "the chart's webhook ClusterRole grants get on namespaces" in lines[0], lines
