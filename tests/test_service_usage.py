"""What the fracspawner service tells a user about their quota when it has no pod watch to
believe ("unknown is never idle, and never allowed"): the GPU their servers hold, from the
hub's server models and their `user_options`, or "unknown", never a made-up "0 in use"."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest
from tornado.httputil import HTTPServerRequest

from fracspawner.backends import load_catalog
from fracspawner.choice.admission import options_gpu_equivalent, server_holdings, user_usage
from fracspawner.choice.offers import build_offer_model
from fracspawner.hub.form import render_service_page
from fracspawner.hub.service import OffersHandler, make_app
from fracspawner.model.catalog import AccessRule

DEMO = load_catalog(Path(__file__).resolve().parent.parent / "examples" / "catalogs" / "demo.yaml")
#: the demo's default rule: the H100 pool, at most a quarter GPU across a user's servers
QUARTER = AccessRule(pools=("h100",), max_gpu=0.25)


@pytest.mark.parametrize(
    ("options", "held"),
    [
        ({"gpu": "1/4", "pool": "h100"}, 0.25),
        ({"gpu": "1/4"}, None),  # "any pool": 1/4 of the H100 or the A100's MIG 2g.20gb?
        ({"gpu": "mig-1g.10gb", "pool": "a100-mig"}, 1 / 7),
        ({"gpu": "none"}, 0.0),
        ({}, 0.0),  # no gpu option: a CPU-only server
        ({"gpu": "1/4", "pool": "gone"}, None),  # a pool since removed from the catalog
        ({"gpu": "mig-1g.10gb", "pool": "h100"}, None),  # not offered there
        ({"gpu": "10GiB"}, None),  # no pool: 10 GiB of the H100, or the A100's 1g.10gb?
        ({"gpu": "a lot"}, None),
        ({"gpu": "1/4", "pool": ["h100"]}, None),
        ("1/4", None),
    ],
)
def test_what_a_servers_options_hold_or_none_when_they_do_not_tell(options, held):
    assert options_gpu_equivalent(DEMO, options) == (
        pytest.approx(held) if held is not None else None
    )


def test_any_pool_is_one_of_the_users_pools():
    h100, t4 = DEMO.pools["h100"], DEMO.pools["t4"]
    assert options_gpu_equivalent(DEMO, {"gpu": "1/4"}, [h100, t4]) == 0.25
    assert options_gpu_equivalent(DEMO, {"gpu": "10GiB"}, [h100]) == 0.125
    assert options_gpu_equivalent(DEMO, {"gpu": "10GiB"}, []) is None


def test_usage_from_the_hubs_server_models_counts_active_servers_and_knows_what_it_misses():
    servers = {
        "": {"user_options": {"gpu": "1/8", "pool": "h100"}, "stopped": False},
        "cpu": {"user_options": {}, "pending": "spawn"},
        "old": {"user_options": {"gpu": "1", "pool": "h100"}, "stopped": True},
    }
    usage = user_usage(server_holdings(DEMO, servers))
    assert usage.known and usage.gpu == pytest.approx(0.125)

    servers["odd"] = {"user_options": {"gpu": "1/4", "pool": "gone"}}
    assert user_usage(server_holdings(DEMO, servers)).unknown == ("odd",)


def _offer(model: dict, pool: str, spec: str) -> dict:
    offers = next(p["offers"] for p in model["pools"] if p["name"] == pool)
    return next(o for o in offers if o["spec"] == spec)


def test_unknown_usage_claims_no_used_or_remaining_and_rules_out_only_what_exceeds_the_quota():
    model = build_offer_model(DEMO, rule=QUARTER, used_gpu=None)
    assert model["quota"] == {
        "max_gpu": 0.25,
        "used_gpu": None,
        "remaining_gpu": None,
        "used_text": "unknown",
        "max_text": "1/4 GPU",
        "remaining_text": None,
    }
    # within the quota: the hub decides at Start (it knows what the servers hold)
    quarter = _offer(model, "h100", "1/4")
    assert (quarter["allowed"], quarter["over_quota"], quarter["reason"]) == (True, False, None)
    half = _offer(model, "h100", "1/2")
    assert (half["allowed"], half["over_quota"]) == (False, True)
    assert half["reason"] == "Needs 1/2 GPU; your quota is 1/4 GPU."
    # another pool is ruled out by the access rules, not the quota
    t4 = _offer(model, "t4", "1/4")
    assert not t4["allowed"] and not t4["over_quota"]

    known = build_offer_model(DEMO, rule=QUARTER, used_gpu=0.125)
    assert (known["quota"]["used_text"], known["quota"]["remaining_text"]) == ("1/8", "1/8 GPU")
    quarter = _offer(known, "h100", "1/4")
    assert (quarter["allowed"], quarter["over_quota"]) == (False, True)
    assert quarter["reason"] == "Needs 1/4 GPU; your quota has 1/8 GPU left."


def _page_quota(model: dict) -> str:
    page = render_service_page(model, user="nowa", hub_prefix="/hub/")
    found = re.search(r'<p id="fs-page-quota">(.*?)</p>', page, re.S)
    assert found, page
    return " ".join(found.group(1).split())


def test_the_service_page_never_says_zero_in_use_when_it_does_not_know():
    unknown = build_offer_model(DEMO, rule=QUARTER, used_gpu=None)
    assert _page_quota(unknown) == (
        "Your GPU quota: 1/4 GPU; what your servers hold now is not known here, the hub checks "
        "it when you press Start."
    )
    known = build_offer_model(DEMO, rule=QUARTER, used_gpu=0.125)
    assert _page_quota(known) == (
        "Your GPU quota: 1/8 of 1/4 GPU in use, <strong>1/8 GPU left</strong>."
    )
    admin = build_offer_model(DEMO, rule=QUARTER, used_gpu=None, admin=True)
    assert _page_quota(admin) == "Your GPU quota: no limit."


# ---------------------------------------------------------------- the service's handler
class FakeHubAuth:
    """HubOAuth's calls the handler makes: the cookie's token, and the hub's /api/user for it."""

    def __init__(self, fresh: Any) -> None:
        self.fresh = fresh
        self.asked: list[dict] = []

    def get_token(self, handler: Any) -> str:
        return "the-users-oauth-token"

    async def user_for_token(self, token: str, **kwargs: Any) -> Any:
        self.asked.append({"token": token, **kwargs})
        if isinstance(self.fresh, Exception):
            raise self.fresh
        return self.fresh


