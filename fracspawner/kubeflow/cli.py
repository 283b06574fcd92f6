"""`fracspawner kubeflow export`: the Kubeflow objects of a catalog, written as YAML to a folder.

Nothing is written unless the whole export succeeded; bad input exits 2 with one line.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from ..backends import load_catalog
from ..model.catalog import not_utf8
from ..model.errors import CatalogError
from .export import (
    Export,
    ExportError,
    ProfileNamespace,
    WebhookTarget,
    export,
    kind_read_from_cluster,
)
from .names import PROFILE_LABEL

PROG = "fracspawner kubeflow"

APPLY_ORDER_V1 = """\
Apply in this order (docs/kubeflow.md):
  1. the webhook: its Deployment + Service (the Helm chart's webhook.enabled, or your own
     running `fracspawner webhook --catalog FILE --port N --tls-cert F --tls-key F`)
  2. kubectl apply -f mutatingwebhookconfiguration.yaml
  3. kubectl apply -f poddefaults/   (or: kubectl apply -n NAMESPACE -f poddefaults.yaml)
     and, with Istio, kubectl apply -f authorizationpolicies.yaml
  4. merge spawner_ui_config.fragment.yaml into the Jupyter web app's spawner_ui_config.yaml
     (ConfigMap jupyter-web-app-config-*; the web app rereads it within 60 s)
"""
APPLY_ORDER_V2 = """\
Apply in this order (docs/kubeflow.md):
  1. the webhook: its Deployment + Service (the Helm chart's webhook.enabled, or your own
     running `fracspawner webhook --catalog FILE --port N --tls-cert F --tls-key F`)
  2. kubectl apply -f mutatingwebhookconfiguration.yaml
{kind}     and, with Istio, kubectl apply -f authorizationpolicies.yaml
"""
#: step 3 for a kind read with --workspace-kind-file, and for the stock kind (no
#: resourceVersion: `kubectl replace` is refused, export.kind_read_from_cluster)
APPLY_KIND_READ = """\
  3. kubectl replace -f workspacekind-NAME.yaml
     (a 409 Conflict means the kind changed since it was read: get it again, export again)
"""
APPLY_KIND_STOCK = """\
  3. kubectl apply -f workspacekind-NAME.yaml
     (built on the stock kind: its podConfig values and rules become the stock kind's and the
     catalog's; export with --workspace-kind-file to keep a changed kind's own)
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Kubeflow Notebooks from the fracspawner catalog."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    ex = sub.add_parser(
        "export",
        help="write PodDefaults, a spawner_ui_config fragment or a WorkspaceKind patch, and the "
        "MutatingWebhookConfiguration",
        description="Write ready-to-apply Kubeflow objects for a catalog to a folder.",
    )
    ex.add_argument("--catalog", required=True, metavar="FILE", help="catalog YAML file")
    ex.add_argument(
        "--namespace",
        action="append",
        default=[],
        metavar="NS",
        help="a profile namespace to write PodDefaults for (repeatable; v1)",
    )
    ex.add_argument(
        "--namespaces-file",
        metavar="FILE",
        help="namespaces with their labels and annotations, as `kubectl get namespaces -o yaml` "
        "prints them: kubeflow.namespaces entries by label or owner are matched against them; "
        "without --namespace, every profile namespace in it is exported",
    )
    ex.add_argument("--notebooks", choices=("v1", "v2"), default="v1", help="Kubeflow Notebooks")
    ex.add_argument(
        "--workspace-kind-file",
        metavar="FILE",
        help="v2: the WorkspaceKind as `kubectl get workspacekind NAME -o yaml` prints it; the "
        "export is that kind with the catalog's podConfigs and rules added (default: "
        "Notebooks 2.0's stock kind 'jupyterlab')",
    )
    ex.add_argument(
        "--webhook-service",
        default="kubeflow/fracspawner-webhook",
        metavar="NS/NAME",
        help="the Service in front of `fracspawner webhook` (default kubeflow/fracspawner-webhook)",
    )
    ex.add_argument("--webhook-port", type=int, default=443, help="the Service's port")
    ca = ex.add_mutually_exclusive_group()
    ca.add_argument("--ca-bundle", metavar="FILE", help="PEM CA that signed the webhook's cert")
    ca.add_argument(
        "--inject-ca-from", metavar="NS/NAME", help="a cert-manager Certificate to take the CA from"
    )
    ex.add_argument(
        "--failure-policy",
        choices=("Fail", "Ignore"),
        default="Fail",
        help="Fail (default): pods are refused while the webhook is down; Ignore: admitted "
        "without their slice",
    )
    ex.add_argument(
        "--slice-pods-only",
        action="store_true",
        help="send only pods labelled fracspawner.io/pool to the webhook, so other pods start "
        "while it is down (MIG requests made through the form's GPU field then pass unchecked)",
    )
    ex.add_argument(
        "--culler-service-account",
        metavar="NS/NAME",
        help="write authorizationpolicies.yaml: Istio AuthorizationPolicies letting the GPU "
        "culler (`fracspawner culler kubeflow` running as this ServiceAccount, with an Istio "
        "sidecar) read the notebooks' /api/status and /api/kernels in each profile namespace",
    )
    ex.add_argument("-o", "--output", required=True, metavar="DIR", help="folder to write to")
    return parser


