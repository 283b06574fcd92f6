"""What the node agent does for a pod in run mode that the Python devcluster's kubelet was tested
for (issue 35 item 4 moved these from tests/test_devcluster*.py onto the real control plane):
every volume kind at its mountPath (configMap, secret, projected, downwardAPI, emptyDir; items,
modes, subPath, optional), a missing ConfigMap or Secret keeping the pod ContainerCreating with
the kubelet's FailedMount until it exists (KubeSpawner creates its internal-SSL Secret and
Service after the pod), env from Secrets, ConfigMaps and fields, a container that ignores SIGTERM
killed after the grace period, what a pod started outside its process group ended with it, the
topology's image map, `0.0.0.0` rewritten to the pod's own loopback address, exec readiness and
startup probes, and the pod's hostname. Host network (a loopback address per pod); pods in
network namespaces of their own are tests/test_nodeagent_lifecycle.py's.
docs/devcluster.md "Node agent: pods in run mode"."""

from __future__ import annotations

import base64
import os
import signal
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient
from kubespawner.objects import make_owner_reference, make_secret, make_service

from devcluster.controlplane import ControlPlane
from devcluster.network import LoopbackPool, sandboxes
from devcluster.nodeagent import NodeAgent
from devcluster.proctree import proc
from tests.nodeagent_support import explained
from tests.realcluster_support import control_plane_fixture, node_agent_fixture
from tests.test_controlplane import eventually, get_json, kubectl

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
NS = "pods"
IMAGES = {"example.org/echo:1": ["python", "-c", "print('from-the-image-map')"]}
# prints each file (mode, path, content) the pod sees under its mountPaths, then exits
SHOW = r"""
import os, stat, sys
for top in sys.argv[1:]:
    for base, dirs, files in sorted(os.walk(top, followlinks=True)):
        dirs.sort()
        for f in sorted(files):
            p = os.path.join(base, f)
            mode = oct(stat.S_IMODE(os.stat(p).st_mode))
            print(mode, p.replace(top, top.rsplit("/", 1)[-1]), open(p).read().strip())
"""
# a Jupyter server starts kernels in sessions of their own: the child leaves the pod's group
ESCAPE = (
    "import subprocess; "
    "child = subprocess.Popen(['sleep', '600'], start_new_session=True); "
    "print(child.pid, flush=True); subprocess.run(['sleep', '600'])"
)


cp = control_plane_fixture()
agent = node_agent_fixture(
    {"nodes": [{"name": "pods-node", "capacity": {"cpu": "16"}}]},
    namespaces=[NS], mode="run", images=IMAGES, restart_backoff=(1.0, 4.0), sync_seconds=1.0,
)  # fmt: skip


def create(cp: ControlPlane, name: str, command: list[str] | None, **more: Any) -> None:
    container = {"name": "main", "image": more.pop("image", "python"), **more.pop("c", {})}
    if command is not None:
        container["command"] = command
    labels = more.pop("labels", {})
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": {"restartPolicy": "Never", "containers": [container], **more},
    }
    kubectl(cp, "create", "-f", "-", stdin=pod)


def pod(cp: ControlPlane, name: str) -> dict[str, Any]:
    return get_json(cp, "pod", name, "-n", NS)


def ready(p: dict[str, Any]) -> bool:
    return any(
        c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or []
    )


def events(cp: ControlPlane, name: str, reason: str) -> list[str]:
    found = get_json(cp, "events", "-n", NS, f"--field-selector=involvedObject.name={name}")
    return [e["message"] for e in found["items"] if e["reason"] == reason]


def finished_log(cp: ControlPlane, name: str, agent: NodeAgent | None = None) -> str:
    """The pod's log once it Succeeded; else fail with its status, events, logs and what
    `agent` knows of it."""
    with explained(cp, NS, name, agent):
        eventually(lambda: pod(cp, name)["status"].get("phase") in ("Succeeded", "Failed"),
                   f"{name} exits")  # fmt: skip
        assert pod(cp, name)["status"]["phase"] == "Succeeded", f"{name} failed"
    return kubectl(cp, "logs", name, "-n", NS).stdout


def logs(cp: ControlPlane, name: str) -> str:
    """The pod's log so far; "" while its container has not started (kubectl logs fails then:
    a wait for a line must not end there, as it did on a loaded machine in fresh27)."""
    return kubectl(cp, "logs", name, "-n", NS, check=False).stdout


