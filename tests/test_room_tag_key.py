"""The room answer's server tags are keyed (review: api/room names servers guessably).

`GET api/room` (culler/room.py) lists, per GPU of an over-committed pool, a tag of each server
it counts, and any token the hub knows may read it (the hub asks with the spawning server's
own). The tag was SHA-256("user/server")[:16]: anyone could compute bob's and learn which GPU
of which pool his server is on, and what is held there. With a key shared by hub and culler
(FracSpawner.room_tag_key, Culler.room_tag_key, $FRACSPAWNER_ROOM_TAG_KEY; the chart generates
it) the tag is HMAC-SHA256(key, "user/server")[:16]. A key mismatch makes the hub's admission
more cautious, never less: it cannot find the spawns it admitted and counts them on top.
"""

from __future__ import annotations

import hashlib
import hmac

import pytest

from fracspawner.backends import load_catalog
from fracspawner.choice.admission import ROOM_TAG_KEY_ENV, server_tag
from fracspawner.culler.app import Culler
from fracspawner.culler.decide import ServerFacts
from fracspawner.hub.room import RoomLine, verdict
from tests.test_culler_hostile import receiver  # noqa: F401 (the culler with a fake hub)
from tests.test_culler_restarted_server import bob_after_ann
from tests.test_overcommit_admission import LAB, NOW, lab_reports
from tests.test_overcommit_pressure import QUARTER, SIZE

KEY = "4f1c0e2a9b7d6c5e8a3f2b1d0c9e8f7a"


def _unkeyed(user: str, server: str = "") -> str:
    """What anyone who can guess a username computes."""
    return hashlib.sha256(f"{user}/{server}".encode()).hexdigest()[:16]


async def test_a_keyed_tag_is_an_hmac_that_the_hub_and_the_culler_both_compute(monkeypatch):
    """Before, server_tag took no key: every tag was the unkeyed SHA-256."""
    keyed = server_tag("bob", "", KEY)
    expected = hmac.new(KEY.encode(), b"bob/", hashlib.sha256).hexdigest()[:16]
    assert keyed == expected and keyed != _unkeyed("bob") and len(keyed) == 16
    assert server_tag("bob", "") == _unkeyed("bob")  # no key: as before
    assert server_tag("bob", "", "another key") != keyed
    # both sides read the same variable by default
    from tests.hub_support import HubUsers

    monkeypatch.setenv(ROOM_TAG_KEY_ENV, KEY)
    assert Culler().room_tag_key == KEY
    hub = HubUsers({"FracSpawner": {"catalog": LAB}})
    assert hub.spawner(hub.user("bob")).room_tag_key == KEY
    # the culler's answer tags bob's server as the hub does
    culler = _lab_culler(["bob", "u2"], key=KEY)
    (gpu,) = culler.room_json(NOW)["gpus"]
    assert set(gpu["servers"]) == {server_tag("bob", "", KEY), server_tag("u2", "", KEY)}


def _lab_culler(users: list[str], key: str) -> Culler:
    """The culler of the everyone-present lab (one T4, over-committed twice), `users` present."""
    culler = Culler(room_tag_key=key)
    culler._catalog = load_catalog(LAB)
    for user, server, parsed in lab_reports(dict.fromkeys(users, True)):
        culler.reports.put(user, server, parsed)
    culler.known = {
        (u, ""): ServerFacts(u, user_options={"gpu": "1/4", "pool": "t4"}) for u in users
    }
    culler.listed_at = NOW
    return culler


@pytest.mark.parametrize("receiver", [{"room_tag_key": KEY}], indirect=True)
async def test_a_user_who_knows_only_usernames_cannot_find_bobs_server(receiver):  # noqa: F811
    """Ann reads api/room with her own server's token (as the hub asks) and computes the tag
    of every username she knows: none is in the answer. Before, bob's was, on his GPU."""
    from fracspawner.hub.room import fetch_room

    users = ["bob", "carl", "dana", "eve"]
    lab = _lab_culler(users, key=KEY)
    culler = receiver.culler
    culler._catalog, culler.known, culler.listed_at = lab._catalog, lab.known, lab.listed_at
    for user, server, parsed in lab_reports(dict.fromkeys(users, True)):
        culler.reports.put(user, server, parsed)  # old by now: each counts its whole slice
    body = await fetch_room(receiver.url.replace("/api/reports", "/api/room"), "ann-token")
    assert body is not None and body["listed"]
    (gpu,) = body["gpus"]
    assert gpu["free_mib"] == 0 and len(gpu["servers"]) == 4
    guesses = {_unkeyed(u) for u in [*users, "ann"]}
    assert not guesses & set(gpu["servers"]), "a username's plain SHA-256 finds its server"
    assert "bob" not in str(body)
    # the hub, which holds the key, finds bob there
    assert server_tag("bob", "", KEY) in gpu["servers"]


