"""The package layout holds: no import cycles, each package imports only what its layer may,
and the lean installs (bare, [notebook]) work without the hub stack. docs/architecture.md."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ROOTS = ("fracspawner", "devcluster")

#: package -> the fracspawner packages it may import (besides itself); docs/architecture.md
LAYERS: dict[str, set[str]] = {
    "model": set(),
    "k8s": set(),
    "backends": {"model", "k8s"},
    "capacity": {"model", "k8s", "backends"},
    "choice": {"model", "k8s", "backends", "capacity"},
    "hub": {"model", "k8s", "backends", "capacity", "choice"},
    "culler": {"model", "k8s", "backends", "capacity", "choice"},
    "kubeflow": {"model", "k8s", "backends", "capacity", "choice"},
    "serverext": set(),
    "cli": {"model", "k8s", "backends", "capacity", "choice", "hub", "culler", "kubeflow"},
}
#: third-party imports a layer must never make (it would drag the hub stack along)
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "model": ("jupyterhub", "kubespawner", "kubernetes", "kubernetes_asyncio", "tornado"),
    "k8s": ("jupyterhub", "kubespawner", "kubernetes_asyncio", "tornado"),
    "backends": ("jupyterhub", "kubespawner", "kubernetes_asyncio", "tornado", "traitlets"),
    "choice": ("jupyterhub", "kubespawner", "kubernetes_asyncio", "tornado"),
    "kubeflow": ("jupyterhub", "kubespawner"),
    "serverext": ("jupyterhub", "kubespawner", "kubernetes", "kubernetes_asyncio"),
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {
        _module_name(p): p
        for root in ROOTS
        for p in sorted((REPO / root).rglob("*.py"))
        if "node_modules" not in p.parts
    }


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(tree: ast.AST):
    """Import nodes that run (anywhere, also inside functions), not those under TYPE_CHECKING."""
    stack = [tree]
    while stack:
        node = stack.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                stack.extend(child.orelse)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child
            stack.append(child)


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules `name` imports: absolute names, relative ones resolved, `from pkg import
    submodule` counted as the submodule."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _runtime_imports(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
            continue
        if node.level:
            base = package.split(".")
            base = base[: len(base) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        submodules = {f"{target}.{a.name}" for a in node.names} & modules.keys()
        found |= submodules
        if len(submodules) < len(node.names):  # some names are the package's own attributes
            found.add(target)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), over our modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph[v]:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle(graph):
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "fracspawner" and len(parts) > 1 else None


def test_each_package_imports_only_its_layer(graph):
    wrong = []
    for module, targets in graph.items():
        layer = _layer(module)
        if layer not in LAYERS:
            continue
        for target in targets:
            other = _layer(target)
            if other in LAYERS and other != layer and other not in LAYERS[layer]:
                wrong.append(f"{module} -> {target}")
            top = target.split(".")[0]
            if top in FORBIDDEN.get(layer, ()):
                wrong.append(f"{module} -> {target} (third-party, forbidden in {layer})")
    assert wrong == []


def test_the_product_never_imports_the_devcluster(graph):
    leaks = [
        f"{m} -> {t}"
        for m, targets in graph.items()
        if m.startswith("fracspawner")
        for t in targets
        if t.split(".")[0] == "devcluster"
    ]
    assert leaks == []


# ------------------------------------------------------------------------ lean installs
#: run Python with these top-level packages made unimportable, as if not installed
_BLOCK = """
import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked by the test)")
sys.meta_path.insert(0, _Block())
"""
HUB_STACK = (
    "jupyterhub",
    "kubespawner",
    "kubernetes",
    "kubernetes_asyncio",
    "kubernetes_validate",
    "devcluster",
)


def _run_without(blocked: tuple[str, ...], code: str) -> subprocess.CompletedProcess:
    prelude = _BLOCK.format(blocked=set(blocked))
    return subprocess.run(
        [sys.executable, "-c", prelude + code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO / "tests",  # not the checkout root: only what is installed is importable
    )


def test_server_extension_imports_without_the_hub_stack():
    result = _run_without(
        HUB_STACK,
        "import fracspawner.serverext as s; print(s._jupyter_server_extension_points())",
    )
    assert result.returncode == 0, result.stderr
    assert "fracspawner.serverext" in result.stdout


def test_plan_works_with_a_bare_install():
    """`fracspawner plan` with only the base dependencies: the GPU fields of the pod, exact."""
    code = (
        "import sys; from fracspawner.cli import main; "
        "sys.exit(main(['plan', '--catalog', sys.argv[1], '--gpu', '1/4', '--pool', 'h100', "
        "'-o', 'json']))"
    )
    prelude = _BLOCK.format(blocked=set(HUB_STACK) | {"traitlets", "tornado", "jupyter_server"})
    result = subprocess.run(
        [sys.executable, "-c", prelude + code, str(REPO / "examples/catalogs/demo.yaml")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO / "tests",
    )
    assert result.returncode == 0, result.stderr
    assert "kubespawner is not installed" in result.stderr
    pod = json.loads(result.stdout)
    assert pod["metadata"]["labels"]["fracspawner.io/pool"] == "h100"
    assert pod["metadata"]["annotations"]["fracspawner.io/gpu-equivalent"] == "0.25"
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "1"


def test_commands_needing_an_extra_say_which():
    result = _run_without(
        HUB_STACK,
        "import sys; from fracspawner.cli import main; sys.exit(main(['service', '--help']))",
    )
    assert result.returncode == 2
    assert "fracspawner[hub]" in result.stderr
    result = _run_without(
        HUB_STACK, "import sys; from fracspawner.cli import main; sys.exit(main(['demo']))"
    )
    assert result.returncode == 2
    assert "make demo" in result.stderr


def _resolve(extra: str) -> set[str]:
    """What pip would install for `fracspawner[extra]` into an empty environment."""
    target = f"{REPO}[{extra}]" if extra else str(REPO)
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"]
        + ["--report", "-", target],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    if result.returncode != 0:
        pytest.fail(f"pip could not resolve {target}: {result.stderr[-2000:]}")
    report = json.loads(result.stdout)
    return {item["metadata"]["name"].lower().replace("_", "-") for item in report["install"]}


@pytest.mark.slow
@pytest.mark.parametrize("extra", ["", "notebook"])
def test_lean_installs_pull_no_hub_stack(extra):
    names = _resolve(extra)
    assert "fracspawner" in names
    assert not names & {"jupyterhub", "jupyterhub-kubespawner", "kubernetes", "kubernetes-validate"}
    if extra == "notebook":
        assert {"jupyter-server", "nvidia-ml-py"} <= names
    else:
        assert "jupyter-server" not in names


# ------------------------------------------------------------------- wheel and sdist
#: where the wheel installs the JupyterLab GPU meter (JupyterLab loads prebuilt extensions there)
METER = "share/jupyter/labextensions/fracspawner-gpu-meter"
#: what the wheel's build hook needs to build the meter from an sdist
LABEXT_SOURCES = (
    "labextension/package.json",
    "labextension/package-lock.json",
    "labextension/tsconfig.json",
    "labextension/install.json",
    "labextension/src/index.ts",
    "labextension/style/index.css",
    "labextension/style/index.js",
)


def _pip_wheel(source: Path, outdir: Path, **env: str) -> subprocess.CompletedProcess:
    """`pip wheel` of a checkout or an sdist, as a release or an image build runs it."""
    clean = {k: v for k, v in os.environ.items() if "SKIP_JUPYTER_BUILDER" not in k}
    return subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(outdir), str(source)],
        capture_output=True,
        text=True,
        timeout=500,
        env={**clean, "PIP_DISABLE_PIP_VERSION_CHECK": "1", **env},
    )


def _assert_ships_the_meter(wheel: Path) -> None:
    """The meter is in the wheel's data, whole: the bundle its package.json loads is there."""
    archive = zipfile.ZipFile(wheel)
    data = {n.split(".data/data/", 1)[1]: n for n in archive.namelist() if ".data/data/" in n}
    assert f"{METER}/package.json" in data, sorted(data)
    assert f"{METER}/install.json" in data
    assert [n for n in data if re.fullmatch(rf"{METER}/static/remoteEntry\.\w+\.js", n)]
    build = json.loads(archive.read(data[f"{METER}/package.json"]))["jupyterlab"]["_build"]
    assert f"{METER}/{build['load']}" in data


