"""The `fracspawner` command: one sub-command per module, each with its own argument parser."""

from __future__ import annotations

import importlib
import sys

# sub-command -> (module, one-line help). Each module has `main(argv: list[str]) -> int`.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": (
        "fracspawner.demo",
        "devcluster + JupyterHub with FracSpawner on http://127.0.0.1:8000",
    ),
    "devcluster": (
        "fracspawner.devcluster.cli",
        "the local Kubernetes stand-in, in the foreground",
    ),
    "plan": ("fracspawner.plan_cli", "print the pod a spawn would create, without a cluster"),
    "capacity": ("fracspawner.capacity_cli", "free/total per pool and offer from a kube context"),
    "culler": ("fracspawner.culler.__main__", "the GPU-aware idle culler service"),
}


def _usage() -> str:
    lines = ["usage: fracspawner COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<12}{help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if argv[0] == "--version":
        from . import __version__

        print(__version__)
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"fracspawner: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
