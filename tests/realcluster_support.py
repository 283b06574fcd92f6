"""The module fixtures of the tests on the real control plane with the node agent: a cluster
per test module (`cp`) and a node agent on it (`agent`), made here once instead of in each
module. `cp = control_plane_fixture()` and `agent = node_agent_fixture(topology, ...)` at a
module's top level give it the two fixtures (module scope)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from devcluster.controlplane import ControlPlane
from devcluster.nodeagent import NodeAgent
from devcluster.topology import load_topology
from tests.test_controlplane import _binary, namespace


def control_plane_fixture(namespaces: Iterable[str] = ()) -> Any:
    """A `cp` fixture: the control plane (skipped without the binary on a developer's machine,
    failed in CI), with `namespaces` made once each has its default ServiceAccount."""

    @pytest.fixture(scope="module")
    def cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
        _binary()
        with ControlPlane.start(tmp_path_factory.mktemp("controlplane")) as running:
            for name in namespaces:
                namespace(running, name)
            yield running

    return cp


def node_agent_fixture(
    topology: Mapping[str, Any] | Path,
    namespaces: Iterable[str] = (),
    state: str = "nodeagent",
    **options: Any,
) -> Any:
    """An `agent` fixture: the node agent for `topology` on `cp`, its state in `cp`'s state
    directory under `state`; `options` are NodeAgent.start's (mode, images, restart_backoff,
    network, ...); `namespaces` made once it runs."""

    @pytest.fixture(scope="module")
    def agent(cp: ControlPlane) -> Iterator[NodeAgent]:
        with NodeAgent.start(
            load_topology(topology), cp.server, cp.pki.ca, cp.state_dir / state, **options
        ) as running:
            for name in namespaces:
                namespace(cp, name)
            yield running

    return agent