def test_the_culler_warns_at_start_when_its_tags_can_be_guessed(caplog):
    """No key and an over-committed pool: one warning saying how to set the key. With a key,
    or no pool whose answer lists servers, none."""
    culler = Culler(room_tag_key="")
    culler._catalog = load_catalog(LAB)
    culler.log.addHandler(caplog.handler)  # the application's logger does not propagate
    try:
        assert culler.warn_guessable_room_tags()
    finally:
        culler.log.removeHandler(caplog.handler)
    assert ROOM_TAG_KEY_ENV in caplog.text and "FracSpawner.room_tag_key" in caplog.text
    keyed = Culler(room_tag_key=KEY)
    keyed._catalog = load_catalog(LAB)
    assert not keyed.warn_guessable_room_tags()
    plain = Culler(room_tag_key="")
    plain._catalog = load_catalog(
        {"pools": {"t4": {"gpu": "T4", "backend": "hami", "offers": ["1/4"]}}}
    )
    assert not plain.warn_guessable_room_tags()


# --- the hub's admission with keys: tests/test_culler_restarted_server.py's scenario ---------
def _bob_after_ann(culler_key: str, hub_key: str) -> bool:
    """One T4 (HAMi, over-committed twice): three present users hold a busy quarter each; ann,
    whom the hub just admitted, is away with one idle quarter the swap can take, and the
    culler counts her by her report. Bob asks for a quarter: is he admitted?"""
    return bob_after_ann(True, 7200, culler_key, hub_key)[0]


def test_the_hub_finds_its_own_spawn_with_the_culler_s_key():
    """The same key on both sides: the hub finds ann in the answer and does not count her
    twice, so bob gets the quarter the swap can free (as without keys)."""
    assert _bob_after_ann(KEY, KEY)
    assert _bob_after_ann("", "")


@pytest.mark.parametrize(("culler_key", "hub_key"), [(KEY, ""), ("", KEY), (KEY, "other")])
def test_a_key_mismatch_makes_the_hub_more_cautious_never_less(culler_key, hub_key):
    """Keys that differ: the hub cannot find ann and counts her quarter on top of the
    culler's figures, so bob waits for room that is there (never a newcomer let in)."""
    assert not _bob_after_ann(culler_key, hub_key)


def test_verdict_only_waits_more_with_more_in_flight():
    """The direction of a mismatch in the verdict itself: whatever the answer, counting more
    servers in flight never turns a wait into a go."""
    for free in (0.0, QUARTER, 2 * QUARTER, SIZE):
        answer = {"listed": True, "gpus": [{"pool": "t4", "free_mib": free, "present": 1}]}
        gone = [
            verdict(answer, "t4", QUARTER, size_mib=SIZE, gpus_in_pool=2, in_flight_mib=q * QUARTER)
            for q in range(8)
        ]
        gone = [v.go for v in gone]
        assert gone == sorted(gone, reverse=True), (free, gone)


def test_the_hub_says_once_when_its_spawns_are_never_found():
    """Servers the hub admitted, unfound for UNFOUND_SECONDS in answers that list servers:
    the hub says once that its key is likely not the culler's. Found ones say nothing."""
    from fracspawner.hub.room import UNFOUND_SECONDS

    theirs = frozenset({server_tag("u1", "", KEY)})
    line = RoomLine()
    line.admit(("ann", ""), "t4", server_tag("ann", "", "other"), QUARTER, at=0.0)
    line.in_flight_mib("t4", theirs, ("bob", ""), now=10.0)
    assert line.unfound(theirs, 10.0) == 0  # too early to tell
    assert line.unfound(frozenset(), UNFOUND_SECONDS) == 0  # an answer listing nobody
    assert line.unfound(theirs, UNFOUND_SECONDS) == 1
    assert line.unfound(theirs, 2 * UNFOUND_SECONDS) == 0  # once
    # matching keys: found, forgotten, nothing to say
    line = RoomLine()
    line.admit(("ann", ""), "t4", server_tag("ann", "", KEY), QUARTER, at=0.0)
    counted = theirs | {server_tag("ann", "", KEY)}
    line.in_flight_mib("t4", counted, ("bob", ""), now=UNFOUND_SECONDS)
    assert line.unfound(counted, UNFOUND_SECONDS) == 0


