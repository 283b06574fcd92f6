"""`python -m devcluster.controlplane`: one real control plane in the foreground until Ctrl-C
or SIGTERM; a component that dies ends it with that component's log."""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import time
from pathlib import Path

from .binary import BinaryMissing
from .launcher import ControlPlane, ControlPlaneError
from .processes import ComponentDied


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devcluster.controlplane", description=__doc__)
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=Path(".devcluster/controlplane"),
        help="certificates, etcd data, kubeconfigs and logs (emptied at start)",
    )
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        default=None,
        help="also copy the admin kubeconfig here (it is always STATE_DIR/admin.kubeconfig)",
    )
    args = parser.parse_args(argv)

    def stop_on(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop_on)

    def say(msg: str) -> None:
        print(f"controlplane: {msg}", file=sys.stderr, flush=True)

    try:
        cp = ControlPlane.start(args.state_dir, progress=say)
    except (BinaryMissing, ControlPlaneError) as err:
        say(str(err))
        return 1
    except KeyboardInterrupt:
        return 130
    with cp:
        if args.kubeconfig:
            args.kubeconfig.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(cp.kubeconfig, args.kubeconfig)
        say(f"export KUBECONFIG={args.kubeconfig or cp.kubeconfig}   (Ctrl-C stops the cluster)")
        try:
            while True:
                cp.check()
                time.sleep(1)
        except ComponentDied as err:
            say(str(err))
            return 1
        except KeyboardInterrupt:
            say("stopping")
    return 0


if __name__ == "__main__":
    sys.exit(main())
