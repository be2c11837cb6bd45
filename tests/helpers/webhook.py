"""A webhook for the job monitor's notifications: an HTTP server on 127.0.0.1 that keeps every JSON body
POSTed to it (Apprise's json:// notifier), and the notify config that points at it."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class Receiver:
    """An HTTP server on 127.0.0.1 that keeps every JSON body POSTed to it."""

    def __init__(self) -> None:
        got: list[dict] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                n = int(self.headers.get("Content-Length") or 0)
                got.append({"at": time.time(), **json.loads(self.rfile.read(n) or b"{}")})
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.got = got
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def titles(self, job_id: str) -> list[str]:
        return [m["title"] for m in self.got if f"job {job_id} (" in m.get("title", "")]

    def first(self, job_id: str, needle: str) -> dict | None:
        return next((m for m in self.got if f"job {job_id} (" in m["title"] and needle in m["title"]), None)


def notify_conf(tmp_path: Path, port: int) -> Path:
    conf = tmp_path / "notify.conf"
    conf.write_text(f"# the test's receiver\njson://127.0.0.1:{port}/hook\n")
    conf.chmod(0o600)
    return conf
