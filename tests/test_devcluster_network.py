"""Pod hostnames on the devcluster (issue 29 item 6, the part this machine allows): where it
runs as root with util-linux's unshare, each pod process gets a UTS namespace of its own whose
hostname is the pod's name, as a container runtime's pod sandbox does (kubelet
GeneratePodHostNameAndDomain: the pod name, cut to 63 characters), and `kubectl exec` runs in
it; the devcluster says at start what it cannot model (its own network namespace per pod,
Service names in pods).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import shutil
import subprocess
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from devcluster import DevCluster
from devcluster.network import network_namespaces, sandboxes
from tests.devcluster_helpers import NS, ONE_NODE, finished, ready
from tests.netns import OwnNetwork, links, own_network

pytestmark = pytest.mark.e2e

PRINT_HOSTNAME = ["python", "-c", "import socket; print(socket.gethostname())"]


@pytest.fixture
async def cluster(tmp_path: Path, caplog) -> AsyncIterator[DevCluster]:
    caplog.set_level(logging.INFO, logger="devcluster")
    async with DevCluster(ONE_NODE, state_dir=tmp_path / "state") as running:
        yield running


async def finished_log(api: client.CoreV1Api, name: str) -> str:
    return (await finished(api, name))[1]


@pytest.mark.skipif(not sandboxes(), reason="needs root and util-linux unshare")
async def test_a_pods_hostname_is_its_name(cluster, caplog):
    name = "a-pod-with-a-name-longer-than-sixty-three-characters-is-cut-to-63-x"
    async with client.ApiClient(client.Configuration(host=cluster.url)) as api_client:
        api = client.CoreV1Api(api_client)
        for pod in ("box", name):
            body = {
                "metadata": {"name": pod},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "c", "image": "x", "command": PRINT_HOSTNAME}],
                },
            }
            await api.create_namespaced_pod(NS, body)
        assert await finished_log(api, "box") == "box\n"
        assert await finished_log(api, name) == name[:63].rstrip("-.") + "\n"
    said = [r.getMessage() for r in caplog.get_records("setup")]  # at start
    assert any("does not model: pods share the host's network" in m for m in said)
    assert not any("hostname" in m for m in said)


@pytest.mark.skipif(not sandboxes(), reason="needs root and util-linux unshare")
@pytest.mark.skipif(not shutil.which("kubectl"), reason="kubectl: make system-deps")
async def test_kubectl_exec_runs_in_the_pods_uts_namespace(cluster):
    async with client.ApiClient(client.Configuration(host=cluster.url)) as api_client:
        api = client.CoreV1Api(api_client)
        body = {
            "metadata": {"name": "sleeper"},
            "spec": {"containers": [{"name": "c", "image": "x", "command": ["sleep", "600"]}]},
        }
        await api.create_namespaced_pod(NS, body)
        deadline = asyncio.get_running_loop().time() + 60
        while (await api.read_namespaced_pod("sleeper", NS)).status.phase != "Running":
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.1)
    done = await asyncio.to_thread(
        subprocess.run,
        ["kubectl", "--kubeconfig", str(cluster.kubeconfig_path), "exec", "sleeper", "--",
         *PRINT_HOSTNAME],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert (done.returncode, done.stdout) == (0, "sleeper\n"), done.stderr


# --------------------------------------------------------------------------- Services and DNS
# answers GET with the pod's hostname, on 0.0.0.0 as a server in a container does
SERVE_NAME = r"""
import http.server, socket
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
        self.wfile.write(socket.gethostname().encode())
http.server.HTTPServer(("0.0.0.0", 8888), H).serve_forever()
"""
# what a client pod sees: each name's address (or the error) and, through it, the answer
CLIENT = r"""
import json, socket, sys, urllib.request
out = {}
for name in sys.argv[1:]:
    seen = out[name] = {}
    try:
        seen["ip"] = socket.gethostbyname(name.split(":")[0])
        seen["body"] = urllib.request.urlopen(f"http://{name}/", timeout=10).read().decode()
    except Exception as exc:
        seen["error"] = type(getattr(exc, "reason", exc)).__name__
