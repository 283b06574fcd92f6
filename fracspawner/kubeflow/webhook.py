"""`fracspawner webhook`: the mutating admission webhook for Kubeflow profile namespaces.

`POST /mutate` answers AdmissionReview (admission.k8s.io/v1) for pods: CREATE gets the slice's
pod plan as a JSONPatch or a refusal (admission.py decides), a GPU pod that is no notebook, and
a pod without a slice that KAI or Run:ai schedules, the label fracspawner.io/counted; UPDATE may
not change the slice labels or quota annotations, nor what a slice pod or a counted pod was
sized and placed by. `/healthz` says whether it serves, `/metrics` is Prometheus text. A request
that is not an AdmissionReview is answered 400, never with a crash; a slice pod whose namespace
or pods cannot be read from the API server is refused (unknown is never allowed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import ssl
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from tornado import web
from tornado.httpserver import HTTPServer
from tornado.ioloop import PeriodicCallback

from ..backends import LABEL_POOL, load_catalog
from ..capacity.apiconfig import load_configuration
from ..model.access import namespace_rule
from ..model.catalog import AccessRule, Catalog
from ..model.errors import CatalogError
from .admission import (
    DEVICE_LIST_STRATEGIES,
    BadReview,
    Refusal,
    Review,
    admit,
    check_ephemeral,
    check_pool_access,
    guard_update,
    hide_devices_from_env,
    hide_devices_from_ephemeral,
    json_patch,
    other_pod_gpu,
    parse_review,
    refuse_gpu_container_env,
    refuse_isolation_env,
    refuse_visible_gpus,
    response,
    slice_ask,
    tolerations_changed,
)
from .callers import DEFAULT_TRUSTED, PodAddresses, SourceStandings
from .claims import DraGate, is_claim_review, review_claim
from .cluster import ApiUnavailable, Cluster, ConfigException
from .metrics import WebhookMetrics
from .quota import (
    COUNTED_LABEL,
    RESERVATION_ANNOTATION,
    Busy,
    Ledger,
    LocalLedger,
    PodIndex,
    SharedLedger,
    reservation_key,
)
from .recognise import (
    fraction_schedulers,
    gpu_equivalent_of_pod,
    notebook_kind,
    pod_gpu_held,
    sized_when_scheduled,
)

PROG = "fracspawner webhook"
log = logging.getLogger("fracspawner.webhook")
#: the API server sends at most a few MiB; anything larger is not an AdmissionReview
MAX_BODY = 4 * 1024 * 1024


#: what a refusal says to a caller that is not known to be the API server: nothing about the
#: namespace's usage, quota or pools (anyone reaching /mutate could claim any namespace)
#: said to a dry run whose caller is not known to be the API server
DRY_RUN_WARNING = (
    "fracspawner does not check the namespace's GPU quota on a dry run unless the webhook can "
    "verify the API server's certificate; the real create is checked"
)
GENERIC_REFUSALS = {
    "quota": "the namespace has no GPU quota left for it",
    "access": "the namespace may not use it",
}


class Webhook:
    """The decisions with their I/O: namespace rule, pod watch, quota ledger, metrics.

    `ledger_namespace`: keep reservations in ConfigMaps there (shared by every replica); None
    keeps them in this process (one replica only). `detailed_refusals`: every caller is the
    API server (a verified certificate, or the operator says nothing else reaches the port): a
    refusal may say the namespace's usage, quota and pools, and a dry run is checked against the
    quota. `trusted_namespaces`: pods there may relay the API server (callers.py).
    `enforce_pool_access`: "all-pods" holds every GPU pod to the pools its namespace may use
    (admission.check_pool_access), "notebooks" only notebook pods."""

    def __init__(
        self,
        catalog: Catalog,
        cluster: Any,
        *,
        ledger_namespace: str | None = None,
        window: float = 10.0,
        detailed_refusals: bool = True,
        trusted_namespaces: Iterable[str] = DEFAULT_TRUSTED,
        enforce_pool_access: str = "notebooks",
        override_visible_devices: str = "env-from",
        device_list_strategy: str = "envvar",
    ):
        self.catalog = catalog
        #: KAI's and Run:ai's scheduler names, the catalog's renamed ones too: their fraction
        #: container's NVIDIA_VISIBLE_DEVICES (their binder's ConfigMap) is its GPU
        self.fraction_schedulers = fraction_schedulers(catalog)
        #: how the nodes' device plugin hands out devices, as the operator declares it: a
        #: GPU container may take envFrom only where that is not through its env
        self.device_list_strategy = device_list_strategy
        #: which containers holding no GPU get NVIDIA_VISIBLE_DEVICES=void written into their
        #: env: "env-from" those taking envFrom, "all" every one (the image's ENV too)
        self.override_visible_devices = override_visible_devices
        #: "notebooks": a pool access rule binds notebook pods; "all-pods": every GPU pod
        self.enforce_pool_access = enforce_pool_access
        self.cluster = cluster
        # whose pod a request comes from, where no client certificate says who calls
        self.callers = PodAddresses(trusted_namespaces)
        # what each pod holds: its GPU resources by the catalog's plans (notebook or not)
        self.pods = PodIndex(lambda pod: pod_gpu_held(pod, catalog), observers=[self.callers])
        self.watch = cluster.pod_watch(self.pods)
        #: how each unverified caller's reservations ended (callers.SourceStandings)
        self.standings = SourceStandings()
        self.ledger: Ledger = (
            SharedLedger(
                cluster.records(ledger_namespace), self.pods, window, standings=self.standings
            )
            if ledger_namespace
            else LocalLedger(self.pods, window, standings=self.standings)
        )
        self.detailed_refusals = detailed_refusals
        #: with --client-ca: /mutate needs a verified client certificate, with one of
        #: these names if any (--client-name)
        self.verify_clients = False
        self.client_names: set[str] = set()
        self.metrics = WebhookMetrics()
        self.metrics.conflicts.set_function(lambda: self.ledger.conflicts)
        self.metrics.unconfirmed.set_function(lambda: self.standings.unconfirmed)
        #: Kubernetes DRA pools: GPU held via claims counts too (kubeflow/claims.py)
        self.dra = DraGate.attach(self)

    def start(self) -> None:
        """Start the pod watch (admissions of slice pods wait for its first list)."""
        self.watch.start()
        if self.dra is not None:
            self.dra.start()

    async def stop(self) -> None:
        await self.watch.stop()
        if self.dra is not None:
            await self.dra.stop()

    async def review(self, review: Review, source: str = "") -> dict[str, Any]:
        """The answer to a review; `source`: the caller's address where no certificate
        verified it ("" for the API server verified)."""
        try:
            if review.operation == "UPDATE":
                assert review.old_pod is not None
                # Kueue releases a gated pod with its ResourceFlavor's tolerations (an UPDATE):
                # a counted pod's new tolerations are checked as its first were, not refused
                guard_update(review.old_pod, review.pod, self.catalog, counted_tolerations=False)
                await self._recheck_pool_access(review)
                # kubectl debug: pods/ephemeralcontainers, the whole pod with the new container
                check_ephemeral(
                    review.old_pod, review.pod, review.namespace, self.fraction_schedulers
                )
                patch = []
                if review.sub_resource == "ephemeralcontainers" and (
                    self.override_visible_devices == "all"
                ):
                    patch = hide_devices_from_ephemeral(review.old_pod, review.pod)
                answer = response(review.uid, patch=patch)
                return self._count(review, answer, "mutated" if patch else "allowed")
            if review.operation != "CREATE":
                return self._count(review, response(review.uid), "skipped")
            return await self._create(review, source)
        except Refusal as refusal:
            self.metrics.refusals.labels(refusal.reason).inc()
            log.info(
                "refused %s/%s: %s", review.namespace, review.name or "(new pod)", refusal.message
            )
            if not self.detailed_refusals and refusal.reason in GENERIC_REFUSALS:
                refusal = Refusal(
                    f"fracspawner refused this pod's GPU slice in namespace {review.namespace}: "
                    f"{GENERIC_REFUSALS[refusal.reason]}",
                    refusal.reason,
                )
            return self._count(review, response(review.uid, refusal=refusal), "refused")

    def _count(self, review: Review, answer: dict[str, Any], result: str) -> dict[str, Any]:
        self.metrics.admissions.labels(review.operation, result).inc()
        return answer

    def _answer(
        self,
        review: Review,
        pod: dict[str, Any],
        result: str,
        unchanged: str | None = None,
        warnings: list[str] | None = None,
    ) -> dict[str, Any]:
        """Allowed, with what turns the pod under review into `pod`, whose containers holding
        no GPU get their envFrom overridden (admission.hide_devices_from_env); counted as
        `result`, or `unchanged` where nothing changes."""
        every = self.override_visible_devices == "all"
        patch = json_patch(
            review.pod, hide_devices_from_env(pod, every=every, schedulers=self.fraction_schedulers)
        )
        label = result if patch or unchanged is None else unchanged
        answer = response(review.uid, patch=patch, warnings=warnings)
        return self._count(review, answer, label)

    async def _recheck_pool_access(self, review: Review) -> None:
        """A counted pod that is no notebook whose tolerations change (Kueue admitting a gated
        pod adds its flavor's): under `--enforce-pool-access all-pods` every pool the pod can
        now reach must be one its namespace may use, as at CREATE (check_pool_access); under
        "notebooks" its pools were never checked, and its count does not read tolerations."""
        old, pod = review.old_pod or {}, review.pod
        labels = (old.get("metadata") or {}).get("labels") or {}
        if (
            self.enforce_pool_access != "all-pods"
            or LABEL_POOL in labels
            or COUNTED_LABEL not in labels
            or not tolerations_changed(old, pod)
            or notebook_kind(pod) is not None
        ):
            return
        ns = review.namespace
        rule = await self._rule(ns)
        check_pool_access(pod, catalog=self.catalog, rule=rule, namespace=ns)

    async def _rule(self, ns: str) -> AccessRule:
        """The access rule of namespace `ns`, from its labels and annotations (an API read)."""
        labels, annotations = await self._read(self.cluster.namespace(ns))
        return namespace_rule(self.catalog, ns, labels, annotations)

    async def _create(self, review: Review, source: str = "") -> dict[str, Any]:
        ns = review.namespace
        pod = review.pod
        if self.dra is not None:  # claims from templates: pools and quota, in words
            await self.dra.check_pod(ns, pod)
        # only notebook pods are mapped; any other pod is counted against the quota and
        # otherwise left as it is (recognise.py). Every pod's containers that hold no GPU of
        # their own are checked for GPU visibility through env; a pod asking for no GPU passes
        # before any API call: it never waits on, or fails with, the API server (one for KAI or
        # Run:ai is only marked, a patch)
        notebook = notebook_kind(pod) is not None
        other_gpu = 0.0 if notebook else gpu_equivalent_of_pod(pod, self.catalog)
        if not notebook:
            refuse_visible_gpus(pod, ns, schedulers=self.fraction_schedulers)
            refuse_gpu_container_env(pod, ns, self.device_list_strategy)
            refuse_isolation_env(pod, ns, self.catalog)
        if not (slice_ask(pod, self.catalog, AccessRule()) if notebook else other_gpu):
            if notebook:
                refuse_visible_gpus(pod, ns, schedulers=self.fraction_schedulers)
            if sized_when_scheduled(pod, self.catalog) and LABEL_POOL not in (
                (pod.get("metadata") or {}).get("labels") or {}
            ):
                # KAI/Run:ai size it from its annotations when they schedule it: counted as 0,
                # and marked so that its updates go to the guard's second webhook, which keeps
                # its ask annotations and tolerations as they are now (no GPU). Only a patch:
                # still no API call, still "skipped" (nothing counted)
                out = json.loads(json.dumps(pod))
                out.setdefault("metadata", {}).setdefault("labels", {})[COUNTED_LABEL] = "true"
                log.debug(
                    "marked %s/%s: no GPU, for %s",
                    ns,
                    review.name or "(new pod)",
                    (pod.get("spec") or {}).get("schedulerName"),
                )
                return self._answer(review, out, "skipped")
            return self._answer(review, pod, "skipped")
        rule = await self._rule(ns)
        warnings: list[str] = []
        if review.dry_run and not self.detailed_refusals and rule.max_gpu is not None:
            # whoever asks may not be the API server: a dry run's answer would tell them the
            # namespace's headroom (ask for 0.125, 0.25, ... and see where it turns), and it
            # persists nothing, so nothing needs its quota: the real create is checked
            rule = AccessRule(pools=rule.pools, max_gpu=None)
            warnings.append(DRY_RUN_WARNING)
        meta = pod.get("metadata") or {}
        name = str(meta.get("name") or "")
        # a generateName pod: a key derived from this call; the key an earlier call of this
        # admission wrote is kept only where the ledger says it may be (a reinvocation)
        key = name or reservation_key(
            ns, {"uid": review.uid, "userInfo": {"username": review.user}}
        )
        given = str((meta.get("annotations") or {}).get(RESERVATION_ANNOTATION) or "")
        reuse = given if not name and 0 < len(given) <= 63 else None
        decided: list[Any] = []

        def decide(pending: float) -> float:
            # what the namespace holds now (the watch) + admitted but not yet in the watch
            used = self.pods.held(ns, exclude=name or None) + pending
            if not notebook:
                if self.enforce_pool_access == "all-pods":
                    check_pool_access(pod, catalog=self.catalog, rule=rule, namespace=ns)
                args = {"catalog": self.catalog, "rule": rule, "namespace": ns, "used_gpu": used}
                decided[:] = [None, used]
                return other_pod_gpu(pod, **args)
            admitted = admit(pod, catalog=self.catalog, rule=rule, namespace=ns, used_gpu=used)
            assert admitted is not None
            # the sidecars and init containers of the mapped pod (reserved env removed), and
            # its notebook container's envFrom
            refuse_visible_gpus(admitted.pod, ns, schedulers=self.fraction_schedulers)
            refuse_gpu_container_env(admitted.pod, ns, self.device_list_strategy)
            decided[:] = [admitted, used]
            return admitted.plan.gpu_equivalent

        reserved = False
        if rule.max_gpu is None:
            decide(0.0)  # no quota: nothing to count, nothing to reserve
        else:
            await self._read(self.watch.wait_synced(self.cluster.timeout))
            if reuse and not review.dry_run and await self._key_in_use(ns, reuse):
                reuse = None  # a created pod carries it: this is a copy, not a reinvocation

            def claims_due() -> int:  # a DRA notebook's claims, each taking its part over
                admitted = decided[0] if decided else None
                return self.dra.claims_due(admitted.pod) if self.dra and admitted else 0

            try:
                _, key = await self._read(
                    self.ledger.admit_keyed(
                        ns,
                        key,
                        key,
                        decide,
                        dry_run=review.dry_run,
                        source=source,
                        user=review.user,
                        reuse=reuse,
                        claims=claims_due,
                    )
                )
            except Busy:
                raise Refusal(
                    "fracspawner is admitting other GPU pods of this namespace; try again",
                    "unavailable",
                ) from None
            reserved = True
            self.metrics.reserved.set(self.ledger.total())
        admitted, used = decided
        if self.dra is not None and admitted is not None:  # a DRA offer: its claim template
            await self.dra.make_templates(ns, admitted.plan, review.dry_run)
        out = json.loads(json.dumps(pod if admitted is None else admitted.pod))
        if reserved and not name:
            # a generateName pod: the watch finds its reservation by this key (quota.py), and
            # a consistent list by the label (`_key_in_use`)
            out["metadata"].setdefault("annotations", {})[RESERVATION_ANNOTATION] = key
            out["metadata"].setdefault("labels", {})[RESERVATION_ANNOTATION] = key
        elif name and RESERVATION_ANNOTATION in (out["metadata"].get("annotations") or {}):
            # a named pod's is a tenant's: the watch would take it for a reservation's key
            del out["metadata"]["annotations"][RESERVATION_ANNOTATION]
        if admitted is None:
            # counted and checked by what it asks now: its updates go to the guard's second
            # webhook (objectSelector on this label), which keeps that as it was (guard_update)
            out["metadata"].setdefault("labels", {})[COUNTED_LABEL] = "true"
            log.info("counted %s/%s: %.6g GPU", ns, review.name or "(new pod)", other_gpu)
            return self._answer(review, out, "allowed", warnings=warnings)
        answer = self._answer(review, out, "mutated", "unchanged", warnings=warnings)
        log.info(
            "%s %s/%s: %s on %s (%s GPU; namespace holds %.6g)",
            "mutated" if "patch" in answer["response"] else "unchanged",
            ns,
            review.name or "(new pod)",
            admitted.ask.options["gpu"],
            admitted.pod["metadata"]["labels"]["fracspawner.io/pool"],
            f"{admitted.plan.gpu_equivalent:g}",
            used + admitted.plan.gpu_equivalent,
        )
        return answer

    async def _key_in_use(self, namespace: str, key: str) -> bool:
        """Whether a pod the API server created carries reservation key `key` (label): a
        consistent list, not the watch, which may not have a pod created a moment ago, whose
        key its creator read from the create's answer. Unknown counts as in use (the copy
        then gets a reservation of its own: counted twice for a window, never too little)."""
        labelled = getattr(self.cluster, "pods_labelled", None)
        if labelled is None:
            return False
        try:
            return bool(await labelled(namespace, RESERVATION_ANNOTATION, key))
        except ApiUnavailable:
            return True

    @staticmethod
    async def _read(awaitable: Any) -> Any:
        try:
            return await awaitable
        except ApiUnavailable as exc:
            raise Refusal(
                f"fracspawner cannot check GPU access and quota right now ({exc}); try again "
                "in a minute",
                "unavailable",
            ) from None


class MutateHandler(web.RequestHandler):
    def initialize(self, webhook: Webhook) -> None:
        self.webhook = webhook

    def check_xsrf_cookie(self) -> None:  # the API server posts JSON, no cookies
        return None

    async def post(self) -> None:
        started = time.perf_counter()
        if self.webhook.verify_clients:
            # the TLS layer verified any certificate presented; /mutate needs one (the probes
            # and Prometheus on the same port have none)
            cert = self.request.get_ssl_certificate()
            names = self.webhook.client_names
            if not cert or (names and not names & peer_names(cert)):
                log.warning(
                    "403 from %s: %s",
                    self.request.remote_ip,
                    "no client certificate" if not cert else "not among --client-name",
                )
                self.set_status(403)
                self.finish({"error": "this client may not send admission reviews"})
                return
        else:
            tenant = self.webhook.callers.tenant(self.request.remote_ip)
            if tenant is not None:
                # a pod's address: a tenant posting reviews of its own making (callers.py)
                self.webhook.metrics.pod_callers.inc()
                log.warning("403 from %s: pod %s/%s", self.request.remote_ip, *tenant)
                self.set_status(403)
                self.finish({"error": "admission reviews are accepted from the API server only"})
                return
        body = _json(self.request.body)
        if is_claim_review(body):  # DRA: a ResourceClaim (kubeflow/claims.py)
            source = "" if self.webhook.verify_clients else str(self.request.remote_ip or "?")
            try:
                answer = await review_claim(self.webhook.dra, body, source)
            except Exception:  # as for pods: a bug refuses the claim (a 500 is admitted under
                # failurePolicy Ignore, which --failure-policy allows)
                request = body.get("request") or {}
                log.exception(
                    "admission of ResourceClaim %s/%s failed",
                    request.get("namespace"), request.get("name"),
                )  # fmt: skip
                words = "fracspawner's webhook failed on this claim; see its log"
                refusal = Refusal(words, "error")
                answer = response(str(request.get("uid") or ""), refusal=refusal)
                self.webhook.metrics.refusals.labels("error").inc()
                self.webhook.metrics.admissions.labels("CREATE", "refused").inc()
            self.webhook.metrics.duration.observe(time.perf_counter() - started)
            self.set_header("Content-Type", "application/json")
            self.finish(json.dumps(answer))
            return
        try:
            review = parse_review(self.request.body)
        except BadReview as exc:
            self.webhook.metrics.bad_requests.inc()
            log.warning("400 from %s: %s", self.request.remote_ip, exc)
            self.set_status(400)
            self.finish({"error": f"not an AdmissionReview v1 for a pod: {exc}"})
            return
        try:
            source = "" if self.webhook.verify_clients else str(self.request.remote_ip or "?")
            answer = await self.webhook.review(review, source)
        except Exception:  # a bug must not take the webhook down; the pod is refused
            log.exception("admission of %s/%s failed", review.namespace, review.name)
            refusal = Refusal("fracspawner's webhook failed on this pod; see its log", "error")
            answer = response(review.uid, refusal=refusal)
            self.webhook.metrics.refusals.labels("error").inc()
            self.webhook.metrics.admissions.labels(review.operation, "refused").inc()
        self.webhook.metrics.duration.observe(time.perf_counter() - started)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(answer))


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None


class HealthHandler(web.RequestHandler):
    def get(self) -> None:
        self.set_header("Content-Type", "text/plain")
        self.finish("ok\n")


class MetricsHandler(web.RequestHandler):
    def initialize(self, webhook: Webhook) -> None:
        self.webhook = webhook

    def get(self) -> None:
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(generate_latest(self.webhook.metrics.registry))


def make_app(webhook: Webhook) -> web.Application:
    return web.Application(
        [
            (r"/mutate", MutateHandler, {"webhook": webhook}),
            (r"/healthz", HealthHandler),
            (r"/metrics", MetricsHandler, {"webhook": webhook}),
        ]
    )


def tls_context(cert: str, key: str, client_ca: str | None = None) -> ssl.SSLContext:
    """The serving context; with `client_ca`, a client certificate is verified against it (the
    API server's, from the kubeConfigFile of its AdmissionConfiguration: docs/kubeflow.md).
    Optional at the TLS layer, so the kubelet's probes still connect; /mutate requires it."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    if client_ca:
        context.load_verify_locations(cafile=client_ca)
        context.verify_mode = ssl.CERT_OPTIONAL
    return context


def peer_names(cert: dict[str, Any] | None) -> set[str]:
    """The common name and DNS names of a verified client certificate."""
    if not cert:
        return set()
    names = {v for rdn in cert.get("subject", ()) for k, v in rdn if k == "commonName"}
    return names | {v for k, v in cert.get("subjectAltName", ()) if k == "DNS"}


class CertificateReloader:
    """Loads a renewed certificate (cert-manager, the chart's Secret) into the live context:
    new connections get it, no restart. A half-written pair is retried at the next check."""

    def __init__(self, context: ssl.SSLContext, cert: str, key: str) -> None:
        self.context, self.cert, self.key = context, cert, key
        self.seen = self._stamp()

    def _stamp(self) -> tuple[float, float]:
        return (os.stat(self.cert).st_mtime, os.stat(self.key).st_mtime)

    def check(self) -> None:
        try:
            stamp = self._stamp()
            if stamp != self.seen:
                self.context.load_cert_chain(self.cert, self.key)
                self.seen = stamp
                log.info("loaded the renewed certificate %s", self.cert)
        except (OSError, ssl.SSLError) as exc:
            log.warning("certificate %s not reloaded yet: %s", self.cert, exc)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Mutating admission webhook: gives pods in Kubeflow profile namespaces "
        "their GPU slice, with the catalog's access rules and quotas.",
    )
    parser.add_argument("--catalog", required=True, metavar="FILE", help="catalog YAML file")
    parser.add_argument("--port", type=int, default=8443, help="HTTPS port (default 8443)")
    parser.add_argument("--address", default="0.0.0.0", help="address to listen on")
    parser.add_argument("--tls-cert", required=True, metavar="FILE", help="serving certificate")
    parser.add_argument("--tls-key", required=True, metavar="FILE", help="its private key")
    parser.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="kubeconfig (default: in-cluster config in a pod, else $KUBECONFIG, ~/.kube/config)",
    )
    parser.add_argument(
        "--reservation-ttl",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="longest an admitted pod counts against its namespace's quota before the pod watch "
        "shows it (a pod that never appears, e.g. refused by a later webhook, frees it then)",
    )
    parser.add_argument(
        "--ledger-namespace",
        metavar="NS",
        help="keep quota reservations in ConfigMaps fracspawner-quota.<namespace> in NS, shared "
        "by every replica (required with more than one replica); default: in this process",
    )
    parser.add_argument(
        "--client-ca",
        metavar="FILE",
        help="require a client certificate signed by this CA (the API server's, configured in "
        "its AdmissionConfiguration kubeConfigFile); refusals then give the details",
    )
    parser.add_argument(
        "--client-name",
        action="append",
        default=[],
        metavar="NAME",
        help="with --client-ca: the certificate's common name or a DNS name must be NAME "
        "(repeatable)",
    )
    parser.add_argument(
        "--detailed-refusals",
        action="store_true",
        help="say a namespace's usage, quota and pools in refusals without --client-ca (only "
        "where nothing but the API server can reach the webhook)",
    )
    parser.add_argument(
        "--enforce-pool-access",
        choices=("notebooks", "all-pods"),
        default="notebooks",
        help="whose GPU a namespace's pool access rule binds: notebook pods only (default; "
        "other pods are counted against the quota wherever they run), or every pod asking for "
        "GPU, which must then be pinned (nodeSelector) to pools the namespace may use",
    )
    parser.add_argument(
        "--override-visible-devices",
        choices=("env-from", "all"),
        default="env-from",
        help="write NVIDIA_VISIBLE_DEVICES=void into the containers holding no GPU that take "
        "env through envFrom (default), or into all of them: that also hides the GPUs a "
        "container's image would show it (CUDA images set NVIDIA_VISIBLE_DEVICES=all)",
    )
    parser.add_argument(
        "--device-list-strategy",
        choices=DEVICE_LIST_STRATEGIES,
        default="envvar",
        help="how the NVIDIA device plugin of every GPU node hands out devices (its "
        "deviceListStrategy). envvar (its default): a container's own env can choose them, so "
        "a container holding a GPU may not take envFrom. Declare volume-mounts or cdi-* only "
        "where the container toolkit also sets accept-nvidia-visible-devices-envvar-when-"
        "unprivileged = false: envFrom is then allowed there (docs/kubeflow.md)",
    )
    parser.add_argument(
        "--trusted-pod-namespace",
        action="append",
        metavar="NS",
        help="without --client-ca, a review sent from the address of a pod is refused (a "
        "tenant's, never the API server's), except from pods of these namespaces, which may "
        "relay the API server (Konnectivity agents); repeatable, default: kube-system",
    )
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING")
    return parser