def _namespaces_from_file(path: Path) -> list[ProfileNamespace]:
    try:
        docs = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
    except UnicodeDecodeError as exc:
        raise ExportError(f"--namespaces-file {path}: {not_utf8(exc)}") from None
    except (OSError, yaml.YAMLError) as exc:
        raise ExportError(f"--namespaces-file {path}: {exc}") from None
    items: list[Any] = []
    for doc in docs:
        is_list = isinstance(doc, dict) and "items" in doc
        items += (doc["items"] or []) if is_list else [doc]
    out = []
    for i, item in enumerate(items):
        meta = item.get("metadata") if isinstance(item, dict) else None
        if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
            raise ExportError(f"--namespaces-file {path}: item {i} is not a Namespace")
        if item.get("kind", "Namespace") != "Namespace":
            raise ExportError(f"--namespaces-file {path}: item {i} is a {item.get('kind')}")
        out.append(
            ProfileNamespace(
                meta["name"],
                {str(k): str(v) for k, v in (meta.get("labels") or {}).items()},
                {str(k): str(v) for k, v in (meta.get("annotations") or {}).items()},
            )
        )
    return out


#: a namespace name (Kubernetes' DNS-1123 label): it names objects and the file poddefaults/NS.yaml
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def _profile_namespaces(args: argparse.Namespace) -> list[ProfileNamespace]:
    for name in args.namespace:
        if not _NAMESPACE.match(name):
            raise ExportError(
                f"--namespace {name!r}: not a namespace name (lower-case letters, digits and "
                "'-', at most 63)"
            )
    described = _namespaces_from_file(Path(args.namespaces_file)) if args.namespaces_file else []
    if not args.namespace:
        key, value = PROFILE_LABEL
        return [ns for ns in described if ns.labels.get(key) == value]
    by_name = {ns.name: ns for ns in described}
    out = []
    for name in args.namespace:
        if args.namespaces_file and name not in by_name:
            raise ExportError(f"--namespace {name}: not in {args.namespaces_file}")
        out.append(by_name.get(name) or ProfileNamespace(name, described=False))
    return out


#: Notebooks 2.0's stock `jupyterlab` WorkspaceKind (the upstream sample), for exports that do
#: not say which kind they extend.
STOCK_WORKSPACE_KIND = Path(__file__).parent / "stock" / "workspacekind-jupyterlab.yaml"


def _workspace_kind(args: argparse.Namespace, notes: list[str]) -> dict[str, Any] | None:
    if args.notebooks != "v2":
        return None
    if not args.workspace_kind_file:
        kind = yaml.safe_load(STOCK_WORKSPACE_KIND.read_text(encoding="utf-8"))
        # Not read from a cluster: nothing of a live object's identity may be sent back.
        for key in ("resourceVersion", "uid", "generation", "creationTimestamp"):
            kind["metadata"].pop(key, None)
        notes.append(
            "no --workspace-kind-file: built on Notebooks 2.0's stock WorkspaceKind "
            "'jupyterlab'; if yours differs (other podConfigs, rules or CPU/memory), export "
            "again with --workspace-kind-file from `kubectl get workspacekind NAME -o yaml`"
        )
        return kind
    path = Path(args.workspace_kind_file)
    try:
        docs = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
    except UnicodeDecodeError as exc:
        raise ExportError(f"--workspace-kind-file {path}: {not_utf8(exc)}") from None
    except (OSError, yaml.YAMLError) as exc:
        raise ExportError(f"--workspace-kind-file {path}: {exc}") from None
    if len(docs) != 1 or not isinstance(docs[0], dict):
        raise ExportError(f"--workspace-kind-file {path}: expected one WorkspaceKind")
    return docs[0]


