"""Issue 34 items 5 and 6: quota reservations a tenant cannot steer.

What a tenant does through the API (a burst of pods carrying a reservation key it wrote, claims
naming a running pod as their owner) goes through the real control plane's kube-apiserver, which
calls the webhook process registered by the export's MutatingWebhookConfiguration. The rest
runs the webhook in process (tests/kubeflow_inprocess.py: namespace labels, watches fed by hand,
a clock of its own), where what is under test is an order of events kube-apiserver and the
watches would not reliably produce (a reinvocation, a copy sent before the watch has the
first pod) or reviews only a forger sends. What is modelled (cited):
- a claim or pod created by generateName has no name at mutating admission (k8s.io/apiserver
  pkg/endpoints/handlers/create.go runs admission before the store names it); the webhook's
  JSONPatch is applied to what is stored, so an annotation it writes is on the object the
  watch then sees, and one the tenant wrote is replaced;
- AdmissionRequest.uid identifies one webhook call, userInfo the requester (set by the API
  server, not by the object); a reinvocation (reinvocationPolicy IfNeeded) is a new call with a
  new uid and the object as the earlier call patched it (k8s.io/api admission/v1 types.go);
- the resourceclaim controller makes a pod's claims from its templates with generateName and
  a controller ownerReference to the pod (kubernetes pkg/controller/resourceclaim/
  controller.go handleClaim); nothing stops a tenant from writing such an ownerReference too.
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from fracspawner.backends import load_catalog
from fracspawner.kubeflow.admission import parse_review
from fracspawner.kubeflow.webhook import Webhook
from tests.kubeflow_inprocess import FakeCluster, FakeWatch, allowed, message
from tests.kubeflow_support import (
    WebhookProcess,
    admission_review,
    create_pod,
    denied,
    make_tls,
    patched,
    profile_namespace,
    register,
)
from tests.test_dra_kubeflow import (
    CATALOG,
    H100,
    claim,
    claim_review,
    claim_spec,
    memory,
    request,
)
from tests.test_kubeflow_webhook_jobs import job_pod, owner_job

TOPOLOGY = {"nodes": [{"name": "cpu-1", "capacity": {"cpu": "8", "memory": "32Gi"}}]}
PROFILE = {"app.kubernetes.io/part-of": "kubeflow-profile"}
RESERVATION = "fracspawner.io/reservation"
EIGHTH = claim_spec(request("gpu.nvidia.com", H100, **memory("10Gi")))  # 0.125 of 0.25
QUARTER = claim_spec(request("gpu.nvidia.com", H100, **memory("20Gi")))  # the whole quota


@pytest.fixture
def webhook(monkeypatch) -> Webhook:
    """Team a's namespace holds a 0.25 GPU quota of pool h100-dra (tests/test_dra_kubeflow.py);
    claim templates are made through an API double."""
    import kubernetes_asyncio.client as k8s

    from tests.test_dra_plan import FakeResourceApi

    store: dict = {}
    monkeypatch.setattr(k8s, "ResourceV1Api", lambda client: FakeResourceApi(store))
    hook = Webhook(CATALOG, FakeCluster({"team-a": {"team": "a"}, "other": {}}))
    hook.pods.load([])
    assert hook.dra is not None
    hook.dra.watch = FakeWatch(hook.dra.claims)
    hook.dra.claims.load([])
    return hook


def generated(spec: dict[str, Any], prefix: str = "work-", **annotations: str) -> dict[str, Any]:
    """A claim as a generateName create sends it: no name yet."""
    obj = claim("team-a", "", spec)
    del obj["metadata"]["name"]
    obj["metadata"]["generateName"] = prefix
    if annotations:
        obj["metadata"]["annotations"] = dict(annotations)
    return obj


def stored(obj: dict[str, Any], answer: dict[str, Any], name: str) -> dict[str, Any]:
    """The claim as the API server stores it: the webhook's patch applied, a name given."""
    out = patched(copy.deepcopy(obj), answer["response"])
    out["metadata"]["name"] = name
    return out


# --------------------------------------------------------------------------- item 6
async def test_a_generate_name_claim_counts_once_when_the_watch_has_it(webhook):
    first = generated(EIGHTH)
    answer = await webhook.dra.review_claim(claim_review(first))
    assert allowed(answer)
    webhook.dra.claims.put(stored(first, answer, "work-x7k2p"))
    # 0.125 held by the claim the watch has; another 0.125 fits the 0.25 quota (before: the
    # claim's reservation counted beside it until its window ended, 10 s)
    second = claim("team-a", "second", EIGHTH)
    answer = await webhook.dra.review_claim(claim_review(second))
    assert allowed(answer), message(answer)


