"""`fracspawner demo`: the real Kubernetes control plane with the node agent running the demo
topology's nodes (devcluster/democluster.py) + a real JupyterHub with FracSpawner.

Everything listens on loopback. Ctrl-C stops the hub (which stops the servers and deletes
their pods), then the cluster (the node agent ends any pod still running, then the control
plane stops, etcd last): nothing stray. A control-plane component that dies is reported with
its log's last lines and the demo stops the same way.
"""

from __future__ import annotations

import argparse
import secrets
import sys
import time
from importlib.resources import files
from pathlib import Path

import yaml

from fracspawner.backends import load_catalog, plan_slice
from fracspawner.choice.admission import ROOM_TAG_KEY_ENV
from fracspawner.choice.offers import size_label
from fracspawner.model.access import allowed_pools, within_quota
from fracspawner.model.catalog import AccessRule, Catalog
from fracspawner.model.units import gpu_amount

from .democluster import ClusterFailed, exited, hub_waits_for, start_devcluster, stop_process
from .leftovers import why_not_start
from .localhub import REPO, free_port, keep_port, launch_hub, wait_hub
from .stopsignals import StopSignals

# The demo's users and groups: any name logs in (DummyAuthenticator-style password), "admin" is
# a hub admin (localhub), and these group members get the catalog's group rule.
DEMO_GROUP_MEMBERS: dict[str, list[str]] = {"ml-research": ["mira", "ravi"]}
DEMO_GROUPS = "c.JupyterHub.load_groups = %r\n" % {
    group: {"users": members} for group, members in DEMO_GROUP_MEMBERS.items()
}


def _sees(catalog: Catalog, rule: AccessRule) -> str:
    """What a rule gives, in the picker's words: 'H100 80GB (HAMi) only: 1/8, 1/4, 10 GiB;
    at most 1/4 GPU in total'."""
    pools = allowed_pools(catalog, rule)
    if not pools:
        return "no GPU pool (CPU-only servers)"
    if len(pools) == 1:
        # only the sizes the quota lets one take
        sizes = ", ".join(
            size_label(offer)
            for offer in pools[0].offers
            if within_quota(rule, 0.0, plan_slice(offer, pools[0], None).gpu_equivalent)
        )
        what = f"{pools[0].display_name} only: {sizes}"
    else:
        what = "every pool" if len(pools) == len(catalog.pools) else "the pools"
        what += ": " + ", ".join(p.display_name for p in pools)
    if rule.max_gpu is None:
        return f"{what}; no quota"
    return f"{what}; at most {gpu_amount(rule.max_gpu)} in total"


def who_sees_what(catalog: Catalog, groups: dict[str, list[str]]) -> list[str]:
    """The banner's lines, from the catalog's access rules (so they cannot drift from what
    the picker shows): everyone else, each demo group's members, the admin."""
    lines = [f"any other name (alice, bob, ...): {_sees(catalog, catalog.access_default)}"]
    for group, members in groups.items():
        if group in catalog.access_groups:
            rule = catalog.rule_for(members[0], [group])
            lines.append(f"{', '.join(members)} ({group}): {_sees(catalog, rule)}")
    lines.append("admin: every pool, no quota; also JupyterHub's admin page")
    return lines


# The culler runs in the demo with timings short enough to watch (issue 27 #3), announced in the
# banner; a catalog of one's own (--catalog) keeps its own.
DEMO_IDLE = {
    # an idle kernel's (simulated) GPU memory is parked in host memory after a minute, on every
    # pool: the demo's GPU and its checkpoint driver are simulated (serverext/simcheckpoint.py)
    "kernel_gpu_hibernate": "1m",
    # kernel_gpu_idle stays the backend's default (model/idle_defaults.py): off on the H100
    # (HAMi reserves the slice: a shut-down kernel gives nobody anything), 30 min on the T4
    "server_gpu_idle": "10m",
    "server_idle": "30m",
    "server_unattended": "2h",
}
HUB_START_TIMEOUT = 180  # seconds: JupyterHub, its proxy and its two managed services
DEMO_CULL_EVERY = 15  # seconds between the culler's cycles
# An open, visible JupyterLab tab keeps its user present until this long after their last input
# (serverext/presence.py; 900 s by default): the README's walk watches a kernel hibernate with
# the tab open, which took 16 minutes at the default (issue 38 #1). Set in the notebooks'
# environment, as an admin would (FRACSPAWNER_PRESENCE_TIMEOUT_SECONDS is not reserved).
DEMO_PRESENCE_TIMEOUT = 60
DEMO_NOTEBOOK_ENV = f"""
c.KubeSpawner.environment = {{"FRACSPAWNER_PRESENCE_TIMEOUT_SECONDS": "{DEMO_PRESENCE_TIMEOUT}"}}
"""


