#!/usr/bin/env python3
"""Usage: alert_relay.py URL --every SECONDS --stop-file FILE   (by utils/observe/job_services.sh)

Puts the job's alerts into the job log. Every SECONDS it asks the job's own Prometheus at URL
(http://HOST:PORT, the one that evaluates utils/observe/alert_rules.yml) for its alerts
(/api/v1/alerts) and prints one line when an alert starts firing for a host and one when it stops:

  alert: firing ALERT host=HOST check=CHECK value=VALUE: SUMMARY; query: QUERY
  alert: resolved ALERT host=HOST check=CHECK after SECONDS s

(docs/job-log.md; utils/joblog.py parses them, the job monitor turns them into events and
notifications). It only reads from Prometheus, so nobody else on the node can make it print
anything. Exits 0 once FILE exists; a Prometheus that does not answer (starting, restarting) is
asked again at the next poll. Standard library only.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import urllib.request

LINE_MAX = 2000  # characters of a line at most (a log line stays far below 4 KiB: mawk -W interactive cuts there)


def firing(url: str) -> dict[tuple[str, str], dict] | None:
    """(alert, host) -> the alert, for each alert firing now; None when Prometheus does not answer."""
    try:
        with urllib.request.urlopen(f"{url}/api/v1/alerts", timeout=5) as r:
            alerts = json.load(r)["data"]["alerts"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    out = {}
    for a in alerts:
        labels = a.get("labels", {})
        if a.get("state") == "firing" and "alertname" in labels:
            out[(labels["alertname"], labels.get("host", "-"))] = a
    return out


def _value(text: str) -> str:
    try:
        v = float(text)
    except (TypeError, ValueError):
        return "?"
    return f"{v:.3g}" if math.isfinite(v) else "?"


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def fired_line(key: tuple[str, str], a: dict) -> str:
    labels, notes = a.get("labels", {}), a.get("annotations", {})
    line = (
        f"alert: firing {key[0]} host={key[1]} check={labels.get('check', '-')} value={_value(a.get('value', ''))}: "
        f"{_one_line(notes.get('summary', ''))}; query: {_one_line(notes.get('query', ''))}"
    )
    return line[:LINE_MAX]


def resolved_line(key: tuple[str, str], a: dict, seconds: float) -> str:
    check = a.get("labels", {}).get("check", "-")
    return f"alert: resolved {key[0]} host={key[1]} check={check} after {seconds:.0f} s"


def main(argv: list[str]) -> int:
    if argv[:1] in (["-h"], ["--help"]):
        print((__doc__ or "").strip())
        return 0
    if len(argv) != 5 or argv[1] != "--every" or argv[3] != "--stop-file":
        print("alert_relay.py: expected URL --every SECONDS --stop-file FILE; see --help", file=sys.stderr)
        return 2
    try:
        every = float(argv[2])
    except ValueError:
        every = 0.0
    if not every > 0:
        print(f"alert_relay.py: --every '{argv[2]}' must be a number of seconds above 0", file=sys.stderr)
        return 2
    url, stop = argv[0].rstrip("/"), argv[4]
    since: dict[tuple[str, str], tuple[float, dict]] = {}
    while not os.path.exists(stop):
        now = firing(url)
        if now is not None:
            for key, a in now.items():
                if key not in since:
                    since[key] = (time.monotonic(), a)
                    print(fired_line(key, a), flush=True)
            for key in [k for k in since if k not in now]:
                began, a = since.pop(key)
                print(resolved_line(key, a, time.monotonic() - began), flush=True)
        for _ in range(max(1, round(every / 0.2))):
            if os.path.exists(stop):
                break
            time.sleep(0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
