"""`fracspawner kubeflow export` and the catalog's `kubeflow:` section: which access rule a
profile namespace gets, what is written for Notebooks 1.x and 2.0, strict checks of every
written object (docs/kubeflow.md), and bad input exiting 2 with the path at fault.

Every written object of a kind the real control plane serves (the MutatingWebhookConfiguration,
ResourceClaimTemplates, and PodDefaults and WorkspaceKinds through the upstream CRDs its launcher
installs, devcluster/controlplane/manifests/crds) is validated by kube-apiserver itself: a
create with dryRun=All and fieldValidation=Strict (as `kubectl apply --dry-run=server`), on one
cluster for the module, started only by the tests that need it. The rest (the spawner_ui_config
fragment, Istio's AuthorizationPolicies) by fracspawner's own schemas."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from fracspawner.backends import load_catalog
from fracspawner.kubeflow.cli import main as kubeflow_main
from fracspawner.kubeflow.export import (
    NAME_LABEL,
    WEBHOOK_NAME,
    ProfileNamespace,
    export,
    filter_rules,
)
from fracspawner.kubeflow.validate import errors as schema_errors
from fracspawner.model.access import namespace_rule
from fracspawner.model.catalog import AccessRule, CatalogError

REPO = Path(__file__).resolve().parent.parent
#: the apiserver starts only for the tests that validate with it (the `apiserver` fixture)
TOPOLOGY = {"nodes": [{"name": "cpu-1", "capacity": {"cpu": "8", "memory": "32Gi"}}]}
EXAMPLES = sorted((REPO / "examples" / "catalogs").glob("*.yaml"))
#: a stock Notebooks 2.0 WorkspaceKind as `kubectl get -o yaml` prints it (the upstream sample)
STOCK_KIND = REPO / "fracspawner" / "kubeflow" / "stock" / "workspacekind-jupyterlab.yaml"

CATALOG: dict[str, Any] = {
    "pools": {
        "a100-mig": {
            "display_name": "A100 80GB (MIG)",
            "gpu": "A100-80GB",
            "backend": "mig-mixed",
            "node_selector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            ],
            "offers": ["mig-1g.10gb", "mig-3g.40gb"],
        },
        "h100": {
            "display_name": "H100 80GB (HAMi)",
            "gpu": "H100-80GB",
            "backend": "hami",
            "offers": ["1/8", "1/4", "10GiB"],
            "idle": {"server_gpu_idle": "10s"},
        },
        "t4": {"gpu": "T4", "backend": "timeslicing", "replicas": 4, "offers": ["1/4"]},
        "hub-only": {"gpu": "L4", "backend": "whole", "offers": ["1"]},
    },
    "images": {"lab": {"image": "quay.io/jupyter/scipy-notebook:latest"}},
    "access": {
        "default": {"pools": ["h100"], "max_gpu": 0.25},
        "groups": {
            "research": {"pools": "all", "max_gpu": 2},
            "vision": {"pools": ["t4"], "max_gpu": 0.5},
            "mig": {"pools": ["a100-mig"], "max_gpu": 1},
        },
    },
    "idle": {"server_gpu_idle": "2h"},
    "kubeflow": {
        "pools": ["a100-mig", "h100", "t4"],
        "namespaces": [
            {"name": "team-vision", "groups": ["vision"]},
            {"labels": {"team": "research", "tier": "gpu"}, "groups": ["research"]},
            {"owner": "carol@example.com", "groups": ["mig"]},
            {"labels": {"team": "cv"}, "groups": ["vision", "mig"]},
        ],
    },
}


@pytest.fixture(scope="module")
def catalog():
    return load_catalog(copy.deepcopy(CATALOG))


def changed(path: str, value: Any) -> dict[str, Any]:
    data = copy.deepcopy(CATALOG)
    *parents, last = path.split(".")
    node: Any = data
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    node[int(last) if isinstance(node, list) else last] = value
    return data


# --------------------------------------------------------------------------- the rule
def test_a_namespace_gets_the_rule_of_the_entries_it_matches(catalog):
    assert namespace_rule(catalog, "team-vision") == AccessRule(pools=("t4",), max_gpu=0.5)
    # labels: all of an entry's labels must be there
    research = {"team": "research", "tier": "gpu"}
    assert namespace_rule(catalog, "ml", research).pools == ("a100-mig", "h100", "t4")
    assert namespace_rule(catalog, "ml", research).max_gpu == 2
    assert namespace_rule(catalog, "ml", {"team": "research"}).pools == ("h100",)  # default
    # the profile owner, from the namespace annotation the profile controller writes
    owner = {"owner": "carol@example.com"}
    assert namespace_rule(catalog, "carol", {}, owner) == AccessRule(("a100-mig",), 1.0)
    # several entries: their groups combine like a user's groups (union, largest quota)
    both = namespace_rule(catalog, "team-vision", {"team": "cv"}, owner)
    assert both == AccessRule(pools=("a100-mig", "t4"), max_gpu=1.0)


def test_unmatched_namespaces_get_the_default_and_kubeflow_pools_limit_everyone(catalog):
    assert namespace_rule(catalog, "nobody") == AccessRule(pools=("h100",), max_gpu=0.25)
    # research may use all pools, but hub-only is not offered in Kubeflow
    research = namespace_rule(catalog, "x", {"team": "research", "tier": "gpu"})
    assert "hub-only" not in research.pools


def test_a_catalog_without_a_kubeflow_section_gives_every_namespace_the_default():
    data = copy.deepcopy(CATALOG)
    del data["kubeflow"]
    plain = load_catalog(data)
    assert namespace_rule(plain, "team-vision") == plain.access_default


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (
            "kubeflow.namespaces.1.groups",
            ["research", "nlp"],
            "kubeflow.namespaces[1].groups[1]: unknown group 'nlp'; groups: research, vision, mig",
        ),
        (
            "kubeflow.pools",
            ["h100", "a100"],
            "kubeflow.pools[1]: unknown pool 'a100'; pools: a100-mig, h100, t4, hub-only",
        ),
        ("kubeflow.namespaces.0", {"groups": ["vision"]}, "kubeflow.namespaces[0]: "),
        ("kubeflow.namespaces.0.colour", "red", "kubeflow.namespaces[0]: unknown key(s)"),
        ("kubeflow.namespaces.0.name", "Team_Vision", "kubeflow.namespaces[0].name: "),
        ("kubeflow.namespaces.1.labels", {"bad key!": "x"}, "kubeflow.namespaces[1].labels"),
        ("kubeflow.namespaces.2.groups", [], "kubeflow.namespaces[2].groups: "),
    ],
)
def test_a_bad_kubeflow_section_names_the_path(path, value, message):
    with pytest.raises(CatalogError) as exc:
        load_catalog(changed(path, value))
    assert str(exc.value).startswith(message), str(exc.value)


def test_the_export_command_exits_2_with_the_path(tmp_path):
    bad = tmp_path / "catalog.yaml"
    bad.write_text(yaml.safe_dump(changed("kubeflow.namespaces.3.groups", ["vision", "nope"])))
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "fracspawner", "kubeflow", "export", "--catalog", str(bad)]
        + ["-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "fracspawner kubeflow export: kubeflow.namespaces[3].groups[1]: unknown group 'nope'; "
        "groups: mig, research, vision"  # safe_dump sorted the keys
    )
    assert not out.exists()  # nothing half-made


# --------------------------------------------------------------------------- v1
def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _write(tmp_path: Path, data: dict[str, Any], *args: str) -> tuple[int, Path]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    cat = tmp_path / "catalog.yaml"
    cat.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    return kubeflow_main(["export", "--catalog", str(cat), "-o", str(out), *args]), out


def test_v1_writes_the_poddefaults_each_namespace_may_use(tmp_path, capsys):
    namespaces = tmp_path / "ns.yaml"
    namespaces.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "List",
                "items": [
                    {
                        "kind": "Namespace",
                        "metadata": {
                            "name": name,
                            "labels": {"app.kubernetes.io/part-of": "kubeflow-profile", **labels},
                            "annotations": {"owner": owner},
                        },
                    }
                    for name, labels, owner in [
                        ("team-vision", {}, "v@example.com"),
                        ("ml", {"team": "research", "tier": "gpu"}, "m@example.com"),
                        ("carol", {}, "carol@example.com"),
                        ("alice", {}, "alice@example.com"),
                    ]
                ]
                + [{"kind": "Namespace", "metadata": {"name": "kube-system"}}],
            }
        )
    )
    code, out = _write(tmp_path, CATALOG, "--namespaces-file", str(namespaces))
    assert code == 0
    written = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert written == {
        "README.txt",
        "mutatingwebhookconfiguration.yaml",
        "spawner_ui_config.fragment.yaml",
        "poddefaults/team-vision.yaml",
        "poddefaults/ml.yaml",
        "poddefaults/carol.yaml",
        "poddefaults/alice.yaml",
    }
    by_ns = {
        ns: [d["metadata"]["name"] for d in _docs(out / "poddefaults" / f"{ns}.yaml")]
        for ns in ("team-vision", "ml", "carol", "alice")
    }
    assert by_ns["team-vision"] == ["fracspawner-t4-0-25"]
    assert by_ns["carol"] == [
        "fracspawner-a100-mig-mig-1g-10gb",
        "fracspawner-a100-mig-mig-3g-40gb",
    ]
    assert by_ns["alice"] == [
        "fracspawner-h100-0-125",
        "fracspawner-h100-0-25",
        "fracspawner-h100-10gi",
    ]
    assert len(by_ns["ml"]) == 6  # every Kubeflow pool; hub-only is not one
    pd = _docs(out / "poddefaults" / "alice.yaml")[1]
    assert pd["metadata"]["namespace"] == "alice"
    # words the chart's template writes too (test_chart: the chart's PodDefaults are these)
    assert pd["spec"]["desc"] == "H100 80GB (HAMi) · GPU 0.25"
    # the form ticks the first matchLabels key; the PodDefault webhook then adds the slice labels
    assert pd["spec"]["selector"] == {"matchLabels": {"fracspawner-h100-0-25": "true"}}
    assert pd["spec"]["labels"] == {"fracspawner.io/pool": "h100", "fracspawner.io/gpu": "0.25"}
    readme = (out / "README.txt").read_text()
    assert "kubectl apply -f mutatingwebhookconfiguration.yaml" in readme
    assert "authorizationpolicies" not in readme  # not written: not named
    assert "no caBundle" in capsys.readouterr().err


def test_a_namespace_given_by_name_only_is_matched_by_name_and_says_so(tmp_path, capsys):
    code, out = _write(tmp_path, CATALOG, "--namespace", "team-vision", "--namespace", "carol")
    assert code == 0
    names = [d["metadata"]["name"] for d in _docs(out / "poddefaults" / "carol.yaml")]
    assert names == ["fracspawner-h100-0-125", "fracspawner-h100-0-25", "fracspawner-h100-10gi"]
    err = capsys.readouterr().err
    assert "namespace carol: its labels and owner are unknown (pass --namespaces-file)" in err


#: kinds the real control plane serves: their collection, by kind
SERVED = {
    "MutatingWebhookConfiguration": "mutatingwebhookconfigurations",
    "ResourceClaimTemplate": "resourceclaimtemplates",
    "PodDefault": "poddefaults",
    "WorkspaceKind": "workspacekinds",
}


@pytest.fixture(scope="module")
def apiserver(devcluster):
    return devcluster.client()


def server_validates(client: Any, doc: dict[str, Any]) -> None:
    """kube-apiserver accepts `doc` as `kubectl apply --dry-run=server` would create it:
    validated strictly (an unknown field is an error), CRDs' schemas and CEL rules included;
    nothing is stored. A namespaced object without a namespace goes to `default`."""
    doc = copy.deepcopy(doc)
    meta = doc["metadata"]
    for key in ("resourceVersion", "uid", "generation", "creationTimestamp", "managedFields"):
        meta.pop(key, None)  # a kind read from a cluster: created anew here
    group = doc["apiVersion"] if "/" in doc["apiVersion"] else "core/" + doc["apiVersion"]
    base = "/api/v1" if group.startswith("core/") else f"/apis/{group}"
    where = ""
    if doc["kind"] not in ("MutatingWebhookConfiguration", "WorkspaceKind"):
        namespace = meta.setdefault("namespace", "default")
        status, body = client.request("GET", f"/api/v1/namespaces/{namespace}")
        if status == 404:
            ns = {"metadata": {"name": namespace}}
            status, body = client.request("POST", "/api/v1/namespaces", ns)
            assert status in (201, 409), body
        where = f"/namespaces/{namespace}"
    path = f"{base}{where}/{SERVED[doc['kind']]}?dryRun=All&fieldValidation=Strict"
    status, body = client.request("POST", path, doc)
    message = body.get("message") if isinstance(body, dict) else body
    assert status == 201, f"{doc['kind']} {meta.get('name')}: {status} {message}"


def test_every_exported_object_passes_its_strict_schema(tmp_path, apiserver):
    seen = set()
    for i, example in enumerate(EXAMPLES + [None]):
        data = yaml.safe_load(example.read_text()) if example else CATALOG
        for notebooks in ("v1", "v2"):
            kind = ["--workspace-kind-file", str(STOCK_KIND)] if notebooks == "v2" else []
            code, out = _write(tmp_path / f"{i}{notebooks}", data, "--notebooks", notebooks, *kind)
            assert code == 0, example
            for path in out.rglob("*.yaml"):
                for doc in _docs(path):
                    if doc.get("kind") in SERVED:
                        server_validates(apiserver, doc)
                        seen.add(doc["kind"])
                    if doc.get("kind") in ("MutatingWebhookConfiguration", "ResourceClaimTemplate"):
                        continue  # fracspawner has no schema of its own for these
                    kind = None if "kind" in doc else "spawner_ui_config"
                    assert schema_errors(doc, kind) == [], (example, path.name)
    assert seen == set(SERVED)  # every served kind was written and checked


def test_the_api_server_refuses_what_the_export_must_not_write(apiserver):
    """The check above bites: an unknown field in a PodDefault (the CRD's schema, strict
    field validation), a webhook name that is no domain of three segments."""
    pd = {
        "apiVersion": "kubeflow.org/v1alpha1",
        "kind": "PodDefault",
        "metadata": {"name": "x", "namespace": "alice"},
        "spec": {"selector": {"matchLabels": {"x": "true"}}, "color": "red"},
    }
    with pytest.raises(AssertionError, match="unknown field"):
        server_validates(apiserver, pd)
    config = export(load_catalog(CATALOG)).files["mutatingwebhookconfiguration.yaml"][0][0]
    config = copy.deepcopy(config)
    config["webhooks"][0]["name"] = "nodots"
    with pytest.raises(AssertionError, match="at least three segments"):
        server_validates(apiserver, config)


def test_the_schemas_refuse_unknown_fields_and_kubeflow_limits():
    pd = {
        "apiVersion": "kubeflow.org/v1alpha1",
        "kind": "PodDefault",
        "metadata": {"name": "x", "namespace": "alice"},
        "spec": {"selector": {"matchLabels": {"x": "true"}}, "resources": {"limits": {}}},
    }
    assert any("resources" in e for e in schema_errors(pd))  # a PodDefault has no resources
    patch = {
        "apiVersion": "kubeflow.org/v1beta1",
        "kind": "WorkspaceKind",
        "metadata": {"name": "jupyterlab"},
        "spec": {
            "podTemplate": {
                "options": {
                    "podConfig": {
                        "values": [
                            {
                                "id": "a",
                                "spawner": {"displayName": "ab"},
                                "spec": {"schedulerName": "volcano"},
                            }
                        ]
                    }
                }
            },
            "activityRules": [
                {"config": {"secondsSinceActive": 15}, "effect": {"pauseWorkspace": True}}
            ],
        },
    }
    found = schema_errors(patch)
    assert any("schedulerName" in e for e in found)  # not a podConfig field in v2.0.0-beta.0
    assert any("15 is less than the minimum of 16" in e for e in found)


def test_the_spawner_ui_config_fragment_keeps_kubeflows_keys(tmp_path):
    code, out = _write(tmp_path, CATALOG)
    assert code == 0
    fragment = yaml.safe_load((out / "spawner_ui_config.fragment.yaml").read_text())
    defaults = fragment["spawnerFormDefaults"]
    assert defaults["gpus"]["value"] == {
        "vendor": "",
        "vendors": [
            {"limitsKey": "nvidia.com/mig-1g.10gb", "uiName": "MIG 1g.10gb of an A100-80GB"},
            {"limitsKey": "nvidia.com/mig-3g.40gb", "uiName": "MIG 3g.40gb of an A100-80GB"},
        ],
        "num": "none",
    }


def test_the_fragment_offers_no_placement_apart_from_the_slice(tmp_path):
    """Issue 19 item 8: per-pool `affinityConfig`/`tolerationGroup` options were picked in the
    form independently of the ticked slice (the H100 slice with the T4 pool's affinity could
    never schedule), and their default `"none"` matched no option, where upstream's form keeps
    `""` for "None" (kubeflow/notebooks notebooks-v1
    components/crud-web-apps/jupyter/frontend/src/app/pages/form/form-new/utils.ts:
    `affinityConfig: ['', []]`, `tolerationGroup: ['', []]`). The webhook gives a slice pod
    its pool's node selector and tolerations; the fragment leaves placement alone."""
    code, out = _write(tmp_path, CATALOG)
    assert code == 0
    defaults = yaml.safe_load((out / "spawner_ui_config.fragment.yaml").read_text())[
        "spawnerFormDefaults"
    ]
    assert set(defaults) == {"gpus"}
    assert "none" not in str({k: v for k, v in defaults.items() if k != "gpus"})


