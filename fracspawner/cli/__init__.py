"""The `fracspawner` command: one sub-command per module, each with its own argument parser."""

from __future__ import annotations

import difflib
import importlib
import sys

# sub-command -> (module, one-line help). Each module has `main(argv: list[str]) -> int`.
# devcluster (demo, devcluster) lives beside the product in the repository, not in the wheel.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": (
        "devcluster.demo",
        "real Kubernetes control plane + JupyterHub with FracSpawner on http://127.0.0.1:8000",
    ),
    "devcluster": (
        "devcluster.cli",
        "the real control plane with simulated GPU nodes (a node agent), in the foreground",
    ),
    "plan": ("fracspawner.cli.plan", "print the pod a spawn would create, without a cluster"),
    "check": ("fracspawner.cli.check", "every mistake of a catalog at once; exit 0 when clean"),
    "capacity": ("fracspawner.cli.capacity", "free/total per pool and offer from a kube context"),
    "usage": ("fracspawner.cli.usage", "per-pool and per-server GPU holdings from a kube context"),
    "doctor": (
        "fracspawner.serverext.doctor",
        "in a notebook pod: slice, limits, NVML, hibernation, culler reports",
    ),
    "service": ("fracspawner.hub.service", "the hub service serving the picker's live offers"),
    "culler": ("fracspawner.culler.__main__", "the GPU-aware idle culler service"),
    "kubeflow": (
        "fracspawner.kubeflow.cli",
        "kubeflow export: PodDefaults, WorkspaceKind patch, webhook configuration",
    ),
    "webhook": ("fracspawner.kubeflow.webhook", "the Kubeflow admission webhook (HTTPS)"),
}


def _usage() -> str:
    lines = ["usage: fracspawner COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<12}{help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:  # a command is missing: usage on stderr, exit 2 (as argparse does)
        print(f"fracspawner: a command is needed\n\n{_usage()}", file=sys.stderr)
        return 2
    if argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if argv[0] == "--version":
        from .. import __version__

        print(__version__)
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        close = difflib.get_close_matches(name, COMMANDS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        print(f"fracspawner: unknown command {name!r}{hint}\n\n{_usage()}", file=sys.stderr)
        return 2
    target = COMMANDS[name][0]
    try:
        module = importlib.import_module(target)
    except ModuleNotFoundError as exc:
        print(f"fracspawner {name}: {_missing(target, exc.name or '')}", file=sys.stderr)
        return 2
    return int(module.main(rest) or 0)


#: what to install for a command whose module needs what a bare install lacks
_EXTRAS = {
    "fracspawner.hub": "fracspawner[hub]",
    "fracspawner.cli.capacity": "fracspawner[hub]",
    "fracspawner.cli.usage": "fracspawner[hub]",
    "fracspawner.culler": "fracspawner[culler]",
    "fracspawner.serverext": "fracspawner[notebook]",
    "fracspawner.kubeflow.webhook": "fracspawner[webhook]",
}


def _missing(target: str, missing: str) -> str:
    if target.startswith("devcluster"):
        return (
            "the devcluster is not installed; it ships with the source repository, not the "
            "wheel: run `make demo` (or `pip install -e .[test]`) in a checkout"
        )
    extra = next((e for prefix, e in _EXTRAS.items() if target.startswith(prefix)), None)
    hint = f"; install {extra}" if extra else ""
    return f"needs the Python package {missing!r}, which is not installed{hint}"


if __name__ == "__main__":
    sys.exit(main())
