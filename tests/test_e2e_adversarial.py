"""Adversarial REST input through a real JupyterHub (issue 14, item 13): what is echoed back is
capped, REST values are single values, and a refused spawn's saved options cannot break the
next form."""

from __future__ import annotations

import json

import pytest

from tests.e2e_helpers import Browserless, server_pods, spawn

pytestmark = pytest.mark.e2e

HUGE = 100_000


def refused(hub, devcluster, user: str, options: dict) -> str:
    status, body = spawn(hub, user, options)
    assert status == 400, (status, body)
    assert not server_pods(devcluster, user)
    return body["message"]


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"gpu": "1/4", "pool": "p" * HUGE}, "pool: unknown pool 'pppp"),
        ({"gpu": "none", "image": "i" * HUGE}, "image: unknown image 'iiii"),
        ({"gpu": "1/4", "k" * HUGE: "x"}, "Unknown option(s): 'kkkk"),
        ({"gpu": "1" * HUGE}, 'gpu: "1111'),
    ],
)
def test_a_100kb_value_is_not_echoed_whole(hub, devcluster, options, words):
    message = refused(hub, devcluster, "mallory", options)
    assert words in message
    assert len(message) < 500, len(message)
    assert "…" in message  # 40 characters of it, then an ellipsis


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"gpu": ["1/4"], "pool": "h100"}, 'gpu: expected one value like "1/4", got a list'),
        ({"gpu": "1/4", "pool": ["h100"]}, "pool: expected a name (a string), got list"),
    ],
)
def test_rest_values_given_as_lists_are_refused(hub, devcluster, options, words):
    assert words in refused(hub, devcluster, "mallory", options)


def embedded_model(html: str) -> dict:
    """The picker's model as the browser's JSON.parse reads it: NaN and Infinity are errors."""
    text = html.split('id="fracspawner-model">', 1)[1].split("</script>", 1)[0]

    def not_json(name: str) -> None:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=not_json)


def test_a_refused_spawns_saved_options_leave_the_next_form_working(hub, devcluster):
    # JupyterHub saves a spawn's options before fracspawner refuses them, and the next form
    # preselects from them: a NaN there made the embedded JSON invalid and broke the picker
    refused(hub, devcluster, "nan", {"gpu": float("nan")})
    status, model = hub.api("GET", "/users/nan")
    assert status == 200
    html = Browserless(hub, "nan").spawn_form()
    assert embedded_model(html)["previous"] == {}

    # a 100 kB pool name saved the same way is not embedded either
    refused(hub, devcluster, "nan", {"gpu": "1/4", "pool": "p" * HUGE})
    html = Browserless(hub, "nan").spawn_form()
    assert embedded_model(html)["previous"] == {"gpu": "1/4"}
    assert "p" * 100 not in html

    # what is valid is still preselected
    refused(hub, devcluster, "nan", {"gpu": "1/2", "pool": "h100"})  # over the 0.25 quota
    assert embedded_model(Browserless(hub, "nan").spawn_form())["previous"] == {
        "gpu": "1/2",
        "pool": "h100",
    }
