"""Admission webhooks: MutatingWebhookConfiguration and ValidatingWebhookConfiguration
(admissionregistration.k8s.io/v1), called as kube-apiserver 1.33 calls them.

Followed from k8s.io/apiserver pkg/admission/plugin/webhook (generic/webhook.go
ShouldCallHook, predicates/rules, mutating/dispatcher.go, validating/dispatcher.go,
request/admissionreview.go, errors/statuserror.go) and pkg/apis/admissionregistration
(v1 defaults, validation):

- a webhook is called when a rule matches (operation, apiGroups, apiVersions, resources with
  `*`, `pods/*`, `*/status`, scope), the namespaceSelector matches the labels of the object's
  namespace (of the Namespace itself for namespaces; ignored for other cluster-scoped
  objects) and the objectSelector matches the object's or old object's labels; with
  matchPolicy Equivalent another served version of the resource matches too;
- mutating webhooks one after another, ordered by configuration name then position; a
  JSONPatch in the answer is applied to the object; with reinvocationPolicy IfNeeded a webhook
  is called once more if a later one changed the object; then the object is validated; then
  validating webhooks, concurrently;
- a refusal is the webhook's Status: `admission webhook "x" denied the request: <message>`,
  code 400 unless the webhook gave a code of 400 or more; a webhook that cannot be called, or
  answers with something that is not a valid AdmissionReview, fails the request with 500
  `Internal error occurred: failed calling webhook "x": ...` under failurePolicy Fail and is
  skipped under Ignore; a patch that does not apply is a 500 whatever the policy;
- webhook configurations themselves are never sent to webhooks (no lock-out).
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from . import jsonpatch, objectmeta
from .fielderrors import FieldError, duplicate, forbidden, invalid, not_supported, required
from .resources import MUTATING, VALIDATING, Resource
from .selectors import match_label_selector
from .store import ApiError, Store
from .webhookcall import CallError, Target, post, request_url

log = logging.getLogger("devcluster.admission")

OPERATIONS = ["*", "CREATE", "UPDATE", "DELETE", "CONNECT"]
REVIEW_VERSIONS = ("v1", "v1beta1")
#: kinds whose writes never go to webhooks, so a broken webhook cannot lock itself in
EXEMPT = frozenset({MUTATING, VALIDATING})
#: the user of requests without impersonation: the devcluster has no authentication
ADMIN = {"username": "system:admin", "groups": ["system:masters", "system:authenticated"]}


class Unreachable(Exception):
    """A Service that resolves to no address (the dial fails with `reason`)."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(reason)
        self.url, self.reason = url, reason


@dataclass
class RequestInfo:
    """Who asks, and how (the request's part of the admission attributes)."""

    user: dict[str, Any] = field(default_factory=lambda: copy.deepcopy(ADMIN))
    dry_run: bool = False
    field_validation: str = "Warn"  # the apiserver's default without ?fieldValidation=
    warnings: list[str] = field(default_factory=list)


@dataclass
class Attributes:
    operation: str  # CREATE, UPDATE, DELETE
    resource: Resource
    version: str  # the version of the request
    namespace: str  # "" for cluster-scoped objects
    name: str  # "" for a create by generateName
    object: dict[str, Any] | None
    old_object: dict[str, Any] | None
    info: RequestInfo
    subresource: str = ""


# ---------------------------------------------------------------- configurations
def set_defaults(config: dict[str, Any], mutating: bool) -> dict[str, Any]:
    """admissionregistration v1 defaulting (SetDefaults_MutatingWebhook, ...)."""
    for webhook in config.get("webhooks") or []:
        if not isinstance(webhook, dict):
            continue
        webhook.setdefault("failurePolicy", "Fail")
        webhook.setdefault("matchPolicy", "Equivalent")
        webhook.setdefault("namespaceSelector", {})
        webhook.setdefault("objectSelector", {})
        webhook.setdefault("timeoutSeconds", 10)
        if mutating:
            webhook.setdefault("reinvocationPolicy", "Never")
        for rule in webhook.get("rules") or []:
            if isinstance(rule, dict):
                rule.setdefault("scope", "*")
        service = (webhook.get("clientConfig") or {}).get("service")
        if isinstance(service, dict):
            service.setdefault("port", 443)
    return config


