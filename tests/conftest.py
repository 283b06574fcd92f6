"""Shared fixtures: the demo catalog, a devcluster subprocess and a real JupyterHub on it."""

from __future__ import annotations

import copy
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
DEMO_CATALOG = REPO / "examples" / "catalogs" / "demo.yaml"
DEMO_TOPOLOGY = REPO / "devcluster" / "topologies" / "demo.yaml"

# The tests start jupyterhub-singleuser and configurable-http-proxy from this environment.
os.environ["PATH"] = os.pathsep.join(
    [str(Path(sys.executable).parent), str(REPO / "node_modules" / ".bin"), os.environ["PATH"]]
)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`make test`'s `--dist loadfile` hands out the slowest modules first (tests/xdist_order.py):
    xdist's own order (most tests first) left the long one-test modules to the end."""
    if config.getvalue("dist") != "loadfile":
        return None
    from tests.xdist_order import SlowestModulesFirst

    return SlowestModulesFirst(config, log)


@pytest.fixture(scope="session")
def demo_catalog_dict() -> dict:
    return yaml.safe_load(DEMO_CATALOG.read_text())


@pytest.fixture
def catalog_dict(demo_catalog_dict: dict) -> dict:
    """A fresh, mutable copy of the demo catalog."""
    return copy.deepcopy(demo_catalog_dict)


@pytest.fixture(scope="session")
def demo_topology_dict() -> dict:
    return yaml.safe_load(DEMO_TOPOLOGY.read_text())


@pytest.fixture(scope="module")
def devcluster(tmp_path_factory: pytest.TempPathFactory, request) -> Iterator:
    """The real control plane (kube-apiserver, etcd, kube-scheduler, kube-controller-manager)
    with the node agent running the pods, on the demo topology (a module may override
    `TOPOLOGY`), in a subprocess (`fracspawner devcluster`, docs/controlplane.md). Skipped
    without `make controlplane` on a developer's machine, failed in CI (tests/missing.py)."""
    from devcluster.controlplane.binary import BinaryMissing, find_binary
    from devcluster.testing import devcluster_process
    from tests.missing import missing

    topology = getattr(request.module, "TOPOLOGY", None) or yaml.safe_load(
        DEMO_TOPOLOGY.read_text()
    )
    try:
        find_binary()
    except BinaryMissing as err:
        missing(str(err))
    with devcluster_process(topology, tmp_path_factory.mktemp("devcluster")) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def hub(devcluster, tmp_path_factory: pytest.TempPathFactory, request) -> Iterator:
    """A real JupyterHub + proxy with FracSpawner on the module's devcluster."""
    from devcluster.localhub import start_hub

    state = tmp_path_factory.mktemp("hub")
    catalog = getattr(request.module, "CATALOG", None)
    catalog_file = DEMO_CATALOG
    if catalog is not None:
        catalog_file = state / "catalog.yaml"
        catalog_file.write_text(yaml.safe_dump(catalog))
    running = start_hub(
        state_dir=state,
        kubeconfig=devcluster.kubeconfig,
        catalog_file=catalog_file,
        extra_config=getattr(request.module, "HUB_EXTRA_CONFIG", ""),
    )
    try:
        yield running
    finally:
        running.stop()
        if request.session.testsfailed:
            print("---- jupyterhub log (tail) ----\n" + running.log()[-6000:])


@pytest.fixture(scope="module")
def browser() -> Iterator:
    """Debian's chromium under Playwright, one per test module (skips without it)."""
    from tests.browser_helpers import chromium

    with chromium() as launched:
        yield launched


@pytest.fixture
def clean_servers(hub, devcluster) -> Iterator:
    """After the test: stop every server it started, and wait for their pods to go."""
    yield
    from tests.browser_helpers import stop_all_servers

    stop_all_servers(hub, devcluster)


@pytest.fixture(scope="module")
def exporter() -> Iterator:
    """A dcgm-exporter stand-in serving the GPU series the tests set (one per module)."""
    from tests.test_culler_support import DcgmExporter

    e = DcgmExporter()
    yield e
    e.stop()


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory, exporter, request) -> Iterator:
    """Debian's Prometheus scraping `exporter` (one per module), and the module's
    PROMETHEUS_EXTRA_JOBS ({job: (host:port, metrics path)}) if it names any."""
    from tests.test_culler_support import Prometheus

    extra = getattr(request.module, "PROMETHEUS_EXTRA_JOBS", None)
    p = Prometheus(tmp_path_factory.mktemp("prometheus"), exporter.port, extra)
    yield p
    p.stop()
