"""The real Kubernetes control plane (devcluster/controlplane, issue 35): built by
`make controlplane`, started per test module with its own certificates and ports, and real in
what the Python devcluster only modelled before issue 35 deleted it: authentication and RBAC,
built-in admission (Pod Security, ResourceQuota), scheduling by kube-scheduler.
docs/controlplane.md.

Without the binary these tests skip on a developer's machine and fail in CI (tests/missing.py)."""

from __future__ import annotations

import datetime
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from devcluster.controlplane import (
    BinaryMissing,
    ControlPlane,
    ControlPlaneError,
    find_binary,
    flags,
)
from devcluster.controlplane.ports import listening_free
from devcluster.controlplane.processes import ComponentDied
from devcluster.proctree import descendants
from tests.chart_support import RELEASE, objects, render
from tests.missing import missing

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
REPO = Path(__file__).resolve().parent.parent


def _binary() -> Path:
    try:
        return find_binary()
    except BinaryMissing as err:
        missing(str(err))


@pytest.fixture(scope="module")
def cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    _binary()
    with ControlPlane.start(tmp_path_factory.mktemp("controlplane")) as running:
        yield running


def kubectl(cp: ControlPlane, *args: str, stdin: Any = None, check: bool = True):
    """kubectl (Debian's kubernetes-client) with the cluster's admin kubeconfig."""
    return subprocess.run(
        ["kubectl", f"--kubeconfig={cp.kubeconfig}", *args],
        input=None if stdin is None else json.dumps(stdin),
        capture_output=True,
        text=True,
        timeout=60,
        check=check,
    )


def eventually(probe: Callable[[], Any], what: str, timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(0.5)


def apply(cp: ControlPlane, *objs: dict) -> None:
    kubectl(cp, "apply", "-f", "-", stdin={"apiVersion": "v1", "kind": "List", "items": list(objs)})


def namespace(cp: ControlPlane, name: str, **labels: str) -> str:
    """A new namespace, once its `default` ServiceAccount exists (made by kube-controller-manager;
    the ServiceAccount admission plugin refuses pods until then)."""
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}
    kubectl(cp, "create", "-f", "-", stdin=ns)
    eventually(
        lambda: kubectl(cp, "get", "sa", "default", "-n", name, check=False).returncode == 0,
        f"namespace {name}'s default ServiceAccount",
    )
    return name


def get_json(cp: ControlPlane, *args: str) -> dict:
    return json.loads(kubectl(cp, "get", *args, "-o", "json").stdout)


