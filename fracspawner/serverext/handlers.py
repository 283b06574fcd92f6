"""`GET /api/fracspawner/gpu`: the server's GPU use, for the user and for the culler."""

from __future__ import annotations

import json

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from tornado import web

from .activity import user_activity


class GpuHandler(APIHandler):
    # Reading per-kernel GPU use is reading kernel state: the same permission as GET /api/kernels.
    auth_resource = "kernels"
    # Polling this (a GPU indicator, the culler) is not user activity: it must not keep the
    # server alive.
    _track_activity = False

    @web.authenticated
    @authorized
    async def get(self) -> None:
        monitor = self.settings["fracspawner_gpu_monitor"]
        # ServerWebApplication.last_activity(): kernels, API, terminals and every *_last_activity
        last_activity = self.application.last_activity()
        report = monitor.report(
            server_last_activity=last_activity, user_last_activity=user_activity(self.settings)
        )
        self.finish(json.dumps(report))