def test_poddefault_names_fit_kubeflows_annotation():
    """Issue 19 item 6: Kubeflow's PodDefault webhook annotates each pod it mutates with
    `poddefault.admission.kubeflow.org/poddefault-<PodDefault name>` (kubeflow/dashboard
    components/poddefaults-webhooks/main.go, applyPodDefaultsOnPod:
    `fmt.Sprintf("%s/poddefault-%s", annotationPrefix, pd.GetName())`): the annotation's name
    part ("poddefault-" + name) is at most 63 characters, so a PodDefault name is at most 52."""
    data = copy.deepcopy(CATALOG)
    long = "a-very-long-pool-name-for-the-research-cluster-h100"
    data["pools"][long] = copy.deepcopy(data["pools"]["h100"])
    data["pools"][long + "-b"] = copy.deepcopy(data["pools"]["h100"])
    data["kubeflow"]["pools"] += [long, long + "-b"]
    ml = ProfileNamespace("ml", {"team": "research", "tier": "gpu"})
    result = export(load_catalog(data), namespaces=[ml])
    pds = result.files["poddefaults/ml.yaml"][0]
    names = [pd["metadata"]["name"] for pd in pds]
    assert len(names) == len(set(names))
    assert max(len(n) for n in names) == 52
    for pd in pds:
        name = pd["metadata"]["name"]
        # the annotation key the pod gets must be a qualified name, as the apiserver checks
        # every annotation key (k8s.io/apimachinery pkg/util/validation/validation.go
        # IsQualifiedName: name part at most 63, alphanumeric at both ends)
        prefix, _, part = f"poddefault.admission.kubeflow.org/poddefault-{name}".partition("/")
        assert len(part) <= 63, part
        assert re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?", part)


