"""Issue 34 item 4: a claim on a consumable-shares DRA pool counts as what the allocator gives it.

What is modelled (cited): NVIDIA's DRA kubelet plugin with `--consumable-shares=N` publishes a
`shares` capacity of N with requestPolicy {default 1, validRange min 1, step 1} and `memory`
with {default 0, min 0, step 1Mi}; with `memory` the memory policy is {default: all of it,
min 1Mi, step 1Mi} (kubernetes-sigs/dra-driver-nvidia-gpu cmd/gpu-kubelet-plugin/
consumable_shares.go applyConsumableShares). The scheduler's allocator consumes, for each
capacity of a device, the request rounded up by the policy's validRange (from min in steps),
or the policy's default when the request names none (kubernetes staging/src/k8s.io/
dynamic-resource-allocation/structured/internal/incubating/consumable_capacity.go
calculateConsumedCapacity, roundUpRange, fillEmptyRequest). So a claim asking `memory: 1Mi`
on a shares pool takes a whole share; on a memory pool it books 1Mi, and memory is enforced by
nothing at run time, so it may use the whole GPU.
"""

from __future__ import annotations

from typing import Any

import pytest

from fracspawner.backends import load_catalog
from fracspawner.kubeflow.claims import ClaimRefused, claim_amount, claim_ask
from fracspawner.kubeflow.webhook import Webhook
from tests.kubeflow_inprocess import FakeCluster, FakeWatch, allowed, message
from tests.test_dra_kubeflow import (
    claim,
    claim_review,
    claim_spec,
    memory,
    request,
)

L40S = "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA L40S'"
H100 = "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100 80GB HBM3'"
CATALOG = load_catalog(
    {
        "pools": {
            "l40s-shares": {
                "gpu": "L40S",
                "backend": "dra",
                "options": {"sharing": "shares", "shares": 8},
                "offers": ["1/8", "1/4", "1/2", "1"],
            },
            "h100-memory": {
                "gpu": "H100-80GB",
                "backend": "dra",
                "options": {"sharing": "memory"},
                "offers": ["1/8", "20GiB", "1"],
            },
        },
        "access": {
            "default": {"pools": [], "max_gpu": 0},
            "groups": {"team": {"pools": "all", "max_gpu": 1}},
        },
        "kubeflow": {"namespaces": [{"labels": {"team": "a"}, "groups": ["team"]}]},
    }
)


def shares(n: int) -> dict[str, Any]:
    return {"capacity": {"requests": {"shares": str(n)}}}


def l40s(**exactly: Any) -> dict[str, Any]:
    return claim_spec(request("gpu.nvidia.com", L40S, **exactly))


@pytest.fixture
def webhook(monkeypatch) -> Webhook:
    hook = Webhook(CATALOG, FakeCluster({"team-a": {"team": "a"}}))
    hook.pods.load([])
    assert hook.dra is not None
    hook.dra.watch = FakeWatch(hook.dra.claims)
    hook.dra.claims.load([])
    return hook


def test_each_offer_counts_as_the_hub_counts_it():
    assert claim_ask(l40s(**shares(1)), CATALOG).gpu == 0.125
    assert claim_ask(l40s(**shares(4)), CATALOG).gpu == 0.5
    assert claim_ask(l40s(**shares(8)), CATALOG).gpu == 1.0
    assert claim_ask(l40s(), CATALOG).gpu == 0.125  # no capacity named: the default, 1 share
    h100 = claim_spec(request("gpu.nvidia.com", H100, **memory("20Gi")))
    assert claim_ask(h100, CATALOG).gpu == 0.25


def test_a_size_the_pool_does_not_offer_is_refused_with_what_it_offers():
    with pytest.raises(ClaimRefused) as refused:
        claim_ask(l40s(**memory("1Mi")), CATALOG)
    words = str(refused.value)
    assert "l40s-shares does not offer" in words
    assert "shares: 1 (1/8 GPU)" in words and "shares: 8 (1 GPU)" in words
    with pytest.raises(ClaimRefused, match="shares: 3"):
        claim_ask(l40s(**shares(3)), CATALOG)
    h100 = claim_spec(request("gpu.nvidia.com", H100, **memory("1Mi")))
    with pytest.raises(ClaimRefused, match=r"memory: 10194Mi \(1/8 GPU\)"):
        claim_ask(h100, CATALOG)


def test_a_claim_made_before_the_webhook_counts_what_the_allocator_gives_it():
    """Claims the watch finds (made before the webhook ran) are never refused, only counted:
    rounded up to a share, or to the pool's next offer."""
    amount = claim_amount(CATALOG)
    assert amount(claim("team-a", "tiny", l40s(**memory("1Mi")))) == 0.125
    # a share and 30Gi of a 48Gi L40S: the memory is the larger part; the next offer is 1
    both = {"capacity": {"requests": {"shares": "1", "memory": "30Gi"}}}
    assert amount(claim("team-a", "both", l40s(**both))) == 1.0
    assert amount(claim("team-a", "three", l40s(**shares(3)))) == 0.5
    h100 = claim_spec(request("gpu.nvidia.com", H100, **memory("1Mi")))
    assert amount(claim("team-a", "h", h100)) == 0.125


async def test_six_one_mebibyte_claims_do_not_all_fit_a_one_gpu_quota(webhook):
    answers = []
    for i in range(6):
        obj = claim("team-a", f"tiny-{i}", l40s(**memory("1Mi")))
        answer = await webhook.dra.review_claim(claim_review(obj))
        answers.append(allowed(answer))
        if allowed(answer):
            webhook.dra.claims.put(obj)
    assert not all(answers)
    assert "does not offer" in message(answer)


async def test_a_half_after_shares_and_tiny_claims_is_refused(webhook):
    """The issue's run: tiny claims held (made before the webhook) and four one-share claims;
    a 0.5 claim would make 1.5 GPU... it is refused."""
    held = [claim("team-a", f"tiny-{i}", l40s(**memory("1Mi"))) for i in range(4)]
    webhook.dra.claims.load(held)
    for i in range(4):
        obj = claim("team-a", f"share-{i}", l40s(**shares(1)))
        assert allowed(await webhook.dra.review_claim(claim_review(obj)))
        webhook.dra.claims.put(obj)
    half = claim("team-a", "half", l40s(**shares(4)))
    answer = await webhook.dra.review_claim(claim_review(half))
    assert not allowed(answer)
    assert "holds 1 of its 1 GPU quota" in message(answer)


def test_a_claim_asking_nothing_on_an_unlimited_pool_counts_a_whole_gpu():
    """--consumable-shares=unlimited: memory's default is 0, so it books nothing and nothing
    keeps it from the whole GPU (consumable_shares.go)."""
    catalog = load_catalog(
        {
            "pools": {
                "l4": {
                    "gpu": "L4",
                    "backend": "dra",
                    "options": {"sharing": "unlimited"},
                    "offers": ["1/4", "1/2"],
                }
            }
        }
    )
    spec = claim_spec(request("gpu.nvidia.com"))
    assert claim_ask(spec, catalog).gpu == 1.0
