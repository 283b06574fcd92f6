"""A node whose GPUs cannot be read is not a node without GPUs (unoffered_since stays None).

`SummedCounter.result` set `unpublished` wherever no serving node's count said anything, and
LiveCapacity then `unoffered_since`: the spawner's "None of the nodes of <pool> offers a GPU
to Kubernetes now ... This does not change by itself", the pod out of line. But a count says
nothing also where it could not be read: a counter that raised (live.py `_count`: "counts as
silent") or a HAMi registration annotation in a form the parser does not know (another HAMi
version). Unknown is never read as none: those keep the plain wait.
"""

from __future__ import annotations

import copy

from fracspawner.backends import load_catalog
from fracspawner.backends.fit import ResourceFit
from fracspawner.capacity import compute_capacity
from tests.test_admission import NODES
from tests.test_waiting_line import CATALOG

HAMI_CATALOG = {
    "pools": {
        "hami": {
            "gpu": "H100-80GB",
            "backend": "hami",
            "node_selector": {"pool": "hami"},
            "offers": ["1/4"],
        }
    }
}


def _node(labels: dict, annotations: dict) -> dict:
    return {
        "metadata": {"name": "n1", "labels": labels, "annotations": annotations},
        "spec": {},
        "status": {
            "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def test_a_counter_that_fails_is_unknown_not_unoffered(monkeypatch):
    def broken(self, slot):
        raise RuntimeError("odd node")

    monkeypatch.setattr(ResourceFit, "count_node", broken)
    counts = compute_capacity(load_catalog(CATALOG), [copy.deepcopy(NODES[0])], []).get("t4", "1/4")
    assert counts.free is None
    assert counts.unoffered_since is None, counts


def test_a_hami_registration_not_understood_is_unknown_not_unoffered():
    catalog = load_catalog(HAMI_CATALOG)
    junk = _node({"pool": "hami"}, {"hami.io/node-nvidia-register": "a form of a newer HAMi"})
    assert compute_capacity(catalog, [junk], []).get("hami", "1/4").unoffered_since is None
    # the annotation absent: the plugin never registered (8b34f0f's case, kept)
    absent = _node({"pool": "hami"}, {})
    assert compute_capacity(catalog, [absent], []).get("hami", "1/4").unoffered_since == 0.0