def test_the_webhook_configuration_sorts_after_kubeflows_and_sends_profile_pods(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    code, out = _write(
        tmp_path, CATALOG, "--ca-bundle", str(ca), "--webhook-service", "gpu/fs-webhook"
    )
    assert code == 0
    (mwc,) = _docs(out / "mutatingwebhookconfiguration.yaml")
    assert mwc["metadata"]["name"] == WEBHOOK_NAME
    assert WEBHOOK_NAME > "poddefaults-webhook-mutating-webhook-configuration"
    hook, workspaces, others, guard, counted, ephemeral = mwc["webhooks"]
    assert guard["rules"][0]["operations"] == ["UPDATE"]
    # the pods the third webhook counts carry fracspawner.io/counted (it writes the label):
    # their updates go to the same guard (tests/test_kubeflow_guard_counted.py)
    assert counted["objectSelector"] == {
        "matchExpressions": [{"key": "fracspawner.io/counted", "operator": "Exists"}]
    }
    assert {k: v for k, v in counted.items() if k not in ("name", "objectSelector")} == {
        k: v for k, v in guard.items() if k not in ("name", "objectSelector")
    }
    # issue 28 item 6: kubectl debug's subresource, for every pod of a profile namespace
    assert ephemeral["rules"] == [
        {
            "operations": ["UPDATE"],
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "resources": ["pods/ephemeralcontainers"],
            "scope": "Namespaced",
        }
    ]
    assert "objectSelector" not in ephemeral
    assert ephemeral["namespaceSelector"] == hook["namespaceSelector"]
    assert ephemeral["clientConfig"] == hook["clientConfig"]
    assert guard["objectSelector"]["matchExpressions"][0]["key"] == "fracspawner.io/pool"
    assert hook["rules"][0]["operations"] == ["CREATE"]
    assert hook["clientConfig"]["service"] == {
        "name": "fs-webhook",
        "namespace": "gpu",
        "path": "/mutate",
        "port": 443,
    }
    assert hook["namespaceSelector"] == {
        "matchLabels": {"app.kubernetes.io/part-of": "kubeflow-profile"},
        # never kube-system nor the webhook's own namespace (self-hosted webhook deadlock)
        "matchExpressions": [
            {
                "key": "kubernetes.io/metadata.name",
                "operator": "NotIn",
                "values": ["kube-system", "gpu"],
            }
        ],
    }
    assert hook["failurePolicy"] == "Fail" and hook["reinvocationPolicy"] == "IfNeeded"
    # issue 19 item 2: notebook pods only are mapped, by the labels the controllers set
    # (kubeflow/notebooks notebook_controller.go / workspace_controller.go generateStatefulSet);
    # every other pod goes to a webhook that only counts its GPU, with the same failure policy
    not_v1 = {"key": "notebook-name", "operator": "DoesNotExist"}
    v2 = {"key": "notebooks.kubeflow.org/workspace-name", "operator": "Exists"}
    assert hook["objectSelector"] == {
        "matchExpressions": [{"key": "notebook-name", "operator": "Exists"}]
    }
    assert workspaces["objectSelector"] == {"matchExpressions": [v2, not_v1]}
    assert others["objectSelector"] == {
        "matchExpressions": [not_v1, {**v2, "operator": "DoesNotExist"}]
    }
    for one in (workspaces, others):
        assert one["rules"] == hook["rules"] and one["clientConfig"] == hook["clientConfig"]
        assert one["failurePolicy"] == "Fail" and one["reinvocationPolicy"] == "IfNeeded"
    code, out = _write(tmp_path, CATALOG, "--slice-pods-only", "--failure-policy", "Ignore")
    hook, workspaces, _, ephemeral = _docs(out / "mutatingwebhookconfiguration.yaml")[0]["webhooks"]
    assert ephemeral["failurePolicy"] == "Ignore"
    assert hook["objectSelector"]["matchExpressions"][1]["key"] == "fracspawner.io/pool"
    assert workspaces["objectSelector"]["matchExpressions"][2]["key"] == "fracspawner.io/pool"
    assert hook["failurePolicy"] == "Ignore"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--webhook-service", "noslash"], "--webhook-service 'noslash': use NAMESPACE/NAME"),
        (["--ca-bundle", "/nonexistent/ca.pem"], "--ca-bundle /nonexistent/ca.pem: No such file"),
        (["--namespaces-file", "/nonexistent.yaml"], "--namespaces-file /nonexistent.yaml"),
    ],
)
def test_bad_arguments_exit_2_and_write_nothing(tmp_path, capsys, args, message):
    code, out = _write(tmp_path, CATALOG, *args)
    assert code == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


