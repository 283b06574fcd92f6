"""devcluster: admission webhooks called as kube-apiserver calls them.

The webhooks are real HTTPS servers (small tornado apps, each on its own thread and event
loop) with certificates from a test CA; the devcluster runs in its own process and verifies
them against the configuration's caBundle. Pods here name a scheduler nobody serves, so they
stay Pending and no process runs: admission is what is under test.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from tornado import web
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from devcluster.certs import CertificateAuthority, issue, make_ca

pytestmark = pytest.mark.e2e

CONTROL_PLANE = "python"  # tests the Python API server itself (issue 35 item 4)
PROFILE = {"app.kubernetes.io/part-of": "kubeflow-profile"}
TOPOLOGY = {
    "namespaces": [
        {"name": "profile-a", "labels": PROFILE},
        {"name": "profile-b", "labels": PROFILE},
        {"name": "webhooks"},
        "plain",
    ],
    "nodes": [{"name": "cpu-1", "capacity": {"cpu": "8", "memory": "32Gi"}}],
}
MUTATING = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
VALIDATING = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
POD_RULE = {"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
            "resources": ["pods"]}  # fmt: skip


# ---------------------------------------------------------------- a webhook server
Respond = Callable[[dict[str, Any]], Any]


class Webhook:
    """An HTTPS admission webhook on 127.0.0.1 (its own thread and event loop). `respond`
    turns each AdmissionReview into the answer (a dict, or a coroutine of one); every review
    received is kept in `reviews`."""

    def __init__(self, cert: Any, respond: Respond) -> None:
        self.cert, self.respond = cert, respond
        self.reviews: list[dict[str, Any]] = []
        self.port = 0
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None

    def __enter__(self) -> Webhook:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(10), "the webhook did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def url(self, path: str = "/mutate") -> str:
        return f"https://127.0.0.1:{self.port}{path}"

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._loop.run_until_complete(self._serve())
        self._loop.close()

    async def _serve(self) -> None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert.cert_file, self.cert.key_file)
        server = HTTPServer(web.Application([(r"/.*", _Handler, {"hook": self})]),
                            ssl_options=context)  # fmt: skip
        sockets = bind_sockets(0, "127.0.0.1")
        server.add_sockets(sockets)
        self.port = sockets[0].getsockname()[1]
        self._stop = asyncio.Event()
        self._ready.set()
        await self._stop.wait()
        server.stop()
        await server.close_all_connections()


class _Handler(web.RequestHandler):
    def initialize(self, hook: Webhook) -> None:
        self.hook = hook

    async def post(self) -> None:
        review = json.loads(self.request.body)
        self.hook.reviews.append(review)
        answer = self.hook.respond(review)
        if asyncio.iscoroutine(answer):
            answer = await answer
        self.set_header("Content-Type", "application/json")
        self.finish(answer if isinstance(answer, (bytes, str)) else json.dumps(answer))


def answer(review: dict[str, Any], **response: Any) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": review["request"]["uid"], "allowed": True, **response},
    }


def patched(review: dict[str, Any], operations: list[dict[str, Any]], **extra: Any) -> dict:
    encoded = base64.b64encode(json.dumps(operations).encode()).decode()
    return answer(review, patchType="JSONPatch", patch=encoded, **extra)


def allow(review: dict[str, Any]) -> dict[str, Any]:
    return answer(review)


# ---------------------------------------------------------------- fixtures and helpers
@pytest.fixture(scope="module")
def ca() -> CertificateAuthority:
    return make_ca()


@pytest.fixture(scope="module")
def cert(ca, tmp_path_factory):
    """A server certificate for the loopback address and for Service `wh` in `webhooks`."""
    return issue(ca, ["127.0.0.1", "wh.webhooks.svc"], tmp_path_factory.mktemp("tls"))


@pytest.fixture
def client(devcluster) -> Iterator[Any]:
    """The module's devcluster; every webhook configuration a test made is removed after it."""
    yield devcluster
    for path in (MUTATING, VALIDATING):
        for item in request(devcluster, "GET", path)[1]["items"]:
            request(devcluster, "DELETE", f"{path}/{item['metadata']['name']}")


def request(
    cluster: Any,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    content_type: str = "application/json",
) -> tuple[int, Any, list[str]]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(cluster.url + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", content_type)
    for key, value in (headers or {}).items():
        req.add_header(key, value)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            warnings = resp.headers.get_all("Warning") or []
            return resp.status, json.loads(resp.read() or b"null"), warnings
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null"), []


def webhook_config(
    name: str,
    hooks: list[dict[str, Any]],
    kind: str = "MutatingWebhookConfiguration",
) -> dict[str, Any]:
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
            "metadata": {"name": name}, "webhooks": hooks}  # fmt: skip


def hook(name: str, client_config: dict[str, Any], **settings: Any) -> dict[str, Any]:
    return {
        "name": name,
        "clientConfig": client_config,
        "rules": [POD_RULE],
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        **settings,
    }


