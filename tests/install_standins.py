"""What runs docs/install.md's `docker`, `helm` and `pip` commands in the walk-through test
(tests/test_install_walkthrough.py), where there is no container engine, no registry, no
cluster for Helm and no z2jh chart:

- `docker build -f F -t TAG CONTEXT`: hadolint on F, and every COPY source of F exists in the
  context and gets past .dockerignore (what the engine would send); `docker push TAG`: TAG was
  built. The Dockerfiles are built by a real Docker daemon and run in tests/test_images.py.
- `helm repo add/update`: the z2jh repository's documented URL; `helm upgrade [--install]` of
  `charts/fracspawner`: Helm's own code (helm-python-sdk): the `--values` files merged as the
  CLI merges them, the schema, the render, every object validated strictly against the
  Kubernetes 1.33 schemas (kubernetes-validate); of `jupyterhub/jupyterhub`: the z2jh 4.4.0
  stand-in of tests/z2jh_support.py (z2jh's defaults, Helm's composition of the `--values`
  files, z2jh's hub configuration run with the catalog the fracspawner release put in its
  ConfigMap), then a pod of every pool as FracSpawner builds it there, HAMi's webhook's answer
  for HAMi pools, and the services' tokens where the fracspawner chart reads them;
  `helm uninstall`: the release was installed.
- `pip install ARGS`: `pip install --dry-run ARGS`: pip resolves them against this
  environment and the package index (nothing is installed).

State (built tags, repositories, releases) is kept in $STANDIN_STATE between commands.
Run as `python -m tests.install_standins docker|helm|pip ARGS...`.
"""

from __future__ import annotations

import asyncio
import fnmatch
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

Z2JH_REPO = "https://hub.jupyter.org/helm-chart/"
Z2JH_VERSION = "4.4.0"
KUBE_VERSION = "1.33.0"


class Refused(Exception):
    """What the real tool would fail with."""


def _state_path() -> Path:
    return Path(os.environ["STANDIN_STATE"])


def _load() -> dict[str, Any]:
    path = _state_path()
    state = json.loads(path.read_text()) if path.exists() else {}
    state.setdefault("images", [])
    state.setdefault("pushed", [])
    state.setdefault("repos", {})
    state.setdefault("releases", {})
    return state


def _save(state: dict[str, Any]) -> None:
    _state_path().write_text(json.dumps(state, indent=2))


# ------------------------------------------------------------------ docker
def _ignored(path: str, patterns: list[str]) -> bool:
    """.dockerignore: the last matching pattern decides; `!` re-includes (a directory
    pattern re-includes what is under it)."""
    excluded = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        hit = pattern == "**" or fnmatch.fnmatch(path, pattern)
        hit = hit or path.startswith(pattern + "/") or fnmatch.fnmatch(path, pattern + "/*")
        if hit:
            excluded = not negate
    return excluded


