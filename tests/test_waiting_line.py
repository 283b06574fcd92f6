"""The hub's line is bounded (hub/waiting.py): spawns in line are pending to JupyterHub, which
refuses every spawn once `concurrent_spawn_limit` are pending, so FracSpawner lets at most
`max_waiting` (by default half that limit) wait. Real JupyterHub users and spawners
(tests/hub_support.py), all at once on a full pool; the pod watch is a stand-in that shows the
T4 full. The real hub's side is tests/test_e2e_wait.py."""

from __future__ import annotations

import asyncio
import re

import pytest
from tornado.web import HTTPError

from fracspawner.backends import load_catalog
from fracspawner.capacity import compute_capacity
from fracspawner.hub.waiting import WaitingSpawns, waiting_limit
from tests.hub_support import HubUsers, refusal
from tests.test_admission import NODES, T4_POOL, pod
from tests.test_spawner_quota import outcomes

CATALOG = {
    "pools": {"t4": T4_POOL},
    "images": {"base": {"image": "quay.io/jupyter/base-notebook", "default": True}},
    "access": {"default": {"pools": "all", "max_gpu": None}},
}
FULL_T4 = compute_capacity(
    load_catalog(CATALOG), NODES, [pod(f"job-{i}", "t4", {"nvidia.com/gpu": "1"}) for i in range(4)]
)


class FullPool:
    """The pod watch as admission reads it (`_capacity_and_usage_now`): the T4's four
    replicas taken by jobs, none of the users' pods made yet."""

    async def start(self) -> None:
        await asyncio.sleep(0)

    def snapshot(self):
        return FULL_T4

    def pod(self, namespace, name):
        return None

    def usage_by_user(self) -> dict:
        return {}

    def placement(self, *args):
        return None


async def everyone_at_once(hub: HubUsers, names: list[str]) -> list[str]:
    """Each spawn at once on the full T4: "in line", or its refusal."""
    spawners = [hub.spawner(hub.user(n)) for n in names]
    for s in spawners:
        s._capacity_watcher = FullPool  # type: ignore[method-assign]  (an instance per call)
    got = await outcomes(spawners, {"gpu": "1/4", "pool": "t4"})
    return ["in line" if g == "ok" else g for g in got]


@pytest.fixture(autouse=True)
def empty_line():
    WaitingSpawns.shared().keys.clear()
    yield
    WaitingSpawns.shared().keys.clear()


async def test_a_class_arriving_together_fills_the_line_and_no_more():
    hub = HubUsers({"FracSpawner": {"catalog": CATALOG, "admission": "wait", "max_waiting": 3}})
    got = await everyone_at_once(hub, [f"s{i}" for i in range(12)])
    assert got.count("in line") == 3
    refused = [m for m in got if m != "in line"]
    assert len(refused) == 9
    assert all(
        m.startswith("No 1/4 GPU is free on t4 right now (all 4 are taken).") for m in refused
    ), refused[0]
    assert all(m.endswith(
        "Waiting is closed for now: 3 servers already wait in line on this hub, the most it "
        "keeps waiting at once, so that others can still start."
    ) for m in refused), refused[0]  # fmt: skip
    assert len(WaitingSpawns.shared()) == 3


async def test_a_place_is_given_back_when_its_spawn_ends():
    hub = HubUsers({"FracSpawner": {"catalog": CATALOG, "admission": "wait", "max_waiting": 1}})
    assert await everyone_at_once(hub, ["a"]) == ["in line"]
    assert (await everyone_at_once(hub, ["b"]))[0].startswith("No 1/4 GPU is free")
    hub.spawner(hub.user("a")).clear_state()  # JupyterHub's stop of a's spawn (queue_timeout)
    assert await everyone_at_once(hub, ["b"]) == ["in line"]


async def test_under_admission_refuse_nobody_takes_a_place():
    hub = HubUsers({"FracSpawner": {"catalog": CATALOG, "max_waiting": 1}})
    got = await everyone_at_once(hub, ["a", "b"])
    assert all(m.startswith("No 1/4 GPU is free") and "Waiting is closed" not in m for m in got)
    assert len(WaitingSpawns.shared()) == 0