# --------------------------------------------------------------------------- v2
def _selector_matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        value = labels.get(expr["key"])
        if expr["operator"] == "In" and value not in expr["values"]:
            return False
        if expr["operator"] == "NotIn" and value in expr["values"]:
            return False
    return True


def _denied(rules: list[dict[str, Any]], pool: str, ns_labels: dict[str, str]) -> bool:
    podconfig = {"fracspawner.io/pool": pool}
    for rule in rules:
        if rule["effect"]["api"].get("deny") and all(
            _selector_matches(m["matchPodConfig"]["selector"], podconfig)
            if "matchPodConfig" in m
            else _selector_matches(m["matchNamespace"]["selector"], ns_labels)
            for m in rule["match"]
        ):
            return True
    return False


def test_v2_filter_rules_deny_exactly_what_the_catalog_denies(catalog):
    rules, notes = filter_rules(catalog)
    assert "owner" in notes[0]
    cases = [
        ("team-vision", {}),
        ("ml", {"team": "research", "tier": "gpu"}),
        ("half", {"team": "research"}),
        ("cv", {"team": "cv"}),
        ("cv-vision", {"team": "cv"}),
        ("nobody", {}),
    ]
    for name, labels in cases:
        ns_labels = {**labels, NAME_LABEL: name}
        rule = namespace_rule(catalog, name, labels)
        for pool in ("a100-mig", "h100", "t4"):
            allowed = rule.pools is None or pool in rule.pools
            assert _denied(rules, pool, ns_labels) == (not allowed), (name, pool)
    # an owner's namespace is filtered as an unmatched one (the webhook knows better): not the
    # MIG pool only its owner entry allows, but the default's h100
    carol = {NAME_LABEL: "carol"}
    assert namespace_rule(catalog, "carol", {}, {"owner": "carol@example.com"}).pools == (
        "a100-mig",
    )
    assert [_denied(rules, p, carol) for p in ("a100-mig", "h100", "t4")] == [True, False, True]


