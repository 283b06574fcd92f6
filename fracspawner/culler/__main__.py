"""`fracspawner culler ARGS` and `python -m fracspawner.culler ARGS`."""

from __future__ import annotations

import sys

from ..stopsignal import honour_sigint
from .app import Culler


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["kubeflow"]:  # Kubeflow notebooks, no hub (culler/kubeflow.py)
        from .kubeflow import main as kubeflow_main

        return kubeflow_main(argv[1:])
    honour_sigint()  # the hub stops its services with SIGINT first
    app = Culler()
    app.initialize(argv)
    try:
        app.start()
    except KeyboardInterrupt:  # stopped by the hub, or Ctrl-C
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
