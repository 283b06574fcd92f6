"""Spawn progress in a person's words, with Kubernetes' own words kept for the event log.

kubespawner turns each pod event into a progress message such as
`2026-11-23T10:00:00Z [Normal] Successfully assigned jhub/jupyter-uma to gpu-h100-0`. The
pending page shows the newest message under its progress bar, so that line is what a user
reads while waiting. `human_step` says the same step in the user's terms (their slice, the
image's display name); `progress_event` puts both into the event: `message` is the plain
sentence (REST clients of `/hub/api/users/:name/server/progress` read it), `html_message` is
the sentence plus the original text in a `fs-raw` span, which our pending-page template hides
under the progress bar and JupyterHub's "Event log" shows (on a hub without that template the
line simply shows both).

Event reasons are the kubelet's and the scheduler's (Kubernetes pkg/kubelet/events/event.go,
pkg/scheduler: Scheduled, FailedScheduling, Pulling, Pulled, Created, Started, Killing,
BackOff, Failed, FailedMount, Unhealthy ...); an unknown reason keeps its own message.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["human_step", "pod_events", "progress_event"]


def _event_time(event: Mapping[str, Any]) -> str:
    # kubespawner's order (EventReflector.events): lastTimestamp, else eventTime (RFC 3339
    # strings of one format, so they sort as times)
    return event.get("lastTimestamp") or event.get("eventTime") or ""


def pod_events(
    events: Iterable[Mapping[str, Any]], pod_name: str, after_uid: str | None
) -> list[Mapping[str, Any]]:
    """The events of pod `pod_name`, oldest first, after the last one whose uid is
    `after_uid` (the marker kubespawner's `_start` sets: an earlier pod's events stay out).

    What kubespawner's `KubeSpawner.events` returns, but it sorts every event the hub holds
    (every pod of the namespace) on each read, `_start` once and `progress()` every second
    per pending spawn; this picks the pod's events first and sorts only those. Python's sort
    is stable, so the order of equal times is the same either way."""
    mine = [e for e in events if e["involvedObject"]["name"] == pod_name]
    mine.sort(key=_event_time)
    if after_uid:
        for i in range(len(mine) - 1, -1, -1):
            if mine[i]["metadata"]["uid"] == after_uid:
                return mine[i + 1 :]
    return mine


def human_step(raw: Mapping[str, Any], *, slice_words: str = "", image: str = "") -> str:
    """One sentence for one pod event. `slice_words` e.g. '1/8 GPU on H100 80GB (HAMi)';
    `image` the image's display name ('' when none was chosen)."""
    reason = str(raw.get("reason") or "")
    message = str(raw.get("message") or "").strip()
    the_image = f"the image {image}" if image else "the image"
    if reason == "Scheduled":
        if slice_words:
            return f"Your {slice_words} is reserved; preparing your server."
        return "A node has room for your server; preparing it."
    if reason == "Pulling":
        return f"Downloading {the_image} (the first start on a node can take a few minutes)."
    if reason == "Pulled":
        return f"{the_image[0].upper()}{the_image[1:]} is ready."
    if reason == "Created":
        return "Your server's container is created."
    if reason == "Started":
        return "Your server has started; waiting for Jupyter to answer."
    if reason == "Killing":
        return "Your server is being stopped."
    if reason == "FailedMount":
        return "A storage volume is not attached yet; Kubernetes keeps trying."
    if reason == "BackOff":
        if "pull" in message.lower():
            return f"{the_image[0].upper()}{the_image[1:]} could not be downloaded; retrying."
        return "Your server stopped right after starting; Kubernetes is retrying."
    if reason in ("Failed", "ErrImageNeverPull", "InspectFailed"):
        return f"Your server could not start: {message}" if message else "Your server failed."
    if reason == "Unhealthy":
        return "Your server is not answering its health check yet."
    if raw.get("type") == "Warning":
        return f"Kubernetes reports a problem ({reason}): {message}" if reason else message
    return message or reason


def progress_event(event: Mapping[str, Any], sentence: str) -> dict[str, Any]:
    """kubespawner's event with `sentence` as its message and the original kept for the log.
    Both parts are escaped: event text comes from the cluster, never trusted as markup."""
    original = str(event.get("message") or "")
    markup = f'<span class="fs-step">{html.escape(sentence)}</span>'
    if original and original != sentence:
        markup += f' <span class="fs-raw">({html.escape(original)})</span>'
    return {**event, "message": sentence, "html_message": markup}