def with_token(cp: ControlPlane, token: str, path: str) -> tuple[int, str]:
    """GET `path` as a bearer token's holder, verifying the apiserver against the cluster CA."""
    tls = ssl.create_default_context(cafile=str(cp.pki.ca.cert))
    req = urllib.request.Request(cp.server + path, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, context=tls, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


# --- no binary needed ------------------------------------------------------------------------
def test_the_apiserver_runs_node_rbac_and_a_default_cluster_s_admission(tmp_path: Path):
    from devcluster.controlplane.pki import make_pki

    argv = flags.kube_apiserver(make_pki(tmp_path), flags.Ports(1, 2, 3, 4, 5))
    opts = dict(a.split("=", 1) for a in argv[1:])
    assert opts["--authorization-mode"] == "Node,RBAC"
    plugins = set(opts["--enable-admission-plugins"].split(","))
    assert {"ServiceAccount", "LimitRanger", "ResourceQuota", "PodSecurity", "NodeRestriction",
            "MutatingAdmissionWebhook", "ValidatingAdmissionWebhook"} <= plugins  # fmt: skip
    assert "DRAConsumableCapacity=true" in opts["--feature-gates"]
    assert "DRAPartitionableDevices=true" in opts["--feature-gates"]
    assert opts["--runtime-config"] == "resource.k8s.io/v1=true"


def _tools(tmp_path: Path, *names: str) -> Path:
    """A PATH directory with only these tools of the machine's."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in names:
        found = subprocess.run(["bash", "-c", f"command -v {tool}"], capture_output=True, text=True)
        if found.stdout.strip() and not (bin_dir / tool).exists():
            (bin_dir / tool).symlink_to(found.stdout.strip())
    return bin_dir


BASE_TOOLS = ("bash", "dirname", "basename", "pwd", "cat", "sha256sum", "cut", "awk", "sed",
              "mkdir", "df", "tail", "mktemp", "rm", "realpath", "timeout", "grep", "sleep",
              "chmod", "mv", "head")  # fmt: skip

#: a stand-in `go`: answers what the build script asks, then fails where FAKE_GO_FAIL says
FAKE_GO = """#!/bin/bash
case "$1 $2" in
  "env GOVERSION") echo go1.26.8 ;;
  "env GOCACHE") echo "$FAKE_GOCACHE" ;;
  "env GOPROXY") echo "the-proxy" ;;
  "mod download") if [ "$FAKE_GO_FAIL" = proxy ]; then
                    echo "go: dial tcp: i/o timeout" >&2; exit 1
                  fi ;;
  "list -m") echo "2026-07-22 18:07:38 +0000 UTC" ;;
  build*) [ "$FAKE_GO_FAIL" = empty ] && exit 0  # "succeeds" without writing its output
          while [ $# -gt 0 ]; do [ "$1" = -o ] && out=$2; shift; done
          echo partial > "$out"; echo "compile: signal: killed" >&2; exit 1 ;;
esac
"""


def _build_script(tmp_path: Path, fail: str, df: str | None = None):
    """hack/build-controlplane.sh with the stand-in go (and df), its cache in tmp_path."""
    bin_dir = _tools(tmp_path, *BASE_TOOLS)
    go = bin_dir / "go"
    go.write_text(FAKE_GO)
    go.chmod(0o755)
    if df is not None:
        (bin_dir / "df").unlink()
        (bin_dir / "df").write_text(
            f"#!/bin/bash\necho 'Filesystem 1024-blocks Used Available'\necho '{df}'\n"
        )
        (bin_dir / "df").chmod(0o755)
    cache = tmp_path / "cache"
    env = {
        "PATH": str(bin_dir),
        "HOME": str(tmp_path),
        "FAKE_GO_FAIL": fail,
        "FAKE_GOCACHE": str(tmp_path / "gocache"),
        "CONTROLPLANE_CACHE": str(cache),
    }
    result = subprocess.run(
        ["bash", str(REPO / "hack" / "build-controlplane.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return result, cache


def test_the_build_says_what_is_missing_without_go(tmp_path: Path):
    """One clear line before anything starts; nothing written to the cache."""
    result = subprocess.run(
        ["bash", str(REPO / "hack" / "build-controlplane.sh")],
        env={"PATH": str(_tools(tmp_path, *BASE_TOOLS)), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "controlplane: Go is not installed; the control plane is built from Go modules "
        "(need go >= 1.26: apt-get install golang-go, or put go on PATH)"
    ]


def test_the_build_says_when_the_module_proxy_does_not_answer(tmp_path: Path):
    result, cache = _build_script(tmp_path, "proxy")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "controlplane: the Go module proxy (the-proxy) does not answer or refused a module: "
        "go: dial tcp: i/o timeout"
    ]
    assert not list(cache.rglob("*kube-controlplane*"))


def test_the_build_says_when_the_disk_is_too_small(tmp_path: Path):
    result, _ = _build_script(tmp_path, "", df="/dev/x 100 99 1048576")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"controlplane: only 1 GB free under {tmp_path / 'gocache'}; "
        "building the control plane needs >= 6 GB"
    )


def test_a_failed_build_leaves_nothing_in_the_cache(tmp_path: Path):
    """The compiler dies having written part of its output: nothing reaches the cache (the
    build writes a temporary file and renames it only when the binary runs)."""
    result, cache = _build_script(tmp_path, "build")
    assert result.returncode == 1
    assert "compile: signal: killed" in result.stderr
    assert "controlplane: build failed after" in result.stderr
    assert [p.name for p in cache.rglob("*") if p.is_file()] == []


def test_a_build_that_writes_no_binary_puts_nothing_in_the_cache(tmp_path: Path):
    """A build that exits 0 without writing its output (as one given a wrong -o path did here)
    left an empty kube-controlplane in the cache; only a binary that runs is renamed in."""
    result, cache = _build_script(tmp_path, "empty")
    assert result.returncode == 1
    assert "controlplane: the built binary does not run" in result.stderr
    assert [p.name for p in cache.rglob("*") if p.is_file()] == []


# --- against the running control plane ---------------------------------------------------------
def test_a_pod_can_be_made_in_default_as_soon_as_the_cluster_is_ready(tmp_path: Path):
    """Ready means a pod can be made: the ServiceAccount admission plugin refuses pods until the
    controller-manager has made the namespace's `default` ServiceAccount (403 'serviceaccount
    "default" not found' in 5 tests of a fresh-clone run, once the CRDs were installed while
    the controllers start)."""
    _binary()
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "first"},
           "spec": {"containers": [{"name": "c", "image": "busybox"}]}}  # fmt: skip
    with ControlPlane.start(tmp_path / "cp") as running:
        made = kubectl(running, "create", "-n", "default", "-f", "-", stdin=pod, check=False)
    assert made.returncode == 0, made.stderr


def test_kubectl_lists_namespaces_with_the_generated_kubeconfig(cp: ControlPlane):
    names = kubectl(cp, "get", "namespaces", "-o", "name").stdout.split()
    assert {"namespace/default", "namespace/kube-system", "namespace/kube-node-lease"} <= set(names)
    # the server is the pinned release (kubectl's own `version` exits 1 on the skew with
    # Debian's older client, so ask the apiserver)
    assert cp.client.get_json("/version")["gitVersion"].startswith("v1.36.")


def test_nvidia_deviceclasses_and_kubeflow_crds_are_installed(cp: ControlPlane):
    classes = get_json(cp, "deviceclasses.resource.k8s.io")["items"]
    assert {c["metadata"]["name"] for c in classes} == {"gpu.nvidia.com", "mig.nvidia.com"}
    gpu = next(c for c in classes if c["metadata"]["name"] == "gpu.nvidia.com")
    assert gpu["spec"].get("extendedResourceName") == "nvidia.com/gpu"  # DRAExtendedResource on
    crds = {c["spec"]["names"]["kind"] for c in get_json(cp, "crds")["items"]}
    assert {"Notebook", "PodDefault", "Profile", "WorkspaceKind", "Workspace"} <= crds
    kubectl(cp, "get", "notebooks.kubeflow.org", "-A")  # served


def _culler_rbac() -> list[dict]:
    """The chart's rendered culler ServiceAccount, Role and RoleBinding (default values)."""
    objs = objects(render())
    name = f"{RELEASE}-culler"
    picked = [
        o
        for o in objs
        if o["kind"] in ("ServiceAccount", "Role", "RoleBinding") and o["metadata"]["name"] == name
    ]
    assert {o["kind"] for o in picked} == {"ServiceAccount", "Role", "RoleBinding"}, picked
    return picked