def _stock_kind() -> dict[str, Any]:
    return yaml.safe_load(STOCK_KIND.read_text())


def _ours(kind: dict[str, Any]) -> list[dict[str, Any]]:
    values = kind["spec"]["podTemplate"]["options"]["podConfig"]["values"]
    return [v for v in values if v["id"].startswith("fracspawner-")]


def _replaced(kind: dict[str, Any], version: str) -> dict[str, Any]:
    """What the API server stores from `kubectl replace -f` (a new resourceVersion)."""
    stored = copy.deepcopy(kind)
    stored["metadata"]["resourceVersion"] = version
    return stored


def test_v2_has_a_podconfig_per_offer_and_pauses_gpu_workspaces(catalog):
    result = export(catalog, notebooks="v2", workspace_kind=_stock_kind())
    (kind,) = result.files["workspacekind-jupyterlab.yaml"][0]
    values = _ours(kind)
    assert [v["id"].rsplit("-", 1)[0] for v in values] == [
        "fracspawner-a100-mig-mig-1g-10gb",
        "fracspawner-a100-mig-mig-3g-40gb",
        "fracspawner-h100-0-125",
        "fracspawner-h100-0-25",
        "fracspawner-h100-10gi",
        "fracspawner-t4-0-25",
    ]
    quarter = values[3]
    assert quarter["spec"]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert quarter["spec"]["resources"]["limits"]["nvidia.com/gpucores"] == "25"
    mig = values[0]["spec"]
    assert mig["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    assert mig["tolerations"][0]["key"] == "nvidia.com/gpu"
    ours = [r for r in kind["spec"]["activityRules"] if r["match"].get("matchPodConfig")]
    seconds = {
        r["match"]["matchPodConfig"]["selector"]["matchLabels"]["fracspawner.io/pool"]: r["config"][
            "secondsSinceActive"
        ]
        for r in ours
    }
    assert seconds == {"a100-mig": 7200, "h100": 16, "t4": 7200}  # 10 s is below v2's minimum
    assert not [n for n in result.notes if "pool h100" in n and "podConfig cannot" in n]


def test_v2_gpu_podconfigs_keep_the_kinds_cpu_and_memory(catalog):
    """Issue 19 item 3: the Workspace controller gives the `main` container exactly the
    podConfig's `resources` (kubeflow/notebooks notebooks-v2
    workspaces/controller/internal/controller/workspace_controller.go, generateStatefulSet:
    `Resources: podConfigValue.Spec.Resources`), so a GPU podConfig with only GPU limits makes
    a pod without CPU/memory requests, which a profile's ResourceQuota on cpu/memory refuses
    (`kf-resource-quota`: kubeflow/dashboard components/profile-controller
    controllers/profile_controller.go). The kind's default podConfig (`tiny_cpu`: requests
    cpu 100m, memory 128Mi) is what its Workspaces get otherwise: every GPU podConfig keeps it."""
    (kind,) = export(catalog, notebooks="v2", workspace_kind=_stock_kind()).files[
        "workspacekind-jupyterlab.yaml"
    ][0]
    for value in _ours(kind):
        requests = value["spec"]["resources"]["requests"]
        assert requests["cpu"] == "100m" and requests["memory"] == "128Mi", value["id"]
        # and the GPU itself as the plan asks for it
        assert any(k.startswith("nvidia.com/") for k in value["spec"]["resources"]["limits"])


def test_v2_re_export_after_a_catalog_change_passes_the_kinds_own_checks(catalog, apiserver):
    """Issue 19 item 4, against the rules the real WorkspaceKind webhook applies
    (tests/workspacekind_model.py cites them) and kube-apiserver's server-side apply with the
    upstream CRD: the export is the whole kind for `kubectl replace` (activityRules and
    filterRules are atomic lists: a server-side apply of ours alone conflicts with the kind's
    owner), keeping the kind's own values and rules; a catalog change makes new podConfig ids,
    and the podConfig a running Workspace uses stays unchanged, hidden and redirected to its
    successor."""
    from tests.workspacekind_model import update_errors

    stock = _stock_kind()
    # the kind as `kubectl apply` made it (the upstream kustomization), then the patch of
    # earlier versions, server-side applied: the kind's owner holds both lists, and
    # kube-apiserver answers a conflict on each (structured-merge-diff: an atomic list is one
    # field, owned whole)
    name = stock["metadata"]["name"]
    live = copy.deepcopy(stock)
    for key in ("resourceVersion", "uid", "generation", "creationTimestamp", "finalizers"):
        live["metadata"].pop(key, None)
    kinds = "/apis/kubeflow.org/v1beta1/workspacekinds"
    status, body = apiserver.request(
        "POST", f"{kinds}?fieldManager=kubectl-client-side-apply", live
    )
    assert status == 201, body
    patch = {
        "apiVersion": "kubeflow.org/v1beta1",
        "kind": "WorkspaceKind",
        "metadata": {"name": name},
        "spec": {"activityRules": [{"config": {"secondsSinceActive": 16}}], "filterRules": []},
    }
    status, body = apiserver.request(
        "PATCH",
        f"{kinds}/{name}?fieldManager=fracspawner&dryRun=All",
        patch,
        "application/apply-patch+yaml",
    )
    assert status == 409, body
    causes = {c["field"] for c in body["details"]["causes"]}
    assert causes == {".spec.activityRules", ".spec.filterRules"}, body
    assert 'conflicts with "kubectl-client-side-apply"' in body["message"], body

    first = export(catalog, notebooks="v2", workspace_kind=stock)
    (kind1,) = first.files["workspacekind-jupyterlab.yaml"][0]
    assert kind1["metadata"]["resourceVersion"] == "4711"  # a kind changed meanwhile: 409
    assert kind1["metadata"]["finalizers"] == stock["metadata"]["finalizers"]
    assert update_errors(stock, kind1, []) == []
    own = [v for v in stock["spec"]["podTemplate"]["options"]["podConfig"]["values"]]
    assert kind1["spec"]["podTemplate"]["options"]["podConfig"]["values"][:3] == own
    for rule in stock["spec"]["activityRules"] + stock["spec"]["filterRules"]:
        assert rule in kind1["spec"]["activityRules"] + kind1["spec"]["filterRules"]
    assert kind1["spec"]["activityRules"][-1]["match"] == {}  # the catch-all stays last
    stored1 = _replaced(kind1, "4712")
    # the same catalog again: nothing changes
    again = export(catalog, notebooks="v2", workspace_kind=stored1)
    assert again.files["workspacekind-jupyterlab.yaml"][0][0]["spec"] == stored1["spec"]

    # a Workspace uses the quarter H100; then the catalog changes that slice's plan
    quarter = next(v for v in _ours(stored1) if v["id"].startswith("fracspawner-h100-0-25-"))
    workspace = {"spec": {"podTemplate": {"options": {"podConfig": quarter["id"]}}}}
    data = copy.deepcopy(CATALOG)
    data["pools"]["h100"]["node_selector"] = {"gpu": "h100"}
    changed_catalog = load_catalog(data)
    second = export(changed_catalog, notebooks="v2", workspace_kind=stored1)
    (kind2,) = second.files["workspacekind-jupyterlab.yaml"][0]
    assert update_errors(stored1, kind2, [workspace]) == []
    by_id = {v["id"]: v for v in kind2["spec"]["podTemplate"]["options"]["podConfig"]["values"]}
    old = by_id[quarter["id"]]
    assert old["spec"] == quarter["spec"] and old["spawner"]["hidden"] is True
    new = by_id[old["redirect"]["to"]]
    assert new["spec"]["nodeSelector"] == {"gpu": "h100"} and not new["spawner"].get("hidden")
    assert any("earlier fracspawner podConfig" in n for n in second.notes)
    # what earlier versions did (the same id, the new spec) is what the webhook refuses
    same_id = copy.deepcopy(kind2)
    for value in same_id["spec"]["podTemplate"]["options"]["podConfig"]["values"]:
        if value["id"] == quarter["id"]:
            value["spec"] = new["spec"]
    assert update_errors(stored1, same_id, [workspace]) == [
        f"podConfig value {quarter['id']!r} is in use and cannot be changed"
    ]


def test_v2_without_a_kind_file_extends_the_stock_kind_and_says_so(tmp_path, capsys):
    # design.md's command shape: `--notebooks v2` alone still exports, built on the stock kind.
    code, out = _write(tmp_path, CATALOG, "--notebooks", "v2")
    assert code == 0
    (kind,) = [d for d in yaml.safe_load_all((out / "workspacekind-jupyterlab.yaml").read_text())]
    assert "resourceVersion" not in kind["metadata"]  # not read from a cluster
    stock = {
        c["id"] for c in _stock_kind()["spec"]["podTemplate"]["options"]["podConfig"]["values"]
    }
    ids = {c["id"] for c in kind["spec"]["podTemplate"]["options"]["podConfig"]["values"]}
    assert stock < ids  # the kind's own podConfigs kept, the catalog's added
    assert "stock WorkspaceKind 'jupyterlab'" in (out / "README.txt").read_text()
    assert "--workspace-kind-file" in capsys.readouterr().err  # the notes, on stderr


def test_v2_refuses_a_kind_file_that_is_no_workspace_kind(tmp_path, capsys):
    bad = tmp_path / "kind.yaml"
    bad.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "ConfigMap"}))
    code, out = _write(tmp_path, CATALOG, "--notebooks", "v2", "--workspace-kind-file", str(bad))
    assert code == 2 and "not a WorkspaceKind" in capsys.readouterr().err


