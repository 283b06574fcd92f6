"""A plain-HTTP door to the apiserver on loopback, as `kubectl proxy` is: each request is sent
on with one identity's client certificate (the admin's), the answer streamed back as it comes
(watches included). For tests and tools that read the cluster with a bare HTTP client; the hub,
the culler and the service use their kubeconfigs and TLS."""

from __future__ import annotations

import http.client
import ssl
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .pki import KeyPair

#: request headers passed on; Authorization and the rest are the proxy's identity's business
_PASSED = ("Content-Type", "Accept", "Accept-Encoding", "User-Agent")


class ApiProxy:
    def __init__(self, server: str, ca_cert: str, identity: KeyPair) -> None:
        target = urllib.parse.urlsplit(server)
        tls = ssl.create_default_context(cafile=ca_cert)
        tls.load_cert_chain(str(identity.cert), str(identity.key))

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # the body ends when the connection does (watches)

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {h: self.headers[h] for h in _PASSED if self.headers.get(h)}
                conn = http.client.HTTPSConnection(
                    target.hostname, target.port, context=tls, timeout=300
                )
                try:
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    self.send_response(resp.status, resp.reason)
                    for name in ("Content-Type", "Content-Length"):
                        if resp.getheader(name):
                            self.send_header(name, resp.getheader(name))
                    self.end_headers()
                    while chunk := resp.read1(65536):
                        self.wfile.write(chunk)
                        self.wfile.flush()
                except (OSError, http.client.HTTPException):
                    pass  # the client went away, or the apiserver did: the connection ends
                finally:
                    conn.close()

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward  # noqa: N815

            def log_message(self, *_args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(
            target=self.server.serve_forever, name="api-proxy", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
