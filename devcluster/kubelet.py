"""A kubelet that runs a bound pod's container command as a real local process.

Each pod runs in its sandbox (devcluster/network.py): where root, its own mount and UTS
namespaces (hostname = pod name, the kubelet's resolv.conf and hosts), and with `network:
namespaces` its own network namespace. On the host's network each pod gets its own loopback
address (127.0.x.y) and the kubelet rewrites `0.0.0.0` in env values and args to that address:
a server told to listen on all interfaces inside its pod listens on the pod's own IP there.
Images are not pulled: the command runs from the current Python environment.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import shutil
import signal
import socket
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import bindmounts, volumes
from .network import NSENTER, Network, sandboxes

#: util-linux's setpriv, to have the kernel SIGKILL a pod's process should the devcluster itself
#: die without cleaning up (SIGKILL, a crash): prctl(PR_SET_PDEATHSIG). An orderly stop kills
#: every pod anyway; without setpriv only that remains.
SETPRIV = shutil.which("setpriv")
#: What runs for a container with no command/args: jupyter docker-stacks images start
#: jupyterhub-singleuser by default. Overridable per image with the topology's `images:` map.
DEFAULT_COMMAND = ["jupyterhub-singleuser"]


@dataclass
class Running:
    process: asyncio.subprocess.Process
    ip: str
    log_path: Path
    waiter: asyncio.Task | None = None
    env: dict[str, str] = field(default_factory=dict)  # for exec probes and pods/exec
    cwd: str = ""
    #: the namespaces of the pod's sandbox that a command beside the container enters
    namespaces: tuple[str, ...] = ()

    def beside(self, command: list[str]) -> list[str]:
        """`command` run beside the container, in its sandbox's namespaces (kubectl exec, exec
        probes): the same hostname, /etc/resolv.conf and network."""
        if not self.namespaces or not NSENTER:
            return command
        flags = [f"--{n}" for n in self.namespaces]
        # entering a mount namespace moves to its root: back to the container's working dir
        workdir = [f"--wd={self.cwd}"] if self.cwd and "mount" in self.namespaces else []
        return [NSENTER, "--target", str(self.process.pid), *flags, *workdir, "--", *command]


class ConfigError(RuntimeError):
    """A container's env names a secret, config map or key that is not there: the kubelet's
    CreateContainerConfigError (the pod stays Pending)."""


#: (plural, namespace, name) -> the stored object, or None
Lookup = Callable[[str, str, str], "Mapping[str, Any] | None"]
_SUBSCRIPT = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


def _field_ref(pod: Mapping[str, Any], path: str, ip: str) -> str:
    if path == "status.podIP":
        return ip
    if path == "status.hostIP":
        return "127.0.0.1"
    if m := _SUBSCRIPT.match(path):
        return str(((pod.get("metadata") or {}).get(m.group(1)) or {}).get(m.group(2), ""))
    value: Any = pod
    for part in path.split("."):
        value = value.get(part, {}) if isinstance(value, Mapping) else {}
    return value if isinstance(value, str) else ""


def _source_data(plural: str, ref: Mapping[str, Any], ns: str, lookup: Lookup | None) -> dict:
    """A secret's (decoded) or config map's data; {} for a missing optional one."""
    name = ref.get("name", "")
    obj = lookup(plural, ns, name) if lookup else None
    if obj is None:
        if ref.get("optional"):
            return {}
        kind = "secret" if plural == "secrets" else "configmap"
        raise ConfigError(f'{kind} "{name}" not found')
    if plural == "secrets":
        return {
            k: base64.b64decode(v).decode(errors="replace")
            for k, v in (obj.get("data") or {}).items()
        }
    return dict(obj.get("data") or {})


def container_env(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    ip: str,
    lookup: Lookup | None = None,
    any_address: str | None = None,
) -> dict[str, str]:
    """The container's environment: `envFrom` first, then `env` (value, fieldRef,
    secretKeyRef, configMapKeyRef), with 0.0.0.0 in literal values rewritten to `any_address`
    (the pod IP on the host's network; unchanged in a network namespace of its own)."""
    any_address = ip if any_address is None else any_address
    ns = (pod.get("metadata") or {}).get("namespace", "default")
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        for plural, key in (("configmaps", "configMapRef"), ("secrets", "secretRef")):
            if key in source:
                data = _source_data(plural, source[key], ns, lookup)
                env.update({source.get("prefix", "") + k: v for k, v in data.items()})
    for item in container.get("env") or []:
        value_from = item.get("valueFrom") or {}
        if "value" in item or not value_from:
            env[item["name"]] = str(item.get("value", "")).replace("0.0.0.0", any_address)
        elif field_ref := value_from.get("fieldRef"):
            env[item["name"]] = _field_ref(pod, field_ref.get("fieldPath", ""), ip)
        else:
            for plural, key in (("configmaps", "configMapKeyRef"), ("secrets", "secretKeyRef")):
                if ref := value_from.get(key):
                    # a missing source raises unless optional; then a missing key does too
                    data = _source_data(plural, ref, ns, lookup)
                    if ref.get("key") in data:
                        env[item["name"]] = data[ref["key"]]
                    elif not ref.get("optional"):
                        kind = "Secret" if plural == "secrets" else "ConfigMap"
                        raise ConfigError(
                            f"couldn't find key {ref.get('key')} in {kind} {ns}/{ref.get('name')}"
                        )
    return env


def container_command(container: Mapping[str, Any], images: Mapping[str, list[str]]) -> list[str]:
    command = list(container.get("command") or [])
    args = list(container.get("args") or [])
    if not command:
        command = list(images.get(container.get("image", ""), DEFAULT_COMMAND)) if not args else []
    return command + args


SIMULATE_GPU = "DEVCLUSTER_SIMULATED_GPU"  # "1": GPU pods read the demo's simulated GPU


def simulated_gpu_env(pod: Mapping[str, Any], container: Mapping[str, Any]) -> dict[str, str]:
    """The demo's simulated GPU for a pod that asked for one (fracspawner/serverext/sources.py,
    DemoSimulatedSource): only where the devcluster runs with DEVCLUSTER_SIMULATED_GPU=1 (`make
    demo`), and not where a test chose its own source (FRACSPAWNER_GPU_SOURCE)."""
    if os.environ.get(SIMULATE_GPU) != "1" or "FRACSPAWNER_GPU_SOURCE" in os.environ:
        return {}
    resources = container.get("resources") or {}
    asked = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
    claims = resources.get("claims")  # a DRA claim (devcluster/dra): a GPU without a resource
    if not claims and not any("gpu" in name or name.startswith("nvidia.com/") for name in asked):
        return {}
    selector = (pod.get("spec") or {}).get("nodeSelector") or {}
    product = selector.get("nvidia.com/gpu.product", "GPU").replace("-", " ")
    device: dict[str, Any] = {"name": f"{product} (simulated)", "kernel_memory_mib": 1536}
    mig = [
        n.removeprefix("nvidia.com/mig-") for n in sorted(asked) if n.startswith("nvidia.com/mig-")
    ]
    slice_label = ((pod.get("metadata") or {}).get("labels") or {}).get("fracspawner.io/gpu", "")
    if claims and slice_label.startswith("mig-"):  # a DRA MIG device: the slice says its profile
        mig = [slice_label.removeprefix("mig-")]
    if mig:  # a MIG instance reports no utilisation (NVML: NOT_SUPPORTED), as a real one
        device["mig"] = True
        device["name"] = f"{product} MIG {mig[0]} (simulated)"
    return {
        "FRACSPAWNER_GPU_SOURCE": "simulated-demo",
        "FRACSPAWNER_SIMULATED_GPU": json.dumps(device),
    }


async def terminate(process: asyncio.subprocess.Process, grace: float, home: Path) -> None:
    """The kubelet's stop: SIGTERM to the container's process group, `grace` seconds, then
    SIGKILL to the group and to what it started outside it (found by its HOME)."""
    if process.returncode is None:
        _signal_group(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), timeout=max(grace, 0))
        except asyncio.TimeoutError:
            pass
    _signal_group(process.pid, signal.SIGKILL)  # also children that outlived the leader
    _kill_escaped(home)
    if process.returncode is None:
        await process.wait()


