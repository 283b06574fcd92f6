"""`GET /api/fracspawner/gpu`: the server's GPU use, for the user and for the culler."""

from __future__ import annotations

import asyncio
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
        reporter = self.settings.get("fracspawner_gpu_reporter")
        if reporter is not None:  # for the user (fracspawner doctor); not sent to the culler
            report["reporter"] = reporter.state()
        self.finish(json.dumps(report))


class ResumeHandler(APIHandler):
    """`POST /api/fracspawner/gpu/resume` `{"kernel_id": "..."}`: bring a hibernated kernel back
    now (the meter's Resume button); without a kernel id, every hibernated kernel. Waits until
    each is back and answers its hibernation state; a failed restore keeps retrying (202)."""

    # resuming a kernel changes it: the permission to write kernels (as interrupting one)
    auth_resource = "kernels"

    @web.authenticated
    @authorized
    async def post(self) -> None:
        monitor = self.settings["fracspawner_gpu_monitor"]
        hib = monitor.hibernator
        body = self.get_json_body() or {}
        wanted = body.get("kernel_id")
        if wanted is not None and not isinstance(wanted, str):
            raise web.HTTPError(400, "kernel_id: expected a kernel id")
        ids = [wanted] if wanted else [k for k in list(hib.kernels) if hib.suspended(k)]
        if wanted and wanted not in monitor._kernel_ids():
            raise web.HTTPError(404, f"no kernel {wanted}")
        tasks = {kid: hib.resume(kid, "Resume in the GPU meter") for kid in ids}
        states = {}
        for kid, task in tasks.items():
            if task is not None:
                # a restore that keeps failing retries in the background: answer meanwhile
                done, _ = await asyncio.wait({task}, timeout=30)
            states[kid] = hib.kernel_json(kid)
        running = all(s["state"] in ("running", "cannot_hibernate") for s in states.values())
        self.set_status(200 if running else 202)
        self.finish(json.dumps({"kernels": states}))