async def test_the_lab_with_mismatched_keys_admits_fewer_and_the_log_says_why(monkeypatch, caplog):
    """The everyone-present lab (tests/test_overcommit_admission.py) with a hub key the
    culler does not have: fewer than the four that fit start (each started server counts
    twice), never more, and the hub logs that its key is likely not the culler's."""
    import asyncio

    import fracspawner.hub.room as room
    from tests.test_overcommit_admission import lab_spawners, until

    monkeypatch.setattr(room, "UNFOUND_SECONDS", 0.0)
    culler, users, spawners = await lab_spawners(
        monkeypatch, {"admission": "wait", "room_tag_key": KEY}
    )
    tasks = {}
    log = spawners["u1"].log  # the hub's logger does not propagate to caplog's
    log.addHandler(caplog.handler)
    try:
        for name in users[:5]:
            tasks[name] = asyncio.ensure_future(spawners[name]._make_create_pod_request(None, 1))
            await until(lambda n=name: n in culler.running or spawners[n]._room_reason)
    finally:
        log.removeHandler(caplog.handler)
    assert 0 < len(culler.running) < 4, culler.running
    assert "FracSpawner.room_tag_key is likely not the culler's" in caplog.text
    for task in tasks.values():
        task.cancel()
    await asyncio.gather(*tasks.values(), return_exceptions=True)


# --- the chart -------------------------------------------------------------------------------
def test_the_chart_generates_the_key_for_the_culler_and_tells_the_hub_where_it_is():
    """A Secret with a random key (kept across upgrades by lookup, as the webhook's
    certificate), the culler's FRACSPAWNER_ROOM_TAG_KEY from it, and the z2jh overlay (and
    NOTES.txt) give the hub the same. Before, the chart had no key: tags were guessable."""
    import base64

    import yaml

    from tests.chart_support import REPO, objects, one, render

    rendered = render({})
    objs = objects(rendered)
    secret = one(objs, "Secret", "room-tag-key")
    key = base64.b64decode(secret["data"]["key"]).decode()
    assert len(key) == 64 and key.isalnum()
    assert secret["type"] == "Opaque"
    culler = one(objs, "Deployment", "culler")["spec"]["template"]["spec"]["containers"][0]
    (env,) = [e for e in culler["env"] if e["name"] == ROOM_TAG_KEY_ENV]
    ref = {"name": secret["metadata"]["name"], "key": "key"}
    assert env["valueFrom"]["secretKeyRef"] == ref
    # generated per install (helm template has no cluster to look the old one up in)
    again = one(objects(render({})), "Secret", "room-tag-key")["data"]["key"]
    assert again != secret["data"]["key"]
    # the hub's env: the overlay and NOTES.txt name the same Secret
    overlay = yaml.safe_load((REPO / "examples" / "z2jh" / "values.yaml").read_text())
    hub_env = overlay["hub"]["extraEnv"][ROOM_TAG_KEY_ENV]
    assert hub_env["valueFrom"]["secretKeyRef"] == ref
    notes = rendered["fracspawner/templates/NOTES.txt"]
    printed = yaml.safe_load(
        notes.split("and run `helm upgrade` of the jupyterhub release in the same namespace:\n")[
            1
        ].split("\nz2jh generates", 1)[0]
    )
    assert printed["hub"]["extraEnv"] == overlay["hub"]["extraEnv"]
    # no culler: no key, and NOTES asks for none
    off = render({"culler": {"enabled": False}})
    assert not [o for o in objects(off) if o["kind"] == "Secret"]
    assert ROOM_TAG_KEY_ENV not in off["fracspawner/templates/NOTES.txt"]


def test_the_demo_gives_its_hub_and_culler_one_fresh_key():
    """`fracspawner demo`: the hub-managed culler gets the key in its environment (not on its
    command line) and the hub the same as FracSpawner.room_tag_key. Before: neither had one."""
    from pathlib import Path

    from traitlets.config import Config

    from devcluster.demo import culler_config

    def run(source: str) -> Config:
        c = Config()
        c.JupyterHub.services, c.JupyterHub.load_roles = [], []
        exec(source, {"c": c})  # as the hub loads its config file
        return c

    c = run(culler_config(Path("catalog.yaml"), 8001))
    (service,) = c.JupyterHub.services
    key = service["environment"][ROOM_TAG_KEY_ENV]
    assert len(key) >= 32 and c.FracSpawner.room_tag_key == key
    assert key not in " ".join(service["command"])
    assert run(culler_config(Path("catalog.yaml"), 8001)).FracSpawner.room_tag_key != key
