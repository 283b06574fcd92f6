"""A refused spawn is logged as one INFO line, not ERROR with a traceback (issue 21 item 9).

The two calls are JupyterHub's own (jupyterhub/user.py `User.spawn`: "Error starting ...",
jupyterhub/handlers/pages.py SpawnHandler.post: "Failed to spawn single-user server with form",
exc_info=True), made on a logger with fracspawner's filter, as in a hub."""

from __future__ import annotations

import logging

from tornado import web

from fracspawner.hub.refusal import gave_up, install_log_filter, refused


def _hub_logs(caplog, error: Exception) -> list[logging.LogRecord]:
    log = logging.getLogger("test-hub-log")
    install_log_filter(log)
    install_log_filter(log)  # once is enough: no second filter
    assert len(log.filters) == 1
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="test-hub-log"):
        log.error(f"Error starting mira's server: {error}")
        if isinstance(error, web.HTTPError):
            error.reason = "error"  # as jupyterhub/user.py sets it before pages.py logs it
        log.error(f"Error starting server mira: {error}")
        try:
            raise error
        except Exception:
            log.error("Failed to spawn single-user server with form", exc_info=True)
    return [r for r in caplog.records if r.name == "test-hub-log"]


def test_a_refusal_is_one_info_line_each(caplog):
    records = _hub_logs(caplog, refused("Quota: 1/4 GPU on H100 is more than the 1/8 GPU left."))
    assert [r.levelno for r in records] == [logging.INFO] * 3
    assert all(r.exc_info is None for r in records)
    assert records[2].getMessage() == (
        "Failed to spawn single-user server with form (refused by fracspawner): "
        "Quota: 1/4 GPU on H100 is more than the 1/8 GPU left."
    )
    assert "Traceback" not in caplog.text


def test_a_queue_give_up_is_info_too(caplog):
    records = _hub_logs(caplog, gave_up("No 1/4 GPU on T4 freed within 30 minutes."))
    assert [r.levelno for r in records] == [logging.INFO] * 3


def test_other_errors_keep_their_level_and_traceback(caplog):
    records = _hub_logs(caplog, web.HTTPError(500, "kubespawner broke"))
    assert [r.levelno for r in records] == [logging.ERROR] * 3
    assert records[2].exc_info is not None
    records = _hub_logs(caplog, RuntimeError("boom"))
    assert records[2].levelno == logging.ERROR and records[2].exc_info is not None


def test_someone_elses_400_or_503_stays_error(caplog):
    # JupyterHub's own 400 for options it cannot apply (jupyterhub/spawner.py
    # Spawner.apply_user_options, jupyterhub 6.1: `raise web.HTTPError(400, "Invalid user
    # options")`) and a 503 raised by another part of the spawn (kubespawner, a hook) are not
    # fracspawner's refusals: every line stays ERROR, the form's with its traceback
    for error in (
        web.HTTPError(400, "Invalid user options"),
        web.HTTPError(503, "%s", "the Kubernetes API is unavailable (timed out)"),
    ):
        records = _hub_logs(caplog, error)
        assert [r.levelno for r in records] == [logging.ERROR] * 3, error
        assert records[2].exc_info is not None
        assert "Traceback" in caplog.text