def by_url(webhook: Webhook, ca: CertificateAuthority, path: str = "/mutate") -> dict:
    return {"url": webhook.url(path), "caBundle": ca.ca_bundle}


def install(cluster: Any, config: dict[str, Any], path: str = MUTATING) -> dict[str, Any]:
    status, body, _ = request(cluster, "POST", path, config)
    assert status == 201, body
    return body


def pod(name: str, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "schedulerName": "nobody",  # stays Pending: no process runs
            "containers": [{"name": "notebook", "image": "example.org/notebook:1"}],
            **spec,
        },
    }


def create_pod(cluster: Any, namespace: str, body: dict[str, Any], **kw: Any) -> tuple:
    return request(cluster, "POST", f"/api/v1/namespaces/{namespace}/pods", body, **kw)


def stored(cluster: Any, namespace: str, name: str) -> dict[str, Any] | None:
    status, body, _ = request(cluster, "GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
    return body if status == 200 else None


# ---------------------------------------------------------------- the request and the patch
def test_a_mutating_webhook_patches_a_pod_create_and_sees_what_the_apiserver_sends(
    client, ca, cert
):
    def respond(review: dict[str, Any]) -> dict[str, Any]:
        return patched(review, [
            {"op": "add", "path": "/metadata/labels/mutated", "value": "yes"},
            {"op": "add", "path": "/spec/containers/0/env",
             "value": [{"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value": "0=10240M"}]},
            # `resources` is there to add to: the apiserver defaults it to {}
            {"op": "add", "path": "/spec/containers/0/resources/limits",
             "value": {"nvidia.com/gpu": "1"}},
        ], warnings=["slice 1/4 of an H100"])  # fmt: skip

    with Webhook(cert, respond) as webhook:
        install(client, webhook_config("slices", [hook(
            "slices.fracspawner.io", by_url(webhook, ca),
            namespaceSelector={"matchLabels": PROFILE})]))  # fmt: skip
        body = pod("", {"fracspawner.io/pool": "h100"})
        del body["metadata"]["name"]
        body["metadata"]["generateName"] = "nb-"
        status, created, warnings = create_pod(
            client, "profile-a", body,
            headers={"Impersonate-User": "system:serviceaccount:kubeflow:notebook-controller",
                     "Impersonate-Group": "system:serviceaccounts"},
        )  # fmt: skip
        assert status == 201, created
        assert warnings == ['299 - "slice 1/4 of an H100"']
        # the patch is applied, then the pod stored and defaulted
        name = created["metadata"]["name"]
        pod_now = stored(client, "profile-a", name)
        assert pod_now["metadata"]["labels"] == {"fracspawner.io/pool": "h100", "mutated": "yes"}
        container = pod_now["spec"]["containers"][0]
        assert container["resources"] == {"limits": {"nvidia.com/gpu": "1"}}
        assert container["env"] == [{"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
                                     "value": "0=10240M"}]  # fmt: skip
        # what the webhook got: an AdmissionReview v1 as kube-apiserver 1.33 sends it
        (review,) = webhook.reviews
        assert review["apiVersion"] == "admission.k8s.io/v1" and review["kind"] == "AdmissionReview"
        req = review["request"]
        assert req["uid"] and req["operation"] == "CREATE" and req["dryRun"] is False
        assert req["kind"] == {"group": "", "version": "v1", "kind": "Pod"}
        assert req["resource"] == {"group": "", "version": "v1", "resource": "pods"}
        assert req["namespace"] == "profile-a"
        assert req["name"] == ""  # generateName: the name is given after admission
        assert req["userInfo"] == {
            "username": "system:serviceaccount:kubeflow:notebook-controller",
            "groups": ["system:serviceaccounts", "system:authenticated"],
        }
        assert req["oldObject"] is None and req["options"]["kind"] == "CreateOptions"
        obj = req["object"]
        assert obj["metadata"]["generateName"] == "nb-" and "uid" not in obj["metadata"]
        assert obj["metadata"]["namespace"] == "profile-a"
        # defaulted before admission, as pkg/apis/core/v1/defaults.go does
        assert (obj["spec"]["restartPolicy"], obj["spec"]["dnsPolicy"]) == (
            "Always",
            "ClusterFirst",
        )
        assert obj["spec"]["terminationGracePeriodSeconds"] == 30
        sent = obj["spec"]["containers"][0]
        assert (sent["resources"], sent["imagePullPolicy"], sent["terminationMessagePolicy"]) == (
            {},
            "IfNotPresent",
            "File",
        )
        # a namespace the selector does not match: the webhook is not called
        status, _, _ = create_pod(client, "plain", pod("outside", {"fracspawner.io/pool": "h"}))
        assert status == 201 and len(webhook.reviews) == 1
        assert "mutated" not in stored(client, "plain", "outside")["metadata"]["labels"]


@pytest.mark.parametrize(
    "settings, called",
    [
        ({"objectSelector": {"matchLabels": {"fracspawner.io/pool": "h100"}}}, ["sliced"]),
        ({"objectSelector": {"matchExpressions": [
            {"key": "fracspawner.io/pool", "operator": "DoesNotExist"}]}}, ["plain"]),
        ({"rules": [{**POD_RULE, "operations": ["UPDATE"]}]}, []),
        ({"rules": [{**POD_RULE, "resources": ["pods/*"]}]}, []),
        ({"rules": [{**POD_RULE, "resources": ["*"], "apiGroups": ["*"],
                     "apiVersions": ["*"]}]}, ["sliced", "plain"]),
        ({"rules": [{**POD_RULE, "scope": "Cluster"}]}, []),
        ({"rules": [{**POD_RULE, "scope": "Namespaced"}]}, ["sliced", "plain"]),
        ({"namespaceSelector": {"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In",
             "values": ["profile-b"]}]}}, []),
    ],
)  # fmt: skip
def test_which_webhooks_are_called_rules_and_selectors(client, ca, cert, settings, called):
    with Webhook(cert, allow) as webhook:
        install(client, webhook_config("selective", [hook(
            "selective.example.com", by_url(webhook, ca), **settings)]))  # fmt: skip
        suffix = abs(hash(json.dumps(settings, sort_keys=True))) % 100000
        for name, labels in (("sliced", {"fracspawner.io/pool": "h100"}), ("plain", {})):
            status, body, _ = create_pod(client, "profile-a", pod(f"{name}-{suffix}", labels))
            assert status == 201, body
        seen = [r["request"]["object"]["metadata"]["name"].rsplit("-", 1)[0]
                for r in webhook.reviews]  # fmt: skip
        assert seen == called


