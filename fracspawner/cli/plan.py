"""`fracspawner plan`: the pod manifest a spawn would create, without a cluster.

With the hub extra installed it runs FracSpawner's own code path (validation, clean baseline,
PodPlan, kubespawner's make_pod), so what it prints is what the spawner would send to the
Kubernetes API. A bare `pip install fracspawner` has no kubespawner: then the same validation
and PodPlan are applied (backends.podspec) onto a minimal single-user pod, and a note on stderr
says that only the GPU fields are exact.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

# A kube config that is read but never contacted: KubeSpawner loads one when it is built.
_PLACEHOLDER_KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: plan, cluster: {server: "http://127.0.0.1:9"}}]
users: [{name: plan, user: {}}]
contexts: [{name: plan, context: {cluster: plan, user: plan, namespace: default}}]
current-context: plan
"""


@contextmanager
def use_kubeconfig(path: Path) -> Iterator[None]:
    """Point kubernetes_asyncio at `path` (it reads $KUBECONFIG once, at import time)."""
    from kubernetes_asyncio.config import kube_config

    old = kube_config.KUBE_CONFIG_DEFAULT_LOCATION
    kube_config.KUBE_CONFIG_DEFAULT_LOCATION = str(path)
    try:
        yield
    finally:
        kube_config.KUBE_CONFIG_DEFAULT_LOCATION = old


class _Hub:
    """What a z2jh hub looks like to its spawners (the values land in the pod's env)."""

    url = "http://hub:8081/hub/"
    api_url = "http://hub:8081/hub/api"
    base_url = "/hub/"
    public_host = ""


class _User:
    """The minimum of jupyterhub.user.User that building a pod needs."""

    def __init__(self, name: str, groups: list[str], admin: bool) -> None:
        self.name = name
        self.id = 1
        self.url = f"/user/{name}/"
        self.groups = groups
        self.admin = admin
        self.escaped_name = name


async def build_manifest(
    catalog: str,
    options: dict[str, Any],
    *,
    user: str = "alice",
    groups: list[str] | None = None,
    admin: bool = False,
    config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The camelCase pod manifest FracSpawner would create for these user_options."""
    pod, _ = await build_objects(
        catalog, options, user=user, groups=groups, admin=admin, config=config
    )
    return pod


async def build_objects(
    catalog: str,
    options: dict[str, Any],
    *,
    user: str = "alice",
    groups: list[str] | None = None,
    admin: bool = False,
    config: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The pod FracSpawner would create and the DRA ResourceClaimTemplates it would make
    first in the pod's namespace (none for other backends)."""
    from kubernetes_asyncio.client import ApiClient
    from traitlets.config import Config

    from ..hub.spawner import FracSpawner

    cfg = Config(config or {})
    cfg.FracSpawner.catalog_file = str(Path(catalog).resolve())
    cfg.FracSpawner.live_capacity = False
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = Path(tmp) / "kubeconfig"
        kubeconfig.write_text(_PLACEHOLDER_KUBECONFIG)
        with use_kubeconfig(kubeconfig):
            spawner = FracSpawner(
                _mock=True, config=cfg, user=_User(user, groups or [], admin), hub=_Hub()
            )
    spawner.user_options = options
    await spawner.load_user_options()
    pod = await spawner.get_pod_manifest()
    async with ApiClient() as api:
        return api.sanitize_for_serialization(pod), spawner.claim_templates()


#: a z2jh single-user pod reduced to what a plan is applied onto (no kubespawner here)
def bare_pod(user: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"jupyter-{user}",
            "labels": {"app": "jupyterhub", "component": "singleuser-server"},
            "annotations": {"hub.jupyter.org/username": user},
        },
        "spec": {
            "containers": [
                {
                    "name": "notebook",
                    "image": "quay.io/jupyterhub/k8s-singleuser-sample",
                    "ports": [{"containerPort": 8888, "name": "notebook-port"}],
                }
            ],
            "restartPolicy": "OnFailure",
        },
    }


def build_bare_manifest(
    catalog: str,
    options: dict[str, Any],
    *,
    user: str = "alice",
    groups: list[str] | None = None,
    admin: bool = False,
) -> dict[str, Any]:
    """The GPU fields of the pod for these user_options, on a minimal pod (no kubespawner)."""
    return build_bare_objects(catalog, options, user=user, groups=groups, admin=admin)[0]


