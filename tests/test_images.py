"""Every images/*/Dockerfile built by a real Docker daemon with BuildKit, and each image run once.

Debian's dockerd runs as the tests' own (tests/docker_daemon.py); the base images the Dockerfiles
name cannot be pulled (no registry here), so stand-ins tagged with the same names are built first
from tests/standin_images/ (tests/image_builds.py, docs/development.md "Images"). The build is
cached outside the checkout: a first build on a fresh machine takes minutes, a build with nothing
changed seconds. A machine without docker.io or mmdebstrap skips these tests, CI fails them
(tests/missing.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from tests.docker_daemon import DockerDaemon, DockerUnavailable
from tests.image_builds import (
    CACHE,
    IMAGES,
    STANDINS,
    BuildFailed,
    base_images,
    built_images,
    require_host_tools,
    standin_for,
)
from tests.missing import missing

# the first build on a fresh machine (Debian root file system, stand-ins, the meter) takes minutes
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

NOTEBOOK = IMAGES["notebook"]
HUB = IMAGES["hub"]
SERVICES = IMAGES["fracspawner"]


@pytest.fixture(scope="module")
def docker(request) -> Iterator[DockerDaemon]:
    try:
        require_host_tools()
    except DockerUnavailable as error:
        missing(str(error))
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")

    def progress(message: str) -> None:
        if reporter is not None:  # not under xdist: the build log in the cache says it too
            reporter.write_line(f"images: {message}")

    with built_images(progress) as daemon:
        yield daemon


def run(daemon: DockerDaemon, image: str, *command: str, entrypoint: str | None = None) -> str:
    """`docker run --rm` with no network: the container's output; its failure fails the test."""
    args = ["run", "--rm", "--network", "none"]
    if entrypoint is not None:
        args += ["--entrypoint", entrypoint]
    proc = daemon.docker(*args, image, *command, check=False, timeout=300)
    assert proc.returncode == 0, (
        f"{image} {command}: exit {proc.returncode}\n{proc.stdout}{proc.stderr}"
    )
    return _plain(proc.stdout + proc.stderr)


def _plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def _config(daemon: DockerDaemon, image: str, field: str) -> str:
    return daemon.docker(
        "image", "inspect", "--format", f"{{{{.Config.{field}}}}}", image
    ).stdout.strip()


def test_the_notebook_image_runs_as_jovyan_with_the_extension_and_the_meter(docker):
    assert _config(docker, NOTEBOOK, "User") == "1000"  # numeric: runAsNonRoot can check it
    assert run(docker, NOTEBOOK, "sh", "-c", "id -u; id -g; id -un").split() == [
        "1000",
        "100",
        "jovyan",
    ]
    where = run(docker, NOTEBOOK, "python", "-c", "import fracspawner; print(fracspawner.__file__)")
    assert where.startswith("/opt/conda/"), where  # installed into the image's environment
    files = run(
        docker, NOTEBOOK, "sh", "-c",
        "ls /opt/conda/etc/jupyter/jupyter_server_config.d/fracspawner.json"
        " /opt/conda/share/jupyter/labextensions/fracspawner-gpu-meter/package.json"
        " /opt/conda/share/jupyter/labextensions/fracspawner-gpu-meter/static/style.js;"
        " ls -d /tmp/wheels /tmp/base-constraints.txt 2>/dev/null; true",
    )  # fmt: skip
    assert "/tmp/" not in files, files  # the wheels and the constraints are removed
    server = run(docker, NOTEBOOK, "jupyter", "server", "extension", "list")
    assert re.search(r"fracspawner\.serverext\s+enabled", server), server
    assert re.search(r"fracspawner\.serverext\s+OK", server), server
    lab = run(docker, NOTEBOOK, "jupyter", "labextension", "list")
    assert re.search(r"fracspawner-gpu-meter v\S+ enabled\s+OK", lab), lab
    # the CUDA base's ENV stays in the image: why CPU-only servers need `void` (issue 34 #3)
    assert "NVIDIA_VISIBLE_DEVICES=all" in _config(docker, NOTEBOOK, "Env")