# --------------------------------------------------------------------------- item 5: pods
DEMO_DATA = yaml.safe_load(
    (Path(__file__).resolve().parent.parent / "examples/catalogs/demo.yaml").read_text()
)
ONE_GPU_DATA = {
    **DEMO_DATA,
    "access": {
        "default": {"pools": [], "max_gpu": 0},
        "groups": {"one-gpu": {"pools": "all", "max_gpu": 1}},
    },
    "kubeflow": {"namespaces": [{"labels": {"quota": "one"}, "groups": ["one-gpu"]}]},
}
ONE_GPU = load_catalog(ONE_GPU_DATA)


@pytest.fixture(scope="module")
def api(devcluster, tmp_path_factory):
    """kube-apiserver calling the webhook for namespace "jobs" (1 GPU of the demo catalog's
    pools) and, claims included, for "team-a" (0.25 GPU of pool h100-dra)."""
    from tests.test_dra_kubeflow import CATALOG_DATA

    client = devcluster.client()
    profile_namespace(client, "jobs", {**PROFILE, "quota": "one"})
    profile_namespace(client, "team-a", {**PROFILE, "team": "a"})
    folder = tmp_path_factory.mktemp("reservations")
    processes = []
    try:
        for name, data, namespace in (
            ("one", ONE_GPU_DATA, "jobs"),
            ("dra", CATALOG_DATA, "team-a"),
        ):
            catalog = folder / f"{name}.yaml"
            catalog.write_text(yaml.safe_dump(data))
            tls = make_tls(folder / f"tls-{name}")
            processes.append(
                WebhookProcess(catalog, devcluster.kubeconfig, tls, folder / f"{name}.log")
            )
            config = f"{namespace}.slices.webhook.fracspawner.io"
            register(client, processes[-1], config, namespace, claims=name == "dra")
        yield client
    finally:
        for process in processes:
            process.stop()


@pytest.fixture
def jobs() -> Webhook:
    """Namespace "jobs" holds a 1-GPU quota of the demo catalog's pools (HAMi h100)."""
    hook = Webhook(ONE_GPU, FakeCluster({"jobs": {"quota": "one"}}))
    hook.pods.load([])
    return hook


def half_gpu_job_pod(**annotations: str) -> dict[str, Any]:
    pod = job_pod(ONE_GPU, "train")  # generateName train-, half an H100
    if annotations:
        pod["metadata"]["annotations"] = dict(annotations)
    return pod


def pod_review(pod: dict[str, Any], user: str = "system:serviceaccount:kube-system:job-controller"):
    body = admission_review(pod)
    body["request"]["userInfo"]["username"] = user
    return parse_review(json.dumps(body).encode())


def key_of(pod: dict[str, Any], answer: dict[str, Any]) -> str:
    return patched(pod, answer["response"])["metadata"]["annotations"][RESERVATION]


def test_a_burst_sharing_a_tenant_set_reservation_key_cannot_overrun_the_quota(api):
    """Three half-GPU generateName pods created at once, each carrying the same reservation
    annotation the tenant wrote: two fit the 1-GPU quota, not three (before: they shared one
    reservation, and all three passed); what is stored carries keys of the webhook's own."""
    uid = owner_job(api, "train")
    burst = [job_pod(ONE_GPU, "train", uid) for _ in range(3)]
    for pod in burst:
        pod["metadata"]["annotations"] = {RESERVATION: "r-mine"}
    with ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(lambda p: create_pod(api, p), burst))
    assert sorted(status for status, _ in answers) == [201, 201, 403], answers
    (refused,) = [denied(body) for status, body in answers if status != 201]
    assert refused and "1 GPU quota" in refused, refused
    keys = {
        body["metadata"]["annotations"][RESERVATION] for status, body in answers if status == 201
    }
    assert "r-mine" not in keys and len(keys) == 2


async def test_a_reinvocation_keeps_its_key_once_and_a_copy_of_it_gets_its_own(jobs):
    first = half_gpu_job_pod()
    answer = await jobs.review(pod_review(first))
    key = key_of(first, answer)
    mutated = patched(first, answer["response"])
    # a later webhook changed the pod: the API server calls again, with a new uid
    mutated["metadata"]["labels"]["sidecar.example.com/injected"] = "true"
    again = await jobs.review(pod_review(mutated))
    assert allowed(again) and key_of(mutated, again) == key
    # the same object sent once more (a copy of the annotation in a burst) is a new pod
    copy_of = await jobs.review(pod_review(copy.deepcopy(mutated)))
    assert allowed(copy_of) and key_of(mutated, copy_of) != key
    # 0.5 + 0.5 reserved: a third half does not fit
    assert not allowed(await jobs.review(pod_review(half_gpu_job_pod())))
    # another user cannot take over a reservation it did not make
    other = await jobs.review(pod_review(copy.deepcopy(mutated), user="alice@example.org"))
    assert key_of(mutated, other) != key if allowed(other) else True


