"""fracspawner.choice.admission: usage from the hub's state and the watch, in-flight holds taken
off capacity, one check-and-reserve at a time under asyncio concurrency."""

from __future__ import annotations

import asyncio
import math

import pytest

from fracspawner.backends import load_catalog
from fracspawner.capacity import Capacity, OfferCapacity, compute_capacity
from fracspawner.choice.admission import (
    Admissions,
    Hold,
    ReservedCapacity,
    Usage,
    check_usage_known,
    hold_for,
    user_usage,
)
from fracspawner.choice.options import OptionsError, resolve_choice
from fracspawner.model.catalog import AccessRule

# one time-sliced T4 of four 1/4 slots (tests/test_waiting_line.py uses it too)
T4_POOL = {
    "gpu": "T4",
    "backend": "timeslicing",
    "replicas": 4,
    "node_selector": {"nvidia.com/gpu.product": "Tesla-T4-SHARED"},
    "offers": ["1/4"],
}
CATALOG = load_catalog(
    {
        "pools": {
            "t4": T4_POOL,
            "a100-mig": {
                "gpu": "A100-80GB",
                "backend": "mig-mixed",
                "node_selector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
                "offers": ["mig-1g.10gb", "mig-3g.40gb"],
            },
            "h100": {
                "gpu": "H100-80GB",
                "backend": "hami",
                "node_selector": {"gpu": "on"},
                "offers": ["1/4", "1/2", "1"],
            },
        },
        "images": {"base": {"image": "quay.io/jupyter/base-notebook", "default": True}},
        "access": {"default": {"pools": "all", "max_gpu": None}},
    }
)
EVERYONE = AccessRule(pools=None, max_gpu=None)


def node(name: str, labels: dict, capacity: dict) -> dict:
    ready = [{"type": "Ready", "status": "True"}]
    return {
        "metadata": {"name": name, "labels": labels},
        "status": {"capacity": capacity, "allocatable": capacity, "conditions": ready},
    }


def pod(name: str, node_name: str | None, limits: dict, uid: str = "", **annotations) -> dict:
    return {
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": uid or f"uid-{name}",
            "annotations": annotations,
        },
        "spec": {
            "nodeName": node_name,
            "containers": [{"name": "c", "resources": {"limits": limits}}],
        },
        "status": {"phase": "Running" if node_name else "Pending"},
    }