def _selector_errors(selector: Any, where: str) -> list[FieldError]:
    found: list[FieldError] = []
    if not isinstance(selector, Mapping):
        return found
    for key, value in (selector.get("matchLabels") or {}).items():
        found += [invalid(f"{where}.matchLabels", key, m) for m in objectmeta.qualified_name(key)]
        found += [invalid(f"{where}.matchLabels", value, m) for m in objectmeta.label_value(value)]
    for i, expr in enumerate(selector.get("matchExpressions") or []):
        at = f"{where}.matchExpressions[{i}]"
        op, values = expr.get("operator"), expr.get("values") or []
        if op in ("In", "NotIn") and not values:
            found.append(
                required(f"{at}.values", "must be specified when `operator` is 'In' or 'NotIn'")
            )
        elif op in ("Exists", "DoesNotExist") and values:
            found.append(
                forbidden(
                    f"{at}.values",
                    "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
                )
            )
        elif op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            found.append(invalid(f"{at}.operator", op, "not a valid selector operator"))
    return found


def _client_config_errors(config: Any, where: str) -> list[FieldError]:
    config = config if isinstance(config, Mapping) else {}
    url, service = config.get("url"), config.get("service")
    if (url is None) == (service is None):
        return [required(where, "exactly one of url or service is required")]
    found: list[FieldError] = []
    if url is not None:
        parts = urlsplit(url)
        if parts.scheme != "https":
            found.append(invalid(f"{where}.url", url, "'https' is the only allowed URL scheme"))
        if not parts.hostname:
            found.append(invalid(f"{where}.url", url, "host must be specified"))
        if parts.username or parts.password:
            found.append(
                invalid(f"{where}.url", url, "user information is not permitted in the URL")
            )
        if parts.fragment or url.endswith("#"):
            found.append(invalid(f"{where}.url", url, "fragments are not permitted in the URL"))
        if parts.query or url.endswith("?"):
            found.append(
                invalid(f"{where}.url", url, "query parameters are not permitted in the URL")
            )
    else:
        at = f"{where}.service"
        if not service.get("name"):
            found.append(required(f"{at}.name", "service name is required"))
        if not service.get("namespace"):
            found.append(required(f"{at}.namespace", "service namespace is required"))
        path = service.get("path")
        if path is not None and not str(path).startswith("/"):
            found.append(invalid(f"{at}.path", path, "must start with a '/'"))
        port = service.get("port", 443)
        if not isinstance(port, int) or not 1 <= port <= 65535:
            found.append(
                invalid(
                    f"{at}.port", port, "port is not valid: must be between 1 and 65535, inclusive"
                )
            )
    ca = config.get("caBundle")
    if ca:
        try:
            base64.b64decode(ca, validate=True)
        except ValueError:
            found.append(invalid(f"{where}.caBundle", "<bytes>", "must be base64 encoded"))
    return found


