"""The host memory budget follows the node (issue 36, item 2; culler/nodememory.py): by default
a share of each node's allocatable memory (its Node object's `status.allocatable.memory`, from
the culler's node watch), an explicit `Culler.host_memory_budget_mib` overrides it, and a node
whose memory is not known gets the fixed 64 GiB, never an unlimited budget."""

from __future__ import annotations

import time

import pytest
from traitlets import TraitError

from fracspawner.backends import load_catalog
from fracspawner.culler.app import Culler
from fracspawner.culler.decide import ServerFacts
from fracspawner.culler.identity import Identity
from fracspawner.culler.nodememory import (
    FALLBACK_BUDGET_MIB,
    NodeMemory,
    allocatable_mib,
    node_budget_mib,
)
from fracspawner.culler.placement import Placement
from fracspawner.culler.reports import parse_report
from tests.conftest import DEMO_CATALOG
from tests.test_host_budget import QUARTER_T4, report


def node(name: str, memory: object) -> dict:
    return {"metadata": {"name": name}, "status": {"allocatable": {"memory": memory}}}


# --- the budget of one node (pure) -----------------------------------------------------------
def test_the_budget_is_a_share_of_the_node_s_allocatable_memory():
    assert node_budget_mib(None, 0.25, 430_000.0) == 107_500.0
    assert node_budget_mib(None, 0.5, 16_384.0) == 8192.0  # a small node: less than 64 GiB


def test_an_explicit_budget_overrides_the_node_s_memory():
    assert node_budget_mib(32_768.0, 0.25, 2_000_000.0) == 32_768.0
    assert node_budget_mib(0.0, 0.25, 2_000_000.0) == 0.0  # 0: no budget, as before


@pytest.mark.parametrize("unknown", [None, 0.0, -5.0, float("nan")])
def test_unknown_node_memory_gets_the_fixed_budget_never_an_unlimited_one(unknown):
    assert node_budget_mib(None, 0.25, unknown) == FALLBACK_BUDGET_MIB == 65536.0


def test_the_node_s_memory_is_read_as_kubernetes_writes_quantities():
    assert allocatable_mib(node("n", "440Gi")) == 440 * 1024
    assert allocatable_mib(node("n", "471859200Ki")) == 450 * 1024
    assert allocatable_mib(node("n", "468G")) == pytest.approx(468e9 / 2**20)
    for bad in ("lots", "5 Gi", "", "0", "-1Gi", None, True):
        assert allocatable_mib(node("n", bad)) is None, bad
    assert allocatable_mib({"metadata": {"name": "n"}}) is None  # no status yet
    assert allocatable_mib({"status": {"allocatable": "440Gi"}}) is None


def test_the_node_index_forgets_a_node_gone_or_no_longer_readable():
    nodes = NodeMemory()
    nodes.load([node("a", "64Gi"), node("b", "468Gi"), node("c", "nonsense")])
    assert (nodes.mib("a"), nodes.mib("b"), nodes.mib("c")) == (65536.0, 479232.0, None)
    nodes.put(node("a", "garbage"))  # unreadable now: not its old figure
    nodes.drop(node("b", "468Gi"))
    assert (nodes.mib("a"), nodes.mib("b"), len(nodes)) == (None, None, 0)


def test_the_fraction_must_be_a_share():
    assert 0 < Culler().host_memory_budget_fraction <= 1
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(TraitError, match="host_memory_budget_fraction"):
            Culler(host_memory_budget_fraction=bad)


# --- the culler uses each node's memory --------------------------------------------------------
class Pods:
    """The culler's pod watch with its node watch: ann and bob on `small` (15 GiB allocatable:
    a quarter is one 1/4 T4), cat and dan on `big` (468 GiB), eve on a node no Node object
    names."""

    where = {"ann": "small", "bob": "small", "cat": "big", "dan": "big", "eve": "unseen"}

    def __init__(self) -> None:
        self.nodes = NodeMemory()
        self.nodes.load([node("small", "15Gi"), node("big", "468Gi")])

    def placement(self, name: str) -> Placement:
        return Placement(self.where[name.removeprefix("jupyter-")])


def test_the_culler_s_budget_follows_each_node_s_memory():
    culler = Culler()
    culler.server_pods = Pods()
    assert culler.host_budget("small") == 0.25 * 15 * 1024
    assert culler.host_budget("big") == 0.25 * 468 * 1024
    assert culler.host_budget("unseen") == culler.host_budget(None) == FALLBACK_BUDGET_MIB
    culler.server_pods = object()  # a pod watch without a node watch: the fallback
    assert culler.host_budget("big") == FALLBACK_BUDGET_MIB
    assert Culler(host_memory_budget_mib=4096.0).host_budget("big") == 4096.0


def test_the_same_hibernated_state_is_shut_down_on_a_small_node_and_kept_on_a_big_one():
    culler = Culler()
    culler._catalog = load_catalog(str(DEMO_CATALOG))
    culler.server_pods = Pods()
    now = time.time()
    for i, user in enumerate(("ann", "bob", "cat", "dan")):
        body = report(now, [(f"{user}-k", QUARTER_T4, now - 5000 + 100 * i, False)])
        culler.known[(user, "")] = ServerFacts(user, user_options={"gpu": "1/4", "pool": "t4"})
        culler.reports.put(user, "", parse_report(body, received_at=now))
    # small: two quarters hibernated, a budget of one: the oldest (ann's) is shut down
    (order,) = culler.answer_report(Identity("ann", ""), now)["swap"]["shutdown"]
    assert order["kernel_id"] == "ann-k" and "3840 MiB" in order["reason"]
    assert culler.answer_report(Identity("bob", ""), now) is None
    # big: the same two quarters are far within 117 GiB: kept (64 GiB would keep them too;
    # the budget is the node's share, not the fixed figure)
    assert culler.answer_report(Identity("cat", ""), now) is None
    assert culler.answer_report(Identity("dan", ""), now) is None


def test_the_culler_watches_nodes_only_where_the_budget_follows_them(monkeypatch):
    """The node watch runs beside the pod watch by default (the budget follows each node), and
    not where the admin set a budget for every node (its RBAC is then not needed)."""
    import fracspawner.culler.serverpods as serverpods

    made: list[dict] = []

    class Recorder:
        def __init__(self, namespace: str, **kw: object) -> None:
            made.append(kw)

        def start(self) -> None:
            pass

    monkeypatch.setattr(serverpods, "ServerPods", Recorder)
    for culler in (Culler(watch_server_pods=True),
                   Culler(watch_server_pods=True, host_memory_budget_mib=8192.0),
                   Culler(watch_server_pods=True, host_memory_budget_mib=0.0)):  # fmt: skip
        culler.start_server_pods()
    assert [kw["nodes"] for kw in made] == [True, False, False]