@pytest.fixture(scope="module")
def sdist(tmp_path_factory) -> Path:
    """`python -m build --sdist`: what a release uploads."""
    outdir = tmp_path_factory.mktemp("sdist")
    result = subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--outdir", str(outdir), str(REPO)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    (path,) = outdir.glob("fracspawner-*.tar.gz")
    return path


@pytest.mark.slow
def test_the_wheel_ships_the_product_and_no_devcluster(tmp_path):
    result = _pip_wheel(REPO, tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    (wheel,) = tmp_path.glob("fracspawner-*.whl")

    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if n.startswith(("devcluster/", "tests/", "benchmarks/"))]
    for expected in (
        "fracspawner/model/catalog.schema.json",
        "fracspawner/hub/templates/gpu_form.html",
        "fracspawner/hub/static/picker.js",
        "fracspawner/backends/hami.py",
    ):
        assert expected in names
    assert any(n.endswith("etc/jupyter/jupyter_server_config.d/fracspawner.json") for n in names)
    _assert_ships_the_meter(wheel)


@pytest.mark.slow
def test_the_sdist_builds_with_the_product_files(sdist):
    names = {n.split("/", 1)[1] for n in tarfile.open(sdist).getnames() if "/" in n}
    for expected in (
        "pyproject.toml",
        "fracspawner/model/catalog.schema.json",
        "fracspawner/hub/templates/gpu_form.html",
        "frontend/picker.js",
        "jupyter-config/jupyter_server_config.d/fracspawner.json",
        *LABEXT_SOURCES,
    ):
        assert expected in names
    assert not [n for n in names if n.startswith((".venv", "node_modules", ".stamps"))]
    # the meter's sources, not what building them leaves in a checkout
    built = ("labextension/node_modules", "labextension/prebuilt", "labextension/lib")
    assert not [n for n in names if n.startswith(built) or n.endswith(".tsbuildinfo")]


