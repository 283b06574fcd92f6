"""Helpers for tests/test_chart.py: rendering the Helm chart with Helm's own Go code
(helm-python-sdk), finding the lint tools, and keeping the chart's values schema in step with
the product's catalog schema.

`python -m tests.chart_support --write-schema` re-embeds fracspawner's catalog JSON Schema into
charts/fracspawner/values.schema.json after the catalog schema changed.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "charts" / "fracspawner"
VALUES_SCHEMA = CHART / "values.schema.json"
RELEASE = "fracspawner"
NAMESPACE = "jhub"
#: the Kubernetes version the chart is linted and its objects validated against with
#: kubernetes-validate's published schemas: a release the chart supports (Chart.yaml kubeVersion
#: >=1.28); its RBAC objects also go to the real control plane (v1.36.3, tests/rbac_support.py)
KUBE_VERSION = "1.33.0"


def _catalog_schema_path() -> Path:
    import fracspawner

    found = sorted(Path(fracspawner.__file__).parent.rglob("catalog.schema.json"))
    assert found, "fracspawner ships no catalog.schema.json"
    return found[0]


CATALOG_SCHEMA = _catalog_schema_path()


def _rewrite_refs(node: Any, prefix: str) -> Any:
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str) and value.startswith("#/$defs/"):
                out[key] = "#/$defs/" + prefix + value[len("#/$defs/") :]
            else:
                out[key] = _rewrite_refs(value, prefix)
        return out
    if isinstance(node, list):
        return [_rewrite_refs(v, prefix) for v in node]
    return node


def embed_catalog_schema(values_schema: Mapping[str, Any], catalog: Mapping[str, Any]) -> dict:
    """The chart's values schema with `catalog` validated by the product's catalog schema:
    the catalog's $defs become `catalog_*` $defs of the values schema, its body the schema of
    a non-empty `catalog` (Helm validates values with JSON Schema 2020-12, local refs)."""
    schema = copy.deepcopy(dict(values_schema))
    body = {k: v for k, v in catalog.items() if k not in ("$schema", "$id", "$defs", "title")}
    body = _rewrite_refs(body, "catalog_")
    defs = {k: v for k, v in schema.get("$defs", {}).items() if not k.startswith("catalog_")}
    for name, sub in catalog.get("$defs", {}).items():
        defs["catalog_" + name] = _rewrite_refs(sub, "catalog_")
    schema["$defs"] = defs
    schema["properties"] = dict(schema["properties"])
    # {} (the default) means the chart's files/default-catalog.yaml; anything else is a catalog
    then = dict(body)
    then["allOf"] = [*body.get("allOf", []), hub_catalog_rules()]
    schema["properties"]["catalog"] = {
        "description": "The fracspawner catalog; {} for the chart's default catalog.",
        "type": "object",
        "if": {"minProperties": 1},
        "then": then,
    }
    return schema


def hub_catalog_rules() -> dict:
    """What the hub refuses at start beyond the catalog schema, where a schema can say it, so
    `helm install` refuses it instead of a hub that does not start: a `gpu` naming no built-in
    model (fracspawner/model/catalog.py `_gpu_model`: `lookup_model` takes a name or alias,
    case-insensitively, after strip()), and a replica pool (NVIDIA time-slicing/MPS, GKE
    sharing: backends/base.py `ReplicaBackend.check_pool`) without `replicas` of 2 or more."""
    from fracspawner.backends import BUILTIN_BACKENDS, get_backend
    from fracspawner.backends.base import ReplicaBackend
    from fracspawner.model.gpumodels import GPU_MODELS

    names = sorted({n.lower() for m in GPU_MODELS.values() for n in (m.name, *m.aliases)})
    assert all(re.fullmatch(r"[a-z0-9-]+", n) for n in names), names  # no regex escapes
    alternatives = "|".join(names)
    replica_rules = []
    for name in BUILTIN_BACKENDS:
        backend = get_backend(name)
        if not isinstance(backend, ReplicaBackend):
            continue
        replicas: dict[str, Any] = {"minimum": 2}
        if backend.max_replicas:
            replicas["maximum"] = backend.max_replicas
        replica_rules.append(
            {
                "if": {"properties": {"backend": {"const": name}}, "required": ["backend"]},
                "then": {"required": ["replicas"], "properties": {"replicas": replicas}},
            }
        )
    pool = {
        "properties": {
            "gpu": {
                "if": {"type": "string"},
                "then": {
                    "description": "a built-in GPU model: " + ", ".join(GPU_MODELS),
                    "pattern": rf"^\s*(?i:{alternatives})\s*$",
                },
            }
        },
        "allOf": replica_rules,
    }
    return {"properties": {"pools": {"additionalProperties": pool}}}


def expected_values_schema() -> dict:
    current = json.loads(VALUES_SCHEMA.read_text())
    return embed_catalog_schema(current, json.loads(CATALOG_SCHEMA.read_text()))


def render(values: Mapping[str, Any] | None = None, **opts: Any) -> dict[str, str]:
    """template path -> rendered text, as `helm template` (an install, no cluster)."""
    import helm_python as helm

    with helm.Chart.load(str(CHART)) as chart:
        return chart.render(
            dict(values or {}),
            name=opts.get("name", RELEASE),
            namespace=opts.get("namespace", NAMESPACE),
            is_install=True,
        )


def objects(rendered: Mapping[str, str]) -> list[dict]:
    """Every Kubernetes object of a render (NOTES.txt and empty documents left out)."""
    out = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                out.append(doc)
    return out


def by_kind(objs: list[dict], kind: str) -> list[dict]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: list[dict], kind: str, component: str) -> dict:
    found = [
        o
        for o in objs
        if o["kind"] == kind
        and o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component
    ]
    assert len(found) == 1, (kind, component, [o["metadata"]["name"] for o in found])
    return found[0]


def pod_specs(objs: list[dict]) -> Iterator[tuple[dict, dict]]:
    """(workload, pod spec) of every Deployment."""
    for o in by_kind(objs, "Deployment"):
        yield o, o["spec"]["template"]["spec"]


def tool(name: str, *venvs: str) -> str | None:
    """A console script from this environment, one of the named venvs, or PATH."""
    candidates = [Path(sys.executable).parent / name]
    candidates += [REPO / venv / "bin" / name for venv in venvs]
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    return shutil.which(name)


class Container:
    """A rendered Deployment's container run as a local process, as the kubelet would run it:
    its command and env (Secret keys and field refs resolved from `secrets`/`fields`), its
    ConfigMap and Secret volumes written under a directory and their mount paths rewritten in
    the command line. `probe()` performs its readiness probe on 127.0.0.1."""

    def __init__(
        self,
        deployment: Mapping[str, Any],
        objs: list[dict],
        workdir: Path,
        *,
        secrets: Mapping[tuple[str, str], str] | None = None,
        fields: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        import subprocess

        spec = deployment["spec"]["template"]["spec"]
        self.container = spec["containers"][0]
        mounts = {m["name"]: m["mountPath"] for m in self.container.get("volumeMounts", [])}
        rewrite: dict[str, str] = {}
        for volume in spec.get("volumes", []):
            if volume["name"] not in mounts:
                continue
            local = workdir / volume["name"]
            local.mkdir(parents=True, exist_ok=True)
            if "configMap" in volume:
                source = _named(objs, "ConfigMap", volume["configMap"]["name"])["data"]
                files = {k: v.encode() for k, v in source.items()}
            elif "secret" in volume:
                import base64

                source = _named(objs, "Secret", volume["secret"]["secretName"])["data"]
                files = {k: base64.b64decode(v) for k, v in source.items()}
            else:  # emptyDir
                files = {}
            for name, data in files.items():
                (local / name).write_bytes(data)
            rewrite[mounts[volume["name"]]] = str(local)
        self.files = rewrite

        import re

        mounts_re = re.compile(
            "|".join(re.escape(m + "/") for m in sorted(rewrite, key=len, reverse=True))
        )

        def local_path(arg: str) -> str:  # one pass: a rewritten path is not rewritten again
            return mounts_re.sub(lambda m: rewrite[m.group(0)[:-1]] + "/", arg)

        command = [local_path(a) for a in self.container["command"]]
        exe = tool(command[0])
        assert exe, command[0]
        environ = {"PATH": os.environ["PATH"], "HOME": str(workdir)}
        for item in self.container.get("env", []):
            if "value" in item:
                environ[item["name"]] = item["value"]
                continue
            source = item["valueFrom"]
            if "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                given = (secrets or {}).get((ref["name"], ref["key"]))
                if given is None:  # a Secret the chart makes itself (the room tag key)
                    import base64

                    data = _named(objs, "Secret", ref["name"])["data"]
                    given = base64.b64decode(data[ref["key"]]).decode()
                environ[item["name"]] = given
            else:
                environ[item["name"]] = (fields or {})[source["fieldRef"]["fieldPath"]]
        environ.update(env or {})
        self.log = open(workdir / "container.log", "w")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [exe, *command[1:]], env=environ, stdout=self.log, stderr=subprocess.STDOUT,
            cwd=workdir,
        )  # fmt: skip
        self.workdir = workdir

    def port(self, name: str) -> int:
        return next(p["containerPort"] for p in self.container["ports"] if p["name"] == name)

    def probe(
        self,
        kind: str = "readinessProbe",
        timeout: float | None = None,
        until: Any = None,
        **urlopen: Any,
    ) -> Any:
        """Wait until the probe answers 2xx, or `until(status, body)` is true for its answer
        whatever the status (a deadline, not a timing assertion): by default as long as the
        kubelet would wait for the container to start (its startupProbe's
        initialDelaySeconds + periodSeconds x failureThreshold, Kubernetes' defaults 0, 10, 3),
        so a slow start on a loaded machine is not mistaken for a broken container."""
        import ssl
        import time
        import urllib.error
        import urllib.request

        if timeout is None:
            startup = self.container.get("startupProbe")
            timeout = 60.0
            if startup:
                timeout = startup.get("initialDelaySeconds", 0) + startup.get(
                    "periodSeconds", 10
                ) * startup.get("failureThreshold", 3)

        get = self.container[kind]["httpGet"]
        port = get["port"] if isinstance(get["port"], int) else self.port(get["port"])
        scheme = get.get("scheme", "HTTP").lower()
        url = f"{scheme}://127.0.0.1:{port}{get['path']}"
        if scheme == "https" and "context" not in urlopen:
            # the kubelet does not verify a probe's certificate
            urlopen["context"] = ssl._create_unverified_context()
        deadline = time.monotonic() + timeout
        while True:
            assert self.process.poll() is None, self.output()
            try:
                with urllib.request.urlopen(url, timeout=5, **urlopen) as resp:
                    answer = resp.status, resp.read()
                if until is None or until(*answer):
                    return answer
            except urllib.error.HTTPError as exc:  # answered, not 2xx
                answer = exc.code, exc.read()
                if until is not None and until(*answer):
                    return answer
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"{url} never answered so:\n{self.output()}") from None
            time.sleep(0.1)

    def output(self) -> str:
        self.log.flush()
        return (self.workdir / "container.log").read_text()[-4000:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except Exception:
                self.process.kill()
                self.process.wait(5)
        self.log.close()


def _named(objs: list[dict], kind: str, name: str) -> dict:
    return next(o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name)


def main(argv: list[str]) -> int:
    if argv != ["--write-schema"]:
        print("usage: python -m tests.chart_support --write-schema", file=sys.stderr)
        return 2
    VALUES_SCHEMA.write_text(json.dumps(expected_values_schema(), indent=2) + "\n")
    print(f"wrote {VALUES_SCHEMA.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
