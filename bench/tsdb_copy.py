#!/usr/bin/env python3
"""Cost of copying a node-local TSDB into the job dir (utils/observe/tsdb_mirror.py), next to a whole copy.

Usage: bench/tsdb_copy.py [--series 3000] [--seconds 60] [--every 5]

A real Prometheus (PROMETHEUS_BIN, else prometheus on PATH) scrapes, every second, an endpoint of this
process serving SERIES gauges whose values change every scrape (3000: about what eight 8-GPU nodes
export); every EVERY seconds one tsdb_mirror pass copies its TSDB into a second directory, and, for
comparison, a whole copy (what a mirror without increments would do) goes to a third. Prints, per pass
and in total: bytes written, CPU seconds (this process: user + system) and wall seconds of each.
Standard library only; both copies on this machine's disk (TMPDIR), not NFS: the byte counts are what
an NFS server would receive.
"""

from __future__ import annotations

import argparse
import http.server
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

if __name__ == "__main__":  # run directly: under the project's environment, found as the utils/ commands find it
    import runpy

    runpy.run_path(str(Path(__file__).resolve().parents[1] / "utils" / "entry.py"))["enter_venv"]()

from helpers.promfixture import free_port  # tests/ is an import root of the environment
from observe import tsdb_mirror


def endpoint(series: int) -> http.server.ThreadingHTTPServer:
    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            body = "".join(f'bench_gauge{{i="{i}"}} {random.random()}\n' for i in range(series)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def cpu() -> float:
    return time.process_time()


def size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> int:
    ap = argparse.ArgumentParser(prog="bench/tsdb_copy.py", description=(__doc__ or "").split("\n\n")[1])
    ap.add_argument("--series", type=int, default=3000)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--every", type=float, default=5)
    a = ap.parse_args()
    prom = os.environ.get("PROMETHEUS_BIN") or shutil.which("prometheus")
    if not prom:
        print("bench/tsdb_copy.py: no Prometheus (apt-get install prometheus, or set PROMETHEUS_BIN)", file=sys.stderr)
        return 1
    srv = endpoint(a.series)
    work = Path(tempfile.mkdtemp(prefix="tsdb-copy-bench."))
    src, dst, whole = work / "src", work / "dst", work / "whole"
    port = free_port()
    (work / "p.yml").write_text(
        "global: {scrape_interval: 1s, scrape_timeout: 900ms}\n"
        f"scrape_configs: [{{job_name: bench, static_configs: [{{targets: ['127.0.0.1:{srv.server_address[1]}']}}]}}]\n"
    )
    proc = subprocess.Popen(
        [
            prom,
            f"--config.file={work / 'p.yml'}",
            f"--storage.tsdb.path={src}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    totals = {"mirror": [0, 0.0, 0.0], "whole": [0, 0.0, 0.0]}
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        print(f"{a.series} series scraped every 1 s; a copy every {a.every:g} s for {a.seconds:g} s")
        print(f"{'t (s)':>6} {'TSDB bytes':>11} | {'mirror bytes':>12} {'CPU s':>6} {'wall s':>6} | "
              f"{'whole bytes':>11} {'CPU s':>6} {'wall s':>6}")  # fmt: skip
        began = time.monotonic()
        while time.monotonic() - began < a.seconds:
            time.sleep(a.every)
            c, w = cpu(), time.monotonic()
            p = tsdb_mirror.mirror(src, dst)
            m = (p.bytes, cpu() - c, time.monotonic() - w)
            shutil.rmtree(whole, ignore_errors=True)
            c, w = cpu(), time.monotonic()
            shutil.copytree(src, whole, ignore=shutil.ignore_patterns("lock", "queries.active"))
            f = (size(whole), cpu() - c, time.monotonic() - w)
            for k, v in (("mirror", m), ("whole", f)):
                totals[k] = [totals[k][0] + v[0], totals[k][1] + v[1], totals[k][2] + v[2]]
            print(f"{time.monotonic() - began:6.0f} {size(src):11d} | {m[0]:12d} {m[1]:6.3f} {m[2]:6.3f} | "
                  f"{f[0]:11d} {f[1]:6.3f} {f[2]:6.3f}")  # fmt: skip
        m, f = totals["mirror"], totals["whole"]
        print(f"{'total':>6} {'':>11} | {m[0]:12d} {m[1]:6.3f} {m[2]:6.3f} | {f[0]:11d} {f[1]:6.3f} {f[2]:6.3f}")
    finally:
        proc.terminate()
        proc.wait()
        srv.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