async def serve(args: argparse.Namespace, catalog: Catalog, context: ssl.SSLContext) -> None:
    cluster = Cluster(await load_configuration(args.kubeconfig))
    webhook = Webhook(
        catalog,
        cluster,
        ledger_namespace=args.ledger_namespace,
        window=args.reservation_ttl,
        detailed_refusals=bool(args.client_ca) or args.detailed_refusals,
        trusted_namespaces=args.trusted_pod_namespace or DEFAULT_TRUSTED,
        enforce_pool_access=args.enforce_pool_access,
        override_visible_devices=args.override_visible_devices,
        device_list_strategy=args.device_list_strategy,
    )
    webhook.verify_clients = bool(args.client_ca)
    webhook.client_names = set(args.client_name)
    webhook.start()
    server = HTTPServer(make_app(webhook), ssl_options=context, max_body_size=MAX_BODY)
    server.listen(args.port, args.address)
    reloader = CertificateReloader(context, args.tls_cert, args.tls_key)
    PeriodicCallback(reloader.check, 30_000).start()
    log.info(
        "serving https://%s:%s/mutate (pools: %s)",
        args.address,
        args.port,
        ", ".join(catalog.pools),
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.stop()
    await server.close_all_connections()
    await webhook.stop()
    await cluster.close()


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="[%(levelname).1s %(asctime)s %(name)s] %(message)s"
    )
    try:
        catalog = load_catalog(args.catalog)
    except CatalogError as exc:
        print(f"{PROG}: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    files = [("--tls-cert", args.tls_cert), ("--tls-key", args.tls_key)]
    if args.client_name and not args.client_ca:
        print(f"{PROG}: --client-name needs --client-ca", file=sys.stderr)
        return 2
    for flag, path in files + ([("--client-ca", args.client_ca)] if args.client_ca else []):
        if not Path(path).is_file():
            print(f"{PROG}: {flag} {path}: no such file", file=sys.stderr)
            return 2
    try:
        context = tls_context(args.tls_cert, args.tls_key, args.client_ca)
    except (ssl.SSLError, OSError) as exc:
        print(f"{PROG}: cannot use --tls-cert/--tls-key/--client-ca: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve(args, catalog, context))
    except (OSError, ConfigException) as exc:  # port taken, no usable kubeconfig
        print(f"{PROG}: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    return 0
