"""What Zero to JupyterHub (z2jh) 4.4.0 does with its values, for the parts fracspawner meets.

The z2jh chart itself is not available here (no network beyond the package registries), so
this module stands in for it. It reproduces, from z2jh's own files, only what a FracSpawner hub
and its pods depend on; each part names where it comes from in
jupyterhub/zero-to-jupyterhub-k8s:

- `Z2JH_DEFAULTS`: the defaults of jupyterhub/values.yaml that matter here
  (`scheduling.userScheduler.enabled: true`, `singleuser.cloudMetadata.blockWithIptables: true`
  with `ip: 169.254.169.254`, `singleuser.networkTools.image`, `hub.baseUrl: /`, `cull.*`).
- `merged_values(...)`: how `helm upgrade -f config.yaml -f overlay.yaml` composes values:
  Helm's own coalescing (helm-python-sdk, `Chart.merge_values`): maps are merged, lists and
  scalars of a later file replace the earlier ones.
- `hub_config(values)`: the hub's traitlets config as z2jh's
  jupyterhub/files/hub/jupyterhub_config.py builds it, in its order:
  `hub.baseUrl` -> `c.JupyterHub.base_url` (the `base_url` entry of its c.JupyterHub loop),
  the user scheduler -> `c.KubeSpawner.scheduler_name = get_name("user-scheduler")` (its
  `# scheduling:` block; get_name gives `<fullname>-user-scheduler`, the fullname being the
  release name unless fullnameOverride is set, jupyterhub/files/hub/z2jh.py and
  templates/_helpers-names.tpl), the metadata block -> a privileged `block-cloud-metadata`
  init container appended to `c.KubeSpawner.init_containers` when
  `singleuser.cloudMetadata.blockWithIptables` is true (its `cloud_metadata` block: iptables
  OUTPUT DROP to the metadata IP, `privileged=True`, `run_as_user=0`, `NET_ADMIN`, as a
  `V1Container` model), `hub.services` (a dict) -> the `c.JupyterHub.services` list with
  each key as `name`, `hub.loadRoles` -> `c.JupyterHub.load_roles` (templates/hub/configmap
  + jupyterhub_config.py's load_roles loop), then `hub.config` passed through section by
  section with `c[section].update(cfg)` (a key there REPLACES what the lines above built, e.g.
  `hub.config.JupyterHub.load_roles` replaces every hub.loadRoles role; secrets popped; a
  section not starting upper-case is FATAL, exit 1), and LAST `hub.extraConfig`, every snippet
  exec'd in sorted key order. Checked against jupyterhub/files/hub/jupyterhub_config.py at
  zero-to-jupyterhub-k8s commit 48ea50e3: services/roles lines 364-439, hub.config lines
  499-526, hub.extraConfig lines 539-542.
"""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

#: z2jh 4.4.0 jupyterhub/values.yaml, the keys fracspawner meets
Z2JH_DEFAULTS: dict[str, Any] = {
    "fullnameOverride": "",
    "nameOverride": None,
    "hub": {
        "baseUrl": "/",
        "services": {},
        "loadRoles": {},
        "extraConfig": {},
        "extraVolumes": [],
        "extraVolumeMounts": [],
        "image": {"name": "quay.io/jupyterhub/k8s-hub", "tag": "4.4.0"},
    },
    "singleuser": {
        "networkTools": {"image": {"name": "quay.io/jupyterhub/k8s-network-tools", "tag": "4.4.0"}},
        "cloudMetadata": {"blockWithIptables": True, "ip": "169.254.169.254"},
        "networkPolicy": {
            "enabled": True,
            "egress": [],
            "egressAllowRules": {
                "cloudMetadataServer": False,
                "dnsPortsCloudMetadataServer": True,
                "dnsPortsKubeSystemNamespace": True,
                "dnsPortsPrivateIPs": True,
                "nonPrivateIPs": True,
                "privateIPs": False,
            },
        },
        "podNameTemplate": None,
    },
    "scheduling": {"userScheduler": {"enabled": True}},
    "cull": {"enabled": True, "timeout": 3600, "every": 600},
}