def secret(name: str, **data: str) -> dict[str, Any]:
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": NS},
            "data": encoded}  # fmt: skip


def config_map(name: str, **data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": NS},
            "data": data}  # fmt: skip


# ---------------------------------------------------------------- volumes
def test_every_volume_kind_reaches_the_process_at_its_mount_path(cp, agent):
    hub_config = {"jupyterhub_config.py": "c.X = 1", "other": "o", "values.yaml": "v: 1"}
    kubectl(cp, "create", "-f", "-", stdin=config_map("hub-config", **hub_config))
    kubectl(cp, "create", "-f", "-", stdin=secret("ssl", **{"ssl.key": "KEY", "ssl.crt": "CRT"}))
    volumes = [
        {"name": "config", "configMap": {"name": "hub-config", "items": [
            {"key": "jupyterhub_config.py", "path": "jupyterhub_config.py"},
            {"key": "other", "path": "sub/renamed", "mode": 0o600},
        ]}},
        {"name": "ssl", "secret": {"secretName": "ssl", "defaultMode": 0o400}},
        {"name": "nothing", "configMap": {"name": "absent", "optional": True}},
        {"name": "both", "projected": {"sources": [
            {"configMap": {"name": "hub-config", "items": [{"key": "other", "path": "o"}]}},
            {"secret": {"name": "ssl", "items": [{"key": "ssl.crt", "path": "crt"}]}},
            {"downwardAPI": {"items": [
                {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}]}},
        ]}},
        {"name": "info", "downwardAPI": {"items": [
            {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
            {"path": "ns", "fieldRef": {"fieldPath": "metadata.namespace"}},
        ]}},
        {"name": "scratch", "emptyDir": {}},
    ]  # fmt: skip
    mounts = [
        {"name": "config", "mountPath": "/etc/jupyterhub"},
        {"name": "ssl", "mountPath": "/etc/jupyterhub-ssl"},
        {"name": "nothing", "mountPath": "/opt/nothing"},
        {"name": "both", "mountPath": "/var/both"},
        {"name": "info", "mountPath": "/etc/podinfo"},
        {"name": "scratch", "mountPath": "/scratch"},
        {"name": "config", "mountPath": "/srv/values.yaml", "subPath": "jupyterhub_config.py"},
    ]
    tops = ["/etc/jupyterhub", "/etc/jupyterhub-ssl", "/opt/nothing", "/var/both",
            "/etc/podinfo", "/scratch"]  # fmt: skip
    check_subpath = "import sys; sys.exit(open('/srv/values.yaml').read() != 'c.X = 1')"
    create(cp, "show", ["python", "-c", SHOW, *tops], labels={"app": "show"}, volumes=volumes,
           c={"volumeMounts": mounts})  # fmt: skip
    create(cp, "subpath", ["python", "-c", check_subpath], volumes=volumes[:1],
           c={"volumeMounts": mounts[-1:]})  # fmt: skip
    lines = finished_log(cp, "show", agent).splitlines()
    assert "0o644 jupyterhub/jupyterhub_config.py c.X = 1" in lines, lines
    assert "0o600 jupyterhub/sub/renamed o" in lines
    assert not any("values.yaml" in line for line in lines)  # only the items
    assert "0o400 jupyterhub-ssl/ssl.key KEY" in lines
    assert "0o400 jupyterhub-ssl/ssl.crt CRT" in lines
    assert "0o644 both/o o" in lines
    assert "0o644 both/crt CRT" in lines
    assert "0o644 both/name show" in lines
    assert '0o644 podinfo/labels app="show"' in lines
    assert f"0o644 podinfo/ns {NS}" in lines
    assert not any(" nothing/" in line or " scratch/" in line for line in lines)
    finished_log(cp, "subpath", agent)


def test_a_missing_key_in_items_is_the_kubelet_s_failed_mount(cp, agent):
    kubectl(cp, "create", "-f", "-", stdin=config_map("partial"))
    volumes = [
        {"name": "v", "configMap": {"name": "partial", "items": [{"key": "k", "path": "k"}]}}
    ]
    create(cp, "nokey", ["true"], volumes=volumes,
           c={"volumeMounts": [{"name": "v", "mountPath": "/etc/x"}]})  # fmt: skip
    said = eventually(lambda: events(cp, "nokey", "FailedMount"), "a FailedMount event")
    assert said[0] == (
        'MountVolume.SetUp failed for volume "v" : configmap references non-existent config key: k'
    )


# prints what it reads at each path, every half second, as one line
WATCH = r"""
import sys, time
while True:
    print(*(open(p).read().strip() for p in sys.argv[1:]), flush=True)
    time.sleep(0.5)
"""


def test_a_changed_config_map_reaches_a_running_pod_but_not_its_subpath_mount(cp, agent):
    """The kubelet's periodic sync writes a running pod's ConfigMap volumes again
    (kubernetes.io "ConfigMaps": "mounted ConfigMaps are updated automatically"; "a container
    using a ConfigMap as a subPath volume mount will not receive ConfigMap updates"), so a
    rotated certificate or a new catalog reaches the webhook and the hub without a restart. A
    ConfigMap deleted meanwhile leaves the files as they were, with a FailedMount event."""
    kubectl(cp, "create", "-f", "-", stdin=config_map("live", greeting="hello"))
    volumes = [{"name": "v", "configMap": {"name": "live"}}]
    mounts = [
        {"name": "v", "mountPath": "/etc/live"},
        {"name": "v", "mountPath": "/etc/greeting", "subPath": "greeting"},
    ]
    create(cp, "watcher", ["python", "-c", WATCH, "/etc/live/greeting", "/etc/greeting"],
           volumes=volumes, c={"volumeMounts": mounts})  # fmt: skip

    def last() -> str:
        lines = logs(cp, "watcher").splitlines()
        return lines[-1] if lines else ""

    with explained(cp, NS, "watcher", agent):
        eventually(lambda: last() == "hello hello", "the pod reads hello")
        kubectl(cp, "apply", "-f", "-", stdin=config_map("live", greeting="bye"))
        eventually(lambda: last() == "bye hello", "the change reaches the whole volume's mount")
        kubectl(cp, "delete", "configmap", "live", "-n", NS)
        said = eventually(lambda: events(cp, "watcher", "FailedMount"), "a FailedMount event")
    assert said[0] == 'MountVolume.SetUp failed for volume "v" : configmap "live" not found'
    assert last() == "bye hello"
    assert pod(cp, "watcher")["status"]["containerStatuses"][0]["restartCount"] == 0


def test_kubespawner_s_ssl_secret_and_service_made_after_the_pod(cp, agent, tmp_path: Path):
    """KubeSpawner creates the pod first, then its internal-SSL Secret and its Service, owned by
    the pod (kubespawner/objects.py make_secret, make_service, make_owner_reference): the pod
    waits in ContainerCreating with FailedMount until the Secret exists, reads its key at the
    env's mountPath, is Ready once the readinessProbe passes, and kube-controller-manager's
    garbage collector takes the Secret and Service with the pod."""
    name, ssl = "jupyter-ann", "/etc/jupyterhub/ssl"
    listen = tmp_path / "listen"
    serve = (
        "import os, sys, time, http.server\n"
        "while not os.path.exists(sys.argv[1]):\n    time.sleep(0.1)\n"
        "key = open(os.environ['JUPYTERHUB_SSL_KEYFILE'], 'rb').read()\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        self.send_response(200); self.end_headers(); self.wfile.write(key)\n"
        "http.server.HTTPServer(('0.0.0.0', 8888), H).serve_forever()\n"
    )
    container = {
        "env": [{"name": "JUPYTERHUB_SSL_KEYFILE", "value": f"{ssl}/ssl.key"}],
        "volumeMounts": [{"name": "jupyterhub-internal-certs", "mountPath": ssl}],
        "ports": [{"containerPort": 8888}],
        "readinessProbe": {"httpGet": {"path": "/", "port": 8888}, "periodSeconds": 1},
    }
    certs = [{"name": "jupyterhub-internal-certs", "secret": {"secretName": name}}]
    create(cp, name, ["python", "-c", serve, str(listen)], c=container, volumes=certs,
           labels={"component": "singleuser-server"}, terminationGracePeriodSeconds=1)  # fmt: skip
    said = eventually(lambda: events(cp, name, "FailedMount"), "FailedMount")
    assert said[0] == (
        f'MountVolume.SetUp failed for volume "jupyterhub-internal-certs" : '
        f'secret "{name}" not found'
    )
    waiting = pod(cp, name)["status"]["containerStatuses"][0]["state"]["waiting"]
    assert (pod(cp, name)["status"]["phase"], waiting["reason"]) == ("Pending", "ContainerCreating")
    for part in ("keyfile", "certfile", "cafile", "hubca"):
        (tmp_path / part).write_text(f"-----{part}-----\n")
    owner = [make_owner_reference(name, pod(cp, name)["metadata"]["uid"])]
    paths = {p: str(tmp_path / p) for p in ("keyfile", "certfile", "cafile")}
    for obj in (
        make_secret(name, "ann", paths, str(tmp_path / "hubca"), owner),
        make_service(name, 8888, {"component": "singleuser-server"}, owner),
    ):
        # the JSON KubeSpawner's client sends (a client made without its connection pool)
        body = object.__new__(ApiClient).sanitize_for_serialization(obj)
        body = {"apiVersion": "v1", **body, "metadata": {**body["metadata"], "namespace": NS}}
        kubectl(cp, "create", "-f", "-", stdin=body)
    running = lambda: pod(cp, name)["status"].get("phase") == "Running" and pod(cp, name)  # noqa: E731
    with explained(cp, NS, name, agent):
        started = eventually(running, "the pod starts once its Secret exists")
        eventually(lambda: events(cp, name, "Unhealthy"), "readiness fails while nothing listens")
        assert not ready(started)
        listen.touch()
        eventually(lambda: ready(pod(cp, name)), "Ready once the server listens")
    url = f"http://{pod(cp, name)['status']['podIP']}:8888/"
    assert urllib.request.urlopen(url, timeout=10).read() == b"-----keyfile-----\n"
    kubectl(cp, "delete", "pod", name, "-n", NS, "--wait=true", "--timeout=60s")
    eventually(
        lambda: not kubectl(cp, "get", "secret,service", name, "-n", NS, "--ignore-not-found",
                            "-o", "name").stdout.strip(),
        "the Secret and Service collected with the pod",
    )  # fmt: skip


# ---------------------------------------------------------------- env, exit, processes
def test_env_from_secrets_config_maps_and_fields_waits_for_the_secret(cp, agent):
    show = "import os, sys; print(*[os.environ.get(k, '-') for k in sys.argv[1:]])"
    names = ["TOKEN", "COLOUR", "CFG_SIZE", "POOL", "BIND"]
    container = {
        "envFrom": [{"configMapRef": {"name": "settings"}, "prefix": "CFG_"}],
        "env": [
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
            {"name": "COLOUR",
             "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "colour"}}},
            {"name": "POOL",
             "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['fracspawner.io/pool']"}}},
            {"name": "BIND", "value": "0.0.0.0:8888"},
        ],
    }  # fmt: skip
    kubectl(cp, "create", "-f", "-", stdin=config_map("settings", colour="blue", SIZE="3"))
    create(cp, "env", ["python", "-c", show, *names], c=container,
           labels={"fracspawner.io/pool": "h100"})  # fmt: skip

    def waiting_reason() -> str | None:
        statuses = pod(cp, "env")["status"].get("containerStatuses") or [{}]
        return ((statuses[0].get("state") or {}).get("waiting") or {}).get("reason")

    # the Secret does not exist yet: the kubelet cannot make the container's config
    eventually(lambda: waiting_reason() == "CreateContainerConfigError", "the config error")
    assert pod(cp, "env")["status"]["phase"] == "Pending"
    kubectl(cp, "create", "-f", "-", stdin=secret("creds", token="s3cret"))
    words = finished_log(cp, "env", agent).split()
    ip = pod(cp, "env")["status"]["podIP"]
    # 0.0.0.0 in a literal value is the pod's own loopback address (host network)
    assert words == ["s3cret", "blue", "3", "h100", f"{ip}:8888"]


