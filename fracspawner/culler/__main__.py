"""`fracspawner culler ARGS` and `python -m fracspawner.culler ARGS`."""

from __future__ import annotations

import sys

from .app import Culler


def main(argv: list[str] | None = None) -> int:
    app = Culler()
    app.initialize(sys.argv[1:] if argv is None else argv)
    app.start()
    return 0


if __name__ == "__main__":
    sys.exit(main())
