"""docs/kubeflow.md's walk-throughs, run: every `$` command of "Walk-through: a stock Kubeflow"
and "Walk-through: Notebooks 2.0", in order, with Debian's kubectl against a devcluster holding
what a Kubeflow v1.11 install (and the Notebooks 2.0 beta) has: profile namespaces as the
profile controller labels and annotates them, the Notebook, PodDefault, WorkspaceKind,
Workspace and Istio AuthorizationPolicy CRDs (compact ones, tests/kubeflow_crds and
tests/devcluster_crds), and the upstream sample WorkspaceKind `jupyterlab`
(fracspawner/kubeflow/stock/workspacekind-jupyterlab.yaml). On the real control plane
(issue 35) kube-apiserver serves them, with the Kubeflow CRDs its launcher installs from their
upstream YAML (devcluster/controlplane/manifests/crds); the test adds those it lacks (Istio)."""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.workspacekind_model import update_errors

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "kubeflow.md"
EXAMPLE = REPO / "examples" / "kubeflow"
STOCK_KIND = REPO / "fracspawner" / "kubeflow" / "stock" / "workspacekind-jupyterlab.yaml"
CRDS = [
    REPO / "tests" / "devcluster_crds" / "notebooks.yaml",
    REPO / "tests" / "kubeflow_crds" / "workspaces.yaml",
    REPO / "tests" / "kubeflow_crds" / "workspacekinds.yaml",
    REPO / "tests" / "kubeflow_crds" / "poddefaults.yaml",
    REPO / "tests" / "kubeflow_crds" / "authorizationpolicies.yaml",
]
SECTIONS = ("## Walk-through: a stock Kubeflow", "## Walk-through: Notebooks 2.0")


def _namespaces() -> list[dict[str, Any]]:
    listed = yaml.safe_load((EXAMPLE / "namespaces.yaml").read_text())["items"]
    return [
        {
            "name": ns["metadata"]["name"],
            "labels": {
                k: v
                for k, v in ns["metadata"]["labels"].items()
                if k != "kubernetes.io/metadata.name"  # the devcluster adds it, as the apiserver
            },
            "annotations": ns["metadata"].get("annotations") or {},
        }
        for ns in listed
    ]


TOPOLOGY = {
    "namespaces": ["kubeflow", *_namespaces()],
    "nodes": [{"name": "cpu-1", "capacity": {"cpu": "8", "memory": "32Gi"}}],
}


def commands(doc: str) -> list[str]:
    """The `$` lines of the walk-through sections' console blocks, continuation lines joined."""
    out: list[str] = []
    for heading in SECTIONS:
        start = doc.index(heading)
        following = doc.find("\n## ", start + 1)
        section = doc[start : following if following != -1 else len(doc)]
        for block in re.findall(r"```console\n(.*?)```", section, re.S):
            lines = [line.strip() for line in block.splitlines()]
            i = 0
            while i < len(lines):
                if lines[i].startswith("$ "):
                    command = lines[i][2:]
                    while command.endswith("\\"):
                        i += 1
                        command = command[:-1].rstrip() + " " + lines[i]
                    out.append(command)
                i += 1
    return out


def test_the_walkthrough_has_the_commands_it_promises():
    found = commands(DOC.read_text())
    assert found[0].startswith("kubectl get namespaces")
    assert any(c.startswith("fracspawner kubeflow export --notebooks v2") for c in found)
    assert "kubectl replace -f kubeflow-gpu-v2/workspacekind-jupyterlab.yaml" in found


def _stock_kind() -> dict[str, Any]:
    kind = yaml.safe_load(STOCK_KIND.read_text())
    kind = copy.deepcopy(kind)
    for key in ("resourceVersion", "uid", "generation", "creationTimestamp"):
        kind["metadata"].pop(key, None)
    kind.pop("status", None)
    return kind


@pytest.fixture(scope="module")
def kubeflow_cluster(devcluster):
    client = devcluster.client()
    for crd in CRDS:
        status, body = client.request(
            "POST",
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            yaml.safe_load(crd.read_text()),
        )
        # 409 on the real control plane: its launcher installed the upstream CRD already
        assert status in (201, 409), body
    status, body = client.request(
        "POST", "/apis/kubeflow.org/v1beta1/workspacekinds", _stock_kind()
    )
    assert status == 201, body
    return devcluster