def test_a_refusal_is_the_webhooks_message_and_nothing_is_stored(client, ca, cert):
    def respond(review: dict[str, Any]) -> dict[str, Any]:
        name = review["request"]["object"]["metadata"]["name"]
        if name == "forbidden":
            return answer(review, allowed=False, status={
                "code": 403, "reason": "Forbidden",
                "message": 'pool "a100" is not allowed in namespace profile-a'})  # fmt: skip
        return answer(review, allowed=False, status={"message": "over the quota of 1 GPU"})

    with Webhook(cert, respond) as webhook:
        install(client, webhook_config("quota", [hook("quota.fracspawner.io",
                                                      by_url(webhook, ca))]))  # fmt: skip
        status, body, _ = create_pod(client, "profile-a", pod("over-quota"))
        assert status == 400  # a refusal without a code of 400 or more is a 400
        assert body["message"] == (
            'admission webhook "quota.fracspawner.io" denied the request: over the quota of 1 GPU'
        )
        assert stored(client, "profile-a", "over-quota") is None
        status, body, _ = create_pod(client, "profile-a", pod("forbidden"))
        assert status == 403 and body["reason"] == "Forbidden"
        assert body["message"] == ('admission webhook "quota.fracspawner.io" denied the request: '
                                   'pool "a100" is not allowed in namespace profile-a')  # fmt: skip


def test_the_patched_pod_is_validated_strictly(client, ca, cert):
    def respond(review: dict[str, Any]) -> dict[str, Any]:
        return patched(review, [{"op": "add", "path": "/spec/containers/0/resources",
                                 "value": {"limits": {"nvidia.com/gpu": ["one"]}}}])  # fmt: skip

    with Webhook(cert, respond) as webhook:
        install(client, webhook_config("breaks", [hook("breaks.example.com",
                                                       by_url(webhook, ca))]))  # fmt: skip
        status, body, _ = create_pod(client, "profile-a", pod("broken-by-webhook"))
        assert status == 422 and body["reason"] == "Invalid"
        assert "spec.containers[0].resources.limits.nvidia.com/gpu" in body["message"]
        assert stored(client, "profile-a", "broken-by-webhook") is None


