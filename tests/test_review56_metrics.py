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


def test_webhook_counts_the_pods_and_claims_it_refuses_on_an_error():
    # a bug refuses the pod (answered allowed: false, reason "error"): the admissions and
    # refusals counters must see it, or a webhook refusing every pod shows no refusal at all
    import asyncio
    import json
    from pathlib import Path

    from tornado.httpclient import AsyncHTTPClient

    from fracspawner.backends import load_catalog
    from fracspawner.kubeflow.webhook import Webhook, make_app
    from tests.kubeflow_inprocess import FakeCluster
    from tests.kubeflow_support import admission_review, notebook_pod

    catalog = load_catalog(str(Path(__file__).parent.parent / "examples/kubeflow/catalog.yaml"))
    hook = Webhook(catalog, FakeCluster({"alice": {}}))
    hook.pods.load([])

    async def broken(*_: Any) -> Any:
        raise RuntimeError("a bug")

    hook.review = broken  # type: ignore[method-assign]
    claim = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "c1",
            "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"},
            "resource": {"group": "resource.k8s.io", "version": "v1", "resource": "resourceclaims"},
            "namespace": "alice",
            "operation": "CREATE",
            "object": {"metadata": {"name": "c", "namespace": "alice"}, "spec": {}},
        },
    }

    async def run() -> list[bool]:
        sockets = make_app(hook).listen(0, "127.0.0.1")
        port = next(iter(sockets._sockets.values())).getsockname()[1]
        http = AsyncHTTPClient(force_instance=True)
        try:
            got = []
            pod = admission_review(notebook_pod("alice", "nb"))
            for body in (pod, claim):
                resp = await http.fetch(
                    f"http://127.0.0.1:{port}/mutate", method="POST", body=json.dumps(body)
                )
                got.append(json.loads(resp.body)["response"]["allowed"])
            return got
        finally:
            http.close()
            sockets.stop()

    hook.dra = _BrokenDra()
    assert asyncio.run(run()) == [False, False]
    value = hook.metrics.registry.get_sample_value
    assert value("fracspawner_webhook_refusals_total", {"reason": "error"}) == 2
    assert (
        value("fracspawner_webhook_admissions_total", {"operation": "CREATE", "result": "refused"})
        == 2
    )


class _BrokenDra:
    """A DRA gate whose admission of a claim fails (kubeflow/claims.py review_claim)."""

    async def review_claim(self, *_: Any, **__: Any) -> Any:
        raise RuntimeError("a bug")


def test_webhook_counts_since_start_are_counters():
    # https://prometheus.io/docs/practices/naming/: an accumulating count has `_total` as a
    # suffix; the quota conflicts and unconfirmed reservations only ever grow
    from prometheus_client.parser import text_string_to_metric_families

    from fracspawner.kubeflow.metrics import WebhookMetrics

    metrics = WebhookMetrics()
    metrics.conflicts.set_function(lambda: 3)
    metrics.unconfirmed.set_function(lambda: 2)
    value = metrics.registry.get_sample_value
    assert value("fracspawner_webhook_quota_conflicts_total") == 3
    assert value("fracspawner_webhook_unconfirmed_reservations_total") == 2
    from prometheus_client import generate_latest

    types = {
        f.name: f.type
        for f in text_string_to_metric_families(generate_latest(metrics.registry).decode())
    }
    assert types["fracspawner_webhook_quota_conflicts"] == "counter"
    assert types["fracspawner_webhook_unconfirmed_reservations"] == "counter"


def test_dashboard_shows_mib_counters_in_mebibytes():
    # fracspawner_reclaimed_gpu_memory_mib_total counts MiB (2**20 bytes); Grafana's unit
    # "decmbytes" is SI megabytes (10**6), "mbytes" mebibytes (grafana-data valueFormats
    # categories.ts): 80 GiB given back read "85.9 GB"
    import json
    from pathlib import Path

    board = Path(__file__).parent.parent / "charts/fracspawner/dashboards/fracspawner.json"
    panels = json.loads(board.read_text())["panels"]
    mib = [p for p in panels if any("_mib_" in t["expr"] for t in p.get("targets", []))]
    assert mib
    for panel in mib:
        assert panel["fieldConfig"]["defaults"]["unit"] == "mbytes", panel["title"]
