"""The GPU meter in the OLDEST JupyterLab it supports (OLDEST_JUPYTERLAB), not only the one
this environment has.

A prebuilt extension consumes JupyterLab's packages from the page's shared scope (webpack
module federation): each singleton it imports carries a `requiredVersion`, and a host whose
version does not satisfy it logs "Unsatisfied version X from ... of shared singleton module
... (required ^Y)" (webpack's ConsumeSharedPlugin runtime). The meter is compiled against the
oldest line's packages (labextension/package.json pins them) and declares their ranges
(`jupyterlab.sharedPackages` ... `requiredVersion`, @jupyterlab/builder's metadata_schema.json),
so one build loads in JupyterLab OLDEST_JUPYTERLAB through 4.x.

The browser test installs that JupyterLab from PyPI into a separate environment (the rest of
this one's packages beneath it), gives it only the meter
that `make setup` built, and opens it in Debian's Chromium.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import uuid
from pathlib import Path

import pytest

from devcluster.localhub import free_port
from tests.browser_helpers import chromium
from tests.conftest import REPO
from tests.test_culler_support import http, wait_for

#: the oldest JupyterLab the meter supports (docs/install.md says so)
OLDEST_JUPYTERLAB = "4.1.0"
LABEXT = Path(sys.prefix) / "share" / "jupyter" / "labextensions" / "fracspawner-gpu-meter"
PACKAGE = json.loads((REPO / "labextension" / "package.json").read_text())
POD_ENV = {
    "FRACSPAWNER_GPU_SLICE": "1/4",
    "FRACSPAWNER_GPU_POOL": "h100",
    "FRACSPAWNER_GPU_POOL_DISPLAY": "H100",
    "FRACSPAWNER_GPU_MEMORY_MIB": "20480",
}
H100 = {"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81920}


def _shared_requirements(remote_entry: str) -> dict[str, str]:
    """package -> the version range the built remoteEntry requires of the host's share scope:
    webpack writes each as a list, [1, 7, 1, 0] for ^7.1.0 (1 = caret), prerelease parts after
    an empty slot ([1, 2, 3, 1, , "alpha", 0] for ^2.3.1-alpha.0)."""
    out = {}
    for name, parts in re.findall(r'\("default","([^"]+)",!1,\[([^\]]*)\]\)', remote_entry):
        items = parts.split(",")
        assert items[0] == "1", (name, parts)  # a caret range: anything else is unexpected
        release, _, pre = ",".join(items[1:]).partition(",,")
        version = ".".join(release.split(","))
        if pre:
            version += "-" + ".".join(p.strip('"') for p in pre.split(","))
        out[name] = "^" + version
    return out


def test_the_meter_declares_the_oldest_supported_jupyterlabs_packages():
    """package.json asks for the oldest line's @jupyterlab/* packages or later (^), its lock
    installs that line (what tsc checks the meter against), the shared-scope ranges are the
    same, and the build that `make setup` installed requires exactly them of the host. The
    JupyterLab here (4.x, newer) finds it compatible by its own check (jupyterlab/commands.py
    `_validate_compatibility`, what `jupyter labextension list` marks "OK" or "X")."""
    from jupyterlab.commands import _validate_compatibility, get_app_dir

    lock = json.loads((REPO / "labextension" / "package-lock.json").read_text())["packages"]
    shared = PACKAGE["jupyterlab"]["sharedPackages"]
    for name, spec in PACKAGE["dependencies"].items():
        assert spec.startswith("^"), f"{name} {spec}: a range newer JupyterLabs satisfy"
        if name.startswith("@jupyterlab/"):
            installed = lock[f"node_modules/{name}"]["version"]
            line = spec[1:].rsplit(".", 1)[0] + "."
            assert installed.startswith(line), f"{name}: the lock installs {installed}"
        assert shared[name]["requiredVersion"] == spec, name
        assert shared[name]["bundled"] is False and shared[name]["singleton"] is True, name
    assert PACKAGE["dependencies"]["@jupyterlab/application"] == "^" + OLDEST_JUPYTERLAB
    core = json.loads((Path(get_app_dir()) / "static" / "package.json").read_text())
    assert _validate_compatibility("fracspawner-gpu-meter", PACKAGE["dependencies"], core) == []
    (entry,) = (LABEXT / "static").glob("remoteEntry.*.js")
    required = _shared_requirements(entry.read_text())
    assert required, "no shared module requirements found in the built meter"
    for name, version in required.items():
        assert version == shared[name]["requiredVersion"], (name, version)
    install = (REPO / "docs" / "install.md").read_text()
    assert f"JupyterLab {OLDEST_JUPYTERLAB.rsplit('.', 1)[0]} or newer" in install


@pytest.fixture(scope="module")
def oldest_lab(tmp_path_factory):
    """A jupyter server with JupyterLab OLDEST_JUPYTERLAB, fracspawner's server extension and
    only the meter among the prebuilt extensions; (url, token, gpu file)."""
    if not (LABEXT / "package.json").exists():
        pytest.fail(f"the GPU meter is not built into {LABEXT}: run `make setup`")
    tmp = tmp_path_factory.mktemp("oldest-lab")
    env_dir = tmp / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    python = env_dir / "bin" / "python"
    site = subprocess.check_output(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        text=True,
    ).strip()
    # this environment's packages (jupyter-server, ...) beneath the one installed here
    (Path(site) / "base.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--disable-pip-version-check", f"jupyterlab=={OLDEST_JUPYTERLAB}"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stdout[-2000:] + installed.stderr[-2000:]
    # only the meter: this environment's other prebuilt extensions are not in the new prefix
    extensions = env_dir / "share" / "jupyter" / "labextensions"
    extensions.mkdir(parents=True, exist_ok=True)
    (extensions / "fracspawner-gpu-meter").symlink_to(LABEXT)
    listed = subprocess.run(
        [str(python), "-m", "jupyterlab.labextensions", "list"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "NO_COLOR": "1"},
    )  # fmt: skip
    out = re.sub(r"\x1b\[[0-9;]*m", "", listed.stdout + listed.stderr)
    assert f"JupyterLab v{OLDEST_JUPYTERLAB}" in out, out
    assert re.search(r"fracspawner-gpu-meter v\S+ enabled\s+OK", out), out
    gpu_file = tmp / "gpu.json"
    gpu_file.write_text(json.dumps({"devices": [H100]}))
    settings = tmp / "lab-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    # no "receive Jupyter news?" toast
    (settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False})
    )
    # jupyter-lsp, which JupyterLab depends on, enables itself in a real image by its own
    # etc/jupyter file (not in this new prefix); JupyterLab's LSP plugin asks it for /lsp/status
    (tmp / "config").mkdir()
    (tmp / "config" / "jupyter_server_config.json").write_text(
        json.dumps({"ServerApp": {"jpserver_extensions": {"jupyter_lsp": True}}})
    )
    token, port = uuid.uuid4().hex, free_port()
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "PYTHON"))}
    env = {
        **clean,
        **POD_ENV,
        "PYTHONPATH": str(REPO),  # fracspawner itself, as this checkout has it
        "FRACSPAWNER_GPU_SOURCE": f"sim:{gpu_file}",
        "JUPYTER_CONFIG_DIR": str(tmp / "config"),
        "JUPYTER_CONFIG_PATH": str(REPO / "jupyter-config"),  # enables the server extension
        "JUPYTER_DATA_DIR": str(tmp / "data"),
        "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(tmp / "lab-settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "workspaces"),
        "PATH": f"{env_dir / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    log = open(tmp / "server.log", "wb")  # noqa: SIM115
    process = subprocess.Popen(
        [str(python), "-m", "jupyterlab", "--allow-root", "--no-browser",
         "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={tmp}"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if process.poll() is not None:
            raise RuntimeError((tmp / "server.log").read_text(errors="replace")[-4000:])
        try:
            return http("GET", f"{url}/api/fracspawner/gpu", token)[0] == 200
        except OSError:
            return False

    try:
        wait_for(up, 120, "JupyterLab with the server extension")
        yield url, token
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
        log.close()
        print((tmp / "server.log").read_text(errors="replace")[-3000:])


@pytest.mark.browser
@pytest.mark.slow
def test_the_meter_loads_in_the_oldest_supported_jupyterlab(oldest_lab):
    url, token = oldest_lab
    with chromium() as browser:
        context = browser.new_context(viewport={"width": 1100, "height": 640}, locale="en-GB")
        page = context.new_page()
        console: list[str] = []
        page.on("console", lambda msg: console.append(f"console.{msg.type}: {msg.text}"))
        page.on("pageerror", lambda error: console.append(f"pageerror: {error}"))
        failed: list[str] = []
        page.on(
            "response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None
        )
        page.goto(f"{url}/lab?token={token}")
        page.wait_for_selector("#jp-main-statusbar", timeout=90_000)
        config = json.loads(page.locator("#jupyter-config-data").text_content())
        assert config["appVersion"] == OLDEST_JUPYTERLAB, config["appVersion"]
        page.locator(".fs-GpuMeter").wait_for(state="visible", timeout=60_000)
        page.wait_for_function(
            "() => document.querySelector('.fs-GpuMeter-slice')?.textContent"
            " === 'GPU 1/4 H100 · 20 GiB'"
        )
        unsatisfied = [line for line in console if "Unsatisfied version" in line]
        assert unsatisfied == [], unsatisfied
        broken = [line for line in console if line.startswith(("pageerror", "console.error"))]
        assert broken == [], (broken, failed)
        context.close()
