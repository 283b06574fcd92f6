"""GPU held via claims: Kubernetes DRA ResourceClaims in a profile namespace, for the webhook.

A GPU asked through `spec.resourceClaims` holds no extended resource, so the pod watch sees
none of it. This source reads the claims themselves:
- `claim_ask(spec, catalog)`: what a ResourceClaim spec (or a ResourceClaimTemplate's
  `spec.spec`) asks of the catalog's DRA pools: which pools its devices could come from and
  how many GPU-equivalents it holds there (the worst case over those pools);
- `ClaimIndex` / `ClaimWatch`: what each namespace's claims hold, from a watch of every
  ResourceClaim (as quota.PodIndex / cluster.PodWatch for pods).

Which pools a request can reach: its DeviceClass must be a DRA pool's `device_class` (or
`mig_device_class` for MIG profiles); CEL selectors the catalog's templates write
(`device.attributes['<driver>'].productName == '...'`, `.profile == '...'`) narrow the pools;
any other expression only narrows the devices further (a selector can never widen a class),
so the pools left are a superset of where the claim can land, and counting the worst of them
never counts too little. Claims of other classes (a NIC, another vendor's device) are not
GPU claims of the catalog and pass. `allocationMode: All` cannot be counted: refused.

GPU-equivalents: a MIG profile as its compute slices; on a pool without consumable shares,
whole devices; on a consumable-shares pool (`sharing: memory|shares|unlimited`), what the
scheduler's allocator gives the request (a `memory: 1Mi` takes a whole share: the driver's
request policies, backends/dra_sizes.py), counted as the offer it matches (10Gi of an H100 is
0.125, as the hub's quota counts it); times the request's count. The webhook refuses a size
no pool the request may land on offers, with the sizes offered; the claim watch counts one
(a claim made before the webhook ran) as the next offer up.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..backends import get_backend
from ..backends.dra import DEFAULT_DRIVER, DEFAULT_GPU_CLASS, DEFAULT_MIG_CLASS, product_name
from ..backends.dra_sizes import SHARING_POOLS, offer_sizes, request_size
from ..k8s.objects import quantity
from ..model.catalog import Catalog, Pool
from ..model.slices import gpu_equivalent, parse_slice
from .quota import RESERVATION_ANNOTATION, reservation_key

log = logging.getLogger("fracspawner.webhook")
_CEL = re.compile(
    r"""^\s*device\.attributes\[\s*(['"])(?P<domain>[^'"]+)\1\s*\]\s*\.\s*"""
    r"""(?P<attr>productName|profile)\s*==\s*(['"])(?P<value>[^'"]*)\4\s*$"""
)


class ClaimRefused(Exception):
    """A GPU claim that cannot be admitted; the message is for the namespace's user."""


@dataclass(frozen=True)
class ClaimAsk:
    pools: tuple[str, ...]  # the catalog pools its GPU devices could come from
    gpu: float  # GPU-equivalents it holds (worst case over `pools`)
    words: str  # what it asks, for messages


NOT_GPU = ClaimAsk((), 0.0, "no GPU of the catalog")


def _dra_pools(catalog: Catalog) -> list[Pool]:
    out = []
    for pool in catalog.pools.values():
        try:
            if getattr(get_backend(pool.backend), "uses_dra", False):
                out.append(pool)
        except ValueError:
            continue
    return out


def _opt(pool: Pool, key: str, default: str) -> str:
    return str((pool.options or {}).get(key) or default)


def _requests(spec: Mapping[str, Any]) -> list[tuple[str, list[dict[str, Any]]]]:
    """(request name, its alternatives): `exactly` is one, `firstAvailable` each subrequest."""
    out = []
    for request in (spec.get("devices") or {}).get("requests") or ():
        if not isinstance(request, Mapping):
            continue
        name = str(request.get("name") or "?")
        if request.get("exactly") is not None:
            out.append((name, [dict(request["exactly"])]))
        elif request.get("firstAvailable"):
            out.append((name, [dict(r) for r in request["firstAvailable"]]))
    return out


def _pool_equivalent(
    pool: Pool, mig: bool, profile: str | None, ask: Mapping[str, Any]
) -> tuple[float, bool]:
    """(GPU-equivalents the request holds on `pool`, whether its size is one the pool offers)."""
    count = int(ask.get("count") or 1)
    if mig:
        if profile and profile in pool.gpu.mig_profiles:
            return count * gpu_equivalent(parse_slice(f"mig-{profile}"), pool.gpu), True
        return float(count), True  # any profile: the largest is the whole GPU
    capacity = (ask.get("capacity") or {}).get("requests") or {}
    sharing = (pool.options or {}).get("sharing", "none")
    if sharing not in SHARING_POOLS:
        return float(count), True  # whole devices, whatever it names
    amounts = {str(k): quantity(v) for k, v in capacity.items()}
    requests = {k: v for k, v in amounts.items() if v is not None and v >= 0}
    if not capacity:  # the request policy's default: one share, or all the memory
        if sharing == "unlimited":
            return float(count), True  # books nothing, and may use the whole GPU
        per_device, _ = request_size(pool, {})
        return count * per_device, True
    # what the allocator gives it (a share at least on a shares pool), as an offer
    per_device, offered = request_size(pool, requests)
    return count * per_device, offered and len(requests) == len(amounts)


def _not_offered(name: str, ask: Mapping[str, Any], pools: list[Pool]) -> ClaimRefused:
    capacity = (ask.get("capacity") or {}).get("requests") or {}
    asked = ", ".join(f"{k}: {v}" for k, v in sorted(capacity.items()))
    offers = "; ".join(
        f"{p.name}: {', '.join(o.words for o in offer_sizes(p)) or 'whole GPUs'}" for p in pools
    )
    return ClaimRefused(
        f"request {name} asks {asked}, a size {', '.join(p.name for p in pools)} does not "
        f"offer (its claims take the allocator's shares, not what they name); ask one of the "
        f"offered sizes: {offers}"
    )


def claim_ask(spec: Mapping[str, Any], catalog: Catalog, strict: bool = True) -> ClaimAsk:
    """What a ResourceClaimSpec asks of the catalog's DRA pools; ClaimRefused when a GPU
    request cannot be counted, or (`strict`) asks a size no pool it may land on offers
    (backends/dra_sizes.py); not strict, such a size counts as the next offer up."""
    pools = _dra_pools(catalog)
    if not pools:
        return NOT_GPU
    reached: set[str] = set()
    total = 0.0
    words = []
    for name, alternatives in _requests(spec):
        worst = 0.0
        for ask in alternatives:
            cls = ask.get("deviceClassName")
            gpu_pools = [p for p in pools if _opt(p, "device_class", DEFAULT_GPU_CLASS) == cls]
            # only nodes that run MIG publish MIG devices
            mig_pools = [
                p
                for p in pools
                if _opt(p, "mig_device_class", DEFAULT_MIG_CLASS) == cls
                and _opt(p, "mig", "none") != "none"
            ]
            if not gpu_pools and not mig_pools:
                continue  # not a GPU class of the catalog
            mig = not gpu_pools
            candidates = gpu_pools or mig_pools
            profile = None
            for selector in ask.get("selectors") or ():
                match = _CEL.match(str(((selector or {}).get("cel") or {}).get("expression", "")))
                if not match:
                    continue  # narrows the devices further: the pools stay a superset
                value = match.group("value")
                if match.group("attr") == "profile":
                    profile = value
                else:
                    candidates = [
                        p
                        for p in candidates
                        if match.group("domain") != _opt(p, "driver", DEFAULT_DRIVER)
                        or product_name(p) in (None, value)
                    ]
            if ask.get("allocationMode") == "All":
                raise ClaimRefused(
                    f"request {name} asks for all devices of class {cls}; fracspawner cannot "
                    "count that against the quota: ask for a count"
                )
            if not candidates:
                continue  # the selectors match no pool's model: no device of the catalog
            reached.update(p.name for p in candidates)
            sizes = [_pool_equivalent(p, mig, profile, ask) for p in candidates]
            if strict and not any(offered for _, offered in sizes):
                raise _not_offered(name, ask, candidates)
            amount = max(amount for amount, _ in sizes)
            worst = max(worst, amount)
            if amount:
                words.append(f"{name}: {amount:g} GPU of {', '.join(p.name for p in candidates)}")
        total += worst
    if not reached:
        return NOT_GPU
    pool_order = tuple(p.name for p in pools if p.name in reached)
    return ClaimAsk(pool_order, total, "; ".join(words))


# --------------------------------------------------------------------------- the index
def _owner_pods(claim: Mapping[str, Any]) -> tuple[str, ...]:
    refs = (claim.get("metadata") or {}).get("ownerReferences") or ()
    return tuple(str(r.get("name")) for r in refs if r.get("kind") == "Pod" and r.get("name"))


class ClaimIndex:
    """GPU-equivalents each namespace's ResourceClaims hold (a claim holds from creation until
    it is deleted: the scheduler may allocate it any time), fed by ClaimWatch. A claim the
    catalog cannot count (made before the webhook ran) counts as a whole GPU per request."""

    def __init__(
        self, amount: Callable[[Mapping[str, Any]], float], clock: Callable[[], float] = time.time
    ) -> None:
        self.amount = amount
        self.clock = clock
        self._claims: dict[str, dict[str, float]] = {}
        #: (namespace, name) -> when it left the watch: its reservation must not come back
        self._gone: dict[tuple[str, str], float] = {}
        #: (namespace, pod name) -> claims owned by that pod
        self._owners: dict[tuple[str, str], set[str]] = {}
        #: (namespace, reservation annotation) -> the claim carrying it (a generateName claim
        #: has no name at admission: the webhook writes its reservation key there)
        self._keys: dict[tuple[str, str], str] = {}
        #: (namespace, name or reservation annotation) -> when the watch first had it
        self._first: dict[tuple[str, str], float] = {}
        self.synced = False

    @staticmethod
    def _where(claim: Mapping[str, Any]) -> tuple[str, str]:
        meta = claim.get("metadata") or {}
        return str(meta.get("namespace") or ""), str(meta.get("name") or "")

    @staticmethod
    def _key(claim: Mapping[str, Any]) -> str:
        annotations = (claim.get("metadata") or {}).get("annotations") or {}
        return str(annotations.get(RESERVATION_ANNOTATION) or "")

    def load(self, claims: Iterable[Mapping[str, Any]]) -> None:
        before = {(ns, name) for ns, names in self._claims.items() for name in names}
        keys = dict(self._keys)
        self._claims, self._owners, self._keys = {}, {}, {}
        for claim in claims:
            self.put(claim)
        now = self.clock()
        for key in before - {(ns, name) for ns, names in self._claims.items() for name in names}:
            self._gone[key] = now
        for marked in keys.keys() - self._keys.keys():
            self._gone[marked] = now
        self.synced = True

    def put(self, claim: Mapping[str, Any]) -> None:
        ns, name = self._where(claim)
        value = self.amount(claim)
        self._gone.pop((ns, name), None)
        now = self.clock()
        self._first.setdefault((ns, name), now)
        key = self._key(claim)
        if key:
            self._keys[(ns, key)] = name
            self._gone.pop((ns, key), None)
            self._first.setdefault((ns, key), now)
        if value > 0:
            self._claims.setdefault(ns, {})[name] = value
            for pod in _owner_pods(claim):
                self._owners.setdefault((ns, pod), set()).add(name)
        else:
            self.drop(claim)

    def drop(self, claim: Mapping[str, Any]) -> None:
        ns, name = self._where(claim)
        names = self._claims.get(ns, {})
        if names.pop(name, None) is not None:
            now = self.clock()
            self._gone[(ns, name)] = now
            for key in [k for k, at in self._gone.items() if at < now - 600]:
                del self._gone[key]
                self._first.pop(key, None)
        if not names:
            self._claims.pop(ns, None)
        key = self._key(claim)
        if key and self._keys.get((ns, key)) == name:
            del self._keys[(ns, key)]
            self._gone[(ns, key)] = self.clock()
        for pod in _owner_pods(claim):
            owned = self._owners.get((ns, pod))
            if owned is not None:
                owned.discard(name)
                if not owned:
                    del self._owners[(ns, pod)]

    def held(self, namespace: str, exclude: str | None = None) -> float:
        return sum(v for k, v in self._claims.get(namespace, {}).items() if k != exclude)

    def has(self, namespace: str, name: str) -> bool:
        """Whether the claim named `name`, or carrying reservation annotation `name`, is in
        the watch."""
        return name in self._claims.get(namespace, {}) or (namespace, name) in self._keys

    def seen_since(self, namespace: str, name: str, since: float) -> bool:
        """Whether the claim is in the watch, or left it after `since` (a deleted claim's
        reservation must not count again until its window ends)."""
        gone = self._gone.get((namespace, name))
        return self.has(namespace, name) or (gone is not None and gone >= since)

    def appeared_since(self, namespace: str, name: str, since: float) -> bool:
        """Whether the claim entered the watch at or after `since` (made for a reservation
        made then, not there already)."""
        first = self._first.get((namespace, name))
        return first is not None and first >= since and self.seen_since(namespace, name, since)

    def owned_by(self, namespace: str, pod: str) -> bool:
        return bool(self._owners.get((namespace, pod)))


def claim_amount(catalog: Catalog) -> Callable[[Mapping[str, Any]], float]:
    """What ClaimIndex counts for one claim: its ask, or a whole GPU per request where the
    ask cannot be counted (unknown is never free)."""

    def amount(claim: Mapping[str, Any]) -> float:
        spec = claim.get("spec") or {}
        try:
            return claim_ask(spec, catalog, strict=False).gpu
        except ClaimRefused:
            return float(len(_requests(spec)) or 1)

    return amount


class ClaimWatch:
    """Every ResourceClaim of the cluster into a ClaimIndex: the pod watch's loop
    (cluster.PodWatch: list, watch from its resourceVersion, relist after a backoff, never
    giving up) on resource.k8s.io/v1 resourceclaims."""

    def __init__(self, pod_watch_class: type, api_client: Any, index: ClaimIndex, timeout: float):
        self._args = (pod_watch_class, api_client, timeout)
        self.index = index
        self._watch: Any = None

    def start(self) -> None:
        from kubernetes_asyncio import client

        watch_class, api_client, timeout = self._args
        lister = _ClaimLister(client.ResourceV1Api(api_client))
        self._watch = watch_class(lister, self.index, timeout=timeout)
        self._watch.start()

    async def stop(self) -> None:
        if self._watch is not None:
            await self._watch.stop()

    async def wait_synced(self, timeout: float) -> None:
        if self.index.synced:
            return
        if self._watch is None:
            from .cluster import ApiUnavailable

            raise ApiUnavailable("the claim watch is not running")
        await self._watch.wait_synced(timeout)


class _ClaimLister:
    """Looks like CoreV1Api to PodWatch: its pod list call lists claims (without the pods'
    phase field selector: claims have none)."""

    def __init__(self, resource: Any) -> None:
        self._resource = resource

    def list_pod_for_all_namespaces(self, **kwargs: Any) -> Any:
        kwargs.pop("field_selector", None)
        return self._resource.list_resource_claim_for_all_namespaces(**kwargs)


async def read_template(api_client: Any, namespace: str, name: str, timeout: float) -> dict:
    """A ResourceClaimTemplate (None: there is none); raises on other API failures."""
    from kubernetes_asyncio import client

    api = client.ResourceV1Api(api_client)
    response = await asyncio.wait_for(
        api.read_namespaced_resource_claim_template(name, namespace, _preload_content=False),
        timeout,
    )
    if response.status == 404:
        return {}
    if response.status != 200:
        raise RuntimeError(f"the Kubernetes API answered {response.status}")
    return json.loads(await response.read())


# --------------------------------------------------------------------------- the webhook's part
#: ledger keys of reservations made for claims (pods' keys are their names)
CLAIM_KEY = "resourceclaim/"
GENERIC = {
    "quota": "the namespace has no GPU quota left for it",
    "access": "the namespace may not use it",
}
#: said to a dry run whose caller is not known to be the API server
DRY_RUN_WARNING = (
    "fracspawner does not check the namespace's GPU quota on a dry run unless the webhook can "
    "verify the API server's certificate; the real create is checked"
)


def is_claim_review(review: Any) -> bool:
    request = review.get("request") if isinstance(review, Mapping) else None
    kind = (request or {}).get("kind") if isinstance(request, Mapping) else None
    return isinstance(kind, Mapping) and (kind.get("group"), kind.get("kind")) == (
        "resource.k8s.io",
        "ResourceClaim",
    )


async def review_claim(
    gate: DraGate | None, review: Mapping[str, Any], source: str = ""
) -> dict[str, Any]:
    """A ResourceClaim review: the gate's answer; allowed where the catalog has no DRA pool
    (nothing of it can be claimed)."""
    if gate is None:
        from .admission import response

        return response(str((review.get("request") or {}).get("uid") or ""))
    return await gate.review_claim(review, source)


def _mark_patch(meta: Mapping[str, Any], mark: str) -> list[dict[str, Any]] | None:
    """JSONPatch writing reservation key `mark` on a generateName claim; on a named claim, one
    removing an annotation of that name the tenant wrote (the watch would take it for a key)."""
    annotations = meta.get("annotations")
    path = "/metadata/annotations/" + RESERVATION_ANNOTATION.replace("/", "~1")
    if mark:
        if not isinstance(annotations, Mapping):
            return [{"op": "add", "path": "/metadata/annotations", "value": {
                RESERVATION_ANNOTATION: mark}}]  # fmt: skip
        return [{"op": "add", "path": path, "value": mark}]
    if isinstance(annotations, Mapping) and RESERVATION_ANNOTATION in annotations:
        return [{"op": "remove", "path": path}]
    return None


class _HeldView:
    """The pod index as the webhook and its ledger read it, with the claims' holdings added:
    a namespace holds its pods' GPUs and its claims'. A reservation of a pod whose claims are
    made from templates stays pending until a claim owned by the pod is in the claim watch
    (the pod alone holds nothing a watch sees)."""

    def __init__(self, pods: Any, gate: DraGate) -> None:
        self._pods = pods
        self._gate = gate

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pods, name)

    def held(self, namespace: str, exclude: str | None = None) -> float:
        return self._pods.held(namespace, exclude) + self._gate.claims.held(namespace)

    def seen_since(self, namespace: str, key: str, since: float) -> bool:
        if key.startswith(CLAIM_KEY):
            return self._gate.claims.seen_since(namespace, key[len(CLAIM_KEY) :], since)
        return self._pods.seen_since(namespace, key, since)

    def appeared_since(self, namespace: str, key: str, since: float) -> bool:
        if key.startswith(CLAIM_KEY):
            return self._gate.claims.appeared_since(namespace, key[len(CLAIM_KEY) :], since)
        return self._pods.appeared_since(namespace, key, since)


def _pod_claims_amount(
    base: Callable[[Mapping[str, Any]], float], catalog: Catalog
) -> Callable[[Mapping[str, Any]], float]:
    """A pod with claims holds what its spec asks (extended resources); the annotation the
    webhook wrote for its slice is what its claim holds, and the claim counts itself."""
    from .recognise import gpu_equivalent_of_pod

    def amount(pod: Mapping[str, Any]) -> float:
        if (pod.get("spec") or {}).get("resourceClaims"):
            return gpu_equivalent_of_pod(pod, catalog)
        return base(pod)

    return amount


class DraGate:
    """GPU held via claims, for the Kubeflow webhook: counts every GPU ResourceClaim of a
    namespace into its quota, refuses claims (and pods naming claim templates) for pools the
    namespace may not use or beyond its quota. `attach` wires it into a Webhook."""

    def __init__(self, webhook: Any) -> None:
        from .cluster import PodWatch

        self.webhook = webhook
        self.catalog: Catalog = webhook.catalog
        self.claims = ClaimIndex(claim_amount(self.catalog))
        cluster = webhook.cluster
        self.watch = ClaimWatch(PodWatch, cluster._api_client, self.claims, cluster.timeout)

    @classmethod
    def attach(cls, webhook: Any) -> DraGate | None:
        """None for a catalog without DRA pools (nothing changes)."""
        if not _dra_pools(webhook.catalog):
            return None
        gate = cls(webhook)
        pods = webhook.pods
        pods.amount = _pod_claims_amount(pods.amount, gate.catalog)
        view = _HeldView(pods, gate)
        webhook.pods = view
        webhook.ledger.pods = view
        return gate

    def start(self) -> None:
        self.watch.start()

    async def stop(self) -> None:
        await self.watch.stop()

    # ------------------------------------------------------------------ pods
    async def make_templates(self, namespace: str, plan: Any, dry_run: bool) -> None:
        """A notebook mapped to a DRA offer names the offer's ResourceClaimTemplate: make it in
        the namespace if it is not there (or not the catalog's), as the hub does for its
        servers (capacity/templates.py), so a namespace needs no export applied first. Not on
        a dry run (nothing may change). Refusal when it cannot be made: the pod would wait for
        a claim that is never made."""
        if dry_run or not getattr(plan, "claim_templates", ()):
            return
        from ..capacity.templates import ClaimTemplateError, ensure_claim_templates
        from .admission import Refusal

        try:
            await asyncio.wait_for(
                ensure_claim_templates(
                    self.webhook.cluster._api_client, namespace, plan.claim_templates
                ),
                self.webhook.cluster.timeout,
            )
        except ClaimTemplateError as exc:
            raise Refusal(str(exc), "unavailable") from None
        except Exception as exc:  # the API did not answer: the pod would wait for nothing
            raise Refusal(
                f"fracspawner cannot make the GPU claim template in namespace {namespace} "
                f"right now ({exc}); try again in a minute",
                "unavailable",
            ) from None

    @staticmethod
    def claims_due(pod: Mapping[str, Any] | None) -> int:
        """How many claims the resourceclaim controller will make for a pod (one per
        template it names): its reservation holds until each took its part over."""
        refs = ((pod or {}).get("spec") or {}).get("resourceClaims") or ()
        return sum(1 for r in refs if isinstance(r, Mapping) and r.get("resourceClaimTemplateName"))

    async def check_pod(self, namespace: str, pod: Mapping[str, Any]) -> None:
        """`pod_asks` for a pod naming claim templates, with the namespace's rule and quota
        (as its holdings stand: the claims are reserved when they are created)."""
        from ..model.access import namespace_rule
        from .admission import Refusal

        refs = (pod.get("spec") or {}).get("resourceClaims") or ()
        if not any(isinstance(r, Mapping) and r.get("resourceClaimTemplateName") for r in refs):
            return
        read = self.webhook._read
        labels, annotations = await read(self.webhook.cluster.namespace(namespace))
        rule = namespace_rule(self.catalog, namespace, labels, annotations)
        asked = await self.pod_asks(namespace, pod, rule)
        if not asked or rule.max_gpu is None:
            return
        await read(self.webhook.watch.wait_synced(self.webhook.cluster.timeout))
        await read(self.watch.wait_synced(self.webhook.cluster.timeout))
        used = self.webhook.pods.held(namespace)
        if used + asked > rule.max_gpu + 1e-9:
            raise Refusal(
                f"this pod's claims hold {asked:g} GPU; namespace {namespace} holds {used:g} "
                f"of its {rule.max_gpu:g} GPU quota",
                "quota",
            )

    async def pod_asks(self, namespace: str, pod: Mapping[str, Any], rule: Any) -> float:
        """A pod naming ResourceClaimTemplates: what their claims will ask; Refusal (access)
        when one can take GPUs of a pool the namespace may not use. Its claims are counted
        against the quota when the resourceclaim controller creates them (`review_claim`);
        this answers the pod in words before it waits on a claim that would be refused."""
        from .admission import Refusal

        total = 0.0
        for ref in (pod.get("spec") or {}).get("resourceClaims") or ():
            name = ref.get("resourceClaimTemplateName") if isinstance(ref, Mapping) else None
            if not name:
                continue
            try:
                template = await read_template(
                    self.webhook.cluster._api_client, namespace, name, self.webhook.cluster.timeout
                )
            except Exception as exc:
                raise Refusal(
                    f"fracspawner cannot read ResourceClaimTemplate {name} right now ({exc}); "
                    "try again in a minute",
                    "unavailable",
                ) from None
            if not template:
                continue  # the claim controller will wait for it; its claim is checked then
            spec = (template.get("spec") or {}).get("spec") or {}
            try:
                ask = claim_ask(spec, self.catalog)
            except ClaimRefused as exc:
                raise Refusal(f"ResourceClaimTemplate {name}: {exc}", "invalid") from None
            self._check_access(namespace, ask, rule, f"ResourceClaimTemplate {name}")
            total += ask.gpu
        return total

    def _check_access(self, namespace: str, ask: ClaimAsk, rule: Any, what: str) -> None:
        from .admission import Refusal

        if rule.pools is None:
            return
        forbidden = [p for p in ask.pools if p not in rule.pools]
        if forbidden:
            may = ", ".join(rule.pools) or "no GPU pool"
            raise Refusal(
                f"{what} can take GPUs of pool {', '.join(forbidden)}, which namespace "
                f"{namespace} may not use (it may use: {may})",
                "access",
            )

    # ------------------------------------------------------------------ claims
    async def review_claim(self, review: Mapping[str, Any], source: str = "") -> dict[str, Any]:
        """An AdmissionReview of a ResourceClaim: CREATE is checked, anything else allowed
        (a claim's spec is immutable). `source`: the caller's address where no certificate
        verified it (its reservations are judged by how they end: callers.SourceStandings)."""
        from .admission import Refusal, response

        request = review.get("request") or {}
        uid = str(request.get("uid") or "")
        if request.get("operation") != "CREATE":
            return response(uid)
        namespace = str(request.get("namespace") or "")
        claim = request.get("object") or {}
        metrics = self.webhook.metrics
        meta = claim.get("metadata") or {}
        # a generateName claim has no name yet: the watch finds its reservation by a key the
        # webhook writes on it, derived from this call (never one the tenant wrote)
        mark = "" if meta.get("name") else reservation_key(namespace, request)
        user = str((request.get("userInfo") or {}).get("username") or "")
        warnings: list[str] = []
        try:
            reserved = await self._admit_claim(
                namespace,
                claim,
                dry_run=bool(request.get("dryRun")),
                mark=mark,
                who=(source, user),
                warnings=warnings,
            )
        except Refusal as refusal:
            metrics.refusals.labels(refusal.reason).inc()
            metrics.admissions.labels("CREATE", "refused").inc()
            name = (claim.get("metadata") or {}).get("name") or "(new claim)"
            log.info("refused ResourceClaim %s/%s: %s", namespace, name, refusal.message)
            if not self.webhook.detailed_refusals and refusal.reason in GENERIC:
                refusal = Refusal(
                    f"fracspawner refused this ResourceClaim in namespace {namespace}: "
                    f"{GENERIC[refusal.reason]}",
                    refusal.reason,
                )
            return response(uid, refusal=refusal)
        metrics.admissions.labels("CREATE", "allowed").inc()
        patch = _mark_patch(meta, mark if reserved else "")
        return response(uid, patch=patch, warnings=warnings)

    def _owner_key(self, namespace: str, claim: Mapping[str, Any]) -> str | None:
        """The ledger key of the pod a claim names as its owner (the resourceclaim
        controller's claims do): its reservation's part for this claim is taken over, if the
        pod has claims due (anyone may name any pod; only a due claim takes anything over)."""
        owners = _owner_pods(claim)
        if not owners:
            return None
        keys = getattr(self.webhook.pods, "_keys", {})
        for (ns, key), name in list(keys.items()):
            if ns == namespace and name == owners[0]:
                return key
        return owners[0]

    async def _admit_claim(
        self,
        namespace: str,
        claim: Mapping[str, Any],
        dry_run: bool,
        mark: str = "",
        who: tuple[str, str] = ("", ""),
        warnings: list[str] | None = None,
    ) -> bool:
        """Refusal, or admitted: whether a reservation was made for it. `who`: (the caller's
        unverified address, the requesting user)."""
        from ..model.access import namespace_rule
        from .admission import Refusal
        from .quota import Busy

        try:
            ask = claim_ask(claim.get("spec") or {}, self.catalog)
        except ClaimRefused as exc:
            raise Refusal(str(exc), "invalid") from None
        if not ask.pools:
            return False  # no GPU of the catalog
        read = self.webhook._read
        labels, annotations = await read(self.webhook.cluster.namespace(namespace))
        rule = namespace_rule(self.catalog, namespace, labels, annotations)
        self._check_access(namespace, ask, rule, "this ResourceClaim")
        if rule.max_gpu is None:
            return False
        if dry_run and not self.webhook.detailed_refusals:
            # whoever asks may not be the API server: a dry run's answer would tell them the
            # namespace's headroom; it persists nothing, so only the namespace's own quota,
            # which says nothing of what it holds, is checked
            if ask.gpu > rule.max_gpu + 1e-9:
                raise Refusal(
                    f"this ResourceClaim holds {ask.gpu:g} GPU, more than the namespace's "
                    f"whole GPU quota",
                    "invalid",
                )
            if warnings is not None:
                warnings.append(DRY_RUN_WARNING)
            return False
        timeout = self.webhook.cluster.timeout
        await read(self.webhook.watch.wait_synced(timeout))
        await read(self.watch.wait_synced(timeout))
        meta = claim.get("metadata") or {}
        key = CLAIM_KEY + str(meta.get("name") or mark)
        owner = self._owner_key(namespace, claim)

        def decide(pending: float) -> float:
            used = self.webhook.pods.held(namespace) + pending
            if used + ask.gpu > rule.max_gpu + 1e-9:
                raise Refusal(
                    f"this ResourceClaim holds {ask.gpu:g} GPU ({ask.words}); namespace "
                    f"{namespace} holds {used:g} of its {rule.max_gpu:g} GPU quota",
                    "quota",
                )
            return ask.gpu

        source, user = who
        try:
            await read(
                self.webhook.ledger.admit(
                    namespace,
                    key,
                    key,
                    decide,
                    dry_run=dry_run,
                    source=source,
                    user=user,
                    take_over=(owner, ask.gpu) if owner else None,
                )
            )
        except Busy:
            raise Refusal(
                "fracspawner is admitting other GPU claims of this namespace; try again",
                "unavailable",
            ) from None
        return not dry_run