def test_v2_says_where_a_podconfig_is_not_enough():
    runai = load_catalog(REPO / "examples" / "catalogs" / "runai.yaml")
    notes = export(runai, notebooks="v2", workspace_kind=_stock_kind()).notes
    (note,) = [n for n in notes if n.startswith("pool a100-runai")]
    assert "gpu-fraction" in note and "schedulerName" in note and "Run the webhook" in note


def test_pools_whose_kubeflow_names_collide_are_refused():
    data = copy.deepcopy(CATALOG)
    del data["kubeflow"]
    data["pools"]["H100"] = copy.deepcopy(data["pools"]["h100"])
    with pytest.raises(ValueError, match="both become the Kubeflow name 'fracspawner-h100-0-125'"):
        export(load_catalog(data))


def test_profile_namespace_defaults():
    assert ProfileNamespace("x").described


def test_the_kubeflow_example_exports_per_namespace(tmp_path, apiserver):
    example = REPO / "examples" / "kubeflow"
    out = tmp_path / "out"
    code = kubeflow_main(
        ["export", "--catalog", str(example / "catalog.yaml"), "-o", str(out)]
        + ["--namespaces-file", str(example / "namespaces.yaml")]
    )
    assert code == 0
    pools = {
        ns: {d["spec"]["labels"]["fracspawner.io/pool"] for d in _docs(out / "poddefaults" / f)}
        for ns, f in [
            ("alice", "alice.yaml"),
            ("ml-team", "ml-team.yaml"),
            ("cv-lab", "cv-lab.yaml"),
        ]
    }
    assert pools == {
        "alice": {"h100"},
        "ml-team": {"a100-mig", "h100", "t4"},
        "cv-lab": {"h100", "t4"},
    }
    for path in out.rglob("*.yaml"):
        for doc in _docs(path):
            assert "&id" not in path.read_text()  # plain YAML, no anchors
            if doc.get("kind") in SERVED:
                server_validates(apiserver, doc)
            if doc.get("kind") not in ("MutatingWebhookConfiguration", "ResourceClaimTemplate"):
                assert schema_errors(doc, None if "kind" in doc else "spawner_ui_config") == []


