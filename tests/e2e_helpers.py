"""Helpers for the end-to-end tests: pods in devcluster, a logged-in browser-less session."""

from __future__ import annotations

import json
import re
import socket
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import requests

from devcluster.localhub import LocalHub, http_json


def demo_topology_with_t4_jobs(jobs: int) -> dict:
    """The demo topology with `jobs` pre-existing pods each holding one T4 time-slicing replica."""
    import yaml

    from tests.conftest import DEMO_TOPOLOGY

    topology = yaml.safe_load(DEMO_TOPOLOGY.read_text())
    topology["pods"] = [
        {
            "name": f"training-{i}",
            "namespace": "default",
            "node": "gpu-t4-1",
            "limits": {"nvidia.com/gpu": "1"},
            "phase": "Running",
        }
        for i in range(jobs)
    ]
    return topology


def pods(cluster: Any, **labels: str) -> list[dict]:
    selector = ",".join(f"{k}={v}" for k, v in labels.items())
    status, body = http_json(
        "GET", f"{cluster.url}/api/v1/namespaces/default/pods?labelSelector={selector}"
    )
    assert status == 200, body
    return body["items"]


def server_pods(cluster: Any, user: str, server: str = "") -> list[dict]:
    return pods(cluster, **{"hub.jupyter.org/username": user, "hub.jupyter.org/servername": server})


def the_pod(cluster: Any, user: str, server: str = "") -> dict:
    found = server_pods(cluster, user, server)
    assert len(found) == 1, f"expected one pod for {user}/{server}, found {len(found)}"
    return found[0]


def container(pod: dict) -> dict:
    return pod["spec"]["containers"][0]


def env_of(pod: dict) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container(pod).get("env", [])}


def gpu_keys(pod: dict) -> dict[str, str]:
    """Every resource limit that is not cpu/memory/ephemeral storage."""
    limits = container(pod).get("resources", {}).get("limits", {}) or {}
    return {k: v for k, v in limits.items() if k not in ("cpu", "memory", "ephemeral-storage")}


def fracspawner_marks(pod: dict) -> dict[str, str]:
    meta = pod["metadata"]
    marks = {**(meta.get("labels") or {}), **(meta.get("annotations") or {})}
    return {k: v for k, v in marks.items() if k.startswith("fracspawner.io/")}


def spawn(hub: LocalHub, user: str, options: dict, server: str = "") -> tuple[int, Any]:
    hub.api("POST", f"/users/{user}", {})  # 201, or 409 when the user exists
    path = f"/users/{user}/servers/{server}" if server else f"/users/{user}/server"
    return hub.api("POST", path, {"user_options": options}, timeout=60)


def stop(hub: LocalHub, user: str, server: str = "", cluster: Any = None) -> None:
    path = f"/users/{user}/servers/{server}" if server else f"/users/{user}/server"
    status, body = hub.api("DELETE", path, timeout=60)
    assert status in (202, 204), (status, body)
    hub.wait_stopped(user, server)
    if cluster is not None:
        wait_until(lambda: not server_pods(cluster, user, server), what=f"pod of {user} deleted")


def spawn_all(hub: LocalHub, requests: list[tuple[str, dict, str]]) -> list[tuple[int, Any]]:
    """POST every (user, options, server) spawn at once, one thread each, as a class starting
    together would; (status, body) of each, in order."""
    for user in {user for user, _, _ in requests}:
        hub.api("POST", f"/users/{user}", {})
    with ThreadPoolExecutor(len(requests)) as pool:
        futures = [
            pool.submit(spawn, hub, user, options, server) for user, options, server in requests
        ]
        return [f.result() for f in futures]


def stop_all(hub: LocalHub, cluster: Any, servers: list[tuple[str, str]]) -> None:
    """Stop (user, server) servers at once and wait for their pods to go."""
    with ThreadPoolExecutor(max(len(servers), 1)) as pool:
        for future in [pool.submit(stop, hub, u, s, cluster) for u, s in servers]:
            future.result()


def wait_until(check, timeout: float = 60, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.3)
    raise TimeoutError(f"timed out waiting for {what}")


def ensure_group(hub: LocalHub, group: str, *users: str) -> None:
    for user in users:
        hub.api("POST", f"/users/{user}", {})
    hub.api("POST", f"/groups/{group}", {})
    status, body = hub.api("POST", f"/groups/{group}/users", {"users": list(users)})
    assert status == 200, body


def processes_of_user(user: str) -> list[int]:
    """PIDs whose environment says they serve this JupyterHub user (notebooks, kernels)."""
    found = []
    needle = f"JUPYTERHUB_USER={user}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if needle in env:
            found.append(int(entry.name))
    return found


def port_open(ip: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((ip, port)) == 0


class Browserless:
    """A logged-in user session against the hub's HTML pages (login, spawn form)."""

    def __init__(self, hub: LocalHub, user: str, password: str = "any") -> None:
        self.hub = hub
        self.session = requests.Session()
        page = self.session.get(f"{hub.url}/hub/login", timeout=30)
        page.raise_for_status()
        response = self.session.post(
            f"{hub.url}/hub/login",
            data={"username": user, "password": password, "_xsrf": self.xsrf()},
            timeout=30,
            allow_redirects=True,
        )
        response.raise_for_status()

    def xsrf(self) -> str:
        return self.session.cookies.get("_xsrf", "")

    def spawn_form(self, server: str = "") -> str:
        user = self.user_name()
        url = f"{self.hub.url}/hub/spawn/{user}" + (f"/{server}" if server else "")
        response = self.session.get(url, timeout=60)
        response.raise_for_status()
        return response.text

    def submit(self, data: dict[str, str], server: str = "") -> requests.Response:
        user = self.user_name()
        url = f"{self.hub.url}/hub/spawn/{user}" + (f"/{server}" if server else "")
        return self.session.post(url, data={**data, "_xsrf": self.xsrf()}, timeout=90)

    def user_name(self) -> str:
        response = self.session.get(
            f"{self.hub.url}/hub/api/user", timeout=30, headers={"X-XSRFToken": self.xsrf()}
        )
        response.raise_for_status()
        return response.json()["name"]


def error_on_page(html: str) -> str:
    """The error message JupyterHub shows on the spawn form, as text."""
    match = re.search(r'class="spawn-error-msg alert alert-danger"[^>]*>(.*?)</p>', html, re.S)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", match.group(1))).strip() if match else ""


def kill_leftovers_check(user: str) -> None:
    left = processes_of_user(user)
    assert not left, f"processes of {user} left behind: {left}"


def progress_events(
    hub: Any, user: str, when: str = "", then: Any = None, timeout: float = 90
) -> list[dict]:
    """Read the hub's spawn progress event stream for `user` until the spawn is ready or
    failed (or `timeout`); `then()` runs once, at the first message containing `when`."""
    request = urllib.request.Request(f"{hub.api_url}/users/{user}/server/progress")
    request.add_header("Authorization", f"token {hub.admin_token}")
    events: list[dict] = []
    deadline = time.monotonic() + timeout
    with urllib.request.urlopen(request, timeout=timeout) as stream:
        for raw in stream:
            line = raw.decode().strip()
            if line.startswith("data:"):
                event = json.loads(line[5:])
                events.append(event)
                if then is not None and when in event.get("message", ""):
                    then()
                    then = None
                if event.get("ready") or event.get("failed"):
                    break
            if time.monotonic() > deadline:
                break
    return events
