"""The webhook's namespace GPU quota as an adversary and the chart's two replicas meet it:
two `fracspawner webhook` processes against one cluster share one quota (issue 19 item 7),
a terminating pod counts until it is gone (item 10), and forged reviews are harmless (item 12):
their reservations end within seconds, dry runs reserve nothing, a caller not known to be the
API server learns nothing about the namespace, the API server's client certificate can be
required, and a review costs no pod list.

A dry run and a terminating pod go through kube-apiserver (the webhook registered by the
export's MutatingWebhookConfiguration, kubeflow_support.register); forged reviews are posted
to the webhook directly, as a forger would; the two replicas are asked directly too (one
kube-apiserver reaches two webhook processes only through a Service, which nothing routes
to loopback processes here).

Kubernetes semantics relied on (kube-apiserver's own: the module runs on the real control plane):
- optimistic concurrency: an update naming an older metadata.resourceVersion is answered 409
  Conflict (kubernetes/community contributors/devel/sig-architecture/api-conventions.md,
  "Concurrency Control and Consistency"; apiserver registry/generic/registry/store.go Update);
- graceful deletion: DELETE of a running pod only sets deletionTimestamp and
  deletionGracePeriodSeconds (kubernetes pkg/registry/core/pod/strategy.go CheckGracefulDelete,
  default spec.terminationGracePeriodSeconds); the kubelet sends SIGTERM, waits the grace
  period, kills, and the pod object goes once its containers stopped (pkg/kubelet/status/
  status_manager.go canBeDeleted);
- AdmissionReview request.dryRun: "the modifications will definitely not be persisted";
  webhooks with side effects must skip them (k8s.io/api admission/v1 types.go AdmissionRequest
  DryRun; docs "Dynamic Admission Control", side effects).
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
import urllib.error
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from fracspawner.kubeflow.quota import (
    LocalLedger,
    PodIndex,
    Reservation,
    SharedLedger,
    decode,
    encode,
)
from tests.kubeflow_support import (
    WebhookProcess,
    admission_review,
    create_pod,
    denied,
    make_client_tls,
    make_tls,
    notebook_pod,
    profile_namespace,
    register,
    with_poddefault,
)

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "examples" / "catalogs" / "demo.yaml"
PROFILE = {"app.kubernetes.io/part-of": "kubeflow-profile"}
LEDGER_NS = "kubeflow"
#: a notebook that ignores SIGTERM, as a process stuck in CUDA teardown or a preStop sleep
#: keeps a deleted pod's container running for its whole grace period; it listens on its port
#: (devcluster's kubelet puts the pod IP for 0.0.0.0) once it does, so Ready means ignoring
STUBBORN = [
    "python",
    "-c",
    "import signal, socket, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "s = socket.socket(); s.bind(('0.0.0.0', 8888)); s.listen(); time.sleep(3600)",
]


def kubeflow_pod(namespace: str, notebook: str, pool: str, gpu: str) -> dict[str, Any]:
    selector = f"fracspawner-{pool}-{gpu.lower().replace('.', '-').replace('/', '-')}"
    return with_poddefault(notebook_pod(namespace, notebook), pool, gpu, selector)


# --------------------------------------------------------------------------- in process
def running_pod(name: str, gpu: str, **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": "ns",
            "name": name,
            "annotations": {"fracspawner.io/gpu-equivalent": gpu},
            **meta,
        },
        "status": {
            "phase": "Running",
            "containerStatuses": [{"name": "nb", "state": {"running": {}}}],
        },
    }


def test_a_terminating_pod_counts_until_its_containers_stopped():
    index = PodIndex()
    index.load([running_pod("a-0", "0.25"), running_pod("b-0", "0.125")])
    deleting = running_pod("a-0", "0.25", deletionTimestamp="2026-11-25T17:00:00Z")
    index.put(deleting)  # DELETE with a grace period: the container still runs
    assert index.held("ns") == 0.375
    deleting["status"]["containerStatuses"][0]["state"] = {"terminated": {"exitCode": 137}}
    index.put(deleting)  # the kubelet killed it: the GPU is free
    assert index.held("ns") == 0.125
    index.drop(deleting)
    assert index.held("ns") == 0.125
    finished = running_pod("b-0", "0.125")
    finished["status"]["phase"] = "Succeeded"
    index.put(finished)
    assert index.held("ns") == 0.0


def _decide(index: PodIndex, quota: float, amount: float):
    def decide(pending: float) -> float:
        if index.held("ns") + pending + amount > quota + 1e-9:
            raise PermissionError("over quota")
        return amount

    return decide


async def test_a_reservation_ends_when_the_watch_saw_its_pod_or_after_its_window():
    now = [1000.0]
    index = PodIndex(clock=lambda: now[0])  # counting the annotation (quota.pod_gpu)
    index.load([])
    ledger = LocalLedger(index, window=10, clock=lambda: now[0])
    await ledger.admit("ns", "a-0", "a-0", _decide(index, 0.25, 0.25))
    with pytest.raises(PermissionError):  # reserved, not yet in the watch
        await ledger.admit("ns", "b-0", "b-0", _decide(index, 0.25, 0.125))
    # a retried create of a-0 replaces its own reservation
    await ledger.admit("ns", "a-0", "a-0", _decide(index, 0.25, 0.25))
    index.put(running_pod("a-0", "0.25"))  # the watch has it: counted from the pod once
    with pytest.raises(PermissionError):
        await ledger.admit("ns", "b-0", "b-0", _decide(index, 0.25, 0.125))
    now[0] += 1
    index.drop(running_pod("a-0", "0.25"))  # deleted: the reservation does not come back
    await ledger.admit("ns", "b-0", "b-0", _decide(index, 0.25, 0.125))
    # a generateName pod (no name: keyed by the review's uid) and a pod that never comes:
    # both end with the window
    await ledger.admit("ns", "uid-1", "", _decide(index, 0.25, 0.125))
    with pytest.raises(PermissionError):
        await ledger.admit("ns", "c-0", "c-0", _decide(index, 0.25, 0.125))
    now[0] += 10
    await ledger.admit("ns", "c-0", "c-0", _decide(index, 0.25, 0.25))


async def test_a_dry_run_reserves_nothing_in_process():
    index = PodIndex()
    index.load([])
    ledger = LocalLedger(index)
    for _ in range(3):
        await ledger.admit("ns", "a-0", "a-0", _decide(index, 0.25, 0.25), dry_run=True)
    await ledger.admit("ns", "b-0", "b-0", _decide(index, 0.25, 0.25))
    assert ledger.total() == 0.25


class Records:
    """An API object per namespace with the API server's optimistic concurrency: a write
    naming an older resourceVersion is refused (409 Conflict), and each read or write yields
    to the event loop, as a network round trip does."""

    def __init__(self) -> None:
        self.objects: dict[str, tuple[str, int]] = {}
        self.conflicts = 0

    async def read(self, namespace: str) -> tuple[str | None, str | None]:
        await asyncio.sleep(0)
        text, version = self.objects.get(namespace, (None, 0))
        return text, str(version) if text is not None else None

    async def write(self, namespace: str, text: str, version: str | None) -> bool:
        await asyncio.sleep(0)
        current = self.objects.get(namespace, (None, 0))[1]
        if (version is None and namespace in self.objects) or (
            version is not None and int(version) != current
        ):
            self.conflicts += 1
            return False
        self.objects[namespace] = (text, current + 1)
        return True


async def test_two_replicas_sharing_one_record_never_overrun_the_quota():
    records = Records()
    replicas = []
    for _ in range(2):
        index = PodIndex()
        index.load([])
        replicas.append((index, SharedLedger(records, index, 60)))

    async def one(i: int) -> bool:
        index, ledger = replicas[i % 2]
        try:
            await ledger.admit("ns", f"nb{i}-0", f"nb{i}-0", _decide(index, 0.25, 0.125))
        except PermissionError:
            return False
        return True

    results = await asyncio.gather(*(one(i) for i in range(10)))
    assert sum(results) == 2
    assert records.conflicts > 0  # the replicas did race, and the loser counted again
    assert len(decode(records.objects["ns"][0])) == 2


def test_a_record_that_is_not_reservations_counts_nothing():
    assert decode("not json") == {} and decode("[1]") == {}
    text = encode({"a-0": Reservation("a-0", 0.25, 5.0)})
    broken = json.loads(text) | {"x": {"pod": "x"}, "y": {"pod": "y", "gpu": "nan", "at": 1}}
    assert decode(json.dumps(broken)) == {"a-0": Reservation("a-0", 0.25, 5.0)}


# --------------------------------------------------------------------------- processes
@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    return make_tls(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def catalog(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("catalog") / "catalog.yaml"
    path.write_text(DEMO.read_text())  # h100 up to 0.25 GPU per namespace by default
    return path


@pytest.fixture(scope="module")
def api(devcluster):
    client = devcluster.client()
    for name in ("twice", "stubborn", "forged", "quiet", "certs", "cost", "dry", LEDGER_NS):
        if name != LEDGER_NS:
            profile_namespace(client, name, PROFILE)
            continue
        status, body = client.request("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
        assert status == 201, body
    return client


def start(catalog: Path, devcluster, tls, folder: Path, *args: str, **kw: Any) -> WebhookProcess:
    folder.mkdir(parents=True, exist_ok=True)
    return WebhookProcess(catalog, devcluster.kubeconfig, tls, folder / "webhook.log", args, **kw)


def review(webhook: WebhookProcess, pod: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return webhook.review(admission_review(pod, **kw))


def test_two_webhook_processes_hold_one_namespace_quota(api, devcluster, tls, catalog, tmp_path):
    shared = ("--detailed-refusals", "--ledger-namespace", LEDGER_NS)
    replicas = [start(catalog, devcluster, tls, tmp_path / f"r{i}", *shared) for i in range(2)]
    try:
        pods = [kubeflow_pod("twice", f"nb{i}", "h100", "0.125") for i in range(10)]
        with ThreadPoolExecutor(10) as pool:
            answers = list(pool.map(lambda i: review(replicas[i % 2], pods[i]), range(10)))
        assert sum(a["allowed"] for a in answers) == 2  # 2 x 0.125 = the 0.25 quota
        refused = [a["status"]["message"] for a in answers if not a["allowed"]]
        assert all("0.25 of its 0.25 GPU quota" in m for m in refused), refused
        # both replicas admitted or refused from the one record in the webhook's namespace
        status, record = api.request(
            "GET", f"/api/v1/namespaces/{LEDGER_NS}/configmaps/fracspawner-quota.twice"
        )
        assert status == 200, record
        assert len(json.loads(record["data"]["reservations"])) == 2
    finally:
        for replica in replicas:
            replica.stop()


def test_a_dry_run_writes_no_reservation(api, devcluster, tls, catalog, tmp_path):
    """`kubectl apply --dry-run=server`: kube-apiserver calls the webhook with dryRun (its
    configuration says sideEffects NoneOnDryRun), and no reservation is written."""
    webhook = start(catalog, devcluster, tls, tmp_path, "--ledger-namespace", LEDGER_NS)
    try:
        register(api, webhook, "dry.slices.webhook.fracspawner.io", "dry")
        for i in range(3):
            status, dry = create_pod(
                api, kubeflow_pod("dry", f"d{i}", "h100", "0.25"), dry_run=True
            )
            assert status == 201, dry  # the answer is the real one
            assert dry["metadata"]["annotations"]["fracspawner.io/gpu-equivalent"] == "0.25"
        status, _ = api.request(
            "GET", f"/api/v1/namespaces/{LEDGER_NS}/configmaps/fracspawner-quota.dry"
        )
        assert status == 404
        status, body = create_pod(api, kubeflow_pod("dry", "real", "h100", "0.25"), dry_run=False)
        assert status == 201, body
    finally:
        webhook.stop()


def _wait(predicate, what: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def test_a_terminating_pod_still_counts_until_it_is_gone(api, devcluster, tls, catalog, tmp_path):
    webhook = start(catalog, devcluster, tls, tmp_path, "--detailed-refusals")
    base = "/api/v1/namespaces/stubborn/pods"
    try:
        register(api, webhook, "stubborn.slices.webhook.fracspawner.io", "stubborn")
        pod = kubeflow_pod("stubborn", "hog", "h100", "0.25")
        pod["spec"]["containers"][0]["command"] = STUBBORN
        pod["spec"]["terminationGracePeriodSeconds"] = 3600
        status, body = create_pod(api, pod)
        assert status == 201, body
        _wait(lambda: ready(api.request("GET", f"{base}/hog-0")[1]), "the pod never got ready")
        status, deleted = api.request("DELETE", f"{base}/hog-0")
        assert status == 200 and deleted["metadata"]["deletionTimestamp"], deleted
        # still there, its container still running (it ignores SIGTERM for an hour)
        status, terminating = api.request("GET", f"{base}/hog-0")
        assert status == 200 and terminating["metadata"]["deletionGracePeriodSeconds"] == 3600
        next_pod = kubeflow_pod("stubborn", "next", "h100", "0.25")
        time.sleep(1)  # the watch has the deletion (a refusal below must not be a stale count)
        status, body = create_pod(api, next_pod, dry_run=True)
        message = denied(body)
        assert message and "already hold 0.25 of its 0.25 GPU quota" in message, body
        # forced (grace 0): gone, and the GPU with it
        status, _ = api.request("DELETE", f"{base}/hog-0?gracePeriodSeconds=0")
        assert status == 200
        _wait(lambda: api.request("GET", f"{base}/hog-0")[0] == 404, "the pod stayed")
        _wait(lambda: create_pod(api, next_pod, dry_run=True)[0] == 201, "still counted")
    finally:
        api.request("DELETE", f"{base}/hog-0?gracePeriodSeconds=0")
        webhook.stop()


def test_a_forged_review_reserves_for_seconds_only(api, devcluster, tls, catalog, tmp_path):
    from fracspawner.kubeflow.webhook import _parser

    # the default window (the helper's 300 s replaced by the default)
    default = str(_parser().get_default("reservation_ttl"))
    # --detailed-refusals: dry runs are checked against the quota (the probe below), as for a
    # verified caller; a review from a non-pod address is the API server's as far as it knows
    flags = ("--reservation-ttl", default, "--detailed-refusals")
    webhook = start(catalog, devcluster, tls, tmp_path, *flags)
    try:
        # anyone reaching /mutate claims the namespace's whole quota for a pod never created
        forged = review(webhook, kubeflow_pod("forged", "ghost", "h100", "0.25"))
        assert forged["allowed"] is True
        real = kubeflow_pod("forged", "real", "h100", "0.125")
        assert review(webhook, real, dry_run=True)["allowed"] is False
        started = time.monotonic()
        _wait(lambda: review(webhook, real, dry_run=True)["allowed"], "reserved too long", 30)
        assert time.monotonic() - started < 30  # not a minute, as before
    finally:
        webhook.stop()


def test_the_default_window_is_seconds(catalog, tls, tmp_path):
    from fracspawner.kubeflow.webhook import _parser

    args = _parser().parse_args(["--catalog", "c", "--tls-cert", "c", "--tls-key", "k"])
    assert args.reservation_ttl <= 15


def test_refusals_to_an_unknown_caller_say_nothing_about_the_namespace(
    api, devcluster, tls, catalog, tmp_path
):
    webhook = start(catalog, devcluster, tls, tmp_path, "--reservation-ttl", "300")
    try:
        assert review(webhook, kubeflow_pod("quiet", "first", "h100", "0.25"))["allowed"]
        quota = review(webhook, kubeflow_pod("quiet", "second", "h100", "0.125"))
        access = review(webhook, kubeflow_pod("quiet", "mig", "a100-mig", "mig-1g.10gb"))
        for answer in (quota, access):
            assert answer["allowed"] is False
            message = answer["status"]["message"]
            # nothing of the namespace's usage, quota or pools: the caller may not be the API
            # server, and may not read that namespace
            for secret in ("0.25", "quota (", "Pools you may use", "h100", "left)"):
                assert secret not in message, message
        assert quota["status"]["message"] == (
            "fracspawner refused this pod's GPU slice in namespace quiet: the namespace has no "
            "GPU quota left for it"
        )
        assert access["status"]["message"].endswith("the namespace may not use it")
    finally:
        webhook.stop()


def test_with_client_ca_only_the_api_servers_certificate_gets_answers(
    api, devcluster, tls, catalog, tmp_path
):
    server = make_client_tls(tmp_path / "apiserver", "kube-apiserver")
    intruder = make_client_tls(tmp_path / "intruder", "someone")
    # a certificate the same CA signed for another name (kubeadm's CA signs users too)
    other = make_client_tls(tmp_path / "other", "kubelet")
    (tmp_path / "cas.pem").write_bytes(server["ca"].read_bytes() + other["ca"].read_bytes())
    flags = ("--client-ca", str(tmp_path / "cas.pem"), "--client-name", "kube-apiserver")
    webhook = start(catalog, devcluster, tls, tmp_path / "wh", *flags, client=server)
    try:
        assert review(webhook, kubeflow_pod("certs", "first", "h100", "0.25"))["allowed"]
        refused = review(webhook, kubeflow_pod("certs", "second", "h100", "0.125"))
        # the API server asked: its user may be told the namespace's numbers
        assert "already hold 0.25 of its 0.25 GPU quota" in refused["status"]["message"]
        body = json.dumps(admission_review(kubeflow_pod("certs", "x", "h100", "0.125"))).encode()
        # a certificate the CA did not sign: no connection
        context = ssl.create_default_context(cafile=str(tls["ca"]))
        context.load_cert_chain(str(intruder["cert"]), str(intruder["key"]))
        webhook.context = context
        with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
            webhook.request("POST", "/mutate", body)
        # no certificate (the kubelet's probes: /healthz answers), or another name: 403
        webhook.context = ssl.create_default_context(cafile=str(tls["ca"]))
        assert webhook.request("GET", "/healthz") == (200, b"ok\n")
        assert webhook.request("POST", "/mutate", body)[0] == 403
        webhook.context.load_cert_chain(str(other["cert"]), str(other["key"]))
        assert webhook.request("POST", "/mutate", body)[0] == 403
    finally:
        webhook.stop()


async def test_a_review_costs_no_pod_list(api, devcluster, catalog, monkeypatch):
    """Bounded cost: the pods come from one watch; each review reads memory, and a slice pod
    in a quota namespace costs the two calls of its reservation record, never a pod list."""
    from kubernetes_asyncio.client import rest

    from fracspawner.backends import load_catalog
    from fracspawner.capacity.apiconfig import load_configuration
    from fracspawner.kubeflow.admission import parse_review
    from fracspawner.kubeflow.cluster import Cluster
    from fracspawner.kubeflow.webhook import Webhook

    calls: list[tuple[str, str]] = []
    original = rest.RESTClientObject.request

    async def recording(self, method, url, *args, **kwargs):
        calls.append((method, url.split("?")[0]))
        return await original(self, method, url, *args, **kwargs)

    monkeypatch.setattr(rest.RESTClientObject, "request", recording)
    cluster = Cluster(await load_configuration(str(devcluster.kubeconfig)))
    webhook = Webhook(load_catalog(str(catalog)), cluster, ledger_namespace=LEDGER_NS)
    webhook.start()
    try:
        for i in range(20):
            pod = kubeflow_pod("cost", f"nb{i}", "h100", "0.125")
            body = json.dumps(admission_review(pod, dry_run=i % 2 == 1)).encode()
            await webhook.review(parse_review(body))
    finally:
        await webhook.stop()
        await cluster.close()
    pod_calls = [c for c in calls if c[1].endswith("/pods")]
    assert len(pod_calls) <= 2, pod_calls  # the watch's list (and its watch request)
    assert len(calls) <= 2 + 1 + 2 * 20, calls  # + the namespace, + record read and write


async def test_a_stale_write_of_the_record_is_a_409_from_the_api_and_counts_again(api, devcluster):
    """Two replicas' ledgers over ConfigMaps in devcluster: replica A reads the record, B
    admits meanwhile, A's write (its resourceVersion now stale) is answered 409 Conflict by
    the API server, and A counts again with B's reservation: over the quota, refused."""
    from fracspawner.capacity.apiconfig import load_configuration
    from fracspawner.kubeflow.cluster import Cluster

    cluster = Cluster(await load_configuration(str(devcluster.kubeconfig)))
    index = PodIndex()
    index.load([])
    replica_b = SharedLedger(cluster.records(LEDGER_NS), index, 60)

    class Interleaved:
        """Replica A's records: B's admission lands between A's first read and its write."""

        def __init__(self, records: Any) -> None:
            self.records, self.reads, self.b_admits, self.quota = records, 0, "b-0", 0.25

        async def read(self, namespace: str) -> tuple[str | None, str | None]:
            found = await self.records.read(namespace)
            self.reads += 1
            if self.reads == 1:
                pod = self.b_admits
                await replica_b.admit("cas", pod, pod, _decide(index, self.quota, 0.125))
            return found

        async def write(self, namespace: str, text: str, version: str | None) -> bool:
            return await self.records.write(namespace, text, version)

    records_a = Interleaved(cluster.records(LEDGER_NS))
    replica_a = SharedLedger(records_a, index, 60)
    try:
        # the first write creates the record: B's create wins, A's create is AlreadyExists
        await replica_a.admit("cas", "a-0", "a-0", _decide(index, 0.25, 0.125))
        assert (replica_a.conflicts, records_a.reads) == (1, 2)
        # now an update: A read version n (a-0, b-0), B wrote n+1 (d-0), A's update at n is
        # a 409; A counts again: 0.375 held + 0.125 is over 0.45
        records_a.reads, records_a.b_admits, records_a.quota = 0, "d-0", 0.45
        with pytest.raises(PermissionError):
            await replica_a.admit("cas", "c-0", "c-0", _decide(index, 0.45, 0.125))
        assert (replica_a.conflicts, records_a.reads) == (2, 2)
    finally:
        await cluster.close()
    status, record = api.request(
        "GET", f"/api/v1/namespaces/{LEDGER_NS}/configmaps/fracspawner-quota.cas"
    )
    assert status == 200
    assert sorted(json.loads(record["data"]["reservations"])) == ["a-0", "b-0", "d-0"]


