"""utils/observe/job_services.sh stop: Prometheus is stopped between two scrapes
(utils/observe/prom_between_scrapes.py).

A scrape that Prometheus's shutdown cancels is saved as failed (`up` 0, "context canceled"), and every
series of that target ends with a staleness marker: a query at the end of the saved TSDB lacks that
node (a CI run lost a Ray metrics port this way; its answer is the slowest). Here a real Prometheus
scrapes a real HTTP endpoint that takes 0.45 s to answer, every 2 s, and is stopped three times:
each time the last saved scrape is a successful one. The window arithmetic has its own cases."""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO, VENV, run

from observe import prom_between_scrapes as pbs


def test_a_quiet_moment_is_after_every_scrape_in_flight_and_before_the_next():
    # target a scraped at 98.9 s (0.3 s long), b at 99.7 s (0.05 s), interval 5 s, now 100 s
    targets = [
        {"lastScrape": "1970-01-01T00:01:38.900000000Z", "lastScrapeDuration": 0.3},
        {"lastScrape": "1970-01-01T00:01:39.700123456Z", "lastScrapeDuration": 0.05},
    ]
    windows = pbs.busy(targets, 5.0, 100.0, 10.0)
    assert pbs.quiet_moment(windows, 100.0, pbs.MARGIN) == 100.0  # nothing in flight now
    # at 103.8 a's next scrape (103.9, up to 1.5 x its 0.3 s, and the margins) is about to start, and b's
    # (104.7) starts before a's window ends: the quiet moment is after b's window
    windows = pbs.busy(targets, 5.0, 103.8, 10.0)
    assert pbs.quiet_moment(windows, 103.8, pbs.MARGIN) == pytest.approx(104.700123 + 1.5 * 0.05 + pbs.MARGIN)
    # at 101 nothing is in flight and a's next scrape is 2.9 s away
    assert pbs.quiet_moment(pbs.busy(targets, 5.0, 101.0, 10.0), 101.0, pbs.MARGIN) == 101.0
    assert pbs._epoch("2026-11-28T09:31:55.123456789Z") == pytest.approx(1795858315.123456)


def test_bad_input_is_one_line():
    res = run([sys.executable, str(REPO / "utils/observe/prom_between_scrapes.py"), "http://127.0.0.1:1"])
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and "URL INTERVAL" in res.stderr
    # Prometheus not there: no wait at all
    t0 = time.monotonic()
    res = run([sys.executable, str(REPO / "utils/observe/prom_between_scrapes.py"), "http://127.0.0.1:1", "5"])
    assert res.returncode == 0 and time.monotonic() - t0 < 3


class Slow(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        time.sleep(0.45)
        body = b"slow_metric 1\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def slow_target() -> Iterator[str]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrapes(port: str) -> int:
    """How many times the Prometheus on PORT has scraped its one target (its samples of `up`)."""
    url = f"http://127.0.0.1:{port}/api/v1/query?query=count_over_time(up%5B1h%5D)"
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            res = json.load(r)["data"]["result"]
    except (OSError, ValueError, KeyError):
        return 0
    return int(float(res[0]["value"][1])) if res else 0


@pytest.mark.slow
def test_stop_leaves_the_last_scrape_of_a_slow_target_successful(tmp_path, slow_target):
    from helpers.promfixture import binary

    for i in range(3):
        job_dir = tmp_path / f"job{i}"
        job_dir.mkdir(mode=0o700)
        env = {**os.environ, "JOB_DIR": str(job_dir), "JOB_HOSTNAME": "n1", "METRICS_INTERVAL": "2",
               "PROMETHEUS_BIN": binary("prometheus") or "prometheus", "MST_PYTHON": str(VENV / "bin/python"),
               "DASHBOARD_BIND": "127.0.0.1"}  # fmt: skip
        (job_dir / "metrics" / "targets").mkdir(parents=True, mode=0o700)
        (job_dir / "metrics" / "targets" / "slow.json").write_text(
            json.dumps([{"targets": [slow_target], "labels": {"host": "n1"}}])
        )
        out = job_dir / "services.out"  # a file, not a pipe: the services it starts keep their output open
        with out.open("w") as f:
            rc = subprocess.run([str(REPO / "utils/observe/job_services.sh"), "start"], env=env, stdout=f,
                                stderr=subprocess.STDOUT, timeout=60).returncode  # fmt: skip
        try:
            assert rc == 0, out.read_text()
            stop_between_scrapes(job_dir, env, i)
        finally:  # what the test started never outlives it
            run([str(REPO / "utils/observe/job_services.sh"), "stop"], env=env, timeout=60)
        res = run([str(REPO / "utils/prometheus.sh"), "query", str(job_dir), "up"], timeout=120)
        assert res.returncode == 0, res.stderr
        ups = json.loads(res.stdout)["data"]["result"]
        assert [u["value"][1] for u in ups] == ["1"], (i, ups)


def stop_between_scrapes(job_dir: Path, env: dict[str, str], i: int) -> None:
    """job_services.sh stop once Prometheus has scraped twice (it hands file_sd targets to its scrapers
    5 s after start), I x 0.73 s later: each stop at another phase of the 2 s interval."""
    port = (job_dir / "metrics" / "run" / "prometheus.port").read_text().strip()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and scrapes(port) < 2:
        time.sleep(0.2)
    time.sleep(0.73 * i)
    res = run([str(REPO / "utils/observe/job_services.sh"), "stop"], env=env, timeout=60)
    assert res.returncode == 0, res.stderr