# ---------------------------------------------------------------- failures and failurePolicy
def test_a_malformed_patch_fails_the_request_like_the_apiserver(client, ca, cert):
    def respond(review: dict[str, Any]) -> Any:
        name = review["request"]["object"]["metadata"]["name"]
        if name.startswith("undecodable"):  # base64 of a JSON object, not a patch
            return answer(review, patchType="JSONPatch",
                          patch=base64.b64encode(b'{"op": "add"}').decode())  # fmt: skip
        if name.startswith("not-base64"):
            return answer(review, patchType="JSONPatch", patch="!!not base64!!")
        return patched(review, [{"op": "remove", "path": "/metadata/labels/absent"}])

    with Webhook(cert, respond) as webhook:
        install(client, webhook_config("malformed", [
            hook("fail.example.com", by_url(webhook, ca),
                 objectSelector={"matchLabels": {"policy": "fail"}}),
            hook("ignore.example.com", by_url(webhook, ca), failurePolicy="Ignore",
                 objectSelector={"matchLabels": {"policy": "ignore"}}),
        ]))  # fmt: skip
        status, body, _ = create_pod(client, "profile-a", pod("undecodable-1", {"policy": "fail"}))
        assert status == 500 and body["reason"] == "InternalError"
        assert body["message"].startswith(
            'Internal error occurred: failed calling webhook "fail.example.com": received '
            "undecodable patch in webhook response: json: cannot unmarshal"
        )
        status, body, _ = create_pod(client, "profile-a", pod("not-base64-1", {"policy": "fail"}))
        assert status == 500 and "illegal base64 data at input byte 0" in body["message"]
        # a patch that does not apply is the apiserver's own error: failurePolicy has no say
        for policy in ("fail", "ignore"):
            status, body, _ = create_pod(
                client, "profile-a", pod(f"missing-{policy}", {"policy": policy})
            )
            assert status == 500
            assert body["message"] == (
                'Internal error occurred: remove operation does not apply: doc is missing path: '
                '"/metadata/labels/absent": missing value')  # fmt: skip
        # an undecodable patch under Ignore: the webhook is skipped, the pod created as sent
        status, body, _ = create_pod(
            client, "profile-a", pod("undecodable-2", {"policy": "ignore"})
        )
        assert status == 201, body
        for name in ("undecodable-1", "not-base64-1", "missing-fail", "missing-ignore"):
            assert stored(client, "profile-a", name) is None


def test_a_webhook_that_is_down_fails_closed_or_open_by_its_policy(client, ca, cert):
    with Webhook(cert, allow) as webhook:
        url = by_url(webhook, ca)
    # the server is gone: nothing listens on its port any more
    install(client, webhook_config("down", [
        hook("slices.example.com", url, objectSelector={"matchLabels": {"slice": "yes"}}),
        hook("optional.example.com", url, failurePolicy="Ignore",
             objectSelector={"matchLabels": {"optional": "yes"}}),
    ]))  # fmt: skip
    status, body, _ = create_pod(client, "profile-a", pod("needs-slice", {"slice": "yes"}))
    assert status == 500 and body["reason"] == "InternalError"
    port = url["url"].split(":")[2].split("/")[0]
    assert body["message"] == (
        'Internal error occurred: failed calling webhook "slices.example.com": failed to call '
        f'webhook: Post "https://127.0.0.1:{port}/mutate?timeout=10s": dial tcp 127.0.0.1:{port}: '
        "connect: connection refused"
    )
    assert stored(client, "profile-a", "needs-slice") is None
    # pods the failing webhook does not select pass; Ignore lets its pods through
    assert create_pod(client, "profile-a", pod("no-slice"))[0] == 201
    assert create_pod(client, "profile-a", pod("optional", {"optional": "yes"}))[0] == 201


def test_timeout_seconds_is_honoured(client, ca, cert):
    release = threading.Event()

    async def slow(review: dict[str, Any]) -> dict[str, Any]:
        await asyncio.to_thread(release.wait, 20)  # held until the test lets it go
        return allow(review)

    try:
        with Webhook(cert, slow) as webhook:
            install(client, webhook_config("slow", [
                hook("slow.example.com", by_url(webhook, ca), timeoutSeconds=1,
                     objectSelector={"matchLabels": {"policy": "fail"}}),
                hook("slow-ignored.example.com", by_url(webhook, ca), timeoutSeconds=1,
                     failurePolicy="Ignore", objectSelector={"matchLabels": {"policy": "ignore"}}),
            ]))  # fmt: skip
            status, body, _ = create_pod(client, "profile-a", pod("too-slow", {"policy": "fail"}))
            assert status == 500
            assert body["message"].startswith(
                'Internal error occurred: failed calling webhook "slow.example.com": failed to '
                f'call webhook: Post "https://127.0.0.1:{webhook.port}/mutate?timeout=1s": '
            )
            assert body["message"].endswith("context deadline exceeded")
            status, _, _ = create_pod(client, "profile-a", pod("slow-ok", {"policy": "ignore"}))
            assert status == 201
            # both requests reached the webhook, which was still holding them
            assert len(webhook.reviews) == 2
            release.set()
    finally:
        release.set()


def test_tls_is_verified_against_the_ca_bundle_and_the_host(client, ca, cert, tmp_path):
    other = make_ca("another CA")
    wrong_host = issue(ca, ["webhook.elsewhere.example"], tmp_path)
    with Webhook(cert, allow) as webhook, Webhook(wrong_host, allow) as misnamed:
        install(client, webhook_config("tls", [
            hook("untrusted.example.com", {"url": webhook.url(), "caBundle": other.ca_bundle},
                 objectSelector={"matchLabels": {"tls": "untrusted"}}),
            hook("misnamed.example.com", by_url(misnamed, ca),
                 objectSelector={"matchLabels": {"tls": "misnamed"}}),
            hook("trusted.example.com", by_url(webhook, ca),
                 objectSelector={"matchLabels": {"tls": "trusted"}}),
        ]))  # fmt: skip
        status, body, _ = create_pod(client, "profile-a", pod("untrusted", {"tls": "untrusted"}))
        assert status == 500 and body["message"].endswith(
            "tls: failed to verify certificate: x509: certificate signed by unknown authority"
        )
        status, body, _ = create_pod(client, "profile-a", pod("misnamed", {"tls": "misnamed"}))
        assert status == 500 and body["message"].endswith(
            "tls: failed to verify certificate: x509: certificate is not valid for 127.0.0.1"
        )
        assert webhook.reviews == [] and misnamed.reviews == []
        assert create_pod(client, "profile-a", pod("trusted", {"tls": "trusted"}))[0] == 201
        assert len(webhook.reviews) == 1