def test_rbac_refuses_the_culler_without_pods_list(cp: ControlPlane):
    """The chart's culler Role lets its ServiceAccount list pods; the same Role without `list`
    is refused 403 by the apiserver's RBAC authoriser, which names the missing permission."""
    rbac = _culler_rbac()
    ns = namespace(cp, rbac[0]["metadata"]["namespace"])
    apply(cp, *rbac)
    sa = next(o for o in rbac if o["kind"] == "ServiceAccount")["metadata"]["name"]
    token = kubectl(cp, "create", "token", sa, "-n", ns).stdout.strip()
    pods = f"/api/v1/namespaces/{ns}/pods"
    eventually(lambda: with_token(cp, token, pods)[0] == 200, "the chart's culler Role lists pods")

    role = next(o for o in rbac if o["kind"] == "Role")
    weaker = json.loads(json.dumps(role))
    for rule in weaker["rules"]:
        rule["verbs"] = [v for v in rule["verbs"] if v != "list"]
    apply(cp, weaker)
    status, body = eventually(
        lambda: (r := with_token(cp, token, pods))[0] != 200 and r, "list refused"
    )
    assert status == 403
    message = json.loads(body)["message"]
    assert f'"system:serviceaccount:{ns}:{sa}" cannot list resource "pods"' in message


def _pod(name: str, **container: Any) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "busybox", **container}]},
    }


def test_pod_security_restricted_refuses_a_privileged_pod(cp: ControlPlane):
    namespace(cp, "restricted", **{"pod-security.kubernetes.io/enforce": "restricted"})
    pod = _pod("root", securityContext={"privileged": True})
    result = kubectl(cp, "create", "-n", "restricted", "-f", "-", stdin=pod, check=False)
    assert result.returncode != 0
    assert 'violates PodSecurity "restricted:latest"' in result.stderr
    assert "privileged" in result.stderr


