"""`resource.k8s.io/v1`'s four kinds and what the apiserver checks beyond their OpenAPI schema.

The schemas are kubernetes-validate's 1.34 ones (the first release with resource.k8s.io/v1;
devcluster/validation.py SCHEMA_VERSIONS). On top, the rules of
kubernetes/kubernetes pkg/apis/resource/validation/validation.go (1.34) that a client can trip:

- ValidateDeviceClass / validateDeviceClassSpec: selectors' CEL compiles (validateSelector);
- ValidateResourceClaim / validateDeviceClaim: request names unique DNS labels, exactly one of
  `exactly` or `firstAvailable` (validateDeviceRequest), a deviceClassName, allocationMode
  ExactCount (count > 0) or All (no count) (validateDeviceAllocationMode), constraints naming
  existing requests (validateDeviceConstraint) with a fully qualified matchAttribute
  (validateFullyQualifiedName);
- ValidateResourceClaimUpdate: the spec is immutable ("field is immutable");
- ValidateResourceClaimStatusUpdate: allocation results name a request of the claim
  (validateDeviceRequestAllocationResult), reservedFor at most 256 unique consumers
  (validateResourceClaimConsumers);
- ValidateResourceClaimTemplate: its spec.spec as a claim's;
- ValidateResourceSlice / validateResourceSliceSpec: exactly one of nodeName, nodeSelector,
  allNodes, perDeviceNodeSelection; at most 128 devices (ResourceSliceMaxDevices); device
  names unique; attribute and capacity names C identifiers of at most 32 characters
  (validateQualifiedName); consumesCounters naming a counter set of the slice.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..fielderrors import FieldError, duplicate, forbidden, invalid, not_supported, required
from ..resources import BUILTIN, Resource
from . import cel

GROUP = "resource.k8s.io"
DEVICECLASSES = f"deviceclasses.{GROUP}"
RESOURCESLICES = f"resourceslices.{GROUP}"
RESOURCECLAIMS = f"resourceclaims.{GROUP}"
RESOURCECLAIMTEMPLATES = f"resourceclaimtemplates.{GROUP}"

RESOURCES: tuple[Resource, ...] = tuple(r for r in BUILTIN if r.group == GROUP)
KEYS = frozenset(r.key for r in RESOURCES)

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_DEVICES = 128  # resource.ResourceSliceMaxDevices
MAX_CONSUMERS = 256  # resource.ResourceClaimReservedForMaxSize
LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and "
    "must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex "
    "used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)


def _selectors(path: str, selectors: Any) -> list[FieldError]:
    errors = []
    for i, selector in enumerate(selectors or []):
        expression = ((selector or {}).get("cel") or {}).get("expression")
        if expression is None:
            errors.append(required(f"{path}[{i}].cel", ""))
            continue
        try:
            cel.compile_selector(expression)
        except cel.CelError as exc:
            errors.append(invalid(f"{path}[{i}].cel.expression", expression, str(exc)))
    return errors


def _exact(path: str, exact: Mapping[str, Any]) -> list[FieldError]:
    errors = []
    if not exact.get("deviceClassName"):
        errors.append(required(f"{path}.deviceClassName", ""))
    mode = exact.get("allocationMode") or "ExactCount"
    if mode == "ExactCount":
        count = exact.get("count")
        if count is not None and int(count) <= 0:
            errors.append(invalid(f"{path}.count", count, "must be greater than zero"))
    elif mode == "All":
        if exact.get("count") is not None:
            errors.append(
                forbidden(f"{path}.count", "must not be specified when allocationMode is All")
            )
    else:
        errors.append(not_supported(f"{path}.allocationMode", mode, ["All", "ExactCount"]))
    errors += _selectors(f"{path}.selectors", exact.get("selectors"))
    return errors


def claim_spec_errors(path: str, spec: Mapping[str, Any]) -> list[FieldError]:
    devices = (spec or {}).get("devices") or {}
    errors: list[FieldError] = []
    names: dict[str, set[str]] = {}
    for i, request in enumerate(devices.get("requests") or []):
        where = f"{path}.devices.requests[{i}]"
        name = request.get("name", "")
        if not name:
            errors.append(required(f"{where}.name", ""))
        elif not _DNS_LABEL.match(name) or len(name) > 63:
            errors.append(invalid(f"{where}.name", name, LABEL_MSG))
        elif name in names:
            errors.append(duplicate(f"{where}.name", name))
        subs: set[str] = set()
        has_exact, has_first = bool(request.get("exactly")), bool(request.get("firstAvailable"))
        if has_exact == has_first:
            errors.append(
                required(where, "exactly one of `exactly` or `firstAvailable` is required")
            )
        if has_exact:
            errors += _exact(f"{where}.exactly", request["exactly"])
        for j, sub in enumerate(request.get("firstAvailable") or []):
            sub_path = f"{where}.firstAvailable[{j}]"
            sub_name = sub.get("name", "")
            if sub_name in subs:
                errors.append(duplicate(f"{sub_path}.name", sub_name))
            subs.add(sub_name)
            errors += _exact(sub_path, sub)
        names[name] = subs
    for i, constraint in enumerate(devices.get("constraints") or []):
        where = f"{path}.devices.constraints[{i}]"
        errors += _request_ref_errors(f"{where}.requests", constraint.get("requests"), names)
        key = "matchAttribute" if "matchAttribute" in constraint else "distinctAttribute"
        attribute = constraint.get(key)
        if attribute is not None and "/" not in attribute:
            errors.append(
                required(
                    f"{where}.{key}",
                    "a fully qualified name must be a domain and a name separated by a slash",
                )
            )
    for i, config in enumerate(devices.get("config") or []):
        where = f"{path}.devices.config[{i}]"
        errors += _request_ref_errors(f"{where}.requests", config.get("requests"), names)
    return errors


def _request_ref_errors(
    path: str, refs: list[str] | None, names: Mapping[str, set[str]]
) -> list[FieldError]:
    """A constraint's or a config's `requests`: each a request of the claim, or
    `request/subrequest`."""
    errors = []
    for j, ref in enumerate(refs or []):
        parent, _, sub = ref.partition("/")
        if parent not in names or (sub and sub not in names[parent]):
            errors.append(
                invalid(
                    f"{path}[{j}]",
                    ref,
                    "must be the name of a request in the claim or the name of a request "
                    "and a subrequest separated by '/'",
                )
            )
    return errors


def _slice_errors(spec: Mapping[str, Any]) -> list[FieldError]:
    errors: list[FieldError] = []
    chosen = [
        k for k in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection") if spec.get(k)
    ]
    if len(chosen) != 1:
        errors.append(
            invalid(
                "spec",
                "{" + ", ".join(chosen) + "}",
                "exactly one of `nodeName`, `nodeSelector`, `allNodes`, "
                "`perDeviceNodeSelection` is required",
            )
        )
    driver = spec.get("driver", "")
    if not _DNS_SUBDOMAIN.match(driver) or len(driver) > 63:
        errors.append(invalid("spec.driver", driver, "a lowercase RFC 1123 subdomain"))
    devices = spec.get("devices") or []
    if len(devices) > MAX_DEVICES:
        errors.append(
            invalid("spec.devices", len(devices), f"must have at most {MAX_DEVICES} items")
        )
    counter_sets = {c.get("name") for c in spec.get("sharedCounters") or []}
    seen: set[str] = set()
    for i, device in enumerate(devices):
        where = f"spec.devices[{i}]"
        if device.get("name") in seen:
            errors.append(duplicate(f"{where}.name", device.get("name")))
        seen.add(device.get("name"))
        for kind in ("attributes", "capacity"):
            for name in device.get(kind) or {}:
                short = name.rpartition("/")[2]
                if not _C_IDENTIFIER.match(short) or len(short) > 32:
                    errors.append(
                        invalid(
                            f"{where}.{kind}[{name}]",
                            name,
                            "a C identifier of at most 32 characters",
                        )
                    )
        for j, consumption in enumerate(device.get("consumesCounters") or []):
            if consumption.get("counterSet") not in counter_sets:
                errors.append(
                    invalid(
                        f"{where}.consumesCounters[{j}].counterSet",
                        consumption.get("counterSet"),
                        "must reference a counterSet defined in the ResourceSlice sharedCounters",
                    )
                )
    return errors


def errors(plural: str, obj: Mapping[str, Any]) -> list[FieldError]:
    """The apiserver's own checks of a create (and every write) of one of the kinds."""
    if plural == DEVICECLASSES:
        return _selectors("spec.selectors", (obj.get("spec") or {}).get("selectors"))
    if plural == RESOURCECLAIMS:
        found = claim_spec_errors("spec", obj.get("spec") or {})
        return found + status_errors(obj)
    if plural == RESOURCECLAIMTEMPLATES:
        return claim_spec_errors("spec.spec", (obj.get("spec") or {}).get("spec") or {})
    if plural == RESOURCESLICES:
        return _slice_errors(obj.get("spec") or {})
    return []


