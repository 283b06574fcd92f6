"""What both culler applications (`fracspawner culler` for JupyterHub, `fracspawner culler
kubeflow`) share: tornado's log lines (JupyterHub's style) at INFO, and their metrics."""

from __future__ import annotations

import logging
from typing import Any

from tornado.log import LogFormatter
from traitlets import default, observe
from traitlets.config import Application

from .metrics import CullerMetrics

__all__ = ["CullerApplication"]


class CullerApplication(Application):
    _log_formatter_cls = LogFormatter

    @default("log_format")
    def _log_format(self) -> str:
        return "%(color)s[%(levelname)1.1s %(asctime)s %(name)s]%(end_color)s %(message)s"

    @default("log_level")
    def _log_level(self) -> int:
        return logging.INFO

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.metrics = CullerMetrics()

    def initialize(self, argv: list[str] | None = None) -> None:
        super().initialize(argv)
        self.share_log_with_modules()

    @observe("log_level")
    def _module_level(self, change: Any) -> None:  # a config file read after initialize
        logging.getLogger("fracspawner").setLevel(change.new)

    def share_log_with_modules(self) -> None:
        """Modules log under `fracspawner.*` (the pod watch's 'cannot watch server pods'):
        without a handler there Python's last-resort handler printed their warnings bare (no
        time, no level) and dropped their INFO lines. They go through this application's
        handlers, at its level, as JupyterHub does for kubespawner's logger."""
        modules = logging.getLogger("fracspawner")
        modules.setLevel(self.log_level)
        for handler in self.log.handlers:
            if handler not in modules.handlers:
                modules.addHandler(handler)
