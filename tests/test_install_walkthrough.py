"""docs/install.md, the walk-through for Zero to JupyterHub: its commands, run.

Every command of the page's ```bash blocks is run here by what stands for its target where no
cluster, registry or container engine exists: the product's own commands for real, `helm` on
the chart through Helm's own code (helm-python-sdk), z2jh through tests/z2jh_support.py. A
command the runner does not know fails the test, so the page cannot gain an unchecked one.
"""

from __future__ import annotations

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