def test_a_service_reference_reaches_a_local_webhook_process(client, ca, cert):
    def respond(review: dict[str, Any]) -> dict[str, Any]:
        return patched(review, [{"op": "add", "path": "/metadata/annotations",
                                 "value": {"via": "service"}}])  # fmt: skip

    with Webhook(cert, respond) as webhook:
        # a Service without a selector: the devcluster dials 127.0.0.1 at its targetPort,
        # verifying the certificate for wh.webhooks.svc
        service = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "wh"},
            "spec": {"ports": [{"port": 443, "targetPort": webhook.port}]},
        }
        assert request(client, "POST", "/api/v1/namespaces/webhooks/services", service)[0] == 201
        try:
            reference = {"service": {"name": "wh", "namespace": "webhooks", "path": "/mutate"},
                         "caBundle": ca.ca_bundle}  # fmt: skip
            config = install(client, webhook_config("svc", [hook("svc.example.com", reference)]))
            # the apiserver's defaults are stored
            stored_hook = config["webhooks"][0]
            assert stored_hook["clientConfig"]["service"]["port"] == 443
            assert (stored_hook["failurePolicy"], stored_hook["timeoutSeconds"],
                    stored_hook["matchPolicy"], stored_hook["reinvocationPolicy"]) == (
                "Fail", 10, "Equivalent", "Never")  # fmt: skip
            assert (
                stored_hook["namespaceSelector"] == {} and stored_hook["rules"][0]["scope"] == "*"
            )
            status, body, _ = create_pod(client, "profile-a", pod("via-service"))
            assert status == 201, body["message"]
            assert stored(client, "profile-a", "via-service")["metadata"]["annotations"] == {
                "via": "service"
            }
        finally:
            request(client, "DELETE", "/api/v1/namespaces/webhooks/services/wh")
        status, body, _ = create_pod(client, "profile-a", pod("no-service"))
        assert status == 500 and body["message"].endswith(
            'Post "https://wh.webhooks.svc:443/mutate?timeout=10s": service "wh" not found'
        )


# ---------------------------------------------------------------- order and reinvocation
@pytest.mark.parametrize("policy, first_calls", [("IfNeeded", 2), ("Never", 1)])
def test_reinvocation_calls_a_webhook_again_after_a_later_one_changed_the_pod(
    client, ca, cert, policy, first_calls
):
    def labeller(label: str) -> Respond:
        def respond(review: dict[str, Any]) -> dict[str, Any]:
            labels = review["request"]["object"]["metadata"].get("labels") or {}
            if label in labels:  # idempotent, as a webhook that is reinvoked must be
                return allow(review)
            return patched(review, [{"op": "add", "path": f"/metadata/labels/{label}",
                                     "value": "1"}])  # fmt: skip

        return respond

    with Webhook(cert, labeller("first")) as first, Webhook(cert, labeller("second")) as second:
        # called in the order of the configurations' names: a-... before b-...
        install(client, webhook_config("b-second", [hook("second.example.com",
                                                         by_url(second, ca))]))  # fmt: skip
        install(client, webhook_config("a-first", [hook(
            "first.example.com", by_url(first, ca), reinvocationPolicy=policy)]))  # fmt: skip
        name = f"reinvoked-{policy.lower()}"
        assert create_pod(client, "profile-a", pod(name))[0] == 201
        assert stored(client, "profile-a", name)["metadata"]["labels"] == {
            "first": "1",
            "second": "1",
        }
        assert len(first.reviews) == first_calls and len(second.reviews) == 1
        if policy == "IfNeeded":  # the second call sees what the later webhook did
            again = first.reviews[1]["request"]["object"]["metadata"]["labels"]
            assert again == {"first": "1", "second": "1"}


