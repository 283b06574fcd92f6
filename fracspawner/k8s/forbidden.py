"""Words for a request the API server's authoriser refused (403), for the log of a component
whose ServiceAccount lacks a permission the chart's RBAC should grant.

A refused list or watch is retried with a backoff (the RBAC may be fixed while it runs), so the
log line is all an admin sees: it carries the apiserver's own message (it names the user, the
verb, the resource and the namespace) and what in the chart grants the permission.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Answer", "api_status", "refused", "service_account"]


def api_status(exc: object) -> tuple[int | None, str]:
    """(HTTP status, the apiserver's Status message or "") of a kubernetes_asyncio
    ApiException, or of anything carrying `status` and `body` (or `reason`) the same way (an
    `Answer`)."""
    status = getattr(exc, "status", None)
    body: Any = getattr(exc, "body", None)
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    message = ""
    if isinstance(body, str) and body.strip():
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict) and isinstance(parsed.get("message"), str):
            message = parsed["message"]
    reason = getattr(exc, "reason", None)
    if not message and isinstance(reason, str) and ": " in reason:
        # an error event of a watch: kubernetes_asyncio's Watch raises it without a body,
        # its reason "<reason>: <message>" (watch/watch.py unmarshal_event)
        message = reason.split(": ", 1)[1]
    return (status if isinstance(status, int) else None), message


#: the RBAC authoriser's words (k8s.io/apiserver pkg/endpoints/handlers/responsewriters
#: errors.go forbiddenMessage): `User "u" cannot list resource "pods" in API group "" in the
#: namespace "ns"` or `... at the cluster scope`
_USER = re.compile(r'User "([^"]+)"')
_CANNOT = re.compile(
    r'cannot (\S+) resource "([^"]+)"(?: in API group "([^"]*)")?'
    r'(?: in the namespace "([^"]+)"| (at the cluster scope))?'
)


def service_account(username: str) -> str | None:
    """The ServiceAccount's name of a `system:serviceaccount:<namespace>:<name>` user."""
    parts = username.split(":")
    if len(parts) == 4 and parts[:2] == ["system", "serviceaccount"]:
        return parts[3]
    return None


@dataclass(frozen=True)
class Answer:
    """An API answer read raw (`_preload_content=False`): its status and body."""

    status: int
    body: bytes | str


def refused(
    exc: object,
    *,
    component: str,
    needs: str,
    grant: Callable[[str | None], str],
) -> str | None:
    """For a 403: "forbidden by the API server (<its message>): <component>'s ServiceAccount
    <name> may not <verb> <resource> in namespace <ns>; <grant(name)>", the account and what it
    asked read from the apiserver's message (`needs` when it says neither); None for anything
    but a 403. `grant(name)` says what in the chart grants it (the account's name, if known)."""
    status, message = api_status(exc)
    if status != 403:
        return None
    user = _USER.search(message)
    account = service_account(user.group(1)) if user else None
    if account:
        who = f"{component}'s ServiceAccount {account}"
    elif user:
        who = f"{component}'s user {user.group(1)}"
    else:
        who = f"{component}'s ServiceAccount"
    cannot = _CANNOT.search(message)
    if cannot:
        verb, resource, group, namespace, cluster = cannot.groups()
        asked = f"{verb} {resource}" + (f".{group}" if group else "")
        if namespace:
            asked += f" in namespace {namespace}"
        elif cluster:
            asked += " in any namespace (cluster scope)"
    else:
        asked = needs
    said = f" ({message})" if message else ""
    return f"forbidden by the API server{said}: {who} may not {asked}; {grant(account)}"
