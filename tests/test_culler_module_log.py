"""The culler's modules log through the culler's own handler, at its level.

The pod watch (fracspawner/culler/serverpods.py) logs under `fracspawner.culler.serverpods`;
with no handler there, Python's last-resort handler printed its 'cannot watch server pods'
warning bare (no time, no level, no logger name) and dropped its INFO lines."""

from __future__ import annotations

import logging

from fracspawner.culler.app import Culler


def test_a_module_warning_comes_out_in_the_cullers_format(capfd) -> None:
    culler = Culler()
    culler.initialize(["--log-level=INFO"])
    try:
        logging.getLogger("fracspawner.culler.serverpods").warning("cannot watch server pods")
        logging.getLogger("fracspawner.culler.serverpods").info("watching server pods again")
        logging.getLogger("fracspawner.culler.serverpods").debug("not at INFO")
        err = capfd.readouterr().err
        assert "[W " in err and "fracspawner.culler.serverpods] cannot watch server pods" in err
        assert "[I " in err and "watching server pods again" in err
        assert "not at INFO" not in err
    finally:
        for handler in culler.log.handlers:
            logging.getLogger("fracspawner").removeHandler(handler)
        Culler.clear_instance()