def build_bare_objects(
    catalog: str,
    options: dict[str, Any],
    *,
    user: str = "alice",
    groups: list[str] | None = None,
    admin: bool = False,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """build_bare_manifest's pod and the DRA claim templates (namespace `default`)."""
    from ..backends import is_reserved_env, load_catalog, scheduler_for
    from ..backends.podspec import NO_DEVICES_ENV, apply_plan
    from ..choice.options import resolve_choice

    cat = load_catalog(catalog)
    choice = resolve_choice(cat, options, rule=cat.rule_for(user, groups or []), admin=admin)
    # the scheduler FracSpawner names (HAMi: hami-scheduler): without it a 1.36 cluster's
    # default scheduler refuses HAMi's gpumem/gpucores, which no node advertises
    plan = replace(choice.plan, scheduler_name=scheduler_for(choice.plan, choice.pool))
    pod = apply_plan(bare_pod(user), plan, reserved=is_reserved_env)
    if choice.pool is None:  # as FracSpawner.apply_choice: a CPU-only server sees no GPU
        pod["spec"]["containers"][0]["env"] = [
            {"name": k, "value": v} for k, v in NO_DEVICES_ENV.items()
        ]
    templates = [
        {**dict(t), "metadata": {**dict(t["metadata"]), "namespace": "default"}}
        for t in choice.plan.claim_templates
    ]
    return pod, templates


def _have_kubespawner() -> bool:
    try:
        import kubespawner  # noqa: F401
    except ImportError:
        return False
    return True


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="fracspawner plan",
        description="Print the pod a spawn would create for user alice (no cluster needed).",
    )
    parser.add_argument("--catalog", required=True, help="catalog YAML file")
    parser.add_argument(
        "--gpu", required=True, help='the slice: "1/4", "10GiB", "mig-1g.10gb", "1", "none"'
    )
    parser.add_argument("--pool", default=None, help="a catalog pool (default: fracspawner picks)")
    parser.add_argument("--image", default=None, help="a catalog image name (default: the default)")
    parser.add_argument("--user", default="alice", help="user name (default: alice)")
    parser.add_argument("--group", action="append", default=[], help="a group of the user")
    parser.add_argument(
        "--check-access",
        action="store_true",
        help="apply the user's access rules and quota (default: plan as an admin would spawn)",
    )
    parser.add_argument(
        "--with-templates",
        action="store_true",
        help="also print the ResourceClaimTemplates a DRA slice's claim is made from (YAML: "
        "more documents after the pod; JSON: a v1 List of the pod and them)",
    )
    parser.add_argument("-o", "--output", choices=["yaml", "json"], default="yaml")
    args = parser.parse_args(argv)
    options = {"gpu": args.gpu}
    if args.pool:
        options["pool"] = args.pool
    if args.image:
        options["image"] = args.image
    if not Path(args.catalog).is_file():
        print(f"fracspawner plan: catalog file not found: {args.catalog}", file=sys.stderr)
        return 2
    who = {"user": args.user, "groups": args.group, "admin": not args.check_access}
    try:
        if _have_kubespawner():
            manifest, templates = asyncio.run(build_objects(args.catalog, options, **who))
        else:
            manifest, templates = build_bare_objects(args.catalog, options, **who)
            print(
                "fracspawner plan: kubespawner is not installed (pip install fracspawner[hub]); "
                "the GPU fields are exact, the rest is a minimal single-user pod",
                file=sys.stderr,
            )
    except Exception as exc:  # one line, no traceback: this is a user-facing command
        # a refusal carries the sentence the form shows (hub/refusal.py); other errors as is
        message = getattr(exc, "jupyterhub_message", None) or str(exc)
        print(f"fracspawner plan: {' '.join(str(message).split())}", file=sys.stderr)
        return 2
    # a DRA slice: the pod names its claim's ResourceClaimTemplate (the hub makes it in the
    # pod's namespace first); stdout stays the pod alone unless asked for the templates
    if templates and not args.with_templates:
        names = ", ".join(t["metadata"]["name"] for t in templates)
        print(
            f"fracspawner plan: the pod's GPU claim is made from ResourceClaimTemplate {names} "
            "(--with-templates prints it)",
            file=sys.stderr,
        )
        templates = []
    if args.output == "json":
        out: Any = manifest
        if templates:
            out = {"apiVersion": "v1", "kind": "List", "items": [manifest, *templates]}
        print(json.dumps(out, indent=2, sort_keys=True))
    else:
        print(yaml.safe_dump_all([manifest, *templates], sort_keys=False), end="")
    return 0