def test_a_container_ignoring_sigterm_is_killed_after_the_grace_period(cp, agent):
    stubborn = (
        "import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        "print('pid', os.getpid(), flush=True); time.sleep(600)"
    )
    create(cp, "stubborn", ["python", "-c", stubborn], terminationGracePeriodSeconds=2)
    with explained(cp, NS, "stubborn", agent):
        eventually(lambda: pod(cp, "stubborn")["status"].get("phase") == "Running",
                   "stubborn runs")  # fmt: skip
    words = eventually(lambda: logs(cp, "stubborn").split(), "its pid")
    process = int(words[1])
    assert proc(process)
    kubectl(cp, "delete", "pod", "stubborn", "-n", NS, "--wait=true", "--timeout=60s")
    assert events(cp, "stubborn", "Killing") == ["Stopping container main"]
    eventually(lambda: not proc(process), "the stubborn process killed")


def test_deleting_a_pod_ends_what_it_started_outside_its_group(cp, agent):
    """Jupyter starts kernels in their own session; deleting the pod still ends them."""
    create(cp, "escaper", [sys.executable, "-c", ESCAPE], terminationGracePeriodSeconds=1)
    log = eventually(lambda: logs(cp, "escaper").split(), "a pid")
    pid = int(log[0])
    try:
        assert proc(pid)
        kubectl(cp, "delete", "pod", "escaper", "-n", NS, "--wait=true", "--timeout=60s")
        eventually(lambda: not proc(pid), "the escaped child ends")
    finally:
        if proc(pid):  # the test failed: still leave nothing behind
            os.kill(pid, signal.SIGKILL)


