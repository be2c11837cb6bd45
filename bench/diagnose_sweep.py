#!/usr/bin/env python3
"""Usage: bench/diagnose_sweep.py [--cache DIR] [--family F] [--seed N] [--runs N] [--hosts N] [--gpus N]
                                [--hours H] [--interval S] [--rebuild]

Wall time of a full diagnosis of a big job: builds (or reuses from the cache) one incident job with
tests/helpers/corpus.py, by default 24 hosts x 8 GPUs x 48 h at the launcher's own 5 s scrape interval
(METRICS_INTERVAL's default) with 8 RDMA NICs per host: ~6100 series, ~210 M samples, what a real job
of that length leaves. Building it takes 10-15 min on 2 cores, ~20 GB of temporary disk under $TMPDIR
(promtool's backfill) and leaves a ~420 MiB TSDB in the cache, which later runs reuse. Then it times
`utils/diagnose.py JOB --json` as a user runs it (Python start, one Prometheus on a copy of the TSDB,
every query and playbook) --runs times and prints each wall time, the CPU time it and its processes
(Prometheus included) used, the medians, the load average and whether the verdict and culprits were
right (on a busy machine the wall time is the CPU time stretched by the load). Goal: <= 10 s. The
cache is $XDG_CACHE_HOME/maxtext-slurm/diagnose-bench (else ~/.cache/maxtext-slurm/diagnose-bench), one
directory per family, seed and scale.
"""

import argparse
import dataclasses
import json
import os
import runpy
import statistics
import subprocess
import sys
import time
from pathlib import Path

if __name__ == "__main__":  # run directly: under the project's environment, found as the utils/ commands find it
    runpy.run_path(str(Path(__file__).resolve().parents[1] / "utils" / "entry.py"))["enter_venv"]()

from helpers import corpus

REPO = Path(__file__).resolve().parent.parent

GOAL_S = 10.0
INTERVAL_S = 5  # the launcher's own scrape interval (METRICS_INTERVAL's default), what a real job leaves


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "maxtext-slurm" / "diagnose-bench"


def build_or_reuse(args: argparse.Namespace) -> tuple[dict, float | None]:
    """(incident record, build seconds or None when reused)."""
    scale = dataclasses.replace(corpus.FULL, hosts=args.hosts, gpus=args.gpus, hours=args.hours, interval=args.interval)
    key = f"{args.family}-s{args.seed}-{scale.hosts}x{scale.gpus}-{scale.hours:g}h-{scale.interval}s"
    ws = args.cache / key
    marker = ws / "incident.json"
    if marker.is_file() and not args.rebuild:
        return json.loads(marker.read_text()), None
    if ws.exists():
        subprocess.run(["rm", "-rf", str(ws)], check=True)
    print(f"building {key} in {ws} ...", flush=True)
    t = time.monotonic()
    inc = corpus.build(args.family, ws, args.seed, scale)
    took = time.monotonic() - t
    rec = {
        "job_dir": str(inc.job_dir),
        "vs": str(inc.vs) if inc.vs else None,
        "verdict": inc.verdict,
        "culprits": inc.culprits,
        "hosts": len(inc.hosts),
        "scale": dataclasses.asdict(scale),
    }
    marker.write_text(json.dumps(rec, indent=1))
    return rec, took


def tsdb_stats(job_dir: Path) -> str:
    size = sum(f.stat().st_size for f in (job_dir / "prometheus").rglob("*") if f.is_file())
    metas = [json.loads(m.read_text()) for m in (job_dir / "prometheus").glob("*/meta.json")]
    series = max((m["stats"]["numSeries"] for m in metas), default=0)  # every block holds every series
    samples = sum(m["stats"]["numSamples"] for m in metas)
    return f"{series} series, {samples / 1e6:.1f} M samples, {size / 2**20:.0f} MiB in {len(metas)} block(s)"


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--cache", type=Path, default=cache_root())
    ap.add_argument("--family", default="rdma_retransmits", choices=list(corpus.FAMILIES))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--runs", type=int, default=3, help="timed runs (0: only build or check the cache)")
    ap.add_argument("--hosts", type=int, default=corpus.FULL.hosts)
    ap.add_argument("--gpus", type=int, default=corpus.FULL.gpus)
    ap.add_argument("--hours", type=float, default=corpus.FULL.hours)
    ap.add_argument("--interval", type=int, default=INTERVAL_S)
    ap.add_argument("--rebuild", action="store_true", help="build again even if cached")
    args = ap.parse_args()
    if args.runs < 0:
        ap.error("--runs must be 0 or more")
    rec, took = build_or_reuse(args)
    job = Path(rec["job_dir"])
    print(f"job: {job}" + (f" (built in {took:.0f} s)" if took is not None else " (cached)"))
    print(f"TSDB: {tsdb_stats(job)}")
    cmd = [sys.executable, str(REPO / "utils" / "diagnose.py"), str(job), "--json"]
    if rec["vs"]:
        cmd += ["--vs", rec["vs"]]
    times, cpus, right = [], [], True
    for i in range(args.runs):
        t, c = time.monotonic(), os.times()
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        times.append(time.monotonic() - t)
        c2 = os.times()
        cpus.append(c2.children_user + c2.children_system - c.children_user - c.children_system)
        if res.returncode != 0:
            print(f"diagnose.py failed ({res.returncode}): {res.stderr.strip()}", file=sys.stderr)
            return 1
        r = json.loads(res.stdout)
        ok = r["verdict"] == rec["verdict"] and sorted(r["culprit_hosts"]) == sorted(rec["culprits"])
        right &= ok
        print(
            f"run {i + 1}: {times[-1]:.2f} s wall, {cpus[-1]:.2f} s CPU ({r['queries_run']} queries, "
            f"{r['seconds']:.2f} s inside), "
            f"verdict {r['verdict']} {','.join(r['culprit_hosts']) or '-'} ({'right' if ok else 'WRONG'})"
        )
    if not times:
        return 0
    med = statistics.median(times)
    met = "met" if med <= GOAL_S else "MISSED"
    print(
        f"median {med:.2f} s over {len(times)} run(s) ({statistics.median(cpus):.2f} s CPU, load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs), goal <= {GOAL_S:g} s: {met}; "
        f"verdicts {'right' if right else 'WRONG'}"
    )
    return 0 if right else 1


if __name__ == "__main__":
    sys.exit(main())