def test_the_default_is_half_the_hubs_spawn_limit():
    assert waiting_limit(None, 64) == 32  # z2jh's hub.concurrentSpawnLimit
    assert waiting_limit(None, 100) == 50  # JupyterHub's default
    assert waiting_limit(None, 1) == 1
    assert waiting_limit(None, 0) is None  # the hub throttles nothing: no bound
    assert waiting_limit(5, 64) == 5 and waiting_limit(0, 64) == 0


async def test_waiting_for_room_takes_a_place_in_the_same_line(monkeypatch):
    """On an over-committed pool the line for room is the same line: with `max_waiting` 2,
    the everyone-present lab's 5th and 6th wait for room, the 7th and 8th are refused at once
    (429, a refusal, not a hub error) with the reason and why they cannot wait."""
    from tests.test_overcommit_admission import lab_spawners, until

    config = {"admission": "wait", "max_waiting": 2}
    culler, users, spawners = await lab_spawners(monkeypatch, config)
    tasks = {}
    for name in users:
        tasks[name] = asyncio.ensure_future(spawners[name]._make_create_pod_request(None, 1))
        await until(
            lambda n=name: n in culler.running or spawners[n]._room_reason or tasks[n].done()
        )
    assert culler.running == users[:4]
    assert [n for n in users if spawners[n]._room_reason] == ["u5", "u6"]
    for name in ("u7", "u8"):
        error = tasks[name].exception()
        assert isinstance(error, HTTPError) and error.status_code == 429
        assert refusal(error) == (
            "The GPU is in use by 4 people now; 2 people are ahead of you, and 2 servers "
            "already wait in line on this hub, the most it keeps waiting at once, so that others "
            "can still start. Try again in a few minutes, or choose another pool."
        )
    assert WaitingSpawns.shared().keys == {("u5", ""), ("u6", "")}
    for name in ("u5", "u6"):
        tasks[name].cancel()
    await asyncio.gather(*tasks.values(), return_exceptions=True)


@pytest.mark.parametrize("watch", ["stale", "none"])
async def test_a_spawn_admitted_on_unknown_counts_takes_its_place_once_its_pod_waits(
    watch, monkeypatch
):
    """Admission takes a place only where the counts say the pool is full. Admitted on counts
    it cannot trust (a watch that lost the API server, or no watch) or on a slot that looked
    free, a spawn whose pod then waits takes its place in `_start`'s line once the scheduler
    found no node for it, or is refused there (429) when the line is full: 12 at once,
    `max_waiting` 3, all pods Pending. Before, all 12 waited (review s53)."""
    import dataclasses

    from kubespawner import KubeSpawner

    from fracspawner.hub.spawner import FracSpawner

    stale = dataclasses.replace(FULL_T4, stale=True, age_seconds=90.0)

    class Stale(FullPool):
        def snapshot(self):
            return stale

    hub = HubUsers({"FracSpawner": {"catalog": CATALOG, "admission": "wait", "max_waiting": 3}})
    spawners = [hub.spawner(hub.user(f"s{i}")) for i in range(12)]
    for s in spawners:
        s._capacity_watcher = Stale if watch == "stale" else (lambda: None)
    assert await outcomes(spawners, {"gpu": "1/4", "pool": "t4"}) == ["ok"] * 12
    assert len(WaitingSpawns.shared()) == 0  # nobody known to wait at admission

    async def pending_for_ever(self):  # kubespawner's start, its pod never scheduled
        await asyncio.Event().wait()

    monkeypatch.setattr(KubeSpawner, "_start", pending_for_ever)
    made = {"status": {"phase": "Pending"}}  # made, the scheduler has not looked yet
    monkeypatch.setattr(FracSpawner, "_queued_pod", lambda self: made)
    for s in spawners:
        s._startup_timeout = 300
    tasks = [asyncio.ensure_future(s._start()) for s in spawners]
    await asyncio.wait(tasks, timeout=2)
    # a pod about to be bound takes no place: nobody is refused for a slot they may have
    assert not any(t.done() for t in tasks) and len(WaitingSpawns.shared()) == 0
    made["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
    ]  # the scheduler found no node: they wait
    await asyncio.wait(tasks, timeout=2)
    refused = [t for t in tasks if t.done()]
    assert len(refused) == 9 and len(WaitingSpawns.shared()) == 3
    error = refused[0].exception()
    assert isinstance(error, HTTPError) and error.status_code == 429
    assert refusal(error) == (
        "Your server would wait for 1/4 GPU on t4, and 3 servers already wait in line on this "
        "hub, the most it keeps waiting at once, so that others can still start. Try again in "
        "a few minutes, or choose another size."
    )
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert len(WaitingSpawns.shared()) == 0  # every place given back


