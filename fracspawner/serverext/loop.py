"""One background loop per object, as the GPU monitor and the reporter each run one: started
once, cancelled and awaited on stop (the server extension's shutdown)."""

from __future__ import annotations

import asyncio
from typing import Any

from traitlets.config import LoggingConfigurable

__all__ = ["BackgroundLoop"]


class BackgroundLoop(LoggingConfigurable):
    """Runs `_run()` as one task on the running event loop."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        raise NotImplementedError

    def _start_loop(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _stop_loop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