# --------------------------------------------------------------------------- Istio
def _profile_policy(namespace: str, owner: str) -> dict[str, Any]:
    """`ns-owner-access-istio` as Kubeflow's profile controller writes it in every profile
    namespace (kubeflow/dashboard components/profile-controller/controllers/
    profile_controller.go getAuthorizationPolicy): the owner through the gateway (the
    kubeflow-userid header), the namespace itself, the Knative probe paths, and Kubeflow's
    notebook-controller on GET */api/kernels (its culler)."""
    return {
        "metadata": {"name": "ns-owner-access-istio", "namespace": namespace},
        "spec": {
            "action": "ALLOW",
            "rules": [
                {"when": [{"key": "request.headers[kubeflow-userid]", "values": [owner]}]},
                {"when": [{"key": "source.namespace", "values": [namespace]}]},
                {"to": [{"operation": {"paths": ["/healthz", "/metrics", "/wait-for-drain"]}}]},
                {
                    "from": [
                        {
                            "source": {
                                "principals": [
                                    "cluster.local/ns/kubeflow/sa/notebook-controller-service-account"
                                ]
                            }
                        }
                    ],
                    "to": [{"operation": {"methods": ["GET"], "paths": ["*/api/kernels"]}}],
                },
            ],
        },
    }


def _istio_match(value: str, patterns: list[str]) -> bool:
    """Istio's string match for paths and principals: exact, `*suffix`, `prefix*`, `*`
    (istio.io docs, security/authorization: "Exact match, prefix match, suffix match and
    presence match")."""
    for p in patterns:
        if p == "*" or p == value:
            return True
        if p.startswith("*") and value.endswith(p[1:]):
            return True
        if p.endswith("*") and value.startswith(p[:-1]):
            return True
    return False