def merged_values(
    *layers: Mapping[str, Any], base: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """z2jh's defaults (or `base`), then each `--values` file in order, composed by Helm's
    own code."""
    import helm_python as helm

    result: dict[str, Any] = copy.deepcopy(dict(Z2JH_DEFAULTS if base is None else base))
    for layer in layers:
        with tempfile.TemporaryDirectory() as tmp:
            chart = Path(tmp)
            (chart / "Chart.yaml").write_text("apiVersion: v2\nname: jupyterhub\nversion: 4.4.0\n")
            (chart / "values.yaml").write_text(yaml.safe_dump(result))
            with helm.Chart.load(str(chart)) as loaded:
                result = loaded.merge_values(dict(layer))
    return result


def fullname(values: Mapping[str, Any], release: str) -> str:
    """z2jh's `jupyterhub.fullname`: fullnameOverride, else the release name."""
    return values.get("fullnameOverride") or release


def block_cloud_metadata_container(values: Mapping[str, Any]) -> Any:
    """The init container z2jh's jupyterhub_config.py appends (its `cloud_metadata` block)."""
    # kubespawner (7.x) takes dicts or kubernetes_asyncio models, which z2jh's hub image ships
    from kubernetes_asyncio import client

    metadata = values["singleuser"]["cloudMetadata"]
    tools = values["singleuser"]["networkTools"]["image"]
    return client.V1Container(
        name="block-cloud-metadata",
        image=f"{tools['name']}:{tools['tag']}",
        command=["iptables", "-A", "OUTPUT", "-d", metadata.get("ip", "169.254.169.254")]
        + ["-j", "DROP"],
        security_context=client.V1SecurityContext(
            privileged=True,
            run_as_user=0,
            capabilities=client.V1Capabilities(add=["NET_ADMIN"]),
        ),
    )


def hub_config(
    values: Mapping[str, Any], *, release: str = "jhub", catalog_file: str | None = None
) -> Any:
    """The traitlets Config z2jh's hub builds from `values` (see the module docstring).

    `catalog_file` replaces the overlay's /etc/fracspawner/catalog.yaml (the chart's ConfigMap,
    mounted in the hub pod) with a local file."""
    from traitlets.config import Config

    c = Config()
    base_url = values["hub"].get("baseUrl")
    if base_url is not None:
        c.JupyterHub.base_url = base_url
    if values["scheduling"]["userScheduler"]["enabled"]:
        c.KubeSpawner.scheduler_name = f"{fullname(values, release)}-user-scheduler"
    c.KubeSpawner.init_containers = []
    if values["singleuser"]["cloudMetadata"].get("blockWithIptables") is True:
        c.KubeSpawner.init_containers.append(block_cloud_metadata_container(values))
    services = []
    for name, service in (values["hub"].get("services") or {}).items():
        service = dict(service or {})
        service.setdefault("name", name)
        service.pop("apiToken", None)
        services.append(service)
    c.JupyterHub.services = services
    roles = []
    for name, role in (values["hub"].get("loadRoles") or {}).items():
        roles.append({"name": name, **(role or {})})
    c.JupyterHub.load_roles = roles
    for section, cfg in (values["hub"].get("config") or {}).items():
        cfg = dict(cfg or {})
        if section == "JupyterHub":
            for secret in ("proxy_auth_token", "cookie_secret", "services"):
                cfg.pop(secret, None)
        if not section[:1].isupper():
            raise SystemExit(1)  # z2jh: "FATAL: Invalid hub.config section name"
        c[section].update(copy.deepcopy(cfg))
    for key, snippet in sorted((values["hub"].get("extraConfig") or {}).items()):
        if catalog_file is not None:
            snippet = snippet.replace("/etc/fracspawner/catalog.yaml", catalog_file)
        exec(compile(snippet, f"hub.extraConfig.{key}", "exec"), {"c": c})
    return c


# ------------------------------------------------------------------ HAMi's admission webhook
def hami_webhook(pod: Mapping[str, Any], scheduler_name: str = "hami-scheduler") -> dict:
    """What HAMi's mutating webhook answers for a pod (Project-HAMi/HAMi
    pkg/scheduler/webhook.go `Handle`), with its chart's defaults (schedulerName
    `hami-scheduler`, forceOverwriteDefaultScheduler on):

    - a pod naming a scheduler other than the default one or HAMi's own is left alone
      ("pod already has different scheduler assigned"): the user scheduler never learns of
      HAMi's resources and the pod stays Pending;
    - a pod asking HAMi's resources (nvidia.com/gpu, gpumem, gpumem-percentage, gpucores in
      any container's limits) with a privileged container, init containers included
      (`privilegedContainerName`), is DENIED: "container <name> is privileged";
    - otherwise a pod with HAMi's resources gets `schedulerName: <HAMi's scheduler>`.

    Returns {"allowed": bool, "message": str, "pod": the pod after the webhook}.
    """
    pod = copy.deepcopy(dict(pod))
    spec = pod["spec"]
    name = spec.get("schedulerName") or ""
    if name and name != "default-scheduler" and name != scheduler_name:
        return {"allowed": True, "message": "pod already has different scheduler assigned",
                "pod": pod}  # fmt: skip
    hami = {"nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpumem-percentage"}
    hami.add("nvidia.com/gpucores")
    containers = list(spec.get("initContainers") or []) + list(spec.get("containers") or [])
    has_resource = any(
        hami & set((c.get("resources") or {}).get("limits") or {}) for c in containers
    )
    privileged = next(
        (c["name"] for c in containers if (c.get("securityContext") or {}).get("privileged")),
        None,
    )
    if has_resource and privileged:
        return {"allowed": False, "message": f"container {privileged} is privileged", "pod": pod}
    if has_resource:
        spec["schedulerName"] = scheduler_name
    return {"allowed": True, "message": "", "pod": pod}