def config_errors(config: Mapping[str, Any], mutating: bool) -> list[FieldError]:
    """ValidateMutatingWebhookConfiguration / ValidateValidatingWebhookConfiguration, in the
    parts a test can reach; `matchConditions` are refused (the devcluster has no CEL)."""
    found: list[FieldError] = []
    names: set[str] = set()
    for i, hook in enumerate(config.get("webhooks") or []):
        at = f"webhooks[{i}]"
        name = hook.get("name") or ""
        if not name:
            found.append(required(f"{at}.name"))
        else:
            found += [invalid(f"{at}.name", name, m) for m in objectmeta.dns1123_subdomain(name)]
            if name.count(".") < 2:
                found.append(
                    invalid(
                        f"{at}.name",
                        name,
                        "should be a domain with at least three segments separated by dots",
                    )
                )
            if name in names:
                found.append(duplicate(f"{at}.name", name))
            names.add(name)
        for j, rule in enumerate(hook.get("rules") or []):
            found += _rule_errors(rule, f"{at}.rules[{j}]")
        for key, allowed in (
            ("failurePolicy", ["Fail", "Ignore"]),
            ("matchPolicy", ["Equivalent", "Exact"]),
            *([("reinvocationPolicy", ["IfNeeded", "Never"])] if mutating else []),
        ):
            if hook.get(key) not in allowed:
                found.append(not_supported(f"{at}.{key}", hook.get(key), allowed))
        side_effects = hook.get("sideEffects")
        if side_effects is None:
            found.append(required(f"{at}.sideEffects", "must specify one of None, NoneOnDryRun"))
        elif side_effects not in ("None", "NoneOnDryRun"):
            found.append(not_supported(f"{at}.sideEffects", side_effects, ["None", "NoneOnDryRun"]))
        versions = hook.get("admissionReviewVersions")
        if not versions:
            found.append(
                required(f"{at}.admissionReviewVersions", "must specify one of v1, v1beta1")
            )
        elif not set(versions) & set(REVIEW_VERSIONS):
            found.append(
                invalid(
                    f"{at}.admissionReviewVersions",
                    versions,
                    "must include at least one of v1, v1beta1",
                )
            )
        timeout = hook.get("timeoutSeconds")
        if not isinstance(timeout, int) or not 1 <= timeout <= 30:
            found.append(
                invalid(
                    f"{at}.timeoutSeconds",
                    timeout,
                    "the timeout value must be between 1 and 30 seconds",
                )
            )
        found += _selector_errors(hook.get("namespaceSelector"), f"{at}.namespaceSelector")
        found += _selector_errors(hook.get("objectSelector"), f"{at}.objectSelector")
        found += _client_config_errors(hook.get("clientConfig"), f"{at}.clientConfig")
        if hook.get("matchConditions"):
            found.append(
                forbidden(
                    f"{at}.matchConditions", "the devcluster does not evaluate CEL expressions"
                )
            )
    return found


def _rule_errors(rule: Mapping[str, Any], at: str) -> list[FieldError]:
    found: list[FieldError] = []
    operations = rule.get("operations") or []
    if not operations:
        found.append(required(f"{at}.operations"))
    if "*" in operations and len(operations) > 1:
        found.append(
            invalid(
                f"{at}.operations",
                operations,
                "if '*' is present, must not specify other operations",
            )
        )
    for k, op in enumerate(operations):
        if op not in OPERATIONS:
            found.append(not_supported(f"{at}.operations[{k}]", op, OPERATIONS))
    for key in ("apiGroups", "apiVersions", "resources"):
        if not rule.get(key):
            found.append(required(f"{at}.{key}"))
    if rule.get("scope", "*") not in ("Cluster", "Namespaced", "*"):
        found.append(not_supported(f"{at}.scope", rule["scope"], ["Cluster", "Namespaced", "*"]))
    return found


# ---------------------------------------------------------------- matching
def _resource_matches(patterns: list[str], resource: str, subresource: str) -> bool:
    for pattern in patterns:
        res, _, sub = pattern.partition("/")
        if pattern == "*/*":
            return True
        if "/" not in pattern:
            if not subresource and res in ("*", resource):
                return True
        elif res in ("*", resource) and sub in ("*", subresource) and subresource:
            return True
    return False


def rule_matches(rule: Mapping[str, Any], attrs: Attributes, version: str) -> bool:
    res = attrs.resource
    operations = rule.get("operations") or []
    scope = rule.get("scope", "*")
    return (
        ("*" in operations or attrs.operation in operations)
        and any(g in ("*", res.group) for g in rule.get("apiGroups") or [])
        and any(v in ("*", version) for v in rule.get("apiVersions") or [])
        and _resource_matches(rule.get("resources") or [], res.plural, attrs.subresource)
        and (scope == "*" or (scope == "Namespaced") == res.namespaced)
    )


def _labels(obj: Mapping[str, Any] | None) -> dict[str, str]:
    return dict(((obj or {}).get("metadata") or {}).get("labels") or {})


