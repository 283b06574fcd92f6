"""NodeAgent.start returns once kube-scheduler can place a pod on each node: the node Ready and
without a `node.kubernetes.io/` taint it did not register with. The apiserver's
TaintNodesByCondition admission plugin (on by default, plugin/pkg/admission/nodetaint) puts
`node.kubernetes.io/not-ready:NoSchedule` on every Node at creation; kube-controller-manager's node
lifecycle controller removes it once it sees the node Ready (doNoScheduleTaintingPass), some
time later on a loaded machine: a pod made in between was reported Unschedulable ('1 node(s)
had untolerated taint(s)', test_fraction_fit's first pod in a fresh-clone run)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from devcluster.controlplane import ControlPlane
from devcluster.nodeagent import NodeAgent, nodeobject
from devcluster.topology import load_topology
from tests.realcluster_support import control_plane_fixture

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

cp = control_plane_fixture()


def _topology(name: str, **node: Any) -> dict[str, Any]:
    return load_topology({"nodes": [{"name": name, "capacity": {"cpu": "8"}, **node}]})


@contextmanager
def controller_manager_paused(cp: ControlPlane, until_node: str) -> Iterator[None]:
    """kube-controller-manager stopped (SIGSTOP) until the Node `until_node` exists and 2 s
    more, as on a loaded machine where its node lifecycle controller comes late; resumed at the
    end in any case."""
    kcm = next(c for c in cp.components if c.name == "kube-controller-manager").process
    done = threading.Event()

    def resume_later() -> None:
        while not done.is_set() and cp.client.get_json(f"/api/v1/nodes/{until_node}") is None:
            done.wait(0.1)
        done.wait(2)
        kcm.send_signal(signal.SIGCONT)

    kcm.send_signal(signal.SIGSTOP)
    resumer = threading.Thread(target=resume_later, daemon=True)
    resumer.start()
    try:
        yield
    finally:
        done.set()
        resumer.join(10)
        kcm.send_signal(signal.SIGCONT)


def test_a_node_is_ready_and_untainted_when_the_agent_has_started(cp: ControlPlane):
    topology = _topology("fresh", taints=[{"key": "own", "value": "x", "effect": "NoSchedule"}])
    with controller_manager_paused(cp, "fresh"):
        agent = NodeAgent.start(topology, cp.server, cp.pki.ca, cp.state_dir / "fresh")
    with agent:
        node = cp.client.get_json("/api/v1/nodes/fresh")  # at once: no wait here
    assert node is not None
    taints = [(t["key"], t["effect"]) for t in node["spec"].get("taints") or []]
    assert taints == [("own", "NoSchedule")], node["spec"]
    ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True"


def test_a_node_that_never_becomes_ready_is_named_with_its_conditions_and_taints(
    cp: ControlPlane, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    from devcluster.nodeagent.agent import NodesNotSchedulable

    reported = nodeobject.status

    def not_ready(*args: Any, **kwargs: Any) -> dict[str, Any]:
        status = reported(*args, **kwargs)
        ready = next(c for c in status["conditions"] if c["type"] == "Ready")
        ready.update(status="False", reason="KubeletNotReady", message="runtime down")
        return status

    monkeypatch.setattr(nodeobject, "status", not_ready)
    topology = _topology("never-ready")
    with pytest.raises(NodesNotSchedulable) as err:
        NodeAgent.start(
            topology, cp.server, cp.pki.ca, tmp_path, mode="no-run", kubelet_api=False,
            ready_timeout=5,
        )  # fmt: skip
    text = str(err.value)
    assert "never-ready" in text, text
    assert "Ready=False (KubeletNotReady: runtime down)" in text, text
    assert "node.kubernetes.io/not-ready:NoSchedule" in text, text