# Kubernetes DRA in the demo (issue 30): the topology's two DRA nodes (an H100 whose NVIDIA DRA
# driver runs --consumable-shares=memory, an A100 with DynamicMIG; devcluster/dra/nvidia.py
# publishes their ResourceSlices) get these pools. Added to the demo's copy of the catalog, not
# to examples/catalogs/demo.yaml, whose three pools the rest of the tests are written against.
DEMO_DRA_POOLS = {
    "h100-dra": {
        "display_name": "H100 80GB (DRA memory shares)",
        "description": "A memory share of an H100 through Kubernetes DRA (NVIDIA's DRA driver, "
        "consumable memory): the scheduler books it, nothing limits a process to it.",
        "gpu": "H100-80GB",
        "backend": "dra",
        "options": {"sharing": "memory"},
        "offers": ["1/8", "1/4", "10GiB", "20GiB"],
    },
    "a100-dra-mig": {
        "display_name": "A100 80GB (DRA, MIG made on demand)",
        "description": "MIG instances an A100 makes when a server asks (Kubernetes DRA, "
        "NVIDIA's DRA driver with DynamicMIG): isolated in hardware.",
        "gpu": "A100-80GB",
        "backend": "dra",
        "options": {"mig": "dynamic"},
        "offers": ["mig-1g.10gb", "mig-2g.20gb", "mig-3g.40gb", "1"],
    },
}


def with_demo_timings(catalog_file: Path, state_dir: Path) -> Path:
    """The catalog with the demo's idle timings and its DRA pools, written into the state dir
    (same name)."""
    data = yaml.safe_load(catalog_file.read_text()) or {}
    data["idle"] = {**(data.get("idle") or {}), **DEMO_IDLE}
    data["pools"] = {**(data.get("pools") or {}), **DEMO_DRA_POOLS}
    out = state_dir / catalog_file.name
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


# JupyterHub 6 gives a managed service 30 s to answer, then exits ("Cannot connect to
# gpu-culler service managed"): the culler took longer on a busy 2-core machine (importing
# kubespawner alone ~10 s there). Service.timeout is new in JupyterHub 6 (5 has none).
SERVICE_TIMEOUT = """
from jupyterhub.services.service import Service as _Service
if "timeout" in _Service.class_trait_names():
    for _service in c.JupyterHub.services:
        _service.setdefault("timeout", 120)
"""


def culler_config(catalog_file: Path, port: int) -> str:
    """The GPU-aware culler as a hub-managed service: the servers push their GPU reports to
    it, the admin page reads its state (docs/admin-guide.md has the same for real hubs). The
    hub and the culler share a fresh key for the server tags of the room answer (as the
    chart's Secret gives both): in its environment, not its command line, which `ps` shows."""
    url = f"http://127.0.0.1:{port}/services/gpu-culler/"
    command = [
        sys.executable, "-m", "fracspawner", "culler", f"--catalog={catalog_file}",
        f"--cull-every={DEMO_CULL_EVERY}", "--namespace=default",
    ]  # fmt: skip
    key = secrets.token_hex(32)
    return f"""
c.JupyterHub.services.append({{
    "name": "gpu-culler", "url": "http://127.0.0.1:{port}", "command": {command!r},
    "display": False, "environment": {{{ROOM_TAG_KEY_ENV!r}: {key!r}}},
}})
c.FracSpawner.room_tag_key = {key!r}
c.JupyterHub.load_roles.append({{
    "name": "gpu-culler", "services": ["gpu-culler"],
    "scopes": ["list:users", "read:users:activity", "read:users:groups", "read:servers",
               "delete:servers"],
}})
c.FracSpawner.culler_url = {url!r}
for _service in c.JupyterHub.services:
    if _service["name"] == "fracspawner":
        _service["command"] = [*_service["command"], "--culler-url={url}"]
{SERVICE_TIMEOUT}"""


def timings_line(catalog_file: Path) -> str:
    """The banner's words for the culler's timings of this catalog."""
    idle = (yaml.safe_load(catalog_file.read_text()) or {}).get("idle") or {}
    words = {
        "kernel_gpu_hibernate": "idle GPU kernels hibernate (simulated) after",
        "kernel_gpu_idle": "idle GPU kernels shut down after",
        "server_gpu_idle": "idle GPU servers stopped after",
        "server_idle": "any idle server after",
    }
    said = [f"{text} {idle[key]}" for key, text in words.items() if idle.get(key)]
    return "; ".join(said) or "the catalog's defaults"


def presence_words(seconds: int) -> str:
    """'1 min', '90 s': the banner's words for the presence timeout."""
    return f"{seconds // 60} min" if seconds % 60 == 0 else f"{seconds} s"


def demo_topology() -> Path:
    return Path(str(files("devcluster") / "topologies" / "demo.yaml"))