# --------------------------------------------------------------------------- item 5: claims
def test_claims_naming_an_existing_pod_as_owner_each_count(api):
    """A tenant's claims whose ownerReference names a pod already in the watch (before: they
    took that pod's name as their reservation key, which the watch had seen, so none was
    counted until the claim watch had them: all passed at once)."""
    runner = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"namespace": "team-a", "name": "runner"},
        "spec": {"containers": [{"name": "c", "image": "x"}], "schedulerName": "not-served"},
    }
    status, created = create_pod(api, runner)
    assert status == 201, created
    owner = {"apiVersion": "v1", "kind": "Pod", "name": "runner", "uid": created["metadata"]["uid"]}
    time.sleep(1)  # the webhook's pod watch has the runner
    burst = [claim("team-a", f"c{i}", EIGHTH) for i in range(3)]
    for obj in burst:
        obj["metadata"]["ownerReferences"] = [{**owner, "controller": True}]
    path = "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims"
    with ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(lambda c: api.request("POST", path, c), burst))
    assert sorted(status for status, _ in answers) == [201, 201, 403], answers


async def test_a_dry_run_claim_review_tells_no_headroom_to_an_unverified_caller(webhook):
    webhook.detailed_refusals = False  # the chart's default: the caller may not be the API server
    quarter = claim("team-a", "q", QUARTER)
    assert allowed(await webhook.dra.review_claim(claim_review(quarter)))
    webhook.dra.claims.put(quarter)
    probe = claim_review(claim("team-a", "probe", EIGHTH))
    probe["request"]["dryRun"] = True
    answer = await webhook.dra.review_claim(probe)
    # full, but a dry run does not say so (it persists nothing: the create is checked)
    assert allowed(answer), answer
    assert (
        "does not check the namespace's GPU quota on a dry run" in answer["response"]["warnings"][0]
    )
    probe["request"]["dryRun"] = False
    assert not allowed(await webhook.dra.review_claim(probe))
    # a size over the namespace's whole quota is refused on a dry run too: that says nothing
    # about what the namespace holds
    whole = claim_review(claim("team-a", "whole", claim_spec(request("gpu.nvidia.com", H100))))
    whole["request"]["dryRun"] = True
    answer = await webhook.dra.review_claim(whole)
    assert not allowed(answer) and "more than the namespace's whole GPU quota" in message(answer)


# --------------------------------------------------------------------------- item 5: sources
FORGER = "127.1.2.3"