def status_errors(claim: Mapping[str, Any]) -> list[FieldError]:
    status = claim.get("status") or {}
    found: list[FieldError] = []
    names = set()
    for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
        names.add(request.get("name"))
        for sub in request.get("firstAvailable") or []:
            names.add(f"{request.get('name')}/{sub.get('name')}")
    results = (((status.get("allocation") or {}).get("devices") or {}).get("results")) or []
    for i, result in enumerate(results):
        if result.get("request") not in names:
            found.append(
                invalid(
                    f"status.allocation.devices.results[{i}].request",
                    result.get("request"),
                    "must be the name of a request in the claim or the name of a request and a "
                    "subrequest separated by '/'",
                )
            )
    consumers = status.get("reservedFor") or []
    if len(consumers) > MAX_CONSUMERS:
        found.append(
            invalid(
                "status.reservedFor", len(consumers), f"must have at most {MAX_CONSUMERS} items"
            )
        )
    uids = [c.get("uid") for c in consumers]
    for i, uid in enumerate(uids):
        if uid in uids[:i]:
            found.append(duplicate(f"status.reservedFor[{i}].uid", uid))
    if consumers and not status.get("allocation"):
        found.append(
            forbidden("status.reservedFor", "may not be specified when `allocated` is not set")
        )
    return found


