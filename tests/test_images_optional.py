"""A catalog without images (issue 14, item 12): the spawner's configured image (z2jh's
singleuser.image, a profile_list override) stays in force, and the form has no image picker."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from fracspawner.backends import load_catalog
from fracspawner.choice.offers import build_offer_model
from fracspawner.hub.form import render_form
from tests.conftest import DEMO_CATALOG

SITE_IMAGE = "registry.example.org/site/notebook:2024.1"
PROFILE_IMAGE = "registry.example.org/site/profile-image:7"
DEMO = yaml.safe_load(DEMO_CATALOG.read_text())


def no_images() -> dict:
    data = copy.deepcopy(DEMO)
    del data["images"]
    return data


def spawner_for(catalog: dict, **kube: object):
    """A FracSpawner as JupyterHub builds one, with `catalog` and KubeSpawner settings."""
    from traitlets.config import Config

    from fracspawner.cli.plan import _PLACEHOLDER_KUBECONFIG, _Hub, _User, use_kubeconfig
    from fracspawner.hub.spawner import FracSpawner

    cfg = Config({"KubeSpawner": {"image": SITE_IMAGE, **kube}})
    cfg.FracSpawner.catalog = catalog
    cfg.FracSpawner.live_capacity = False
    kubeconfig = Path(__file__).parent / ".placeholder-kubeconfig-images"
    kubeconfig.write_text(_PLACEHOLDER_KUBECONFIG)
    try:
        with use_kubeconfig(kubeconfig):
            return FracSpawner(
                _mock=True, config=cfg, user=_User("ivy", ["ml-research"], False), hub=_Hub()
            )
    finally:
        kubeconfig.unlink()


async def spawn_image(spawner, options: dict) -> str:
    """The image of the pod a spawn with `options` creates (as JupyterHub runs a spawn)."""
    spawner.user_options = options
    spawner.clear_state()
    await spawner.load_user_options()
    pod = await spawner.get_pod_manifest()
    spawner.clear_state()  # the server stopped
    return pod.spec.containers[0].image


@pytest.mark.parametrize(
    "options", [{"gpu": "1/4", "pool": "h100"}, {"gpu": "mig-1g.10gb"}, {"gpu": "none"}, {}]
)
async def test_without_catalog_images_the_configured_image_is_used(options):
    spawner = spawner_for(no_images())
    assert await spawn_image(spawner, options) == SITE_IMAGE


async def test_without_catalog_images_a_profile_override_image_is_used():
    profiles = [
        {"display_name": "Site", "slug": "site", "default": True},
        {
            "display_name": "Special",
            "slug": "special",
            "kubespawner_override": {"image": PROFILE_IMAGE},
        },
    ]
    spawner = spawner_for(no_images(), profile_list=profiles)
    assert await spawn_image(spawner, {"profile": "special", "gpu": "1/4"}) == PROFILE_IMAGE
    # and the next spawn of the same server object is back to the configured image
    assert await spawn_image(spawner, {"profile": "site", "gpu": "1/4"}) == SITE_IMAGE


async def test_with_catalog_images_the_catalogs_image_is_used():
    spawner = spawner_for(copy.deepcopy(DEMO))
    assert await spawn_image(spawner, {"gpu": "1/4"}) == DEMO["images"]["pytorch"]["image"]
    assert await spawn_image(spawner, {"image": "scipy"}) == DEMO["images"]["scipy"]["image"]


async def test_an_image_option_without_catalog_images_is_refused_with_a_reason():
    from tornado.web import HTTPError

    spawner = spawner_for(no_images())
    spawner.user_options = {"gpu": "1/4", "image": "pytorch"}
    spawner.clear_state()
    with pytest.raises(HTTPError) as info:
        await spawner.load_user_options()
    assert info.value.status_code == 400
    assert "this hub offers no choice of image" in str(info.value)


@pytest.mark.parametrize(("catalog", "picker"), [(no_images(), False), (DEMO, True)])
def test_the_form_shows_an_image_picker_only_when_there_are_images(catalog, picker):
    loaded = load_catalog(catalog)
    html = render_form(build_offer_model(loaded, rule=loaded.rule_for("ivy", []), used_gpu=0))
    assert ('name="image"' in html) is picker
    assert 'name="gpu"' in html and 'name="pool"' in html