async def _post_from(port: int, source: str, review: dict[str, Any]) -> dict[str, Any]:
    """POST /mutate over plain HTTP from the address `source`, as a process there would."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    body = json.dumps(review).encode()
    writer.write(
        b"POST /mutate HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    raw = await reader.read()
    writer.close()
    return json.loads(raw.split(b"\r\n\r\n", 1)[1])


async def test_forged_claim_reviews_from_a_node_address_are_judged_by_their_source(webhook):
    """Claim reviews for claims never created, sent from an address that is no pod's: their
    reservations end unconfirmed and, after a few, no longer hold the namespace's quota
    (before: claim reservations carried no source and were never judged)."""
    from tornado.httpserver import HTTPServer

    from devcluster.localhub import free_port
    from fracspawner.kubeflow.webhook import make_app

    now = [1000.0]
    webhook.ledger.clock = lambda: now[0]
    webhook.standings.clock = lambda: now[0]
    port = free_port()
    server = HTTPServer(make_app(webhook))
    server.listen(port, "127.0.0.1")
    try:
        for i in range(4):  # each the whole 0.25 quota, for a claim never created
            ghost = claim_review(claim("team-a", f"ghost-{i}", QUARTER))
            assert (await _post_from(port, FORGER, ghost))["response"]["allowed"]
            now[0] += 11  # its window ends without the claim
        assert webhook.standings.suspect(FORGER)
        ghost = claim_review(claim("team-a", "ghost-last", QUARTER))
        assert (await _post_from(port, FORGER, ghost))["response"]["allowed"]
        # the namespace's own claim, from the API server, gets its whole quota
        real = claim_review(claim("team-a", "real", QUARTER))
        assert allowed(await webhook.dra.review_claim(real))
    finally:
        server.stop()


async def test_naming_existing_pods_does_not_launder_a_forgers_standing(jobs):
    """Reviews naming pods the watch already has 'end with their pod' only in name: a
    reservation is confirmed by a pod that appeared after it (before: a forger mixing such
    reviews into its ghosts was never suspect)."""
    now = [1000.0]
    jobs.ledger.clock = jobs.pods.clock = jobs.standings.clock = lambda: now[0]
    existing = half_gpu_job_pod()
    existing["metadata"]["name"] = "old-0"
    del existing["metadata"]["generateName"]
    jobs.pods.put({**existing, "status": {"phase": "Running"}})
    now[0] += 60
    for i in range(4):
        ghost = half_gpu_job_pod()
        ghost["metadata"]["name"] = f"ghost-{i}"
        await jobs.review(pod_review(ghost), source=FORGER)
        await jobs.review(pod_review(existing), source=FORGER)  # names a pod that exists
        now[0] += 11
    await jobs.review(pod_review(half_gpu_job_pod()), source=FORGER)  # reads: judges the rest
    assert jobs.standings.suspect(FORGER)


async def test_a_copy_of_a_created_pods_key_gets_no_share_of_its_reservation(jobs):
    """A tenant reads the key from the pod the API server just created (the create's answer
    carries it) and sends a copy before the webhook's watch has the first pod: the first pod
    carries the key as a label too, which a consistent list finds, so the copy is a new pod
    (before: it took the first pod's reservation over, and both held the quota's room once)."""
    created: list[dict[str, Any]] = []

    async def pods_labelled(namespace: str, key: str, value: str) -> bool:
        return any((p["metadata"].get("labels") or {}).get(key) == value for p in created)

    jobs.cluster.pods_labelled = pods_labelled
    user = "alice@example.org"
    first = half_gpu_job_pod()
    answer = await jobs.review(pod_review(first, user=user))
    stored = patched(first, answer["response"])
    key = stored["metadata"]["annotations"][RESERVATION]
    assert stored["metadata"]["labels"][RESERVATION] == key
    stored["metadata"]["name"] = "train-abcde"
    created.append(stored)  # persisted; the webhook's watch does not have it yet
    copy_of = copy.deepcopy(stored)
    del copy_of["metadata"]["name"]
    second = await jobs.review(pod_review(copy_of, user=user))
    assert allowed(second) and key_of(copy_of, second) != key
    assert not allowed(await jobs.review(pod_review(half_gpu_job_pod(), user=user)))


async def test_a_notebooks_claim_takes_its_reservation_over_and_the_rest_stays_free(webhook):
    """A notebook mapped to a DRA offer reserves its slice with one claim due; the claim the
    controller makes for it takes that reservation over (once), so the namespace's other
    0.125 stays free."""
    from fracspawner.kubeflow.admission import parse_review as parse
    from tests.kubeflow_support import notebook_pod, with_poddefault

    pod = with_poddefault(notebook_pod("team-a", "nb"), "h100-dra", "10Gi", "fracspawner-h100")
    answer = await webhook.review(parse(json.dumps(admission_review(pod)).encode()))
    assert allowed(answer)
    webhook.pods.put({**patched(pod, answer["response"]), "status": {"phase": "Pending"}})
    made = generated(EIGHTH, prefix="nb-0-gpu-")
    made["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Pod", "name": "nb-0", "uid": "u", "controller": True}
    ]
    answer = await webhook.dra.review_claim(claim_review(made))
    assert allowed(answer)
    webhook.dra.claims.put(stored(made, answer, "nb-0-gpu-x7k2p"))
    other = claim("team-a", "other", EIGHTH)
    assert allowed(await webhook.dra.review_claim(claim_review(other)))
    # a second claim naming the notebook as owner takes nothing over: it is counted in full
    webhook.dra.claims.put(other)
    extra = claim("team-a", "extra", EIGHTH, owner="nb-0")
    assert not allowed(await webhook.dra.review_claim(claim_review(extra)))


async def test_a_claim_review_the_webhook_fails_on_is_refused_not_a_500(webhook, monkeypatch):
    """A bug in the claims path answers a refusal, as the pods path does: a 500 is refused
    under failurePolicy Fail but admitted under Ignore (`--failure-policy Ignore`)."""
    from tornado.httpserver import HTTPServer

    from devcluster.localhub import free_port
    from fracspawner.kubeflow.webhook import make_app

    async def broken(review: Any, source: str = "") -> dict[str, Any]:
        raise RuntimeError("a bug")

    assert webhook.dra is not None
    monkeypatch.setattr(webhook.dra, "review_claim", broken)
    port = free_port()
    server = HTTPServer(make_app(webhook))
    server.listen(port, "127.0.0.1")
    try:
        review = claim_review(claim("team-a", "big", QUARTER))
        answer = await _post_from(port, "127.0.0.1", review)
    finally:
        server.stop()
    assert answer["response"]["uid"] == review["request"]["uid"]
    assert answer["response"]["allowed"] is False
    assert "failed on this claim" in answer["response"]["status"]["message"]
