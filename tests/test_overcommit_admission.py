"""Admission knows who is present (issue 36, item 5; bug 4: "8 present users on one
over-committed GPU: 28 CUDA out-of-memory errors in the cells of users 5-8 over 40 min, and no
word about why"). The everyone-present lab: one T4 of a pool with 4 slots over-committed twice
(8 slots of 1/4). The culler's room view (culler/room.py, `Culler.room_json`) counts a present
user's slice whole; the hub's admission (hub/room.py, FracSpawner) keeps the 5th..8th new
servers in line with the reason while the first four hold the GPU, and lets the next one in
when a user leaves."""

from __future__ import annotations

import pytest

from fracspawner.backends import load_catalog
from fracspawner.culler.decide import ServerFacts
from fracspawner.culler.placement import Placement
from fracspawner.culler.reports import parse_report
from fracspawner.culler.room import gpu_rooms, server_tag
from fracspawner.culler.swapdesk import seats_from
from tests.test_culler_hostile import receiver  # noqa: F401 (the culler with a fake hub)
from tests.test_overcommit_pressure import QUARTER, SIZE, UUID, kernel, report

LAB = {
    "pools": {
        "t4": {"gpu": "T4", "backend": "timeslicing", "replicas": 4, "overcommit": 2,
               "offers": ["1/4"]},
    }
}  # fmt: skip
NOW = 1e9
AT = "2001-09-09T01:46:00Z"  # the reports' sampled_at, just before NOW


def lab_reports(present: dict[str, bool], busy: frozenset[str] = frozenset()) -> list:
    """Each user's server report: one idle (or busy) kernel holding its quarter; the device
    reading says what all of them hold."""
    used = QUARTER * len(present)
    out = []
    for i, (user, here) in enumerate(sorted(present.items())):
        extra = {"execution_state": "busy"} if user in busy else {}
        body = report(
            [kernel(f"k-{user}", QUARTER, f"2001-09-09T00:0{i}:00Z", **extra)],
            present=here,
            used=used,
        )
        out.append((user, "", parse_report({**body, "sampled_at": AT}, received_at=NOW)))
    return out


def rooms(reports, users) -> list:
    catalog = load_catalog(LAB)
    known = {(u, ""): ServerFacts(u, user_options={"gpu": "1/4", "pool": "t4"}) for u in users}
    seats = seats_from(reports, known, catalog, NOW, 30, placement=lambda u, s: Placement("node-1"))
    return gpu_rooms([("t4", s) for s in seats])


def test_present_users_hold_their_whole_slice_and_a_leaving_one_frees_it():
    users = ["u1", "u2", "u3", "u4"]
    (room,) = rooms(lab_reports(dict.fromkeys(users, True)), users)
    assert (room.pool, room.gpu, room.size_mib) == ("t4", f"node-1/{UUID}", SIZE)
    # four present people, each may run a cell at any moment: the GPU is theirs
    assert room.present == 4 and room.held_mib == SIZE and room.free_mib == 0
    assert set(room.servers) == {server_tag(u, "") for u in users}
    # u1 leaves (absent): its idle kernel can be swapped out, so its quarter is room
    (room,) = rooms(lab_reports({**dict.fromkeys(users, True), "u1": False}), users)
    assert room.present == 3 and room.free_mib == QUARTER
    # a busy kernel of an absent user cannot be swapped out: no room
    (room,) = rooms(lab_reports({**dict.fromkeys(users, True), "u1": False}, {"u1"}), users)
    assert room.free_mib == 0


