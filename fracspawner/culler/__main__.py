"""`fracspawner culler ARGS` and `python -m fracspawner.culler ARGS`."""

from __future__ import annotations

import sys

from .app import Culler


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["kubeflow"]:  # Kubeflow notebooks, no hub (culler/kubeflow.py)
        from .kubeflow import main as kubeflow_main

        return kubeflow_main(argv[1:])
    app = Culler()
    app.initialize(argv)
    app.start()
    return 0


if __name__ == "__main__":
    sys.exit(main())
