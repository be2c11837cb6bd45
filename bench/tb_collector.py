#!/usr/bin/env python3
"""Cost of the exporter's TensorBoard collector: the first poll over a long history, then polls with nothing new.

Usage: bench/tb_collector.py [--histories 10000,100000] [--idle-polls 50] [--runs 3]
                                              [--baseline FILE]

For each history size N, writes N scalars (the 17 tags MaxText writes, one event per scalar, in step order:
tests/helpers/tbevents.py) into one event file, then, in a fresh process as in the exporter (so the collector's
own imports of tensorboard and numpy count), times a new TensorBoardCollector: its first poll (reads and holds
all N samples), the scrape that serves them, and --idle-polls polls with nothing new (median and max). Each
figure is the median of --runs processes. --baseline FILE times another metrics_exporter.py as well (e.g. one
from `git show REV:utils/observe/metrics_exporter.py > /tmp/before.py`), alternately with this one on the same
files, and prints its rows beside. Goals: the first poll of 100k scalars costs <= 0.4 CPU seconds (on a shared
machine, wall time also counts waiting for a core); a poll with nothing new independent of the history.
"""

from __future__ import annotations

import argparse
import importlib.util
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

from helpers.tbevents import write_history

GOAL_CPU_S = 0.4


def timed(fn: object) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of one call."""
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w0, time.process_time() - c0


def measure(exporter: str, job: str, idle_polls: int) -> dict:
    """In this (fresh) process: the collector of `exporter` (a metrics_exporter.py; "" = this checkout's) over `job`."""
    if exporter:
        spec = importlib.util.spec_from_file_location("baseline_exporter", exporter)
        mx = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mx  # dataclasses look their module up
        spec.loader.exec_module(mx)
    else:
        from observe import metrics_exporter as mx
    tb = mx.TensorBoardCollector(job, "bench")
    first = timed(tb.poll)
    held = sum(len(q) for q in tb.held.waiting.values())
    text: list[str] = []
    scrape = timed(lambda: text.append(mx.generate_latest(tb).decode()))
    served = sum(1 for line in text[0].splitlines() if line.startswith("tb_"))
    idle = [timed(tb.poll)[0] for _ in range(idle_polls)]
    return {"first": first, "held": held, "scrape": scrape[0], "served": served, "idle": idle}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--histories", default="10000,100000", help="comma-separated scalar counts (default 10000,100000)")
    ap.add_argument("--idle-polls", type=int, default=50, help="polls with nothing new to time (default 50)")
    ap.add_argument("--runs", type=int, default=3, help="processes per figure, the median is shown (default 3)")
    ap.add_argument("--baseline", metavar="FILE", help="another metrics_exporter.py to time beside this one")
    ap.add_argument("--measure", nargs=2, metavar=("EXPORTER", "JOB"), help=argparse.SUPPRESS)  # the child
    args = ap.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure[0], args.measure[1], args.idle_polls)))
        return 0
    try:
        sizes = [int(x) for x in args.histories.split(",")]
    except ValueError:
        sys.exit(f"tb_collector.py: --histories {args.histories!r} is not a comma-separated list of integers")
    if args.baseline and not Path(args.baseline).is_file():
        sys.exit(f"tb_collector.py: --baseline {args.baseline!r} is not a file (a metrics_exporter.py)")
    versions = [("this", "")] + ([("baseline", str(Path(args.baseline).resolve()))] if args.baseline else [])
    rows = []
    with tempfile.TemporaryDirectory(prefix="tb_collector.") as tmp:
        for n in sizes:
            job = Path(tmp, f"job{n}")
            write_history(job / "outputs/bench/tensorboard/bench", n)
            got: dict[str, list[dict]] = {name: [] for name, _ in versions}
            for _ in range(args.runs):
                for name, exporter in versions:
                    out = subprocess.run(
                        [
                            sys.executable,
                            __file__,
                            "--idle-polls",
                            str(args.idle_polls),
                            "--measure",
                            exporter,
                            str(job),
                        ],
                        capture_output=True,
                        text=True,
                        check=True,
                    ).stdout
                    got[name].append(json.loads(out))
            for name, _ in versions:
                runs = got[name]
                med = statistics.median
                rows.append(
                    (
                        n,
                        name,
                        med(r["first"][0] for r in runs),
                        med(r["first"][1] for r in runs),
                        runs[0]["held"],
                        med(r["scrape"] for r in runs),
                        runs[0]["served"],
                        med(med(r["idle"]) for r in runs) * 1000,
                        max(max(r["idle"]) for r in runs) * 1000,
                    )
                )
    print(
        f"{'history':>8} {'exporter':>9} {'first poll wall/CPU s':>22} {'held':>7} {'first scrape wall s':>20} "
        f"{'served':>7} {'idle poll median/max ms':>24}"
    )
    for n, name, wall, cpu, held, scrape, served, idle_med, idle_max in rows:
        print(
            f"{n:>8} {name:>9} {wall:>11.3f}/{cpu:<10.3f} {held:>7} {scrape:>20.3f} {served:>7} "
            f"{idle_med:>12.3f}/{idle_max:<11.3f}"
        )
    this = [r for r in rows if r[1] == "this"]
    big = max(this, key=lambda r: r[0])
    verdict = "met" if big[3] <= GOAL_CPU_S else "NOT met"
    print(
        f"first poll of {big[0]} scalars: {big[3]:.3f} CPU s, {big[2]:.3f} s wall (goal <= {GOAL_CPU_S} CPU s: "
        f"{verdict}); poll with nothing new: " + ", ".join(f"{r[7]:.3f} ms at {r[0]}" for r in this)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