def test_unknown_is_never_room():
    """A server whose report is stale, or that has not reported (its pod on the GPU's node),
    counts its whole slice; memory the device shows and nobody reports counts too."""
    users = ["u1", "u2", "u3", "u4"]
    absent = lab_reports(dict.fromkeys(users, False))
    (room,) = rooms(absent, users)
    assert room.present == 0 and room.free_mib == SIZE  # four idle kernels: all swappable
    # u5 listed by the hub, pod on node-1, no report yet: its slice
    (room,) = rooms(absent, [*users, "u5"])
    assert room.free_mib == SIZE - QUARTER and server_tag("u5", "") in room.servers
    # u1's report is stale: its slice
    old = parse_report({**report([]), "sampled_at": AT}, received_at=NOW - 100)
    (room,) = rooms([*absent[1:], ("u1", "", old)], users)
    assert room.free_mib == SIZE - QUARTER
    # the device shows a quarter more than the servers report (a kernel above its slice)
    more = lab_reports(dict.fromkeys(users, False))
    more = [(u, s, r) for u, s, r in more]
    bigger = report([kernel("k-u1", QUARTER, "2001-09-09T00:00:00Z")], used=5 * QUARTER)
    more[0] = ("u1", "", parse_report({**bigger, "sampled_at": AT}, received_at=NOW))
    for i in range(1, 4):
        body = report([kernel(f"k-u{i + 1}", QUARTER, AT)], used=5 * QUARTER)
        more[i] = (f"u{i + 1}", "", parse_report({**body, "sampled_at": AT}, received_at=NOW))
    (room,) = rooms(more, users)
    assert room.free_mib == SIZE - QUARTER


# --- the hub: the everyone-present lab ------------------------------------------------------
class LabCuller:
    """The culler's room answer for the lab, from the real culler code (seats_from, gpu_rooms)
    over the reports of the servers that run: each user is present unless they left."""

    def __init__(self) -> None:
        self.running: list[str] = []
        self.left: set[str] = set()
        self.asked = 0

    async def answer(self) -> dict:
        self.asked += 1
        present = {u: u not in self.left for u in self.running}
        found = rooms(lab_reports(present), self.running) if self.running else []
        return {"at": NOW, "listed": True, "gpus": [r.to_json() for r in found]}


