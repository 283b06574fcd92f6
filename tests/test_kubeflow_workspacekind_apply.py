"""Issue 28 item 10 (the kind): `fracspawner kubeflow export --notebooks v2` without
--workspace-kind-file writes a WorkspaceKind that Debian's kubectl applies to a cluster holding
Notebooks 2.0 v2.0.0-beta.0's CRD and its sample kind.

Modelled, and from where: the WorkspaceKind CRD (tests/kubeflow_crds/workspacekinds.yaml,
written from kubeflow/notebooks v2.0.0-beta.0's kubeflow.org_workspacekinds.yaml: its
podTemplate.serviceAccount has clusterRoles only, the alpha's `name` is gone); kubectl's
strict field validation (kubectl >= 1.27 sends fieldValidation=Strict: an unknown field is a
400); a custom resource refuses an update without metadata.resourceVersion (apiextensions-
apiserver pkg/registry/customresource/strategy.go AllowUnconditionalUpdate false), while
`kubectl apply` sends a JSON merge patch for a custom resource, which needs none.
On the real control plane (issue 35) kube-apiserver does all this itself, with the CRDs its
launcher installs from the same upstream YAML (devcluster/controlplane/manifests/crds).
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.workspacekind_model import update_errors

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parent.parent
STOCK_KIND = REPO / "fracspawner" / "kubeflow" / "stock" / "workspacekind-jupyterlab.yaml"
KINDS = "/apis/kubeflow.org/v1beta1/workspacekinds"


def _sample() -> dict[str, Any]:
    """The sample kind as the upstream kustomization creates it (no identity fields)."""
    kind = copy.deepcopy(yaml.safe_load(STOCK_KIND.read_text()))
    for key in ("resourceVersion", "uid", "generation", "creationTimestamp"):
        kind["metadata"].pop(key, None)
    return kind


@pytest.fixture(scope="module")
def cluster(devcluster):
    client = devcluster.client()
    for crd in ("workspacekinds.yaml", "workspaces.yaml"):
        status, body = client.request(
            "POST",
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            yaml.safe_load((REPO / "tests" / "kubeflow_crds" / crd).read_text()),
        )
        # 409 on the real control plane: its launcher installed the upstream CRD already
        assert status in (201, 409), body
    return devcluster


def _run(args: list[str], cwd: Path, kubeconfig: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "PYTHONPATH": str(REPO)}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs kubectl (make system-deps)")
def test_the_stock_based_kind_applies_with_kubectl(cluster, tmp_path):
    client = cluster.client()
    status, body = client.request("POST", KINDS, _sample())  # the install's sample kind
    assert status == 201, body
    before = client.get(f"{KINDS}/jupyterlab")
    catalog = REPO / "examples" / "kubeflow" / "catalog.yaml"
    export = [sys.executable, "-m", "fracspawner", "kubeflow", "export", "--notebooks", "v2"]
    done = _run([*export, "--catalog", str(catalog), "-o", "out"], tmp_path, cluster.kubeconfig)
    assert done.returncode == 0, done.stderr
    readme = (tmp_path / "out" / "README.txt").read_text()
    assert "kubectl apply -f workspacekind-NAME.yaml" in readme, readme
    assert "kubectl replace" not in readme, readme
    written = tmp_path / "out" / "workspacekind-jupyterlab.yaml"
    kind = yaml.safe_load(written.read_text())
    assert "serviceAccount" not in kind["spec"]["podTemplate"], kind["spec"]["podTemplate"]
    # the alpha field the stock kind carried: kubectl's strict validation refuses it
    alpha = copy.deepcopy(kind)
    alpha["spec"]["podTemplate"]["serviceAccount"] = {"name": "default-editor"}
    (tmp_path / "alpha.yaml").write_text(yaml.safe_dump(alpha))
    refused = _run(["kubectl", "apply", "-f", "alpha.yaml"], tmp_path, cluster.kubeconfig)
    assert refused.returncode != 0 and "serviceAccount.name" in refused.stderr, refused.stderr
    # what it is for (strict field validation: an alpha field would be refused here)
    applied = _run(["kubectl", "apply", "-f", str(written)], tmp_path, cluster.kubeconfig)
    assert applied.returncode == 0, applied.stderr
    after = client.get(f"{KINDS}/jupyterlab")
    values = after["spec"]["podTemplate"]["options"]["podConfig"]["values"]
    ids = [v["id"] for v in values]
    assert ids[:3] == ["tiny_cpu", "small_cpu", "big_gpu"]  # the kind's own, kept
    assert any(i.startswith("fracspawner-") for i in ids)
    assert after["metadata"]["finalizers"] == before["metadata"]["finalizers"]
    # the kind's own validating webhook would let the change through
    assert update_errors(before, after, []) == []
    # applied again (after a catalog change, the same command): still applies
    again = _run(["kubectl", "apply", "-f", str(written)], tmp_path, cluster.kubeconfig)
    assert again.returncode == 0, again.stderr
    client.request("DELETE", f"{KINDS}/jupyterlab")


def test_an_update_without_resource_version_is_refused_as_the_api_server_does(cluster):
    """What a client that PUTs the stock-based file unchanged meets (kubectl replace fills the
    live resourceVersion in itself: cli-runtime's resource.Helper.Replace, overwrite=true)."""
    client = cluster.client()
    status, body = client.request("POST", KINDS, {**_sample(), "metadata": {"name": "bare"}})
    assert status == 201, body
    status, body = client.request(
        "PUT", f"{KINDS}/bare", {**_sample(), "metadata": {"name": "bare"}}
    )
    assert status == 422, body
    assert (
        "metadata.resourceVersion: Invalid value: 0: must be specified for an update"
        in (body["message"])
    )
    client.request("DELETE", f"{KINDS}/bare")
