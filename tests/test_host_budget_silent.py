"""A server that stops reporting still holds its hibernated kernels' host memory ("Host memory
per node" in docs/culler.md). Its report stale (older than `max_staleness`: its reporter stuck,
a network partition, its event loop busy) or missing (the culler restarted, or pruned the
report), the culler left it out of its node's count, "not counted, never ordered": its host
memory was given out again to other kernels' hibernations while its GPU state still sat in the
node's RAM, and the node could go over its budget (the OOM killer then takes someone's
notebook). Unknown is never free: while its pod is on its node, such a server counts at what its
pod can hold (`Culler.host_share`), and it is still ordered nothing, nor is anyone else's kernel
shut down on its account (unknown culls nobody).

Through the real `Culler.answer_report` over reports parsed as they arrive.
"""

from __future__ import annotations

import time

from fracspawner.backends import load_catalog
from fracspawner.culler.app import Culler
from fracspawner.culler.decide import ServerFacts
from fracspawner.culler.identity import Identity
from fracspawner.culler.placement import Placement
from fracspawner.culler.reports import parse_report
from tests.conftest import DEMO_CATALOG
from tests.test_host_budget import QUARTER_T4, iso, report

T4 = 15360.0  # the demo catalog's T4: what a time-sliced 1/4 T4 pod can hold on its GPU
BUDGET = 16000.0


class Pods:
    """The culler's pod watch: every server's pod on node-a, but for those gone."""

    def __init__(self) -> None:
        self.gone: set[str] = set()

    def placement(self, name: str) -> Placement | None:
        return None if any(name.endswith(user) for user in self.gone) else Placement("node-a")


def _culler(*users: str) -> Culler:
    """The demo catalog's 1/4 T4 servers of `users`, listed by the hub, all on node-a."""
    culler = Culler(host_memory_budget_mib=BUDGET)
    culler._catalog = load_catalog(str(DEMO_CATALOG))
    culler.server_pods = Pods()
    for user in users:
        culler.known[(user, "")] = ServerFacts(user, user_options={"gpu": "1/4", "pool": "t4"})
    return culler


def _says(culler: Culler, user: str, at: float, hibernated=(), wants=(), in_session=False) -> dict:
    """`user`'s server reports at `at` (its hibernated kernels: (id, MiB, since); the kernels
    it would hibernate: (id, MiB); its person in session at a tab); the culler's answer."""
    body = report(at, [(kid, mib, since, False) for kid, mib, since in hibernated])
    if in_session:
        body["presence"] = {
            "known": True, "present": False, "last_present": iso(at - 600), "tabs": 1,
            "visible_tabs": 1, "in_session": True, "elsewhere": False,
        }  # fmt: skip
    if wants:
        body["swap"] = {"hibernate_wanted": [{"kernel_id": k, "gpu_memory_mib": m}
                                             for k, m in wants]}  # fmt: skip
    culler.reports.put(user, "", parse_report(body, received_at=at))
    return culler.answer_report(Identity(user, ""), at) or {}


def _wait(answer: dict) -> str:
    swap = answer.get("swap") or {}
    assert "host_room" not in swap, f"room given: {swap}"
    (wait,) = swap["host_wait"]
    return wait["reason"]


def test_a_server_whose_report_went_stale_still_holds_its_host_memory():
    """ann's server has 12,000 MiB of hibernated state on node-a (budget 16,000), her person
    in session, and her server stops reporting. 400 s later bob's idle kernel (5,000 MiB) asks
    for room: it was given, ann's state forgotten while it was still in host memory. It waits
    now, and says why; nobody's kernel is shut down for it (ann's is not heard of, and may be
    back). Once ann's pod is gone (the pod watch), bob's kernel fits."""
    now = time.time()
    culler = _culler("ann", "bob")
    answer = _says(culler, "ann", now, hibernated=[("a1", 12000.0, now - 60)], in_session=True)
    assert "shutdown" not in answer.get("swap", {})
    # fresh: ann's 12,000 MiB count (her person in session: never shut down for room), and
    # bob's 5,000 do not fit (the rule as before)
    assert "has 4000 MiB left" in _wait(_says(culler, "bob", now + 60, wants=[("b1", 5000.0)]))
    # ann's report is stale now (max_staleness 300 s)
    answer = _says(culler, "bob", now + 400, wants=[("b1", 5000.0)])
    why = _wait(answer)
    assert "not reported" in why and "until" in why, why
    assert "shutdown" not in answer["swap"]
    assert culler._host_room.evicting == {}, "a kernel was ordered out on a stale report's count"
    # her server is known gone: her pod left the node
    culler.server_pods.gone.add("ann")
    swap = _says(culler, "bob", now + 420, wants=[("b1", 5000.0)])["swap"]
    assert swap["host_room"] == [{"kernel_id": "b1", "gpu_memory_mib": 5000.0}]