def test_every_walkthrough_command_runs_on_a_stock_install(kubeflow_cluster, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "catalog.yaml").write_text((EXAMPLE / "catalog.yaml").read_text())
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "fracspawner"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m fracspawner "$@"\n')
    wrapper.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "KUBECONFIG": str(kubeflow_cluster.kubeconfig),
        "PYTHONPATH": str(REPO),
    }
    ran = []
    for command in commands(DOC.read_text()):
        result = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", command],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, (command, result.stdout[-2000:], result.stderr[-2000:])
        ran.append((command, result.stdout))

    client = kubeflow_cluster.client()
    # v1: the PodDefaults each namespace may use, the webhook, the culler's Istio policy
    names = {
        pd["metadata"]["name"]
        for pd in client.get("/apis/kubeflow.org/v1alpha1/namespaces/cv-lab/poddefaults")["items"]
    }
    assert {"fracspawner-t4-0-25", "fracspawner-h100-0-25"} <= names
    assert not any("a100" in n for n in names)  # cv-lab may not use the MIG pool
    listed = dict(ran)["kubectl get poddefaults -n cv-lab"]
    assert "fracspawner-t4-0-25" in listed
    hooks = client.get("/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations")[
        "items"
    ]
    assert [h["metadata"]["name"] for h in hooks] == ["slices.webhook.fracspawner.io"]
    policy = client.get(
        "/apis/security.istio.io/v1/namespaces/cv-lab/authorizationpolicies/"
        "fracspawner-culler-status"
    )
    assert policy["spec"]["rules"][0]["from"][0]["source"]["principals"] == [
        "cluster.local/ns/kubeflow/sa/fracspawner-kubeflow-culler"
    ]
    # v2: the kind keeps its own podConfigs and rules and gains the catalog's
    kind = client.get("/apis/kubeflow.org/v1beta1/workspacekinds/jupyterlab")
    values = kind["spec"]["podTemplate"]["options"]["podConfig"]["values"]
    ids = [v["id"] for v in values]
    assert ids[:3] == ["tiny_cpu", "small_cpu", "big_gpu"]
    ours = [v for v in values if v["id"].startswith("fracspawner-")]
    assert ours and all(v["spec"]["resources"]["requests"]["cpu"] == "100m" for v in ours)
    assert kind["spec"]["activityRules"][-1]["match"] == {}
    assert kind["spec"]["filterRules"][0]["scope"] == "WORKSPACE_KIND"
    assert kind["metadata"]["finalizers"] == ["notebooks.kubeflow.org/workspacekind-protection"]

    # the docs' promise: the written file names the resourceVersion it was read at, so a
    # second replace of the same file (the kind changed meanwhile) is refused, 409
    again = subprocess.run(
        ["kubectl", "replace", "-f", "kubeflow-gpu-v2/workspacekind-jupyterlab.yaml"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert again.returncode != 0 and "the object has been modified" in again.stderr

    # step 4: a Workspace uses a slice, the catalog changes that slice, steps 1-3 again; what
    # the API server stores passes the kind's own webhook rules (tests/workspacekind_model.py)
    quarter = next(v["id"] for v in ours if v["id"].startswith("fracspawner-h100-0-25-"))
    workspace = {
        "apiVersion": "kubeflow.org/v1beta1",
        "kind": "Workspace",
        "metadata": {"name": "resnet", "namespace": "cv-lab"},
        "spec": {
            "kind": "jupyterlab",
            "podTemplate": {
                "volumes": {"home": "resnet-home"},
                "options": {"imageConfig": "jupyter-scipy:v1.10.0", "podConfig": quarter},
            },
        },
    }
    status, body = client.request(
        "POST", "/apis/kubeflow.org/v1beta1/namespaces/cv-lab/workspaces", workspace
    )
    assert status == 201, body
    catalog = yaml.safe_load((work / "catalog.yaml").read_text())
    catalog["pools"]["h100"]["node_selector"] = {"gpu": "h100"}
    (work / "catalog.yaml").write_text(yaml.safe_dump(catalog))
    v2 = commands(DOC.read_text())
    v2 = v2[[c.startswith("kubectl get workspacekind") for c in v2].index(True) :]
    for command in v2:
        result = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", command],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, (command, result.stderr[-2000:])
    after = client.get("/apis/kubeflow.org/v1beta1/workspacekinds/jupyterlab")
    workspaces = client.get("/apis/kubeflow.org/v1beta1/workspaces")["items"]
    assert update_errors(kind, after, workspaces) == []
    by_id = {v["id"]: v for v in after["spec"]["podTemplate"]["options"]["podConfig"]["values"]}
    assert by_id[quarter]["spawner"]["hidden"] is True
    assert by_id[by_id[quarter]["redirect"]["to"]]["spec"]["nodeSelector"] == {"gpu": "h100"}
    assert "resnet" in result.stdout and quarter in result.stdout  # step 4's listing
