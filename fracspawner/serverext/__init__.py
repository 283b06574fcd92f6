"""fracspawner's jupyter-server extension: GPU use per kernel, and GPU work counted as activity.

Enabled automatically by `jupyter-config/jupyter_server_config.d/fracspawner.json` when installed
with `pip install fracspawner[notebook]`; or with
`--ServerApp.jpserver_extensions='{"fracspawner.serverext": True}'`.
"""

from __future__ import annotations

import json
from typing import Any

from . import clients
from .activity import server_activity, user_activity
from .handlers import GpuHandler, PresenceHandler, ResumeHandler
from .monitor import SETTINGS_KEY, GpuMonitor
from .oomnote import explaining_connection_class
from .presence import SETTINGS_KEY as PRESENCE_KEY
from .presence import Presence
from .reporter import GpuReporter
from .resume import resuming_connection_class
from .swap import SwapAgent

__all__ = [
    "GpuMonitor",
    "GpuHandler",
    "GpuReporter",
    "Presence",
    "SETTINGS_KEY",
    "PAGE_CONFIG_KEY",
    "PRESENCE_CONFIG_KEY",
]

PAGE_CONFIG_KEY = "fracspawnerGpuUrl"  # read by the JupyterLab GPU meter (labextension/)
PRESENCE_CONFIG_KEY = "fracspawnerPresence"  # where and how often a tab reports presence


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "fracspawner.serverext"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    web_app = serverapp.web_app
    # the person at the server, as the JupyterLab tabs report it (presence.py)
    presence = Presence(parent=serverapp, settings=web_app.settings, log=serverapp.log)
    web_app.settings[PRESENCE_KEY] = presence
    # the user's other clients (VS Code, scripts) count while a tab reports presence (clients.py)
    clients.install(web_app, serverapp.log)
    monitor = GpuMonitor(parent=serverapp, settings=web_app.settings, log=serverapp.log)
    web_app.settings["fracspawner_gpu_monitor"] = monitor
    base_url = web_app.settings["base_url"].rstrip("/")
    web_app.add_handlers(
        ".*$",
        [
            (f"{base_url}/api/fracspawner/gpu", GpuHandler),
            (f"{base_url}/api/fracspawner/gpu/resume", ResumeHandler),
            (f"{base_url}/api/fracspawner/presence", PresenceHandler),
        ],
    )
    # resume on use: every message to a kernel passes the hibernator first (resume.py)
    connection = resuming_connection_class(
        web_app.settings.get("kernel_websocket_connection_class")
    )
    if connection is not None:
        # and a cell that runs out of GPU memory is told why, under the error (oomnote.py)
        web_app.settings["kernel_websocket_connection_class"] = explaining_connection_class(
            connection
        )
    else:  # kernels elsewhere (a gateway): their messages are not seen here, so never suspend
        monitor.hibernator.disable("kernels run behind a gateway: their messages are not seen here")
    # JupyterLab copies page_config_data into the page: the GPU meter asks for the report only
    # where this says the extension is there (no 404 in the browser console elsewhere)
    page_config = web_app.settings.setdefault("page_config_data", {})
    page_config[PAGE_CONFIG_KEY] = "api/fracspawner/gpu"
    # JSON text: page config values reach the page as strings
    page_config[PRESENCE_CONFIG_KEY] = json.dumps(
        {"url": "api/fracspawner/presence", "interval": presence.interval}
    )
    # the report the culler gets is pushed from here, with this server's own token: the culler
    # never calls into the server (docs/culler.md, "Trust")
    # over-commit's swap (swap.py): the culler's orders come back in the answer to a report
    swap = SwapAgent(
        monitor, lambda seconds: reporter.report_soon(seconds), parent=serverapp, log=serverapp.log
    )
    reporter = GpuReporter(
        parent=serverapp,
        log=serverapp.log,
        report=lambda: swap.extend(
            monitor.report(
                server_last_activity=server_activity(web_app.settings),
                user_last_activity=user_activity(web_app.settings),
            )
        ),
    )

    def on_answer(answer: dict) -> None:
        swap.on_answer(answer)
        presence.on_culler_answer(answer)  # the user at a tab of another server of theirs
        monitor.on_culler_answer(answer)  # what a HAMi pod's GPUs have free (the meter)

    reporter.on_answer = on_answer
    # a person back at a tab: the culler hears it now, not at the next report interval
    presence.on_back = lambda: reporter.report_soon(0.0)
    # hibernation within the node's host budget: the culler gives the room (swap.py)
    swap.ask_host_room = reporter.enabled
    web_app.settings["fracspawner_gpu_reporter"] = reporter
    web_app.settings["fracspawner_swap"] = swap
    # the tasks end with the server's event loop: module extensions get no unload hook
    serverapp.io_loop.add_callback(monitor.start)
    serverapp.io_loop.add_callback(reporter.start)
    serverapp.log.info(
        "fracspawner: GPU monitor loaded (source %s, every %ss; reports to the culler: %s)",
        monitor.source.name if monitor.source else "none",
        monitor.poll_interval,
        reporter.endpoint if reporter.enabled else "off",
    )