def test_the_image_map_gives_a_command_to_images_without_one(cp, agent):
    create(cp, "mapped", None, image="example.org/echo:1")
    assert finished_log(cp, "mapped", agent).strip() == "from-the-image-map"


# ---------------------------------------------------------------- probes
def test_an_exec_readiness_probe_failing_keeps_the_pod_not_ready(cp, agent):
    probe = {"exec": {"command": ["false"]}, "periodSeconds": 1}
    create(cp, "unready", ["sleep", "600"], c={"readinessProbe": probe})
    eventually(lambda: events(cp, "unready", "Unhealthy"), "a failed readiness probe")
    assert pod(cp, "unready")["status"]["phase"] == "Running"
    assert not ready(pod(cp, "unready"))
    kubectl(cp, "delete", "pod", "unready", "-n", NS, "--wait=false")


def test_a_failing_startup_probe_restarts_the_container(cp, agent):
    probe = {"exec": {"command": ["false"]}, "periodSeconds": 1, "failureThreshold": 2}
    create(cp, "unstarted", ["sleep", "600"], restartPolicy="Always", c={"startupProbe": probe})
    eventually(
        lambda: (pod(cp, "unstarted")["status"].get("containerStatuses") or [{}])[0].get(
            "restartCount", 0) >= 1, "a restart",
    )  # fmt: skip
    killing = events(cp, "unstarted", "Killing")
    assert "Container main failed startup probe, will be restarted" in killing, killing
    assert not ready(pod(cp, "unstarted"))
    kubectl(cp, "delete", "pod", "unstarted", "-n", NS, "--wait=false")


