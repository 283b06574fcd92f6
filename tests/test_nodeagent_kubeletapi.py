"""The node agent's kubelet API (devcluster/nodeagent/kubeletapi.py, served by
`kube-controlplane kubelet-api`, controlplane/kubeletapi.go) behind the real apiserver: `kubectl
exec` (WebSocket v5 to the apiserver, which speaks SPDY to the kubelet) and kubernetes_asyncio's
stream client (WebSocket v4, passed through to the kubelet) run a command beside a run-mode
pod's container with its env and get its output and exit status; `kubectl logs` (tail,
timestamps, follow) returns the container's output; `kubectl port-forward` reaches a port the
pod listens on; the kubelet API refuses a request without the apiserver's client certificate
(401) and a certificate of the same CA that is not the apiserver's (403); a stopped or killed
agent leaves no kubelet-api process. docs/controlplane.md "Node agent"."""

from __future__ import annotations

import datetime
import re
import signal
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client, config
from kubernetes_asyncio.stream import WsApiClient

from devcluster.certs import make_ca
from devcluster.controlplane import ControlPlane
from devcluster.controlplane.pki import issue_client
from devcluster.network import network_namespaces, sandboxes
from devcluster.nodeagent import NodeAgent
from devcluster.nodeagent.credentials import load_ca
from devcluster.proctree import descendants, proc
from devcluster.topology import load_topology
from tests.netns import bridge_links, links, own_network_fixture
from tests.nodeagent_support import explained
from tests.realcluster_support import control_plane_fixture
from tests.test_controlplane import eventually, get_json, kubectl

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
REPO = Path(__file__).resolve().parent.parent
NS = "kapi"
NODE = "kapi-node"
TOPOLOGY = {"nodes": [{"name": NODE, "capacity": {"cpu": "8", "memory": "16Gi"}}]}
NETNS_NODE = "kapi-netns"
NETNS_TAINT = {"key": "kapi/netns", "value": "true", "effect": "NoSchedule"}


# netns_agent's bridge and veths, the control plane it reaches, the other agents and the tests'
# kubectl: in a network namespace of the module's own (tests/netns.py), set up before `cp`
own_module_network = own_network_fixture()
cp = control_plane_fixture(namespaces=[NS])


@pytest.fixture(scope="module")
def agent(cp: ControlPlane) -> Iterator[NodeAgent]:
    state = cp.state_dir / "nodeagent"
    with NodeAgent.start(
        load_topology(TOPOLOGY), cp.server, cp.pki.ca, state, mode="run", restart_backoff=(1, 4)
    ) as a:
        assert a.kubelet_api is not None
        served = proc(a.kubelet_api.component.process.pid)
        yield a
    # a stopped agent leaves no kubelet-api behind
    assert served is not None and not served.alive()


def pod(name: str, command: list[str], node: str = NODE, **container: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{**NETNS_TAINT, "operator": "Equal"}],
            "containers": [{"name": "main", "image": "python", "command": command, **container}],
        },
    }


def started(
    cp: ControlPlane, manifest: dict[str, Any], *phases: str, agent: NodeAgent | None = None
) -> dict[str, Any]:
    """Create the pod; once it is in one of `phases`, as the apiserver has it. Else fail with
    what the pod shows, its events and logs, and what `agent` knows of it."""
    kubectl(cp, "create", "-f", "-", stdin=manifest)
    name = manifest["metadata"]["name"]
    with explained(cp, NS, name, agent):
        return eventually(
            lambda: (
                (p := get_json(cp, "pod", name, "-n", NS))["status"].get("phase") in phases and p
            ),
            f"{name} {'/'.join(phases)}",
        )


def ready(cp: ControlPlane, name: str, agent: NodeAgent | None = None) -> dict[str, Any]:
    """The pod once its Ready condition is True (`kubectl wait --for=condition=Ready`)."""

    def probe() -> dict[str, Any] | None:
        got = get_json(cp, "pod", name, "-n", NS)
        states = {c["type"]: c["status"] for c in got["status"].get("conditions") or []}
        return got if states.get("Ready") == "True" else None

    with explained(cp, NS, name, agent):
        return eventually(probe, f"{name} Ready")