async def until(condition, limit: float = 60.0) -> None:
    """Let the event loop run until `condition()` holds (a generous limit, no timing claim)."""
    import asyncio

    for _ in range(int(limit / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


async def lab_spawners(monkeypatch, config: dict) -> tuple[LabCuller, list[str], dict]:
    """The lab's 8 users, each spawn admitted and about to ask for room (FracSpawner `config`
    beside the lab's catalog); kubespawner's pod creation records who got in."""
    from kubespawner import KubeSpawner

    import fracspawner.hub.room as room
    import fracspawner.hub.spawner as spawner_module
    from tests.hub_support import HubUsers, begin_spawn

    monkeypatch.setattr(room, "CACHE_SECONDS", 0.0)
    monkeypatch.setattr(spawner_module, "POLL_SECONDS", 0.01)
    hub = HubUsers({"FracSpawner": {"catalog": LAB, **config}})
    culler = LabCuller()
    users = [f"u{i}" for i in range(1, 9)]
    spawners = {}
    for name in users:
        s = hub.spawner(hub.user(name))
        s._room_answer = culler.answer
        spawners[name] = s
        await begin_spawn(s, {"gpu": "1/4", "pool": "t4"})

    async def created(self, pod, request_timeout):  # kubespawner's pod creation, recorded
        culler.running.append(self.user.name)
        return True

    monkeypatch.setattr(KubeSpawner, "_make_create_pod_request", created)
    return culler, users, spawners


async def test_the_everyone_present_lab_waits_with_the_reason_and_lets_the_next_in(monkeypatch):
    """8 present users on one GPU of 4 slots over-committed twice: the first four start; the
    5th..8th wait in line with the reason (the GPU is in use by 4 people now; you are next; N
    ahead) instead of meeting CUDA out-of-memory in a cell; one user leaving lets the next in."""
    import asyncio

    import fracspawner.hub.room as room

    culler, users, spawners = await lab_spawners(monkeypatch, {"admission": "wait"})
    tasks = {}
    for name in users:  # one after the other, as students click
        tasks[name] = asyncio.ensure_future(spawners[name]._make_create_pod_request(None, 1))
        await until(lambda n=name: n in culler.running or spawners[n]._room_reason)
    assert culler.running == users[:4]
    # the 5th is next, the others are behind it; each is in line (queue_timeout counts)
    reasons = {n: spawners[n]._room_reason for n in users[4:]}
    assert reasons["u5"] == "The GPU is in use by 4 people now; you are next", reasons
    assert reasons["u6"] == "The GPU is in use by 4 people now; 1 person is ahead of you"
    assert reasons["u8"] == "The GPU is in use by 4 people now; 3 people are ahead of you"
    assert all(spawners[n]._in_line() for n in users[4:])
    words = spawners["u5"]._room_words(reasons["u5"])
    assert "starts by itself" in words and "place is kept for 30 minutes" in words
    # u1 leaves (absent: its idle kernel may be swapped out): u5 goes in, u6 is next
    culler.left.add("u1")
    await until(lambda: "u5" in culler.running)
    # u6 may look between u5 leaving the line and its pod being made (a create yields, as an
    # API request does), and read "3 people" for a moment: the reading once u5 counts
    next_reason = "The GPU is in use by 4 people now; you are next"
    await until(lambda: spawners["u6"]._room_reason == next_reason)
    assert culler.running == [*users[:4], "u5"]
    assert spawners["u6"]._room_reason == "The GPU is in use by 4 people now; you are next"
    assert not spawners["u5"]._in_line()
    for name in users[5:]:
        tasks[name].cancel()
    await asyncio.gather(*tasks.values(), return_exceptions=True)
    assert not room.RoomLine.shared().waiting["t4"]  # cancelled spawns leave the line


async def test_no_answer_from_the_culler_admits_by_slot_counts(monkeypatch):
    """The culler cannot answer: admitted as before the check (the slot counts bound it), and
    the log says so; under admission "refuse" a full GPU refuses with the reason."""
    import fracspawner.hub.room as room
    from tests.hub_support import HubUsers, begin_spawn, refusal

    monkeypatch.setattr(room, "CACHE_SECONDS", 0.0)
    hub = HubUsers({"FracSpawner": {"catalog": LAB, "admission": "wait"}})
    s = hub.spawner(hub.user("ann"))

    async def nothing():
        return None

    s._room_answer = nothing
    await begin_spawn(s, {"gpu": "1/4", "pool": "t4"})
    await s._wait_for_room()
    assert s._room_checked and s._room_reason is None
    # admission "refuse": the reason, at once
    hub = HubUsers({"FracSpawner": {"catalog": LAB, "admission": "refuse"}})
    culler = LabCuller()
    culler.running = ["u1", "u2", "u3", "u4"]
    s = hub.spawner(hub.user("bob"))
    s._room_answer = culler.answer
    await begin_spawn(s, {"gpu": "1/4", "pool": "t4"})
    import pytest
    from tornado.web import HTTPError

    with pytest.raises(HTTPError) as info:
        await s._wait_for_room()
    assert refusal(info.value).startswith("The GPU is in use by 4 people now; you are next.")


def test_the_culler_publishes_room_after_the_hubs_first_list():
    """`Culler.room_json` (GET .../api/room): nothing until the hub has listed its servers
    (the culler knows nobody yet: the hub admits by slot counts); then each GPU of an
    over-committed pool with what present users hold, and no names."""
    from fracspawner.culler.app import Culler

    culler = Culler()
    culler._catalog = load_catalog(LAB)
    users = ["u1", "u2", "u3", "u4"]
    for user, server, parsed in lab_reports(dict.fromkeys(users, True)):
        culler.reports.put(user, server, parsed)
    assert culler.room_json(NOW) == {"at": NOW, "listed": False, "gpus": []}
    culler.known = {
        (u, ""): ServerFacts(u, user_options={"gpu": "1/4", "pool": "t4"}) for u in users
    }
    culler.listed_at = NOW
    body = culler.room_json(NOW)
    (gpu,) = body["gpus"]
    assert body["listed"] and gpu["pool"] == "t4" and gpu["gpu"] == UUID  # no pod watch: UUID
    assert (gpu["present"], gpu["free_mib"], gpu["held_mib"]) == (4, 0.0, SIZE)
    assert "u1" not in str(body)


async def test_the_pending_page_says_why_while_the_spawn_waits_for_room():
    """kubespawner's progress yields nothing before the pod exists: the reason is put among its
    events each time it changes, and its patience message gives way to the reason."""
    import asyncio

    from tests.hub_support import HubUsers

    hub = HubUsers({"FracSpawner": {"catalog": LAB, "admission": "wait"}})
    s = hub.spawner(hub.user("eve"))
    gate = asyncio.Event()

    async def kubespawner_progress():
        await gate.wait()
        yield {"message": "Spawn taking longer than expected"}

    s._room_reason = "The GPU is in use by 4 people now; you are next"
    seen = []

    async def read():
        async for event in s._with_room_words(kubespawner_progress()):
            seen.append(event["message"])

    task = asyncio.ensure_future(read())
    await until(lambda: seen)
    assert seen[0].startswith("The GPU is in use by 4 people now; you are next. Your server")
    s._room_reason = None
    gate.set()
    await task
    assert seen[-1] == "Spawn taking longer than expected" and len(seen) == 2


async def test_a_spawn_given_up_in_line_for_room_says_so():
    from tests.hub_support import HubUsers

    hub = HubUsers({"FracSpawner": {"catalog": LAB, "admission": "wait", "queue_timeout": 600}})
    s = hub.spawner(hub.user("eve"))
    s._room_reason = "The GPU is in use by 4 people now; you are next"
    assert s._gave_up_message() == (
        "The GPU is in use by 4 people now; you are next, and no room freed within 10 minutes;"
        " your place is given up. Start again to wait again, or choose another pool."
    )


async def test_the_pending_page_closing_early_closes_kubespawners_progress():
    """JupyterHub closes the progress generator when the page goes away, while kubespawner's
    waits for its next event: the wrapper closes it cleanly."""
    import asyncio

    from tests.hub_support import HubUsers

    hub = HubUsers({"FracSpawner": {"catalog": LAB, "admission": "wait"}})
    s = hub.spawner(hub.user("eve"))
    closed = []

    async def kubespawner_progress():
        try:
            await asyncio.Event().wait()
            yield {"message": "never"}
        finally:
            closed.append(True)

    s._room_reason = "The GPU is in use by 4 people now; you are next"
    events = s._with_room_words(kubespawner_progress())
    first = await events.__anext__()
    assert first["message"].startswith("The GPU is in use by 4 people now")
    await events.aclose()
    assert closed == [True]


async def test_any_servers_token_reads_the_room_and_not_the_state(receiver, caplog):  # noqa: F811
    """The room answer names nobody, so the spawning server's own token reads it (as the hub
    asks); the state API still wants `read:servers`; an unknown token gets no answer, which
    the hub reads as 'no answer' (admitted by slots, logged)."""
    from fracspawner.hub.room import fetch_room
    from tests.test_culler_hostile import get_state

    url = receiver.url.replace("/api/reports", "/api/room")  # served next to the reports
    body = await fetch_room(url, "ann-token")
    assert body is not None and body["listed"] is False and body["gpus"] == []
    assert await get_state(receiver.url, "ann-token", "127.0.0.1") == 403
    assert await fetch_room(url, "nobody's-token") is None
    # the hub's log says why there was no answer (a spawn then goes by slot counts alone)
    assert "the culler gave no room answer at" in caplog.text and "403" in caplog.text


async def test_an_answer_without_the_culler_s_count_is_asked_again_at_the_next_spawn():
    """The hub shares one room answer for CACHE_SECONDS, but only one that counts: an answer
    from before the culler listed the hub (`listed: false`), or none at all, is asked again at
    the next spawn. Cached, a newcomer right after the culler's first list was admitted by slot
    counts alone beside four present users (fresh-clone run fresh21:
    test_overcommit_admission_e2e, 'no answer from the culler ... admitted by slot counts')."""
    from fracspawner.hub.room import RoomLine

    answers = [None, {"listed": False, "gpus": []}, {"listed": True, "gpus": []}]
    asked = []

    async def fetch():
        asked.append(len(asked))
        return answers[len(asked) - 1]

    line = RoomLine()
    assert await line.answer(fetch, 100.0) is None
    assert await line.answer(fetch, 100.5) == {"listed": False, "gpus": []}
    assert await line.answer(fetch, 101.0) == {"listed": True, "gpus": []}
    # a counting answer serves every spawn for CACHE_SECONDS
    assert await line.answer(fetch, 102.0) == {"listed": True, "gpus": []}
    assert len(asked) == 3


def _two_gpu_rooms(on_gpu: dict[str, str], silent: list[str]) -> dict[str, object]:
    """The room answer of node-1 with two T4s of the time-sliced lab pool: each user of
    `on_gpu` present at a server whose report names its GPU ("a" or "b"), holding its quarter;
    each of `silent` listed with its pod on node-1 and no report yet (time-slicing names no
    device: its pod may be on either GPU). By GPU ("a", "b")."""
    catalog = load_catalog(LAB)
    reports = []
    for i, (user, gpu) in enumerate(sorted(on_gpu.items())):
        body = report([kernel(f"k-{user}", QUARTER, f"2001-09-09T00:0{i}:00Z")], present=True)
        body["devices"][0]["uuid"] = f"GPU-{gpu}"
        body["devices"][0]["memory_used_mib"] = QUARTER * list(on_gpu.values()).count(gpu)
        reports.append((user, "", parse_report({**body, "sampled_at": AT}, received_at=NOW)))
    users = [*on_gpu, *silent]
    known = {(u, ""): ServerFacts(u, user_options={"gpu": "1/4", "pool": "t4"}) for u in users}
    seats = seats_from(reports, known, catalog, NOW, 30, placement=lambda u, s: Placement("node-1"))
    return {r.gpu.rsplit("-", 1)[1]: r for r in gpu_rooms([("t4", s) for s in seats])}


def test_a_silent_server_whose_pod_may_be_on_either_gpu_of_its_node_counts_once():
    """A listed server that has not reported, on a time-sliced pool (the device plugin names no
    device UUID), may be on any GPU of its node: it counts its slice once on the node, where it
    leaves the least room (unknown is never room on the GPU a newcomer is let onto), not on each
    GPU (on a 2-GPU node one silent server took a quarter on both, and the hub, summing the
    pool's room, saw a quarter fewer than there is)."""
    rooms_ = _two_gpu_rooms({"u1": "a", "u2": "b", "u4": "b"}, ["u3"])
    held = {g: r.held_mib for g, r in rooms_.items()}
    assert sum(held.values()) == 4 * QUARTER, f"u3's quarter counted more than once: {held}"
    # it may be on the GPU with more room: counted there (a newcomer sees the least room)
    assert held == {"a": 2 * QUARTER, "b": 2 * QUARTER}
    tag = server_tag("u3", "")
    assert [g for g, r in rooms_.items() if tag in r.servers] == ["a"]
    # the hub: three servers of its own in flight (started, not counted yet) and one more
    # quarter fit in the node's four free quarters; counted twice it saw three and the
    # newcomer waited
    from fracspawner.hub.room import verdict

    answer = {"listed": True, "gpus": [r.to_json() for r in rooms_.values()]}
    go = verdict(answer, "t4", QUARTER, size_mib=SIZE, gpus_in_pool=2, in_flight_mib=3 * QUARTER)
    assert go.go, go.reason


class OnePodName:
    """The API server's pods and the hub's pod watch as kubespawner reads them
    (`pod_reflector.pods`), for the pods kubespawner makes and deletes: a pod of the spawn's
    name may still be there, terminating, when the spawn makes its own; one with a finalizer
    nothing removes stays."""

    def __init__(self) -> None:
        self.pods: dict[str, dict] = {}
        self.created: list[str] = []
        self.deleted: list[str] = []

    async def create_namespaced_pod(self, namespace, body):
        from kubernetes_asyncio.client.rest import ApiException

        key = f"{namespace}/{body.metadata.name}"
        if key in self.pods:
            raise ApiException(status=409, reason="Conflict")  # the name is taken
        self.created.append(key)
        ports = [
            {"name": port.name, "containerPort": port.container_port}
            for port in body.spec.containers[0].ports or []
        ]
        self.pods[key] = {
            "metadata": {"name": body.metadata.name, "uid": f"uid-{len(self.created)}"},
            "spec": {"containers": [{"ports": ports}]},
            "status": {"phase": "Running", "podIP": "10.0.0.5",
                       "containerStatuses": [{"ready": True}]},
        }  # fmt: skip
        return body

    async def delete_namespaced_pod(self, name, namespace, body=None, **kwargs):
        key = f"{namespace}/{name}"
        self.deleted.append(key)
        if not self.pods.get(key, {}).get("metadata", {}).get("finalizers"):
            self.pods.pop(key, None)


async def spawn_over_an_old_pod(monkeypatch, *, waits: bool, stays: bool = False, **config):
    """u5's spawn on the everyone-present lab, its pod's name still taken by a pod of an
    earlier start being deleted (one that `stays`: a finalizer holds it); with `waits` it waits
    1.5 s for room first, longer than kubespawner's budget for creating the pod (1 s here).
    kubespawner's own `_start` and `stop` run; the API server and the pod watch are stand-ins.
    (the cluster, the spawner, its start's task)"""
    import asyncio

    from kubespawner import KubeSpawner

    import fracspawner.hub.room as room
    import fracspawner.hub.spawner as spawner_module
    from tests.hub_support import HubUsers

    monkeypatch.setattr(room, "CACHE_SECONDS", 0.0)
    monkeypatch.setattr(spawner_module, "POLL_SECONDS", 0.01)
    config = {"catalog": LAB, "admission": "wait", "events_enabled": False,
              "k8s_api_request_retry_timeout": 1, **config}  # fmt: skip
    hub = HubUsers({"FracSpawner": config})
    culler = LabCuller()
    culler.running = ["u1", "u2", "u3", "u4"]  # present: no room for a fifth
    if not waits:
        culler.left.add("u1")  # room at once
    s = hub.spawner(hub.user("u5"))
    s._room_answer = culler.answer
    cluster = OnePodName()
    s.api = cluster

    async def watching(replace: bool = False):
        return cluster

    s._start_watching_pods = watching
    monkeypatch.setitem(KubeSpawner.reflectors, s._get_reflector_key("pods"), cluster)
    metadata = {"name": s.pod_name, "uid": "uid-old", "deletionTimestamp": AT}
    if stays:
        metadata["finalizers"] = ["example.com/keep"]
    cluster.pods[f"{s.namespace}/{s.pod_name}"] = {
        "metadata": metadata,
        "status": {"phase": "Running", "podIP": "10.0.0.4", "containerStatuses": []},
    }
    s.user_options = {"gpu": "1/4", "pool": "t4"}
    s.clear_state()
    started = s.start()
    if waits:
        await until(lambda: s._room_reason or started.done())
        assert s._room_reason == "The GPU is in use by 4 people now; you are next"
        await asyncio.sleep(1.5)
        culler.left.add("u1")  # room
    return cluster, s, started


@pytest.mark.parametrize("waits", [False, True], ids=["room-at-once", "long-wait-for-room"])
async def test_a_pod_of_the_same_name_after_a_long_wait_for_room_is_replaced(waits, monkeypatch):
    """kubespawner 7 answers a 409 on creating the pod (a pod of that name still there, e.g.
    terminating) by deleting it and creating again, within k8s_api_request_retry_timeout from
    its first try (kubespawner/spawner.py `_start`, `_make_create_pod_request`). FracSpawner
    waits for room inside that first try, so after a wait longer than the budget the 409 was
    the end: the old pod deleted, no new one, "Could not create pod". Now the tries after the
    wait have the whole budget: the old pod goes and the user gets theirs. With room at once
    (no wait) kubespawner replaced the pod before too."""
    import asyncio

    cluster, s, started = await spawn_over_an_old_pod(monkeypatch, waits=waits)
    url = await asyncio.wait_for(started, 30)
    assert url == "http://10.0.0.5:8888"
    key = f"{s.namespace}/{s.pod_name}"
    assert cluster.deleted == [key] and cluster.created == [key]
    assert cluster.pods[key]["metadata"]["uid"] == "uid-1"


async def test_a_pod_of_the_same_name_that_stays_is_named_in_the_failure(monkeypatch):
    """Where the old pod does not go (a finalizer, a node that is gone), the spawn ends at its
    start_timeout saying why, and makes nothing: no pod, no place in line, no room held."""
    import asyncio
    import re

    from fracspawner.hub.room import RoomLine
    from fracspawner.hub.waiting import WaitingSpawns

    cluster, s, started = await spawn_over_an_old_pod(
        monkeypatch, waits=True, stays=True, start_timeout=2
    )
    with pytest.raises(asyncio.TimeoutError) as failed:
        await asyncio.wait_for(started, 30)
    said = re.sub(r"besides \d+ s", "besides N s", str(failed.value))
    assert said == (
        "u5 did not start in 2 seconds (besides N s waiting for a slot): a pod of the same name "
        "(jupyter-u5, of an earlier start) is still being deleted. Start again once it is gone, "
        "or ask an administrator if it stays"
    )
    key = f"{s.namespace}/{s.pod_name}"
    assert cluster.created == [] and cluster.pods[key]["metadata"]["uid"] == "uid-old"
    assert ("u5", "") not in WaitingSpawns.shared().keys
    s.clear_state()  # JupyterHub's stop of a spawn that failed
    assert ("u5", "") not in RoomLine.shared().admitted
