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


def pytest_configure(config: pytest.Config) -> None:
    """A browser test failing with net::ERR_NETWORK_CHANGED lists the machine's link changes."""
    from tests import netwatch

    if not config.pluginmanager.is_registered(netwatch):
        config.pluginmanager.register(netwatch, "tests.netwatch")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`make test`'s `--dist loadfile` hands out the slowest modules first (tests/xdist_order.py):
    xdist's own order (most tests first) left the long one-test modules to the end."""
    if config.getvalue("dist") != "loadfile":
        return None
    from tests.xdist_order import SlowestModulesFirst

    return SlowestModulesFirst(config, log)


#: stand-ins for nvidia-ml-py (`pynvml`) and cuda-python (`cuda.bindings.driver`)
FAKE_NVML = Path(__file__).parent / "fake_nvml"


def _is_nvml_or_cuda(module: str) -> bool:
    return module in ("pynvml", "cuda") or module.startswith("cuda.")


@pytest.fixture
def fake_nvml_imports(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """`import pynvml` / `cuda.bindings.driver` in this process get tests/fake_nvml's fakes
    for the test; afterwards the modules imported before it (the real pynvml) are back.
    monkeypatch.delitem restores only what it removed, so a fake first imported during the
    test stayed in sys.modules, and later tests (test_serverext's NvmlSource) imported it."""
    saved = {name: mod for name, mod in sys.modules.items() if _is_nvml_or_cuda(name)}
    for name in saved:
        del sys.modules[name]
    monkeypatch.syspath_prepend(str(FAKE_NVML))
    try:
        yield
    finally:
        for name in [name for name in sys.modules if _is_nvml_or_cuda(name)]:
            del sys.modules[name]
        sys.modules.update(saved)


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


#: the hub the module's `devcluster` fixture launched beside the cluster, for `hub` to take
EARLY_HUB = pytest.StashKey["LocalHub"]()


def _uses_conftest_hub(request: pytest.FixtureRequest) -> bool:
    """The test asks for `hub` (itself or through clean_servers) and its module has no `hub`
    fixture of its own."""
    return "hub" in request.fixturenames and "hub" not in vars(request.module)


# The hub's configuration holds it until the cluster is ready (devcluster.democluster's
# hub_waits_for, the same for the demo), and ends it if this pytest process went away meanwhile
WAIT_FOR = """
import os as _os, sys as _sys, time as _time  # noqa: E401
while not _os.path.exists({ready!r}):
    if _os.getppid() != {parent}:
        _sys.exit("the tests that launched this hub are gone")
    _time.sleep(0.2)
"""


def _launch_hub(request: pytest.FixtureRequest, tmp_path_factory, kubeconfig: Path, ready: Path):
    """The module's hub (its CATALOG, HUB_EXTRA_CONFIG), launched now: its configuration waits
    for `ready`, so its imports (JupyterHub, kubespawner, fracspawner: 10-20 s on a busy
    2-core machine) overlap the control plane's start, as in `fracspawner demo`."""
    from devcluster.localhub import launch_hub

    state = tmp_path_factory.mktemp("hub")
    catalog = getattr(request.module, "CATALOG", None)
    catalog_file = DEMO_CATALOG
    if catalog is not None:
        catalog_file = state / "catalog.yaml"
        catalog_file.write_text(yaml.safe_dump(catalog))
    return launch_hub(
        state_dir=state,
        kubeconfig=kubeconfig,
        catalog_file=catalog_file,
        extra_config=WAIT_FOR.format(ready=str(ready), parent=os.getpid())
        + getattr(request.module, "HUB_EXTRA_CONFIG", ""),
    )


@pytest.fixture(scope="module")
def devcluster(tmp_path_factory: pytest.TempPathFactory, request) -> Iterator:
    """The real control plane (kube-apiserver, etcd, kube-scheduler, kube-controller-manager)
    with the node agent running the pods, on the demo topology (a module may override
    `TOPOLOGY`), in a subprocess (`fracspawner devcluster`, docs/controlplane.md). Skipped
    without `make controlplane` on a developer's machine, failed in CI (tests/missing.py).
    A module that uses `hub` gets its hub launched beside the cluster (`_launch_hub`)."""
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
    where = tmp_path_factory.mktemp("devcluster")
    ready = where / "ready"  # devcluster_process writes the kubeconfig to where / "kubeconfig"
    stash = request.node.stash
    if _uses_conftest_hub(request):
        stash[EARLY_HUB] = _launch_hub(request, tmp_path_factory, where / "kubeconfig", ready)
    try:
        with devcluster_process(topology, where) as cluster:
            ready.touch()
            yield cluster
    finally:
        # a hub `hub` did not take (the cluster did not start, or no test got as far): stopped
        # before the cluster's end is checked
        if (left := stash.get(EARLY_HUB, None)) is not None:
            left.stop()


@pytest.fixture(scope="module")
def hub(devcluster, tmp_path_factory: pytest.TempPathFactory, request) -> Iterator:
    """A real JupyterHub + proxy with FracSpawner on the module's devcluster, launched by the
    `devcluster` fixture beside it (or here, when a later test of the module is the first to
    ask for a hub)."""
    from devcluster.localhub import wait_hub

    launched = request.node.stash.get(EARLY_HUB, None)
    if launched is not None:
        del request.node.stash[EARLY_HUB]  # this fixture stops it
    else:
        ready = Path(devcluster.kubeconfig).parent / "ready"
        launched = _launch_hub(request, tmp_path_factory, devcluster.kubeconfig, ready)
    # as long as start_hub gave a hub launched once the cluster was ready
    running = wait_hub(launched, 60)
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