def through_port_forward(
    cp: ControlPlane, name: str, port: int, path: str, agent: NodeAgent | None = None
) -> str:
    """GET `path` from the pod's `port` through `kubectl port-forward`, as a user would: once
    the pod is Ready (without a readinessProbe the node agent's pod is Ready when its first
    containerPort answers, podworker.py), and after kubectl printed 'Forwarding from'. Running
    is not enough: a connection the pod refuses ends kubectl port-forward ('lost connection to
    pod', kubectl >= 1.23, kubernetes/kubernetes#103526, kubectl#1169), as with the real
    kubelet, so a retry after it reaches nothing."""
    ready(cp, name, agent)
    forward = subprocess.Popen(
        ["kubectl", f"--kubeconfig={cp.kubeconfig}", "port-forward", f"pod/{name}", f":{port}",
         "-n", NS], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        line = forward.stdout.readline() if forward.stdout else ""
        match = re.match(rf"Forwarding from 127\.0\.0\.1:(\d+) -> {port}\n", line)
        assert match, (line, forward.poll())
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{match[1]}{path}", timeout=60) as resp:
                return resp.read().decode()
        except OSError as exc:
            forward.terminate()
            _, stderr = forward.communicate(timeout=30)
            raise AssertionError(f"{exc}; kubectl port-forward: {stderr}") from exc
    finally:
        forward.terminate()
        forward.wait(timeout=30)


@pytest.fixture(scope="module")
def sleeper(cp: ControlPlane, agent: NodeAgent) -> str:
    env = [{"name": "MARKER", "value": "from-the-pod-spec"}]
    started(cp, pod("sleeper", ["sleep", "600"], env=env), "Running", agent=agent)
    return "sleeper"


def test_the_node_advertises_the_kubelet_api_port(cp, agent):
    node = get_json(cp, "node", NODE)
    assert node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"] == agent.kubelet_api.port
    assert {"type": "InternalIP", "address": "127.0.0.1"} in node["status"]["addresses"]


def test_kubectl_exec_runs_beside_the_container_with_its_env_and_exit_status(
    cp, agent, sleeper, tmp_path: Path
):
    done = kubectl(cp, "exec", sleeper, "-n", NS, "--", "sh", "-c",
                   'echo "marker=$MARKER"; echo oops >&2; exit 3', check=False)  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert done.stdout == "marker=from-the-pod-spec\n"
    assert "oops" in done.stderr
    # in the container's working directory
    assert agent.runtime is not None
    cwd = agent.runtime.kubelet.running[(NS, sleeper)].cwd
    assert kubectl(cp, "exec", sleeper, "-n", NS, "--", "pwd").stdout == f"{cwd}\n"
    if sandboxes():  # in the pod's own UTS namespace, as the container
        assert kubectl(cp, "exec", sleeper, "-n", NS, "--", "hostname").stdout == f"{sleeper}\n"
    # stdin reaches the command
    echoed = subprocess.run(
        ["kubectl", f"--kubeconfig={cp.kubeconfig}", "exec", "-i", sleeper, "-n", NS, "--",
         "cat"], input="through stdin\n", capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert (echoed.returncode, echoed.stdout) == (0, "through stdin\n"), echoed.stderr
    # kubectl cp: tar through exec, its stdin closed at the end of the file
    (tmp_path / "local.txt").write_text("copied in\n")
    kubectl(cp, "cp", str(tmp_path / "local.txt"), f"{NS}/{sleeper}:{tmp_path}/copied.txt")
    assert (tmp_path / "copied.txt").read_text() == "copied in\n"
    # a command that is not there: an error, not a hang
    missing = kubectl(cp, "exec", sleeper, "-n", NS, "--", "no-such-program", check=False)
    assert missing.returncode != 0
    assert "no-such-program" in missing.stderr


async def test_kubernetes_asyncio_stream_exec_gets_the_output(cp, sleeper):
    configuration = client.Configuration()
    await config.load_kube_config(str(cp.kubeconfig), client_configuration=configuration)
    async with WsApiClient(configuration=configuration) as ws:
        out = await client.CoreV1Api(ws).connect_get_namespaced_pod_exec(
            sleeper, NS, command=["sh", "-c", "echo out; echo err >&2"],
            stdout=True, stderr=True, stdin=False, tty=False,
        )  # fmt: skip
        # with tty=True the command's stdin and stdout are a terminal
        terminal = await client.CoreV1Api(ws).connect_get_namespaced_pod_exec(
            sleeper, NS, command=["sh", "-c", "test -t 0 && test -t 1 && tty"],
            stdout=True, stderr=False, stdin=False, tty=True,
        )  # fmt: skip
    # stdout and stderr are separate streams: their order on arrival is not the command's
    assert sorted(out.splitlines()) == ["err", "out"]
    assert terminal.startswith("/dev/pts/"), terminal


def test_kubectl_logs_returns_the_container_s_output(cp, agent):
    script = "import time\nfor i in range(3): print('line', i, flush=True)\ntime.sleep(2)\n"
    started(cp, pod("talker", ["python", "-c", script]), "Running", "Succeeded", agent=agent)
    with explained(cp, NS, "talker", agent):
        eventually(
            lambda: kubectl(cp, "logs", "talker", "-n", NS).stdout == "line 0\nline 1\nline 2\n",
            "talker's three lines",
        )
    assert kubectl(cp, "logs", "talker", "-n", NS, "--tail=1").stdout == "line 2\n"
    stamped = kubectl(cp, "logs", "talker", "-n", NS, "--timestamps").stdout.splitlines()
    assert [line.split(" ", 1)[1] for line in stamped] == ["line 0", "line 1", "line 2"]
    when = datetime.datetime.fromisoformat(stamped[0].split(" ", 1)[0].replace("Z", "+00:00"))
    age = datetime.datetime.now(datetime.timezone.utc) - when
    assert datetime.timedelta(0) <= age < datetime.timedelta(minutes=5)
    assert kubectl(cp, "logs", "talker", "-n", NS, "--since=1h").stdout.count("line") == 3
    # --follow ends when the container does
    followed = kubectl(cp, "logs", "-f", "talker", "-n", NS)
    assert followed.stdout == "line 0\nline 1\nline 2\n"
    with explained(cp, NS, "talker", agent):
        eventually(lambda: get_json(cp, "pod", "talker", "-n", NS)["status"]["phase"]
                   == "Succeeded", "talker Succeeded")  # fmt: skip
    # an exited container's log stays readable
    assert kubectl(cp, "logs", "talker", "-n", NS).stdout == "line 0\nline 1\nline 2\n"


def test_kubectl_port_forward_reaches_a_port_the_pod_listens_on(cp, agent, tmp_path: Path):
    (tmp_path / "hello.txt").write_text("hello through the tunnel\n")
    server = pod(
        "web",
        ["python", "-m", "http.server", "8000", "--bind", "0.0.0.0", "--directory",
         str(tmp_path)],
        ports=[{"containerPort": 8000}],
    )  # fmt: skip
    started(cp, server, "Running", agent=agent)
    assert (
        through_port_forward(cp, "web", 8000, "/hello.txt", agent) == "hello through the tunnel\n"
    )


def test_logs_are_the_running_container_s_and_previous_the_one_before(cp, agent, sleeper, tmp_path):
    marker = tmp_path / "ran-once"
    script = (
        "import os, sys, time\n"
        f"if os.path.exists({str(marker)!r}): print('second run', flush=True); time.sleep(600)\n"
        f"open({str(marker)!r}, 'w').close(); print('first run', flush=True); sys.exit(1)\n"
    )
    manifest = pod("restarts", ["python", "-c", script])
    manifest["spec"]["restartPolicy"] = "OnFailure"
    kubectl(cp, "create", "-f", "-", stdin=manifest)

    def restarted() -> bool:
        statuses = get_json(cp, "pod", "restarts", "-n", NS)["status"].get("containerStatuses")
        return (
            bool(statuses)
            and statuses[0]["restartCount"] >= 1
            and "running" in (statuses[0]["state"])
        )

    logs = lambda *more: kubectl(cp, "logs", "restarts", "-n", NS, *more, check=False)  # noqa: E731
    with explained(cp, NS, "restarts", agent):
        eventually(restarted, "restarts runs again")
        eventually(lambda: logs().stdout == "second run\n", "the second run's log alone")
    assert logs("--previous").stdout == "first run\n"
    never = kubectl(cp, "logs", sleeper, "-n", NS, "--previous", check=False)
    assert never.returncode != 0
    assert "previous terminated container" in never.stderr


def test_kubectl_attach_streams_the_container_s_output(cp, agent):
    script = (
        "import itertools, time\n"
        "for i in itertools.count(): print('tick', i, flush=True); time.sleep(0.3)\n"
    )
    started(cp, pod("ticker", ["python", "-c", script]), "Running", agent=agent)
    attach = subprocess.Popen(
        ["kubectl", f"--kubeconfig={cp.kubeconfig}", "attach", "ticker", "-n", NS],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        line = attach.stdout.readline() if attach.stdout else ""
        assert re.fullmatch(r"tick \d+\n", line), (line, attach.poll())
    finally:
        attach.terminate()
        attach.wait(timeout=30)


def test_exec_and_logs_reach_every_container_of_the_pod(cp, agent):
    manifest = pod("multi", ["sh", "-c", "echo main up; exec sleep 600"],
                   env=[{"name": "WHO", "value": "main"}])  # fmt: skip
    spec = manifest["spec"]
    spec["containers"].append({
        "name": "second", "image": "python", "env": [{"name": "WHO", "value": "second"}],
        "command": ["sh", "-c", "echo second up; exec sleep 600"],
    })  # fmt: skip
    spec["initContainers"] = [
        {"name": "init", "image": "python", "command": ["sh", "-c", "echo init ran"]},
        {"name": "sidecar", "image": "python", "restartPolicy": "Always",
         "command": ["sh", "-c", "echo sidecar up; while sleep 0.3; do echo tick; done"]},
    ]  # fmt: skip
    started(cp, manifest, "Running", agent=agent)

    def all_running() -> bool:  # Running once one app container runs: the others follow
        status = get_json(cp, "pod", "multi", "-n", NS)["status"]
        apps = status.get("containerStatuses") or []
        return len(apps) == 2 and all("running" in c["state"] for c in apps)

    run = lambda *a: kubectl(cp, "-n", NS, *a, check=False)  # noqa: E731
    with explained(cp, NS, "multi", agent):
        eventually(all_running, "multi's app containers running")
    # exec runs beside the named container, with its environment
    who = 'echo "$WHO"'
    second = run("exec", "multi", "-c", "second", "--", "sh", "-c", who)
    assert second.stdout == "second\n", second.stderr
    assert run("exec", "multi", "-c", "main", "--", "sh", "-c", who).stdout == "main\n"
    # each container's own log, init containers and sidecars included
    for name, line in [("main", "main up"), ("second", "second up"), ("init", "init ran"),
                       ("sidecar", "sidecar up")]:  # fmt: skip
        with explained(cp, NS, "multi", agent):
            eventually(lambda n=name, want=line: run("logs", "multi", "-c", n).stdout
                       .startswith(f"{want}\n"), f"{name}'s log")  # fmt: skip
    assert run("logs", "multi", "-c", "init").stdout == "init ran\n"
    # attach streams the named container's output
    attach = subprocess.Popen(
        ["kubectl", f"--kubeconfig={cp.kubeconfig}", "-n", NS, "attach", "multi", "-c",
         "sidecar"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        line = attach.stdout.readline() if attach.stdout else ""
        assert line == "tick\n", (line, attach.poll())
    finally:
        attach.terminate()
        attach.wait(timeout=30)
    # an exited init container is not there to exec into: the kubelet's words
    gone = run("exec", "multi", "-c", "init", "--", "true")
    assert gone.returncode != 0
    assert 'container not found ("init")' in gone.stderr
    never = run("logs", "multi", "-c", "second", "--previous")
    assert never.returncode != 0
    assert 'previous terminated container "second"' in never.stderr


def test_an_init_container_s_previous_log_is_its_run_before(cp, agent, tmp_path: Path):
    marker = tmp_path / "init-ran-once"
    init = f"if [ -f {marker} ]; then echo init second; exit 0; fi; touch {marker}; echo init first"
    init += "; exit 1"
    manifest = pod("reinit", ["sleep", "600"])
    manifest["spec"]["restartPolicy"] = "OnFailure"
    manifest["spec"]["initContainers"] = [
        {"name": "init", "image": "python", "command": ["sh", "-c", init]}
    ]
    started(cp, manifest, "Running", agent=agent)
    logs = lambda *more: kubectl(cp, "-n", NS, "logs", "reinit", "-c", "init", *more)  # noqa: E731
    assert logs().stdout == "init second\n"
    assert logs("--previous").stdout == "init first\n"


def _kubelet_get(agent: NodeAgent, path: str, cert: Any = None) -> tuple[int, str]:
    tls = ssl.create_default_context(cafile=str(agent.kubelet_api.ca_cert))
    if cert is not None:
        tls.load_cert_chain(str(cert.cert), str(cert.key))
    url = f"https://127.0.0.1:{agent.kubelet_api.port}{path}"
    try:
        with urllib.request.urlopen(url, context=tls, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_the_kubelet_api_lets_only_the_apiserver_in(cp, agent, sleeper, tmp_path: Path):
    path = f"/containerLogs/{NS}/{sleeper}/main"
    assert _kubelet_get(agent, path)[0] == 401  # no client certificate
    # a certificate of the cluster CA that is not the apiserver's: a node's
    node = issue_client(load_ca(cp.pki.ca), tmp_path, "node", f"system:node:{NODE}",
                        ("system:nodes",))  # fmt: skip
    status, body = _kubelet_get(agent, path, node)
    assert status == 403
    assert f"user=system:node:{NODE}" in body
    # a certificate of another CA does not get through the TLS handshake
    other = make_ca("someone-else")
    stranger = issue_client(other, tmp_path, "stranger", "kube-apiserver-kubelet-client")
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
        _kubelet_get(agent, path, stranger)
    # the apiserver's own kubelet client certificate
    assert _kubelet_get(agent, path, cp.pki.apiserver_kubelet_client) == (200, "")


def test_a_killed_agent_command_takes_its_kubelet_api_along(cp, tmp_path: Path):
    topology = tmp_path / "one.yaml"
    topology.write_text(yaml.safe_dump({"nodes": [
        {"name": "kill-node", "unschedulable": True, "capacity": {"cpu": "4", "memory": "8Gi"}}
    ]}))  # fmt: skip
    agent = subprocess.Popen(
        [sys.executable, "-m", "devcluster.nodeagent", "--kubeconfig", str(cp.kubeconfig),
         "--topology", str(topology)],
        cwd=REPO, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:

        def served() -> Any:
            kids = [p for p in descendants(agent.pid) if b"kubelet-api" in _cmdline(p.pid)]
            return kids and kids[0]

        kubelet_api = eventually(served, "the agent's kubelet-api process", 60)
        eventually(
            lambda: kubectl(cp, "get", "lease", "kill-node", "-n", "kube-node-lease",
                            check=False).returncode == 0,
            "kill-node's Lease",
        )  # fmt: skip
        agent.send_signal(signal.SIGKILL)
        agent.wait(timeout=30)
        eventually(lambda: not kubelet_api.alive(), "the kubelet-api process ends", 30)
    finally:
        agent.kill()
        agent.wait(timeout=30)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@pytest.fixture(scope="module")
def netns_agent(cp: ControlPlane) -> Iterator[NodeAgent]:
    """A second agent whose pods each get a network namespace of their own."""
    if not network_namespaces():
        pytest.skip("pods get no network namespaces here (needs root, unshare, nsenter, ip)")
    topology = load_topology(
        {"nodes": [{"name": NETNS_NODE, "taints": [NETNS_TAINT], "capacity": {"cpu": "8"}}]}
    )
    state = cp.state_dir / "nodeagent-netns"
    with NodeAgent.start(
        topology, cp.server, cp.pki.ca, state, mode="run", network="namespaces"
    ) as running:  # fmt: skip
        yield running


def test_in_a_network_namespace_exec_enters_it_and_port_forward_reaches_the_pod(
    cp, netns_agent, tmp_path: Path
):
    (tmp_path / "hello.txt").write_text("hello from the pod's own network\n")
    server = pod(
        "netweb",
        ["python", "-m", "http.server", "8000", "--bind", "0.0.0.0", "--directory",
         str(tmp_path)],
        node=NETNS_NODE,
        ports=[{"containerPort": 8000}],
    )  # fmt: skip
    started(cp, server, "Running", agent=netns_agent)
    assert netns_agent.runtime is not None
    pid = netns_agent.runtime.kubelet.running[(NS, "netweb")].process.pid
    own = Path(f"/proc/{pid}/ns/net").readlink()
    assert own != Path("/proc/self/ns/net").readlink()  # the pod's, not the host's
    seen = kubectl(cp, "exec", "netweb", "-n", NS, "--", "readlink", "/proc/self/ns/net")
    assert seen.stdout.strip() == str(own)
    hello = through_port_forward(cp, "netweb", 8000, "/hello.txt", netns_agent)
    assert hello == "hello from the pod's own network\n"


def test_the_netns_agent_s_bridge_and_pod_veths_are_not_links_of_the_machine(
    cp, netns_agent, own_module_network
):
    """The second agent's bridge and its pods' veths are in the module's network namespace
    (tests/netns.py): none is a link change of the machine, where another worker's Chromium
    would fail its requests with net::ERR_NETWORK_CHANGED."""
    started(cp, pod("netguard", ["sleep", "600"], node=NETNS_NODE), "Running", agent=netns_agent)
    assert netns_agent.runtime is not None
    bridge = netns_agent.runtime.kubelet.network.bridge
    assert len(bridge_links(bridge, links())) >= 2, links()  # the bridge and the pod's veth
    assert bridge_links(bridge, own_module_network.outside_links()) == []
