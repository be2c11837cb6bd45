#!/usr/bin/env python3
"""Usage: prom_between_scrapes.py URL INTERVAL   (by utils/observe/job_services.sh stop)

Waits, at most two scrape intervals, for a moment when the Prometheus at URL (http://HOST:PORT)
has no scrape in flight, so that the SIGTERM sent right after cancels none: a scrape that shutdown
cancels is recorded as failed (`up` 0, "context canceled"), which marks every series of that target
stale at the end of the saved TSDB (a query at its end then lacks that node; measured on a job's
Ray metrics port, whose answer takes longest). Each target is scraped at its last scrape time plus
whole intervals (/api/v1/targets: lastScrape, lastScrapeDuration). Exits 0 in every case, at once
when Prometheus cannot be asked: stopping it must not wait on this. Standard library only.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from datetime import datetime

MARGIN = 0.15  # seconds kept free around each scrape (shutdown stops the scrape loops within ms)


def _epoch(rfc3339: str) -> float | None:
    """Prometheus's lastScrape (nanoseconds, Z) in unix seconds."""
    s = rfc3339.replace("Z", "+00:00")
    head, dot, rest = s.partition(".")
    if dot:  # fromisoformat takes microseconds at most
        digits = "".join(c for c in rest if c.isdigit())
        s = f"{head}.{digits[:6]}{rest[len(digits) :]}"
    try:
        return datetime.fromisoformat(s).timestamp()
    except ValueError:
        return None


def busy(targets: list[dict], interval: float, now: float, horizon: float) -> list[tuple[float, float]]:
    """The windows (start, end), from now to now + horizon, in which some target is being scraped."""
    out = []
    for t in targets:
        last = _epoch(t.get("lastScrape", ""))
        if last is None or last <= 0:
            continue
        dur = max(float(t.get("lastScrapeDuration") or 0), 0.01)
        k = max(0, int((now - last) // interval))
        start = last + k * interval
        while start < now + horizon:
            out.append((start - MARGIN, start + 1.5 * dur + MARGIN))  # half as long again: durations vary
            start += interval
    return sorted(out)


def quiet_moment(windows: list[tuple[float, float]], now: float, need: float) -> float:
    """The first time from now on with `need` seconds free of every window."""
    t = now
    for a, b in windows:
        if t + need <= a:
            return t
        t = max(t, b)
    return t


def main(argv: list[str]) -> int:
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__.strip())
        return 0
    if len(argv) != 2 or not argv[1].replace(".", "", 1).isdigit() or float(argv[1]) <= 0:
        print("prom_between_scrapes.py: expected URL INTERVAL (seconds > 0); see --help", file=sys.stderr)
        return 2
    url, interval = argv[0].rstrip("/"), float(argv[1])
    try:
        with urllib.request.urlopen(f"{url}/api/v1/targets?state=active", timeout=2) as r:
            targets = json.load(r)["data"]["activeTargets"]
    except (OSError, ValueError, KeyError, TypeError):
        return 0
    now = time.time()
    at = quiet_moment(busy(targets, interval, now, 2 * interval), now, MARGIN)
    time.sleep(max(0.0, min(at - now, 2 * interval)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