def docker(args: list[str]) -> str:
    state = _load()
    if args[:1] == ["push"]:
        (tag,) = args[1:]
        if tag not in state["images"]:
            raise Refused(f"An image does not exist locally with the tag: {tag}")
        state["pushed"].append(tag)
        _save(state)
        return f"pushed {tag}"
    if args[:1] != ["build"]:
        raise Refused(f"docker {' '.join(args)}: not a step of the walk-through")
    rest = args[1:]
    dockerfile = rest[rest.index("-f") + 1]
    tag = rest[rest.index("-t") + 1]
    context = Path(rest[-1])
    path = context / dockerfile
    if not path.is_file():
        raise Refused(f"unable to prepare context: {dockerfile} not found")
    from tests.chart_support import tool

    lint = subprocess.run(
        [tool("hadolint") or "hadolint", "--no-color", str(path)], capture_output=True, text=True
    )
    if lint.returncode or lint.stdout.strip():
        raise Refused(f"hadolint {dockerfile}:\n{lint.stdout}{lint.stderr}")
    ignore = [
        line.strip()
        for line in (context / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for line in path.read_text().splitlines():
        parts = shlex.split(line) if line.startswith("COPY ") else []
        if not parts or any(p.startswith("--from") for p in parts):
            continue
        for source in parts[1:-1]:
            source = source.rstrip("/")
            if not (context / source).exists() or _ignored(source, ignore):
                raise Refused(f"COPY {source}: not in the build context (.dockerignore)")
    state["images"].append(tag)
    _save(state)
    return f"built {tag} from {dockerfile}"


# ------------------------------------------------------------------ helm
def _options(args: list[str]) -> tuple[list[str], dict[str, Any]]:
    positional, opts = [], {"values": []}
    it = iter(args)
    for arg in it:
        if arg in ("--values", "-f"):
            opts["values"].append(next(it))
        elif arg in ("--namespace", "-n", "--version"):
            opts[arg.lstrip("-")[0] if arg == "-n" else arg.lstrip("-")] = next(it)
        elif arg.startswith("--"):
            opts[arg.lstrip("-")] = True
        else:
            positional.append(arg)
    opts["namespace"] = opts.pop("n", None) or opts.get("namespace") or "default"
    return positional, opts


def _merge_files(files: list[str]) -> dict[str, Any]:
    """`-f a -f b`: Helm's own coalescing, a later file's maps merged into the earlier one's,
    its lists and scalars replacing them (z2jh_support.merged_values, from no defaults)."""
    from tests.z2jh_support import merged_values

    layers = [yaml.safe_load(Path(f).read_text()) or {} for f in files]
    return merged_values(*layers, base={})


def helm(args: list[str]) -> str:
    state = _load()
    if args[:2] == ["repo", "add"]:
        name, url = args[2:4]
        if name == "jupyterhub" and url != Z2JH_REPO:
            raise Refused(f"{url}: not z2jh's chart repository ({Z2JH_REPO})")
        state["repos"][name] = url
        _save(state)
        return f'"{name}" has been added to your repositories'
    if args[:2] == ["repo", "update"]:
        if not state["repos"]:
            raise Refused("no repositories found. You must add one before updating")
        return "Update Complete."
    if args[:1] == ["uninstall"]:
        positional, opts = _options(args[1:])
        key = f"{opts['namespace']}/{positional[0]}"
        if key not in state["releases"]:
            raise Refused(f"uninstall: Release not loaded: {positional[0]}: release: not found")
        del state["releases"][key]
        _save(state)
        return f'release "{positional[0]}" uninstalled'
    if args[:1] != ["upgrade"]:
        raise Refused(f"helm {' '.join(args)}: not a step of the walk-through")
    positional, opts = _options(args[1:])
    release, chart = positional
    key = f"{opts['namespace']}/{release}"
    if key not in state["releases"] and not opts.get("install"):
        raise Refused(f'UPGRADE FAILED: "{release}" has no deployed releases')
    if chart == "charts/fracspawner":
        record = _fracspawner_release(release, opts)
    elif chart == "jupyterhub/jupyterhub":
        if state["repos"].get("jupyterhub") != Z2JH_REPO:
            raise Refused("repo jupyterhub not found (helm repo add jupyterhub ...)")
        if opts.get("version") != Z2JH_VERSION:
            raise Refused(f"the walk-through is tested with z2jh {Z2JH_VERSION}")
        record = _z2jh_release(release, opts, state)
    else:
        raise Refused(f"{chart}: not a chart of the walk-through")
    state["releases"][key] = record
    _save(state)
    return f'Release "{release}" has been upgraded. Happy Helming!\n' + record["summary"]


def _fracspawner_release(release: str, opts: dict[str, Any]) -> dict[str, Any]:
    import kubernetes_validate

    from tests.chart_support import objects, render

    values = _merge_files(opts["values"])
    rendered = render(values, name=release, namespace=opts["namespace"])
    objs = objects(rendered)
    for obj in objs:
        if obj["apiVersion"].split("/")[0] in ("v1", "apps", "policy") or obj[
            "apiVersion"
        ].startswith(("rbac.", "networking.", "admissionregistration.")):
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
    catalogs = [o for o in objs if o["kind"] == "ConfigMap" and "catalog.yaml" in o["data"]]
    # the keys read from z2jh's Secret (jupyterhub.tokenSecret, "hub"): the chart's own Secrets
    # (the room tag key) are its to make
    z2jh_secret = (values.get("jupyterhub") or {}).get("tokenSecret") or "hub"
    tokens = sorted(
        e["valueFrom"]["secretKeyRef"]["key"]
        for o in objs
        if o["kind"] == "Deployment"
        for c in o["spec"]["template"]["spec"]["containers"]
        for e in c.get("env", [])
        if (e.get("valueFrom") or {}).get("secretKeyRef", {}).get("name") == z2jh_secret
    )
    return {
        "chart": "fracspawner",
        "objects": [f"{o['kind']}/{o['metadata']['name']}" for o in objs],
        "configmaps": {o["metadata"]["name"]: o["data"]["catalog.yaml"] for o in catalogs},
        "tokens": tokens,
        "notes": rendered.get("fracspawner/templates/NOTES.txt", ""),
        "summary": f"{len(objs)} objects, all valid",
    }


def _z2jh_release(release: str, opts: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    from tests.z2jh_support import hub_config, merged_values

    layers = [yaml.safe_load(Path(f).read_text()) or {} for f in opts["values"]]
    values = merged_values(*layers)
    lines = []
    record: dict[str, Any] = {"chart": "jupyterhub", "values": values}
    # the hub pod's volumes: a ConfigMap it mounts must exist in the namespace
    configmaps: dict[str, str] = {}
    for other_key, other in state["releases"].items():
        if other_key.startswith(opts["namespace"] + "/") and other["chart"] == "fracspawner":
            configmaps.update(other["configmaps"])
            record["tokens_read"] = other["tokens"]
    catalog_file = None
    for volume in values["hub"].get("extraVolumes") or []:
        name = (volume.get("configMap") or {}).get("name")
        if name is None:
            continue
        if name not in configmaps:
            raise Refused(f"hub pod: configmap {name!r} not found in {opts['namespace']}")
        tmp = Path(tempfile.mkdtemp())
        (tmp / "catalog.yaml").write_text(configmaps[name])
        catalog_file = str(tmp / "catalog.yaml")
    c = hub_config(values, release=release, catalog_file=catalog_file)
    record["spawner_class"] = c.JupyterHub.get("spawner_class", "kubespawner.KubeSpawner")
    record["services"] = [s["name"] for s in c.JupyterHub.get("services", [])]
    record["roles"] = c.JupyterHub.get("load_roles", [])
    # z2jh stores a token for every hub.services entry under this key of its Secret `hub`
    missing = [
        t
        for t in record.get("tokens_read", [])
        if t.removeprefix("hub.services.").removesuffix(".apiToken") not in record["services"]
    ]
    if missing and record["spawner_class"] == "fracspawner":
        raise Refused(f"the fracspawner pods read tokens z2jh does not create: {missing}")
    lines.append(f"hub: spawner {record['spawner_class']}, services {record['services']}")
    if record["spawner_class"] == "fracspawner":
        record["pods"] = asyncio.run(_pods(catalog_file, c))
        lines += [f"  {p['pool']}: schedulerName {p['scheduler']}, {p['admission']}"
                  for p in record["pods"]]  # fmt: skip
    return {**record, "summary": "\n".join(lines)}


async def _pods(catalog_file: str, c: Any) -> list[dict[str, Any]]:
    """A pod of each pool's first offer, as FracSpawner builds it in this hub, and what HAMi's
    webhook answers for it where the pool is HAMi's."""
    from fracspawner.backends import load_catalog
    from fracspawner.cli.plan import build_manifest
    from tests.z2jh_support import hami_webhook

    catalog = load_catalog(catalog_file)
    out = []
    for name, pool in catalog.pools.items():
        options = {"gpu": str(pool.offers[0]), "pool": name}
        pod = await build_manifest(catalog_file, options, admin=True, config=c)
        admission = "no admission webhook"
        if pool.backend == "hami":
            answer = hami_webhook(pod)
            if not answer["allowed"]:
                raise Refused(f"HAMi's webhook refuses the {name} pod: {answer['message']}")
            admission = "admitted by HAMi's webhook"
        out.append({"pool": name, "scheduler": pod["spec"].get("schedulerName"),
                    "admission": admission})  # fmt: skip
    return out


# ------------------------------------------------------------------ pip
def pip(args: list[str]) -> str:
    if args[:1] != ["install"]:
        raise Refused(f"pip {' '.join(args)}: not a step of the walk-through")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", *args[1:]],
        capture_output=True,
        text=True,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
        timeout=300,
    )
    if result.returncode:
        raise Refused(result.stdout[-2000:] + result.stderr[-2000:])
    return result.stdout.strip().splitlines()[-1]


def main(argv: list[str]) -> int:
    tool, args = argv[0], argv[1:]
    try:
        print({"docker": docker, "helm": helm, "pip": pip}[tool](args))
    except Refused as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
