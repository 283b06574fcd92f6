"""A few calls to the apiserver with the admin's client certificate (the launcher's own needs:
readiness, creating the built-in objects); everything else goes through real clients."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from typing import Any

from .pki import KeyPair

#: where the launcher's manifests' kinds live (apiVersion, kind) -> collection path
COLLECTIONS = {
    ("resource.k8s.io/v1", "DeviceClass"): "/apis/resource.k8s.io/v1/deviceclasses",
    (
        "apiextensions.k8s.io/v1",
        "CustomResourceDefinition",
    ): "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
}


class Client:
    def __init__(self, server: str, ca_cert: str, client: KeyPair) -> None:
        self.server = server
        self._tls = ssl.create_default_context(cafile=ca_cert)
        self._tls.load_cert_chain(str(client.cert), str(client.key))

    def request(
        self, method: str, path: str, body: Any = None, timeout: float = 10
    ) -> tuple[int, str]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, context=self._tls, timeout=timeout) as resp:
                return resp.status, resp.read().decode(errors="replace")
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode(errors="replace")

    def create(self, obj: dict[str, Any]) -> None:
        """POST `obj` to its collection; an object that already exists is left as it is."""
        key = (obj["apiVersion"], obj["kind"])
        if key not in COLLECTIONS:
            raise ValueError(f"no collection known for {key[1]} {key[0]}")
        status, text = self.request("POST", COLLECTIONS[key], obj)
        if status not in (200, 201, 409):
            raise RuntimeError(f"creating {key[1]} {obj['metadata']['name']}: {status} {text}")

    def get_json(self, path: str) -> dict[str, Any] | None:
        status, text = self.request("GET", path)
        return json.loads(text) if status == 200 else None


def ok(url: str, timeout: float = 2) -> bool:
    """Whether an unauthenticated health endpoint (/health, /healthz) answers 200. The
    components' own serving certificates are self-signed: loopback, not verified."""
    tls = ssl.create_default_context()
    tls.check_hostname = False
    tls.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, context=tls, timeout=timeout) as resp:
            return resp.status == 200
    except (OSError, urllib.error.URLError):
        return False
