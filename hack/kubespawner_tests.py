"""kubespawner's own cluster tests against the real control plane and the node agent (issue 35).

    .venv/bin/python hack/kubespawner_tests.py [--spawner kubespawner|fracspawner|both]
                                              [--source GIT] [-- PYTEST ARGS]

Fetches kubespawner's `tests/` at the installed kubespawner's tag into .cache/kubespawner-tests/
(ignored: fetched code is never committed) from --source (a git directory or URL; default
https://github.com/jupyterhub/kubespawner.git), installs the pytest and pytest-asyncio they
are written for (pytest-asyncio < 0.23, as their pyproject pins it) into
.cache/kubespawner-tests/site, starts a control plane (devcluster.controlplane) and a node agent
in run mode with one CPU node, its pods in network namespaces of their own (two hub pods both
listen on 0.0.0.0:8081; the internal-SSL test reaches its hub by a Service's name), and runs
the tests that reach a cluster (those with kubespawner's `kube_client` fixture:
hack/kubespawner_plugin.py) with KUBECONFIG at the admin kubeconfig: once with KubeSpawner and
once with FracSpawner in its place.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from devcluster.controlplane import ControlPlane  # noqa: E402
from devcluster.nodeagent import NodeAgent  # noqa: E402
from devcluster.topology import load_topology  # noqa: E402

CACHE = REPO / ".cache" / "kubespawner-tests"
UPSTREAM = "https://github.com/jupyterhub/kubespawner.git"
PINS = ["pytest==7.4.4", "pytest-asyncio==0.21.2", "pluggy<2", "iniconfig"]
TOPOLOGY = {"nodes": [{"name": "node-1", "capacity": {"cpu": "16", "memory": "64Gi"}}]}
PYTEST_INI = """[pytest]
addopts = --verbose --durations=10
asyncio_mode = auto
norecursedirs = lib lib64
"""


def place_tests(version: str, source: str) -> Path:
    """kubespawner's tests/ at tag `version`, under CACHE/<version>/ (placed once)."""
    root = CACHE / version
    if (root / "tests" / "conftest.py").exists():
        return root
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        if Path(source).is_dir():
            git_dir = source
        else:
            subprocess.run(
                ["git", "clone", "--quiet", "--bare", "--depth", "1", "--branch", version,
                 source, f"{tmp}/repo"],
                check=True,
            )  # fmt: skip
            git_dir = f"{tmp}/repo"
        archive = subprocess.run(
            ["git", f"--git-dir={git_dir}", "archive", version, "tests"],
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    (root / "pytest.ini").write_text(PYTEST_INI)
    return root


def install_pins() -> Path:
    site = CACHE / "site"
    if not (site / "pytest_asyncio").is_dir():
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
             str(site), *PINS],
            check=True,
        )  # fmt: skip
    return site


def run_tests(root: Path, site: Path, kubeconfig: Path, spawner: str, extra: list[str]) -> int:
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "PYTHONPATH": os.pathsep.join([str(site), str(REPO / "hack"), str(REPO)]),
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        "KUBESPAWNER_TESTS_CLUSTER_ONLY": "1",
        "KUBESPAWNER_TESTS_SPAWNER": spawner,
    }
    if spawner == "fracspawner":  # FracSpawner needs a catalog: the demo's (CPU by default)
        env.setdefault("FRACSPAWNER_CATALOG", str(REPO / "examples" / "catalogs" / "demo.yaml"))
    argv = [sys.executable, "-m", "pytest", "-p", "pytest_asyncio.plugin",
            "-p", "kubespawner_plugin", "-rfE", "tests", *extra]  # fmt: skip
    print(f"== kubespawner's tests with {spawner}: {' '.join(argv[1:])}", flush=True)
    return subprocess.run(argv, cwd=root, env=env).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spawner", choices=("kubespawner", "fracspawner", "both"),
                        default="both")  # fmt: skip
    parser.add_argument("--source", default=os.environ.get("KUBESPAWNER_SOURCE", UPSTREAM),
                        help="a git directory or URL holding kubespawner's tags")  # fmt: skip
    parser.add_argument("--keep", action="store_true", help="keep the cluster's state directory")
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest (after --)")
    args = parser.parse_args(argv)
    version = importlib.metadata.version("jupyterhub-kubespawner")
    root = place_tests(version, args.source)
    site = install_pins()
    spawners = ["kubespawner", "fracspawner"] if args.spawner == "both" else [args.spawner]
    state = Path(tempfile.mkdtemp(prefix="kubespawner-tests-"))
    # pods run from this environment: the hub pod's image has configurable-http-proxy, so the
    # pods get the repository's (npm install), as tests/conftest.py gives it to the suite's
    os.environ["PATH"] = os.pathsep.join(
        [str(Path(sys.executable).parent), str(REPO / "node_modules" / ".bin"), os.environ["PATH"]]
    )
    # the images' servers run as a user (jovyan, uid 1000); here every pod runs as root, so
    # jupyter-server is told that is fine (else it exits: "Running as root is not recommended")
    config = CACHE / "jupyter-config"
    config.mkdir(parents=True, exist_ok=True)
    (config / "jupyter_server_config.json").write_text('{"ServerApp": {"allow_root": true}}')
    os.environ["JUPYTER_CONFIG_PATH"] = str(config)
    codes = {}
    try:
        with ControlPlane.start(state / "controlplane") as cp:
            topology = load_topology(TOPOLOGY)
            with NodeAgent.start(
                topology, cp.server, cp.pki.ca, state / "nodeagent", mode="run",
                network="namespaces", say=lambda msg: print(f"nodeagent: {msg}", flush=True),
            ):  # fmt: skip
                for spawner in spawners:
                    codes[spawner] = run_tests(root, site, cp.kubeconfig, spawner,
                                               args.pytest_args)  # fmt: skip
    finally:
        if not args.keep:
            shutil.rmtree(state, ignore_errors=True)
        else:
            print(f"state kept in {state}")
    return max(codes.values(), default=1)


if __name__ == "__main__":
    sys.exit(main())
