"""Helpers for the Kubeflow tests: a test CA and serving certificate, the real `fracspawner
webhook` process, pods as Kubeflow's Notebook controller makes them, AdmissionReviews."""

from __future__ import annotations

import base64
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from devcluster.localhub import free_port

REPO = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- TLS
def make_tls(folder: Path, hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> dict[str, Path]:
    """A test CA and a serving certificate it signed for `hosts` (devcluster.certs), as PEM
    files: {"ca", "cert", "key"}."""
    from devcluster.certs import issue, make_ca

    folder.mkdir(parents=True, exist_ok=True)
    ca = make_ca("fracspawner test CA")
    (folder / "ca.crt").write_bytes(ca.pem)
    server = issue(ca, list(hosts), folder)
    return {"ca": folder / "ca.crt", "cert": server.cert_file, "key": server.key_file}


def make_client_tls(folder: Path, name: str = "kube-apiserver") -> dict[str, Path]:
    """A client CA and a client certificate (common name `name`, extended key usage
    clientAuth) it signed, as the API server presents to webhooks from the kubeConfigFile of
    its AdmissionConfiguration: {"ca", "cert", "key"}."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    from devcluster.certs import make_ca

    folder.mkdir(parents=True, exist_ok=True)
    ca = make_ca(f"{name} client CA")
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca.key, hashes.SHA256())
    )
    out = {
        "ca": folder / "client-ca.crt",
        "cert": folder / "client.crt",
        "key": folder / "client.key",
    }
    out["ca"].write_bytes(ca.pem)
    out["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    out["key"].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return out


# --------------------------------------------------------------------------- the webhook
class WebhookProcess:
    """`python -m fracspawner webhook ...` on a loopback port, talked to over verified HTTPS.

    `args` replace the default `--detailed-refusals` (the tests stand where only the API
    server reaches the webhook); `client`: a client certificate to present (make_client_tls)."""

    def __init__(
        self,
        catalog: Path,
        kubeconfig: Path,
        tls: dict[str, Path],
        log: Path,
        args: tuple[str, ...] = ("--detailed-refusals",),
        client: dict[str, Path] | None = None,
    ):
        self.catalog = catalog
        self.tls = tls
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.context = ssl.create_default_context(cafile=str(tls["ca"]))
        if client is not None:
            self.context.load_cert_chain(str(client["cert"]), str(client["key"]))
        self.log_path = log
        self._log = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [
                sys.executable, "-m", "fracspawner", "webhook", "--catalog", str(catalog),
                "--port", str(self.port), "--address", "127.0.0.1",
                "--tls-cert", str(tls["cert"]), "--tls-key", str(tls["key"]),
                "--kubeconfig", str(kubeconfig), "--reservation-ttl", "300", *args,
            ],
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"webhook exited {self.process.returncode}:\n{self.logs()}")
            try:
                if self.request("GET", "/healthz")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"webhook did not start:\n{self.logs()}")

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        req = urllib.request.Request(self.url + path, data=body, method=method)
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=30, context=self.context) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def review(self, review: dict[str, Any]) -> dict[str, Any]:
        """The `response` of an AdmissionReview."""
        status, body = self.request("POST", "/mutate", json.dumps(review).encode())
        assert status == 200, (status, body)
        answer = json.loads(body)
        assert answer["apiVersion"] == "admission.k8s.io/v1"
        assert answer["response"]["uid"] == review["request"]["uid"]
        return answer["response"]

    def logs(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self._log.close()


def at_url(config: dict[str, Any], base: str) -> dict[str, Any]:
    """A copy of a webhook configuration whose webhooks call `base` (the local webhook process,
    e.g. https://127.0.0.1:PORT) at their Service's path instead of the Service: kube-apiserver
    reaches a Service through its ClusterIP, which nothing routes to a local process."""
    out = json.loads(json.dumps(config))
    for webhook in out["webhooks"]:
        client = webhook["clientConfig"]
        service = client.pop("service")
        client["url"] = base + service.get("path", "/")
    return out


# --------------------------------------------------------------------------- through kube-apiserver
MUTATING = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"


def apply_object(client: Any, path: str, obj: dict[str, Any]) -> None:
    """Create `obj` at `path`, or replace the one of its name there (as `kubectl apply`)."""
    status, body = client.request("POST", path, obj)
    if status == 409:
        name = obj["metadata"]["name"]
        current = client.get(f"{path}/{name}")
        meta = {**obj["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}
        status, body = client.request("PUT", f"{path}/{name}", {**obj, "metadata": meta})
    assert status in (200, 201), body


def register(
    client: Any,
    webhook: WebhookProcess,
    name: str,
    namespace: str | tuple[str, ...],
    *,
    claims: bool = False,
) -> None:
    """Register `webhook` with kube-apiserver as `fracspawner kubeflow export` writes its
    MutatingWebhookConfiguration (export.webhook_configuration, the CA of its serving
    certificate as caBundle), at its loopback URL (at_url), as configuration `name`, for the
    pods of `namespace` (one or several) only, so that differently run webhooks share a
    cluster. Returns once kube-apiserver calls it: its configuration watch takes a moment to
    see a new object."""
    from fracspawner.kubeflow.export import WebhookTarget, webhook_configuration

    ca = base64.b64encode(webhook.tls["ca"].read_bytes()).decode()
    config = at_url(webhook_configuration(WebhookTarget(ca_bundle=ca), claims), webhook.url)
    config["metadata"]["name"] = name
    namespaces = [namespace] if isinstance(namespace, str) else list(namespace)
    only = {"key": "kubernetes.io/metadata.name", "operator": "In", "values": namespaces}
    for hook in config["webhooks"]:
        selector = hook["namespaceSelector"]  # the export's own terms are kept
        hook["namespaceSelector"] = {
            **selector,
            "matchExpressions": [*selector.get("matchExpressions", []), only],
        }
    apply_object(client, MUTATING, config)
    # a GPU-less pod choosing every GPU through env: the webhook refuses it (dry run)
    probe = other_pod(namespaces[0], "probe-x7k2p-1", {})
    probe["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    deadline = time.monotonic() + 60
    while not denied(create_pod(client, probe, dry_run=True)[1]):
        assert time.monotonic() < deadline, f"kube-apiserver does not call {name} after 60 s"
        time.sleep(0.2)


def create_pod(
    client: Any, pod: dict[str, Any], *, dry_run: bool = False
) -> tuple[int, dict[str, Any]]:
    """POST `pod` to kube-apiserver, with strict field validation (as kubectl sends it);
    `dry_run`: admitted, validated and answered as it would be stored, but not stored."""
    namespace = pod["metadata"]["namespace"]
    query = "?fieldValidation=Strict" + ("&dryRun=All" if dry_run else "")
    return client.request("POST", f"/api/v1/namespaces/{namespace}/pods{query}", pod)


def add_ephemeral(
    client: Any, namespace: str, name: str, debugger: dict[str, Any], *, dry_run: bool = False
) -> tuple[int, dict[str, Any]]:
    """What `kubectl debug` sends: the pod with `debugger` appended to its ephemeral
    containers, PUT to the subresource pods/ephemeralcontainers (kubectl/pkg/cmd/debug
    debug.go debugByEphemeralContainer falls back to an update of the whole pod's spec)."""
    path = f"/api/v1/namespaces/{namespace}/pods/{name}"
    pod = client.get(path)
    pod["spec"].setdefault("ephemeralContainers", []).append(debugger)
    query = "?fieldValidation=Strict" + ("&dryRun=All" if dry_run else "")
    return client.request("PUT", f"{path}/ephemeralcontainers{query}", pod)


def denied(body: Any, webhook: str | None = None) -> str | None:
    """The webhook's own words where kube-apiserver answered that an admission webhook
    (`webhook`, if named) denied the request, else None."""
    if not isinstance(body, dict) or body.get("kind") != "Status":
        return None
    prefix = f'admission webhook "{webhook}" denied the request: ' if webhook else None
    message = body.get("message") or ""
    if (
        prefix is None
        and message.startswith("admission webhook ")
        and " denied the request: " in message
    ):
        return message.split(" denied the request: ", 1)[1]
    if prefix and message.startswith(prefix):
        return message[len(prefix) :]
    return None


def as_sent(stored: dict[str, Any], sent: dict[str, Any]) -> dict[str, Any]:
    """A container as kube-apiserver stored it, narrowed to what `sent` gave (the API server's
    defaults left out): its fields, requests only where sent (else the API server copied
    them from the limits), volume mounts less the ServiceAccount plugin's token mount."""
    out = {k: stored.get(k) for k in sent}
    if "resources" in sent and "requests" not in sent["resources"]:
        out["resources"] = {
            k: v for k, v in (stored.get("resources") or {}).items() if k != "requests"
        }
    if "volumeMounts" in sent:
        out["volumeMounts"] = [
            m
            for m in stored.get("volumeMounts") or []
            if not m["name"].startswith("kube-api-access-")
        ]
    return out


# --------------------------------------------------------------------------- Kubeflow objects
def profile_namespace(client: Any, name: str, labels: dict[str, str]) -> None:
    """A profile namespace as Kubeflow's Profile controller makes it: the namespace with its
    labels, and the ServiceAccount `default-editor` notebook and pipeline pods run as (the
    ServiceAccount admission plugin refuses a pod whose account is missing). Then it waits for
    the account `default` kube-controller-manager makes in every namespace, which pods that name
    none run as."""
    status, body = client.request(
        "POST", "/api/v1/namespaces", {"metadata": {"name": name, "labels": labels}}
    )
    assert status == 201, body
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default-editor"}}
    status, body = client.request("POST", f"/api/v1/namespaces/{name}/serviceaccounts", account)
    assert status == 201, body
    deadline = time.monotonic() + 60
    while client.request("GET", f"/api/v1/namespaces/{name}/serviceaccounts/default")[0] != 200:
        assert time.monotonic() < deadline, f"no ServiceAccount default in {name} after 60 s"
        time.sleep(0.2)


def notebook_pod(
    namespace: str, notebook: str, labels: dict[str, str] | None = None, **extra: Any
) -> dict[str, Any]:
    """The pod Kubeflow's Notebook controller makes for a JWA notebook (NB1 notebook_controller.go
    generateStatefulSet; JWA notebook_template.yaml and form.py): named <notebook>-0, the
    Notebook's labels copied (incl. the PodDefault selector label the form set), NB_PREFIX,
    port 8888 notebook-port, fsGroup 100, /dev/shm, default-editor."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{notebook}-0",
            "namespace": namespace,
            "labels": {
                "app": notebook,
                "statefulset": notebook,
                "notebook-name": notebook,
                "statefulset.kubernetes.io/pod-name": f"{notebook}-0",
                **(labels or {}),
            },
        },
        "spec": {
            "containers": [
                {
                    "name": notebook,
                    "image": "ghcr.io/kubeflow/kubeflow/notebook-servers/jupyter-scipy:v1.10.0",
                    "resources": {
                        "requests": {"cpu": "500m", "memory": "1Gi"},
                        "limits": {"cpu": "600m", "memory": "1288490188800m"},
                    },
                    "env": [{"name": "NB_PREFIX", "value": f"/notebook/{namespace}/{notebook}"}],
                    "ports": [{"containerPort": 8888, "name": "notebook-port", "protocol": "TCP"}],
                    "workingDir": "/home/jovyan",
                    "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
                    **extra,
                }
            ],
            "serviceAccountName": "default-editor",
            "securityContext": {"fsGroup": 100},
            "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
            "hostname": f"{notebook}-0",
            "subdomain": notebook,
        },
    }


def workspace_pod(
    namespace: str,
    workspace: str,
    pod_config: dict[str, Any],
    *,
    kind_metadata: dict[str, Any] | None = None,
    workspace_metadata: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The pod Kubeflow Notebooks 2.0 makes for a Workspace, as the real controller does
    (kubeflow/notebooks `notebooks-v2` workspaces/controller/internal/controller/
    workspace_controller.go generateStatefulSet, L976-1246 at 8b610577): labels and annotations
    from the WorkspaceKind's `podMetadata`, then the Workspace's (it wins), then
    `notebooks.kubeflow.org/workspace-name` and `statefulset`; from the podConfig's `spec` ONLY
    `resources` (on the container `main`), `nodeSelector`, `tolerations` and `affinity`: never
    its `spawner.labels`. The StatefulSet (generateName `ws-<name>-`) owns the pod `<sts>-0`;
    its controller adds the pod-name / revision labels (kubernetes pkg/controller/statefulset
    stateful_set_utils.go)."""
    sts = f"ws-{workspace}-x7k2p"
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    for metadata in (kind_metadata or {}, workspace_metadata or {}):
        labels.update(metadata.get("labels") or {})
        annotations.update(metadata.get("annotations") or {})
    labels.update({"notebooks.kubeflow.org/workspace-name": workspace, "statefulset": workspace})
    labels.update(
        {
            "controller-revision-hash": f"{sts}-6d5f8b9c7",
            "statefulset.kubernetes.io/pod-name": f"{sts}-0",
            "apps.kubernetes.io/pod-index": "0",
        }
    )
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "main",
                "image": "ghcr.io/kubeflow/kubeflow/notebook-servers/jupyter-scipy:v1.10.0",
                "imagePullPolicy": "IfNotPresent",
                "ports": [{"name": "http-8888", "containerPort": 8888, "protocol": "TCP"}],
                "env": [
                    {
                        "name": "NB_PREFIX",
                        "value": f"/workspace/connect/{namespace}/{workspace}/jupyterlab/",
                    }
                ],
                "volumeMounts": [{"name": "home-volume", "mountPath": "/home/jovyan"}],
                "resources": json.loads(json.dumps(pod_config.get("resources") or {})),
            }
        ],
        "serviceAccountName": f"ws-{workspace}",
        "volumes": [
            {"name": "home-volume", "persistentVolumeClaim": {"claimName": f"{workspace}-home"}}
        ],
        "hostname": f"{sts}-0",
    }
    for key in ("nodeSelector", "tolerations", "affinity"):
        if pod_config.get(key):
            spec[key] = json.loads(json.dumps(pod_config[key]))
    metadata: dict[str, Any] = {
        "name": f"{sts}-0",
        "namespace": namespace,
        "labels": labels,
        "ownerReferences": [
            {
                "apiVersion": "apps/v1",
                "kind": "StatefulSet",
                "name": sts,
                "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, sts)),
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }
    if annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def podconfig_spec(catalog: Any, pool: str, offer: str) -> dict[str, Any]:
    """The `spec` of the podConfig `fracspawner kubeflow export --notebooks v2` writes for an
    offer of a catalog pool (export.podconfig_value)."""
    from fracspawner.backends import plan_slice
    from fracspawner.kubeflow.export import podconfig_value
    from fracspawner.model.slices import parse_slice

    p, s = catalog.pools[pool], parse_slice(offer)
    return podconfig_value(p, s, plan_slice(s, p, None))["spec"]


def other_pod(namespace: str, name: str, resources: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A pod no notebook controller made: a Kubeflow Pipelines v2 step. KFP's Argo compiler
    gives every step the podMetadata label and annotation `pipelines.kubeflow.org/v2_component:
    "true"` (kubeflow/pipelines backend/src/v2/compiler/argocompiler/argo.go); Argo's workflow
    controller names the pod <workflow>-<template>-<hash>, labels it
    `workflows.argoproj.io/workflow` and runs the step in the container `main`
    (argoproj/argo-workflows workflow/controller/workflowpod.go)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                "workflows.argoproj.io/workflow": name.rsplit("-", 2)[0],
                "pipelines.kubeflow.org/v2_component": "true",
            },
            "annotations": {"workflows.argoproj.io/node-name": f"{name}.train"},
        },
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "python:3.11",
                    "command": ["python", "-c", "print('train')"],
                    "resources": resources,
                    **extra,
                }
            ],
            "restartPolicy": "Never",
            "serviceAccountName": "default-editor",
        },
    }