def _service_account(value: str | None) -> str | None:
    if value is None:
        return None
    namespace, _, name = value.partition("/")
    if not namespace or not name or "/" in name:
        raise ExportError(f"--culler-service-account {value!r}: use NAMESPACE/NAME")
    return value


def _target(args: argparse.Namespace) -> WebhookTarget:
    namespace, _, service = args.webhook_service.rpartition("/")
    if not namespace or not service:
        raise ExportError(f"--webhook-service {args.webhook_service!r}: use NAMESPACE/NAME")
    if not 1 <= args.webhook_port <= 65535:
        raise ExportError(f"--webhook-port {args.webhook_port}: use a port, 1-65535")
    bundle = None
    if args.ca_bundle:
        try:
            pem = Path(args.ca_bundle).read_bytes()
        except OSError as exc:
            raise ExportError(f"--ca-bundle {args.ca_bundle}: {exc.strerror or exc}") from None
        if b"-----BEGIN CERTIFICATE-----" not in pem:
            raise ExportError(f"--ca-bundle {args.ca_bundle}: not a PEM certificate")
        bundle = base64.b64encode(pem).decode()
    if args.inject_ca_from and "/" not in args.inject_ca_from:
        raise ExportError(f"--inject-ca-from {args.inject_ca_from!r}: use NAMESPACE/NAME")
    return WebhookTarget(
        service=service,
        namespace=namespace,
        port=args.webhook_port,
        ca_bundle=bundle,
        inject_ca_from=args.inject_ca_from,
        failure_policy=args.failure_policy,
        slice_pods_only=args.slice_pods_only,
    )


def render(objects: list[dict[str, Any]], header: str) -> str:
    """Documents with a comment header (wrapped), as kubectl apply -f reads them."""
    words, lines, line = header.split(), [], "#"
    for word in words:
        if len(line) + len(word) > 98:
            lines.append(line)
            line = "#"
        line += " " + word
    lines.append(line)
    # a JSON round trip: shared sub-objects must not come out as YAML anchors and aliases
    plain = json.loads(json.dumps(objects))
    body = "---\n".join(yaml.safe_dump(o, sort_keys=False, allow_unicode=True) for o in plain)
    return "\n".join(lines) + "\n" + body


def write(result: Export, out_dir: Path, notebooks: str) -> list[Path]:
    """Write every file, each atomically (a temporary file renamed into place)."""
    written = []
    order = APPLY_ORDER_V1
    if notebooks != "v1":
        kinds = [o[0] for rel, (o, _) in result.files.items() if rel.startswith("workspacekind")]
        read = not kinds or kind_read_from_cluster(kinds[0])
        order = APPLY_ORDER_V2.format(kind=APPLY_KIND_READ if read else APPLY_KIND_STOCK)
    if "authorizationpolicies.yaml" not in result.files:
        order = "".join(line for line in order.splitlines(True) if "authorizationpolic" not in line)
    readme = order + (
        "\nNotes:\n" + "".join(f"  - {n}\n" for n in result.notes) if result.notes else ""
    )
    contents = {rel: render(objs, header) for rel, (objs, header) in result.files.items()}
    contents["README.txt"] = readme
    for rel, text in contents.items():
        path = out_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
        written.append(path)
    return written


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if not Path(args.catalog).is_file():
        print(f"{PROG} export: catalog file not found: {args.catalog}", file=sys.stderr)
        return 2
    try:
        catalog = load_catalog(args.catalog)
        kind_notes: list[str] = []
        result = export(
            catalog,
            namespaces=_profile_namespaces(args),
            notebooks=args.notebooks,
            webhook=_target(args),
            workspace_kind=_workspace_kind(args, kind_notes),
            culler_service_account=_service_account(args.culler_service_account),
        )
        result.notes[:0] = kind_notes
        out_dir = Path(args.output)
        if out_dir.exists() and not out_dir.is_dir():
            raise ExportError(f"-o {out_dir}: exists and is not a folder")
        written = write(result, out_dir, args.notebooks)
    except (CatalogError, ExportError) as exc:
        print(f"{PROG} export: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"{PROG} export: cannot write {args.output}: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    for note in result.notes:
        print(f"note: {note}", file=sys.stderr)
    return 0