class Admission:
    """The admission webhooks of one devcluster, read from its store at every request."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def _webhooks(self, key: str) -> list[tuple[str, dict[str, Any]]]:
        configs = sorted(self.store.entries(key, None), key=lambda e: e.obj["metadata"]["name"])
        return [
            (entry.obj["metadata"]["name"], hook)
            for entry in configs
            for hook in entry.obj.get("webhooks") or []
        ]

    def _invocation_version(self, hook: Mapping[str, Any], attrs: Attributes) -> str | None:
        """The version the webhook is called with, None if it is not to be called."""
        if attrs.resource.key in EXEMPT:
            return None
        if attrs.resource.namespaced:
            ns = self.store.objects["namespaces"].get(("", attrs.namespace))
            ns_labels = _labels(ns.obj if ns else None)
            if not match_label_selector(hook.get("namespaceSelector"), ns_labels):
                return None
        elif attrs.resource.key == "namespaces":
            target = attrs.object if attrs.object is not None else attrs.old_object
            if not match_label_selector(hook.get("namespaceSelector"), _labels(target)):
                return None
        selector = hook.get("objectSelector")
        if not (
            match_label_selector(selector, _labels(attrs.object))
            or (
                attrs.old_object is not None
                and match_label_selector(selector, _labels(attrs.old_object))
            )
        ):
            return None
        rules = hook.get("rules") or []
        if any(rule_matches(r, attrs, attrs.version) for r in rules):
            return attrs.version
        if hook.get("matchPolicy", "Equivalent") == "Equivalent":
            for version in attrs.resource.versions:
                if version != attrs.version and any(rule_matches(r, attrs, version) for r in rules):
                    return version
        return None

    # ------------------------------------------------------------ the review
    def _review(self, hook: Mapping[str, Any], attrs: Attributes, version: str) -> dict[str, Any]:
        res = attrs.resource
        review_version = next(v for v in hook["admissionReviewVersions"] if v in REVIEW_VERSIONS)
        options_kind = {
            "CREATE": "CreateOptions",
            "UPDATE": "UpdateOptions",
            "DELETE": "DeleteOptions",
        }[attrs.operation]

        def at(obj: dict[str, Any] | None) -> dict[str, Any] | None:
            return None if obj is None else {**obj, "apiVersion": res.api_version(version)}

        request = {
            "uid": str(uuid.uuid4()),
            "kind": {"group": res.group, "version": version, "kind": res.kind},
            "resource": {"group": res.group, "version": version, "resource": res.plural},
            "requestKind": {"group": res.group, "version": attrs.version, "kind": res.kind},
            "requestResource": {"group": res.group, "version": attrs.version,
                                "resource": res.plural},
            "name": attrs.name,
            "operation": attrs.operation,
            "userInfo": attrs.info.user,
            "object": at(attrs.object),
            "oldObject": at(attrs.old_object),
            "dryRun": attrs.info.dry_run,
            "options": {"kind": options_kind, "apiVersion": "meta.k8s.io/v1"},
        }  # fmt: skip
        if attrs.namespace:
            request["namespace"] = attrs.namespace
        if attrs.subresource:
            request["subResource"] = request["requestSubResource"] = attrs.subresource
        return {
            "apiVersion": f"admission.k8s.io/{review_version}",
            "kind": "AdmissionReview",
            "request": request,
        }

    def _target(self, client_config: Mapping[str, Any]) -> Target:
        """Where to send the review. A Service resolves to a ready pod it selects (its podIP
        and target port), or, for a Service without a selector, to 127.0.0.1 at its target
        port: how a webhook running as a local process is reached."""
        if client_config.get("url"):
            parts = urlsplit(client_config["url"])
            return Target(client_config["url"], parts.hostname or "", parts.port or 443)
        ref = client_config["service"]
        name, namespace, port = ref["name"], ref["namespace"], int(ref.get("port", 443))
        url = f"https://{name}.{namespace}.svc:{port}{ref.get('path') or ''}"
        entry = self.store.objects["services"].get((namespace, name))
        if entry is None:
            raise Unreachable(url, f'service "{name}" not found')
        spec = entry.obj.get("spec") or {}
        service_port = next((p for p in spec.get("ports") or [] if p.get("port") == port), None)
        if service_port is None:
            raise Unreachable(url, f'no service port {port} found for service "{name}"')
        target_port = service_port.get("targetPort", port)
        selector = spec.get("selector")
        if not selector:
            return Target(url, "127.0.0.1", int(target_port))
        for pod_entry in self.store.entries("pods", namespace):
            pod = pod_entry.obj
            status = pod.get("status") or {}
            ready = any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in status.get("conditions") or []
            )
            if (
                ready
                and status.get("podIP")
                and all(_labels(pod).get(k) == v for k, v in selector.items())
            ):
                if isinstance(target_port, str):  # a named container port
                    ports = [p for c in pod["spec"]["containers"] for p in c.get("ports") or []]
                    named = next((p for p in ports if p.get("name") == target_port), None)
                    if named is None:
                        continue
                    target_port = named["containerPort"]
                return Target(url, status["podIP"], int(target_port))
        raise Unreachable(url, f'no endpoints available for service "{name}"')

    async def _call(
        self, hook: Mapping[str, Any], attrs: Attributes, version: str, mutating: bool
    ) -> dict[str, Any]:
        """The webhook's verified response; CallError when the call or its answer fails."""
        review = self._review(hook, attrs, version)
        timeout = float(hook.get("timeoutSeconds", 10))
        try:
            target = self._target(hook["clientConfig"])
            answer = await post(target, review, timeout, hook["clientConfig"].get("caBundle"))
        except Unreachable as exc:
            raise CallError(
                f'failed to call webhook: Post "{request_url(exc.url, timeout)}": {exc.reason}'
            ) from None
        except CallError as exc:
            raise CallError(f"failed to call webhook: {exc}") from None
        return _verify(answer, review, mutating)

    # ------------------------------------------------------------ dispatch
    async def mutate(
        self, attrs: Attributes, redefault: Callable[[dict[str, Any]], None] | None = None
    ) -> dict[str, Any] | None:
        """Run the mutating webhooks; the object as they leave it (attrs.object is updated)."""
        hooks = self._webhooks(MUTATING)
        if not hooks:
            return attrs.object
        previously: set[int] = set()  # IfNeeded webhooks called so far
        reinvoke: set[int] = set()
        should_reinvoke = False
        for round_ in (0, 1):
            if round_ == 1 and not should_reinvoke:
                break
            for index, (_, hook) in enumerate(hooks):
                version = self._invocation_version(hook, attrs)
                if version is None or (round_ == 1 and index not in reinvoke):
                    continue
                changed = await self._mutate_once(hook, attrs, version, redefault)
                if changed:
                    # a change: every IfNeeded webhook called before is called once more
                    reinvoke |= previously
                    previously = set()
                    should_reinvoke = True
                if hook.get("reinvocationPolicy") == "IfNeeded":
                    previously.add(index)
        return attrs.object

    async def _mutate_once(
        self,
        hook: Mapping[str, Any],
        attrs: Attributes,
        version: str,
        redefault: Callable[[dict[str, Any]], None] | None,
    ) -> bool:
        name = hook["name"]
        try:
            response = await self._call(hook, attrs, version, mutating=True)
        except CallError as exc:
            return self._failed(hook, exc)
        attrs.info.warnings.extend(str(w) for w in response.get("warnings") or [])
        if not response.get("allowed"):
            raise denied(name, response.get("status"))
        raw = response.get("patch")
        if not raw:
            return False
        try:
            operations = jsonpatch.decode(json.loads(_b64(raw)))
        except (ValueError, jsonpatch.PatchError) as exc:
            return self._failed(
                hook, CallError(f"received undecodable patch in webhook response: {exc}")
            )
        if not operations:
            return False
        if attrs.object is None:
            raise internal(
                f'admission webhook "{name}" attempted to modify the object, which '
                "is not supported for this operation"
            )
        if response.get("patchType") != "JSONPatch":
            return self._failed(
                hook, CallError(f"unsupported patch type {json.dumps(response.get('patchType'))}")
            )
        sent = {**attrs.object, "apiVersion": attrs.resource.api_version(version)}
        try:
            patched = jsonpatch.apply(sent, operations)
        except jsonpatch.PatchError as exc:
            raise internal(str(exc)) from None
        if not isinstance(patched, dict):
            raise internal(
                f"couldn't get version/kind; json parse error: patched object is a "
                f"{type(patched).__name__}"
            )
        patched["apiVersion"] = attrs.resource.api_version(attrs.version)
        if redefault is not None:
            redefault(patched)
        changed = patched != attrs.object
        attrs.object = patched
        return changed

    async def validate(self, attrs: Attributes) -> None:
        """Run the validating webhooks (concurrently, as the apiserver does)."""
        calls = []
        for _, hook in self._webhooks(VALIDATING):
            version = self._invocation_version(hook, attrs)
            if version is not None:
                calls.append((hook, self._call(hook, attrs, version, mutating=False)))
        results = await asyncio.gather(*(c for _, c in calls), return_exceptions=True)
        for (hook, _), result in zip(calls, results, strict=True):
            if isinstance(result, CallError):
                self._failed(hook, result)
                continue
            if isinstance(result, BaseException):
                raise result
            attrs.info.warnings.extend(str(w) for w in result.get("warnings") or [])
            if not result.get("allowed"):
                raise denied(hook["name"], result.get("status"))

    def _failed(self, hook: Mapping[str, Any], exc: CallError) -> bool:
        """A webhook that could not be called: skipped under Ignore, else the request fails."""
        message = f'failed calling webhook "{hook["name"]}": {exc}'
        if hook.get("failurePolicy", "Fail") == "Ignore":
            log.warning("Failed calling webhook, failing open %s: %s", hook["name"], message)
            return False
        log.warning("Failed calling webhook, failing closed %s: %s", hook["name"], message)
        raise internal(message)