def update_errors(current: Mapping[str, Any], updated: Mapping[str, Any]) -> list[FieldError]:
    """ValidateResourceClaimUpdate: the spec cannot change."""
    if (current.get("spec") or {}) != (updated.get("spec") or {}):
        return [invalid("spec", updated.get("spec"), "field is immutable")]
    return []


def prepare_update(
    current: Mapping[str, Any], updated: dict[str, Any], subresource: str
) -> dict[str, Any]:
    """ResourceClaim's strategies (pkg/registry/resource/resourceclaim/strategy.go): a write of
    the claim keeps its status (PrepareForUpdate) and may not change its spec
    (ValidateResourceClaimUpdate, 422 "field is immutable"); a write of `/status` changes
    nothing but the status and the finalizers (statusStrategy.PrepareForUpdate keeps the spec;
    the scheduler adds its delete-protection finalizer there)."""
    from ..fielderrors import invalid_error

    if subresource == "status":
        kept = {k: v for k, v in current.items() if k != "status"}
        kept = {**kept, "metadata": dict(current["metadata"])}
        finalizers = (updated.get("metadata") or {}).get("finalizers")
        if finalizers is not None:
            kept["metadata"]["finalizers"] = finalizers
        return {**kept, "status": updated.get("status") or {}}
    updated["status"] = current.get("status") or {}
    errors = update_errors(current, updated)
    if errors:
        name = current["metadata"]["name"]
        raise invalid_error("ResourceClaim", GROUP, name, errors)
    return updated


def _go_claim(entry: Mapping[str, Any]) -> str:
    """A PodResourceClaim as Go's %#v prints it in the apiserver's message."""

    def pointer(value: Any) -> str:
        return "(*string)(nil)" if value is None else "(*string)(0xc000a1b2c0)"

    return (
        f'core.PodResourceClaim{{Name:"{entry.get("name", "")}", '
        f"ResourceClaimName:{pointer(entry.get('resourceClaimName'))}, "
        f"ResourceClaimTemplateName:{pointer(entry.get('resourceClaimTemplateName'))}}}"
    )


def pod_errors(pod: Mapping[str, Any]) -> list[FieldError]:
    """A pod's claims as pkg/apis/core/validation/validation.go checks them: each
    spec.resourceClaims entry names exactly one source (validatePodResourceClaimSource), and a
    container's resources.claims name entries of spec.resourceClaims
    (validateResourceClaimNames)."""
    spec = pod.get("spec") or {}
    errors: list[FieldError] = []
    names: set[str] = set()
    for i, entry in enumerate(spec.get("resourceClaims") or []):
        names.add(entry.get("name", ""))
        by_name, by_template = (
            entry.get("resourceClaimName"),
            entry.get("resourceClaimTemplateName"),
        )
        if by_name is not None and by_template is not None:
            detail = (
                "at most one of `resourceClaimName` or `resourceClaimTemplateName` may be specified"
            )
        elif by_name is None and by_template is None:
            detail = "must specify one of: `resourceClaimName`, `resourceClaimTemplateName`"
        else:
            continue
        errors.append(
            FieldError(
                "Invalid", f"spec.resourceClaims[{i}]", detail=f"{_go_claim(entry)}: {detail}"
            )
        )
    for group in ("initContainers", "containers"):
        for i, container in enumerate(spec.get(group) or []):
            seen: set[str] = set()
            for j, claim in enumerate((container.get("resources") or {}).get("claims") or []):
                name = claim.get("name", "")
                where = f"spec.{group}[{i}].resources.claims[{j}]"
                if not name:
                    errors.append(required(where, ""))
                    continue
                key = f"{name}/{claim.get('request', '')}"
                if key in seen:
                    errors.append(duplicate(where, name))
                seen.add(key)
                if name not in names:
                    detail = "must be one of the names in pod.spec.resourceClaims"
                    detail += ": " + ", ".join(sorted(names)) if names else " which is empty"
                    errors.append(FieldError("NotFound", where, name, detail))
    return errors
