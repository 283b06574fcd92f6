"""What both culler applications (`fracspawner culler` for JupyterHub, `fracspawner culler
kubeflow`) share: tornado's log lines (JupyterHub's style) at INFO, and their metrics."""

from __future__ import annotations

import logging
from typing import Any

from tornado.log import LogFormatter
from traitlets import default
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

    def share_log_with_modules(self) -> None:
        """Modules log under `fracspawner.*` (the pod watch's 'cannot watch server pods'):
        without a handler there Python's last-resort handler printed their warnings bare (no
        time, no level). They go through this application's handlers. The `fracspawner`
        logger's level is left alone: it is process-wide, and an in-process culler (tests, the
        benchmark's, at ERROR) set it for every other module's logger."""
        modules = logging.getLogger("fracspawner")
        for handler in self.log.handlers:
            if handler not in modules.handlers:
                modules.addHandler(handler)
