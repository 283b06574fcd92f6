"""devcluster: CustomResourceDefinitions served like built-ins, and namespace labels.

One devcluster subprocess for the module. Each test defines its own small CRD (or the
realistic Notebook CRD in tests/devcluster_crds/) and its own namespace, so tests do not
depend on each other's order. What is asserted is what a client of a real apiserver sees:
status codes, Status messages worded like the apiserver's, pruning, defaults, watch events.
"""

from __future__ import annotations

import copy
import json
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.e2e

CONTROL_PLANE = "python"  # tests the Python API server itself (issue 35 item 4)
TOPOLOGY = {
    "namespaces": [
        "crd-a",
        {"name": "team-a", "labels": {"app.kubernetes.io/part-of": "kubeflow-profile"},
         "annotations": {"owner": "alice@example.com"}},
        {"name": "team-b", "labels": {"app.kubernetes.io/part-of": "kubeflow-profile",
                                      "team": "b"}},
    ],
    "nodes": [{"name": "cpu-1", "capacity": {"cpu": "8", "memory": "32Gi"}}],
}  # fmt: skip
NOTEBOOK_CRD = Path(__file__).parent / "devcluster_crds" / "notebooks.yaml"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


# ---------------------------------------------------------------- helpers
def http(
    cluster: Any,
    method: str,
    path: str,
    body: Any = None,
    content_type: str = "application/json",
) -> tuple[int, Any, list[str]]:
    """(status, JSON body, Warning headers) of one request."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(cluster.url + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return (
                resp.status,
                json.loads(resp.read() or b"null"),
                resp.headers.get_all("Warning") or [],
            )
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null"), exc.headers.get_all("Warning") or []


def ok(result: tuple[int, Any, list[str]], *codes: int) -> Any:
    status, body, _ = result
    assert status in (codes or (200, 201)), (status, body)
    return body


def widget_crd(
    group: str,
    *,
    scope: str = "Namespaced",
    versions: tuple[str, ...] = ("v1",),
    status: bool = False,
    spec_schema: dict | None = None,
    columns: list[dict] | None = None,
    short_names: list[str] | None = None,
) -> dict[str, Any]:
    """A small CRD `widgets.<group>`: spec {size (integer >= 1, required), mode (enum, default
    fast), labels (map of strings), extra (preserve-unknown-fields), template (an embedded
    resource)}, status {ready}."""
    schema = {
        "type": "object",
        "properties": {
            "spec": spec_schema
            or {
                "type": "object",
                "required": ["size"],
                "properties": {
                    "size": {"type": "integer", "minimum": 1},
                    "mode": {"type": "string", "enum": ["fast", "slow"], "default": "fast"},
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                    "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                    "template": {
                        "type": "object",
                        "x-kubernetes-embedded-resource": True,
                        "properties": {"spec": {"type": "object", "properties": {
                            "replicas": {"type": "integer"}}}},
                    },
                },
            },
            "status": {"type": "object", "properties": {"ready": {"type": "boolean"}}},
        },
    }  # fmt: skip
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{group}"},
        "spec": {
            "group": group,
            "scope": scope,
            "names": {"plural": "widgets", "kind": "Widget", **(
                {"shortNames": short_names} if short_names else {})},
            "versions": [
                {
                    "name": v,
                    "served": True,
                    "storage": i == 0,
                    "schema": {"openAPIV3Schema": copy.deepcopy(schema)},
                    **({"subresources": {"status": {}}} if status else {}),
                    **({"additionalPrinterColumns": columns} if columns else {}),
                }
                for i, v in enumerate(versions)
            ],
        },
    }  # fmt: skip


def widget(name: str, group: str, version: str = "v1", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{group}/{version}",
        "kind": "Widget",
        "metadata": {"name": name},
        "spec": spec or {"size": 1},
    }


def base(group: str, version: str = "v1", namespace: str | None = "crd-a") -> str:
    where = f"/namespaces/{namespace}" if namespace else ""
    return f"/apis/{group}/{version}{where}/widgets"


def kubectl(cluster: Any, *args: str) -> str:
    result = subprocess.run(
        ["/usr/bin/kubectl", "--kubeconfig", str(cluster.kubeconfig), *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


# ---------------------------------------------------------------- definitions and discovery
def test_a_crd_is_established_and_discovered_with_its_preferred_version(devcluster):
    group = "discovery.example.com"
    crd = widget_crd(group, versions=("v1beta1", "v1", "v1alpha1"), status=True,
                     short_names=["wdg"])  # fmt: skip
    created = ok(http(devcluster, "POST", CRDS, crd), 201)
    conditions = {c["type"]: c["status"] for c in created["status"]["conditions"]}
    assert conditions == {"NamesAccepted": "True", "Established": "True"}
    assert created["status"]["storedVersions"] == ["v1beta1"]
    assert created["spec"]["names"]["singular"] == "widget"  # defaulted, as is listKind
    assert created["spec"]["names"]["listKind"] == "WidgetList"

    groups = {g["name"]: g for g in ok(http(devcluster, "GET", "/apis"))["groups"]}
    # GA before beta before alpha, as kube-aware version sorting orders them
    assert [v["version"] for v in groups[group]["versions"]] == ["v1", "v1beta1", "v1alpha1"]
    assert groups[group]["preferredVersion"]["version"] == "v1"
    assert "apiextensions.k8s.io" in groups and "admissionregistration.k8s.io" in groups
    resources = ok(http(devcluster, "GET", f"/apis/{group}/v1"))["resources"]
    by_name = {r["name"]: r for r in resources}
    assert by_name["widgets"]["kind"] == "Widget" and by_name["widgets"]["namespaced"] is True
    assert by_name["widgets"]["shortNames"] == ["wdg"]
    assert by_name["widgets/status"]["verbs"] == ["get", "patch", "update"]
    assert http(devcluster, "GET", f"/apis/{group}/v2")[0] == 404


def test_a_crd_that_is_not_structural_is_refused_with_the_apiservers_paths(devcluster):
    crd = widget_crd("bad.example.com", spec_schema={
        "type": "object",
        "properties": {"size": {"description": "no type"},
                       "list": {"type": "array"},
                       "both": {"type": "object", "properties": {"a": {"type": "string"}},
                                "additionalProperties": {"type": "string"}}},
    })  # fmt: skip
    status, body, _ = http(devcluster, "POST", CRDS, crd)
    assert status == 422 and body["reason"] == "Invalid"
    where = "spec.versions[0].schema.openAPIV3Schema.properties[spec]"
    assert body["message"].startswith(
        'CustomResourceDefinition.apiextensions.k8s.io "widgets.bad.example.com" is invalid: ['
    )
    assert (f"{where}.properties[size].type: Required value: must not be empty for specified "
            "object fields") in body["message"]  # fmt: skip
    assert f"{where}.properties[list].items: Required value: must be specified" in body["message"]
    assert (f"{where}.properties[both].additionalProperties: Forbidden: additionalProperties "
            "and properties are mutual exclusive") in body["message"]  # fmt: skip
    fields = {c["field"] for c in body["details"]["causes"]}
    assert f"{where}.properties[size].type" in fields
    # nothing half-made: the group is not served
    assert http(devcluster, "GET", "/apis/bad.example.com/v1")[0] == 404

    wrong_name = widget_crd("named.example.com")
    wrong_name["metadata"]["name"] = "gadgets.named.example.com"
    status, body, _ = http(devcluster, "POST", CRDS, wrong_name)
    assert status == 422
    assert (
        'metadata.name: Invalid value: "gadgets.named.example.com": must be '
        'spec.names.plural+"."+spec.group' in body["message"]
    )
    two_storage = widget_crd("storage.example.com", versions=("v1", "v2"))
    two_storage["spec"]["versions"][1]["storage"] = True
    status, body, _ = http(devcluster, "POST", CRDS, two_storage)
    assert status == 422 and "must have exactly one version marked as storage version" in body[
        "message"]  # fmt: skip


# ---------------------------------------------------------------- objects
def test_custom_resources_are_created_read_listed_by_label_and_deleted(devcluster):
    group = "crud.example.com"
    ok(http(devcluster, "POST", CRDS, widget_crd(group)), 201)
    for name, colour in (("red-1", "red"), ("red-2", "red"), ("blue-1", "blue")):
        body = widget(name, group, size=2)
        body["metadata"]["labels"] = {"colour": colour}
        created = ok(http(devcluster, "POST", base(group), body), 201)
        assert created["metadata"]["namespace"] == "crd-a" and created["metadata"]["uid"]
        assert created["metadata"]["generation"] == 1
    got = ok(http(devcluster, "GET", base(group) + "/red-1"))
    assert got["spec"] == {"size": 2, "mode": "fast"}  # the default filled in
    listed = ok(http(devcluster, "GET", base(group) + "?labelSelector=colour%3Dred"))
    assert listed["kind"] == "WidgetList" and listed["apiVersion"] == f"{group}/v1"
    assert sorted(i["metadata"]["name"] for i in listed["items"]) == ["red-1", "red-2"]
    # across namespaces, and 409 / 404 as for built-ins
    everywhere = ok(http(devcluster, "GET", base(group, namespace=None)))
    assert len(everywhere["items"]) == 3
    status, body, _ = http(devcluster, "POST", base(group), widget("red-1", group))
    assert status == 409 and body["message"] == f'widgets.{group} "red-1" already exists'
    status, body, _ = http(devcluster, "GET", base(group) + "/nope")
    assert status == 404 and body["message"] == f'widgets.{group} "nope" not found'
    # the body must say what the URL says
    status, body, _ = http(devcluster, "POST", base(group), widget("x", "other.example.com"))
    assert status == 400 and "does not match the expected API version" in body["message"]
    assert ok(http(devcluster, "DELETE", base(group) + "/blue-1"))["metadata"]["name"] == "blue-1"
    assert http(devcluster, "GET", base(group) + "/blue-1")[0] == 404


def test_a_cluster_scoped_resource_has_no_namespace_and_no_namespaced_path(devcluster):
    group = "cluster.example.com"
    ok(http(devcluster, "POST", CRDS, widget_crd(group, scope="Cluster")), 201)
    created = ok(http(devcluster, "POST", base(group, namespace=None), widget("global", group)),
                 201)  # fmt: skip
    assert "namespace" not in created["metadata"]
    assert ok(http(devcluster, "GET", base(group, namespace=None) + "/global"))["spec"]["size"] == 1
    assert http(devcluster, "GET", base(group) + "/global")[0] == 404


def test_unknown_fields_are_pruned_with_a_warning_or_refused_when_strict(devcluster):
    group = "prune.example.com"
    ok(http(devcluster, "POST", CRDS, widget_crd(group)), 201)
    body = widget("pruned", group, size=3, unknown="x", extra={"anything": {"goes": [1]}},
                  template={"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "t"},
                            "spec": {"replicas": 2, "dropped": True}})  # fmt: skip
    body["metadata"]["bogus"] = "meta"
    body["topLevel"] = 1
    status, created, warnings = http(devcluster, "POST", base(group), body)
    assert status == 201
    assert created["spec"]["extra"] == {"anything": {"goes": [1]}}  # preserve-unknown-fields
    # an embedded resource keeps apiVersion, kind and metadata; its unknown fields go
    assert created["spec"]["template"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "t"},
        "spec": {"replicas": 2},
    }
    assert "unknown" not in created["spec"] and "topLevel" not in created
    assert "bogus" not in created["metadata"]
    assert sorted(warnings) == sorted(
        f'299 - "unknown field \\"{p}\\""'
        for p in ("metadata.bogus", "spec.template.spec.dropped", "spec.unknown", "topLevel")
    )
    # what kubectl sends by default: fieldValidation=Strict refuses, naming every field
    body["metadata"]["name"] = "strict"
    status, refused, _ = http(devcluster, "POST", base(group) + "?fieldValidation=Strict", body)
    assert status == 400 and refused["reason"] == "BadRequest"
    assert refused["message"].startswith(
        'Widget in version "v1" cannot be handled as a Widget: strict decoding error: '
    )
    assert 'unknown field "spec.unknown"' in refused["message"]
    assert http(devcluster, "GET", base(group) + "/strict")[0] == 404
    # Ignore: pruned without a word
    body["metadata"]["name"] = "quiet"
    status, _, warnings = http(devcluster, "POST", base(group) + "?fieldValidation=Ignore", body)
    assert status == 201 and warnings == []


def test_schema_errors_are_422_with_every_field_path(devcluster):
    group = "invalid.example.com"
    ok(http(devcluster, "POST", CRDS, widget_crd(group)), 201)
    status, body, _ = http(
        devcluster,
        "POST",
        base(group),
        widget("bad", group, size="three", mode="turbo", labels={"a": 1}),
    )
    assert status == 422 and body["reason"] == "Invalid"
    assert body["message"] == (
        'Widget.invalid.example.com "bad" is invalid: ['
        'spec.size: Invalid value: "string": spec.size in body must be of type integer: '
        '"string", '
        'spec.mode: Unsupported value: "turbo": supported values: "fast", "slow", '
        'spec.labels.a: Invalid value: "integer": spec.labels.a in body must be of type string: '
        '"integer"]'
    )
    assert [c["field"] for c in body["details"]["causes"]] == [
        "spec.size",
        "spec.mode",
        "spec.labels.a",
    ]
    assert body["details"]["group"] == group and body["details"]["kind"] == "Widget"
    status, body, _ = http(devcluster, "POST", base(group), widget("small", group, size=0))
    assert status == 422 and body["message"].endswith(
        "spec.size: Invalid value: 0: spec.size in body should be greater than or equal to 1"
    )
    status, body, _ = http(devcluster, "POST", base(group), widget("empty", group, mode="slow"))
    assert status == 422 and body["message"].endswith("spec.size: Required value")
    # ObjectMeta is checked as for every kind
    named = widget("Not_A_Name", group)
    status, body, _ = http(devcluster, "POST", base(group), named)
    assert status == 422 and "a lowercase RFC 1123 subdomain must consist of" in body["message"]
    assert all(http(devcluster, "GET", base(group) + f"/{n}")[0] == 404
               for n in ("bad", "small", "empty"))  # fmt: skip


def test_patch_merge_and_json_and_replace_with_optimistic_concurrency(devcluster):
    group = "patch.example.com"
    ok(http(devcluster, "POST", CRDS, widget_crd(group)), 201)
    ok(http(devcluster, "POST", base(group), widget("p", group, size=1)), 201)
    merged = ok(
        http(
            devcluster,
            "PATCH",
            base(group) + "/p",
            {"metadata": {"labels": {"a": "1"}}, "spec": {"size": 4}},
            MERGE,
        )
    )
    assert merged["spec"]["size"] == 4 and merged["metadata"]["labels"] == {"a": "1"}
    assert merged["metadata"]["generation"] == 2  # the spec changed
    relabelled = ok(
        http(
            devcluster,
            "PATCH",
            base(group) + "/p",
            [{"op": "add", "path": "/metadata/labels/b", "value": "2"}],
            JSON_PATCH,
        )
    )
    assert relabelled["metadata"]["labels"] == {"a": "1", "b": "2"}
    assert relabelled["metadata"]["generation"] == 2  # metadata only: same generation
    status, body, _ = http(
        devcluster,
        "PATCH",
        base(group) + "/p",
        [{"op": "remove", "path": "/spec/nothing"}],
        JSON_PATCH,
    )
    assert status == 422
    assert body["message"] == ('remove operation does not apply: doc is missing path: '
                               '"/spec/nothing": missing value')  # fmt: skip
    # a patch that breaks the schema changes nothing
    status, _, _ = http(devcluster, "PATCH", base(group) + "/p", {"spec": {"size": -1}}, MERGE)
    assert status == 422
    current = ok(http(devcluster, "GET", base(group) + "/p"))
    assert current["spec"]["size"] == 4
    # PUT replaces (the labels not sent are gone); a stale resourceVersion is a 409
    replacement = widget("p", group, size=9)
    replacement["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
    replaced = ok(http(devcluster, "PUT", base(group) + "/p", replacement))
    assert replaced["spec"] == {"size": 9, "mode": "fast"} and "labels" not in replaced["metadata"]
    assert replaced["metadata"]["uid"] == current["metadata"]["uid"]
    status, body, _ = http(devcluster, "PUT", base(group) + "/p", replacement)
    assert status == 409 and body["reason"] == "Conflict"
    # custom resources take no strategic merge patch, as on the apiserver
    status, body, _ = http(devcluster, "PATCH", base(group) + "/p", {"spec": {"size": 2}},
                           "application/strategic-merge-patch+json")  # fmt: skip
    assert status == 415 and body["reason"] == "UnsupportedMediaType"


def test_the_status_subresource_splits_spec_and_status_writes(devcluster):
    group = "status.example.com"
    ok(http(devcluster, "POST", CRDS, widget_crd(group, status=True)), 201)
    body = widget("s", group, size=1)
    body["status"] = {"ready": True}
    created = ok(http(devcluster, "POST", base(group), body), 201)
    assert "status" not in created  # a create cannot set status
    ok(http(devcluster, "PATCH", base(group) + "/s/status",
            {"status": {"ready": True}, "spec": {"size": 7}}, MERGE))  # fmt: skip
    after_status = ok(http(devcluster, "GET", base(group) + "/s"))
    assert after_status["status"] == {"ready": True}
    assert after_status["spec"]["size"] == 1  # /status ignores the spec
    assert after_status["metadata"]["generation"] == 1  # status changes leave generation
    ok(http(devcluster, "PATCH", base(group) + "/s",
            {"status": {"ready": False}, "spec": {"size": 2}}, MERGE))  # fmt: skip
    after_spec = ok(http(devcluster, "GET", base(group) + "/s"))
    assert after_spec["status"] == {"ready": True}  # the main resource ignores status
    assert after_spec["spec"]["size"] == 2 and after_spec["metadata"]["generation"] == 2
    status = ok(http(devcluster, "GET", base(group) + "/s/status"))
    assert status["status"] == {"ready": True}
    # what the apiserver refuses with 405: DELETE on the subresource, a create without a namespace
    for method, path in (
        ("DELETE", base(group) + "/s/status"),
        ("POST", base(group, namespace=None)),
    ):
        code, refused, _ = http(devcluster, method, path, widget("t", group))
        assert (code, refused["reason"]) == (405, "MethodNotAllowed"), (method, path)
    assert ok(http(devcluster, "GET", base(group) + "/s"))["spec"]["size"] == 2
    # a resource without the subresource has no /status
    ok(http(devcluster, "POST", CRDS, widget_crd("nostatus.example.com")), 201)
    ok(http(devcluster, "POST", base("nostatus.example.com"), widget("n", "nostatus.example.com")),
       201)  # fmt: skip
    assert http(devcluster, "GET", base("nostatus.example.com") + "/n/status")[0] == 404


def _watch(cluster: Any, path: str, count: int) -> list[dict[str, Any]]:
    """The first `count` events of a watch (the server ends it after 5 s at most)."""
    sep = "&" if "?" in path else "?"
    with urllib.request.urlopen(f"{cluster.url}{path}{sep}watch=true&timeoutSeconds=5",
                                timeout=30) as resp:  # fmt: skip
        events = []
        for line in resp:
            events.append(json.loads(line))
            if len(events) == count:
                break
        return events


def test_watch_resumes_from_a_resource_version_with_selectors_and_versions(devcluster):
    group = "watch.example.com"
    ok(http(devcluster, "POST", CRDS, widget_crd(group, versions=("v1", "v1beta1"))), 201)
    first = ok(http(devcluster, "POST", base(group), widget("w1", group)), 201)
    since = first["metadata"]["resourceVersion"]
    labelled = widget("w2", group)
    labelled["metadata"]["labels"] = {"watch": "me"}
    ok(http(devcluster, "POST", base(group), labelled), 201)
    ok(http(devcluster, "PATCH", base(group) + "/w1", {"spec": {"size": 5}}, MERGE))
    ok(http(devcluster, "PATCH", base(group) + "/w1", {"metadata": {"labels": {"watch": "me"}}},
            MERGE))  # fmt: skip
    ok(http(devcluster, "DELETE", base(group) + "/w2"))
    events = _watch(devcluster, base(group) + f"?resourceVersion={since}", 4)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "w2"),
        ("MODIFIED", "w1"),
        ("MODIFIED", "w1"),
        ("DELETED", "w2"),
    ]
    # label-selected: w1 arrives when the label is added, w2 leaves when deleted
    selected = _watch(devcluster, base(group) + f"?resourceVersion={since}&labelSelector=watch", 3)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in selected] == [
        ("ADDED", "w2"),
        ("ADDED", "w1"),
        ("DELETED", "w2"),
    ]
    # the same objects through the other served version (conversion None: only apiVersion)
    beta = _watch(devcluster, base(group, "v1beta1"), 1)
    assert beta[0]["object"]["apiVersion"] == f"{group}/v1beta1"
    assert ok(http(devcluster, "GET", base(group, "v1beta1") + "/w1"))["apiVersion"] == (
        f"{group}/v1beta1")  # fmt: skip


def test_deleting_a_crd_deletes_its_objects_and_stops_serving_it(devcluster):
    group = "gone.example.com"
    ok(http(devcluster, "POST", CRDS, widget_crd(group)), 201)
    ok(http(devcluster, "POST", base(group), widget("doomed", group)), 201)
    listed = ok(http(devcluster, "GET", base(group)))
    with urllib.request.urlopen(
        f"{devcluster.url}{base(group)}?watch=true&timeoutSeconds=10"
        f"&resourceVersion={listed['metadata']['resourceVersion']}", timeout=30
    ) as resp:  # fmt: skip
        ok(http(devcluster, "DELETE", f"{CRDS}/widgets.{group}"))
        events = [json.loads(line) for line in resp]  # the watch ends with the resource
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("DELETED", "doomed")]
    assert http(devcluster, "GET", base(group))[0] == 404
    assert group not in {g["name"] for g in ok(http(devcluster, "GET", "/apis"))["groups"]}
    # defined again, it starts empty
    ok(http(devcluster, "POST", CRDS, widget_crd(group)), 201)
    assert ok(http(devcluster, "GET", base(group)))["items"] == []


# ---------------------------------------------------------------- namespaces
def test_namespaces_carry_labels_that_select_and_patch(devcluster):
    selected = ok(
        http(
            devcluster,
            "GET",
            "/api/v1/namespaces?labelSelector=app.kubernetes.io/part-of%3Dkubeflow-profile",
        )
    )
    assert sorted(n["metadata"]["name"] for n in selected["items"]) == ["team-a", "team-b"]
    team_a = ok(http(devcluster, "GET", "/api/v1/namespaces/team-a"))
    assert team_a["metadata"]["annotations"] == {"owner": "alice@example.com"}
    # every namespace is labelled with its own name, as the apiserver labels it
    assert team_a["metadata"]["labels"]["kubernetes.io/metadata.name"] == "team-a"
    ok(http(devcluster, "PATCH", "/api/v1/namespaces/team-a",
            {"metadata": {"labels": {"team": "a"}}}, MERGE))  # fmt: skip
    teams = ok(http(devcluster, "GET", "/api/v1/namespaces?labelSelector=team"))
    assert sorted(n["metadata"]["name"] for n in teams["items"]) == ["team-a", "team-b"]
    created = ok(http(devcluster, "POST", "/api/v1/namespaces",
                      {"metadata": {"name": "fresh", "labels": {"x": "y"}}}), 201)  # fmt: skip
    assert created["metadata"]["labels"] == {"x": "y", "kubernetes.io/metadata.name": "fresh"}
    assert created["status"] == {"phase": "Active"}
    status, body, _ = http(
        devcluster,
        "PATCH",
        "/api/v1/namespaces/fresh",
        {"metadata": {"labels": {"bad": "x" * 64}}},
        MERGE,
    )
    assert status == 422 and "must be no more than 63 characters" in body["message"]
    status, body, _ = http(
        devcluster, "POST", "/api/v1/namespaces", {"metadata": {"name": "Upper"}}
    )
    assert status == 422 and "a lowercase RFC 1123 label must consist of" in body["message"]


def test_deleting_a_namespace_deletes_the_custom_resources_in_it(devcluster):
    group = "nsdelete.example.com"
    ok(http(devcluster, "POST", "/api/v1/namespaces", {"metadata": {"name": "short-lived"}}), 201)
    ok(http(devcluster, "POST", CRDS, widget_crd(group)), 201)
    ok(http(devcluster, "POST", base(group, namespace="short-lived"), widget("inside", group)), 201)
    ok(http(devcluster, "POST", base(group), widget("outside", group)), 201)
    ok(http(devcluster, "DELETE", "/api/v1/namespaces/short-lived"))
    listed = ok(http(devcluster, "GET", base(group, namespace=None)))
    assert [i["metadata"]["name"] for i in listed["items"]] == ["outside"]


# ---------------------------------------------------------------- the Kubeflow Notebook CRD
def notebook(name: str, version: str = "v1", **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"kubeflow.org/{version}",
        "kind": "Notebook",
        "metadata": {"name": name, "labels": {"app": name, "access-ml-pipeline": "true"},
                     "annotations": {"notebooks.kubeflow.org/creator": "alice@example.com"}},
        "spec": {"template": {"spec": {
            "serviceAccountName": "default-editor",
            "containers": [{"name": name, "image": "kubeflownotebookswg/jupyter-scipy:v1.10.0",
                            "resources": {"requests": {"cpu": "0.5", "memory": "1Gi"},
                                          "limits": {"nvidia.com/gpu": 1}},
                            "env": [{"name": "NB_PREFIX", "value": f"/notebook/team-a/{name}"}]}],
            **extra,
        }}},
    }  # fmt: skip


def test_the_kubeflow_notebook_crd_serves_notebooks_as_the_jupyter_web_app_writes_them(
    devcluster,
):
    crd = yaml.safe_load(NOTEBOOK_CRD.read_text())
    ok(http(devcluster, "POST", CRDS, crd), 201)
    nb = "/apis/kubeflow.org/v1beta1/namespaces/team-a/notebooks"
    # the Jupyter web app writes v1beta1; a dry run first, as it does, stores nothing
    dry = ok(http(devcluster, "POST", nb + "?dryRun=All", notebook("scipy", "v1beta1")), 201)
    assert dry["metadata"]["uid"] and "resourceVersion" not in dry["metadata"]
    assert http(devcluster, "GET", nb + "/scipy")[0] == 404
    created = ok(
        http(devcluster, "POST", nb, notebook("scipy", "v1beta1", tolerations=[{"key": "gpu"}])),
        201,
    )
    container = created["spec"]["template"]["spec"]["containers"][0]
    assert container["env"][0]["value"] == "/notebook/team-a/scipy"  # preserved PodSpec fields
    assert container["resources"]["limits"] == {"nvidia.com/gpu": 1}  # int-or-string
    # the culler reads v1 and stops a notebook the way the web app does
    v1 = "/apis/kubeflow.org/v1/namespaces/team-a/notebooks/scipy"
    stopped = ok(
        http(
            devcluster,
            "PATCH",
            v1,
            {"metadata": {"annotations": {"kubeflow-resource-stopped": "2026-01-01T00:00:00Z"}}},
            MERGE,
        )
    )
    assert stopped["apiVersion"] == "kubeflow.org/v1"
    assert stopped["metadata"]["annotations"]["kubeflow-resource-stopped"] == "2026-01-01T00:00:00Z"
    # the controller's status goes through /status and must be complete
    status_path = v1 + "/status"
    status, body, _ = http(
        devcluster, "PATCH", status_path, {"status": {"readyReplicas": 1}}, MERGE
    )
    assert status == 422 and "status.conditions: Required value" in body["message"]
    ok(http(devcluster, "PATCH", status_path, {"status": {
        "readyReplicas": 1, "containerState": {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
        "conditions": [{"type": "Ready", "status": "True"}]}}, MERGE))  # fmt: skip
    # a container without a name is refused
    bad = notebook("broken")
    del bad["spec"]["template"]["spec"]["containers"][0]["name"]
    status, body, _ = http(devcluster, "POST", nb.replace("v1beta1", "v1"), bad)
    assert status == 422
    assert "spec.template.spec.containers[0].name: Required value" in body["message"]

    # kubectl finds the kind from discovery and prints it
    table = kubectl(devcluster, "get", "notebooks", "-n", "team-a")
    assert table.split("\n")[0].split() == ["NAME", "AGE"]
    assert table.split("\n")[1].split()[0] == "scipy"
    fetched = json.loads(kubectl(devcluster, "get", "notebook", "scipy", "-n", "team-a",
                                 "-o", "json"))  # fmt: skip
    assert fetched["kind"] == "Notebook" and fetched["status"]["readyReplicas"] == 1
    assert "notebooks" in kubectl(devcluster, "api-resources", "--api-group=kubeflow.org")


def test_kubectl_prints_a_crds_printer_columns(devcluster):
    group = "columns.example.com"
    columns = [
        {"name": "Size", "type": "integer", "jsonPath": ".spec.size"},
        {"name": "Mode", "type": "string", "jsonPath": ".spec.mode"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    ok(http(devcluster, "POST", CRDS, widget_crd(group, columns=columns,
                                                short_names=["cw"])), 201)  # fmt: skip
    ok(http(devcluster, "POST", base(group), widget("printed", group, size=3)), 201)
    lines = kubectl(devcluster, "get", "cw", "-n", "crd-a").splitlines()
    assert lines[0].split() == ["NAME", "SIZE", "MODE", "AGE"]
    assert lines[1].split()[:3] == ["printed", "3", "fast"]


def test_what_the_devcluster_does_not_evaluate_is_said_as_a_warning(devcluster):
    crd = widget_crd("cel.example.com")
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec["x-kubernetes-validations"] = [{"rule": "self.size <= 8", "message": "too big"}]
    status, _, warnings = http(devcluster, "POST", CRDS, crd)
    assert status == 201
    assert warnings == [
        '299 - "devcluster: v1: x-kubernetes-validations (CEL) rules are not evaluated"'
    ]


def test_kubectl_apply_creates_and_changes_custom_resources_with_server_side_validation(
    devcluster, tmp_path
):
    group = "apply.example.com"
    crd_file = tmp_path / "crd.yaml"
    crd_file.write_text(yaml.safe_dump(widget_crd(group)))
    assert "created" in kubectl(devcluster, "apply", "-f", str(crd_file))
    manifest = widget("applied", group, size=2)
    manifest["metadata"]["namespace"] = "crd-a"
    target = tmp_path / "widget.yaml"
    target.write_text(yaml.safe_dump(manifest))
    assert kubectl(devcluster, "apply", "-f", str(target)).strip() == (
        f"widget.{group}/applied created"
    )
    assert kubectl(devcluster, "apply", "-f", str(target)).strip() == (
        f"widget.{group}/applied unchanged"
    )
    manifest["spec"]["size"] = 5
    target.write_text(yaml.safe_dump(manifest))
    assert kubectl(devcluster, "apply", "-f", str(target)).strip() == (
        f"widget.{group}/applied configured"
    )
    assert ok(http(devcluster, "GET", base(group) + "/applied"))["spec"]["size"] == 5
    # kubectl validates through the server (fieldValidation=Strict): an unknown field fails
    manifest["metadata"]["name"] = "typo"
    manifest["spec"]["sise"] = 5
    target.write_text(yaml.safe_dump(manifest))
    result = subprocess.run(
        ["/usr/bin/kubectl", "--kubeconfig", str(devcluster.kubeconfig), "apply", "-f",
         str(target)], capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1
    assert 'strict decoding error: unknown field "spec.sise"' in result.stderr
    assert http(devcluster, "GET", base(group) + "/typo")[0] == 404