def test_a_stale_server_counts_at_what_its_pod_can_hold_not_at_its_last_word():
    """ann was given room for a second kernel, a2 (3,000 MiB), and then fell silent: her server
    may have hibernated it (a grant is in force 30 s) without being heard. The culler holds that
    room at most 600 s (LONGEST_SECONDS, for a server that never reports again); after it,
    counted at her last word (a1, 9,000 MiB), bob's 5,000 MiB would fit, and with a2 the node
    would hold 17,000 MiB of its 16,000. Counted at her bound (her pod's GPU, 15,360 MiB) it does
    not. When she reports again her word counts again, exactly."""
    now = time.time()
    culler = _culler("ann", "bob")
    _says(culler, "bob", now)
    answer = _says(culler, "ann", now, hibernated=[("a1", 9000.0, now - 60)],
                   wants=[("a2", 3000.0)])  # fmt: skip
    assert answer["swap"]["host_room"] == [{"kernel_id": "a2", "gpu_memory_mib": 3000.0}]
    why = _wait(_says(culler, "bob", now + 700, wants=[("b1", 5000.0)]))
    assert f"{T4:.0f} MiB" in why, why
    # ann reports: a2 came back to the GPU meanwhile, only a1 is in host memory
    _says(culler, "ann", now + 710, hibernated=[("a1", 9000.0, now - 60)])
    swap = _says(culler, "bob", now + 720, wants=[("b1", 5000.0)])["swap"]
    assert swap["host_room"] == [{"kernel_id": "b1", "gpu_memory_mib": 5000.0}]


def test_a_listed_server_not_heard_since_the_culler_started_counts_at_its_bound():
    """The culler restarted. Until its first cycle lists the hub's servers it gives no one room
    (a server not listed yet gets none). After it, a pod the hub does not list is a server
    started since (given no room either, and none of its kernels idle for
    `kernel_gpu_hibernate` yet) or one stopping (its memory goes with its pod): not counted.
    The first cycle lists ann's server (on node-a, a 1/4 T4), which has not reported to it yet
    and may hold hibernated kernels the previous culler gave room for. bob's kernel waits until
    ann reports (within a minute), then fits by her word. A server without a GPU slice holds no
    GPU state and counts nothing."""
    now = time.time()
    culler = _culler()  # restarted: nothing listed yet
    why = _wait(_says(culler, "bob", now - 5, wants=[("b1", 5000.0)]))
    assert "has not listed this server yet" in why, why
    culler.known.update(_culler("ann", "bob").known)  # the first cycle
    culler.known[("cpu", "")] = ServerFacts("cpu", user_options={})
    why = _wait(_says(culler, "bob", now, wants=[("b1", 5000.0)]))
    assert "not reported" in why, why
    _says(culler, "ann", now + 30, hibernated=[("a1", 9000.0, now - 600)])
    swap = _says(culler, "bob", now + 40, wants=[("b1", 5000.0)])["swap"]
    assert swap["host_room"] == [{"kernel_id": "b1", "gpu_memory_mib": 5000.0}]


def test_a_silent_server_s_kernels_are_never_ordered_and_nobody_goes_for_them():
    """The after-the-fact safety net (the node over its budget) counts fresh reports only: ann's
    stale report says 12,000 MiB and dan's fresh one 8,000 on a 16,000 MiB node. Neither her
    kernel (she cannot hear the order, and it may be back on the GPU) nor dan's (shut down for
    memory that may be free) is ordered shut down. And bob's kernel that would fit if ann's
    state were known gone waits rather than have dan's kernel shut down for it."""
    now = time.time()
    culler = _culler("ann", "dan", "bob")
    _says(culler, "ann", now, hibernated=[("a1", 12000.0, now - 900)])
    _says(culler, "bob", now)
    # dan hibernated after ann fell silent (a culler that restarted granted it, say)
    for at in (now + 400, now + 460):
        answer = _says(culler, "dan", at, hibernated=[("d1", 8000.0, now - 300)])
        assert "shutdown" not in answer.get("swap", {}), answer
    assert "not reported" in _wait(_says(culler, "bob", now + 470, wants=[("b1", QUARTER_T4)]))
    assert culler._host_room.evicting == {}
    answer = _says(culler, "dan", now + 480, hibernated=[("d1", 8000.0, now - 300)])
    assert "shutdown" not in answer.get("swap", {})


# --- review s55: a silent server's unknown memory was taken as free when shutting kernels down


