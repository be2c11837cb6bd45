"""A small client for a job's saved (or live) Prometheus TSDB.

`Served(path)` runs `utils/prometheus.sh serve` once: that copies the TSDB (blocks hard-linked,
WAL and head chunks copied), starts a private Prometheus on the copy and prints its URL and the
data's time range; the server stays up until we close its stdin, so any number of queries cost
one Prometheus start. The saved TSDB is never written. Queries go over one kept-alive connection
per thread (standard library only: importing requests cost a tool 0.09 CPU-s of its 0.2 s start).

    from diagnosis.tsdb import Served
    with Served("outputs/4242-JAX-llama2-7b") as prom:
        rows = prom.query_range('avg by (host) (hw_gpu_power_watts)', prom.first, prom.last, 60)
        for row in rows:
            print(row["metric"]["host"], len(row["values"]))

`resolve(path)` applies the same rules as utils/prometheus.sh (a job dir with prometheus/
inside, or a TSDB dir with block dirs and/or wal/) and raises TSDBError with one line.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import threading
import urllib.parse
from pathlib import Path
from typing import Any

from diagnosis.jobdir import has_blocks, is_tsdb

__all__ = ["REPO", "TOOL", "Served", "TSDBError", "has_blocks", "is_tsdb", "resolve"]  # has_blocks, is_tsdb: jobdir.py

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "utils" / "prometheus.sh"


class TSDBError(Exception):
    """A TSDB that cannot be served or a query that failed (one line of text)."""


def resolve(path: str | Path) -> Path:
    """The TSDB dir for a job dir (its prometheus/) or a TSDB dir; TSDBError otherwise."""
    p = Path(path)
    want = "a job dir with prometheus/ inside, or a TSDB dir with block dirs (meta.json) and/or wal/"
    if not p.exists():
        raise TSDBError(f"{p} does not exist (expected {want})")
    if not p.is_dir():
        raise TSDBError(f"{p} is not a directory (expected {want})")
    if (p / "prometheus").is_dir():
        if not is_tsdb(p / "prometheus"):
            raise TSDBError(f"{p / 'prometheus'} holds no saved metrics yet (no block dir with meta.json, no wal/)")
        return (p / "prometheus").resolve()
    if is_tsdb(p):
        return p.resolve()
    raise TSDBError(f"{p} is neither a job dir nor a TSDB (expected {want})")


def _end(proc: subprocess.Popen) -> None:
    """Close the stdin of prometheus.sh serve (it stops and cleans up) and wait for it; terminate it after 30 s."""
    try:
        if proc.stdin:
            proc.stdin.close()
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.terminate()
        proc.wait(timeout=30)


class Served:
    """A private Prometheus on a copy of one TSDB, for as long as the `with` block runs.

    Attributes once entered: url, first and last (unix seconds of the first and last sample,
    None for an empty TSDB). Queries go straight to it over HTTP (no proxy).
    """

    def __init__(self, path: str | Path, timeout: float = 120.0) -> None:
        self.tsdb = resolve(path)
        self.timeout = timeout
        self.url = ""
        self.first: float | None = None
        self.last: float | None = None
        self.queries = 0
        self._proc: subprocess.Popen | None = None
        # one connection per thread (load.py queries from a pool), straight to our own server on
        # loopback: never through http_proxy, no compression (the CPU it costs both ends buys nothing)
        self._local = threading.local()
        self._conns: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def __enter__(self) -> Served:
        self._proc = subprocess.Popen(
            [str(TOOL), "serve", str(self.tsdb)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PROMETHEUS_START_TIMEOUT": str(int(self.timeout))},
        )
        line = self._first_line()
        fields = dict(kv.partition("=")[::2] for kv in line.split())
        self.url = fields.get("url", "")
        if not self.url.startswith("http"):
            self.close()
            raise TSDBError(f"prometheus.sh serve printed no URL: {line[:200]!r}")
        if fields.get("first_ms") and fields.get("last_ms"):
            self.first, self.last = int(fields["first_ms"]) / 1000, int(fields["last_ms"]) / 1000
        return self

    def _first_line(self) -> str:
        proc = self._proc
        assert proc is not None and proc.stdout and proc.stderr
        out, got = proc.stdout, []

        def read() -> None:  # the server's own handles: close() may drop self._proc meanwhile
            try:
                got.append(out.readline())
            except (OSError, ValueError):  # closed under it after a timeout
                got.append("")

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(self.timeout + 30)
        if got and got[0].strip():
            return got[0].strip()
        _end(proc)
        err = proc.stderr.read().strip().splitlines()  # its last line says why (prometheus.sh's die)
        self.close()
        raise TSDBError(err[-1] if err else "prometheus.sh serve did not start")

    def close(self) -> None:
        """Stop the server (closing its stdin ends prometheus.sh serve, which cleans up)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            _end(proc)
        finally:
            for f in (proc.stdout, proc.stderr):
                if f:
                    f.close()
            with self._lock:
                conns, self._conns = self._conns, []
            for c in conns:
                c.close()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- HTTP API -------------------------------------------------------------------------
    def _connection(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            url = urllib.parse.urlsplit(self.url)
            conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=self.timeout)
            self._local.conn = conn
            with self._lock:
                self._conns.append(conn)
        return conn

    def _request(self, method: str, path: str, body: bytes | None) -> tuple[int, bytes]:
        headers = {"Accept-Encoding": "identity"}
        if body is not None:
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        conn = self._connection()
        for attempt in (1, 2):  # a kept-alive connection the server closed meanwhile: once more
            try:
                conn.request(method, path, body=body, headers=headers)
                resp = conn.getresponse()
                return resp.status, resp.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                conn.close()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _call(self, path: str, data: dict[str, Any], method: str = "POST") -> Any:
        self.queries += 1
        form = urllib.parse.urlencode(data)
        try:
            if method == "GET":
                status, raw = self._request("GET", f"{path}?{form}", None)
            else:
                status, raw = self._request("POST", path, form.encode())
        except (OSError, http.client.HTTPException) as e:
            raise TSDBError(f"prometheus did not answer {path}: {e}") from None
        try:
            body = json.loads(raw)
        except ValueError:
            text = raw[:200].decode(errors="replace")
            raise TSDBError(f"prometheus answered {path} with HTTP {status}: {text}") from None
        if body.get("status") != "success":
            raise TSDBError(f"query failed: {body.get('errorType')}: {body.get('error')} ({data.get('query', '')})")
        return body["data"]

    def query(self, expr: str, at: float) -> list[dict]:
        """Instant query at unix time `at`: [{"metric": {...}, "value": [t, "v"]}, ...]."""
        return self._call("/api/v1/query", {"query": expr, "time": f"{at:.3f}"})["result"]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict]:
        """Range query: [{"metric": {...}, "values": [[t, "v"], ...]}, ...]."""
        data = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        return self._call("/api/v1/query_range", data)["result"]

    def series(self, match: str, start: float, end: float) -> list[dict[str, str]]:
        """Label sets of the series matching `match` with samples in [start, end]."""
        return self._call("/api/v1/series", {"match[]": match, "start": f"{start:.3f}", "end": f"{end:.3f}"})

    def label_values(self, label: str, match: str, start: float, end: float) -> list[str]:
        """Values of `label` among the series matching `match` in [start, end] (from the index only)."""
        return self._call(
            f"/api/v1/label/{label}/values",
            {"match[]": match, "start": f"{start:.3f}", "end": f"{end:.3f}"},
            method="GET",
        )
