"""Quota from the hub's own state (issue 14, items 9 and 10): every server of a user counts with
the slice it holds or is starting, with or without a pod watch, across a hub restart, and two
spawns at once cannot both pass. Real JupyterHub users and spawners (tests/hub_support.py)."""

from __future__ import annotations

import asyncio

import pytest
from tornado.web import HTTPError

from tests.hub_support import HubUsers, begin_spawn, refusal, running_server, stop

QUARTER = {"gpu": "1/4", "pool": "h100"}
EIGHTH = {"gpu": "1/8", "pool": "h100"}


def assert_quota_refusal(message: str) -> None:
    """A quota refusal that says the user's other servers hold part of the quota (the exact
    words belong to fracspawner.choice.options)."""
    assert message.startswith("Quota:"), message
    assert "hold" in message and ("0.25" in message or "1/4" in message), message


async def outcomes(spawners, options) -> list[str]:
    """Spawn all at once; 'ok' or the 400 message of each."""
    results = await asyncio.gather(
        *(begin_spawn(s, options) for s in spawners), return_exceptions=True
    )
    out = []
    for result in results:
        if isinstance(result, HTTPError):
            assert result.status_code == 400
            out.append(refusal(result))
        elif isinstance(result, BaseException):
            raise result
        else:
            out.append("ok")
    return out


@pytest.mark.parametrize("live_capacity", [False, True], ids=["no-watch", "watch-unreachable"])
async def test_three_named_servers_at_once_one_passes_a_quarter_quota(live_capacity):
    """The demo's default rule: h100 only, 0.25 GPU across all of a user's servers. With
    live capacity off, or on but the API unreachable, the hub's own state still counts."""
    hub = HubUsers(live_capacity=live_capacity)
    user = hub.user("quinn")
    spawners = [hub.spawner(user, name) for name in ("one", "two", "three")]
    results = await outcomes(spawners, QUARTER)
    assert results.count("ok") == 1, results
    for message in results:
        if message != "ok":
            assert_quota_refusal(message)
    # exactly one spawner holds a slice; the refused ones hold nothing
    assert [s.hold is not None for s in spawners].count(True) == 1


async def test_quota_counts_running_and_starting_servers_without_a_watch():
    hub = HubUsers()
    user = hub.user("quinn")
    one, two, three = (hub.spawner(user, n) for n in ("one", "two", "three"))
    await begin_spawn(one, EIGHTH)
    await begin_spawn(two, EIGHTH)
    with pytest.raises(HTTPError) as info:
        await begin_spawn(three, EIGHTH)
    assert_quota_refusal(refusal(info.value))
    # a CPU-only server is always fine
    await begin_spawn(three, {"gpu": "none"})
    stop(three)
    # stopping one frees its eighth for another server
    stop(one)
    pod = await begin_spawn(three, EIGHTH)
    assert pod.metadata.labels["fracspawner.io/gpu"] == "0.125"


async def test_a_hub_restart_keeps_what_running_servers_hold():
    hub = HubUsers()
    user = hub.user("rosa")
    one = hub.spawner(user, "one")
    await begin_spawn(one, QUARTER)
    # what User.spawn persists once start() returns
    one.orm_spawner.state = one.get_state()
    hub.db.commit()

    # a new hub process: new User and spawner objects from the database (load_state)
    user = hub.user("rosa")
    again = hub.spawner(user, "one")
    assert again is not one and again.hold is not None and again.hold.gpu_equivalent == 0.25
    again.server = one.server  # JupyterHub found it running
    two = hub.spawner(user, "two")
    with pytest.raises(HTTPError) as info:
        await begin_spawn(two, EIGHTH)
    assert_quota_refusal(refusal(info.value))

    # once stopped, the state no longer carries a slice
    stop(again)
    again.orm_spawner.state = again.get_state()
    assert "fracspawner_hold" not in again.orm_spawner.state
    await begin_spawn(two, EIGHTH)


async def test_an_active_server_without_a_record_makes_usage_unknown():
    """A server started before this version (no hold in its state) while no pod watch can
    say what it holds: GPU spawns are refused with the reason; CPU-only spawns and admins
    are not limited by it."""
    hub = HubUsers()
    user = hub.user("otto")
    old = hub.spawner(user, "old")
    old.server = running_server(old)
    new = hub.spawner(user, "new")
    with pytest.raises(HTTPError) as info:
        await begin_spawn(new, EIGHTH)
    message = refusal(info.value)
    assert "cannot tell what GPU server 'old' holds right now" in message
    assert "Stop that server, start this one without a GPU, or try again later." in message
    await begin_spawn(new, {"gpu": "none"})
    stop(new)

    admin = hub.user("ada", admin=True)
    admin_old = hub.spawner(admin, "old")
    admin_old.server = running_server(admin_old)
    await begin_spawn(hub.spawner(admin, "new"), {"gpu": "1/4", "pool": "a100-mig"})


async def test_a_refused_spawn_holds_nothing():
    hub = HubUsers()
    user = hub.user("nia")
    one, two = hub.spawner(user, "one"), hub.spawner(user, "two")
    with pytest.raises(HTTPError):
        await begin_spawn(one, {"gpu": "1/4", "pool": "a100-mig"})  # not her pool
    assert one.hold is None and "fracspawner_hold" not in one.get_state()
    await begin_spawn(two, QUARTER)


async def test_a_hold_left_in_the_state_of_a_stopped_server_counts_nothing():
    """A hub that died mid-stop may leave a hold in a stopped server's state."""
    hub = HubUsers()
    user = hub.user("ines")
    old = hub.spawner(user, "old")
    old.orm_spawner.state = {
        "fracspawner_hold": {"pool": "h100", "gpu": "1/4", "gpu_equivalent": 0.25}
    }
    hub.db.commit()
    user = hub.user("ines")
    assert hub.spawner(user, "old").hold is not None  # loaded, but the server is not running
    await begin_spawn(hub.spawner(user, "new"), QUARTER)