async def test_an_earlier_starts_pod_being_deleted_is_not_in_line(monkeypatch):
    """kubespawner deletes a pod of the spawn's name that answers its create with 409 and waits
    for it to go: while it goes, that Pending, unschedulable pod is not this spawn waiting in
    line (it would take a place, counted against max_waiting, for nothing)."""
    import types

    hub = HubUsers({"FracSpawner": {"catalog": CATALOG, "admission": "wait"}})
    spawner = hub.spawner(hub.user("ann"))
    unschedulable = {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
    }
    key = f"{spawner.namespace}/{spawner.pod_name}"
    waiting = {"metadata": {"name": spawner.pod_name}, "spec": {}, "status": unschedulable}
    pods = {key: waiting}
    reflector = types.SimpleNamespace(pods=pods)
    monkeypatch.setattr(type(spawner), "pod_reflector", property(lambda self: reflector))
    assert spawner._unschedulable() and spawner._in_line()
    going = {
        **waiting,
        "metadata": {**waiting["metadata"], "deletionTimestamp": "2026-11-30T18:00:00Z"},
    }
    pods[key] = going
    assert not spawner._unschedulable()
    assert not spawner._in_line()


def visible(form: str) -> str:
    """The form's words without JavaScript: tags, the embedded model and the picker's script
    and style left out, entities read (elements marked hidden are kept)."""
    import html

    form = re.sub(r"<(script|style)\b.*?</\1>", " ", form, flags=re.S)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", form)).split())


def embedded_model(form: str) -> dict:
    import json

    found = re.search(r'<script[^>]* id="fracspawner-model">(.*?)</script>', form, flags=re.S)
    assert found, "no model in the form"
    return json.loads(found.group(1))


async def test_the_form_says_the_line_is_full_before_start_is_pressed():
    """max_waiting 1, the T4 full. While the one place is free the form offers 1/4 on the T4
    to wait for; once someone waits in it, the next user's form rules the size out with the
    words Start would be refused with, and the model tells the picker the hub knew it."""
    hub = HubUsers({"FracSpawner": {"catalog": CATALOG, "admission": "wait", "max_waiting": 1}})

    async def form_of(name: str) -> str:
        spawner = hub.spawner(hub.user(name))
        spawner._capacity_watcher = FullPool  # type: ignore[method-assign]
        return await spawner._render_options_form_async(spawner)

    before = await form_of("b")
    assert "(none free now: your server would wait for one)" in visible(before)

    assert await everyone_at_once(hub, ["a"]) == ["in line"]
    form = await form_of("b")
    words = visible(form)
    closed = (
        "None free right now. Waiting is closed for now: 1 server already waits in line on "
        "this hub, the most it keeps waiting at once, so that others can still start."
    )
    assert "t4: 0 of 4 free — 1/4 of a T4: " in words, words
    assert f"(unavailable: {closed})" in words, words
    assert "would wait" not in words
    assert re.search(r'<input[^>]*value="1/4"[^>]*disabled', form), "1/4 can still be chosen"
    # what picker.js reads: the hub knew (the service cannot: tests/test_browser_line.py)
    line = embedded_model(form)["waiting_line"]
    assert line == {"known": True, "closed": True, "reason": closed}
    assert embedded_model(before)["waiting_line"] == {
        "known": True, "closed": False, "reason": None,
    }  # fmt: skip
    # Start is refused with the same words
    got = await everyone_at_once(hub, ["b"])
    assert got[0].endswith(closed.removeprefix("None free right now. ")), got
    # the user in line, looking at their server's form, is not told the line is closed
    assert "would wait for one" in visible(await form_of("a"))
