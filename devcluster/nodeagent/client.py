"""A small synchronous REST client for one identity read from a kubeconfig with client
certificate files (what the launcher and credentials.py write): JSON requests, merge patches and
watches. The node agent needs no more than this, and a thread per node keeps it simple."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml


class ApiError(RuntimeError):
    def __init__(self, status: int, method: str, path: str, body: str) -> None:
        try:
            message = json.loads(body).get("message", body)
        except ValueError:
            message = body
        super().__init__(f"{method} {path}: {status} {message}")
        self.status = status
        self.message = message


class Client:
    def __init__(self, kubeconfig: Path) -> None:
        config = yaml.safe_load(Path(kubeconfig).read_text())
        context = _named(config, "contexts", config["current-context"])["context"]
        cluster = _named(config, "clusters", context["cluster"])["cluster"]
        user = _named(config, "users", context["user"])["user"]
        if "client-certificate" not in user:
            raise ValueError(f"{kubeconfig}: the node agent needs client certificate files")
        self.server = cluster["server"].rstrip("/")
        self.user = context["user"]
        self._tls = ssl.create_default_context(cafile=cluster["certificate-authority"])
        self._tls.load_cert_chain(user["client-certificate"], user["client-key"])

    def _open(self, method: str, path: str, body: Any, content_type: str, timeout: float):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            return urllib.request.urlopen(req, context=self._tls, timeout=timeout)
        except urllib.error.HTTPError as err:
            raise ApiError(err.code, method, path, err.read().decode(errors="replace")) from None

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float = 30,
    ) -> dict[str, Any]:
        with self._open(method, path, body, content_type, timeout) as resp:
            text = resp.read().decode()
        return json.loads(text) if text else {}

    def get(self, path: str, **params: str) -> dict[str, Any]:
        return self.request("GET", _with(path, params))

    def create(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        return self.request("POST", path, obj)

    def merge_patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self.request("PATCH", path, patch, "application/merge-patch+json")

    def delete(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.request("DELETE", path, body)

    def watch(self, path: str, timeout_seconds: int, **params: str) -> Iterator[dict[str, Any]]:
        """The events of one watch request that the server ends after `timeout_seconds`."""
        query = {**params, "watch": "1", "timeoutSeconds": str(timeout_seconds)}
        with self._open("GET", _with(path, query), None, "", timeout_seconds + 30) as resp:
            for line in resp:
                if line.strip():
                    yield json.loads(line)


def _named(config: dict[str, Any], section: str, name: str) -> dict[str, Any]:
    for entry in config.get(section) or []:
        if entry.get("name") == name:
            return entry
    raise ValueError(f"kubeconfig: no {section[:-1]} named {name!r}")


def _with(path: str, params: dict[str, str]) -> str:
    return f"{path}?{urllib.parse.urlencode(params)}" if params else path