def test_the_notebook_image_leaves_its_environment_writable_by_the_users_group(docker):
    """docker-stacks' recipe ends a pip install with `fix-permissions`: a server run under
    another uid with group users (docker-stacks' NB_UID/`--group-add users`) can still
    `pip install` into /opt/conda, the fracspawner files included."""
    wrong = run(
        docker, NOTEBOOK, "sh", "-c",
        'find "$CONDA_DIR" \\( ! -group "$NB_GID" -o ! -perm -g+rw \\) -print | head -5',
    )  # fmt: skip
    assert not wrong.strip(), wrong


def test_the_hub_image_runs_z2jhs_jupyterhub_with_fracspawner(docker):
    assert _config(docker, HUB, "User") == "1000"
    assert run(docker, HUB, "id", "-u").strip() == "1000"
    # z2jh 4.4.0's JupyterHub and KubeSpawner stay as z2jh ships them (the constraints)
    assert run(docker, HUB, "jupyterhub", "--version").strip() == "5.5.0"
    versions = run(
        docker, HUB, "python", "-c",
        "import kubespawner, fracspawner; from fracspawner import FracSpawner;"
        " print(kubespawner.__version__, fracspawner.__file__)",
    )  # fmt: skip
    kubespawner, where = versions.split()
    assert kubespawner == "7.0.0" and where.startswith("/usr/local/"), versions


def test_the_services_image_runs_fracspawner(docker):
    assert _config(docker, SERVICES, "User") == "10001:10001"
    out = run(docker, SERVICES)  # ENTRYPOINT fracspawner, CMD --help
    assert "usage: fracspawner" in out and "culler" in out and "webhook" in out, out
    # the three services' extras are installed
    run(
        docker, SERVICES, "-c", "import kubernetes_asyncio, prometheus_client, kubespawner",
        entrypoint="python",
    )  # fmt: skip


def test_the_builds_ran_on_buildkit(docker):
    """Debian's docker CLI has no buildx: DOCKER_BUILDKIT=1 makes its `docker build` use the
    daemon's BuildKit (the `#N [stage]` log), not the classic builder ("Sending build context")."""
    log = (CACHE / "build.log").read_text(errors="replace")
    assert "Sending build context to Docker daemon" not in log
    for name in IMAGES:
        assert re.search(rf"-f \S*images/{name}/Dockerfile", log), name
    assert re.search(r"^#\d+ \[internal\] load build definition from Dockerfile", log, re.MULTILINE)


def test_every_base_image_has_a_stand_in():
    refs = base_images()
    assert {standin_for(ref)[0].directory for ref in refs} == {s.directory for s in STANDINS}
    with pytest.raises(BuildFailed, match="no stand-in for the base image ubuntu:24.04"):
        standin_for("ubuntu:24.04")


def test_a_stopped_daemon_leaves_no_process_and_no_socket(tmp_path):
    """The daemon's containerd outlives a killed dockerd: stop() waits for both, so no daemon
    is left behind by a test session."""
    try:
        require_host_tools()
    except DockerUnavailable as error:
        missing(str(error))
    daemon = DockerDaemon(tmp_path / "data-root", storage_driver="vfs")
    try:
        daemon.start()
        started = daemon.descendants()
        assert len(started) >= 2, started  # dockerd and its containerd
    finally:
        daemon.stop()
    assert not daemon.descendants()
    assert not daemon.mounts()
    assert not daemon.run_dir.exists()
    assert daemon.process is not None and daemon.process.returncode is not None


def test_a_missing_daemon_is_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr("tests.docker_daemon.DOCKERD_FALLBACK", str(tmp_path / "dockerd"))
    with pytest.raises(DockerUnavailable) as raised:
        require_host_tools()
    message = str(raised.value)
    assert "\n" not in message
    assert message in (
        "dockerd is not installed (apt-get install docker.io; make system-deps)",
        "dockerd needs root here (no rootless set-up): run the tests as root",
    )


def test_a_dockerd_that_cannot_start_says_why(tmp_path):
    try:
        require_host_tools()
    except DockerUnavailable as error:
        missing(str(error))
    daemon = DockerDaemon(tmp_path / "data-root", storage_driver="no-such-driver")
    try:
        # dockerd's own last word: "failed to start daemon: error initializing graphdriver:
        # driver not supported" (its error lines before it name the driver)
        why = r"^dockerd did not start: failed to start daemon: .*graphdriver"
        with pytest.raises(DockerUnavailable, match=why):
            daemon.start(timeout=60)
    finally:
        daemon.stop()
    assert not daemon.descendants()
    assert not daemon.mounts()  # dockerd's bind mount of its data root, left by a failed start
