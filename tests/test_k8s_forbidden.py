"""fracspawner/k8s/forbidden.py: a 403 from the apiserver's authoriser in words an admin can act
on (the apiserver's message, the account, what it asked, what in the chart grants it)."""

from __future__ import annotations

import json

from fracspawner.k8s.forbidden import api_status, refused, service_account


class Refusal(Exception):
    """Shaped as kubernetes_asyncio's ApiException: `status` and the body the server sent."""

    def __init__(self, status: int, body: bytes | str | None, reason: str = "Forbidden") -> None:
        super().__init__(status)
        self.status, self.body, self.reason = status, body, reason


def _status(message: str) -> bytes:
    return json.dumps(
        {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
         "reason": "Forbidden", "code": 403}
    ).encode()  # fmt: skip


NAMESPACED = (
    'pods is forbidden: User "system:serviceaccount:jhub:fracspawner-culler" cannot list '
    'resource "pods" in API group "" in the namespace "jhub"'
)
CLUSTER = (
    'resourceslices.resource.k8s.io is forbidden: User "system:serviceaccount:jhub:x" cannot '
    'watch resource "resourceslices" in API group "resource.k8s.io" at the cluster scope'
)


def grant(account: str | None) -> str:
    return f"check Role {account}"


def test_a_namespaced_refusal_names_the_account_the_verb_and_the_namespace():
    words = refused(Refusal(403, _status(NAMESPACED)), component="the culler", needs="-",
                    grant=grant)  # fmt: skip
    assert words == (
        f"forbidden by the API server ({NAMESPACED}): the culler's ServiceAccount "
        "fracspawner-culler may not list pods in namespace jhub; check Role fracspawner-culler"
    )


def test_a_cluster_scoped_refusal_names_the_group():
    words = refused(Refusal(403, _status(CLUSTER)), component="the culler", needs="-",
                    grant=grant)  # fmt: skip
    assert words is not None
    assert "ServiceAccount x may not watch resourceslices.resource.k8s.io in any namespace" in words


def test_a_refusal_without_the_apiservers_words_says_what_was_needed():
    for body in (None, b"", b"not json", json.dumps({"message": 3})):
        words = refused(Refusal(403, body), component="the culler", needs="list pods",
                        grant=grant)  # fmt: skip
        assert words == (
            "forbidden by the API server: the culler's ServiceAccount may not list pods; "
            "check Role None"
        )


def test_only_a_403_is_a_refusal():
    for status in (401, 404, 410, 500):
        assert refused(Refusal(status, _status(NAMESPACED)), component="c", needs="n",
                       grant=grant) is None  # fmt: skip
    assert refused(OSError("reset"), component="c", needs="n", grant=grant) is None
    assert api_status(OSError("reset")) == (None, "")


def test_a_user_that_is_not_a_service_account_is_named_as_a_user():
    message = NAMESPACED.replace("system:serviceaccount:jhub:fracspawner-culler", "alice")
    words = refused(Refusal(403, _status(message)), component="the culler", needs="-",
                    grant=grant)  # fmt: skip
    assert words is not None and "the culler's user alice may not list pods" in words
    assert service_account("system:serviceaccount:ns:name") == "name"
    assert service_account("system:serviceaccount:ns") is None


def test_a_watch_refused_has_the_message_in_its_reason():
    """kubernetes_asyncio's Watch raises a refused watch with reason "Forbidden: <message>"
    and no body."""
    message = NAMESPACED.replace("cannot list", "cannot watch")
    words = refused(Refusal(403, None, f"Forbidden: {message}"), component="the culler",
                    needs="-", grant=grant)  # fmt: skip
    assert words is not None and f"({message})" in words
    assert "ServiceAccount fracspawner-culler may not watch pods in namespace jhub" in words