NODES = [
    node(
        "t4",
        {"nvidia.com/gpu.product": "Tesla-T4-SHARED", "nvidia.com/gpu.replicas": "4"},
        {"cpu": "8", "memory": "32Gi", "pods": "110", "nvidia.com/gpu": "4"},
    ),
    node(
        "a100",
        {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
        {
            "cpu": "8",
            "memory": "32Gi",
            "pods": "110",
            "nvidia.com/mig-1g.10gb": "2",
            "nvidia.com/mig-3g.40gb": "1",
        },
    ),
]
TWO_T4_JOBS = [pod(f"job-{i}", "t4", {"nvidia.com/gpu": "1"}) for i in range(2)]


def choose(spec: str, pool: str, capacity, user: str = "u", server: str = ""):
    choice = resolve_choice(CATALOG, {"gpu": spec, "pool": pool}, rule=EVERYONE, capacity=capacity)
    return hold_for(choice, user=user, server=server, pod=("default", f"jupyter-{user}{server}"))


# --------------------------------------------------------------------------- usage
def test_usage_counts_in_flight_servers_the_watch_cannot_see_yet():
    # "two" was admitted a moment ago: no pod yet, the hub's hold says 0.25
    usage = user_usage({"one": 0.25, "two": 0.25}, watch={"one": 0.25}, watch_total=0.25)
    assert usage == Usage(0.5)


def test_usage_without_a_watch_comes_from_the_hub_alone():
    assert user_usage({"one": 0.125, "two": 0.0}) == Usage(0.125)


def test_usage_the_hub_does_not_know_comes_from_the_watch_or_is_unknown():
    assert user_usage({"old": None}, watch={"old": 0.5}, watch_total=0.5) == Usage(0.5)
    # no watch to ask: unknown, never zero
    usage = user_usage({"old": None, "one": 0.25})
    assert not usage.known and usage.unknown == ("old",)


def test_pods_of_deleted_servers_still_count():
    usage = user_usage({"one": 0.25}, watch={"one": 0.25}, watch_total=0.75)
    assert usage == Usage(0.75)


def test_unknown_usage_refuses_gpu_not_cpu_nor_admins_nor_unlimited_rules():
    gpu = resolve_choice(CATALOG, {"gpu": "1/4", "pool": "t4"}, rule=EVERYONE)
    cpu = resolve_choice(CATALOG, {"gpu": "none"}, rule=EVERYONE)
    limited = AccessRule(pools=None, max_gpu=1.0)
    unknown = Usage(0.0, ("", "big"))
    with pytest.raises(OptionsError) as info:
        check_usage_known(gpu, limited, unknown, admin=False)
    message = str(info.value)
    assert "your default server, server 'big'" in message and "cannot be checked" in message
    check_usage_known(cpu, limited, unknown, admin=False)
    check_usage_known(gpu, limited, unknown, admin=True)
    check_usage_known(gpu, EVERYONE, unknown, admin=False)


@pytest.mark.parametrize(
    "state",
    [
        None,
        "x",
        {},
        {"gpu_equivalent": "0.25"},
        {"gpu_equivalent": math.nan},
        {"gpu_equivalent": -1},
        {"gpu_equivalent": True},
        {"gpu_equivalent": math.inf},
    ],
)
def test_a_hold_is_only_restored_from_valid_state(state):
    assert Hold.from_state("u", "", state) is None


def test_a_hold_round_trips_through_state():
    hold = choose("1/4", "t4", None)
    again = Hold.from_state("u", "", hold.to_state())
    assert (again.pool, again.spec, again.gpu_equivalent) == ("t4", "1/4", 0.25)


# --------------------------------------------------------------------------- capacity
def test_in_flight_spawns_take_free_slots_until_their_pods_are_counted():
    capacity = compute_capacity(CATALOG, NODES, TWO_T4_JOBS)
    assert capacity.get("t4", "1/4").free == 2
    holds = [choose("1/4", "t4", capacity, user=f"u{i}") for i in range(2)]
    view = ReservedCapacity(capacity, CATALOG, holds)
    counts = view.get("t4", "1/4")
    assert (counts.free, counts.total) == (0, 4) and "2 being started" in counts.note
    with pytest.raises(OptionsError, match=r"No 1/4 GPU is free on .* \(all 4 are taken\)"):
        resolve_choice(CATALOG, {"gpu": "1/4", "pool": "t4"}, rule=EVERYONE, capacity=view)


def test_a_mig_profile_in_flight_does_not_take_other_profiles():
    capacity = compute_capacity(CATALOG, NODES, [])
    view = ReservedCapacity(capacity, CATALOG, [choose("mig-1g.10gb", "a100-mig", capacity)])
    assert view.get("a100-mig", "mig-1g.10gb").free == 1
    assert view.get("a100-mig", "mig-3g.40gb").free == 1  # its own resource: untouched


def test_a_fraction_in_flight_takes_what_it_may_occupy_of_other_offers():
    # HAMi books fractions of the same devices: a 1/4 in flight may take the last quarter of
    # a GPU (one 1/2, one whole GPU); a 1/2 in flight may take two quarters
    capacity = Capacity(
        pools={
            "h100": {
                "1/4": OfferCapacity(8, 8),
                "1/2": OfferCapacity(4, 4),
                "1": OfferCapacity(2, 2),
            }
        },
        nodes_seen=1,
    )
    view = ReservedCapacity(capacity, CATALOG, [choose("1/4", "h100", None)])
    assert [view.get("h100", s).free for s in ("1/4", "1/2", "1")] == [7, 3, 1]
    view = ReservedCapacity(capacity, CATALOG, [choose("1/2", "h100", None)])
    assert [view.get("h100", s).free for s in ("1/4", "1/2", "1")] == [6, 3, 1]
    view = ReservedCapacity(capacity, CATALOG, [choose("1", "h100", None)])
    assert [view.get("h100", s).free for s in ("1/4", "1/2", "1")] == [4, 2, 1]


def test_unknown_counts_stay_unknown():
    capacity = compute_capacity(CATALOG, [], [])
    view = ReservedCapacity(capacity, CATALOG, [choose("1/4", "t4", capacity)])
    assert view.get("t4", "1/4").free is None


def test_settle_waits_for_the_new_pod_bound_to_a_node():
    admissions = Admissions()
    capacity = compute_capacity(CATALOG, NODES, [])
    old = pod("jupyter-u", "t4", {"nvidia.com/gpu": "1"}, uid="old")
    hold = choose("1/4", "t4", capacity)
    admissions.reserve(Hold(**{**hold.__dict__, "stale_uid": "old"}))
    cache: dict = {("default", "jupyter-u"): old}

    def pod_of(namespace: str, name: str):
        return cache.get((namespace, name))

    admissions.settle(pod_of)  # the old pod of that name, still terminating
    assert admissions.held_by("u", "")
    cache[("default", "jupyter-u")] = pod("jupyter-u", None, {"nvidia.com/gpu": "1"}, uid="new")
    admissions.settle(pod_of)  # created, not yet scheduled: capacity does not count it
    assert admissions.held_by("u", "")
    cache[("default", "jupyter-u")] = pod("jupyter-u", "t4", {"nvidia.com/gpu": "1"}, uid="new")
    admissions.settle(pod_of)
    assert admissions.held_by("u", "") is None


def test_cpu_only_choices_reserve_nothing():
    admissions = Admissions()
    choice = resolve_choice(CATALOG, {"gpu": "none"}, rule=EVERYONE)
    admissions.reserve(hold_for(choice, user="u", server=""))
    assert admissions.in_flight() == []


async def test_concurrent_admissions_for_the_last_slots_admit_exactly_that_many():
    """Twelve spawns race for two free T4 slots; each awaits between its check and its
    reservation (as a real admission may). Under the lock, exactly two pass."""
    admissions = Admissions()
    capacity = compute_capacity(CATALOG, NODES, TWO_T4_JOBS)

    async def spawn(i: int) -> bool:
        async with admissions.lock:
            view = ReservedCapacity(capacity, CATALOG, admissions.in_flight())
            try:
                hold = choose("1/4", "t4", view, user=f"u{i}")
            except OptionsError:
                return False
            await asyncio.sleep(0)  # any await here would let the others in without the lock
            admissions.reserve(hold)
            return True

    results = await asyncio.gather(*(spawn(i) for i in range(12)))
    assert sum(results) == 2
    assert len(admissions.in_flight()) == 2


async def test_without_the_lock_the_same_race_over_admits():
    """The failure the lock prevents, shown on the same code: checks that all run before any
    reservation admit every spawn."""
    admissions = Admissions()
    capacity = compute_capacity(CATALOG, NODES, TWO_T4_JOBS)

    async def spawn(i: int) -> bool:
        view = ReservedCapacity(capacity, CATALOG, admissions.in_flight())
        try:
            hold = choose("1/4", "t4", view, user=f"u{i}")
        except OptionsError:
            return False
        await asyncio.sleep(0)
        admissions.reserve(hold)
        return True

    assert sum(await asyncio.gather(*(spawn(i) for i in range(12)))) == 12
