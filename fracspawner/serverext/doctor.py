"""`fracspawner doctor`: in a notebook pod (a terminal, or `kubectl exec` as an admin), what the
pod was given and what works, in plain words on one screen.

- the slice, pool and idle policy FracSpawner put in the environment, the pod's memory and CPU
  limits (cgroup files), and the GPU-related environment (device visibility, sharing limits,
  framework caps);
- how the node's device plugin handed out the GPUs: by volume mounts or by env;
- what NVML sees (devices, memory, processes), or why it cannot be read;
- whether GPU hibernation is possible here, and which condition stops it (no cuda-python, a
  driver without the checkpoint API, a driver that cannot checkpoint in a container seeing only
  some GPUs, MIG), and the running server's kernels that are not hibernated and why;
- whether the culler is reachable, and whether this server's reports reach it (from the running
  server's own extension, found through jupyter-server's runtime files).

It changes nothing and needs no privilege. Exit status 0, or 1 when something needs attention.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .attribution import has_own_pid_namespace
from .checkpoint import CheckpointDriver, Unsupported, host_headroom
from .checkpoint_env import driver_problem, mig_problem, nvml_driver_version
from .podinfo import PodInfo, gib
from .sources import GpuUnavailable, NvmlSource

GPU_ENV = (
    "NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_MEMORY_LIMIT",
    "CUDA_DEVICE_SM_LIMIT", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    "CUPY_GPU_MEMORY_LIMIT", "XLA_PYTHON_CLIENT_MEM_FRACTION", "TF_FORCE_GPU_ALLOW_GROWTH",
    "GPU_MEM_LIMIT_GB",
)  # fmt: skip


def _minutes(seconds: float | None) -> str:
    if seconds is None:
        return "off"
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    return f"{seconds / 60:g} min" if seconds >= 60 else f"{seconds:g} s"


def _cpu_limit(root: Path) -> str | None:
    try:
        quota, period = (root / "cpu.max").read_text().split()
    except (OSError, ValueError):
        return None
    return None if quota == "max" else f"{int(quota) / int(period):g} CPUs"


def pod_lines(env: Mapping[str, str], cgroup: str, meminfo: str) -> list[str]:
    pod = PodInfo.from_environ(env)
    label = pod.slice_json()["label"]
    lines = [
        f"Slice:       {label} (pool {pod.pool})" if label else
        "Slice:       none: FracSpawner gave this pod no GPU (FRACSPAWNER_GPU_SLICE unset)",
    ]  # fmt: skip
    p = pod.policy
    lines.append(
        f"Idle policy: idle kernels hibernate {_minutes(p.kernel_gpu_hibernate)}, shut down "
        f"{_minutes(p.kernel_gpu_idle)}; server stopped GPU-idle {_minutes(p.server_gpu_idle)}, "
        f"idle {_minutes(p.server_idle)}"
    )
    room = host_headroom(cgroup, meminfo)  # the hibernator's reading: cgroup v2 or v1
    if room.limit_mib is None:
        memory = "memory limit unknown"
    elif math.isinf(room.limit_mib):
        memory = "no memory limit"
    else:
        memory = f"memory limit {gib(room.limit_mib)}"
    free = "unknown" if room.free_mib is None else gib(room.free_mib)
    cpu = _cpu_limit(Path(cgroup)) or "no CPU limit"
    lines.append(f"Limits:      {memory} ({free} free under {room.where}), {cpu}")
    gpu_env = [f"{k}={env[k]}" for k in GPU_ENV if env.get(k)]
    lines.append("GPU env:     " + (", ".join(gpu_env) if gpu_env else "none set"))
    return lines


#: where the NVIDIA toolkit reads a container's devices when the device plugin runs with
#: `deviceListStrategy: volume-mounts`: one (empty) mount per device, named by its id
#: (k8s-device-plugin api/config/v1/flags.go; the toolkit's
#: accept-nvidia-visible-devices-as-volume-mounts)
DEVICE_MOUNTS = "/var/run/nvidia-container-devices"


def device_list_line(env: Mapping[str, str], mounts: str = DEVICE_MOUNTS) -> str:
    """How this node's device plugin handed the pod its GPUs: by volume mounts (a pod's own
    NVIDIA_VISIBLE_DEVICES then chooses nothing where the toolkit also has
    accept-nvidia-visible-devices-envvar-when-unprivileged = false), or by env (the plugin's
    default, `envvar`: the kubelet puts the pod's own env after the plugin's, so a pod that
    sets the variable chooses its GPUs; issue 34)."""
    folder = Path(mounts)
    if folder.is_dir():
        try:
            names = sorted(p.name for p in folder.iterdir())
        except OSError:
            names = []
        shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
        return f"Devices:     by volume mounts ({mounts}: {shown or 'none'})"
    value = (env.get("NVIDIA_VISIBLE_DEVICES") or "").strip()
    if value and value not in ("void", "none"):
        return (
            f"Devices:     by env (NVIDIA_VISIBLE_DEVICES={value}): the node's device plugin "
            "uses deviceListStrategy envvar, where a pod's own env can choose GPUs "
            "(docs/install.md, GPU nodes)"
        )
    return "Devices:     no device-plugin GPU here (no device mounts, no device in the env)"


def nvml_lines() -> tuple[list[str], bool, list[str]]:
    """What NVML shows, whether it works, and the device indices ("0:3" for a MIG instance)."""
    source = NvmlSource()
    try:
        sample = source.sample()
    except GpuUnavailable as exc:
        return [f"NVML:        cannot read the GPU: {exc}"], False, []
    finally:
        source.close()
    lines = [f"NVML:        {len(sample.devices)} device(s) visible"]
    for d in sample.devices[:4]:
        util = "n/a (MIG)" if d.utilization is None else f"{d.utilization:.0f}%"
        lines.append(
            f"  {d.index}: {d.name}, {gib(d.memory_used_mib)} of {gib(d.memory_total_mib)} used, "
            f"utilisation {util}"
        )
    mine = sum(p.memory_mib for p in sample.processes)
    lines.append(f"  {len(sample.processes)} compute process(es) listed, {gib(mine)} in all")
    return lines, bool(sample.devices), [d.index for d in sample.devices]


def hibernation_lines(
    env: Mapping[str, str],
    cgroup: str,
    meminfo: str,
    devices: list[str] | None = None,
    in_container: bool | None = None,
) -> tuple[list[str], bool]:
    """Whether the CUDA checkpoint API works here, and if not which condition stops it: no
    cuda-python, a driver without the API, a driver that cannot checkpoint in a container that
    sees only some GPUs, MIG (checkpoint_env.py, the hibernator's own checks)."""
    policy = PodInfo.from_environ(env).policy.kernel_gpu_hibernate
    driver = CheckpointDriver()
    try:
        driver.check()
        cuda = driver.cuda_version()
    except Unsupported as exc:
        return [f"Hibernation: not possible here: {exc}"], policy is None
    except Exception as exc:  # a broken binding says so rather than a traceback
        return [f"Hibernation: not possible here: the checkpoint API failed: {exc}"], False
    version = nvml_driver_version()
    container = has_own_pid_namespace() if in_container is None else in_container
    said = f"driver {version or 'of unknown version'}, CUDA {cuda // 1000}.{cuda % 1000 // 10}"
    problem = driver_problem(version, container, all_gpus_visible=False) or mig_problem(
        devices or []
    )
    if problem is not None:
        note = (
            " (unless this pod sees every GPU of its node: Hibernator.all_gpus_visible)"
            if "#12, #24" in problem
            else ""
        )
        return [f"Hibernation: not possible here: {problem}{note}", f"  ({said})"], policy is None
    if policy is None:
        off = f"Hibernation: possible ({said}), but off for this pool (kernel_gpu_hibernate)"
        return [off], True
    room = host_headroom(cgroup, meminfo)
    free = "an unknown amount" if room.free_mib is None else gib(room.free_mib)
    return [
        f"Hibernation: possible (CUDA checkpoint API, {said}); a kernel can park up to {free} "
        f"of GPU memory in host memory ({room.where})"
    ], room.free_mib is not None


def kernel_hibernation_lines(report: dict | None, limit: int = 4) -> list[str]:
    """The running server's kernels that are not hibernated as asked, and why (its report)."""
    lines = []
    for k in (report or {}).get("kernels") or []:
        h = k.get("hibernation") or {}
        if h.get("state") == "hibernated" or not h.get("reason"):
            continue
        lines.append(f"  kernel {str(k.get('id'))[:8]}: {h.get('state')}: {h.get('reason')}")
    return lines[:limit]


def _servers(runtime_dir: str) -> list[dict]:
    found = []
    for path in sorted(glob.glob(os.path.join(runtime_dir, "jpserver-*.json"))):
        try:
            found.append(json.loads(Path(path).read_text()))
        except (OSError, ValueError):
            continue
    return found


def _get(url: str, token: str | None) -> tuple[int, Any]:
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"token {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, None


def server_report(env: Mapping[str, str], runtime_dir: str) -> dict | None:
    """This pod's running server's own report (its extension), if it can be asked."""
    for info in _servers(runtime_dir):
        url = info.get("url", "").rstrip("/") + "/api/fracspawner/gpu"
        for token in (info.get("token"), env.get("JUPYTERHUB_API_TOKEN")):
            try:
                status, body = _get(url, token)
            except OSError:
                break
            if status == 200 and isinstance(body, dict):
                return body
    return None


def culler_lines(env: Mapping[str, str], report: dict | None) -> tuple[list[str], bool]:
    url = (env.get("FRACSPAWNER_CULLER_URL") or "").strip()
    if not url:
        return ["Culler:      not configured (FRACSPAWNER_CULLER_URL unset): no reports sent"], True
    endpoint = url.rstrip("/") + "/api/reports"
    req = urllib.request.Request(endpoint, data=b"{}", method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            status = resp.status
    except urllib.error.HTTPError as exc:
        status = exc.code  # 401 without a token: it is there and asks who we are
    except OSError as exc:
        return [f"Culler:      NOT reachable at {endpoint}: {getattr(exc, 'reason', exc)}"], False
    lines = [f"Culler:      reachable at {endpoint} (HTTP {status} without a token, as expected)"]
    reporter = (report or {}).get("reporter")
    if reporter is None:
        lines.append("  reports:   unknown (the notebook server's extension could not be asked)")
        return lines, True
    if reporter.get("last_error"):
        lines.append(f"  reports:   REFUSED: {reporter['last_error']}")
        return lines, False
    if not reporter.get("sent"):
        lines.append("  reports:   none sent yet (one a minute once the server runs)")
        return lines, True
    lines.append(f"  reports:   {reporter['sent']} sent, the last at {reporter['last_sent_at']}")
    return lines, True


def in_notebook_pod(env: Mapping[str, str]) -> bool:
    """Whether this looks like a notebook pod: the kubelet sets KUBERNETES_SERVICE_HOST in every
    pod, the hub's spawner JUPYTERHUB_* in a single-user server's, FracSpawner its own."""
    return bool(env.get("KUBERNETES_SERVICE_HOST")) or any(
        name.startswith(("JUPYTERHUB_", "FRACSPAWNER_")) for name in env
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="fracspawner doctor",
        description="What this notebook pod was given and what works: slice, limits, NVML, "
        "hibernation, culler.",
    )
    parser.add_argument("--cgroup", default="/sys/fs/cgroup", help="the cgroup files' directory")
    parser.add_argument("--meminfo", default="/proc/meminfo", help=argparse.SUPPRESS)
    parser.add_argument("--devices-dir", default=DEVICE_MOUNTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    env = os.environ
    if not in_notebook_pod(env):  # it said "this notebook pod ... All fine" on a laptop
        print(
            "fracspawner doctor: not in a notebook pod (no KUBERNETES_SERVICE_HOST, no "
            "JUPYTERHUB_* or FRACSPAWNER_* variables): it checks the pod it runs in. Run it in "
            "a notebook's terminal, or `kubectl exec -it POD -- fracspawner doctor` as an admin.",
            file=sys.stderr,
        )
        return 2
    runtime = env.get("JUPYTER_RUNTIME_DIR") or os.path.expanduser("~/.local/share/jupyter/runtime")
    lines = ["fracspawner doctor: this notebook pod", ""]
    lines += pod_lines(env, args.cgroup, args.meminfo)
    lines.append(device_list_line(env, args.devices_dir))
    nvml, gpu_ok, devices = nvml_lines()
    hib, hib_ok = hibernation_lines(env, args.cgroup, args.meminfo, devices)
    report = server_report(env, runtime)
    hib += kernel_hibernation_lines(report)
    culler, culler_ok = culler_lines(env, report)
    lines += nvml + hib + culler
    if report is not None and report.get("kernels"):
        parked = report.get("hibernated_gpu_memory_mib") or 0
        lines.append(f"Kernels:     {len(report['kernels'])} running, {gib(parked)} hibernated")
    wants_gpu = PodInfo.from_environ(env).gpu is not None
    ok = culler_ok and (gpu_ok or not wants_gpu) and (hib_ok or not wants_gpu)
    lines += ["", "All fine." if ok else "Something needs attention: see the lines above."]
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