class Kubelet:
    def __init__(
        self,
        state_dir: Path,
        images: Mapping[str, list[str]] | None = None,
        network: Network | None = None,
        bind_mounts: bool = False,
    ) -> None:
        """`bind_mounts`: volumes bound at their mountPaths in each pod's mount namespace
        (devcluster/bindmounts.py, the node agent) where the machine gives pods one, instead
        of the mountPaths rewritten on the command line."""
        self.state_dir = state_dir
        self.images = dict(images or {})
        self.bind_mounts = bind_mounts and sandboxes()
        self.network = network or Network(state_dir, lambda _ns: [])
        self.ips = self.network.ips
        self.running: dict[tuple[str, str], Running] = {}

    async def release(self, ip: str) -> None:
        """The pod is gone: its address (and network namespace) go back."""
        await self.network.release(ip)

    def pod_dir(self, namespace: str, name: str) -> Path:
        return self.state_dir / "pods" / namespace / name

    async def start(
        self,
        pod: Mapping[str, Any],
        lookup: Lookup | None = None,
        extra_env: Mapping[str, str] | None = None,
        ip: str | None = None,
    ) -> Running:
        """Start the pod's first container (or the one `pod` is viewed as, containers.py);
        `extra_env`: what the node agent adds under the container's own env (Service
        variables, its DRA claims' CDI edits, claimenv.py; a sibling's HOME and log);
        `ip`: the pod's address kept from its former run (a restarted container keeps its
        pod's IP)."""
        meta = pod["metadata"]
        key = (meta["namespace"], meta["name"])
        container = pod["spec"]["containers"][0]
        ports = [int(p["containerPort"]) for p in container.get("ports") or []]
        if ip is None:
            ip = self.ips.take(ports)
        else:
            self.ips.used.add(ip)
        home = self.pod_dir(*key) / "home"
        home.mkdir(parents=True, exist_ok=True)
        log_path = self.pod_dir(*key) / "container.log"
        env = {
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
            "HOME": str(home),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "HOSTNAME": meta["name"],
            "KUBERNETES_SERVICE_HOST": self.network.host_ip,
        }
        for passthrough in ("PYTHONPATH", "JUPYTER_CONFIG_PATH", "FRACSPAWNER_GPU_SOURCE"):
            if passthrough in os.environ:
                env[passthrough] = os.environ[passthrough]
        env.update(simulated_gpu_env(pod, container))
        env.update(extra_env or {})
        try:
            # volumes first: the kubelet waits for them before it makes the container's config
            mounts = volumes.materialise(
                pod,
                container,
                self.pod_dir(*key),
                self.state_dir,
                lookup or (lambda *_: None),
                lambda p, path: _field_ref(p, path, ip),
            )
            rewrite = (lambda text: text) if self.bind_mounts else volumes.rewriter(mounts)
            any_address = ip if self.network.rewrites_any_address() else "0.0.0.0"
            own = container_env(pod, container, ip, lookup, any_address)
        except (ConfigError, volumes.MountError):
            self.ips.give(ip)
            raise
        env.update({k: rewrite(v) for k, v in own.items()})
        command = [
            rewrite(c.replace("0.0.0.0", any_address))
            for c in container_command(container, self.images)
        ]
        workdir = rewrite(container.get("workingDir") or "") or None
        cwd = workdir if workdir and Path(workdir).is_dir() else str(home)
        exe = command[0] if command else ""
        if "/" in exe:
            exe = os.path.join(cwd, exe)  # relative to the working dir, as the exec would be
        if not exe or not shutil.which(exe, path=env["PATH"]):
            self.ips.give(ip)  # like a container runtime's "executable file not found"
            raise RuntimeError(
                f'exec: "{command[0] if command else ""}": executable file not found in $PATH'
            )
        try:
            sandbox = await self.network.sandbox(meta["namespace"], meta["name"], ip)
        except RuntimeError:
            await self.release(ip)
            raise
        if sandbox and self.bind_mounts:
            try:
                # the container's own rootfs: a sibling's start never empties it
                rootfs = self.pod_dir(*key) / "rootfs" / container["name"]
                binds = bindmounts.argv(mounts, rootfs, self.pod_dir(*key) / "mountpoints")
            except OSError as exc:
                await self.release(ip)
                raise volumes.MountError(f"MountVolume.SetUp failed: {exc}") from exc
            command = [*binds, *command]
        command = [*sandbox, *command]
        argv = [SETPRIV, "--pdeathsig", "KILL", "--", *command] if SETPRIV else command
        with open(log_path, "ab") as log:
            try:
                process = await asyncio.create_subprocess_exec(
                    *argv,
                    env=env,
                    cwd=cwd,
                    stdout=log,
                    stderr=log,
                    stdin=asyncio.subprocess.DEVNULL,
                    start_new_session=True,
                )
            except OSError as exc:
                await self.release(ip)
                raise RuntimeError(f'exec: "{command[0]}": {exc.strerror or exc}') from exc
        namespaces: tuple[str, ...] = ()
        if sandbox:
            namespaces = ("uts", "mount") + (("net",) if self.network.mode != "host" else ())
        running = Running(process, ip, log_path, env=env, cwd=cwd, namespaces=namespaces)
        self.running[key] = running
        return running

    async def stop(self, namespace: str, name: str, grace: float, release_ip: bool = True) -> None:
        running = self.running.pop((namespace, name), None)
        if running is None:
            return
        await terminate(running.process, grace, self.pod_dir(namespace, name) / "home")
        if release_ip:
            await self.release(running.ip)

    def kill_all(self) -> None:
        for (namespace, name), running in list(self.running.items()):
            _signal_group(running.process.pid, signal.SIGKILL)
            _kill_escaped(self.pod_dir(namespace, name) / "home")
            self.ips.give(running.ip)
        self.running.clear()


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_escaped(home: Path) -> None:
    """SIGKILL what a pod started outside its process group, as a container's cgroup would.

    jupyter_client starts kernels with start_new_session=True (launcher.py), so a notebook's
    kernels are not in the server's process group; they still carry the pod's HOME.
    """
    needle = f"HOME={home}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            try:
                os.kill(int(entry.name), signal.SIGKILL)
            except ProcessLookupError:
                pass


def port_open(ip: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((ip, port)) == 0
