"""A read-only container registry on 127.0.0.1 for tests of pulling with credentials.

No registry can be reached from the test machines and Debian's registry package would install a system
service, so this serves the pull side of the registry API (the OCI distribution spec's "Pull" endpoints:
`GET /v2/`, `GET|HEAD /v2/<name>/manifests/<reference>`, `GET|HEAD /v2/<name>/blobs/<digest>`) from an OCI
image layout directory (`podman save --format oci-dir`), behind HTTP basic authentication: a request
without the right `Authorization: Basic` header gets 401 and `WWW-Authenticate: Basic realm=...`, as a
registry that wants a login answers. Real podman pulls from it (plain HTTP: list it as insecure in a
registries.conf).
"""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class Registry:
    """`with Registry(layout, "team/maxtext", "1", user, password) as reg:` serves the image of the layout as
    127.0.0.1:<reg.port>/team/maxtext:1; reg.refused and reg.served count requests."""

    def __init__(self, layout: Path, name: str, tag: str, user: str, password: str) -> None:
        index = json.loads((layout / "index.json").read_text())
        self.manifest_digest = index["manifests"][0]["digest"]
        self.media_type = index["manifests"][0]["mediaType"]
        self.layout, self.name, self.tag = layout, name, tag
        self.auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self.refused = self.served = 0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.port = self.server.server_address[1]

    def blob(self, digest: str) -> Path | None:
        algo, _, hexdigest = digest.partition(":")
        path = self.layout / "blobs" / algo / hexdigest
        return path if algo == "sha256" and hexdigest.isalnum() and path.is_file() else None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        reg = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # quiet
                pass

            def reply(self, code: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
                self.send_response(code)
                for k, v in {"Docker-Distribution-API-Version": "registry/2.0", **(headers or {})}.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def error(self, code: int, what: str, headers: dict[str, str] | None = None) -> None:
                body = json.dumps({"errors": [{"code": what, "message": what.lower()}]}).encode()
                self.reply(code, body, {"Content-Type": "application/json", **(headers or {})})

            def do_GET(self) -> None:
                if self.headers.get("Authorization") != reg.auth:
                    reg.refused += 1
                    self.error(401, "UNAUTHORIZED", {"WWW-Authenticate": 'Basic realm="mst-test"'})
                    return
                reg.served += 1
                path = self.path.split("?", 1)[0]
                if path == "/v2/":
                    self.reply(200, b"{}", {"Content-Type": "application/json"})
                    return
                prefix = f"/v2/{reg.name}/"
                kind, _, ref = path[len(prefix) :].partition("/") if path.startswith(prefix) else ("", "", "")
                if kind == "manifests" and ref in (reg.tag, reg.manifest_digest):
                    body = reg.blob(reg.manifest_digest).read_bytes()  # type: ignore[union-attr]
                    headers = {"Content-Type": reg.media_type, "Docker-Content-Digest": reg.manifest_digest}
                    self.reply(200, body, headers)
                elif kind == "blobs" and reg.blob(ref):
                    body = reg.blob(ref).read_bytes()  # type: ignore[union-attr]
                    self.reply(200, body, {"Content-Type": "application/octet-stream", "Docker-Content-Digest": ref})
                else:
                    self.error(404, "MANIFEST_UNKNOWN" if kind == "manifests" else "BLOB_UNKNOWN")

            do_HEAD = do_GET

        return Handler

    def __enter__(self) -> Registry:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
