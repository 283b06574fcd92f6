"""KubeSpawner's cluster features through a real hub on the real control plane with the node
agent (issue 29 acceptance; on the real control plane since issue 35 item 4).

A real JupyterHub and proxy spawn, with plain KubeSpawner and with FracSpawner, a server with
everything a z2jh operator may turn on that needs the cluster to behave: `internal_ssl` (the hub
makes certificates; KubeSpawner puts them in a Secret the pod mounts, and the hub and proxy
reach the server over TLS at `<pod>.<ns>.svc.cluster.local`), `services_enabled` (a Service per
server: its ClusterIP, the cluster DNS and the Service proxy of the node agent's `network:
namespaces`, devcluster/network.py), a namespace per user (`enable_user_namespaces`), and a
`readinessProbe`. The hub resolves Service names as a hub pod would (the node agent's
resolv.conf, devcluster/localhub.py `resolv`). After the server stops, its pod is deleted and
kube-controller-manager's garbage collector takes the Service and Secret it owns (KubeSpawner
relies on that: kubespawner/objects.py make_owner_reference). Pods on the host's network get
no cluster DNS from the node agent, so both spawners run with pods in namespaces of their own.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from devcluster.localhub import LocalHub, http_json, start_hub
from devcluster.network import network_namespaces
from devcluster.testing import devcluster_process
from tests.conftest import DEMO_CATALOG, DEMO_TOPOLOGY
from tests.e2e_helpers import spawn, wait_until
from tests.netns import OwnNetwork, links, own_network
from tests.test_controlplane import _binary

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not network_namespaces(), reason="Service names: root, unshare, iproute2"),
]

PROBE = {"tcpSocket": {"port": 8888}, "periodSeconds": 1}
EXTRA = f"""
c.JupyterHub.internal_ssl = True
c.ConfigurableHTTPProxy.api_url = c.ConfigurableHTTPProxy.api_url.replace("http:", "https:")
c.KubeSpawner.services_enabled = True
c.KubeSpawner.enable_user_namespaces = True
c.KubeSpawner.user_namespace_template = "{{hubnamespace}}-{{username}}"
c.KubeSpawner.extra_container_config = {{"readinessProbe": {PROBE!r}}}
"""
SPAWNERS = {
    "kubespawner": ('c.JupyterHub.spawner_class = "kubespawner.KubeSpawner"', {}),
    "fracspawner": ("", {"gpu": "none"}),
}


# with `network: namespaces` pods reach the hub only on the bridge: it listens there, and its
# internal-SSL certificate names that address (JupyterHub's trusted_alt_names)
ON_THE_BRIDGE = """
c.JupyterHub.hub_ip = c.JupyterHub.hub_connect_ip = {ip!r}
c.JupyterHub.trusted_alt_names = ["IP:{ip}"]
"""
CASES = [("kubespawner", "namespaces"), ("fracspawner", "namespaces")]


@pytest.fixture(scope="module", params=CASES, ids=lambda case: "-".join(case))
def case(request, tmp_path_factory) -> Iterator[tuple[str, Any, LocalHub, OwnNetwork | None]]:
    kind, network = request.param
    topology = {**yaml.safe_load(DEMO_TOPOLOGY.read_text()), "network": network}
    with contextlib.ExitStack() as stack:
        # `network: namespaces`: the devcluster (a child process), its bridge and veths, the
        # hub and this test's requests, all in a network namespace of the test's own
        # (tests/netns.py): the machine sees no link change
        own = stack.enter_context(own_network()) if network == "namespaces" else None
        _binary()
        cluster = stack.enter_context(
            devcluster_process(topology, tmp_path_factory.mktemp("devcluster"))
        )
        net = cluster.state_dir / "nodeagent" / "pods" / "network"
        state = tmp_path_factory.mktemp(f"hub-{kind}")
        extra = EXTRA + f'c.JupyterHub.internal_certs_location = "{state}/internal-ssl"\n'
        if network == "namespaces":
            host_ip = (net / "host-ip").read_text().strip()
            extra += ON_THE_BRIDGE.format(ip=host_ip)
        hub = start_hub(
            state_dir=state,
            kubeconfig=cluster.kubeconfig,
            catalog_file=DEMO_CATALOG,
            extra_config=extra + SPAWNERS[kind][0],
            resolv=net / "resolv.conf",
        )
        try:
            yield kind, cluster, hub, own
        finally:
            hub.stop()
            if request.session.testsfailed:
                print("---- jupyterhub log (tail) ----\n" + hub.log()[-6000:])


def objects(devcluster, namespace: str, plural: str) -> list[str]:
    found = devcluster.client().get(f"/api/v1/namespaces/{namespace}/{plural}")
    return [o["metadata"]["name"] for o in found["items"]]


def test_internal_ssl_service_user_namespace_probe_exec(case):
    kind, devcluster, hub, own = case
    user = f"ann-{kind}"
    # the hub's namespace is "default": KubeSpawner writes "user" for it (_expand_user_properties)
    namespace, pod = f"user-{user}", f"jupyter-{user}"
    status, body = spawn(hub, user, SPAWNERS[kind][1])
    assert status in (201, 202), body
    hub.wait_ready(user)
    if own is not None:  # the bridge and the pod's veth are the test's, none the machine's
        (bridge,) = [name for name in links() if name.startswith("dc")]
        assert not [name for name in own.outside_links() if bridge[2:] in name]
    # the user's own namespace holds the pod, its Service and its certificates' Secret, the
    # last two owned by the pod
    assert objects(devcluster, namespace, "pods") == [pod]
    assert pod in objects(devcluster, namespace, "services")
    assert pod in objects(devcluster, namespace, "secrets")
    client = devcluster.client()
    got = client.get(f"/api/v1/namespaces/{namespace}/pods/{pod}")
    # as KubeSpawner sent it, with the apiserver's defaults (timeoutSeconds, thresholds)
    assert PROBE.items() <= got["spec"]["containers"][0]["readinessProbe"].items()
    assert any(c["type"] == "Ready" and c["status"] == "True" for c in got["status"]["conditions"])
    service = client.get(f"/api/v1/namespaces/{namespace}/services/{pod}")
    owners = service["metadata"]["ownerReferences"]
    assert [o["uid"] for o in owners] == [got["metadata"]["uid"]]
    assert service["spec"]["clusterIP"] not in ("", "None")
    # through the proxy, over TLS to the Service's name: the server answers
    status, _ = http_json("GET", f"{hub.url}/user/{user}/api/status", token=hub.admin_token)
    assert status == 200, hub.log()[-3000:]
    log = hub.log()
    assert f"https://{pod}.{namespace}.svc.cluster.local:8888" in log
    # kubectl exec runs in the pod: the certificate KubeSpawner's Secret put at its mountPath
    if shutil.which("kubectl"):
        read_cert = "import os; print(open(os.environ['JUPYTERHUB_SSL_CERTFILE']).read()[:27])"
        done = subprocess.run(
            ["kubectl", "--kubeconfig", str(devcluster.kubeconfig), "exec", "-n", namespace,
             pod, "--", "python", "-c", read_cert],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert (done.returncode, done.stdout) == (0, "-----BEGIN CERTIFICATE-----\n"), done.stderr
    # stopped: the pod is deleted, and its Service and Secret follow it
    assert hub.api("DELETE", f"/users/{user}/server")[0] in (202, 204)
    hub.wait_stopped(user)
    wait_until(
        lambda: (
            not any(
                pod in objects(devcluster, namespace, plural)
                for plural in ("pods", "services", "secrets")
            )
        ),
        60,
        "the pod, its Service and Secret gone",
    )
