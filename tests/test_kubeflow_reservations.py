"""Issue 34 items 5 and 6: quota reservations a tenant cannot steer.

The webhook runs in process (tests/test_dra_kubeflow.py's FakeCluster: namespace labels, watches
fed by hand). What is modelled (cited):
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

import copy
from typing import Any

import pytest

from fracspawner.kubeflow.webhook import Webhook
from tests.kubeflow_support import patched
from tests.test_dra_kubeflow import (
    CATALOG,
    H100,
    FakeCluster,
    FakeWatch,
    allowed,
    claim,
    claim_review,
    claim_spec,
    memory,
    message,
    request,
)

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