@pytest.mark.slow
def test_a_wheel_built_from_the_sdist_carries_the_meter(sdist, tmp_path):
    """What pip does with the sdist where no wheel fits: the build hook builds the meter from
    its sources (npm install from npm's registry, tsc, jupyter-builder)."""
    result = _pip_wheel(sdist, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (wheel,) = tmp_path.glob("fracspawner-*.whl")
    _assert_ships_the_meter(wheel)


@pytest.mark.slow
def test_a_failed_meter_build_fails_the_wheel(sdist, tmp_path):
    """No wheel without the meter: an npm that fails stops the build, with npm's error."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "npm").write_text("#!/bin/sh\necho 'npm: registry unreachable (test)' >&2\nexit 1\n")
    (fake / "npm").chmod(0o755)
    out = tmp_path / "wheels"
    result = _pip_wheel(sdist, out, PATH=f"{fake}{os.pathsep}{os.environ['PATH']}")
    assert result.returncode != 0
    assert "npm: registry unreachable (test)" in result.stdout + result.stderr
    assert not list(out.glob("*.whl"))


# ------------------------------------------------------------------- each command's extra
#: a command's module (or the hook JupyterHub/jupyter-server loads) -> the extra that must carry
#: every third-party package it imports, also lazily inside functions
COMMAND_EXTRAS = {
    "fracspawner.hub.spawner": "hub",
    "fracspawner.hub.service": "hub",
    "fracspawner.cli.capacity": "hub",
    "fracspawner.culler.__main__": "culler",
    "fracspawner.culler.kubeflow": "culler",
    "fracspawner.kubeflow.webhook": "webhook",
    "fracspawner.serverext": "notebook",
}


def _guarded(tree: ast.AST) -> set[int]:
    """Line numbers of imports inside `try: ... except ImportError` (optional on purpose)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Try):
            continue
        names = {
            n.id
            for h in node.handlers
            for n in ast.walk(h.type or ast.Name("BaseException"))
            if isinstance(n, ast.Name)
        }
        if names & {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}:
            lines |= {n.lineno for s in node.body for n in ast.walk(s) if hasattr(n, "lineno")}
    return lines


def _third_party(start: str, graph: dict[str, set[str]], modules: dict[str, Path]) -> set[str]:
    """Top-level third-party modules `start` imports, through our own modules, unguarded."""
    seen, todo, found = set(), [start], set()
    while todo:
        name = todo.pop()
        if name in seen or name not in modules:
            continue
        seen.add(name)
        todo += [m for m in graph[name] if m in modules]
        tree = ast.parse(modules[name].read_text())
        guarded = _guarded(tree)
        for node in _runtime_imports(tree):
            if node.lineno in guarded or getattr(node, "level", 0):
                continue
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            found |= {n.split(".")[0] for n in names if n}
    return found - set(sys.stdlib_module_names) - set(ROOTS)


def _closure(extra: str) -> set[str]:
    """Distributions `fracspawner[extra]` installs: its pyproject lists, then what those
    require (from the installed metadata)."""
    from importlib.metadata import PackageNotFoundError, requires

    import tomllib
    from packaging.requirements import Requirement

    def norm(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    todo = [Requirement(r) for r in project["dependencies"]]
    todo += [Requirement(r) for r in project["optional-dependencies"][extra]]
    found: set[str] = set()
    while todo:
        req = todo.pop()
        if norm(req.name) in found or req.marker and not req.marker.evaluate({"extra": ""}):
            continue
        found.add(norm(req.name))
        try:
            todo += [Requirement(r) for r in requires(req.name) or []]
        except PackageNotFoundError:
            pass
    return found


@pytest.mark.parametrize(("module", "extra"), sorted(COMMAND_EXTRAS.items()))
def test_each_command_s_extra_carries_what_it_imports(module, extra, graph):
    """`pip install fracspawner[culler]` must run `fracspawner culler kubeflow`: a package
    imported only inside a function (kubernetes_asyncio there) fails at run time, not at start."""
    from importlib.metadata import packages_distributions

    providers = packages_distributions()
    closure = _closure(extra)
    missing = {
        top: providers.get(top, [top])
        for top in _third_party(module, graph, _modules())
        if not {re.sub(r"[-_.]+", "-", d).lower() for d in providers.get(top, [top])} & closure
    }
    assert not missing, f"{module} imports {sorted(missing)}, not in fracspawner[{extra}]"