def test_resource_quota_refuses_a_pod_over_the_namespace_s_gpu_quota(cp: ControlPlane):
    namespace(cp, "team")
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "gpus", "namespace": "team"},
        "spec": {"hard": {"requests.nvidia.com/gpu": "1"}},
    }
    apply(cp, quota)
    # admission refuses everything while the quota controller has not computed its usage yet
    eventually(
        lambda: get_json(cp, "resourcequota", "gpus", "-n", "team").get("status", {}).get("used"),
        "the quota controller fills in the quota's usage",
    )
    two = _pod("two-gpus", resources={"limits": {"nvidia.com/gpu": "2"}})
    result = kubectl(cp, "create", "-n", "team", "-f", "-", stdin=two, check=False)
    assert result.returncode != 0
    assert "exceeded quota: gpus" in result.stderr
    assert "requested: requests.nvidia.com/gpu=2" in result.stderr


def _node(name: str) -> dict:
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "test node"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {
            "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110", "nvidia.com/gpu": "1"},
            "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110", "nvidia.com/gpu": "1"},
            "conditions": [ready],
        },
    }


def _lease(node: str) -> dict:
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": node, "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": now},
    }


def test_kube_scheduler_binds_a_gpu_pod_to_a_registered_node(cp: ControlPlane):
    """A Node registered with nvidia.com/gpu and its heartbeat Lease (as a node agent will
    register it): kube-scheduler binds a pod asking for the GPU to it. Node status is allowed
    on create; kube-controller-manager lifts the not-ready taint the apiserver put on it."""
    apply(cp, _node("gpu-node-1"), _lease("gpu-node-1"))
    namespace(cp, "sched")
    pod = _pod("wants-gpu", resources={"limits": {"nvidia.com/gpu": "1"}})
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "gpu-node-1"}
    kubectl(cp, "create", "-n", "sched", "-f", "-", stdin=pod)
    node = eventually(
        lambda: get_json(cp, "pod", "wants-gpu", "-n", "sched")["spec"].get("nodeName"),
        "kube-scheduler binds the pod",
    )
    assert node == "gpu-node-1"


def test_kube_scheduler_allocates_a_resource_claim_from_a_published_resource_slice(
    cp: ControlPlane,
):
    """A node's ResourceSlice for NVIDIA's driver (one whole GPU) and a claim of the chart's
    gpu.nvidia.com DeviceClass: kube-scheduler allocates the device and binds the pod there."""
    node = _node("dra-node-1")
    for key in ("capacity", "allocatable"):
        del node["status"][key]["nvidia.com/gpu"]  # no device plugin: DRA only
    apply(cp, node)
    slice_ = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "dra-node-1-gpu.nvidia.com"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": "dra-node-1",
            "pool": {"name": "dra-node-1", "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": "gpu-0",
                    "attributes": {"type": {"string": "gpu"}, "productName": {"string": "H100"}},
                    "capacity": {"memory": {"value": "80Gi"}},
                }
            ],
        },
    }
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "one-gpu", "namespace": "dra"},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]
            }
        },
    }
    namespace(cp, "dra")
    apply(cp, slice_, claim)
    pod = _pod("uses-claim", resources={"claims": [{"name": "gpu"}]})
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "one-gpu"}]
    kubectl(cp, "create", "-n", "dra", "-f", "-", stdin=pod)
    bound = eventually(
        lambda: get_json(cp, "pod", "uses-claim", "-n", "dra")["spec"].get("nodeName"),
        "kube-scheduler binds the pod",
    )
    assert bound == "dra-node-1"
    allocation = get_json(cp, "resourceclaim", "one-gpu", "-n", "dra")["status"]["allocation"]
    [result] = allocation["devices"]["results"]
    assert (result["driver"], result["pool"], result["device"]) == (
        "gpu.nvidia.com",
        "dra-node-1",
        "gpu-0",
    )


def _managed(cp: ControlPlane, *args: str) -> dict:
    """kubectl get with managedFields (which kubectl leaves out unless asked)."""
    return get_json(cp, *args, "--show-managed-fields")


