"""The project's three images, their names and versions, agree wherever they are written (issue 34
item 11): the version is fracspawner/_version.py's, which Chart.yaml's appVersion, the chart's
default catalog, the z2jh overlay, the README and the docs name; the image names are the ones
docs/install.md builds from images/*/Dockerfile; the base images the Dockerfiles pin are the
ones the docs name (z2jh's hub image at the z2jh version the docs install, which
tests/z2jh_support.py models). And the GPU notebook image is pre-pulled (z2jh's
`prePuller.extraImages`), so a first spawn does not wait for a pull of many GB under
`singleuser.startTimeout`.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import yaml

from tests.conftest import REPO
from tests.z2jh_support import Z2JH_DEFAULTS

INSTALL = Path("docs/install.md")
OVERLAY = Path("examples/z2jh/values.yaml")
#: where the images are written down: scanned for `<registry>/<image>:<tag>` and `name:`/`tag:`
SCANNED = ("README.md", "docs/*.md", "examples/**/*.yaml", "charts/fracspawner/values.yaml",
           "charts/fracspawner/files/*.yaml", "charts/fracspawner/templates/NOTES.txt")  # fmt: skip


def sources(root: Path) -> list[Path]:
    """Every file the check reads, relative to `root`."""
    found = {Path("fracspawner/_version.py"), Path("charts/fracspawner/Chart.yaml")}
    found |= {p.relative_to(root) for p in root.glob("images/*/Dockerfile")}
    for pattern in SCANNED:
        found |= {p.relative_to(root) for p in root.glob(pattern)}
    return sorted(found)


def built_images(install: str) -> dict[str, str]:
    """images/<dir> -> the image name docs/install.md builds from it."""
    return dict(
        re.findall(r"docker build -f images/([\w-]+)/Dockerfile -t \$REGISTRY/([\w-]+):", install)
    )


def dockerfile_args(text: str) -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S+)", text, re.M))


def last(name: str) -> str:
    return name.rsplit("/", 1)[-1]


def problems(root: Path, z2jh_hub_tag: str) -> list[str]:
    """Every place where an image name or version disagrees with its source."""
    out: list[str] = []
    version = re.search(r'__version__ = "([^"]+)"', (root / "fracspawner/_version.py").read_text())[
        1
    ]
    chart = yaml.safe_load((root / "charts/fracspawner/Chart.yaml").read_text())
    if chart["appVersion"] != version:
        out.append(f"Chart.yaml appVersion {chart['appVersion']!r}, the version is {version!r}")
    install = (root / INSTALL).read_text()
    built = built_images(install)
    dirs = {p.parent.name for p in root.glob("images/*/Dockerfile")}
    if set(built) != dirs:
        out.append(f"docs/install.md builds images/{sorted(built)}, images/ has {sorted(dirs)}")
    for found in re.findall(r"^VERSION=(\S+)", install, re.M):
        if found != version:
            out.append(f"docs/install.md: VERSION={found}, the version is {version!r}")
    names = "|".join(sorted(map(re.escape, built.values()), key=len, reverse=True))
    reference = re.compile(rf"(?<![\w.$-])(?:[\w.-]+(?::\d+)?/)+({names}):([0-9][\w.-]*)")
    name_tag = re.compile(rf'name:\s*"?\S*/({names})"?\s*\n\s*tag:\s*"?([^"\s]+)"?')
    for path in sources(root):
        if path.suffix not in (".md", ".yaml", ".txt"):
            continue
        text = (root / path).read_text()
        for pattern in (reference, name_tag):
            for match in pattern.finditer(text):
                tag = match[2]
                if tag != version and not tag.startswith("{{"):
                    line = text.count("\n", 0, match.start()) + 1
                    out.append(f"{path}:{line}: {match[1]}:{tag}, the version is {version!r}")
    # the names the chart, the overlay and the default catalog use are the ones built
    values = yaml.safe_load((root / "charts/fracspawner/values.yaml").read_text())
    overlay = yaml.safe_load((root / OVERLAY).read_text())
    catalog = yaml.safe_load((root / "charts/fracspawner/files/default-catalog.yaml").read_text())
    used = {
        "fracspawner": ("charts/fracspawner/values.yaml image.name", values["image"]["name"]),
        "hub": (f"{OVERLAY} hub.image.name", overlay["hub"]["image"]["name"]),
        "notebook": ("the chart's default catalog's image",
                     next(i["image"] for i in catalog["images"].values()).split(":")[0]),
    }  # fmt: skip
    for folder, (where, name) in used.items():
        if last(name) != built.get(folder):
            out.append(f"{where} is {name!r}, images/{folder} is built as {built.get(folder)!r}")
    # the GPU notebook image is pre-pulled, at the version
    pulled = {
        last(i.get("name", "")): str(i.get("tag"))
        for i in ((overlay.get("prePuller") or {}).get("extraImages") or {}).values()
    }
    if pulled.get(built.get("notebook", "")) != version:
        out.append(f"{OVERLAY} prePuller.extraImages does not pull the notebook image at {version}")
    # the base images the Dockerfiles pin are the ones the docs name
    args = {p.parent.name: dockerfile_args(p.read_text()) for p in root.glob("images/*/Dockerfile")}
    pythons = {a["PYTHON_IMAGE"] for a in args.values() if "PYTHON_IMAGE" in a}
    if len(pythons) > 1:
        out.append(f"the Dockerfiles pin different PYTHON_IMAGEs: {sorted(pythons)}")
    for image in [*pythons, args.get("notebook", {}).get("NOTEBOOK_IMAGE", "")]:
        if image and image not in install:
            out.append(f"docs/install.md does not name the base image {image}")
    z2jh = set(re.findall(r"jupyterhub/jupyterhub --version (\S+)", install))
    hub = args.get("hub", {}).get("HUB_IMAGE", "")
    for tag in sorted(z2jh | {z2jh_hub_tag}):
        if hub != f"quay.io/jupyterhub/k8s-hub:{tag}":
            out.append(f"images/hub/Dockerfile HUB_IMAGE is {hub!r}; z2jh {tag} is named")
        if f"quay.io/jupyterhub/k8s-hub:{tag}" not in install:
            out.append(f"docs/install.md does not name z2jh {tag}'s hub image")
    return out


def test_the_image_names_and_versions_agree_everywhere():
    assert problems(REPO, Z2JH_DEFAULTS["hub"]["image"]["tag"]) == []


def test_a_drift_in_any_of_them_is_named(tmp_path):
    """The check on a copy of the files, each kind of drift made once."""
    for path in sources(REPO):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / path, tmp_path / path)
    version = re.search(r'"([^"]+)"', (REPO / "fracspawner/_version.py").read_text())[1]

    def edit(path: str, old: str, new: str) -> None:
        text = (tmp_path / path).read_text()
        assert old in text, (path, old)
        (tmp_path / path).write_text(text.replace(old, new, 1))

    edit("charts/fracspawner/Chart.yaml", f'appVersion: "{version}"', 'appVersion: "9.9.9"')
    edit("README.md", f"fracspawner-notebook:{version}", "fracspawner-notebook:0.0.1")
    edit(str(OVERLAY), f'tag: "{version}"', 'tag: "0.0.2"')
    edit("images/hub/Dockerfile", "k8s-hub:", "k8s-hub:0")
    found = "\n".join(problems(tmp_path, Z2JH_DEFAULTS["hub"]["image"]["tag"]))
    assert "Chart.yaml appVersion '9.9.9'" in found
    assert "README.md:" in found and "fracspawner-notebook:0.0.1" in found
    assert f"{OVERLAY}:" in found and "fracspawner-hub:0.0.2" in found
    assert "images/hub/Dockerfile HUB_IMAGE" in found


def test_the_gpu_notebook_image_is_pre_pulled_and_the_docs_say_why():
    overlay = yaml.safe_load((REPO / OVERLAY).read_text())
    pulled = overlay["prePuller"]["extraImages"]["fracspawner-notebook"]
    assert last(pulled["name"]) == "fracspawner-notebook"
    install = (REPO / INSTALL).read_text()
    for words in ("prePuller.extraImages", "singleuser.startTimeout",
                  "prePuller.extraTolerations"):  # fmt: skip
        assert words in install, words