def test_validating_webhooks_see_the_mutated_object_and_may_refuse(client, ca, cert):
    def mutate(review: dict[str, Any]) -> dict[str, Any]:
        return patched(review, [{"op": "add", "path": "/metadata/labels/quota",
                                 "value": "checked"}])  # fmt: skip

    def validate(review: dict[str, Any]) -> dict[str, Any]:
        labels = review["request"]["object"]["metadata"]["labels"]
        if labels.get("size") == "huge":
            return answer(review, allowed=False, status={"message": "too big for this profile"})
        return allow(review)

    with Webhook(cert, mutate) as mutating, Webhook(cert, validate) as validating:
        install(client, webhook_config("m", [hook("m.example.com", by_url(mutating, ca))]))
        install(
            client,
            webhook_config(
                "v",
                [hook("v.example.com", by_url(validating, ca, "/validate"))],
                kind="ValidatingWebhookConfiguration",
            ),
            VALIDATING,
        )
        assert create_pod(client, "profile-a", pod("fits", {"size": "small"}))[0] == 201
        status, body, _ = create_pod(client, "profile-a", pod("huge", {"size": "huge"}))
        assert status == 400 and body["message"] == (
            'admission webhook "v.example.com" denied the request: too big for this profile'
        )
        assert validating.reviews[0]["request"]["object"]["metadata"]["labels"]["quota"] == (
            "checked")  # fmt: skip
        assert stored(client, "profile-a", "huge") is None


def test_an_answer_that_is_not_a_valid_admission_review_is_a_failed_call(client, ca, cert):
    def respond(review: dict[str, Any]) -> Any:
        name = review["request"]["object"]["metadata"]["name"]
        if name == "wrong-uid":
            return {**answer(review), "response": {"uid": "not-the-request", "allowed": True}}
        if name == "no-patch-type":
            return {
                **answer(review),
                "response": {"uid": review["request"]["uid"], "allowed": True, "patch": "W10="},
            }
        if name == "not-json":
            return "<html>oops</html>"
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}

    expected = {
        "wrong-uid": "received invalid webhook response: expected response.uid=",
        "no-patch-type": "received invalid webhook response: webhook returned response.patch "
        "but not response.patchType",
        "not-json": "failed to call webhook: couldn't get version/kind; json parse error",
        "no-response": "received invalid webhook response: webhook response was absent",
    }
    with Webhook(cert, respond) as webhook:
        install(client, webhook_config("garbled", [hook("garbled.example.com",
                                                        by_url(webhook, ca))]))  # fmt: skip
        for name, text in expected.items():
            status, body, _ = create_pod(client, "profile-a", pod(name))
            assert status == 500, body
            assert body["message"].startswith(
                'Internal error occurred: failed calling webhook "garbled.example.com": ' + text
            ), body["message"]


# ---------------------------------------------------------------- configurations
def test_webhook_configurations_are_checked_as_the_apiserver_checks_them(client, ca):
    bad = webhook_config("bad", [{
        "name": "short.name",
        "clientConfig": {"url": "http://127.0.0.1:1/mutate"},
        "rules": [{**POD_RULE, "operations": ["CREATE", "PATCH"]}],
        "admissionReviewVersions": ["v2"],
        "timeoutSeconds": 31,
    }])  # fmt: skip
    status, body, _ = request(client, "POST", MUTATING, bad)
    assert status == 422 and body["reason"] == "Invalid"
    message = body["message"]
    assert message.startswith(
        'MutatingWebhookConfiguration.admissionregistration.k8s.io "bad" is invalid: ['
    )
    for part in (
        'webhooks[0].name: Invalid value: "short.name": should be a domain with at least three '
        "segments separated by dots",
        'webhooks[0].rules[0].operations[1]: Unsupported value: "PATCH"',
        "webhooks[0].sideEffects: Required value: must specify one of None, NoneOnDryRun",
        'webhooks[0].admissionReviewVersions: Invalid value: ["v2"]: must include at least one '
        "of v1, v1beta1",
        "webhooks[0].timeoutSeconds: Invalid value: 31: the timeout value must be between 1 and "
        "30 seconds",
        "webhooks[0].clientConfig.url: Invalid value: \"http://127.0.0.1:1/mutate\": 'https' is "
        "the only allowed URL scheme",
    ):
        assert part in message, (part, message)
    assert request(client, "GET", f"{MUTATING}/bad")[0] == 404


def test_webhook_configurations_are_never_sent_to_webhooks(client, ca, cert):
    with Webhook(cert, allow) as webhook:
        url = by_url(webhook, ca)
    everything = hook(
        "everything.example.com",
        url,
        rules=[
            {"operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*/*"]}
        ],
    )
    install(client, webhook_config("everything", [everything]))
    # the webhook is down and matches everything, yet it can still be changed and removed
    status, _, _ = request(
        client,
        "PATCH",
        f"{MUTATING}/everything",
        {"metadata": {"labels": {"x": "y"}}},
        content_type="application/merge-patch+json",
    )
    assert status == 200
    assert create_pod(client, "profile-a", pod("blocked"))[0] == 500
    assert request(client, "DELETE", f"{MUTATING}/everything")[0] == 200
    assert create_pod(client, "profile-a", pod("unblocked"))[0] == 201


