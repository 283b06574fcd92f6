"""POSTing an AdmissionReview to a webhook over HTTPS, as the apiserver's webhook client does,
with its failures worded like Go's (`Post "https://...": dial tcp 127.0.0.1:9443: connect:
connection refused`, `context deadline exceeded`, `tls: failed to verify certificate: x509:
certificate signed by unknown authority`).

The server certificate is verified for real: against the webhook's `caBundle` when it has
one, else the system's trust roots, and for the host name of the URL (for a Service,
`<name>.<namespace>.svc`, wherever the devcluster sends the connection).
"""

from __future__ import annotations

import base64
import binascii
import json
import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from tornado.httpclient import HTTPRequest
from tornado.simple_httpclient import HTTPTimeoutError, SimpleAsyncHTTPClient


class CallError(Exception):
    """The call failed (ErrCallingWebhook's reason): the failure policy decides what follows."""


#: client-go's messages for error responses that are not a Status (rest/request.go,
#: newUnstructuredResponseError and apierrors.NewGenericServerResponse)
_GENERIC = {
    400: "the server rejected our request for an unknown reason",
    401: "the server has asked for the client to provide credentials",
    403: "the server does not allow access to the requested resource",
    404: "the server could not find the requested resource",
    405: "the server does not allow this method on the requested resource",
    409: "the server reported a conflict",
    415: "the server responded with the status code 415 but did not return more information",
    422: "the server rejected our request due to an error in our request",
    429: "the server has received too many requests and has asked us to try again later",
    503: "the server is currently unable to handle the request",
    504: "the server was unable to return a response in the time allotted, but may still be "
    "processing the request",
}


@dataclass(frozen=True)
class Target:
    url: str  # what the request is addressed to (and the certificate verified for)
    address: str  # where the connection goes
    port: int


def tls_context(ca_bundle: str | None) -> ssl.SSLContext:
    """Verification against the caBundle (base64 of PEM certificates), else system roots."""
    context = ssl.create_default_context()
    if ca_bundle:
        try:
            pem = base64.b64decode(ca_bundle).decode()
            context = ssl.create_default_context(cadata=pem)
        except (ValueError, ssl.SSLError, binascii.Error) as exc:
            raise CallError(f"unable to load root certificates: {exc}") from None
    return context


def _go_error(exc: BaseException, target: Target, host: str) -> str:
    if isinstance(exc, HTTPTimeoutError):
        return "context deadline exceeded"
    if isinstance(exc, ssl.SSLCertVerificationError):
        # OpenSSL's verify codes: 10 expired, 62 host name and 64 IP address mismatch
        why = {
            10: "x509: certificate has expired or is not yet valid",
            62: f"x509: certificate is not valid for {host}",
            64: f"x509: certificate is not valid for {host}",
        }.get(exc.verify_code, "x509: certificate signed by unknown authority")
        return f"tls: failed to verify certificate: {why}"
    if isinstance(exc, ssl.SSLError):
        return f"remote error: tls: {exc.reason or exc}"
    if isinstance(exc, ConnectionRefusedError):
        return f"dial tcp {target.address}:{target.port}: connect: connection refused"
    if isinstance(exc, OSError):
        return f"dial tcp {target.address}:{target.port}: {exc.strerror or exc}"
    return str(exc)


def _error_response(code: int, body: bytes) -> str:
    try:
        status = json.loads(body)
    except ValueError:
        status = None
    if isinstance(status, dict) and status.get("kind") == "Status" and status.get("message"):
        return str(status["message"])
    if code in _GENERIC:
        return _GENERIC[code]
    text = body.decode(errors="replace").strip()
    return f"an error on the server ({json.dumps(text)}) has prevented the request from succeeding"


def request_url(url: str, timeout: float) -> str:
    """The URL as the apiserver's client sends it: with the call's timeout, rounded up to
    whole seconds, as `?timeout=10s`."""
    seconds = max(1, int(-(-timeout // 1)))
    return url + ("&" if "?" in url else "?") + f"timeout={seconds}s"


async def post(
    target: Target, review: dict[str, Any], timeout: float, ca_bundle: str | None
) -> Any:
    """The decoded JSON answer of the webhook, or CallError worded like the apiserver's."""
    url = request_url(target.url, timeout)
    parts = urlsplit(target.url)
    host = parts.hostname or ""
    context = tls_context(ca_bundle)
    # connect to the target's address and port; TLS still verifies the URL's host name
    mapping = {(host, parts.port or 443): (target.address, target.port)}
    client = SimpleAsyncHTTPClient(force_instance=True, hostname_mapping=mapping)
    request = HTTPRequest(
        url,
        method="POST",
        body=json.dumps(review),
        headers={"Content-Type": "application/json", "Accept": "application/json, */*"},
        connect_timeout=timeout,
        request_timeout=timeout,
        ssl_options=context,
        follow_redirects=False,
    )
    try:
        response = await client.fetch(request, raise_error=False)
    except Exception as exc:  # the transport's failure, whatever it is, is the call failing
        raise CallError(f'Post "{url}": {_go_error(exc, target, host)}') from None
    finally:
        client.close()
    if response.code == 599:  # tornado reports transport errors as a 599 response
        error = response.error or RuntimeError("connection failed")
        raise CallError(f'Post "{url}": {_go_error(error, target, host)}')
    body = response.body or b""
    if not 200 <= response.code <= 206:
        raise CallError(_error_response(response.code, body))
    try:
        return json.loads(body)
    except ValueError as exc:
        raise CallError(f"couldn't get version/kind; json parse error: {exc}") from None