# not JSON alone: the API client would parse a JSON log and hand back its repr
print("seen", json.dumps(out))
"""


def server_pod(name: str, labels: dict[str, str]) -> dict:
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "c",
                    "image": "x",
                    "command": ["python", "-c", SERVE_NAME],
                    "ports": [{"name": "http", "containerPort": 8888}],
                    "readinessProbe": {"tcpSocket": {"port": 8888}, "periodSeconds": 1},
                }
            ],
        },
    }


def client_pod(name: str, *targets: str) -> dict:
    return {
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {"name": "c", "image": "x", "command": ["python", "-c", CLIENT, *targets]}
            ],
        },
    }


def service(name: str, selector: dict[str, str], port: int = 80) -> dict:
    # port 80 -> the pods' named port: the proxy looks the name up in each pod
    return {
        "metadata": {"name": name},
        "spec": {"selector": selector, "ports": [{"port": port, "targetPort": "http"}]},
    }


@pytest.mark.skipif(not sandboxes(), reason="needs root and util-linux unshare")
async def test_service_names_resolve_in_pods_and_reach_ready_endpoints(cluster):
    """The apiserver gives the Service a ClusterIP; a pod resolves the Service's name (FQDN,
    and the short name through the kubelet's search path) to it with the cluster DNS, and its
    connection reaches a ready pod the selector matches; a Service with no ready pod refuses."""
    async with client.ApiClient(client.Configuration(host=cluster.url)) as api_client:
        api = client.CoreV1Api(api_client)
        await api.create_namespaced_pod(NS, server_pod("web-0", {"app": "web"}))
        made = await api.create_namespaced_service(NS, service("web", {"app": "web"}))
        empty = await api.create_namespaced_service(NS, service("nobody", {"app": "none"}))
        ip = made.spec.cluster_ip
        assert ip and ip != "None" and made.spec.cluster_ips == [ip]
        # a ClusterIP is immutable (ValidateServiceUpdate)
        with pytest.raises(client.ApiException) as refused:
            await api.patch_namespaced_service("web", NS, {"spec": {"clusterIP": "10.0.0.9"}})
        assert refused.value.status == 422 and "field is immutable" in refused.value.body
        await ready(api, "web-0")
        targets = ["web.default.svc.cluster.local", "web", "nobody", "nothere"]
        await api.create_namespaced_pod(NS, client_pod("asker", *targets))
        seen = json.loads((await finished_log(api, "asker")).removeprefix("seen "))
    assert seen["web.default.svc.cluster.local"] == {"ip": ip, "body": "web-0"}
    assert seen["web"] == {"ip": ip, "body": "web-0"}
    # resolved, then refused: nothing answers
    assert seen["nobody"]["ip"] == empty.spec.cluster_ip
    assert seen["nobody"]["error"] in ("ConnectionResetError", "RemoteDisconnected")
    assert seen["nothere"] == {"error": "gaierror"}  # NXDOMAIN


@pytest.mark.skipif(not network_namespaces(), reason="needs root, util-linux and iproute2")
async def test_pods_in_network_namespaces_of_their_own(tmp_path: Path, own_netns):
    """`network: namespaces`: each pod has its own network namespace on a bridge (a CNI bridge
    plugin's layout). Two pods both bind 0.0.0.0:8888 and each answers at its own address; a
    pod's loopback is its own; pods reach each other and a Service by name; `kubectl exec` runs
    in the pod's network; the bridge and the namespaces are gone after the devcluster stops.
    All of it in the test's own network namespace (own_netns), the host's from there."""
    topology = {**ONE_NODE, "network": "namespaces"}
    async with DevCluster(topology, state_dir=tmp_path / "state") as cluster:
        network = cluster.network
        assert network.mode == "namespaces"
        subnet = ipaddress.ip_network(network.subnet)
        async with client.ApiClient(client.Configuration(host=cluster.url)) as api_client:
            api = client.CoreV1Api(api_client)
            for name in ("a", "b"):
                await api.create_namespaced_pod(NS, server_pod(name, {"app": "web"}))
            await api.create_namespaced_service(NS, service("web", {"app": "web"}))
            ips = {name: (await ready(api, name)).status.pod_ip for name in ("a", "b")}
            assert ips["a"] != ips["b"] and all(
                ipaddress.ip_address(i) in subnet for i in ips.values()
            )
            for name, ip in ips.items():  # from the host, through the bridge
                body = await asyncio.to_thread(
                    lambda ip=ip: urllib.request.urlopen(f"http://{ip}:8888/", timeout=10).read()
                )
                assert body.decode() == name
            targets = [f"{ips['a']}:8888", "web", "127.0.0.1:8888"]
            await api.create_namespaced_pod(NS, client_pod("asker", *targets))
            seen = json.loads((await finished_log(api, "asker")).removeprefix("seen "))
            svc = await api.read_namespaced_service("web", NS)
        assert seen[f"{ips['a']}:8888"]["body"] == "a"
        assert seen["web"]["ip"] == svc.spec.cluster_ip and seen["web"]["body"] in ("a", "b")
        assert ipaddress.ip_address(svc.spec.cluster_ip) in subnet
        assert seen["127.0.0.1:8888"]["error"] == "ConnectionRefusedError"  # its own loopback
        if shutil.which("kubectl"):
            show_ip = "import socket; print(socket.gethostbyname(socket.gethostname()))"
            done = await asyncio.to_thread(
                subprocess.run,
                ["kubectl", "--kubeconfig", str(cluster.kubeconfig_path), "exec", "b", "--",
                 "python", "-c", show_ip],
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            assert (done.returncode, done.stdout) == (0, ips["b"] + "\n"), done.stderr
        bridge = network.bridge
    gone = subprocess.run(["ip", "link", "show", bridge], capture_output=True)
    assert gone.returncode != 0
    assert not list(Path("/run/netns").glob(f"{bridge}-*"))


@pytest.fixture
def own_netns() -> Iterator[OwnNetwork]:
    """The test in a network namespace of its own (tests/netns.py): what `network: namespaces`
    adds is never a link change of the machine's, which other workers' browsers would see."""
    with own_network() as network:
        yield network


@pytest.mark.skipif(not network_namespaces(), reason="needs root, util-linux and iproute2")
async def test_a_namespaced_devcluster_changes_no_link_of_the_machine(tmp_path: Path, own_netns):
    """Issue 34 item 12: the bridge and veth pairs of `network: namespaces` are made in the
    test's own network namespace (tests/netns.py): the machine's link list (`ip -o link`,
    where other workers' browsers watch for network changes) never shows them."""
    topology = {**ONE_NODE, "network": "namespaces"}
    async with DevCluster(topology, state_dir=tmp_path / "state") as cluster:
        mark = cluster.network.bridge[2:]  # in the bridge's name and every veth's
        async with client.ApiClient(client.Configuration(host=cluster.url)) as api_client:
            api = client.CoreV1Api(api_client)
            await api.create_namespaced_pod(NS, server_pod("a", {"app": "web"}))
            await ready(api, "a")
        inside = [name for name in links() if mark in name]
        outside = [name for name in own_netns.outside_links() if mark in name]
    assert len(inside) >= 2, inside  # the bridge and the pod's veth
    assert outside == []
