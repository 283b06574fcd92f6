"""`GET /api/fracspawner/gpu`: the server's GPU use, for the user and for the culler;
`POST /api/fracspawner/presence`: a JupyterLab tab says whether its person is there."""

from __future__ import annotations

import asyncio
import json

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from tornado import web

from .activity import presence_of, server_activity, user_activity
from .presence import PresenceError, parse_client_report, utcnow


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
        # ServerWebApplication.last_activity(): kernels, API, terminals and every
        # *_last_activity; the API requests left out where a tab reports presence
        now = utcnow()
        report = monitor.report(
            server_last_activity=server_activity(self.settings, now),
            user_last_activity=user_activity(self.settings, now),
            now=now,
        )
        reporter = self.settings.get("fracspawner_gpu_reporter")
        if reporter is not None:  # for the user (fracspawner doctor); not sent to the culler
            report["reporter"] = reporter.state()
        self.finish(json.dumps(report))


#: why resume-all left a kernel out: its checkpoint still copies (a minute for 80 GiB)
COPYING_OUT = (
    "not resumed: its GPU state is still being copied to host memory (its checkpoint is under "
    "way); ask again once the copy is done"
)


class ResumeHandler(APIHandler):
    """`POST /api/fracspawner/gpu/resume` `{"kernel_id": "..."}`: bring a hibernated kernel back
    now (the meter's Resume button); without a kernel id, every hibernated kernel whose copy to
    host memory is done (those still copying are named in `copying`, not waited for). Waits
    until each is back and answers its hibernation state; not all back (a failed restore keeps
    retrying, a copy under way): 202."""

    # resuming a kernel changes it: the permission to write kernels (as interrupting one)
    auth_resource = "kernels"

    @web.authenticated
    @authorized
    async def post(self) -> None:
        monitor = self.settings["fracspawner_gpu_monitor"]
        hib = monitor.hibernator
        body = self.get_json_body()
        if body is None:
            body = {}
        if not isinstance(body, dict):
            raise web.HTTPError(400, 'expected a JSON object: {"kernel_id": "..."} or {}')
        wanted = body.get("kernel_id")
        if wanted is not None and not isinstance(wanted, str):
            raise web.HTTPError(400, "kernel_id: expected a kernel id")
        ids = [wanted] if wanted else [k for k in list(hib.kernels) if hib.suspended(k)]
        if wanted and wanted not in monitor._kernel_ids():
            raise web.HTTPError(404, f"no kernel {wanted}")
        # all: a kernel still copying out would be waited for, then copied straight back (the
        # meter offers no Resume then either); one named by its id is waited for as asked
        copying = [] if wanted else [k for k in ids if hib.kernels[k].state == "hibernating"]
        tasks = {
            kid: hib.resume(kid, "Resume in the GPU meter") for kid in ids if kid not in copying
        }
        states = {}
        for kid, task in tasks.items():
            if task is not None:
                # a restore that keeps failing retries in the background: answer meanwhile
                done, _ = await asyncio.wait({task}, timeout=30)
            states[kid] = hib.kernel_json(kid)
        states.update((kid, hib.kernel_json(kid)) for kid in copying)
        running = all(s["state"] in ("running", "cannot_hibernate") for s in states.values())
        self.set_status(200 if running else 202)
        answer: dict = {"kernels": states}
        if copying:
            answer["copying"] = dict.fromkeys(copying, COPYING_OUT)
        self.finish(json.dumps(answer))


class PresenceHandler(APIHandler):
    """`POST /api/fracspawner/presence` `{"client": "<tab id>", "visible": bool, "focused": bool,
    "idle_seconds": n}`: a tab's word on its person (presence.py decides with its own timeout).
    Answers what the server concludes, and how often to report."""

    auth_resource = "api"  # about the server as a whole, as GET /api/status
    # the report itself is not activity: what it says is (presence.py)
    _track_activity = False

    @web.authenticated
    @authorized
    async def post(self) -> None:
        presence = presence_of(self.settings)
        if presence is None:
            raise web.HTTPError(404, "presence is not kept here")
        now = utcnow()
        try:
            client, report = parse_client_report(self.get_json_body(), now)
        except PresenceError as exc:
            raise web.HTTPError(400, f"presence report: {exc}") from None
        presence.record(client, report)
        self.finish(json.dumps(presence.as_json(now)))
