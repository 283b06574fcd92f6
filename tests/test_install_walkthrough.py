"""docs/install.md, the walk-through for Zero to JupyterHub: its commands, run.

Every command of the page's ```bash blocks is run here by what stands for its target where no
cluster, registry or container engine exists: the product's own commands for real, `helm` on
the chart through Helm's own code (helm-python-sdk), z2jh through tests/z2jh_support.py. A
command the runner does not know fails the test, so the page cannot gain an unchecked one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.test_layout import _run_without

HUB_STACK = ("jupyterhub", "kubespawner", "kubernetes", "kubernetes_asyncio")


def test_capacity_without_the_hub_extra_names_it():
    """install.md step 3 on a bare `pip install -e .`: `fracspawner capacity` needs
    kubernetes_asyncio (fracspawner[hub]); it says so in one line, exit 2, no traceback."""
    catalog = REPO / "examples" / "catalogs" / "demo.yaml"
    code = (
        "import sys; from fracspawner.cli import main; "
        f"sys.exit(main(['capacity', '--catalog', {str(catalog)!r}]))"
    )
    result = _run_without(HUB_STACK, code)
    assert result.returncode == 2, result.stderr
    assert "fracspawner[hub]" in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


# ------------------------------------------------------------------ the walk-through
INSTALL_MD = REPO / "docs" / "install.md"
#: what the walk-through's commands may start with; anything else fails the test
KNOWN = {"kubectl", "docker", "helm", "pip", "fracspawner", "cp"}
#: the checkout as the page's commands see it (they run in the repository root)
CHECKOUT = (
    "pyproject.toml", "README.md", "LICENSE", ".dockerignore", "fracspawner", "frontend",
    "jupyter-config", "labextension", "images", "charts", "examples",
)  # fmt: skip


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, re.MULTILINE | re.DOTALL)


def _commands(block: str) -> list[str]:
    joined = re.sub(r"\\\n\s*", " ", block)
    return [line.strip() for line in joined.splitlines() if line.strip()]


def test_every_command_of_the_walkthrough_is_one_the_test_runs():
    text = INSTALL_MD.read_text()
    steps = re.findall(r"^## (\d+)\. ", text, re.MULTILINE)
    assert steps == [str(i) for i in range(1, len(steps) + 1)] and len(steps) >= 5, steps
    for block in _blocks(text, "bash"):
        for command in _commands(block):
            word = command.split()[0]
            assert word in KNOWN or re.fullmatch(r"[A-Z_]+=\S+", word), command


@pytest.mark.slow
def test_the_install_walkthrough_runs_as_written(devcluster, tmp_path):
    """docs/install.md's files and commands, in the page's order, in a copy of the checkout:
    each ```bash block runs in bash (set -euo pipefail) with `docker`, `helm` and `pip` the
    stand-ins of tests/install_standins.py, `kubectl` and `fracspawner` the real ones on the
    devcluster. Then what the stand-ins saw: the images built and pushed, the fracspawner
    release's objects valid, z2jh's hub running FracSpawner on the chart's catalog with HAMi
    pods admitted by HAMi's webhook, and both releases gone after the uninstall step."""
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is needed to run the walk-through's kubectl commands"
    work = tmp_path / "checkout"
    work.mkdir()
    for name in CHECKOUT:
        (work / name).symlink_to(REPO / name)
    text = INSTALL_MD.read_text()
    for block in _blocks(text, "yaml"):
        first = block.splitlines()[0]
        if re.fullmatch(r"# [\w.-]+\.yaml", first):
            (work / first[2:]).write_text(block)
    state = tmp_path / "standins.json"
    python = sys.executable
    prelude = "\n".join(
        f'{tool}() {{ "{python}" -m tests.install_standins {tool} "$@"; }}'
        for tool in ("docker", "helm", "pip")
    )
    env = {
        "PATH": f"{Path(python).parent}{os.pathsep}{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "KUBECONFIG": str(devcluster.kubeconfig),
        "PYTHONPATH": str(REPO),
        "STANDIN_STATE": str(state),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    outputs = []
    for block in _blocks(text, "bash"):
        script = f"set -euo pipefail\n{prelude}\n{block}"
        result = subprocess.run(
            ["bash", "-c", script], cwd=work, env=env, capture_output=True, text=True,
            timeout=600,
        )  # fmt: skip
        assert result.returncode == 0, f"{block}\n{result.stdout}\n{result.stderr}"
        outputs.append(result.stdout)
    seen = json.loads(state.read_text())
    registry = "registry.example.org"
    built = {f"{registry}/{n}:0.1.0.dev0" for n in ("fracspawner-hub", "fracspawner")}
    built.add(f"{registry}/fracspawner-notebook:0.1.0.dev0")
    assert set(seen["images"]) == built and set(seen["pushed"]) == built
    # what the steps printed: the cluster's GPUs, the plan, free/total per offer
    everything = "\n".join(outputs)
    assert "NVIDIA-H100-80GB-HBM3" in everything  # kubectl get nodes, step 1
    assert "nvidia.com/gpumem-percentage: '25'" in everything  # plan --gpu 1/4 on HAMi
    capacity = json.loads(outputs[-3][outputs[-3].index("{") :])
    assert capacity["pools"]["h100"]["1/4"]["total"] is not None
    # the z2jh install ran FracSpawner with HAMi pods admitted (step 5), then both went away
    assert "h100: schedulerName hami-scheduler, admitted by HAMi's webhook" in everything
    assert "spawner fracspawner" in everything
    # uninstalling: z2jh upgraded without the overlay (a plain KubeSpawner hub), the chart gone
    assert list(seen["releases"]) == ["jhub/jhub"]
    assert seen["releases"]["jhub/jhub"]["spawner_class"] == "kubespawner.KubeSpawner"
