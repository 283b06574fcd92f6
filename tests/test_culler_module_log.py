"""The culler's modules log through the culler's own handler, at its level.

The pod watch (fracspawner/culler/serverpods.py) logs under `fracspawner.culler.serverpods`;
with no handler there, Python's last-resort handler printed its 'cannot watch server pods'
warning bare (no time, no level, no logger name)."""

from __future__ import annotations

import logging

from fracspawner.culler.app import Culler


def test_a_module_warning_comes_out_in_the_cullers_format(capfd) -> None:
    culler = Culler()
    culler.initialize(["--log-level=INFO"])
    try:
        logging.getLogger("fracspawner.culler.serverpods").warning("cannot watch server pods")
        err = capfd.readouterr().err
        assert "[W " in err and "fracspawner.culler.serverpods] cannot watch server pods" in err
        # the process-wide `fracspawner` logger's level is not this app's to set
        assert logging.getLogger("fracspawner").level == logging.NOTSET
    finally:
        for handler in culler.log.handlers:
            logging.getLogger("fracspawner").removeHandler(handler)
        Culler.clear_instance()