def _managers(obj: dict, subresource: str = "") -> set[str]:
    return {
        m["manager"]
        for m in obj["metadata"].get("managedFields", [])
        if m.get("subresource", "") == subresource
    }


def test_each_component_writes_under_its_own_manager_name(cp: ControlPlane):
    """One binary runs every component, but each names itself as its own binary does: the
    apiserver's field manager is the User-Agent's first word (apiserver
    pkg/endpoints/handlers/create.go prefixFromUserAgent), which client-go's
    DefaultKubernetesUserAgent takes from os.Args[0] (client-go rest/config.go)."""
    namespace(cp, "managers")
    # kube-scheduler writes an unschedulable pod's PodScheduled condition (pods/status)
    stuck = _pod("nowhere")
    stuck["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "no-such-node"}
    kubectl(cp, "create", "-n", "managers", "-f", "-", stdin=stuck)
    status = eventually(
        lambda: _managers(_managed(cp, "pod", "nowhere", "-n", "managers"), "status"),
        "kube-scheduler writes the pod's status",
    )
    assert status == {"kube-scheduler"}
    # kube-controller-manager's deployment controller makes the ReplicaSet, its replicaset
    # controller the pod
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "managers"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": _pod("web")["spec"],
            },
        },
    }
    apply(cp, deployment)
    [rs] = eventually(
        lambda: _managed(cp, "rs", "-n", "managers", "-l", "app=web")["items"],
        "the deployment controller makes a ReplicaSet",
    )
    assert _managers(rs) == {"kube-controller-manager"}
    [pod] = eventually(
        lambda: _managed(cp, "pod", "-n", "managers", "-l", "app=web")["items"],
        "the replicaset controller makes a pod",
    )
    assert _managers(pod) == {"kube-controller-manager"}
    # kube-apiserver reconciles the `kubernetes` Service itself
    service = _managed(cp, "service", "kubernetes", "-n", "default")
    assert _managers(service) == {"kube-apiserver"}


def test_two_clusters_side_by_side_then_nothing_left_behind(cp: ControlPlane, tmp_path: Path):
    """A second cluster starts while the first runs, on ports of its own; a component that dies
    is reported with its log; stopping ends every process and frees every port."""
    second = ControlPlane.start(tmp_path / "second")
    try:
        ports = set(vars(second.ports).values())
        assert not ports & set(vars(cp.ports).values())
        assert kubectl(second, "get", "ns", "default", "-o", "name").stdout.strip() == (
            "namespace/default"
        )
        scheduler = next(c for c in second.components if c.name == "kube-scheduler")
        os.kill(scheduler.process.pid, signal.SIGKILL)
        scheduler.process.wait(timeout=30)
        with pytest.raises(
            ComponentDied, match=r"kube-scheduler exited with status -9; last lines"
        ):
            second.check()
    finally:
        second.stop()
    procs = [c.proc for c in second.components]
    assert len(procs) == 4 and not [p for p in procs if p.alive()]
    assert all(listening_free(port) for port in ports)  # nothing listens there any more
    # the first cluster is untouched
    assert kubectl(cp, "get", "ns", "default", "-o", "name").stdout.strip() == "namespace/default"


def test_a_launcher_killed_outright_leaves_no_component_behind(tmp_path: Path):
    """`python -m devcluster.controlplane` killed with SIGKILL (no clean-up runs): its etcd,
    apiserver, scheduler and controller manager die with it (PR_SET_PDEATHSIG)."""
    _binary()
    launcher = subprocess.Popen(
        [sys.executable, "-m", "devcluster.controlplane", "--state-dir", str(tmp_path / "cp")],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        seen = []
        for line in launcher.stderr:
            seen.append(line)
            if "export KUBECONFIG=" in line:
                break
        else:
            pytest.fail("the launcher ended before it was ready:\n" + "".join(seen))
        children = descendants(launcher.pid)
        assert len(children) == 4, children
        launcher.kill()
        launcher.wait(timeout=30)
        eventually(lambda: not [p for p in children if p.alive()], "every component ends", 60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


def test_a_state_dir_that_is_not_one_is_never_emptied(tmp_path: Path):
    _binary()
    (tmp_path / "precious.txt").write_text("keep me")
    with pytest.raises(ControlPlaneError, match="refusing to empty it"):
        ControlPlane.start(tmp_path)
    assert (tmp_path / "precious.txt").read_text() == "keep me"
