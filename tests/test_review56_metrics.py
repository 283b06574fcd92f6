"""Review 56: the Prometheus metrics against Prometheus' own conventions
(https://prometheus.io/docs/practices/naming/, /instrumentation/): series of objects that are
gone are removed, labels come from bounded sets, counters are counters, base units."""

from __future__ import annotations

from typing import Any

from fracspawner.hub.admin import PoolMetrics


def pool(name: str, held: int, offers: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "held": held,
        "waiting": 0,
        "held_gpu": held * 0.5,
        "free_gpu": 1.0,
        "idle_held_gpu": 0.0,
        "offers": offers or [{"spec": "0.5", "free": 2}],
    }


def test_pool_gauges_of_a_pool_gone_from_the_model_are_removed():
    # a pool removed from the catalog is still listed while pods hold it (capacity/usage.py
    # pool_usage: "a pool the catalog no longer has"); once its last pod ends it leaves the
    # model, and its series must go with it, not read "1 held" forever
    metrics = PoolMetrics()
    value = metrics.registry.get_sample_value
    metrics.update({"stale": False, "pools": [pool("t4", 1), pool("old", 1)]})
    assert value("fracspawner_pool_slices", {"pool": "old", "state": "held"}) == 1
    metrics.update({"stale": False, "pools": [pool("t4", 1)]})
    for name, labels in (
        ("fracspawner_pool_slices", {"pool": "old", "state": "held"}),
        ("fracspawner_pool_slices", {"pool": "old", "state": "waiting"}),
        ("fracspawner_pool_gpu_equivalents_held", {"pool": "old"}),
        ("fracspawner_pool_gpu_equivalents_free", {"pool": "old"}),
        ("fracspawner_pool_gpu_equivalents_idle_held", {"pool": "old"}),
        ("fracspawner_pool_offer_free_slices", {"pool": "old", "offer": "0.5"}),
    ):
        assert value(name, labels) is None, (name, labels)
    assert value("fracspawner_pool_slices", {"pool": "t4", "state": "held"}) == 1
    # an offer a pool no longer lists goes too
    metrics.update({"stale": False, "pools": [pool("t4", 1, [{"spec": "0.25", "free": 4}])]})
    assert value("fracspawner_pool_offer_free_slices", {"pool": "t4", "offer": "0.5"}) is None
    assert value("fracspawner_pool_offer_free_slices", {"pool": "t4", "offer": "0.25"}) == 4


def test_kubeflow_culler_pool_label_is_never_a_tenants_pod_label(tmp_path):
    # a Notebook's pod labels are its namespace's members' to write (its pod template; and
    # `kubectl label pod`): a pool label the catalog lacks must not become a series of its own,
    # or a tenant relabelling a pod each cycle grows the culler's registry without bound
    import asyncio
    import time

    import yaml

    from fracspawner.culler.kubeflow import KubeflowCuller, Notebook
    from tests.test_kubeflow_culler import CATALOG

    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(yaml.safe_dump(CATALOG))
    app = KubeflowCuller()
    app.initialize([f"--catalog={catalog}", "--status-url="])
    now = time.time()

    def notebook(pool: str) -> Notebook:
        labels = {"notebook-name": "nb", "fracspawner.io/gpu": "0.25", "fracspawner.io/pool": pool}
        pod = {
            "metadata": {"name": "nb-0", "namespace": "alice", "labels": labels},
            "status": {"phase": "Running", "startTime": "2020-01-01T00:00:00Z"},
        }
        return Notebook("Notebook", "alice", "nb", pod, False, None)

    for pool in ("t4", "made-up-1", "made-up-2"):
        outcome = app.judge(notebook(pool), None, {}, now)
        assert outcome.decision.gpu_failsafe  # activity unknown: counted as a failsafe
        asyncio.run(app.act(outcome, now))
    pools = {
        s.labels["pool"]
        for family in app.metrics.registry.collect()
        for s in family.samples
        if "pool" in s.labels
    }
    assert pools == {"t4", ""}
