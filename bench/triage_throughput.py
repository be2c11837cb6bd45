#!/usr/bin/env python3
"""Usage: bench/triage_throughput.py [--hosts 24] [--lines 1000000] [--runs 3] [--no-absl] [--keep DIR]

End-to-end speed of utils/triage.py --json on a large synthetic job log (tests/helpers/logcorpus.py:
HOSTS nodes, at least LINES lines, every node printing every step, as MaxText does). Prints the
log size, the best wall time of RUNS runs of the CLI (new Python process each time, file in the
page cache) as MB/s, and where the time goes: interpreter start-up, the scan (utils/joblog.py)
and the analysis/JSON (utils/triage.py). Goal: >= 200 MB/s.
"""

import argparse
import json
import runpy
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __name__ == "__main__":  # run directly: under the project's environment, found as the utils/ commands find it
    runpy.run_path(str(Path(__file__).resolve().parents[1] / "utils" / "entry.py"))["enter_venv"]()

from helpers import logcorpus

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--hosts", type=int, default=24)
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-absl", action="store_true", help="step lines without the absl prefix (the slower path)")
    ap.add_argument("--keep", type=Path, help="write the log here and keep it (default: a temporary directory)")
    a = ap.parse_args()
    tmp = None
    if a.keep:
        work = a.keep
        work.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="triage-bench-")
        work = Path(tmp.name)
    log = work / "4242-JAX-tiny.log"
    t = time.perf_counter()
    lines = logcorpus.write_big_log(log, a.hosts, a.lines, absl=not a.no_absl)
    gen = time.perf_counter() - t
    size = log.stat().st_size
    log.read_bytes()  # into the page cache: measure the tool, not the disk
    cmd = [sys.executable, str(REPO / "utils" / "triage.py"), str(log), "--json", "--no-scheduler"]
    walls, reports = [], []
    for _ in range(a.runs):
        t = time.perf_counter()
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        walls.append(time.perf_counter() - t)
        if res.returncode != 0:
            print(res.stderr, file=sys.stderr)
            return 1
        reports.append(json.loads(res.stdout))
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import json, re, statistics, argparse, subprocess"], check=True)
    startup = time.perf_counter() - t
    best = min(walls)
    scan = min(r["scan"]["seconds"] for r in reports)
    r = reports[0]
    print(f"log: {lines} lines, {a.hosts} hosts, {size / 1e6:.1f} MB (generated in {gen:.1f} s)")
    print(
        f"triage.py --json: best {best:.3f} s, median {statistics.median(walls):.3f} s of {a.runs} runs "
        f"-> {size / best / 1e6:.0f} MB/s end to end"
    )
    print(
        f"  interpreter start-up ~{startup:.3f} s, scan {scan:.3f} s ({size / scan / 1e6:.0f} MB/s), "
        f"analysis + JSON ~{max(0.0, best - startup - scan):.3f} s"
    )
    print(
        f"  result: status={r['status']} last_step={r['progress']['last_step']} tgs={r['tgs']['steady']} "
        f"phases={len(r['tgs']['phases'])}"
    )
    if tmp:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