def _b64(value: Any) -> bytes:
    """response.patch: base64 (Go's []byte in JSON)."""
    if not isinstance(value, str):
        raise ValueError(
            f"json: cannot unmarshal {type(value).__name__} into Go struct field "
            "AdmissionResponse.response.patch of type []uint8"
        )
    try:
        return base64.b64decode(value, validate=True)
    except ValueError:
        bad = next((i for i, c in enumerate(value) if not (c.isalnum() or c in "+/=")), len(value))
        raise ValueError(f"illegal base64 data at input byte {bad}") from None


def _verify(answer: Any, review: Mapping[str, Any], mutating: bool) -> dict[str, Any]:
    """VerifyAdmissionResponse: the answer must be an AdmissionReview for this request."""

    def bad(why: str) -> CallError:
        return CallError(f"received invalid webhook response: {why}")

    if not isinstance(answer, Mapping):
        raise CallError(
            f"failed to call webhook: couldn't get version/kind; json parse error: "
            f"cannot unmarshal {type(answer).__name__} into Go value"
        )
    response = answer.get("response")
    if not isinstance(response, Mapping):
        raise bad("webhook response was absent")
    expected_version = review["apiVersion"]
    uid = review["request"]["uid"]
    if expected_version == "admission.k8s.io/v1":
        if response.get("uid") != uid:
            raise bad(f'expected response.uid="{uid}", got "{response.get("uid", "")}"')
        got = str(answer.get("apiVersion") or "")
        if got != expected_version or answer.get("kind") != "AdmissionReview":
            raise bad(
                f"expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, "
                f"got {got}, Kind={answer.get('kind') or ''}"
            )
        if mutating:
            if response.get("patch") and response.get("patchType") is None:
                raise bad("webhook returned response.patch but not response.patchType")
            if not response.get("patch") and response.get("patchType") is not None:
                raise bad("webhook returned response.patchType but not response.patch")
        else:
            if response.get("patch"):
                raise bad("validating webhook may not return response.patch")
            if response.get("patchType") is not None:
                raise bad("validating webhook may not return response.patchType")
    elif response.get("patch") and mutating:
        response = {**response, "patchType": "JSONPatch"}  # v1beta1 pinned it
    return dict(response)


def denied(name: str, status: Mapping[str, Any] | None) -> ApiError:
    """ToStatusErr: the webhook's own Status, worded as a refusal, code 400 or more."""
    status = dict(status or {})
    code = int(status.get("code") or 0)
    message, reason = status.get("message") or "", status.get("reason") or ""
    prefix = f'admission webhook "{name}" denied the request'
    if message:
        text = f"{prefix}: {message}"
    elif reason:
        text = f"{prefix}: {reason}"
    else:
        text = f"{prefix} without explanation"
    return ApiError(max(code, 400), reason, text, status.get("details") or {})


def internal(message: str) -> ApiError:
    """apierrors.NewInternalError."""
    return ApiError(
        500,
        "InternalError",
        f"Internal error occurred: {message}",
        {"causes": [{"message": message}]},
    )