# ---------------------------------------------------------------- other operations and kinds
def test_update_delete_and_dry_run_go_through_admission(client, ca, cert):
    def respond(review: dict[str, Any]) -> dict[str, Any]:
        req = review["request"]
        if req["operation"] == "DELETE":
            return answer(review, allowed=False, status={"message": "keep it"})
        return allow(review)

    rules = [{**POD_RULE, "operations": ["CREATE", "UPDATE", "DELETE"]}]
    with Webhook(cert, respond) as webhook:
        install(client, webhook_config("ops", [hook("ops.example.com", by_url(webhook, ca),
                                                    rules=rules)]))  # fmt: skip
        status, dry, _ = create_pod(client, "profile-a", pod("dry"))
        assert status == 201
        status, _, _ = request(
            client, "POST", "/api/v1/namespaces/profile-a/pods?dryRun=All", pod("only-dry")
        )
        assert status == 201 and stored(client, "profile-a", "only-dry") is None
        assert webhook.reviews[-1]["request"]["dryRun"] is True
        status, _, _ = request(
            client,
            "PATCH",
            "/api/v1/namespaces/profile-a/pods/dry",
            {"metadata": {"labels": {"touched": "yes"}}},
            content_type="application/merge-patch+json",
        )
        assert status == 200
        update = webhook.reviews[-1]["request"]
        assert update["operation"] == "UPDATE" and update["name"] == "dry"
        assert update["object"]["metadata"]["labels"] == {"touched": "yes"}
        assert update["oldObject"]["metadata"]["labels"] == {}
        assert update["options"]["kind"] == "UpdateOptions"
        status, body, _ = request(client, "DELETE", "/api/v1/namespaces/profile-a/pods/dry")
        assert status == 400 and body["message"].endswith("denied the request: keep it")
        delete = webhook.reviews[-1]["request"]
        assert delete["object"] is None and delete["oldObject"]["metadata"]["name"] == "dry"
        assert stored(client, "profile-a", "dry") is not None


def test_custom_resources_are_admitted_with_equivalent_versions(client, ca, cert):
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "gadgets.admission.example.com"},
        "spec": {"group": "admission.example.com", "scope": "Namespaced",
                 "names": {"plural": "gadgets", "kind": "Gadget"},
                 "versions": [{"name": v, "served": True, "storage": v == "v1",
                               "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                                   "spec": {"type": "object",
                                            "x-kubernetes-preserve-unknown-fields": True}}}}}
                              for v in ("v1", "v1beta1")]},
    }  # fmt: skip
    assert (
        request(client, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)[0]
        == 201
    )

    def respond(review: dict[str, Any]) -> dict[str, Any]:
        return patched(review, [{"op": "add", "path": "/spec/stamped", "value": True}])

    with Webhook(cert, respond) as webhook:
        rule = {"operations": ["CREATE"], "apiGroups": ["admission.example.com"],
                "apiVersions": ["v1"], "resources": ["gadgets"]}  # fmt: skip
        install(
            client,
            webhook_config(
                "gadgets", [hook("gadgets.example.com", by_url(webhook, ca), rules=[rule])]
            ),
        )
        body = {"apiVersion": "admission.example.com/v1beta1", "kind": "Gadget",
                "metadata": {"name": "g"}, "spec": {"size": 1}}  # fmt: skip
        status, created, _ = request(
            client, "POST", "/apis/admission.example.com/v1beta1/namespaces/profile-a/gadgets", body
        )
        assert status == 201, created
        assert created["spec"] == {"size": 1, "stamped": True}
        assert created["apiVersion"] == "admission.example.com/v1beta1"
        # matchPolicy Equivalent: a v1 webhook gets the v1beta1 request as v1
        req = webhook.reviews[0]["request"]
        assert req["kind"] == {"group": "admission.example.com", "version": "v1", "kind": "Gadget"}
        assert req["requestKind"]["version"] == "v1beta1"
        assert req["object"]["apiVersion"] == "admission.example.com/v1"


def test_concurrent_creates_reach_the_webhook_concurrently(client, ca, cert):
    """The apiserver admits requests in parallel; a webhook guarding a quota has to cope
    with that, so the devcluster must not serialise them. The webhook holds every request
    until all four have arrived: were they serialised, the first would never be answered
    (its call times out and, under Fail, every create fails)."""
    arrived = threading.Barrier(4, timeout=20)

    async def respond(review: dict[str, Any]) -> dict[str, Any]:
        try:
            await asyncio.to_thread(arrived.wait)
        except threading.BrokenBarrierError:
            return answer(review, allowed=False, status={"message": "not concurrent"})
        return allow(review)

    with Webhook(cert, respond) as webhook:
        install(client, webhook_config("together", [hook("together.example.com",
                                                         by_url(webhook, ca),
                                                         timeoutSeconds=30)]))  # fmt: skip
        with ThreadPoolExecutor(4) as pool:
            results = list(
                pool.map(lambda i: create_pod(client, "profile-b", pod(f"together-{i}")), range(4))
            )
        assert [r[0] for r in results] == [201] * 4, results
        assert len(webhook.reviews) == 4


