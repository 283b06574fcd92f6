"""The hub's line for room on over-committed GPUs is first come, first served with backfill
(hub/room.py): a spawn ahead that does not fit now does not hold up a smaller one behind it
that does, until it has waited OVERTAKE_SECONDS. Strictly first come, first served, a half-GPU
slice at the head kept five 1/8 slices waiting 64-98 min beside 17-20 GiB of room (the culler
benchmark, breaks on half the GPUs)."""

from __future__ import annotations

import asyncio

from fracspawner.hub.room import OVERTAKE_SECONDS, InLine, RoomLine, verdict

GIB = 1024.0
H100 = 80 * GIB


def answer(*free_gib: float, present: int = 8) -> dict:
    """The culler's room answer for pool `h` with one GPU per `free_gib`."""
    gpus = [
        {"pool": "h", "gpu": f"node-1/GPU-{i}", "free_mib": f * GIB, "present": present // 2}
        for i, f in enumerate(free_gib)
    ]
    return {"listed": True, "gpus": gpus}


def go(ans: dict, need_gib: float, *ahead: InLine) -> bool:
    v = verdict(ans, "h", need_gib * GIB, size_mib=H100, gpus_in_pool=len(ans["gpus"]),
                ahead=ahead)  # fmt: skip
    return v.go


def test_a_small_slice_is_not_held_up_by_a_large_one_that_does_not_fit():
    half = InLine(40 * GIB, 60.0)  # a half-GPU slice first in line for a minute
    # 20 and 17 GiB free: no room for the half anywhere, room for a 1/8 (10 GiB)
    assert not go(answer(20, 17), 40)
    assert go(answer(20, 17), 10, half)
    # where nothing fits, the one behind still waits, and its page says where it stands
    v = verdict(answer(5, 5), "h", 10 * GIB, size_mib=H100, gpus_in_pool=2, ahead=(half,))
    assert (
        not v.go
        and v.reason == "The pool's 2 GPUs are in use by 8 people now; 1 person is ahead of you"
    )


def test_those_ahead_that_fit_take_their_room_first():
    # two quarters (20 GiB) ahead fit in 45 GiB; what is left (5) holds no 1/8 (10 GiB)
    quarter = InLine(20 * GIB, 5.0)
    assert go(answer(45), 10, quarter)
    assert not go(answer(45), 10, quarter, quarter)
    # one ahead takes the roomiest GPU (the most it can take from the one behind): 30 of 40,
    # leaving 10 and 20; a spawn of 25 fits on neither
    assert go(answer(40, 20), 25)
    assert not go(answer(40, 20), 25, InLine(30 * GIB, 5.0))
    # the pool's total counts too: 12 + 12 free, a 20 ahead fits nowhere, a 10 fits
    assert go(answer(12, 12), 10, InLine(20 * GIB, 5.0))


def test_a_large_slice_that_waited_long_enough_is_not_overtaken():
    # past OVERTAKE_SECONDS nobody passes the half-GPU slice, so small ones cannot take every
    # bit of room that frees before it grows to a half
    starving = InLine(40 * GIB, OVERTAKE_SECONDS)
    assert not go(answer(20, 17), 10, starving)
    assert go(answer(20, 17), 10, InLine(40 * GIB, OVERTAKE_SECONDS - 1))
    # one that fits now is no hold-up at any age: it takes its room, the rest is shared
    assert go(answer(50), 10, InLine(40 * GIB, 10 * OVERTAKE_SECONDS))
    # nor is a waiting one behind the one asking
    assert go(answer(20), 10)


def test_the_line_knows_what_each_asked_and_since_when():
    line = RoomLine()
    line.join("h", ("ann", ""), 40 * GIB, 100.0)
    line.join("h", ("bob", ""), 10 * GIB, 130.0)
    line.join("h", ("ann", ""), 5 * GIB, 200.0)  # asking again keeps the first place and ask
    assert line.ahead("h", ("ann", ""), 250.0) == []
    assert line.ahead("h", ("bob", ""), 250.0) == [InLine(40 * GIB, 150.0)]
    # one not in line sees everyone who is
    assert line.ahead("h", ("cy", ""), 250.0) == [InLine(40 * GIB, 150.0), InLine(10 * GIB, 120.0)]
    line.leave("h", ("ann", ""))
    assert line.ahead("h", ("bob", ""), 250.0) == [] and ("ann", "") not in line.waiting["h"]


async def test_a_spawner_behind_a_waiting_large_slice_starts_where_its_own_fits(monkeypatch):
    """Real FracSpawners on a HAMi H100 pool over-committed twice: ann asks half a GPU and
    waits (20 and 17 GiB free); bob, after her, asks an eighth and his pod is made; once ann
    has waited `room_overtake_seconds`, cy's eighth waits behind her with the reason."""
    from kubespawner import KubeSpawner

    import fracspawner.hub.room as room
    import fracspawner.hub.spawner as spawner_module
    from tests.hub_support import HubUsers, begin_spawn
    from tests.test_overcommit_admission import until

    catalog = {
        "pools": {
            "h": {"gpu": "H100-80GB", "backend": "hami", "overcommit": 2,
                  "offers": ["1/8", "1/2"]},
        }
    }  # fmt: skip
    monkeypatch.setattr(room, "CACHE_SECONDS", 0.0)
    monkeypatch.setattr(spawner_module, "POLL_SECONDS", 0.01)
    hub = HubUsers(
        {"FracSpawner": {"catalog": catalog, "admission": "wait", "room_overtake_seconds": 300}}
    )
    made: list[str] = []

    async def created(self, pod, request_timeout):  # kubespawner's pod creation, recorded
        made.append(self.user.name)
        return True

    monkeypatch.setattr(KubeSpawner, "_make_create_pod_request", created)
    spawners, tasks = {}, {}
    for name, piece in (("ann", "1/2"), ("bob", "1/8"), ("cy", "1/8")):
        s = spawners[name] = hub.spawner(hub.user(name))

        async def fetch() -> dict:
            return answer(20, 17)

        s._room_answer = fetch
        await begin_spawn(s, {"gpu": piece, "pool": "h"})
    size = spawners["ann"].choice.pool.gpu.device_memory_mib
    for name in ("ann", "bob"):
        tasks[name] = asyncio.ensure_future(spawners[name]._make_create_pod_request(None, 1))
        await until(lambda n=name: n in made or spawners[n]._room_reason)
    assert made == ["bob"], made
    assert spawners["ann"]._room_reason.endswith("you are next")
    assert size / 2 > 20 * GIB  # her half does not fit: the answer is the culler's word
    # ann has waited the configured 300 s (the default is OVERTAKE_SECONDS): the next eighth
    # waits behind her, and says so
    assert OVERTAKE_SECONDS > 300
    line = room.RoomLine.shared()
    need, _ = line.waiting["h"][("ann", "")]
    line.waiting["h"][("ann", "")] = (need, asyncio.get_running_loop().time() - 300)
    tasks["cy"] = asyncio.ensure_future(spawners["cy"]._make_create_pod_request(None, 1))
    await until(lambda: spawners["cy"]._room_reason)
    assert made == ["bob"]
    assert spawners["cy"]._room_reason.endswith("1 person is ahead of you")
    for task in tasks.values():
        task.cancel()
    await asyncio.gather(*tasks.values(), return_exceptions=True)
    assert not line.waiting["h"]