def with_poddefault(pod: dict[str, Any], pool: str, gpu: str, selector: str) -> dict[str, Any]:
    """The pod after Kubeflow's PodDefault webhook applied a fracspawner PodDefault: the
    selector label (copied from the Notebook) plus the PodDefault's spec.labels, and its
    `poddefault.admission.kubeflow.org/poddefault-<name>` annotation."""
    out = json.loads(json.dumps(pod))
    meta = out["metadata"]
    meta["labels"].update(
        {selector: "true", "fracspawner.io/pool": pool, "fracspawner.io/gpu": gpu}
    )
    meta.setdefault("annotations", {})[
        f"poddefault.admission.kubeflow.org/poddefault-{selector}"
    ] = "1"
    return out


def admission_review(
    pod: dict[str, Any],
    *,
    operation: str = "CREATE",
    old: dict[str, Any] | None = None,
    dry_run: bool = False,
) -> dict[str, Any]:
    """An AdmissionReview as the API server sends it for a pod."""
    namespace = pod["metadata"].get("namespace", "")
    request: dict[str, Any] = {
        "uid": str(uuid.uuid4()),
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
        "requestResource": {"group": "", "version": "v1", "resource": "pods"},
        "name": pod["metadata"].get("name", ""),
        "namespace": namespace,
        "operation": operation,
        "userInfo": {
            "username": "system:serviceaccount:kube-system:statefulset-controller",
            "groups": ["system:serviceaccounts", "system:authenticated"],
        },
        "object": pod,
        "oldObject": old,
        "dryRun": dry_run,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
    }
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def patched(pod: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    """The pod with the response's JSONPatch applied."""
    if "patch" not in response:
        return pod
    assert response["patchType"] == "JSONPatch"
    operations = json.loads(base64.b64decode(response["patch"]))
    return apply_json_patch(pod, operations)


def apply_json_patch(doc: Any, operations: list[dict[str, Any]]) -> Any:
    """RFC 6902 add/replace/remove, written from the RFC (independent of the webhook's code)."""
    doc = json.loads(json.dumps(doc))
    for op in operations:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        if not parts:
            doc = op["value"]
            continue
        parent = doc
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
        last = parts[-1]
        if isinstance(parent, list):
            index = len(parent) if last == "-" else int(last)
            if op["op"] == "add":
                parent.insert(index, op["value"])
            elif op["op"] == "replace":
                parent[index] = op["value"]
            else:
                del parent[index]
        elif op["op"] in ("add", "replace"):
            if op["op"] == "replace":
                assert last in parent, f"replace of a missing {op['path']}"
            parent[last] = op["value"]
        else:
            del parent[last]
    return doc


# --------------------------------------------------------------------------- comparison
def _leaves(pod: dict[str, Any], container: str | None) -> dict[str, Any]:
    """A pod as path -> value, with env keyed by name and the notebook container as `box`."""
    spec = pod["spec"]
    box = next((c for c in spec["containers"] if c["name"] == container), spec["containers"][0])
    out: dict[str, Any] = {}
    for field in ("labels", "annotations"):
        for k, v in (pod["metadata"].get(field) or {}).items():
            out[f"metadata.{field}.{k}"] = v
    for k, v in spec.items():
        if k == "containers":
            continue
        if k == "nodeSelector":
            out.update({f"spec.nodeSelector.{n}": x for n, x in v.items()})
        else:
            out[f"spec.{k}"] = json.dumps(v, sort_keys=True)
    for k, v in box.items():
        if k == "resources":
            for part in ("limits", "requests"):
                out.update({f"box.{part}.{n}": x for n, x in (v.get(part) or {}).items()})
        elif k == "env":
            out.update({f"box.env.{e['name']}": json.dumps(e, sort_keys=True) for e in v})
        elif k != "name":
            out[f"box.{k}"] = json.dumps(v, sort_keys=True)
    return out


def changes(
    before: dict[str, Any],
    after: dict[str, Any],
    container: str | None = None,
    ignore: tuple[str, ...] = ("box.env.JUPYTER_IMAGE",),
) -> dict[str, Any]:
    """What turned `before` into `after` (path -> new value, None for removed): for a plan,
    the GPU fields when `before` is the same spawn without a GPU."""
    a, b = _leaves(before, container), _leaves(after, container)
    diff = {k: b.get(k) for k in a.keys() | b.keys() if a.get(k) != b.get(k)}
    return {k: v for k, v in diff.items() if not k.startswith(ignore)}


def assert_plan_applied(
    pod: dict[str, Any], mutated: dict[str, Any], container: str, expected: dict[str, Any]
) -> None:
    """`mutated` carries exactly the GPU fields `expected` (a plan's changes), and the webhook
    changed nothing else (the slice labels may have been there already, from a PodDefault)."""
    mutated = without_admission_additions(pod, mutated)
    after = _leaves(mutated, container)
    assert {k: after.get(k) for k in expected} == expected
    before = _leaves(pod, container)
    extra = {
        k
        for k in set(changes(pod, mutated, container)) - set(expected)
        if not (k in API_DEFAULTS and k not in before)  # the API server filled them in
        and not _request_defaulted(k, before, after)
    }
    assert not extra, f"changed besides the plan: {sorted(extra)}"


def _request_defaulted(key: str, before: dict[str, Any], after: dict[str, Any]) -> bool:
    """A request the API server copied from the limit (a container's requests default to its
    limits where unset: pkg/apis/core/v1/defaults.go SetDefaults_Pod)."""
    if not key.startswith("box.requests.") or key in before:
        return False
    return after.get(key) == after.get("box.limits." + key.removeprefix("box.requests."))


#: tolerations the DefaultTolerationSeconds admission plugin adds to every pod
_DEFAULT_TOLERATIONS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


def without_admission_additions(pod: dict[str, Any], stored: dict[str, Any]) -> dict[str, Any]:
    """`stored` (what kube-apiserver answered for `pod`) less what its built-in admission and
    defaulting add to every pod, so what is left is what webhooks did: the ServiceAccount
    plugin's projected token volume `kube-api-access-*` and its mounts, DefaultTolerationSeconds'
    two tolerations, the deprecated `spec.serviceAccount` alias of serviceAccountName."""
    out = json.loads(json.dumps(stored))
    spec, sent = out["spec"], pod["spec"]
    if "serviceAccount" not in sent:
        spec.pop("serviceAccount", None)
    token = {
        v["name"] for v in spec.get("volumes") or [] if v["name"].startswith("kube-api-access-")
    } - {v["name"] for v in sent.get("volumes") or []}
    if token:
        spec["volumes"] = [v for v in spec["volumes"] if v["name"] not in token]
        if not spec["volumes"] and "volumes" not in sent:
            del spec["volumes"]
        for box in spec["containers"] + spec.get("initContainers", []):
            mounts = [m for m in box.get("volumeMounts") or [] if m["name"] not in token]
            box["volumeMounts"] = mounts
            if not mounts:
                del box["volumeMounts"]
    added = [
        t
        for t in spec.get("tolerations") or []
        if t.get("key") in _DEFAULT_TOLERATIONS and t not in (sent.get("tolerations") or [])
    ]
    if added:
        spec["tolerations"] = [t for t in spec["tolerations"] if t not in added]
        if not spec["tolerations"]:
            del spec["tolerations"]
    return out


#: fields the API server defaults on a pod it stores (pkg/apis/core/v1/defaults.go)
API_DEFAULTS = {
    "spec.restartPolicy",
    "spec.dnsPolicy",
    "spec.terminationGracePeriodSeconds",
    "spec.schedulerName",
    "spec.securityContext",
    "spec.enableServiceLinks",
    "spec.priority",
    "spec.preemptionPolicy",
    "box.terminationMessagePath",
    "box.terminationMessagePolicy",
    "box.imagePullPolicy",
}