def demo_catalog() -> Path:
    return REPO / "examples" / "catalogs" / "demo.yaml"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="fracspawner demo", description=__doc__)
    parser.add_argument("--port", type=int, default=8000, help="hub port on 127.0.0.1")
    parser.add_argument("--topology", type=Path, default=None, help="devcluster topology YAML")
    parser.add_argument("--catalog", type=Path, default=None, help="fracspawner catalog YAML")
    parser.add_argument("--state-dir", type=Path, default=Path(".demo"), help="where state goes")
    parser.add_argument(
        "--password", default=None, help="the password every demo user logs in with"
    )
    parser.add_argument(
        "--stop-timeout",
        type=float,
        default=30,
        help="seconds the hub gets to stop its servers on Ctrl-C before it is killed "
        "(whatever it started is ended either way)",
    )
    args = parser.parse_args(argv)
    state_dir = args.state_dir.resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    password = args.password or secrets.token_urlsafe(6)

    catalog_file = (args.catalog or demo_catalog()).resolve()
    if args.catalog is None:
        catalog_file = with_demo_timings(catalog_file, state_dir)
    banner = "".join(
        f"    {line}\n" for line in who_sees_what(load_catalog(catalog_file), DEMO_GROUP_MEMBERS)
    )
    # an earlier demo still running (its hub holding the port) or another program on the
    # port: say so, rather than print a password that the old hub would refuse
    if refused := why_not_start(state_dir, args.port):
        print(f"fracspawner demo: {refused}", file=sys.stderr)
        return 1
    # the caller (a test, a script) may have drawn --port from the block free_port() draws
    # from: the culler's and the hub's own ports must not be drawn on top of it
    keep_port(args.port)
    # SIGTERM (say, to make's process group) and SIGHUP stop everything like Ctrl-C, from the
    # start: one before the hub was up killed this process and left the devcluster running.
    # Only the first interrupts; later ones (a closed terminal's second SIGHUP) cannot abort
    # the clean-up (devcluster/stopsignals.py)
    signals = StopSignals()
    signals.install()
    cluster = hub = None
    status = 0
    try:
        began = time.monotonic()
        cluster = start_devcluster(args.topology or demo_topology(), state_dir)
        # the hub starts beside the cluster and waits in its configuration until the cluster
        # serves (democluster.hub_waits_for): their start-ups overlap
        _say(
            "  starting JupyterHub with FracSpawner, its picker service and the GPU culler "
            "(it goes on once the cluster is ready)..."
        )
        hub = launch_hub(
            state_dir=state_dir / "hub",
            kubeconfig=state_dir / "kubeconfig",
            catalog_file=catalog_file,
            port=args.port,
            password=password,
            # the hub's, the proxy's and the service's logs go to a file: the password and
            # who-sees-what stay the last lines on the screen (no proxy noise scrolls them off)
            log_to_console=False,
            extra_config=hub_waits_for(cluster.ready_file)
            + DEMO_GROUPS
            + DEMO_NOTEBOOK_ENV
            + culler_config(catalog_file, free_port()),
        )
        cluster.wait_ready()
        # its two managed services start one after the other: over a minute on a busy 2-core
        # machine
        hub = wait_hub(hub, HUB_START_TIMEOUT)
        _say(f"  [{time.monotonic() - began:5.1f} s] hub ready")
        print(
            f"\n  fracspawner demo: {hub.url}/hub/login   password: {password}\n"
            f"  who sees what (the access rules of {catalog_file.name}):\n{banner}"
            f"  GPU admin page (log in as admin): {hub.url}/services/fracspawner/admin\n"
            f"  the GPU culler runs{' with demo timings' if args.catalog is None else ''}: "
            f"{timings_line(catalog_file)} (every {DEMO_CULL_EVERY} s)\n"
            f"  a tab counts as away {presence_words(DEMO_PRESENCE_TIMEOUT)} after your last "
            "input (keys, mouse, scrolling), even while it stays open\n"
            "  a tab that stays open, hidden or visible, keeps you in session 2 h after you were "
            "last seen: your idle kernels may hibernate then, never be shut down\n"
            f"  logs: {hub.log_path} (hub, proxy, service, culler), "
            f"{state_dir / 'devcluster.log'}\n"
            "  Ctrl-C stops everything.\n",
            flush=True,
        )
        while hub.process.poll() is None and cluster.poll() is None:
            time.sleep(0.5)
        if cluster.poll() is not None:  # a control-plane component died, or the node agent
            status = 1
            _say(f"\nfracspawner demo: {exited(cluster.proc, cluster.log_path)}")
            _say("stopping the demo...")
    except KeyboardInterrupt:
        _say("\nstopping the demo (Ctrl-C again will not interrupt this)...")
    except (ClusterFailed, RuntimeError, TimeoutError) as err:  # the cluster's or the hub's
        status = 1
        print(f"fracspawner demo: {err}", file=sys.stderr, flush=True)
    finally:
        # from here a Ctrl-C, SIGTERM or SIGHUP must not abort the clean-up (orphans). One that
        # comes just as the hub or devcluster ended on its own raises here, once, having marked
        # the stop like stop() does
        try:
            signals.stop()
        except KeyboardInterrupt:
            pass
        if hub is not None:
            hub.stop(grace=args.stop_timeout)
        if cluster is not None:
            stop_process(cluster)
        _say("the demo has stopped.")
    return status


def _say(text: str) -> None:
    try:
        print(text, flush=True)
    except OSError:  # the terminal or pipe went away with the signal: stop all the same
        pass