# ---------------------------------------------------------------- the sandbox
@pytest.mark.skipif(not sandboxes(), reason="needs root and util-linux unshare")
def test_a_pod_s_hostname_is_its_name_also_for_kubectl_exec(cp, agent):
    name = "a-pod-with-a-name-longer-than-sixty-three-characters-is-cut-to-63-x"
    hostname = ["python", "-c", "import socket; print(socket.gethostname())"]
    create(cp, name, hostname)
    assert finished_log(cp, name, agent) == name[:63].rstrip("-.") + "\n"
    create(cp, "box", ["sleep", "600"])
    with explained(cp, NS, "box", agent):
        eventually(lambda: pod(cp, "box")["status"].get("phase") == "Running", "box runs")
    done = kubectl(cp, "exec", "box", "-n", NS, "--", *hostname)
    assert done.stdout == "box\n", done.stderr
    kubectl(cp, "delete", "pod", "box", "-n", NS, "--wait=false")


def test_pod_addresses_skip_those_whose_port_is_taken():
    """Another cluster's pod (or anything) listening there must not be mistaken for ours."""
    import socket

    first = LoopbackPool(seed=7).take([18888])
    with socket.socket() as other:
        other.bind((first, 18888))
        other.listen()
        assert LoopbackPool(seed=7).take([18888]) != first
        assert LoopbackPool(seed=7).take([18889]) == first