def _dan_bob(ann_fresh: bool) -> tuple:
    """node-a, budget 16,000 MiB: ann's server (in session: her kernels are never shut down)
    holds a1, 12,000 MiB; dan (away) d1, 8,000 MiB; bob (away) would hibernate b1, 10,000 MiB.
    With ann's word known, b1 cannot fit even with d1 gone (16,000 - 12,000 = 4,000 < 10,000),
    so nobody's kernel is shut down for it. Returns (culler, bob's answer)."""
    now = time.time()
    culler = _culler("ann", "dan", "bob")
    _says(culler, "ann", now, hibernated=[("a1", 12000.0, now - 900)], in_session=True)
    at = now + (100 if ann_fresh else 400)  # max_staleness 300 s: at +400 ann is silent
    if ann_fresh:
        _says(culler, "ann", at - 5, hibernated=[("a1", 12000.0, now - 900)], in_session=True)
    _says(culler, "dan", at, hibernated=[("d1", 8000.0, now - 300)])
    answer = _says(culler, "bob", at + 5, wants=[("b1", 10000.0)])
    return culler, answer


def test_control_with_ann_heard_nobody_is_shut_down_for_a_want_that_cannot_fit():
    culler, answer = _dan_bob(ann_fresh=True)
    _wait(answer)
    assert culler._host_room.evicting == {}


def test_a_silent_server_does_not_get_another_user_s_kernel_shut_down():
    """Same node, but ann's server has not reported for 400 s (silent: counted at her pod's
    15,360 MiB). plan_room reckons shut-downs 'without' the silent servers, i.e. with their
    memory as free: d1 is ordered shut down (dan's GPU state is lost) for b1, which still
    cannot hibernate while ann is silent, nor after she reports her 12,000 MiB again. Missing
    data culled a notebook that full data would have kept."""
    culler, answer = _dan_bob(ann_fresh=False)
    _wait(answer)
    assert culler._host_room.evicting == {}, (
        f"dan's kernel ordered shut down on ann's unknown: {culler._host_room.evicting}"
    )


# --- review s55: a silent server without a slice the culler can size had its granted room dropped


def _no_slice_culler():
    """A culler with a host budget of 16,000 MiB on node-a and no slice it can size for ann's
    and bob's servers (no catalog: `claim` is 0 for every server, the 'GPU some other way'
    case of host_holders)."""
    from fracspawner.culler.app import Culler
    from fracspawner.culler.decide import ServerFacts
    from tests.test_host_budget_silent import Pods

    culler = Culler(host_memory_budget_mib=16000.0)
    culler.server_pods = Pods()
    for user in ("ann", "bob"):
        culler.known[(user, "")] = ServerFacts(user, user_options={})
    return culler


def test_control_room_granted_to_a_server_is_held_while_it_has_not_reported_since():
    now = time.time()
    culler = _no_slice_culler()
    answer = _says(culler, "ann", now, hibernated=[("a1", 8000.0, now - 600)],
                   wants=[("a2", 6000.0)])  # fmt: skip
    assert answer["swap"]["host_room"] == [{"kernel_id": "a2", "gpu_memory_mib": 6000.0}]
    # ann has not reported since: a2 may be in host memory now (8,000 + 6,000 of 16,000)
    _wait(_says(culler, "bob", now + 100, wants=[("b1", 6000.0)]))


def test_a_silent_server_s_granted_room_is_not_given_out_again():
    """ann (8,000 MiB hibernated) is granted room for a2 (6,000 MiB) and falls silent (her
    report older than max_staleness). host_holders counts her, having no slice, at her last
    word (8,000: a2 is not in it), and HostRoom.reserved no longer counts the room held for a2
    because she is silent ('it counts at its whole share already'): that share is only her
    last word. bob's 6,000 MiB is granted: 8,000 + 6,000 + 6,000 = 20,000 MiB on a 16,000 MiB
    budget. Her silence freed the room she was given."""
    now = time.time()
    culler = _no_slice_culler()
    _says(culler, "ann", now, hibernated=[("a1", 8000.0, now - 600)], wants=[("a2", 6000.0)])
    answer = _says(culler, "bob", now + 400, wants=[("b1", 6000.0)])
    swap = answer.get("swap") or {}
    assert "host_room" not in swap, f"room given out of ann's granted room: {swap}"


def test_a_server_that_never_reports_is_warned_of_once_the_culler_has_run_a_while(caplog):
    """Just started, the culler has heard from no server: no warning for each. One that still
    has not reported after max_staleness is warned of, once (it may run without the extension,
    or with the culler's address missing: an operator needs to know its node is short)."""
    import logging

    now = time.time()
    culler = _culler("ann", "bob")
    culler._began = now
    culler.log.propagate = True  # into pytest's caplog
    caplog.set_level(logging.WARNING)
    _says(culler, "bob", now + 10, wants=[("b1", 1000.0)])
    assert "has not reported" not in caplog.text
    _says(culler, "bob", now + 400, wants=[("b1", 1000.0)])
    _says(culler, "bob", now + 460, wants=[("b1", 1000.0)])
    assert caplog.text.count("has not reported since the culler started") == 1, caplog.text
