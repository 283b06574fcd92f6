"""Review s56: adversarial user_options against the real spawn path (JupyterHub users and
spawners from tests/hub_support.py, kubespawner's own profile_list handling underneath)."""

from __future__ import annotations

import pytest
import yaml
from tornado.web import HTTPError

from tests.conftest import DEMO_CATALOG
from tests.hub_support import HubUsers, begin_spawn, refusal

#: z2jh's documented shape: an image option with an "Other..." free-text choice the admin
#: limits by a regex, beside a fixed choice list
IMAGE_PROFILES = [
    {
        "display_name": "Data science",
        "slug": "datasci",
        "default": True,
        "profile_options": {
            "notebook_image": {
                "display_name": "Image",
                "choices": {
                    "minimal": {
                        "display_name": "Minimal",
                        "default": True,
                        "kubespawner_override": {"image": "quay.io/jupyter/minimal-notebook:2025"},
                    },
                },
                "unlisted_choice": {
                    "enabled": True,
                    "display_name": "Other image",
                    "validation_regex": r"^quay\.io/jupyter/[a-z-]+:[0-9a-z.-]+$",
                    "kubespawner_override": {"image": "{value}"},
                },
            },
            "size": {
                "display_name": "Size",
                "choices": {
                    "small": {"display_name": "Small", "kubespawner_override": {"cpu_limit": 1}},
                    "large": {"display_name": "Large", "kubespawner_override": {"cpu_limit": 8}},
                },
            },
        },
    },
]


def profile_hub() -> HubUsers:
    """The demo catalog without images: the image is the profile's to choose."""
    catalog = yaml.safe_load(DEMO_CATALOG.read_text())
    del catalog["images"]
    return HubUsers(
        {"KubeSpawner": {"profile_list": IMAGE_PROFILES}, "FracSpawner": {"catalog": catalog}}
    )


async def spawn_image(options: dict) -> str:
    hub = profile_hub()
    spawner = hub.spawner(hub.user("mallory"))
    pod = await begin_spawn(spawner, options)
    return pod.spec.containers[0].image


async def test_an_allowed_unlisted_image_is_used():
    """The control: what the admin's regex allows, with the profile named, is the pod's."""
    image = await spawn_image(
        {"profile": "datasci", "notebook_image--unlisted-choice": "quay.io/jupyter/r-notebook:2025"}
    )
    assert image == "quay.io/jupyter/r-notebook:2025"


@pytest.mark.parametrize("profile", [None, ""], ids=["no-profile-key", "empty-profile"])
async def test_an_unlisted_choice_without_a_profile_still_meets_the_admins_regex(profile):
    """kubespawner validates unlisted choices only when `profile` is given, but applies them to
    the default profile either way: leaving `profile` out of REST user_options put any image
    on the pod, past the admin's validation_regex."""
    options = {"notebook_image--unlisted-choice": "evil.example/miner:latest"}
    if profile is not None:
        options["profile"] = profile
    with pytest.raises(HTTPError) as info:
        await spawn_image(options)
    assert info.value.status_code == 400, refusal(info.value)
    assert "notebook_image" in refusal(info.value)


@pytest.mark.parametrize(
    "options",
    [
        {"profile": "datasci", "size": ["large"]},
        {"profile": "datasci", "size": {"large": 1}},
        {"profile": "datasci", "notebook_image--unlisted-choice": ["quay.io/jupyter/x:1"]},
        {"profile": "datasci", "notebook_image--unlisted-choice": 7},
        {"profile": ["datasci"]},
        {"profile": {"slug": "datasci"}},
    ],
    ids=["choice-list", "choice-dict", "unlisted-list", "unlisted-number", "profile-list",
         "profile-dict"],
)  # fmt: skip
async def test_profile_values_of_another_type_are_a_400_not_a_500(options):
    """REST user_options carry any JSON: a list or a number where kubespawner expects a name
    made its profile code raise TypeError, a 500 that JupyterHub counts toward
    consecutive_failure_limit (z2jh: 5, then the hub exits) - any user could restart the hub."""
    with pytest.raises(HTTPError) as info:
        await spawn_image(options)
    assert info.value.status_code == 400, refusal(info.value)


@pytest.mark.parametrize(
    "saved",
    [
        {"profile": "datasci", "notebook_image--unlisted-choice": 7},
        {"notebook_image--unlisted-choice": ["quay.io/jupyter/x:1"]},
        {"profile": "datasci", "size": ["large"], "gpu": "1/4"},
    ],
    ids=["unlisted-number", "unlisted-list-no-profile", "choice-list"],
)
async def test_a_refused_spawns_saved_profile_options_leave_the_next_form_working(saved):
    """JupyterHub saves a REST spawn's options before they are refused, and the next spawn form
    pre-selects from them: a number where kubespawner's form code runs its validation_regex
    raised TypeError (only ValueError drops the pre-selection), a 500 for the user's spawn page
    (and an admin's, opening it) until the options were replaced."""
    hub = profile_hub()
    spawner = hub.spawner(hub.user("mallory"))
    with pytest.raises(HTTPError) as info:
        await begin_spawn(spawner, saved)
    assert info.value.status_code == 400
    spawner.user_options = spawner.orm_spawner.user_options = saved  # as the hub loads them
    form = await spawner._render_options_form_async(spawner)
    assert "profile-option-datasci--notebook_image" in form


async def test_a_100kb_profile_name_is_not_echoed_whole():
    """Like every other option (test_e2e_adversarial): kubespawner's "No such profile: <all of
    it>" carried the whole value back in the 400 (and the hub's log)."""
    with pytest.raises(HTTPError) as info:
        await spawn_image({"profile": "p" * 100_000})
    message = refusal(info.value)
    assert info.value.status_code == 400 and "No such profile" in message
    assert len(message) < 500 and "…" in message, len(message)
    assert "datasci" in message  # what there is to choose