def _quota(fresh: Any, watcher: Any = None) -> dict:
    app = make_app(DEMO, watcher, "/services/fracspawner/")
    request = HTTPServerRequest(
        method="GET", uri="/services/fracspawner/api/offers", connection=mock.Mock()
    )
    handler = OffersHandler(app, request, catalog=DEMO, watcher=watcher)
    handler.hub_auth = auth = FakeHubAuth(fresh)
    # HubOAuth's (cached) model of the user: "servers" only when the token may read them
    may_read = not (isinstance(fresh, dict) and "servers" not in fresh)
    handler._current_user = {"name": "nowa", "groups": [], "admin": False}
    handler._current_user |= {"servers": {}} if may_read else {}

    async def model() -> dict:
        return await handler.user_model()

    quota = asyncio.run(model())["quota"]
    # asked afresh (HubOAuth caches the user model for minutes), or not at all
    assert all(asked["use_cache"] is False for asked in auth.asked)
    quota["asked_hub"] = bool(auth.asked)
    return quota


def _servers(**servers: dict) -> dict:
    return {"name": "nowa", "kind": "user", "servers": servers}


def test_without_a_watch_the_service_counts_the_users_servers_from_the_hub():
    servers = {
        "": {"user_options": {"gpu": "1/8", "pool": "h100"}},
        # "any pool" (options saved before the pool was added, e.g. after a hub restart): the
        # user's only pool, the H100
        "side": {"user_options": {"gpu": "1/8"}, "pending": "spawn"},
    }
    quota = _quota(_servers(**servers))
    assert (quota["used_text"], quota["remaining_text"], quota["asked_hub"]) == (
        "1/4",
        "0 GPU",
        True,
    )


@pytest.mark.parametrize(
    "fresh",
    [
        {"name": "nowa", "kind": "user"},  # a token without read:servers!user
        None,  # the hub does not know the token any more
        RuntimeError("hub down"),
        _servers(side={"user_options": {"gpu": "1/4", "pool": "gone"}}),
        {"name": "someone-else", "servers": {}},
    ],
)
def test_without_a_watch_or_an_answer_from_the_hub_usage_is_unknown_not_zero(fresh):
    quota = _quota(fresh)
    # a token that may not read servers is not sent to ask for them
    assert quota["asked_hub"] == (not isinstance(fresh, dict) or "servers" in fresh)
    assert (quota["used_gpu"], quota["used_text"], quota["remaining_text"]) == (
        None,
        "unknown",
        None,
    )


def test_a_stale_or_never_listed_watch_is_not_believed_about_usage():
    class Watcher:
        def __init__(self, **snapshot: Any) -> None:
            self.capacity = SimpleNamespace(get=lambda pool, spec: None, **snapshot)

        async def start(self) -> None:
            return None

        def snapshot(self) -> Any:
            return self.capacity

        def usage_by_user(self) -> dict:
            return {}  # nothing listed: it would say 0

    holding = _servers(**{"": {"user_options": {"gpu": "1/8", "pool": "h100"}}})
    for snapshot in ({"nodes_seen": 0, "stale": False}, {"nodes_seen": 3, "stale": True}):
        assert _quota(holding, Watcher(**snapshot))["used_text"] == "1/8"
        assert _quota({"name": "nowa"}, Watcher(**snapshot))["used_text"] == "unknown"
    # a watch that has listed the cluster and is live is believed (no hub request)
    quota = _quota(holding, Watcher(nodes_seen=3, stale=False))
    assert (quota["used_text"], quota["asked_hub"]) == ("0", False)