def test_the_certs_helper_writes_a_key_only_its_owner_reads(cert):
    assert Path(cert.key_file).stat().st_mode & 0o077 == 0


def test_a_write_during_admission_is_retried_on_the_new_version_or_409_if_preconditioned(
    client, ca, cert
):
    """While a webhook holds an update, another write lands: the held update is done again
    on the new object (as the apiserver's GuaranteedUpdate retries), so neither change is
    lost; an update that named a resourceVersion gets a 409 instead."""
    hold = threading.Event()
    held = threading.Event()

    async def respond(review: dict[str, Any]) -> dict[str, Any]:
        labels = review["request"]["object"]["metadata"]["labels"]
        if labels.get("slow") == "yes" and not held.is_set():
            held.set()
            await asyncio.to_thread(hold.wait, 20)
        return allow(review)

    rules = [{**POD_RULE, "operations": ["UPDATE"]}]
    path = "/api/v1/namespaces/profile-b/pods/raced"
    merge = "application/merge-patch+json"
    with Webhook(cert, respond) as webhook:
        install(
            client,
            webhook_config(
                "race",
                [hook("race.example.com", by_url(webhook, ca), rules=rules, timeoutSeconds=30)],
            ),
        )
        assert create_pod(client, "profile-b", pod("raced"))[0] == 201
        for precondition, expected in ((False, 200), (True, 409)):
            hold.clear()
            held.clear()
            current = request(client, "GET", path)[1]
            patch: dict[str, Any] = {"metadata": {"labels": {"slow": "yes"}}}
            if precondition:
                patch["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            with ThreadPoolExecutor(1) as pool:
                slow = pool.submit(request, client, "PATCH", path, patch, content_type=merge)
                assert held.wait(20), "the webhook never got the first update"
                quick = {"metadata": {"labels": {"slow": None, "quick": str(precondition)}}}
                assert request(client, "PATCH", path, quick, content_type=merge)[0] == 200
                hold.set()
                status, body, _ = slow.result(60)
            assert status == expected, body
            labels = request(client, "GET", path)[1]["metadata"]["labels"]
            if expected == 200:
                assert labels == {"slow": "yes", "quick": "False"}  # both writes kept
                # the retry was admitted again, on top of the write that landed meanwhile
                assert webhook.reviews[-1]["request"]["oldObject"]["metadata"]["labels"] == {
                    "quick": "False"
                }
            else:
                assert labels == {"quick": "True"}
                assert body["reason"] == "Conflict"


def test_strategic_merge_patches_merge_lists_by_their_keys_as_kubectl_apply_needs(
    client, ca, tmp_path
):
    config = webhook_config("merged", [
        hook("one.example.com", {"url": "https://127.0.0.1:1/one", "caBundle": ca.ca_bundle},
             objectSelector={"matchLabels": {"never": "matches"}}),
        hook("two.example.com", {"url": "https://127.0.0.1:1/two", "caBundle": ca.ca_bundle},
             objectSelector={"matchLabels": {"never": "matches"}}),
    ])  # fmt: skip
    install(client, config)
    strategic = "application/strategic-merge-patch+json"
    path = f"{MUTATING}/merged"
    # one element patched by its merge key (name): the other and the rest of it stay
    status, body, _ = request(client, "PATCH", path,
                              {"webhooks": [{"name": "two.example.com", "timeoutSeconds": 3}]},
                              content_type=strategic)  # fmt: skip
    assert status == 200, body
    assert [(w["name"], w["timeoutSeconds"]) for w in body["webhooks"]] == [
        ("one.example.com", 10),
        ("two.example.com", 3),
    ]
    assert body["webhooks"][1]["clientConfig"]["url"] == "https://127.0.0.1:1/two"
    # $patch: delete removes one element; finalizers merge as a set
    status, body, _ = request(client, "PATCH", path, {
        "metadata": {"finalizers": ["example.com/keep"]},
        "webhooks": [{"name": "one.example.com", "$patch": "delete"}]},
        content_type=strategic)  # fmt: skip
    assert status == 200 and [w["name"] for w in body["webhooks"]] == ["two.example.com"]
    status, body, _ = request(client, "PATCH", path,
                              {"metadata": {"finalizers": ["example.com/also"]}},
                              content_type=strategic)  # fmt: skip
    assert body["metadata"]["finalizers"] == ["example.com/keep", "example.com/also"]
    # kubectl apply, twice: the second is a strategic merge patch of the configuration
    config["metadata"]["name"] = "applied"
    manifest = tmp_path / "config.yaml"
    manifest.write_text(json.dumps(config))
    for expected in ("created", "configured"):
        result = subprocess.run(
            ["/usr/bin/kubectl", "--kubeconfig", str(client.kubeconfig), "apply", "-f",
             str(manifest)], capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == (
            f"mutatingwebhookconfiguration.admissionregistration.k8s.io/applied {expected}"
        )
