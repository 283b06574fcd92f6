"""Spawn progress in a person's words (hub/progress.py): each kubelet/scheduler event reason
becomes a sentence about the user's slice and image; Kubernetes' own text is kept, escaped."""

from __future__ import annotations

import pytest

from fracspawner.hub.progress import human_step, progress_event

SLICE = "1/8 GPU on H100 80GB (HAMi)"
IMAGE = "PyTorch (CUDA 12)"


@pytest.mark.parametrize(
    ("reason", "type_", "message", "expected"),
    [
        (
            "Scheduled",
            "Normal",
            "Successfully assigned jhub/jupyter-uma to gpu-h100-0",
            f"Your {SLICE} is reserved; preparing your server.",
        ),
        (
            "Pulling",
            "Normal",
            'Pulling image "pytorch:2"',
            f"Downloading the image {IMAGE} (the first start on a node can take a few minutes).",
        ),
        (
            "Pulled",
            "Normal",
            'Container image "pytorch:2" already present on machine',
            f"The image {IMAGE} is ready.",
        ),
        ("Created", "Normal", "Created container: notebook", "Your server's container is created."),
        (
            "Started",
            "Normal",
            "Started container notebook",
            "Your server has started; waiting for Jupyter to answer.",
        ),
        (
            "BackOff",
            "Warning",
            'Back-off pulling image "pytorch:2"',
            f"The image {IMAGE} could not be downloaded; retrying.",
        ),
        (
            "BackOff",
            "Warning",
            "Back-off restarting failed container notebook",
            "Your server stopped right after starting; Kubernetes is retrying.",
        ),
        (
            "Failed",
            "Warning",
            'Error: secret "x" not found',
            'Your server could not start: Error: secret "x" not found',
        ),
        (
            "FailedMount",
            "Warning",
            'MountVolume.SetUp failed for volume "home"',
            "A storage volume is not attached yet; Kubernetes keeps trying.",
        ),
        # unknown reasons keep their own words; a warning says it is one
        (
            "Evicted",
            "Warning",
            "The node was low on resource: memory.",
            "Kubernetes reports a problem (Evicted): The node was low on resource: memory.",
        ),
        ("SomethingNew", "Normal", "all good", "all good"),
    ],
)
def test_each_event_reads_as_a_step(reason, type_, message, expected):
    raw = {"reason": reason, "type": type_, "message": message}
    assert human_step(raw, slice_words=SLICE, image=IMAGE) == expected


def test_without_a_slice_or_image_the_words_stay_general():
    assert human_step({"reason": "Scheduled"}) == "A node has room for your server; preparing it."
    assert human_step({"reason": "Pulled"}) == "The image is ready."


def test_the_original_text_is_kept_escaped_for_the_event_log():
    event = {
        "progress": 50,
        "message": '2026-11-23T10:00:00Z [Normal] Pulled "<img src=x onerror=alert(1)>"',
        "raw_event": {"reason": "Pulled"},
    }
    out = progress_event(event, "The image <b>x</b> is ready.")
    assert out["message"] == "The image <b>x</b> is ready."  # plain text: the page escapes it
    assert out["progress"] == 50 and out["raw_event"] == {"reason": "Pulled"}
    assert "<img" not in out["html_message"] and "<b>" not in out["html_message"]
    assert out["html_message"].startswith('<span class="fs-step">The image &lt;b&gt;x')
    assert (
        '<span class="fs-raw">(2026-11-23T10:00:00Z [Normal] Pulled &quot;&lt;img'
        in (out["html_message"])
    )