async def test_a_watch_refused_after_every_list_backs_off(monkeypatch):
    """The pod watch never gives up, but a watch the API server refuses each time (a role
    without `watch`) must not relist in a tight loop: the backoff grows until a watch
    delivers, as client-go's Reflector does; a 410 Gone relists at once."""
    from kubernetes_asyncio.client import ApiException

    from fracspawner.kubeflow import cluster as cluster_module

    class Response:
        status, reason = 200, "OK"

        async def read(self) -> bytes:
            return b'{"items": [], "metadata": {"resourceVersion": "1"}}'

    class V1:
        lists = 0

        async def list_pod_for_all_namespaces(self, **kwargs: Any) -> Any:
            if kwargs.get("watch"):
                raise ApiException(status=403, reason="Forbidden")
            V1.lists += 1
            return Response()

    delays: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(delay: float) -> None:
        delays.append(delay)
        if len(delays) >= 6:
            raise asyncio.CancelledError
        await real_sleep(0)

    monkeypatch.setattr(cluster_module.asyncio, "sleep", sleep)
    watch = cluster_module.PodWatch(V1(), PodIndex())
    with pytest.raises(asyncio.CancelledError):
        await watch._run()
    assert V1.lists == 6
    assert delays[-1] > 10 * delays[0], delays  # 0.8 s doubling, not 0.8 s each time