def _istio_allows(policies: list[dict[str, Any]], request: dict[str, Any]) -> bool:
    """Istio's ALLOW evaluation for a workload with ALLOW policies only: the request is
    allowed when any rule of any policy in the namespace matches (rules are ORed, a rule's
    from/to/when ANDed), else denied."""
    for policy in policies:
        if policy["metadata"]["namespace"] != request["namespace"]:
            continue
        for rule in policy["spec"]["rules"]:
            ok = True
            for src in rule.get("from", []):
                ok &= _istio_match(request["principal"], src["source"].get("principals", ["*"]))
            for to in rule.get("to", []):
                op = to["operation"]
                ok &= request["method"] in op.get("methods", [request["method"]])
                ok &= _istio_match(request["path"], op.get("paths", ["*"]))
            for cond in rule.get("when", []):
                key = cond["key"]
                have = (
                    request["namespace_of_source"]
                    if key == "source.namespace"
                    else request.get("headers", {}).get(key[len("request.headers[") : -1])
                )
                ok &= have in cond["values"]
            if ok:
                return True
    return False


def test_the_culler_gets_through_a_profiles_istio_policy(tmp_path):
    """Issue 19 item 5: on a default Kubeflow install with Istio, the profile's policy lets
    only the notebook-controller's principal call a notebook from outside, so the GPU culler's
    GET /api/status is denied and it never learns any activity (Kubeflow's own culler is off:
    ENABLE_CULLING=false, kubeflow/notebooks notebooks-v1 components/notebook-controller
    config/manager/params.env). `--culler-service-account` writes the AuthorizationPolicy that
    admits exactly that request, in every profile namespace exported."""
    from fracspawner.culler.kubeflow import KubeflowCuller

    code, out = _write(
        tmp_path,
        CATALOG,
        "--namespace",
        "team-vision",
        "--culler-service-account",
        "kubeflow/fracspawner-kubeflow-culler",
    )
    assert code == 0
    ours = _docs(out / "authorizationpolicies.yaml")
    assert [p["metadata"]["namespace"] for p in ours] == ["team-vision"]
    for policy in ours:
        assert schema_errors(policy) == []
    stock = [_profile_policy("team-vision", "v@example.com")]
    v1_path = KubeflowCuller.status_url.default_value.format(
        name="resnet", namespace="team-vision", cluster_domain="cluster.local"
    ).split("cluster.local", 1)[1]
    culler = {
        "namespace": "team-vision",
        "namespace_of_source": "kubeflow",
        "principal": "cluster.local/ns/kubeflow/sa/fracspawner-kubeflow-culler",
        "method": "GET",
        "path": v1_path,
    }
    v2 = {**culler, "path": "/workspace/connect/team-vision/ws1/api/status"}
    assert not _istio_allows(stock, culler)  # what the culler met before
    assert _istio_allows(stock + ours, culler) and _istio_allows(stock + ours, v2)
    # and its kernels (a running kernel is activity): the path Istio matches, without the
    # query string (Envoy's url_path)
    from urllib.parse import urlsplit

    from fracspawner.culler.kubeflow import kernels_url

    kernels = urlsplit(kernels_url("http://x" + v1_path)).path
    assert kernels == "/notebook/team-vision/resnet/api/kernels"
    assert not _istio_allows(stock, {**culler, "path": kernels})
    assert _istio_allows(stock + ours, {**culler, "path": kernels})
    # nothing else is opened: another principal, another path, another method
    assert not _istio_allows(stock + ours, {**culler, "principal": "cluster.local/ns/x/sa/y"})
    assert not _istio_allows(
        stock + ours, {**culler, "path": "/notebook/team-vision/r/api/contents"}
    )
    assert not _istio_allows(
        stock + ours, {**culler, "path": "/notebook/team-vision/r/api/kernels/k1/interrupt"}
    )
    assert not _istio_allows(stock + ours, {**culler, "method": "POST"})
    readme = (out / "README.txt").read_text()
    assert "kubectl apply -f authorizationpolicies.yaml" in readme
    code, _ = _write(tmp_path / "bad", CATALOG, "--culler-service-account", "nonamespace")
    assert code == 2
